"""One granule stream for both drivers: the same input is accepted and rejected the same way with or without Ray."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ingest import Repository
from ingest.pipeline import IngestReport, granule_stream, ingest_items, ingest_with_ray
from tests.conftest import make_item


def hostile_folder(folder: Path) -> Path:
    """Good items mixed with every kind of bad input the stream must name (and a collection)."""
    folder.mkdir()
    good = [make_item(f"good-{n}", "c") for n in range(5)]
    no_id = make_item("x", "c")
    del no_id["id"]
    bad_geometry = make_item("bad-geometry", "c")
    bad_geometry["geometry"] = {"type": "Polygon", "coordinates": [[[0, 0], [1, 1]]]}  # GEOS: too few points
    lines = [
        json.dumps(good[0]),
        "{not json",
        json.dumps(no_id),
        json.dumps(bad_geometry),
        json.dumps(make_item("../escape", "c")),
        json.dumps(make_item("bad-collection", "c/../d")),
        json.dumps(good[1]),
        json.dumps(good[0]),  # a duplicate of the first line
        json.dumps({**make_item("no-datetime", "c"), "properties": {}}),
    ]
    (folder / "items.ndjson").write_text("\n".join(lines) + "\n")
    (folder / "more.json").write_text(json.dumps({"type": "FeatureCollection", "features": good[2:]}))
    (folder / "broken.json").write_text("[1, 2")
    collection = {"type": "Collection", "id": "c", "description": "c", "license": "other", "links": []}
    (folder / "collection.json").write_text(json.dumps(collection))
    (folder / "bad-collection.json").write_text(json.dumps({**collection, "id": ".hidden"}))
    return folder


def rejection_set(report: IngestReport) -> set[tuple[str, str | None, str]]:
    return {(rejection.source, rejection.item_id, rejection.reason) for rejection in report.rejected}


def test_the_stream_names_every_bad_input_and_yields_the_rest_in_order(tmp_path):
    folder = hostile_folder(tmp_path / "in")
    repository = Repository.create(tmp_path / "repo")
    report = IngestReport()
    granules = list(granule_stream(repository, [folder], report, branch="main", chunk=3))
    assert [granule.item["id"] for granule in granules] == [f"good-{n}" for n in (0, 1, 2, 3, 4)]
    # source label (file name and line or position) -> (item id, reason)
    found = {Path(source).name: (item_id, reason) for source, item_id, reason in rejection_set(report)}
    assert "not valid JSON" in found["items.ndjson:2"][1]
    assert found["items.ndjson:3"] == (None, "item has no id")
    assert found["items.ndjson:4"][0] == "bad-geometry" and "not valid GeoJSON" in found["items.ndjson:4"][1]
    assert found["items.ndjson:5"][0] == "../escape" and "path separator" in found["items.ndjson:5"][1]
    assert found["items.ndjson:6"][0] == "bad-collection" and "path separator" in found["items.ndjson:6"][1]
    assert found["items.ndjson:8"] == ("good-0", f"duplicate id (first seen in {folder / 'items.ndjson'}:1)")
    assert found["items.ndjson:9"][0] == "no-datetime" and "datetime" in found["items.ndjson:9"][1]
    assert "not valid JSON" in found["broken.json"][1]
    assert found["bad-collection.json"][0] == ".hidden" and "refused" in found["bad-collection.json"][1]
    assert len(report.rejected) == len(found) == 9
    assert report.items_read == 11  # every item parsed from a readable source, good or bad (8 + 3)
    assert "c" in repository.collections()


@pytest.mark.usefixtures("ray_cluster")
def test_with_and_without_ray_the_same_input_is_rejected_the_same_way(tmp_path):
    folder = hostile_folder(tmp_path / "in")
    without = ingest_items(Repository.create(tmp_path / "without"), [folder], batch_size=2)
    with_ray = ingest_with_ray(Repository.create(tmp_path / "with"), [folder], workers=1, batch_size=2, assets="none")
    assert rejection_set(without) == rejection_set(with_ray)
    assert len(without.rejected) == 9
    assert without.rows_added == with_ray.rows_added == 5
    assert without.items_read == with_ray.items_read
