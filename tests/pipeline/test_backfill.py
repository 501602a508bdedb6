"""A metadata backfill on Ray (``--assets none``): the sources cut into parts that actors read, check and commit
give the same items, the same rejections (by the file's own line and row) and the same ``--report`` as one process
reading them whole (issue 52, item 3). The two-node run is in test_two_node_cluster.py."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pytest
import stac_geoparquet.arrow as sga

from ingest import Repository, Settings
from ingest.export import export_ndjson
from ingest.pipeline import ingest_items, ingest_with_ray
from tests.conftest import make_item, with_square

pytestmark = pytest.mark.slow


def awkward_items(count: int) -> list[dict]:
    """Items as archives have them: huge properties, footprints across the antimeridian, nulls, big integers."""
    items = []
    for n in range(count):
        item = make_item(f"item-{n:04d}", ("optical", "radar")[n % 2], when=f"2024-{n % 12 + 1:02d}-07T10:00:00Z")
        if n % 50 == 0:
            item["properties"]["history"] = "processed; " * 2000
        if n % 7 == 0:
            ring = [[179.5, 10.0], [-179.5, 10.0], [-179.5, 11.0], [179.5, 11.0], [179.5, 10.0]]
            item["geometry"] = {"type": "Polygon", "coordinates": [ring]}
            item["bbox"] = [179.5, 10.0, -179.5, 11.0]
        if n % 5 == 0:
            item["properties"]["cloud_cover"] = None
        if n % 11 == 0:
            item["properties"]["checksum"] = 2**63 + n
        if n % 13 == 0:
            with_square(item, n % 90, -45.0, 0.5)
        items.append(item)
    return items


def write_sources(folder: Path) -> list[Path]:
    """A folder of NDJSON (with bad lines), stac-geoparquet (several row groups) and a FeatureCollection."""
    folder.mkdir(parents=True)
    items = awkward_items(900)
    lines = [json.dumps(item) for item in items[:600]]
    lines.insert(100, "{not json")
    lines.insert(333, json.dumps({"type": "Feature", "id": "no-geometry"}))
    lines.insert(400, "")
    lines.insert(500, json.dumps(items[10]))  # read twice in the same part: a duplicate
    (folder / "a.ndjson").write_text("\n".join(lines) + "\n")
    plain = [item for item in items[600:850] if "checksum" not in item["properties"]]  # Arrow has no uint64 here
    table = pa.Table.from_batches(sga.parse_stac_items_to_arrow(plain))
    sga.to_parquet(pa.Table.from_batches(table.to_batches(max_chunksize=40)), folder / "b.parquet")
    features = {"type": "FeatureCollection", "features": items[850:]}
    (folder / "c.json").write_text(json.dumps(features))
    return [folder]


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

    # Parts of about 16 kB: the NDJSON file in dozens of byte ranges, the Parquet file in runs of row groups.
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
