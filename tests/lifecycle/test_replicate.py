"""replicate: local -> S3 and S3 -> local, incremental runs that copy only what is new, a source written meanwhile."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess

import pytest
import xarray as xr
from typer.testing import CliRunner

from ingest import Repository, Settings
from ingest.cli import app
from ingest.errors import ReplicationFailed, RepositoryNotFound
from ingest.lifecycle import _replicate as replicate_module
from ingest.lifecycle import check, replicate
from ingest.lifecycle._replica_refs import CapturedRefs
from ingest.lifecycle._store import RootFiles
from ingest.stac import read_arrays_asset
from tests.lifecycle._helpers import export, exports
from tests.lifecycle._writers import commit_with_arrays, steady_writer

SPAWN = multiprocessing.get_context("spawn")


def files_of(root: str, settings: Settings) -> set[str]:
    """Every file of a root that replicate copies (the refs object and Icechunk's backups of it aside)."""
    from ingest.storage import Location

    store = RootFiles(Location.parse(root, settings))
    found = set(store.list("arrays")) | set(store.list("tables"))
    return {path for path in found if path != "arrays/repo" and not path.startswith("arrays/overwritten/")}


def assert_arrays_equal(source: Repository, target: Repository, ref: str) -> None:
    """Every item with arrays at ``ref`` reads, through ``View.item_arrays``, the same Dataset from both roots:
    pixels, dtype, grid and attributes."""
    source_view, target_view = source.view(ref), target.view(ref)
    with_arrays = [item for item in source_view.items() if read_arrays_asset(item) is not None]
    assert with_arrays, f"no item with arrays at {ref}"
    for item in with_arrays:
        expected = source_view.item_arrays(item["collection"], item["id"])
        found = target_view.item_arrays(item["collection"], item["id"])
        xr.testing.assert_identical(found, expected)


def assert_same_repository(source: Repository, target: Repository) -> None:
    assert check(target, all_refs=True, deep=True) == []
    assert [(r.kind, r.name, r.snapshot_id) for r in target.refs()] == [
        (r.kind, r.name, r.snapshot_id) for r in source.refs()
    ]
    assert exports(target) == exports(source)
    for entry in source.log():
        assert export(target, entry.snapshot_id) == export(source, entry.snapshot_id)
    for ref in source.refs():
        assert_arrays_equal(source, target, ref.snapshot_id)
    # The tip's stacks: the same slots hold the same items at the target.
    tip_source, tip_target = source.view(), target.view()
    stacks = tip_source.stacks("c")
    assert stacks and tip_target.stacks("c") == stacks
    for stack in stacks:
        assert tip_target.slot_items(stack) == tip_source.slot_items(stack)


@pytest.mark.s3
def test_replicate_local_to_s3_and_back_incrementally(tmp_path, s3_root, s3_settings):
    settings = Settings(s3=s3_settings.s3)
    local = str(tmp_path / "source")
    source = Repository.create(local, settings)
    commit_with_arrays(source, "a", 1)
    source.tag("v1")
    commit_with_arrays(source, "b", 2)

    first = replicate(local, s3_root, settings)
    assert first.refs_moved and first.copied and first.rewritten
    target = Repository.open(s3_root, settings)
    assert_same_repository(source, target)
    # Iceberg metadata at the target names the target's files only.
    assert target.view("v1").table.metadata_location.startswith(s3_root + "/tables/")
    assert all(t.file.file_path.startswith(s3_root) for t in target.view().table.scan().plan_files())

    again = replicate(local, s3_root, settings)
    assert again.files_written == [] and again.refs_moved

    before = files_of(local, settings)
    commit_with_arrays(source, "c", 3)
    commit_with_arrays(source, "d", 4)
    source.tag("v2")
    new_files = files_of(local, settings) - before
    assert any(path.startswith("arrays/chunks/") for path in new_files)
    incremental = replicate(local, s3_root, settings)
    assert sorted(incremental.files_written) == sorted(new_files)
    assert_same_repository(source, Repository.open(s3_root, settings))

    # And back: S3 -> local, through the CLI (S3 settings from the environment).
    back = str(tmp_path / "back")
    env = {f"FLOE_S3__{key.upper()}": str(value) for key, value in s3_settings.s3.model_dump().items() if value}
    result = CliRunner().invoke(app, ["replicate", s3_root, back], env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert_same_repository(source, Repository.open(back, settings))
    assert CliRunner().invoke(app, ["--root", back, "check", "--all", "--deep"]).exit_code == 0


def test_dry_run_writes_nothing_and_a_missing_source_is_named(tmp_path):
    settings = Settings()
    local = str(tmp_path / "source")
    source = Repository.create(local, settings)
    commit_with_arrays(source, "a", 1)
    report = replicate(local, str(tmp_path / "copy"), settings, dry_run=True)
    assert report.copied and report.rewritten and not report.refs_moved
    assert not (tmp_path / "copy").exists()
    with pytest.raises(RepositoryNotFound, match="nowhere"):
        replicate(str(tmp_path / "nowhere"), str(tmp_path / "copy"), settings)


def wait_until(condition: Callable[[], bool], what: str, writer: BaseProcess) -> None:
    """Wait for ``condition`` while the writer lives: an event, not a time (the limit only ends a stuck test)."""
    stuck_at = time.monotonic() + 300
    while not condition():
        assert writer.is_alive(), f"the writer died before {what}"
        assert time.monotonic() < stuck_at, f"waited 300s for {what}"
        time.sleep(0.05)


@pytest.mark.s3
@pytest.mark.slow
def test_replicate_while_the_source_is_written_copies_a_consistent_version(tmp_path, s3_root, s3_settings, monkeypatch):
    """A commit lands on the source while each replication runs, for certain: replication captures the source's
    refs, then waits until the writer has committed, then copies. The target holds the captured version, whole."""
    settings = Settings(s3=s3_settings.s3)
    local = str(tmp_path / "source")
    source = Repository.create(local, settings)
    commit_with_arrays(source, "seed", 0)
    source.tag("v0")
    stop = tmp_path / "stop-writing"
    writer = SPAWN.Process(target=steady_writer, args=(local, settings.model_dump(), str(stop), "live"))
    capture_refs = replicate_module.capture_refs

    def capture_then_let_a_commit_land(repo_bytes: bytes) -> CapturedRefs:
        # The refs are read (repo_bytes) before this runs: a tip that moves past the one seen now moved after them.
        seen = source.resolve("main")
        captured = capture_refs(repo_bytes)
        wait_until(lambda: source.resolve("main") != seen, "a commit landed during replication", writer)
        return captured

    monkeypatch.setattr(replicate_module, "capture_refs", capture_then_let_a_commit_land)
    writer.start()
    try:
        wait_until(lambda: len(source.log()) >= 4, "the writer made its first commits", writer)
        for _ in range(2):
            report = replicate(local, s3_root, settings)
            assert report.refs_moved
            target = Repository.open(s3_root, settings)
            assert target.resolve("main") != source.resolve("main"), "the source did not move during replication"
            assert check(target, all_refs=True, deep=True) == []
            for ref in target.refs():  # the target's version of each ref is one the source had, arrays and all
                assert export(target, ref.snapshot_id) == export(source, ref.snapshot_id)
                assert_arrays_equal(source, target, ref.snapshot_id)
    finally:
        stop.touch()
        writer.join(120)
        if writer.is_alive():
            writer.kill()
    assert writer.exitcode == 0
    monkeypatch.setattr(replicate_module, "capture_refs", capture_refs)
    replicate(local, s3_root, settings)
    assert_same_repository(source, Repository.open(s3_root, settings))


def test_a_target_that_does_not_verify_keeps_its_old_refs(tmp_path, monkeypatch):
    settings = Settings()
    source_root, target_root = str(tmp_path / "source"), str(tmp_path / "target")
    source = Repository.create(source_root, settings)
    commit_with_arrays(source, "a", 1)
    replicate(source_root, target_root, settings)
    old_tip = Repository.open(target_root, settings).resolve("main")
    commit_with_arrays(source, "b", 2)

    original = RootFiles.write

    def lose_data_files(self, relative, data):  # a copy that silently never lands
        if not relative.endswith(".parquet"):
            original(self, relative, data)

    with monkeypatch.context() as patch:
        patch.setattr(RootFiles, "write", lose_data_files)
        with pytest.raises(ReplicationFailed, match=r"\.parquet: missing.*refs were not moved"):
            replicate(source_root, target_root, settings)
    target = Repository.open(target_root, settings)
    assert target.resolve("main") == old_tip
    assert check(target, all_refs=True, deep=True) == []

    replicate(source_root, target_root, settings)
    assert_same_repository(source, Repository.open(target_root, settings))
