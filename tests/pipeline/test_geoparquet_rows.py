"""A metadata-only ingest of stac-geoparquet takes the rows it can vouch for as rows (never items): the same
table, export and rejections as the item path, a re-run that skips, a change that replaces, and a column the
table types otherwise written as the item path writes it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import ingest.pipeline.sources._geoparquet as geoparquet_source
from ingest import Repository, Settings
from ingest.pipeline import ingest_items
from ingest.pipeline._report import IngestReport
from tests.pipeline._compare import exported, rejections
from tests.stac._geoparquet_cases import awkward_items, write_geoparquet


@pytest.fixture
def rows_seen(monkeypatch) -> list[int]:
    """How many rows each batch gave as rows (the row path ran)."""
    seen: list[int] = []
    vouch = geoparquet_source.geoparquet_rows

    def counting(batch: Any) -> Any:
        mapped = vouch(batch)
        seen.append(0 if mapped is None else len(mapped.rows))
        return mapped

    monkeypatch.setattr(geoparquet_source, "geoparquet_rows", counting)
    return seen


def _item_path(monkeypatch) -> None:
    """Every row of every batch made into an item, as before the row path."""
    monkeypatch.setattr(geoparquet_source, "geoparquet_rows", lambda batch: None)


def _awkward_file(path: Path) -> Path:
    """The awkward cases three times over (unique ids), in row groups of 7, a duplicate of an earlier row last."""
    items = []
    for copy in range(3):
        for item in awkward_items():
            item["id"] = f"{item['id']}-{copy}" if item["id"].startswith("item-") else item["id"]
            items.append(item)
    items.append({**items[0], "properties": {**items[0]["properties"], "platform": "again"}})
    return write_geoparquet(items, path, rows_per_group=7)


def _ingested(root: Path, source: Path | str, **options: Any) -> tuple[Repository, IngestReport]:
    repository = Repository.create(str(root), Settings())
    return repository, ingest_items(repository, [source], **options)


def test_rows_ingest_exports_and_rejects_what_the_item_path_does(tmp_path, monkeypatch, rows_seen):
    source = _awkward_file(tmp_path / "awkward.parquet")
    rows_repository, rows_report = _ingested(tmp_path / "rows", source, batch_size=10)
    assert sum(rows_seen) > 40, "the rows did not come as rows"
    _item_path(monkeypatch)
    items_repository, items_report = _ingested(tmp_path / "items", source, batch_size=10)

    assert exported(rows_repository) == exported(items_repository)
    assert rejections(rows_report) == rejections(items_report)
    # The duplicate is refused by the row it repeats, and each refusal names its row.
    assert any("duplicate id (first seen in" in reason for _, _, reason in rejections(rows_report))
    assert all("#row" in source for source, _, _ in rejections(rows_report))
    assert rows_report.rows_added == items_report.rows_added
    # Batches fill to their size in rows as in items: the same commits.
    assert len(rows_report.commits) == len(items_report.commits)


def test_a_rerun_skips_every_row_and_a_changed_row_replaces_its_item(tmp_path, rows_seen):
    items = awkward_items()
    first = write_geoparquet(items, tmp_path / "first.parquet")
    repository, report = _ingested(tmp_path / "repo", first)
    assert sum(rows_seen) > 0
    added = report.rows_added

    again = ingest_items(repository, [first])
    assert again.skipped == added and not again.commits

    changed = [dict(item) for item in items]
    plain = next(index for index, item in enumerate(changed) if item["id"] == "item-plain")
    changed[plain] = {**changed[plain], "properties": {**changed[plain]["properties"], "platform": "s2b"}}
    report = ingest_items(repository, [write_geoparquet(changed, tmp_path / "changed.parquet")])
    assert (report.skipped, report.replaced, report.rows_added) == (added - 1, 1, 1)
    by_id = {json.loads(text)["id"]: json.loads(text) for text in exported(repository)}
    assert by_id["item-plain"]["properties"]["platform"] == "s2b"
    assert len(by_id) == added


def test_a_column_the_table_types_otherwise_is_written_as_the_item_path_writes_it(tmp_path, monkeypatch, rows_seen):
    # The table holds gsd as text first; the file's gsd is an integer column.
    (earlier,) = [item for item in awkward_items() if item["id"] == "item-plain"]
    earlier = {**earlier, "id": "earlier", "properties": {**earlier["properties"], "gsd": "ten"}}
    text = tmp_path / "earlier.ndjson"
    text.write_text(json.dumps(earlier) + "\n")
    source = write_geoparquet(awkward_items(), tmp_path / "awkward.parquet")

    exports = []
    for name in ("rows", "items"):
        if name == "items":
            _item_path(monkeypatch)
        repository, _ = _ingested(tmp_path / name, text)
        report = ingest_items(repository, [source])
        assert report.rows_added > 10
        exports.append(exported(repository))
    assert sum(rows_seen) > 0
    assert exports[0] == exports[1]
    by_id = {json.loads(text)["id"]: json.loads(text) for text in exports[0]}
    assert by_id["earlier"]["properties"]["gsd"] == "ten"
    assert by_id["item-plain"]["properties"]["gsd"] == 10


def test_rows_from_a_url_export_what_the_item_path_does_relative_hrefs_made_absolute(
    tmp_path, monkeypatch, rows_seen, http_server
):
    # Row groups of 7: the one holding a relative href ("t.png") is read as items, to be made absolute.
    source = _awkward_file(http_server.folder / "awkward.parquet")
    url = f"{http_server.url}/{source.name}"
    rows_repository, rows_report = _ingested(tmp_path / "rows", url)
    as_rows = sum(rows_seen)
    assert as_rows > 20
    _item_path(monkeypatch)
    items_repository, items_report = _ingested(tmp_path / "items", url)

    assert exported(rows_repository) == exported(items_repository)
    assert rejections(rows_report) == rejections(items_report)
    hrefs = [json.loads(text)["assets"]["thumb"]["href"] for text in exported(rows_repository) if '"thumb"' in text]
    assert hrefs and all(href == f"{http_server.url}/t.png" for href in hrefs)
