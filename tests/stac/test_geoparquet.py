"""stac-geoparquet rows become the items stac-geoparquet's own reader makes, a batch at a time, faster."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import stac_geoparquet.arrow as sga

from ingest.pipeline import read_items
from ingest.stac import geoparquet_items
from tests.conftest import load_real_items, make_item


def _written(items: list[dict], path: Path, *, rows_per_group: int | None = None) -> Path:
    table = pa.Table.from_batches(sga.parse_stac_items_to_arrow(items))
    if rows_per_group is not None:
        table = pa.Table.from_batches(table.to_batches(max_chunksize=rows_per_group))
    sga.to_parquet(table, path)
    return path


def _both(path: Path) -> tuple[list[dict], list[dict]]:
    """The file's items as stac-geoparquet reads them and as floe does, batch by batch."""
    theirs = list(sga.stac_table_to_items(pq.read_table(path)))
    ours = [item for batch in pq.ParquetFile(path).iter_batches() for item in geoparquet_items(batch)]
    return theirs, ours


def test_the_real_items_of_each_collection_read_as_stac_geoparquet_reads_them(tmp_path):
    by_collection: dict[str, list[dict]] = {}
    for item in load_real_items():
        by_collection.setdefault(item.get("collection", "none"), []).append(item)
    with_proj_geometry = 0
    for collection, items in by_collection.items():
        theirs, ours = _both(_written(items, tmp_path / f"{collection}.parquet"))
        assert ours == theirs, collection
        assert [item["id"] for item in ours] == [item["id"] for item in items]
        with_proj_geometry += any(
            "proj:geometry" in item["properties"]
            or any("proj:geometry" in (asset or {}) for asset in item["assets"].values())
            for item in ours
        )
    assert with_proj_geometry >= 2  # proj:geometry, in properties and in assets, is decoded too


def _shapes() -> list[dict]:
    point = make_item("point", "mixed")
    point["geometry"] = {"type": "Point", "coordinates": [12.345678901234567, -45.000000000000014]}
    point["bbox"] = [12.345678901234567, -45.000000000000014, 12.345678901234567, -45.000000000000014]
    multi = make_item("multi", "mixed")
    multi["geometry"] = {
        "type": "MultiPolygon",
        "coordinates": [
            [[[0.1, 0.1], [1.1, 0.1], [1.1, 1.1], [0.1, 0.1]]],
            [[[2.0, 2.0], [3.0, 2.0], [3.0, 3.0], [2.0, 2.0]], [[2.2, 2.2], [2.8, 2.2], [2.8, 2.8], [2.2, 2.2]]],
        ],
    }
    multi["bbox"] = [0.1, 0.1, 3.0, 3.0]
    multi["assets"]["thumbnail"] = {"href": "https://example.com/thumb.png", "roles": ["thumbnail"]}
    ranged = make_item("ranged", "mixed", when="2024-03-01T00:00:00Z")
    ranged["properties"].update(
        {"datetime": None, "start_datetime": "2024-03-01T00:00:00Z", "end_datetime": "2024-03-31T23:59:59Z"}
    )
    return [point, multi, ranged]


def test_rows_of_different_shapes_and_assets_read_alike(tmp_path):
    items = _shapes()

    theirs, ours = _both(_written(items, tmp_path / "mixed.parquet", rows_per_group=2))

    assert ours == theirs
    assert ours[0]["geometry"] == items[0]["geometry"]  # the same doubles, through GEOS's text
    assert ours[1]["geometry"] == items[1]["geometry"]
    assert "thumbnail" in ours[1]["assets"] and "thumbnail" not in ours[0]["assets"]  # a row's missing asset


def test_proj_geometry_of_an_asset_some_rows_lack_is_read(tmp_path):
    items = _shapes()
    footprint = {"type": "Polygon", "coordinates": [[[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 0.0]]]}
    items[1]["assets"]["thumbnail"]["proj:geometry"] = footprint
    items[1]["properties"]["proj:geometry"] = footprint
    path = _written(items, tmp_path / "footprints.parquet")
    # stac-geoparquet's reader fails on the rows without that asset (a null WKB); floe's reads every row.
    with pytest.raises(AttributeError):
        list(sga.stac_table_to_items(pq.read_table(path)))

    ours = [item for batch in pq.ParquetFile(path).iter_batches() for item in geoparquet_items(batch)]

    assert [item["id"] for item in ours] == ["point", "multi", "ranged"]
    assert ours[1]["assets"]["thumbnail"]["proj:geometry"] == footprint
    assert ours[1]["properties"]["proj:geometry"] == footprint
    assert "thumbnail" not in ours[0]["assets"] and ours[0]["properties"]["proj:geometry"] is None


def test_a_local_file_is_read_batch_by_batch_and_a_broken_batch_ends_it_with_the_reason(tmp_path):
    items = [make_item(f"row-{n}") for n in range(9)]
    path = _written(items, tmp_path / "groups.parquet", rows_per_group=3)
    metadata = pq.ParquetFile(path).metadata
    assert metadata.num_row_groups == 3
    # The last row group's first page is overwritten: the rows before it are read, then the file fails.
    start = metadata.row_group(2).column(0).data_page_offset
    data = bytearray(path.read_bytes())
    data[start : start + 64] = b"\xff" * 64
    path.write_bytes(bytes(data))

    read = list(read_items([path]))

    assert [entry.item["id"] for entry in read if entry.item is not None] == [f"row-{n}" for n in range(6)]
    assert read[5].source == f"{path}#row5"
    (failed,) = [entry for entry in read if entry.error is not None]
    assert failed.source == str(path) and str(failed.error).startswith("not a readable stac-geoparquet file (")


@pytest.mark.parametrize("payload", [b"not parquet at all", b"PAR1" + b"\x00" * 32 + b"PAR1"])
def test_a_file_that_is_no_stac_geoparquet_is_named_so(tmp_path, payload):
    path = tmp_path / "broken.parquet"
    path.write_bytes(payload)
    (failed,) = read_items([path])
    assert failed.source == str(path) and str(failed.error).startswith("not a readable stac-geoparquet file (")
