"""Items staged as floe's rows (``Writer.add_rows``) commit as items do: they replace the branch's versions, are
refused twice in one batch, and after a lost race against a commit that typed one of their columns otherwise
their file is written again, as its items would be."""

from __future__ import annotations

import io
import json

import pyarrow.parquet as pq
import pytest

from ingest import Repository, Settings
from ingest.errors import InvalidItem
from ingest.export import export_ndjson
from ingest.repository._files import month_of
from ingest.stac import arrow_to_items, geoparquet_rows
from tests.stac._geoparquet_cases import awkward_items, write_geoparquet


def _rows(tmp_path):
    """The awkward cases' rows that come as rows, and their ids."""
    (batch,) = pq.read_table(write_geoparquet(awkward_items(), tmp_path / "rows.parquet")).to_batches()
    mapped = geoparquet_rows(batch)
    assert mapped is not None
    return mapped.table, mapped.table.column("id").to_pylist()


def _exported(repository: Repository) -> dict[str, dict]:
    out = io.StringIO()
    export_ndjson(repository.view("main"), out)
    return {item["id"]: item for item in map(json.loads, out.getvalue().splitlines())}


def test_rows_replace_what_the_branch_holds_and_a_second_copy_is_refused(tmp_path):
    repository = Repository.create(str(tmp_path / "repo"), Settings())
    rows, ids = _rows(tmp_path)
    writer = repository.writer("main")
    writer.add_rows(rows, sources=[f"file#row{index}" for index in range(len(ids))])
    with pytest.raises(InvalidItem, match="already"):
        writer.add_rows(rows.slice(0, 1))
    assert writer.pending_items == len(ids)
    first = writer.commit("rows")
    assert first.rows_added == len(ids)
    # One data file per partition (collection, month; a range's rows have none), as the item path writes them.
    partitions = {(item["collection"], month_of(item)) for item in arrow_to_items(rows)}
    assert None in {month for _, month in partitions} and len({collection for collection, _ in partitions}) == 2
    assert first.files_written == len(partitions)

    again = repository.writer("main")
    again.add_rows(rows)
    second = again.commit("rows again")
    assert (second.rows_added, second.rows_replaced) == (len(ids), len(ids))
    assert sorted(_exported(repository)) == sorted(ids)


def test_rows_that_lose_a_race_to_a_column_typed_otherwise_are_written_again_as_items(tmp_path):
    repository = Repository.create(str(tmp_path / "repo"), Settings())
    repository.ensure_groups(["c1"])
    rows, ids = _rows(tmp_path)
    loser = repository.writer("main")
    loser.add_rows(rows)  # gsd: an integer column

    winner = repository.writer("main")
    (plain,) = [item for item in awkward_items() if item["id"] == "item-plain"]
    winner.add_item({**plain, "id": "winner", "properties": {**plain["properties"], "gsd": "ten"}})
    winner.commit("gsd as text")

    result = loser.commit("rows")
    assert result.attempts == 2 and result.files_rewritten >= 1
    exported = _exported(repository)
    assert exported["winner"]["properties"]["gsd"] == "ten"
    assert all(exported[item_id]["properties"]["gsd"] == 10 for item_id in ids)
    assert sorted(exported) == sorted([*ids, "winner"])


def _mapped(tmp_path, name: str, items: list[dict]):
    (batch,) = pq.read_table(write_geoparquet(items, tmp_path / f"{name}.parquet")).to_batches()
    mapped = geoparquet_rows(batch)
    assert mapped is not None and len(mapped.others) == 0
    return mapped.table


def test_rows_of_batches_with_other_columns_share_a_file_and_a_column_typed_otherwise_goes_apart(tmp_path):
    (plain,) = [item for item in awkward_items() if item["id"] == "item-plain"]

    def items(prefix: str, **properties: object) -> list[dict]:
        return [{**plain, "id": f"{prefix}-{n}", "properties": {**plain["properties"], **properties}} for n in range(3)]

    first = _mapped(tmp_path, "first", items("a", extra="x"))
    second = _mapped(tmp_path, "second", items("b", only_here=1))
    texts = _mapped(tmp_path, "texts", items("c", gsd="ten"))
    assert first.schema != second.schema
    repository = Repository.create(str(tmp_path / "repo"), Settings())
    writer = repository.writer("main")
    for rows in (first, second, texts):
        writer.add_rows(rows)
    result = writer.commit("three batches")
    # One partition: the first two batches in one file (a property the other lacks is absent there), the third,
    # whose gsd is text, apart.
    assert result.files_written == 2
    exported = _exported(repository)
    assert exported["a-0"]["properties"]["extra"] == "x" and "only_here" not in exported["a-0"]["properties"]
    assert exported["b-0"]["properties"]["only_here"] == 1 and "extra" not in exported["b-0"]["properties"]
    assert exported["c-0"]["properties"]["gsd"] == "ten" and exported["a-0"]["properties"]["gsd"] == 10
