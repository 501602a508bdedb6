"""What two ingests of the same input are compared by: the items exported at main, and the rejections."""

from __future__ import annotations

import io
import json

from ingest import Repository
from ingest.export import export_ndjson
from ingest.pipeline._report import IngestReport


def exported(repository: Repository) -> list[str]:
    """The items at main, as JSON text with sorted keys, by (collection, id)."""
    out = io.StringIO()
    export_ndjson(repository.view("main"), out)
    items = [json.loads(line) for line in out.getvalue().splitlines()]
    return [
        json.dumps(item, sort_keys=True) for item in sorted(items, key=lambda item: (item["collection"], item["id"]))
    ]


def rejections(report: IngestReport) -> list[tuple[str, str | None, str]]:
    """Each rejection's source, item id and reason, sorted."""
    return sorted((rejection.source, rejection.item_id, rejection.reason) for rejection in report.rejected)
