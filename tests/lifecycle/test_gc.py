"""gc: after concurrent writers (conflict orphans) and a writer killed mid-commit, every unreferenced table file
goes and every version stays exactly as it was; files younger than the grace period survive."""

from __future__ import annotations

import multiprocessing
import os
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from ingest import Repository, Settings
from ingest.errors import InvalidDuration
from ingest.lifecycle import gc, parse_duration
from ingest.lifecycle._store import RootFiles
from ingest.repository import _commit as commit_module
from ingest.stac import arrow_to_items, without_arrays_asset
from tests import invariants
from tests._cli import floe_here as floe
from tests.conftest import make_item, stage_raster
from tests.lifecycle._helpers import every_version, expected_live, exports, files_of_version, table_files
from tests.lifecycle._writers import commit_with_arrays, killed_mid_commit
from tests.repository._writers import (
    GO,
    LOSER_WAITING,
    Meeting,
    Race,
    commit_worker,
    forced_loss,
    pixels_of,
    snapshot_ids,
    staged_slots,
    wait_while_writing,
)

SPAWN = multiprocessing.get_context("spawn")


def kill_a_writer(root: str, settings: Settings, item_id: str, directory: Path) -> str:
    """Run a writer that dies by SIGKILL right before its compare-and-swap; returns the pointer it never committed."""
    pointer_file = directory / f"{item_id}.pointer"
    process = SPAWN.Process(target=killed_mid_commit, args=(root, settings.model_dump(), item_id, str(pointer_file)))
    process.start()
    process.join(120)
    assert process.exitcode == -9, "the writer was meant to die by SIGKILL mid-commit"
    return pointer_file.read_text()


def race_writers(
    root: str, settings: Settings, directory: Path, *, writers: int, commits: int, rows: int, race_at: int, held: bool
) -> tuple[Meeting, list[tuple]]:
    """Arguments of ``commit_worker`` processes that start together, writer 0's commit ``race_at`` losing a forced
    race to writer 1 (which, if ``held``, waits for the test's ``GO``); and where they meet."""
    meeting = Meeting(str(directory))
    directory.mkdir()
    race = Race(meeting, loser=0, winner=1, at=race_at, held=held)
    arguments = [
        (root, settings.model_dump(), worker, commits, rows, meeting, writers, race) for worker in range(writers)
    ]
    return meeting, arguments


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
    """Conflict orphans (forced: writer 0's first commit must lose its compare-and-swap to writer 1) and a killed
    writer's files are exactly the unreferenced files; gc removes all of them and nothing any version reads."""
    settings = Settings()
    root = str(tmp_path / "repo")
    repository = Repository.create(root, settings)
    commit_with_arrays(repository, "first", 1)
    seed_workers_stack(repository)
    repository.tag("v1")
    _, arguments = race_writers(
        root, settings, tmp_path / "meeting", writers=3, commits=3, rows=2, race_at=0, held=False
    )
    with SPAWN.Pool(3) as pool:
        results = pool.starmap(commit_worker, arguments)
    commits = [commit for worker in results for commit in worker]
    forced_loss(results)
    lost = [pointer for commit in commits for pointer in commit["lost"]]  # the forced loss, and any natural one
    repository.tag("v2")
    killed = kill_a_writer(root, settings, "killed", tmp_path)
    repository.branch("dev")
    commit_with_arrays(repository, "on-main", 2)
    invariants.assert_history_holds(repository, "main", *snapshot_ids(results))

    before = exports(repository)
    versions = every_version(repository)
    listed = table_files(repository)
    live = expected_live(repository)
    orphans = set(listed) - live
    assert live <= set(listed)
    # Every orphan is accounted for: what the lost attempts and the killed writer wrote and no version uses, and the
    # data files a loser wrote before it saw the tip had moved (then rewrote, because its rows' slots moved).
    left_by = {pointer: files_of_version(repository, pointer) - live for pointer in [*lost, killed]}
    left = set().union(*left_by.values())
    assert left <= orphans, "a lost attempt's file is live"
    for path in orphans - left:
        assert_rows_moved_before_written(repository, path, commits)
    for pointer in lost:  # a lost attempt's table version is not re-used by its retry (its data files may be)
        assert {f"tables/{pointer}", manifest_list_of(repository, pointer)} <= left_by[pointer], pointer
    assert any(path.endswith(".parquet") for path in left_by[killed]), "the killed writer left no data file"
    assert f"tables/{killed}" in left_by[killed], "the killed writer left no metadata.json"

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
    assert every_version(reopened) == versions, "a version in some ref's history reads differently after gc"
    assert "killed" not in str(before)
    tip = reopened.view()
    invariants.assert_item_arrays(
        tip, "c", {item_id: pixels_of(item_id) for commit in commits for item_id in commit["ids"]}
    )
    invariants.assert_no_slice_without_row(tip)


