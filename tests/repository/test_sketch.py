"""Id sketches beside the manifests: written with every commit (appends, merged and rewritten manifests, compaction),
exactly the live files' rows and id fingerprints, used by searches by ids instead of the files' ids, checked by
``check --deep``, kept by gc, carried by replicate and relocate; a table without them is searched as before."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

import ingest.repository._append as append
from ingest import Repository
from ingest.api import SearchEngine, SearchRequest
from ingest.lifecycle import check, gc, relocate, replicate
from ingest.repository import (
    SKETCHED,
    IdIndex,
    data_manifests,
    fingerprints,
    read_column,
    read_sketch,
    relative_to,
    sketch_location,
)
from tests.conftest import make_item


def commit_batch(repository: Repository, batch: int, size: int = 6) -> list[str]:
    writer = repository.writer()
    ids = [f"b{batch}-{number}" for number in range(size)]
    for number, item_id in enumerate(ids):
        writer.add_item(make_item(item_id, f"c{number % 2}", when=f"2024-0{batch % 3 + 1}-05T00:00:00Z"))
    writer.commit(f"batch {batch}")
    return ids


def current(repository: Repository):
    table = repository.table_at(repository.resolve())
    return table, table.current_snapshot()


def assert_sketches_match_files(repository: Repository) -> None:
    """Every data manifest of the current version has a sketch naming exactly its live files, each row's id
    fingerprint in row order (computed here from the files themselves)."""
    table, snapshot = current(repository)
    assert snapshot.summary.get(SKETCHED) == "true"
    for manifest in data_manifests(snapshot.manifests(repository.io)):
        sketch = read_sketch(repository.io, manifest.manifest_path)
        files = [e.data_file for e in manifest.fetch_manifest_entry(repository.io, discard_deleted=True)]
        expected = {}
        for data_file in files:
            ids = read_column(repository.io, data_file, "id").to_pylist()
            expected[relative_to(table.location(), data_file.file_path)] = fingerprints(ids).tolist()
        names = sketch.column("file").to_pylist()
        found: dict[str, list[tuple[int, int]]] = {}
        rows, values = sketch.column("row").to_pylist(), sketch.column("fingerprint").to_pylist()
        for name, row, value in zip(names, rows, values, strict=True):
            found.setdefault(name, []).append((row, value))
        assert set(found) == set(expected), manifest.manifest_path
        for name, pairs in found.items():
            assert [value for _, value in sorted(pairs)] == expected[name]
            assert [row for row, _ in sorted(pairs)] == list(range(len(expected[name])))


def ids_found(repository: Repository, wanted: list[str]) -> list[str]:
    page = SearchEngine(repository).search(SearchRequest(ids=wanted, limit=100))
    return sorted(item["id"] for item in page.items)


def no_file_ids_read(monkeypatch) -> None:
    """Make reading every file's ids (the path without sketches) fail the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("the ids of every file were read: the sketches were not used")

    monkeypatch.setattr(IdIndex, "build", refuse)


def test_appends_merges_and_rewrites_keep_every_manifest_sketched(tmp_path, monkeypatch):
    repository = Repository.create(tmp_path / "repo")
    # floe's tables merge 16 manifests of a tier into one: 17 commits make a merged manifest.
    written = [item_id for batch in range(17) for item_id in commit_batch(repository, batch, size=2)]
    _, snapshot = current(repository)
    manifests = snapshot.manifests(repository.io)
    assert any(manifest.manifest_path.endswith("-m1.avro") for manifest in manifests)  # a merged one
    assert_sketches_match_files(repository)

    writer = repository.writer()
    writer.delete_item("c0", "b2-0")
    writer.delete_item("c1", "b5-1")
    writer.commit("delete two")  # rewrites the files that held them: rewritten manifests keep sketches
    assert_sketches_match_files(repository)
    repository.optimize()
    assert_sketches_match_files(repository)

    no_file_ids_read(monkeypatch)
    wanted = ["b0-1", "b2-0", "b5-1", "b16-1", "b3-0", "absent"]
    assert ids_found(repository, wanted) == sorted({"b0-1", "b16-1", "b3-0"})
    assert ids_found(repository, written) == sorted(set(written) - {"b2-0", "b5-1"})
    assert check(repository, deep=True) == []


