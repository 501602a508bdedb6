"""replicate's choices: --refs, --history none, refs the source deleted or moved, two S3 services, and a gc of the
source that overlaps a run."""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta

import pytest
from typer.testing import CliRunner

from ingest import Repository, Settings
from ingest.cli import app
from ingest.errors import InvalidRoot, RefNotFound, ReplicationFailed
from ingest.lifecycle import _replicate as replicate_module
from ingest.lifecycle import _replicate_tables as tables_module
from ingest.lifecycle import check, gc, replicate
from ingest.lifecycle._replica_refs import CapturedRefs
from ingest.lifecycle._store import RootFiles
from ingest.storage import Location
from tests.conftest import MotoServer
from tests.lifecycle._helpers import export, exports
from tests.lifecycle._writers import commit_with_arrays
from tests.lifecycle.test_replicate import assert_arrays_equal

SETTINGS = Settings()


def root_bytes(root: str, settings: Settings = SETTINGS) -> int:
    """Bytes of every file under a root (Icechunk's backups of its ``repo`` object aside)."""
    files = RootFiles(Location.parse(root, settings))
    found = {**files.list("arrays"), **files.list("tables")}
    return sum(stat.size for path, stat in found.items() if not path.startswith("arrays/overwritten/"))


def new_files(root: str, before: dict[str, int]) -> dict[str, int]:
    files = RootFiles(Location.parse(root, SETTINGS))
    now = {**files.list("arrays"), **files.list("tables")}
    return {path: stat.size for path, stat in now.items() if path not in before}


def listing(root: str) -> dict[str, int]:
    files = RootFiles(Location.parse(root, SETTINGS))
    return {path: stat.size for path, stat in {**files.list("arrays"), **files.list("tables")}.items()}


def refs_of(repository: Repository) -> list[tuple[str, str]]:
    return [(ref.kind, ref.name) for ref in repository.refs()]


def replica_of(repository: Repository, ref: str) -> str:
    """The source snapshot the target's version of ``ref`` reproduces, as its log records it."""
    return repository.icechunk.lookup_snapshot(repository.resolve(ref)).metadata["floe:replica-of"]


