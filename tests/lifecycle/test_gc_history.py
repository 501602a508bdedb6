"""gc and Icechunk's ``arrays/overwritten/``: replaced versions of ``repo`` older than the grace go, younger ones (and
the newest few) stay, a dry run deletes nothing, and every ref and every version in its history still reads.

The objects are aged by their modification time (``os.utime``) on local roots; on moto, where a LastModified cannot
be set, the default grace keeps everything and ``--grace 0s`` removes all but the newest."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest

from ingest import Repository, Settings
from ingest.lifecycle import arrays_footprint, gc
from ingest.lifecycle._history import KEEP_NEWEST, OVERWRITTEN_DIR, REPO_OBJECT
from ingest.lifecycle._store import RootFiles
from tests._cli import floe_here as floe
from tests.lifecycle._helpers import every_version, exports
from tests.lifecycle._writers import commit_with_arrays

HALF_HOUR = timedelta(minutes=30)


def overwritten(repository: Repository) -> dict[str, float]:
    """Each replaced version of ``repo`` (path relative to the root) -> its modification time (epoch seconds)."""
    listed = RootFiles(repository.location).list(OVERWRITTEN_DIR)
    return {path: stat.modified.timestamp() for path, stat in listed.items() if stat.modified is not None}


def backdate(root: str, listed: dict[str, float], paths: set[str], seconds: float) -> None:
    """Make ``paths`` ``seconds`` older, each by the same amount, so they stay in the order they were written."""
    for path in paths:
        moment = listed[path] - seconds
        os.utime(os.path.join(root, path), (moment, moment))


def history_with_refs(repository: Repository) -> None:
    """Commits with arrays; a tag and a branch part-way, main moving on: every kind of ref, each with history."""
    for number in range(4):
        commit_with_arrays(repository, f"main-{number}", number)
    repository.tag("v1")
    repository.branch("side")
    for number in range(4, 14):
        commit_with_arrays(repository, f"main-{number}", number)


def assert_everything_reads(root: str, versions_before, exports_before, settings: Settings | None = None) -> None:
    # A fresh open: nothing cached from before the sweep.
    reopened = Repository.open(root, settings or Settings())
    assert exports(reopened) == exports_before
    assert every_version(reopened) == versions_before
    result = floe(root, "check", "--all", "--deep", settings=settings)
    assert result.exit_code == 0, result.output


@pytest.mark.slow
def test_gc_removes_replaced_repo_versions_older_than_the_grace_and_keeps_younger_ones(tmp_path):
    root = str(tmp_path / "repo")
    repository = Repository.create(root, Settings())
    history_with_refs(repository)
    versions_before, exports_before = every_version(repository), exports(repository)
    listed = overwritten(repository)
    assert len(listed) >= 16  # one per commit, tag and branch at least
    # The older half is an hour old, the rest young: the grace alone decides which go.
    by_age = sorted(listed, key=listed.__getitem__)
    old, young = set(by_age[: len(by_age) // 2]), set(by_age[len(by_age) // 2 :])
    backdate(root, listed, old, 3600)

    # The command keeps the newest ten whatever their age: of the old ones, those beyond the newest ten would go.
    beyond_newest = old - set(by_age[-KEEP_NEWEST:])
    assert beyond_newest
    dry = floe(root, "gc", "--grace", "30m", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert f"arrays/overwritten: would delete {len(beyond_newest)} replaced version(s)" in dry.stderr
    assert {path for path, _ in gc(repository, grace=HALF_HOUR, dry_run=True).history.deleted} == beyond_newest
    assert set(overwritten(repository)) >= set(listed)  # a dry run deletes nothing

    report = gc(repository, grace=HALF_HOUR, keep_newest=0)
    assert {path for path, _ in report.history.deleted} == old
    assert young <= {path for path, _ in report.history.kept_young}
    assert report.history.bytes_deleted > 0 and not report.history.kept_newest
    left = set(overwritten(repository))
    assert young <= left and not old & left
    # Icechunk's GC rewrote `repo` (and copied the old one to overwritten/, young); the refs in it are the same.
    assert report.repo_bytes == len(RootFiles(repository.location).read(REPO_OBJECT)) > 0
    assert_everything_reads(root, versions_before, exports_before)

    # The repository goes on: a commit lands, and Icechunk's operations log still reads (it ends where a copy is gone).
    commit_with_arrays(repository, "after", 99)
    assert len(list(repository.icechunk.ops_log())) >= 9
    assert exports(Repository.open(root, Settings()))["branch:main"] != exports_before["branch:main"]


@pytest.mark.slow
def test_the_newest_replaced_versions_stay_whatever_their_age(tmp_path):
    root = str(tmp_path / "repo")
    repository = Repository.create(root, Settings())
    history_with_refs(repository)
    versions_before, exports_before = every_version(repository), exports(repository)
    listed = overwritten(repository)
    backdate(root, listed, set(listed), 7200)
    aged = overwritten(repository)

    report = gc(repository, grace=HALF_HOUR, keep_newest=3)
    young = {path for path, _ in report.history.kept_young}
    newest = {path for path, _ in report.history.kept_newest}
    deleted = {path for path, _ in report.history.deleted}
    # Young: only the copy Icechunk's own GC made of `repo` during this run. With it, three stay.
    assert young and not young & set(aged)
    assert len(young) + len(newest) == 3
    left = set(overwritten(repository))
    assert young | newest <= left and not deleted & left
    assert deleted == set(aged) - newest
    assert max(aged[path] for path in deleted) < min(aged[path] for path in newest)
    assert_everything_reads(root, versions_before, exports_before)


@pytest.mark.slow
def test_default_gc_keeps_the_newest_ten_and_expiry_shrinks_repo(tmp_path):
    root = str(tmp_path / "repo")
    repository = Repository.create(root, Settings())
    for number in range(KEEP_NEWEST + 6):
        commit_with_arrays(repository, f"item-{number}", number)
    repository.tag("v1")
    exports_before = exports(repository)
    footprint = arrays_footprint(repository.location)
    assert footprint.objects["overwritten"] >= KEEP_NEWEST + 6
    assert footprint.bytes["repo"] == RootFiles(repository.location).stat(REPO_OBJECT).size

    result = floe(root, "gc", "--grace", "0s", "--expire-older-than", "0s")
    assert result.exit_code == 0, result.output
    assert "arrays/overwritten: deleted" in result.stderr
    after = arrays_footprint(repository.location)
    # Every copy is older than a zero grace: only the newest ten stay.
    assert after.objects["overwritten"] == KEEP_NEWEST
    # Expiry dropped the old snapshots from `repo` (tips and tags stay): it is smaller than before.
    assert after.bytes["repo"] < footprint.bytes["repo"]
    assert exports(Repository.open(root, Settings())) == exports_before
    assert floe(root, "check", "--all", "--deep").exit_code == 0


def test_dry_run_deletes_no_replaced_version(tmp_path):
    root = str(tmp_path / "repo")
    repository = Repository.create(root, Settings())
    history_with_refs(repository)
    listed = overwritten(repository)
    backdate(root, listed, set(listed), 3600)
    report = gc(repository, grace=HALF_HOUR, keep_newest=0, dry_run=True)
    assert {path for path, _ in report.history.deleted} == set(listed)
    assert set(overwritten(repository)) == set(listed)


@pytest.mark.s3
def test_gc_on_s3_removes_replaced_versions_by_last_modified(s3_root, s3_settings):
    repository = Repository.create(s3_root, s3_settings)
    for number in range(3):
        commit_with_arrays(repository, f"item-{number}", number)
    repository.tag("v1")
    commit_with_arrays(repository, "item-3", 3)
    versions_before, exports_before = every_version(repository), exports(repository)
    listed = set(overwritten(repository))
    assert len(listed) >= 5

    kept = floe(s3_root, "gc", settings=s3_settings)  # default grace: 24h
    assert kept.exit_code == 0, kept.output
    assert listed <= set(overwritten(repository))

    report = gc(repository, grace=timedelta(0), keep_newest=2)
    left = set(overwritten(repository))
    deleted = {path for path, _ in report.history.deleted}
    assert deleted and not deleted & left
    assert len(listed & left) <= 2  # the newest two (or copies made by this very run) stay
    assert_everything_reads(s3_root, versions_before, exports_before, s3_settings)


def test_icechunk_reads_replaced_versions_only_to_extend_its_operations_log(tmp_path):
    """What gc relies on, pinned against the installed Icechunk: ``repo`` keeps its newest updates itself, the
    operations log follows the copies in ``overwritten/`` for older ones and ends without an error where they are
    gone, and nothing else (reads, history, commits) notices."""
    import icechunk
    import zarr

    path = tmp_path / "arrays"
    config = icechunk.RepositoryConfig.default()
    config.num_updates_per_repo_info_file = 5  # a chain of copies after a few commits, not after 1,000
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(path)), config=config)
    session = repo.writable_session("main")
    zarr.group(session.store).create_array("a", shape=(20,), chunks=(1,), dtype="int64")
    session.commit("create")
    for number in range(12):
        session = repo.writable_session("main")
        zarr.open_array(session.store, path="a")[number] = number
        session.commit(f"write {number}")
    assert len(list(repo.ops_log())) == 14  # initialization, 13 commits: most of them read from copies

    for copy in (path / "overwritten").iterdir():
        copy.unlink()
    reopened = icechunk.Repository.open(icechunk.local_filesystem_storage(str(path)))
    assert len(list(reopened.ops_log())) == 5  # what `repo` holds itself
    assert len(list(reopened.ancestry(branch="main"))) == 14
    assert list(zarr.open_array(reopened.readonly_session("main").store, path="a", mode="r")[:12]) == list(range(12))
    session = reopened.writable_session("main")
    zarr.open_array(session.store, path="a")[12] = 12
    after = session.commit("after")
    log = list(reopened.ops_log())
    assert len(log) >= 5 and after in str(log[0].kind)  # the log goes on, newest first
