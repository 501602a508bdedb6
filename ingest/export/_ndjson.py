"""Export as newline-delimited JSON: one STAC item per line, exactly as ingested."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TextIO

from ingest.export._common import ExportResult, iter_items, replacing_file
from ingest.repository import View


def write_ndjson(view: View, stream: TextIO) -> tuple[int, int]:
    """Write the view's items to ``stream``, one per line; returns (items, collections)."""
    count = 0
    collections: set[str] = set()
    for _, items in iter_items(view):
        # json (not orjson) so that NaN and other values the overflow kept survive as they came in.
        stream.write("".join(json.dumps(item, separators=(",", ":")) + "\n" for item in items))
        count += len(items)
        collections.update(item.get("collection") or "" for item in items)
    return count, len(collections)


def export_ndjson(view: View, out: str | os.PathLike[str] | TextIO) -> ExportResult:
    """Export every item at ``view`` as NDJSON to a file path, ``-`` (stdout), or an open text stream.

    A file appears only once it is complete. Items stream batch by batch, in the
    table's order, so the same ref always gives the same bytes.

    Args:
        view: the snapshot to export (:meth:`~ingest.repository.Repository.view`).
        out: a file path (its folder is created if missing), ``-`` for standard output, or an open text stream
            (flushed, not closed).

    Returns:
        The format (``ndjson``), the items and collections written, the ref and snapshot, and the file path (``-``
        for a stream).

    Raises:
        InvalidExportTarget: ``out`` is a folder, or a file stands where its folder would be.
    """
    if isinstance(out, str) and out == "-":
        out = sys.stdout
    if isinstance(out, str | os.PathLike):
        target_path = Path(out)
        with replacing_file(target_path) as stream:
            count, collections = write_ndjson(view, stream)
        target = str(target_path)
    else:
        count, collections = write_ndjson(view, out)
        out.flush()
        target = "-"
    return ExportResult("ndjson", count, collections, view.ref, view.snapshot_id, target)