def assert_rows_moved_before_written(repository: Repository, path: str, commits: list[dict]) -> None:
    """``path`` (relative to the root), an orphan no table version names, is a data file a writer wrote for one
    commit before it knew the tip had moved: its rows are that commit's items as they landed, but for the slots
    their pieces name (the slots moved past a winner's, and the rows were written again)."""
    assert path.endswith(".parquet"), f"{path}: an orphan nobody left"
    with repository.io.new_input(f"{repository.location.url}/{path}").open() as stream:
        rows = arrow_to_items(pq.read_table(stream))
    ids = {row["id"] for row in rows}
    assert any(ids <= set(commit["ids"]) for commit in commits), f"{path}: rows {sorted(ids)} of no one commit"
    tip = repository.view()
    for row in rows:
        landed = tip.item("c", row["id"])
        assert without_arrays_asset(row) == without_arrays_asset(landed), f"{path}: {row['id']} is another version"
        assert staged_slots(row) != staged_slots(landed), f"{path}: {row['id']} names the slots it landed at"


def seed_workers_stack(repository: Repository) -> None:
    """Commit an item with a raster of the kind ``commit_worker`` stages, so the stack and array the workers append
    to exist before they race: otherwise a worker's first swap is the commit that creates them (``commit_alone``),
    and a race forced at commit 0 would be run on that commit instead of the one with the items."""
    writer = repository.writer()
    writer.add_item(stage_raster(writer, make_item("seed", "c"), pixels_of("seed")))
    writer.commit("the stack the workers append to")


def manifest_list_of(repository: Repository, pointer: str) -> str:
    snapshot = repository.catalog.load_at(repository.absolute_location(pointer)).current_snapshot()
    assert snapshot is not None
    relative = RootFiles(repository.location).relative(snapshot.manifest_list)
    assert relative is not None
    return relative


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


def test_a_writer_whose_base_expiry_took_out_of_its_branch_is_refused_even_where_a_tag_keeps_it(tmp_path):
    from ingest.errors import CommitConflict

    repository = Repository.create(tmp_path / "repo", Settings())
    commit_with_arrays(repository, "a", 1)
    repository.tag("kept")  # the snapshot the late writer opens at survives expiry as this tag's
    late = repository.writer()  # stages a raster: its commit must rebase its slots from its base to the tip
    late.add_item(stage_raster(late, make_item("late", "c"), np.ones((16, 16), dtype="int32")))
    commit_with_arrays(repository, "b", 2)
    commit_with_arrays(repository, "c", 3)
    gc(repository, grace=timedelta(0), expire_older_than=timedelta(0))  # main's history: its tip alone
    tip_history = [info.id for info in repository.icechunk.ancestry(branch="main")]
    assert late.session.snapshot_id not in tip_history  # the tag keeps the snapshot, not its place in main
    with pytest.raises(CommitConflict, match="expired"):
        late.commit("after expiry")
    assert "late" not in {item["id"] for item in repository.view().items()}
    again = repository.writer()  # a new writer, opened at the tip, commits the same item
    again.add_item(make_item("late", "c"))
    again.commit("again")
    assert "late" in {item["id"] for item in repository.view().items()}


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
    assert len([path for path in orphans if "/data/" in path]) == 2, "staged file and rewrite are orphans"

    result = floe(root, "gc", "--grace", "0s")
    assert result.exit_code == 0, result.output
    assert set(table_files(repository)) == expected_live(repository)
    assert exports(repository) == before
    invariants.assert_newest_versions(repository.view("v1"), {"y": 0})
    invariants.assert_newest_versions(repository.view(), {"y": 2})
    assert floe(root, "check", "--all", "--deep").exit_code == 0