@pytest.fixture(scope="module")
def fifty(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A source with 50 commits with arrays: v1 tags the 25th, v2 the 50th."""
    root = str(tmp_path_factory.mktemp("fifty") / "source")
    source = Repository.create(root, SETTINGS)
    for number in range(50):
        commit_with_arrays(source, f"g{number:02d}", number)
        if number == 24:
            source.tag("v1")
    source.tag("v2")
    return root


@pytest.mark.slow
def test_one_tag_without_history_then_a_second(fifty, tmp_path):
    source = Repository.open(fifty, SETTINGS)
    target_root, full_root = str(tmp_path / "release"), str(tmp_path / "full")

    first = replicate(fifty, target_root, SETTINGS, refs=["v1"], history="none")
    assert first.updated == ["tag v1"] and first.refs_moved
    target = Repository.open(target_root, SETTINGS)
    # v1 only; main is Icechunk's, at the empty version the target was created with.
    assert refs_of(target) == [("branch", "main"), ("tag", "v1")]
    assert export(target, "main") == []
    assert export(target, "v1") == export(source, "v1")
    assert_arrays_equal(source, target, "v1")
    assert check(target, all_refs=True, deep=True) == []
    # Its own short history: the empty version, then one snapshot reproducing v1.
    assert len(target.log("v1")) == 2
    assert replica_of(target, "v1") == source.resolve("v1")
    # Only v1's current Iceberg snapshot is kept.
    assert len(target.view("v1").table.metadata.snapshots) == 1

    replicate(fifty, full_root, SETTINGS)
    without, with_history = root_bytes(target_root), root_bytes(full_root)
    assert without < with_history / 2, (without, with_history)

    v1_version = target.resolve("v1")
    before = listing(target_root)
    second = replicate(fifty, target_root, SETTINGS, refs=["v1", "v2"], history="none")
    assert second.updated == ["tag v2"]
    target = Repository.open(target_root, SETTINGS)
    assert refs_of(target) == [("branch", "main"), ("tag", "v1"), ("tag", "v2")]
    assert target.resolve("v1") == v1_version
    assert export(target, "v2") == export(source, "v2")
    assert_arrays_equal(source, target, "v2")
    assert replica_of(target, "v2") == source.resolve("v2")
    assert check(target, all_refs=True, deep=True) == []
    # v2 was written as what changed since v1: its chunks are the 25 new items' (not all 50 items').
    assert second.chunk_bytes < first.chunk_bytes * 1.5
    # The second run kept every file of the first.
    assert set(before) <= set(listing(target_root))

    again = replicate(fifty, target_root, SETTINGS, refs=["v1", "v2"], history="none")
    assert again.updated == [] and again.bytes_written == 0

    # A floe repository like any other: the CLI exports it, and its own gc keeps what its refs need.
    out = tmp_path / "v2.ndjson"
    result = CliRunner().invoke(app, ["--root", target_root, "export", str(out), "--ref", "v2"])
    assert result.exit_code == 0, result.output
    lines = out.read_text().splitlines()
    assert sorted(json.dumps(json.loads(line), sort_keys=True) for line in lines) == export(source, "v2")
    gc(target, grace=timedelta(0), expire_older_than=timedelta(0))
    assert check(target, all_refs=True, deep=True) == []
    assert export(target, "v1") == export(source, "v1") and export(target, "v2") == export(source, "v2")


@pytest.mark.slow
def test_a_branch_without_history_follows_its_source_incrementally(tmp_path):
    source_root, target_root = str(tmp_path / "source"), str(tmp_path / "target")
    source = Repository.create(source_root, SETTINGS)
    for number in range(6):
        commit_with_arrays(source, f"a{number}", number)
    replicate(source_root, target_root, SETTINGS, refs=["main"], history="none")
    before = listing(source_root)
    for number in range(6, 9):
        commit_with_arrays(source, f"a{number}", number)
    added = new_files(source_root, before)
    new_data = sum(size for path, size in added.items() if path.startswith(("arrays/chunks/", "tables/items/data/")))

    report = replicate(source_root, target_root, SETTINGS, refs=["main"], history="none")
    target = Repository.open(target_root, SETTINGS)
    assert report.updated == ["branch main"] and not report.moved
    assert export(target, "main") == export(source, "main")
    assert_arrays_equal(source, target, "main")
    assert check(target, all_refs=True, deep=True) == []
    copied_data = report.chunk_bytes + sum(size for path, size in report.copied)
    assert new_data <= copied_data <= 1.1 * new_data + 1024, (copied_data, new_data)
    # One more snapshot on the target's main, which reproduces the source's new tip.
    assert [(info.metadata or {}).get("floe:replica-of") for info in target.icechunk.ancestry(branch="main")][:2] == [
        source.resolve("main"),
        source.log("main")[3].snapshot_id,
    ]


@pytest.mark.parametrize("history", ["full", "none"])
def test_refs_the_source_deleted_or_moved_are_reported_and_pruned_on_request(tmp_path, history):
    source_root, target_root = str(tmp_path / "source"), str(tmp_path / "target")
    source = Repository.create(source_root, SETTINGS)
    commit_with_arrays(source, "a", 1)
    source.tag("old")
    source.branch("dev")
    source.branch("side")
    for number in range(2, 4):
        commit_with_arrays(source, f"b{number}", number)
    source.icechunk.reset_branch("dev", source.resolve("main"))  # dev moves forward to main's tip
    replicate(source_root, target_root, SETTINGS, history=history)

    # dev moves back to where old points (not a descendant of the version the target holds); side and old are
    # deleted at the source.
    commit_with_arrays(source, "d", 5, collection="c")
    source.icechunk.reset_branch("dev", source.resolve("old"))
    source.icechunk.delete_branch("side")
    source.icechunk.delete_tag("old")

    kept = replicate(source_root, target_root, SETTINGS, history=history)
    target = Repository.open(target_root, SETTINGS)
    assert "branch side" in kept.gone
    assert ("branch", "side") in refs_of(target)
    assert "tag old" in (kept.removed if history == "full" else kept.gone)
    assert export(target, "dev") == export(source, "dev")
    assert export(target, "main") == export(source, "main")
    assert check(target, all_refs=True, deep=True) == []

    pruned = replicate(source_root, target_root, SETTINGS, history=history, prune=True)
    target = Repository.open(target_root, SETTINGS)
    assert "branch side" in pruned.removed
    assert ("branch", "side") not in refs_of(target) and ("tag", "old") not in refs_of(target)
    assert check(target, all_refs=True, deep=True) == []


def test_a_branch_that_moved_back_gets_a_new_version_forward(tmp_path):
    source_root, target_root = str(tmp_path / "source"), str(tmp_path / "target")
    source = Repository.create(source_root, SETTINGS)
    commit_with_arrays(source, "a", 1)
    first = source.resolve("main")
    commit_with_arrays(source, "b", 2)
    replicate(source_root, target_root, SETTINGS, history="none")
    held = Repository.open(target_root, SETTINGS).resolve("main")

    source.icechunk.reset_branch("main", first)
    report = replicate(source_root, target_root, SETTINGS, history="none")
    target = Repository.open(target_root, SETTINGS)
    assert report.moved == ["branch main"]
    assert export(target, "main") == export(source, "main")
    assert_arrays_equal(source, target, "main")
    # Forward only: the version the target held is the parent of its new one.
    assert target.log("main")[1].snapshot_id == held
    assert check(target, all_refs=True, deep=True) == []


@pytest.mark.slow
def test_a_full_replica_of_chosen_refs_lists_only_them(fifty, tmp_path):
    source = Repository.open(fifty, SETTINGS)
    target_root = str(tmp_path / "target")
    report = replicate(fifty, target_root, SETTINGS, refs=["v1"])
    target = Repository.open(target_root, SETTINGS)
    assert refs_of(target) == [("branch", "main"), ("tag", "v1")]
    assert report.refs == ["branch main", "tag v1"]
    assert export(target, "v1") == export(source, "v1")
    for entry in source.log("v1"):  # its whole history
        assert export(target, entry.snapshot_id) == export(source, entry.snapshot_id)
    assert check(target, all_refs=True, deep=True) == []
    # A later run with more refs adds them; the refs an earlier run chose stay.
    replicate(fifty, target_root, SETTINGS, refs=["v2"])
    assert refs_of(Repository.open(target_root, SETTINGS)) == [("branch", "main"), ("tag", "v1"), ("tag", "v2")]


def test_modes_do_not_mix_and_unknown_refs_are_named(fifty, tmp_path):
    with_history, without = str(tmp_path / "with"), str(tmp_path / "without")
    replicate(fifty, with_history, SETTINGS, refs=["v1"])
    replicate(fifty, without, SETTINGS, refs=["v1"], history="none")
    with pytest.raises(InvalidRoot, match="with history"):
        replicate(fifty, with_history, SETTINGS, history="none")
    with pytest.raises(InvalidRoot, match="without history"):
        replicate(fifty, without, SETTINGS)
    with pytest.raises(RefNotFound, match="v9"):
        replicate(fifty, str(tmp_path / "other"), SETTINGS, refs=["v9"], history="none")
    result = CliRunner().invoke(app, ["replicate", fifty, str(tmp_path / "x"), "--history", "some"])
    assert result.exit_code == 2 and "full or none" in result.output


@pytest.mark.s3
@pytest.mark.parametrize("history", ["full", "none"])
def test_s3_to_another_s3_service(tmp_path, moto_server, history):
    """Two moto servers on two ports: the source's settings reach one, --dst-config the other."""
    other = MotoServer()
    try:
        source_settings = Settings(s3=moto_server.s3_settings())
        source_root = f"s3://{moto_server.create_bucket()}/repo"
        source = Repository.create(source_root, source_settings)
        for number in range(3):
            commit_with_arrays(source, f"s{number}", number)
        source.tag("v1")
        commit_with_arrays(source, "s3", 3)
        target_root = f"s3://{other.create_bucket()}/replica"
        dst = tmp_path / "dst.toml"
        target_s3 = other.s3_settings()
        dst.write_text(
            "[s3]\n"
            + "".join(f'{key} = "{value}"\n' for key, value in target_s3.model_dump().items() if isinstance(value, str))
            + "allow_http = true\nforce_path_style = true\n"
        )
        env = {f"FLOE_S3__{k.upper()}": str(v) for k, v in moto_server.s3_settings().model_dump().items() if v}
        for _ in range(2):  # the second run finds nothing new
            result = CliRunner().invoke(
                app,
                ["replicate", source_root, target_root, "--history", history, "--dst-config", str(dst)],
                env=env,
                catch_exceptions=False,
            )
            assert result.exit_code == 0, result.output
        target_settings = Settings(s3=target_s3)
        target = Repository.open(target_root, target_settings)
        assert check(target, all_refs=True, deep=True) == []
        assert exports(target) == exports(source)
        assert_arrays_equal(source, target, "v1")
        assert not RootFiles(Location.parse(source_root.replace("/repo", "/replica"), source_settings)).list("")
        assert "0 B" in result.output or "copied 0 file(s)" in result.output
    finally:
        other.stop()


@pytest.mark.parametrize("when", ["before the listing", "during the copies"])
def test_a_gc_of_the_source_mid_run_leaves_the_target_old_or_complete(tmp_path, monkeypatch, when):
    """`floe gc --grace 0s --expire-older-than 0s` runs on the source after the refs were captured: before the
    objects are listed (a snapshot expired then is never listed) or between the copies. The target keeps its old
    refs, or is complete: never a target that checks but lacks a file."""
    source_root, target_root = str(tmp_path / "source"), str(tmp_path / "target")
    source = Repository.create(source_root, SETTINGS)
    commit_with_arrays(source, "a", 1)
    replicate(source_root, target_root, SETTINGS)
    old_tip = Repository.open(target_root, SETTINGS).resolve("main")
    for number in range(2, 8):
        commit_with_arrays(source, f"b{number}", number)
    source.tag("keep")
    commit_with_arrays(source, "c", 9)

    def collect() -> None:
        gc(Repository.open(source_root, SETTINGS), grace=timedelta(0), expire_older_than=timedelta(0))

    ran = []
    if when == "before the listing":
        plan = replicate_module._Replication.plan_copies

        def gc_then_plan(self):
            collect()
            ran.append(True)
            plan(self)

        monkeypatch.setattr(replicate_module._Replication, "plan_copies", gc_then_plan)
    else:
        copy_files = tables_module.copy_files

        def gc_then_copy(source_files, target_files, paths):
            if paths and not ran:
                collect()
                ran.append(True)
            copy_files(source_files, target_files, paths)

        monkeypatch.setattr(replicate_module, "copy_files", gc_then_copy)
    try:
        replicate(source_root, target_root, SETTINGS)
        moved = True
    except ReplicationFailed as error:
        assert "refs were not moved" in str(error)
        moved = False
    assert ran, "the gc did not run during the replication"
    target = Repository.open(target_root, SETTINGS)
    assert check(target, all_refs=True, deep=True) == []
    if moved:
        for ref in target.refs():
            assert_arrays_equal(source, target, ref.snapshot_id)
            for entry in target.log(ref.snapshot_id):
                assert export(target, entry.snapshot_id)  # every version in the history reads
    else:
        assert target.resolve("main") == old_tip
    monkeypatch.undo()
    replicate(source_root, target_root, SETTINGS)  # and a run after the gc brings it up to date
    target = Repository.open(target_root, SETTINGS)
    assert check(target, all_refs=True, deep=True) == []
    assert exports(target) == exports(Repository.open(source_root, SETTINGS))


@pytest.mark.slow
def test_without_history_a_gc_mid_run_fails_cleanly_or_completes(tmp_path, monkeypatch):
    source_root, target_root = str(tmp_path / "source"), str(tmp_path / "target")
    source = Repository.create(source_root, SETTINGS)
    for number in range(4):
        commit_with_arrays(source, f"a{number}", number)
    replicate(source_root, target_root, SETTINGS, history="none")
    held = Repository.open(target_root, SETTINGS).resolve("main")
    for number in range(4, 8):
        commit_with_arrays(source, f"a{number}", number)
    # The source's main moves back (its newer versions become garbage) and gc collects them mid-run.
    tip = source.resolve("main")
    plan = tables_module.TableCopy.write

    def collect_then_write(self):
        source.icechunk.reset_branch("main", source.log("main")[5].snapshot_id)
        gc(Repository.open(source_root, SETTINGS), grace=timedelta(0), expire_older_than=timedelta(0))
        plan(self)

    monkeypatch.setattr(tables_module.TableCopy, "write", collect_then_write)
    with pytest.raises(ReplicationFailed, match="refs were not moved"):
        replicate(source_root, target_root, SETTINGS, history="none")
    assert source.resolve("main") != tip
    target = Repository.open(target_root, SETTINGS)
    assert target.resolve("main") == held
    assert check(target, all_refs=True, deep=True) == []


def test_a_snapshot_expired_on_the_source_during_the_run_stops_it(tmp_path, monkeypatch):
    """The source's refs are read again before the target's move: a snapshot the captured refs reach that is no
    longer listed (expired meanwhile; its objects may have gone before they were listed) stops the run."""
    source_root, target_root = str(tmp_path / "source"), str(tmp_path / "target")
    source = Repository.create(source_root, SETTINGS)
    commit_with_arrays(source, "a", 1)
    replicate(source_root, target_root, SETTINGS)
    held = Repository.open(target_root, SETTINGS).resolve("main")
    commit_with_arrays(source, "b", 2)
    expired = source.log("main")[1].snapshot_id
    capture = replicate_module.capture_refs
    reads = []

    def expire_after_the_first_read(repo_bytes: bytes) -> CapturedRefs:
        captured = capture(repo_bytes)
        reads.append(True)
        if len(reads) > 1:  # the source's refs (1), the source's again before the move (2)
            captured.snapshot_ids.discard(expired)
        return captured

    monkeypatch.setattr(replicate_module, "capture_refs", expire_after_the_first_read)
    with pytest.raises(ReplicationFailed, match=f"snapshot {expired} was expired on the source"):
        replicate(source_root, target_root, SETTINGS)
    assert Repository.open(target_root, SETTINGS).resolve("main") == held


def test_virtual_arrays_replicate_without_history_as_references(tmp_path):
    """A virtual granule's chunks stay references to its source file at the target: they read the same pixels,
    the target's configuration authorises the same source, and nothing of the file is copied."""
    from ingest.pipeline._arrays import stage_references
    from ingest.sample import make_archive
    from ingest.stac import arrays_asset, with_arrays_asset
    from tests.conftest import make_item

    item_file = next(
        path for path in make_archive(tmp_path / "archive", granules=3, seed=4) if "sample-dem" in path.name
    )
    tif = next(item_file.parent.glob("*.tif"))
    source_root, target_root = str(tmp_path / "source"), str(tmp_path / "target")
    source = Repository.create(source_root, SETTINGS)
    source.allow_virtual_sources([tif])
    writer = source.writer()
    writer.ensure_collection("sample-dem")
    item = make_item("one", "sample-dem")
    placed, _ = stage_references(writer, item, {"data": str(tif)}, source.settings.arrays)
    writer.add_item(with_arrays_asset(item, arrays_asset(placed, virtual=True)))
    writer.commit("one virtual granule")

    report = replicate(source_root, target_root, SETTINGS, history="none")
    target = Repository.open(target_root, SETTINGS)
    assert check(target, all_refs=True, deep=True) == []
    assert_arrays_equal(source, target, "main")
    assert report.chunk_bytes < tif.stat().st_size  # references, not the file's bytes
    assert str(tif) in " ".join(target.view().session.all_virtual_chunk_locations())
    # A source file modified after the replicated version was written is refused at the target.
    later = time.time() + 5
    os.utime(tif, (later, later))
    with pytest.raises(Exception, match="checksum of the object owning the virtual chunk has changed"):
        target.view().item_arrays("sample-dem", "one").load()


@pytest.mark.slow
def test_a_replica_without_history_is_served_at_its_tag(fifty, tmp_path):
    """`floe serve` on a replica without history: a STAC client searching the tag's root gets the source's items
    at that tag, and the branch root (main, empty at such a target) gets none."""
    from pystac_client import Client

    from tests.api._servers import FloeServer

    target_root = str(tmp_path / "release")
    replicate(fifty, target_root, SETTINGS, refs=["v1"], history="none")
    expected = sorted(item["id"] for item in Repository.open(fifty, SETTINGS).view("v1").items())
    server = FloeServer(target_root)
    try:
        tag = Client.open(f"{server.url}/refs/v1/")
        assert sorted(item.id for item in tag.search(max_items=None, limit=7).items()) == expected
        main = Client.open(server.url)
        assert list(main.search(max_items=None).items()) == []
    finally:
        server.stop()
