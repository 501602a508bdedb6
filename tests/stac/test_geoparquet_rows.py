"""stac-geoparquet batches become floe's rows on columns: each row vouched for decodes to exactly the item the item
path stores for it, and every row the item path would refuse (or might read otherwise) is left to it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from ingest.errors import InvalidItem
from ingest.stac import arrow_to_items, geoparquet_items, geoparquet_rows, items_to_arrow, validate_item
from tests.conftest import load_real_items
from tests.stac._geoparquet_cases import BAD_COLLECTION, INVALID, awkward_items, write_geoparquet


def _text(value: Any) -> str:
    """A JSON value as text with sorted keys (NaN written, so it compares equal to itself)."""
    return json.dumps(value, sort_keys=True)


def _stored_by_item_path(batch: pa.RecordBatch) -> list[dict[str, Any] | InvalidItem]:
    """Each row as the item path stores and reads it back, or its refusal."""
    stored: list[dict[str, Any] | InvalidItem] = []
    for item in geoparquet_items(batch):
        try:
            valid = validate_item(item)
        except InvalidItem as error:
            stored.append(error)
            continue
        stored.append(next(arrow_to_items(items_to_arrow([valid]))))
    return stored


def _one_batch(path: Path) -> pa.RecordBatch:
    (batch,) = pq.read_table(path).to_batches()
    return batch


def _assert_same_as_item_path(batch: pa.RecordBatch) -> tuple[set[str], set[str]]:
    """The rows vouched for decode to what the item path stores; returns the ids vouched for and left."""
    mapped = geoparquet_rows(batch)
    assert mapped is not None
    expected = _stored_by_item_path(batch)
    ids = batch.column("id").to_pylist()
    decoded = list(arrow_to_items(mapped.table))
    assert len(decoded) == len(mapped.rows)
    for row, item in zip(mapped.rows, decoded, strict=True):
        wanted = expected[row]
        assert not isinstance(wanted, InvalidItem), f"{ids[row]} was vouched for, but the item path refuses it"
        assert _text(item) == _text(wanted), ids[row]
    assert sorted([*mapped.rows, *mapped.others]) == list(range(batch.num_rows))
    return {ids[row] for row in mapped.rows}, {ids[row] for row in mapped.others}


def test_awkward_rows_decode_to_what_the_item_path_stores_and_refusals_are_left_to_it(tmp_path):
    batch = _one_batch(write_geoparquet(awkward_items(), tmp_path / "awkward.parquet"))
    vouched, left = _assert_same_as_item_path(batch)
    # Every refusal is the item path's to name; so is what these checks cannot vouch for cheaply (a non-ASCII id,
    # a bbox across the antimeridian). Everything else comes as rows.
    assert left == {*INVALID, BAD_COLLECTION, "ünïcode-id", "item-antimeridian"}
    assert "item-plain" in vouched and "item-sparse" in vouched and "item-huge" in vouched
    assert len(vouched) == batch.num_rows - len(left)


def test_the_real_items_of_each_collection_decode_as_the_item_path_stores_them(tmp_path):
    by_collection: dict[str, list[dict]] = {}
    for item in load_real_items():
        by_collection.setdefault(item.get("collection", "none"), []).append(item)
    read_as_rows = 0
    for collection, items in by_collection.items():
        batch = _one_batch(write_geoparquet(items, tmp_path / f"{collection}.parquet"))
        if geoparquet_rows(batch) is None:
            continue  # a layout left whole to the item path (a 3D bbox)
        vouched, _ = _assert_same_as_item_path(batch)
        read_as_rows += len(vouched)
    assert read_as_rows >= 40, "most real items should come as rows"


def test_rows_of_many_batches_and_groups_hold_what_the_item_path_stores(tmp_path):
    items = awkward_items() * 3
    for index, item in enumerate(items):
        item["id"] = f"{item['id']}-{index}" if item["id"] not in INVALID else item["id"]
    path = write_geoparquet(items, tmp_path / "groups.parquet", rows_per_group=7)
    for batch in pq.ParquetFile(path).iter_batches(batch_size=7):
        _assert_same_as_item_path(batch)


def _with_column(batch: pa.RecordBatch, name: str, values: pa.Array) -> pa.RecordBatch:
    index = batch.schema.get_field_index(name)
    if index < 0:
        return batch.append_column(name, values)
    return batch.set_column(index, name, values)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(
            lambda b: _with_column(b, "datetime", b.column("datetime").cast(pa.timestamp("ns", "UTC"))), id="ns"
        ),
        pytest.param(lambda b: _with_column(b, "datetime", b.column("datetime").cast(pa.timestamp("us"))), id="naive"),
        pytest.param(lambda b: _with_column(b, "count", pa.array([2**64 - 1] * b.num_rows, pa.uint64())), id="uint64"),
        pytest.param(lambda b: _with_column(b, "day", pc.cast(b.column("datetime"), pa.date32())), id="date"),
        pytest.param(lambda b: b.drop_columns(["assets"]), id="no-assets"),
        pytest.param(
            lambda b: _with_column(b, "properties", pa.array([{"a": 1}] * b.num_rows)), id="nested-properties"
        ),
    ],
)
def test_a_layout_it_does_not_read_is_left_whole_to_the_item_path(tmp_path, change):
    batch = _one_batch(write_geoparquet(awkward_items()[:3], tmp_path / "plain.parquet"))
    assert geoparquet_rows(batch) is not None
    assert geoparquet_rows(change(batch)) is None


def test_rows_whose_extensions_are_all_empty_decode_as_the_item_path_stores_them(tmp_path):
    items = [{**item, "stac_extensions": []} for item in awkward_items()]
    batch = _one_batch(write_geoparquet(items, tmp_path / "no-extensions.parquet"))
    assert pa.types.is_null(batch.schema.field("stac_extensions").type.value_type)
    vouched, _ = _assert_same_as_item_path(batch)
    assert "item-plain" in vouched