@pytest.mark.slow
def test_gc_while_writers_commit_deletes_nothing_they_need(tmp_path, monkeypatch):
    """gc sweeps while a commit is in flight, for certain: writer 0 has written its data file, manifest and
    metadata.json and waits before its compare-and-swap, and writer 1 is held, while the test runs gc. Old orphans
    go; the in-flight files, unreferenced but younger than the grace, stay; the commit then loses its race, moves
    its slots past the winner's (its rows rewritten to name them) and lands whole. More sweeps run while the two
    writers race on; every commit's version still reads its rows and their pixels."""
    settings = Settings()
    root = str(tmp_path / "repo")
    repository = Repository.create(root, settings)
    repository.ensure_groups(["c"])
    crash_mid_commit(repository, "old-orphan", monkeypatch)
    old = set(table_files(repository)) - expected_live(repository)
    assert old
    two_hours_ago = time.time() - 7200
    for path in old:
        os.utime(os.path.join(root, path), (two_hours_ago, two_hours_ago))
    grace = timedelta(hours=1)

    meeting, arguments = race_writers(
        root, settings, tmp_path / "meeting", writers=2, commits=8, rows=3, race_at=3, held=True
    )
    with SPAWN.Pool(2) as pool:
        pending = pool.starmap_async(commit_worker, arguments)

        wait_while_writing(meeting, LOSER_WAITING, pending)
        live_at_sweep = expected_live(repository)
        in_flight = gc(repository, grace=grace)
        meeting.arrive(GO)
        later = []
        while not pending.ready():
            later.append(gc(repository, grace=grace))
        results = pending.get()

    assert {path for path, _ in in_flight.deleted} == old, "gc did not remove exactly the old orphans"
    assert not any(sweep.deleted for sweep in later), "a later sweep deleted a file younger than the grace"
    commits = [commit for worker in results for commit in worker]
    forced = forced_loss(results)
    # The table files the in-flight attempt had written existed, unreferenced, when gc swept: gc kept them all.
    waiting = files_of_version(repository, forced["lost"][0]) - live_at_sweep
    assert any(path.endswith(".parquet") for path in waiting) and f"tables/{forced['lost'][0]}" in waiting
    assert waiting <= {path for path, _ in in_flight.kept_young}, "gc swept a file of the commit in flight"
    assert waiting <= set(table_files(repository)), "a file of the commit in flight is gone"
    # Both writers appended to one stack from the same base: the loser's slots moved past the winner's (its rows
    # were rewritten to name them), and it landed whole with the data files that name the moved slots.
    tip = Repository.open(root, settings)
    landed = {item_id: staged_slots(tip.view(forced["snapshot_id"]).item("c", item_id)) for item_id in forced["ids"]}
    assert landed != forced["staged"], "the forced loser's slots did not move: the race did not collide"
    landed_with = data_files_added(tip, forced["snapshot_id"])
    assert landed_with and landed_with <= set(table_files(tip))

    rows = invariants.Rows()
    invariants.assert_history_holds(tip, "main", *snapshot_ids(results))
    invariants.assert_items_exactly(
        tip.view(), Counter(item_id for commit in commits for item_id in commit["ids"]), rows
    )
    committed = {commit["snapshot_id"]: commit["ids"] for commit in commits}
    for commit in commits:  # every commit's own version still reads, with its arrays
        invariants.assert_committed_rows_readable(tip, committed, commit["snapshot_id"], rows)
        view = tip.view(commit["snapshot_id"])
        invariants.assert_item_arrays(view, "c", {item_id: pixels_of(item_id) for item_id in commit["ids"]})
        invariants.assert_rows_have_their_arrays(view, rows)
        invariants.assert_no_slice_without_row(view, rows)
    checked = floe(root, "check", "--all", "--deep")
    assert checked.exit_code == 0, checked.output


def data_files_added(repository: Repository, snapshot_id: str) -> set[str]:
    """The data files the table at ``snapshot_id`` has and the table at its parent has not (relative to the root)."""
    parent = repository.icechunk.lookup_snapshot(snapshot_id).parent_id
    assert parent is not None

    def data_files(snapshot: str) -> set[str]:
        return {task.file.file_path for task in repository.view(snapshot).table.scan().plan_files()}

    files = RootFiles(repository.location)
    return {files.relative(path) or path for path in data_files(snapshot_id) - data_files(parent)}