def test_a_table_written_without_sketches_is_searched_by_reading_ids(tmp_path, monkeypatch):
    monkeypatch.setattr(append, "sketched_files", lambda *args: None)  # a floe before sketches
    repository = Repository.create(tmp_path / "repo")
    commit_batch(repository, 0)
    monkeypatch.undo()
    commit_batch(repository, 1)  # its base has none: this version is not sketched either
    _, snapshot = current(repository)
    assert SKETCHED not in snapshot.summary.additional_properties
    assert ids_found(repository, ["b0-2", "b1-4"]) == ["b0-2", "b1-4"]
    assert check(repository, deep=True) == []


def test_check_names_a_missing_or_wrong_sketch_and_searches_still_answer(tmp_path):
    repository = Repository.create(tmp_path / "repo")
    for batch in range(3):
        commit_batch(repository, batch)
    _, snapshot = current(repository)
    first, second = data_manifests(snapshot.manifests(repository.io))[:2]
    assert check(repository) == [] and check(repository, deep=True) == []

    # A wrong fingerprint: only the deep check reads the files to see it.
    sketch = read_sketch(repository.io, first.manifest_path)
    prints = sketch.column("fingerprint").to_numpy().copy()
    prints[0] ^= 1
    append.write_sketch(repository.io, first.manifest_path, sketch.set_column(2, "fingerprint", [prints]))
    assert check(repository) == []
    deep = [str(problem) for problem in check(repository, deep=True)]
    assert len(deep) == 1 and "disagrees with the ids" in deep[0], deep

    # A missing one: named by the plain check; a search by ids falls back on reading the files' ids.
    Path(sketch_location(second.manifest_path)).unlink()
    problems = [str(problem) for problem in check(repository)]
    assert any("is missing" in problem and sketch_location(second.manifest_path) in problem for problem in problems)
    assert ids_found(repository, ["b0-0", "b1-1", "b2-5"]) == ["b0-0", "b1-1", "b2-5"]


def test_gc_keeps_live_sketches_and_sweeps_those_of_dropped_manifests(tmp_path, monkeypatch):
    repository = Repository.create(tmp_path / "repo")
    for batch in range(17):  # a merge: the manifests merged stay live in older versions only
        commit_batch(repository, batch, size=2)
    orphan = tmp_path / "repo" / "tables" / "items" / "metadata" / "lost-m0.ids.parquet"
    shutil.copy(next((tmp_path / "repo" / "tables" / "items" / "metadata").glob("*.ids.parquet")), orphan)

    gc(repository, grace=timedelta(0))
    assert not orphan.exists()
    assert_sketches_match_files(repository)
    no_file_ids_read(monkeypatch)
    assert ids_found(repository, ["b0-0", "b16-1"]) == ["b0-0", "b16-1"]
    assert check(repository, all_refs=True, deep=True) == []


def test_replicate_and_relocate_carry_the_sketches(tmp_path, monkeypatch):
    source = Repository.create(tmp_path / "source")
    for batch in range(3):
        commit_batch(source, batch)
    replicate(str(tmp_path / "source"), str(tmp_path / "replica"))
    replica = Repository.open(tmp_path / "replica")
    assert_sketches_match_files(replica)
    assert check(replica, deep=True) == []

    shutil.copytree(tmp_path / "source", tmp_path / "moved")
    relocate(Repository.open(tmp_path / "moved", moved_ok=True))
    moved = Repository.open(tmp_path / "moved")
    assert check(moved, deep=True) == []
    no_file_ids_read(monkeypatch)
    for repository in (replica, moved):
        assert ids_found(repository, ["b0-3", "b2-0"]) == ["b0-3", "b2-0"]


