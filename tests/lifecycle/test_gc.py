"""gc: after concurrent writers (conflict orphans) and a writer killed mid-commit, every unreferenced table file
goes and every version stays exactly as it was; files younger than the grace period survive."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest
from typer.testing import CliRunner

from ingest import Repository, Settings
from ingest.cli import app
from ingest.errors import InvalidDuration
from ingest.lifecycle import gc, parse_duration
from ingest.repository import _commit as commit_module
from tests.conftest import make_item
from tests.lifecycle._helpers import expected_live, exports, table_files
from tests.lifecycle._writers import commit_with_arrays, killed_mid_commit
from tests.repository._writers import commit_worker

SPAWN = multiprocessing.get_context("spawn")


def floe(root: str, *args: str, settings: Settings | None = None):
    env = {}
    if settings is not None and settings.s3.endpoint_url:
        env = {f"FLOE_S3__{key.upper()}": str(value) for key, value in settings.s3.model_dump().items() if value}
    return CliRunner().invoke(app, ["--root", root, *args], env=env, catch_exceptions=False)


def kill_a_writer(root: str, settings: Settings, item_id: str) -> None:
    process = SPAWN.Process(target=killed_mid_commit, args=(root, settings.model_dump(), item_id))
    process.start()
    process.join(120)
    assert process.exitcode == -9, "the writer was meant to die by SIGKILL mid-commit"


class Crash(Exception):
    pass


def crash_mid_commit(repository: Repository, item_id: str, monkeypatch) -> None:
    """In this process: a writer that has written every table file of its commit fails before the Icechunk commit."""

    def fail_before_swap(*args, **kwargs):
        raise Crash(item_id)

    with monkeypatch.context() as patch:
        patch.setattr(commit_module, "_swap", fail_before_swap)
        writer = repository.writer()
        writer.add_item(make_item(item_id, "c"))
        with pytest.raises(Crash):
            writer.commit(f"never lands: {item_id}")


@pytest.mark.slow
def test_gc_after_racing_and_killed_writers_removes_every_orphan_and_keeps_every_version(tmp_path):
    settings = Settings()
    root = str(tmp_path / "repo")
    repository = Repository.create(root, settings)
    commit_with_arrays(repository, "first", 1)
    repository.tag("v1")
    repository.ensure_groups(["c"])
    start_at = time.time() + 3.0
    with SPAWN.Pool(3) as pool:
        commits = pool.starmap(commit_worker, [(root, settings.model_dump(), w, 3, 2, start_at) for w in range(3)])
    assert any(c["attempts"] > 1 for worker in commits for c in worker), "no race happened: no conflict orphans"
    repository.tag("v2")
    kill_a_writer(root, settings, "killed")
    repository.branch("dev")
    commit_with_arrays(repository, "on-main", 2)

    before = exports(repository)
    listed = table_files(repository)
    live = expected_live(repository)
    orphans = set(listed) - live
    assert live <= set(listed)
    assert any(path.endswith(".parquet") for path in orphans), "the killed writer left no data file"
    # The killed writer's metadata.json is an orphan. A lost race adds one only when the tip moved between the
    # writer's look at it and its commit (it looks before writing one), so their count is not a given.
    assert any(path.endswith(".metadata.json") for path in orphans), "the killed writer left no metadata.json"

    dry = floe(root, "gc", "--grace", "0s", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert set(table_files(repository)) == set(listed), "a dry run deleted something"
    assert {line.split("\t")[0] for line in dry.stdout.splitlines() if line.strip()} == orphans

    result = floe(root, "gc", "--grace", "0s")
    assert result.exit_code == 0, result.output
    assert set(table_files(repository)) == live, "gc left an orphan or removed a live file"

    checked = floe(root, "check", "--all", "--deep")
    assert checked.exit_code == 0, checked.output
    reopened = Repository.open(root, settings)
    assert exports(reopened) == before
    assert "killed" not in str(before)


def test_files_younger_than_the_grace_survive(tmp_path, monkeypatch):
    settings = Settings()
    root = str(tmp_path / "repo")
    repository = Repository.create(root, settings)
    commit_with_arrays(repository, "kept", 1)
    crash_mid_commit(repository, "young", monkeypatch)
    crash_mid_commit(repository, "old", monkeypatch)
    orphans = set(table_files(repository)) - expected_live(repository)
    assert len(orphans) >= 8  # two data files, manifests, manifest lists, metadata.json
    # Backdate half of the orphans, leave the rest young: the grace alone decides which go.
    old = set(sorted(orphans)[: len(orphans) // 2])
    young = orphans - old
    assert old and young
    hour_ago = time.time() - 3600
    for path in old:
        os.utime(os.path.join(root, path), (hour_ago, hour_ago))

    report = gc(repository, grace=parse_duration("30m"))
    assert {path for path, _ in report.deleted} == old
    assert {path for path, _ in report.kept_young} == young
    assert young <= set(table_files(repository)) and not old & set(table_files(repository))
    assert report.bytes_deleted == sum(size for _, size in report.deleted) > 0

    # Unreferenced and young: kept by the default grace (24h), removed once the grace is 0.
    assert not gc(repository).deleted
    assert {path for path, _ in gc(repository, grace=parse_duration("0s")).deleted} == young
    assert floe(root, "check", "--all", "--deep").exit_code == 0


@pytest.mark.s3
def test_gc_on_s3_uses_last_modified(s3_root, s3_settings, monkeypatch):
    repository = Repository.create(s3_root, s3_settings)
    commit_with_arrays(repository, "kept", 1)
    repository.tag("v1")
    crash_mid_commit(repository, "orphan", monkeypatch)
    before = exports(repository)
    orphans = set(table_files(repository)) - expected_live(repository)
    assert orphans
    kept = floe(s3_root, "gc", settings=s3_settings)  # default grace: 24h
    assert kept.exit_code == 0, kept.output
    assert orphans <= set(table_files(repository))
    removed = floe(s3_root, "gc", "--grace", "0s", settings=s3_settings)
    assert removed.exit_code == 0, removed.output
    assert set(table_files(repository)) == expected_live(repository)
    assert exports(repository) == before
    assert floe(s3_root, "check", "--all", "--deep", settings=s3_settings).exit_code == 0


def test_expire_keeps_tags_and_tips_and_their_files(tmp_path):
    settings = Settings()
    root = str(tmp_path / "repo")
    repository = Repository.create(root, settings)
    commit_with_arrays(repository, "a", 1)
    repository.tag("v1")
    commit_with_arrays(repository, "b", 2)
    commit_with_arrays(repository, "c", 3)
    before = {ref: items for ref, items in exports(repository).items()}
    history = len(repository.log())
    result = floe(root, "gc", "--grace", "0s", "--expire-older-than", "0s")
    assert result.exit_code == 0, result.output
    assert len(repository.log()) < history
    assert exports(repository) == before
    assert set(table_files(repository)) == expected_live(repository)
    assert floe(root, "check", "--all", "--deep").exit_code == 0


def test_durations():
    assert parse_duration("0s").total_seconds() == 0
    assert parse_duration("30m").total_seconds() == 1800
    assert parse_duration("24h").total_seconds() == 86400
    assert parse_duration("90d").days == 90
    with pytest.raises(InvalidDuration, match="'3 days'"):
        parse_duration("3 days")


def test_bad_duration_is_a_usage_error_naming_it(tmp_path):
    root = str(tmp_path / "repo")
    Repository.create(root, Settings())
    result = floe(root, "gc", "--grace", "soon")
    assert result.exit_code == 1 and "'soon'" in result.output


def test_gc_refuses_to_sweep_when_a_version_cannot_be_read(tmp_path, monkeypatch):
    settings = Settings()
    root = str(tmp_path / "repo")
    repository = Repository.create(root, settings)
    commit_with_arrays(repository, "a", 1)
    repository.tag("v1")
    commit_with_arrays(repository, "b", 2)
    crash_mid_commit(repository, "orphan", monkeypatch)
    manifest_list = repository.view("v1").table.current_snapshot().manifest_list
    os.unlink(manifest_list)
    listed = set(table_files(repository))
    result = floe(root, "gc", "--grace", "0s")
    assert result.exit_code == 1 and manifest_list in result.output.replace("\n", "")
    assert "gc deleted no table file" in " ".join(result.output.split())
    assert set(table_files(repository)) == listed, "gc deleted files without knowing the whole live set"


def test_gc_after_replacements_keeps_old_versions_and_drops_orphaned_rewrites(tmp_path, monkeypatch):
    """Copy-on-write replacement: the replaced file stays for older versions; a crashed writer's rewrite goes."""
    root = str(tmp_path / "repo")
    repository = Repository.create(root, Settings())
    writer = repository.writer()
    writer.add_items([make_item(item_id, "c", version=0) for item_id in ("x", "y", "z")])
    writer.commit("seed")
    repository.tag("v1")
    first, second = repository.writer(), repository.writer()
    first.add_item(make_item("y", "c", version=1), replace=True)
    second.add_item(make_item("y", "c", version=2), replace=True)
    first.commit("first replacement")
    assert second.commit("second replacement, re-planned").attempts == 2

    def fail_before_swap(*args, **kwargs):
        raise Crash("z")

    with monkeypatch.context() as patch:
        patch.setattr(commit_module, "_swap", fail_before_swap)
        crashed = repository.writer()
        crashed.add_item(make_item("z", "c", version=9), replace=True)
        with pytest.raises(Crash):
            crashed.commit("never lands")
    before = exports(repository)
    orphans = set(table_files(repository)) - expected_live(repository)
    assert len([path for path in orphans if path.endswith(".parquet")]) == 2, "staged file and rewrite are orphans"

    result = floe(root, "gc", "--grace", "0s")
    assert result.exit_code == 0, result.output
    assert set(table_files(repository)) == expected_live(repository)
    assert exports(repository) == before
    assert [item["properties"]["version"] for item in repository.view("v1").items() if item["id"] == "y"] == [0]
    assert [item["properties"]["version"] for item in repository.view().items() if item["id"] == "y"] == [2]
    assert floe(root, "check", "--all", "--deep").exit_code == 0


