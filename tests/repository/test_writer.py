"""The writer's commit loop, driven deterministically: two writers from one base, replays, refusals."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import shapely

from ingest import CommitConflict, ConflictRetriesExhausted, Repository, Settings, WriterClosed
from ingest.config import CommitSettings
from tests.conftest import make_item


def data_files(repo: Repository) -> list[Path]:
    return sorted(Path(repo.location.url, "tables", "items", "data").rglob("*.parquet"))


def ids_at(repo: Repository, ref: str = "main") -> Counter[str]:
    return Counter(item["id"] for item in repo.view(ref).items())


def stage(writer, collection: str, group: str, value: int, ids: list[str], **properties) -> None:
    array = writer.item_group(collection, group).create_array("band", shape=(3,), dtype="int16")
    array[:] = value
    for item_id in ids:
        writer.add_item(make_item(item_id, collection, **properties))


def test_second_writer_from_same_base_reconciles(repo):
    repo.ensure_groups(["c"])
    first, second = repo.writer(), repo.writer()
    stage(first, "c", "g1", 1, ["a1", "a2"])
    stage(second, "c", "g2", 2, ["b1", "b2", "b3"])
    one = first.commit("first")
    two = second.commit("second")

    assert one.attempts == 1 and two.attempts == 2
    assert ids_at(repo) == Counter({"a1": 1, "a2": 1, "b1": 1, "b2": 1, "b3": 1})
    tip = repo.view()
    assert (tip.arrays("c/g1")["band"][:] == 1).all()
    assert (tip.arrays("c/g2")["band"][:] == 2).all()
    # The replay re-registered the files the second writer had already written.
    assert two.files_rewritten == 0
    assert len(data_files(repo)) == 2  # one per writer: the retry wrote none
    # The snapshot of the first commit still shows only its own rows.
    assert ids_at(repo, one.snapshot_id) == Counter({"a1": 1, "a2": 1})
    log = repo.log()
    assert [entry.message for entry in log[:2]] == ["second", "first"]
    assert log[0].attempts == 2 and log[0].rows_added == 3


def test_concurrent_schema_unions_both_land(repo):
    first, second = repo.writer(), repo.writer()
    first.add_items([make_item(f"a{i}", "c", alpha=i) for i in range(3)])
    second.add_items([make_item(f"b{i}", "c", beta=f"value {i}") for i in range(3)])
    first.commit("adds alpha")
    result = second.commit("adds beta")
    assert result.attempts == 2

    view = repo.view()
    names = view.table.schema().column_names
    assert "alpha" in names and "beta" in names
    rows = {item["id"]: item["properties"] for item in view.items()}
    assert [rows[f"a{i}"]["alpha"] for i in range(3)] == [0, 1, 2]
    assert [rows[f"b{i}"]["beta"] for i in range(3)] == ["value 0", "value 1", "value 2"]
    assert "beta" not in rows["a0"] and "alpha" not in rows["b0"]


def test_concurrent_conflicting_types_are_kept_losslessly(repo):
    first, second = repo.writer(), repo.writer()
    first.add_items([make_item(f"a{i}", "c", gamma=i) for i in range(3)])
    second.add_items([make_item(f"b{i}", "c", gamma=f"text {i}") for i in range(3)])
    first.commit("gamma as integers")
    result = second.commit("gamma as text")

    assert result.attempts == 2
    assert result.files_rewritten == 1  # the one real conflict re-plans its file
    field = repo.view().table.schema().find_field("gamma")
    assert str(field.field_type) == "long"
    rows = {item["id"]: item["properties"]["gamma"] for item in repo.view().items()}
    assert rows == {"a0": 0, "a1": 1, "a2": 2, "b0": "text 0", "b1": "text 1", "b2": "text 2"}


def test_retries_exhausted_commits_nothing(tmp_path):
    settings = Settings(commit=CommitSettings(max_attempts=1))
    repo = Repository.create(tmp_path / "repo", settings)
    first, second = repo.writer(), repo.writer()
    first.add_item(make_item("a", "c"))
    second.add_item(make_item("b", "c"))
    first.commit("wins")
    with pytest.raises(ConflictRetriesExhausted, match="lost 1 races"):
        second.commit("loses")
    assert ids_at(repo) == Counter({"a": 1})
    with pytest.raises(WriterClosed):
        second.add_item(make_item("c", "c"))


def test_same_item_group_from_two_writers_is_refused(repo):
    repo.ensure_groups(["c"])
    first, second = repo.writer(), repo.writer()
    stage(first, "c", "same", 1, ["x"])
    stage(second, "c", "same", 2, ["x"])
    first.commit("first")
    with pytest.raises(CommitConflict) as refused:
        second.commit("second")
    assert "/c/same" in refused.value.paths
    tip = repo.view()
    assert (tip.arrays("c/same")["band"][:] == 1).all()
    assert ids_at(repo) == Counter({"x": 1})


def test_arrays_only_commit_keeps_the_table_version(repo):
    before = repo.view().metadata_location
    writer = repo.writer()
    array = writer.item_group("c", "only-arrays").create_array("band", shape=(2,), dtype="uint8")
    array[:] = 7
    result = writer.commit("arrays only")
    assert result.rows_added == 0
    assert repo.view().metadata_location == before
    assert (repo.view().arrays("c/only-arrays")["band"][:] == 7).all()


def test_collection_group_is_created_once_for_concurrent_writers(repo):
    first, second = repo.writer(), repo.writer()
    stage(first, "new", "g1", 1, ["a"])
    stage(second, "new", "g2", 2, ["b"])  # finds /new created by the first writer's own commit
    first.commit("first")
    second.commit("second")
    assert set(repo.view().arrays("new").group_keys()) == {"g1", "g2"}
    creations = [entry for entry in repo.log() if entry.message.startswith("floe: create")]
    assert len(creations) == 1


def test_table_metadata_stays_small_and_manifests_bounded(tmp_path):
    repo = Repository.create(tmp_path / "repo", Settings())
    locations = []
    for number in range(40):
        writer = repo.writer()
        writer.add_item(make_item(f"i{number}", "c"))
        locations.append(writer.commit(f"commit {number}").metadata_location)
    table = repo.view().table
    assert len(table.metadata.snapshots) <= repo.settings.commit.snapshot_log
    assert len(table.current_snapshot().manifests(repo.io)) <= 16
    assert sum(ids_at(repo).values()) == 40
    # Iceberg's own cleanup is off: every older table version is still there for older snapshots.
    assert table.metadata.properties["gc.enabled"] == "false"
    assert table.metadata.properties["write.metadata.delete-after-commit.enabled"] == "false"
    assert all(Path(location).exists() for location in locations)
    assert Counter(item["id"] for item in repo.view(repo.log()[-1 - 5].snapshot_id).items()) == Counter(
        f"i{n}" for n in range(5)
    )


def test_data_files_are_geoparquet(repo):
    writer = repo.writer()
    writer.add_items([make_item(f"i{n}", "c") for n in range(5)])
    writer.commit("geoparquet")
    (path,) = data_files(repo)
    metadata = pq.read_metadata(path).metadata
    geo = json.loads(metadata[b"geo"])
    assert geo["primary_column"] == "geometry" and geo["columns"]["geometry"]["encoding"] == "WKB"
    assert b"stac-geoparquet" in metadata
    assert "collection=c" in str(path) and "datetime_month=2024-01" in str(path)
    table = pq.read_table(path)
    points = shapely.from_wkb(table.column("geometry").to_pylist())
    assert np.all(shapely.get_type_id(points) == 0)


def test_partition_pruning_uses_collection_and_month(repo):
    writer = repo.writer()
    writer.add_items([make_item(f"a{n}", "c1", when="2024-01-05T00:00:00Z") for n in range(3)])
    writer.add_items([make_item(f"b{n}", "c2", when="2024-03-05T00:00:00Z") for n in range(3)])
    writer.commit("two partitions")
    table = repo.view().table
    assert len(list(table.scan().plan_files())) == 2
    planned = list(table.scan(row_filter="collection == 'c2'").plan_files())
    assert len(planned) == 1 and "collection=c2" in planned[0].file.file_path
    by_time = list(table.scan(row_filter="datetime >= '2024-02-01T00:00:00+00:00'").plan_files())
    assert len(by_time) == 1 and "datetime_month=2024-03" in by_time[0].file.file_path


def test_schema_history_is_trimmed_with_the_snapshot_log(repo):
    for number in range(12):
        writer = repo.writer()
        writer.add_item(make_item(f"i{number}", "c", **{f"prop{number}": number}))
        writer.commit(f"adds prop{number}")
    table = repo.view().table
    assert len(table.metadata.schemas) <= repo.settings.commit.snapshot_log + 1
    assert all(f"prop{n}" in table.schema().column_names for n in range(12))
    rows = {item["id"]: item["properties"] for item in repo.view().items()}
    assert all(rows[f"i{n}"][f"prop{n}"] == n for n in range(12))


def test_pystac_items_are_accepted(repo):
    import pystac

    item = pystac.Item.from_dict(make_item("from-pystac", "c", platform="sentinel-2a"))
    writer = repo.writer()
    writer.add_item(item)
    writer.commit("pystac")
    (stored,) = list(repo.view().items())
    assert stored["id"] == "from-pystac" and stored["collection"] == "c"
    assert stored["properties"]["platform"] == "sentinel-2a"
    assert stored["geometry"] == item.geometry


def test_manifest_merging_is_tiered_so_history_metadata_grows_near_linearly(tmp_path):
    """Merging every small manifest into one growing manifest rewrites the whole file list every few commits."""
    repo = Repository.create(tmp_path / "repo", Settings())
    commits = 160
    for number in range(commits):
        writer = repo.writer()
        writer.add_item(make_item(f"i{number}", "c"))
        writer.commit(f"commit {number}")
    manifests: dict[str, int] = {}
    for entry in repo.log():
        snapshot = repo.catalog.load_at(entry.metadata_location).current_snapshot()
        for manifest in snapshot.manifests(repo.io) if snapshot else []:
            manifests[manifest.manifest_path] = (manifest.added_files_count or 0) + (manifest.existing_files_count or 0)
    # Tiers of 16: each file is written once per tier it passes through (2 here); one growing manifest would
    # have written about commits**2 / 32 = 800 entries on top of the 160.
    assert sum(manifests.values()) <= 3 * commits
    tip = repo.view().table.current_snapshot().manifests(repo.io)
    assert len(tip) <= 2 * 15 + 1
    assert sum(ids_at(repo).values()) == commits