def test_fingerprints_are_the_same_in_every_process():
    # MurmurHash3 x86 32-bit, seed 0, of the UTF-8 bytes: the reference values of "" and "a", and the same values
    # in a process whose str hash is salted otherwise (sketches are read by other processes and machines).
    assert fingerprints(["", "a"]).tolist() == [0, 0x3C2569B2]
    ids = ["S2B_T33UUP_20240105", "é-ünïcode", "x" * 300]
    code = (
        "import json, sys; from ingest.repository import fingerprints as f; print(json.dumps(f(sys.argv[1:]).tolist()))"
    )
    elsewhere = subprocess.run(
        [sys.executable, "-c", code, *ids],
        env={**os.environ, "PYTHONHASHSEED": "12345"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(elsewhere.stdout) == fingerprints(ids).tolist()
    assert fingerprints([]).dtype == np.int32


@pytest.mark.parametrize("path", ["s3://b/r/tables/items/metadata/x-m0.avro", "/r/tables/items/metadata/x-m1.avro"])
def test_a_sketch_sits_beside_its_manifest(path):
    assert sketch_location(path) == path.removesuffix(".avro") + ".ids.parquet"


def test_a_new_writer_finds_the_items_a_table_holds_from_the_sketches_not_the_files_ids(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    first = Repository.create(root)
    for batch in range(3):
        commit_batch(first, batch)

    import ingest.repository._keys as keys

    def refuse(*args, **kwargs):
        raise AssertionError("a file's ids were read: the key index did not use the sketches")

    monkeypatch.setattr(keys, "read_column", refuse)
    again = Repository.open(root)  # another process's writer: nothing learned yet
    writer = again.writer()
    b12 = make_item("b1-2", "c0", when="2024-02-05T00:00:00Z", changed=True)  # b1-2 is in c0
    writer.add_item(b12, replace=True)
    writer.add_item(make_item("fresh", "c1"))
    writer.commit("replace one, add one")
    view = again.view()
    rows = view.table.scan(row_filter="id == 'b1-2'").to_arrow()
    assert rows.num_rows == 1  # replaced, not duplicated
    assert ids_found(again, ["b1-2", "fresh", "b0-0"]) == ["b0-0", "b1-2", "fresh"]


def test_a_lost_sketch_costs_the_index_not_the_commit(tmp_path):
    repository = Repository.create(tmp_path / "repo")
    for batch in range(3):
        commit_batch(repository, batch)
    _, snapshot = current(repository)
    lost = next(m for m in snapshot.manifests(repository.io) if "b1-0" in ids_of_manifest(repository, m))
    Path(sketch_location(lost.manifest_path)).unlink()

    again = Repository.open(tmp_path / "repo")  # a writer that has read no sketch yet
    writer = again.writer()
    writer.delete_item("c0", "b1-0")  # rewrites the manifest whose sketch is gone
    writer.add_item(make_item("b1-2", "c0", when="2024-02-05T00:00:00Z", changed=True), replace=True)
    writer.commit("delete and replace beside a lost sketch")
    _, snapshot = current(again)
    assert SKETCHED not in snapshot.summary.additional_properties  # this version goes without sketches
    assert ids_found(again, ["b1-0", "b1-2", "b2-3"]) == ["b1-2", "b2-3"]
    assert len(again.view().table.scan(row_filter="id == 'b1-2'").to_arrow()) == 1
    assert check(again, deep=True) == []
    commit_batch(again, 7)  # later versions stay without sketches, and commit as before
    assert ids_found(again, ["b7-1", "b0-0"]) == ["b0-0", "b7-1"]


def ids_of_manifest(repository: Repository, manifest) -> set[str]:
    found: set[str] = set()
    for entry in manifest.fetch_manifest_entry(repository.io, discard_deleted=True):
        found.update(read_column(repository.io, entry.data_file, "id").to_pylist())
    return found
