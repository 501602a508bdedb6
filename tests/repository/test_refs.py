"""Refs: resolving branches, tags and snapshot ids; tags pin a version; branches isolate; log."""

from __future__ import annotations

from collections import Counter

import pytest

from ingest import InvalidRefName, RefExists, RefNotFound, Repository, RepositoryExists, RepositoryNotFound
from tests import invariants
from tests.conftest import make_item, stage_raster
from tests.repository._writers import pixels_of, replace_raster


def commit_items(repo: Repository, ids: list[str], branch: str = "main", message: str = "items") -> str:
    writer = repo.writer(branch)
    writer.add_items([make_item(item_id) for item_id in ids])
    return writer.commit(message).snapshot_id


def ids(repo: Repository, ref: str | None = None) -> Counter[str]:
    return Counter(item["id"] for item in repo.view(ref).items())


def test_tag_pins_arrays_and_table_together(repo):
    writer = repo.writer()
    writer.add_item(stage_raster(writer, make_item("a"), pixels_of("a-1")))
    tagged = writer.commit("first").snapshot_id
    assert repo.tag("v1") == tagged

    # The next commit replaces a's raster (its old slice cleared) and adds b with one of its own.
    writer = repo.writer()
    writer.add_item(replace_raster(writer, make_item("a"), pixels_of("a-2")), replace=True)
    writer.add_item(stage_raster(writer, make_item("b"), pixels_of("b")))
    writer.commit("second")

    assert ids(repo, "v1") == Counter({"a": 1})
    invariants.assert_item_arrays(repo.view("v1"), "c", {"a": pixels_of("a-1")})
    invariants.assert_slices_exactly(repo.view("v1"), "c", {"a": 1})
    assert ids(repo) == Counter({"a": 1, "b": 1})
    invariants.assert_item_arrays(repo.view(), "c", {"a": pixels_of("a-2"), "b": pixels_of("b")})
    invariants.assert_slices_exactly(repo.view(), "c", {"a": 1, "b": 1})
    invariants.assert_check_passes(repo)
    with pytest.raises(RefExists):
        repo.tag("v1")


def test_branch_isolates_writes(repo):
    commit_items(repo, ["a"])
    repo.branch("dev")
    commit_items(repo, ["d"], branch="dev")
    commit_items(repo, ["m"])
    assert ids(repo, "dev") == Counter({"a": 1, "d": 1})
    assert ids(repo, "main") == Counter({"a": 1, "m": 1})
    with pytest.raises(RefExists):
        repo.branch("dev")


def test_resolve_by_name_snapshot_and_prefix(repo):
    snapshot = commit_items(repo, ["a"])
    repo.tag("main-copy")
    assert repo.resolve("main") == snapshot
    assert repo.resolve(snapshot) == snapshot
    assert repo.resolve("snapshot:" + snapshot) == snapshot
    assert repo.resolve("tag:main-copy") == snapshot
    with pytest.raises(RefNotFound, match="nope"):
        repo.resolve("nope")
    with pytest.raises(RefNotFound):
        repo.resolve("tag:main")  # 'main' is a branch, not a tag
    with pytest.raises(RefNotFound):
        repo.writer("no-such-branch")


@pytest.mark.parametrize("name", ["", "../x", "a/b", ".hidden", "-flag", "with space", "x" * 200, "a..b"])
def test_invalid_ref_names_are_refused(repo, name):
    with pytest.raises(InvalidRefName):
        repo.tag(name)
    with pytest.raises(InvalidRefName):
        repo.branch(name)


def test_log_reports_rows_attempts_and_pointer(repo):
    commit_items(repo, ["a", "b"], message="two")
    commit_items(repo, ["c"], message="one")
    log = repo.log()
    assert [(entry.message, entry.rows_added, entry.attempts) for entry in log] == [
        ("one", 1, 1),
        ("two", 2, 1),
        ("floe: initialize repository", 0, 1),
    ]
    assert log[0].parent_id == log[1].snapshot_id
    assert log[0].metadata_location == repo.view().metadata_location
    assert repo.log(limit=1) == log[:1]
    assert repo.log(log[1].snapshot_id)[0] == log[1]


def test_create_open_errors(tmp_path):
    with pytest.raises(RepositoryNotFound, match="floe init"):
        Repository.open(tmp_path / "missing")
    Repository.create(tmp_path / "repo")
    with pytest.raises(RepositoryExists):
        Repository.create(tmp_path / "repo")
    assert Repository.open_or_create(tmp_path / "repo").view().count() == 0


def test_a_repository_whose_creation_stopped_before_floe_s_first_commit_is_not_one_yet(tmp_path, monkeypatch):
    # What another process sees while `floe init` (or a first `floe ingest`) is creating the repository.
    from ingest.repository import _create

    def stopped(*_args, **_kwargs):
        raise RuntimeError("stopped before floe's first commit")

    monkeypatch.setattr(_create, "commit_change", stopped)
    with pytest.raises(RuntimeError):
        Repository.create(tmp_path / "repo")
    monkeypatch.undo()
    with pytest.raises(RepositoryNotFound, match="without floe's first commit"):
        Repository.open(tmp_path / "repo")
    # Creating again completes it (tests/repository/test_create.py kills a real `floe init` there).
    assert [entry.message for entry in Repository.create(tmp_path / "repo").log()] == ["floe: initialize repository"]


@pytest.mark.s3
def test_s3_repository_round_trip(s3_root, s3_settings):
    repo = Repository.create(s3_root, s3_settings)
    writer = repo.writer()
    for n in range(4):
        writer.add_item(stage_raster(writer, make_item(f"i{n}"), pixels_of(f"i{n}")))
    writer.commit("on s3")
    repo.tag("v1")
    reopened = Repository.open(s3_root, s3_settings)
    assert ids(reopened, "v1") == Counter(f"i{n}" for n in range(4))
    invariants.assert_item_arrays(reopened.view("v1"), "c", {f"i{n}": pixels_of(f"i{n}") for n in range(4)})
    assert reopened.view().metadata_location.startswith(s3_root + "/tables/items/metadata/")


def test_a_huge_unknown_ref_is_named_short(repo):
    huge = "r" * 5_000
    with pytest.raises(RefNotFound) as unknown:
        repo.resolve(huge)
    assert "(5,000 characters)" in str(unknown.value) and len(str(unknown.value)) < 200
    with pytest.raises(RefNotFound) as no_branch:
        repo.writer(branch=huge)
    assert "(5,000 characters)" in str(no_branch.value) and len(str(no_branch.value)) < 250
