"""Replacing items: copy-on-write rewrites, re-planned when a concurrent commit touched the same rows."""

from __future__ import annotations

from collections import Counter

import pytest

from ingest import Repository
from ingest.repository import _keys, _replace
from ingest.repository._read import data_fragment, read_column
from tests.conftest import make_item


def versions(repo: Repository, ref: str = "main") -> dict[str, list[int | None]]:
    found: dict[str, list[int | None]] = {}
    for item in repo.view(ref).items():
        found.setdefault(item["id"], []).append(item["properties"].get("version"))
    return found


@pytest.fixture
def seeded(repo):
    """A table with one file holding x, y and z (version 0)."""
    writer = repo.writer()
    writer.add_items([make_item(item_id, "c", version=0) for item_id in ("x", "y", "z")])
    writer.commit("seed")
    return repo


def test_replacement_swaps_the_row_and_keeps_the_rest(seeded):
    before = seeded.resolve()
    writer = seeded.writer()
    writer.add_item(make_item("y", "c", version=1), replace=True)
    writer.add_item(make_item("w", "c", version=1), replace=True)  # absent: a plain append
    result = writer.commit("replace y")

    assert result.rows_added == 2 and result.rows_replaced == 1
    assert versions(seeded) == {"x": [0], "y": [1], "z": [0], "w": [1]}
    assert versions(seeded, before) == {"x": [0], "y": [0], "z": [0]}  # the old version is intact
    assert seeded.view().table.current_snapshot().summary.operation.value == "overwrite"
    assert seeded.log(limit=1)[0].rows_replaced == 1


def test_concurrent_replacements_of_one_item_leave_one_row(seeded):
    first, second = seeded.writer(), seeded.writer()
    first.add_item(make_item("y", "c", version=1), replace=True)
    second.add_item(make_item("y", "c", version=2), replace=True)
    one = first.commit("first")
    two = second.commit("second")

    assert two.attempts == 2 and two.rows_replaced == 1
    assert versions(seeded) == {"x": [0], "y": [2], "z": [0]}  # the loser re-planned on the winner's row
    assert versions(seeded, one.snapshot_id) == {"x": [0], "y": [1], "z": [0]}


def test_replacement_replans_when_the_winner_rewrote_its_file(seeded):
    """The winner rewrote the file the loser planned to rewrite: the loser's rewrite would resurrect old rows."""
    first, second = seeded.writer(), seeded.writer()
    first.add_item(make_item("x", "c", version=1), replace=True)
    second.add_item(make_item("z", "c", version=2), replace=True)
    first.commit("first")
    second.commit("second")

    assert versions(seeded) == {"x": [1], "y": [0], "z": [2]}


def test_concurrent_first_versions_of_one_item_leave_one_row(repo):
    first, second = repo.writer(), repo.writer()
    first.add_item(make_item("new", "c", version=1), replace=True)
    second.add_item(make_item("new", "c", version=2), replace=True)
    first.commit("first")
    second.commit("second")

    assert versions(repo) == {"new": [2]}


def test_plain_append_does_not_replace(seeded):
    writer = seeded.writer()
    writer.add_item(make_item("x", "c", version=5))
    writer.commit("append a duplicate on purpose")
    assert Counter(versions(seeded)["x"]) == Counter([0, 5])


def test_replacement_across_partitions_moves_the_row(seeded):
    writer = seeded.writer()
    moved = make_item("x", "c", version=3)
    moved["properties"]["datetime"] = "2019-06-01T00:00:00Z"
    writer.add_item(moved, replace=True)
    writer.commit("x moves to another month")

    assert versions(seeded) == {"x": [3], "y": [0], "z": [0]}
    june = list(seeded.view().items("datetime < '2020-01-01T00:00:00+00:00'"))
    assert [item["id"] for item in june] == ["x"]


def test_lookups_read_only_the_files_that_hold_a_key_once_their_keys_are_known(repo, monkeypatch):
    """Tile-first ids: every file's id range spans every id, so bounds prune nothing; the key index does, from the
    id sketches beside the manifests (no file's ids are read)."""
    for batch in range(8):
        writer = repo.writer()
        writer.add_items([make_item(f"T{tile:02d}-{batch}", "c", version=0) for tile in range(20)])
        writer.commit(f"batch {batch}")
    opened: list[str] = []
    sketches: list[str] = []

    def counting(repository: Repository) -> None:
        new_input = repository.io.new_input

        def counted(location: str):
            if location.endswith(".ids.parquet"):
                sketches.append(location)
            elif location.endswith(".parquet"):
                opened.append(location)
            return new_input(location)

        monkeypatch.setattr(repository.io, "new_input", counted)

        def counted_column(io, data_file, name):
            opened.append(data_file.file_path)  # the key index reads ids by the file's size, not through new_input
            return read_column(io, data_file, name)

        monkeypatch.setattr(_keys, "read_column", counted_column)

        def counted_fragment(io, location, size):
            opened.append(location)  # a lookup confirms a key by the file's size too
            return data_fragment(io, location, size)

        monkeypatch.setattr(_replace, "data_fragment", counted_fragment)

    counting(repo)
    assert repo.writer().stored_items([("c", "T05-new")]) == {}
    assert opened == [] and sketches == []  # the repository object that wrote the files knows their keys

    repo = Repository.open(repo.location.url, repo.settings)
    counting(repo)
    repo.writer().stored_items([("c", "T05-new")])
    assert opened == []  # another repository object learns the candidates' keys from the sketches, not the files
    assert len(sketches) == len(set(sketches)) == 8  # one sketch a manifest (8 commits, no merge yet), read once

    sketches.clear()
    assert repo.writer().stored_items([("c", f"T{tile:02d}-new") for tile in range(20)]) == {}
    assert opened == [] and sketches == []  # none of these keys is stored: nothing is read
    stored = repo.writer().stored_items([("c", "T07-3"), ("c", "T09-new")])
    assert list(stored) == [("c", "T07-3")]
    assert len(opened) == 2  # the one file holding T07-3: its keys to confirm, then its row
    assert len(set(opened)) == 1
