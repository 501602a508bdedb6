"""A metadata backfill on Ray (``--assets none``): the sources cut into parts that actors read, check and commit
give the same items, the same rejections (by the file's own line and row) and the same ``--report`` as one process
reading them whole (issue 52, item 3). The two-node run is in test_two_node_cluster.py."""

from __future__ import annotations

import io
import json

import pytest

from ingest import Repository, Settings
from ingest.export import export_ndjson
from ingest.pipeline import ingest_items, ingest_with_ray
from tests.pipeline._backfill_sources import write_sources

pytestmark = pytest.mark.slow


def _exported(repository: Repository) -> list[str]:
    stream = io.StringIO()
    export_ndjson(repository.view("main"), stream)
    return sorted(stream.getvalue().splitlines())


def _landed(report_text: str) -> list[tuple[str, str]]:
    return sorted((line["source"], line["id"]) for line in map(json.loads, report_text.splitlines()))


def test_a_backfill_gives_what_one_process_gives(tmp_path, ray_cluster):
    sources = write_sources(tmp_path / "sources")

    alone = Repository.create(tmp_path / "alone", Settings())
    alone_lines = io.StringIO()
    expected = ingest_items(alone, sources, batch_size=200, report_to=alone_lines)

    # Parts of about 16 kB: the NDJSON file in dozens of byte ranges, the Parquet file in runs of rows.
    spread = Repository.create(tmp_path / "spread", Settings(part_mb=16 / 1024))
    spread_lines = io.StringIO()
    got = ingest_with_ray(spread, sources, workers=2, assets="none", batch_size=200, report_to=spread_lines)

    # The same rejections, by the file's own lines, but one: an id read again in another part is not rejected as
    # a duplicate (no reader sees both); the table holds it once all the same.
    assert len(expected.rejected) == 3  # the bad JSON, the item without geometry, the duplicate, by their lines
    assert "duplicate id" in expected.rejected[-1].reason
    assert [str(rejection) for rejection in got.rejected] == [str(rejection) for rejection in expected.rejected[:2]]
    assert expected.rejected[0].source.endswith("a.ndjson:101")
    assert got.items_read == expected.items_read
    # The repeated id is skipped (unchanged) if its first part's commit landed before the second part looked, else
    # staged again as a replacement: either way the table holds it once.
    assert got.rows_added + got.skipped == expected.rows_added + 1
    assert _exported(spread) == _exported(alone)
    landed, alone_landed = _landed(spread_lines.getvalue()), _landed(alone_lines.getvalue())
    assert landed in (alone_landed, sorted([*alone_landed, (f"{sources[0] / 'a.ndjson'}:502", "item-0010")]))
    parts = {commit_message(spread, commit.snapshot_id) for commit in got.commits}
    assert len(parts) > 10, "the sources were not read in parts"
    assert got.stages and got.stages["parse"] > 0

    # Again: everything is there, unchanged, and nothing is committed.
    again = ingest_with_ray(spread, sources, workers=2, assets="none", batch_size=200)
    assert again.commits == [] and again.skipped == expected.rows_added + 1
    assert _exported(spread) == _exported(alone)


def commit_message(repository: Repository, snapshot_id: str) -> str:
    """The part a commit came from (``floe ingest (part N) (batch M)``)."""
    message = next(entry.message for entry in repository.log() if entry.snapshot_id == snapshot_id)
    return message.split(" (batch")[0]