@pytest.mark.slow
def test_gc_while_writers_commit_deletes_nothing_they_need(tmp_path):
    """gc runs in a loop while two writer processes race: every commit lands whole and every version reads."""
    from datetime import timedelta

    settings = Settings()
    root = str(tmp_path / "repo")
    repository = Repository.create(root, settings)
    repository.ensure_groups(["c"])
    start_at = time.time() + 3.0
    sweeps = 0
    with SPAWN.Pool(2) as pool:
        arguments = [(root, settings.model_dump(), worker, 8, 3, start_at) for worker in range(2)]
        pending = pool.starmap_async(commit_worker, arguments)
        while not pending.ready() or sweeps == 0:
            gc(repository, grace=timedelta(seconds=30))
            sweeps += 1
        commits = pending.get()
    assert sweeps >= 2
    committed = [commit for worker in commits for commit in worker]
    tip = Repository.open(root, settings)
    ids = [item["id"] for item in tip.view().items()]
    assert sorted(ids) == sorted(item_id for commit in committed for item_id in commit["ids"])
    for commit in committed:  # every commit's own version still reads, with its arrays
        view = tip.view(commit["snapshot_id"])
        assert set(commit["ids"]) <= {item["id"] for item in view.items()}
        assert (view.arrays(f"c/{commit['group']}")["band"][:] == commit["value"]).all()
    checked = floe(root, "check", "--all", "--deep")
    assert checked.exit_code == 0, checked.output
