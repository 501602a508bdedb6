"""The items table records the order its files follow: (floe:hilbert, datetime), as an Iceberg sort order.

Other engines see the clustering in the table's metadata: the sort order
names the ``floe:hilbert`` column (the Hilbert index of each row's bbox
centre) and ``datetime``, and every data file floe writes, by ingest or by
compaction, says it follows that order and really does. The key is floe's,
not the item's: it never appears in an item, a queryable or an export.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from pyiceberg.table.sorting import NullOrder, SortDirection

from ingest import Repository, Settings
from ingest.api._collections import queryables
from ingest.export import export_geoparquet
from ingest.repository import _catalog
from ingest.repository._append import ManifestCache
from ingest.stac import HILBERT
from ingest.stac._spatial import spatial_key
from tests import invariants
from tests.conftest import make_item, with_square


def _items(prefix: str, count: int) -> list[dict]:
    items = []
    for n in range(count):
        item = make_item(f"{prefix}{n}", "c", when=f"2024-01-{1 + n % 28:02d}T{n % 24:02d}:00:00Z")
        # Places spread over the globe, several items per place so the datetime tie-break matters.
        items.append(with_square(item, (n // 3 * 37.7) % 350 - 175, (n // 3 * 23.3) % 160 - 80, 1))
    return items


def _commit(repository: Repository, items: list[dict]) -> None:
    writer = repository.writer()
    for item in items:
        writer.add_item(item)
    writer.commit("batch")


def _assert_files_follow_the_order(repository: Repository) -> int:
    """Every live file says it follows the table's sort order, holds the right keys and is in that order."""
    table = repository.view().table
    order_id = table.sort_order().order_id
    files = ManifestCache(repository.io).live_files(table.metadata)
    for path, data_file in files.items():
        assert data_file.sort_order_id == order_id, path
        with repository.io.new_input(path).open() as stream:
            rows = pq.read_table(stream, columns=["bbox", "datetime", HILBERT])
        keys = rows.column(HILBERT).combine_chunks()
        expected = spatial_key(rows.column("bbox"))
        missing = expected == np.iinfo(np.uint64).max
        assert keys.is_null().to_pylist() == missing.tolist()
        assert keys.fill_null(0).to_numpy().tolist() == np.where(missing, 0, expected).astype(np.int64).tolist()
        # (key ascending, nulls last; then datetime ascending): consecutive rows never go backwards.
        sortable = [
            (key is None, key or 0, when)
            for key, when in zip(keys.to_pylist(), rows.column("datetime").to_pylist(), strict=True)
        ]
        assert sortable == sorted(sortable), path
    return len(files)


def test_the_table_records_the_order_every_file_follows(tmp_path: Path) -> None:
    repository = Repository.create(tmp_path / "repo", Settings(optimize={"target_file_rows": 20}))
    order = repository.view().table.sort_order()
    schema = repository.view().table.schema()
    assert [schema.find_column_name(field.source_id) for field in order.fields] == [HILBERT, "datetime"]
    assert all(
        field.direction == SortDirection.ASC and field.null_order == NullOrder.NULLS_LAST for field in order.fields
    )
    assert order.order_id != 0  # 0 is Iceberg's "unsorted"

    for batch in range(3):
        _commit(repository, _items(f"b{batch}-", 30))
    assert _assert_files_follow_the_order(repository) == 3

    repository.optimize()
    assert _assert_files_follow_the_order(repository) == 5  # 90 rows in a run of files of 18
    invariants.assert_check_passes(repository)


def test_the_key_is_never_an_item_member_a_queryable_or_an_exported_column(tmp_path: Path) -> None:
    repository = Repository.create(tmp_path / "repo")
    items = _items("a", 10)
    items[0]["properties"][HILBERT] = "an item's own property of that name"
    items[1][HILBERT] = 12  # and a foreign top-level member of that name
    _commit(repository, items)

    assert sorted(repository.view().items(), key=lambda item: item["id"]) == sorted(items, key=lambda i: i["id"])
    assert HILBERT not in queryables(repository.view().table.schema())["properties"]
    exported = tmp_path / "items.parquet"
    export_geoparquet(repository.view(), exported)
    assert HILBERT not in pq.read_schema(exported).names


def test_a_table_made_before_the_key_records_the_order_with_its_next_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    definition = json.loads(_catalog.SCHEMA_FILE.read_text())
    definition["schema"]["fields"] = [f for f in definition["schema"]["fields"] if f["name"] != HILBERT]
    del definition["sort-order"]
    legacy = tmp_path / "items-before-the-key.json"
    legacy.write_text(json.dumps(definition))
    monkeypatch.setattr(_catalog, "SCHEMA_FILE", legacy)
    repository = Repository.create(tmp_path / "repo")
    monkeypatch.undo()
    table = repository.view().table
    assert table.sort_order().is_unsorted and HILBERT not in table.schema().column_names

    _commit(repository, _items("a", 12))

    table = repository.view().table
    assert [table.schema().find_column_name(field.source_id) for field in table.sort_order().fields] == [
        HILBERT,
        "datetime",
    ]
    assert str(table.schema().find_type(HILBERT)) == "long"
    assert _assert_files_follow_the_order(repository) == 1
