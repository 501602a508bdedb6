"""Copies and moves are safe: a copied, moved or synced repository is refused until `floe relocate` makes it
work where it is, and neither it nor the original ever loses a file (issue 14, item 7)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from ingest import Repository, Settings
from ingest.errors import RepositoryMoved
from ingest.lifecycle import relocate
from ingest.lifecycle._store import RootFiles
from tests._cli import floe_here as floe
from tests.conftest import make_item
from tests.lifecycle._helpers import every_version, expected_live, table_files
from tests.lifecycle._writers import commit_with_arrays


def build(root: str, settings: Settings) -> Repository:
    """A history worth relocating: arrays, a tag, a branch with its own commit, a copy-on-write replacement."""
    repository = Repository.create(root, settings)
    for number in range(3):
        commit_with_arrays(repository, f"item-{number}", number)
    repository.tag("v1")
    repository.branch("dev")
    writer = repository.writer("dev")
    writer.add_item(make_item("only-on-dev", "c"))
    writer.commit("dev only")
    writer = repository.writer()
    writer.add_item(make_item("item-1", "c", version=2), replace=True)
    writer.commit("replace item-1")
    return repository


def digests(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.name != ".floe.lock"
    }


def kept_files(directory: Path) -> list[Path]:
    return [path for path in directory.rglob("*") if path.is_file()]


@pytest.mark.slow
def test_a_copy_is_refused_until_relocated_then_works_and_the_original_is_untouched(tmp_path):
    settings = Settings()
    original = tmp_path / "R"
    versions = every_version(build(str(original), settings))
    before = digests(original)
    copy = tmp_path / "R2"
    shutil.copytree(original, copy, symlinks=True)  # cp -a

    with pytest.raises(RepositoryMoved) as refused:
        Repository.open(copy, settings)
    assert str(original) in str(refused.value) and "floe --root" in str(refused.value)
    assert "relocate" in str(refused.value)
    copied = digests(copy)
    for args in (("gc", "--grace", "0s"), ("check", "--all", "--deep"), ("export", "-"), ("log",)):
        result = floe(str(copy), *args)
        assert result.exit_code == 1, (args, result.output)
        assert "relocate" in result.output
    assert digests(copy) == copied, "a refused command changed the copy"

    dry = floe(str(copy), "relocate", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert digests(copy) == copied, "a dry run wrote something"
    listed = {line for line in dry.stdout.splitlines() if line.strip()}
    assert any(path.endswith(".metadata.json") for path in listed)
    assert any(path.endswith(".avro") for path in listed)

    result = floe(str(copy), "relocate")
    assert result.exit_code == 0, result.output
    relocated = Repository.open(copy, settings)
    assert every_version(relocated) == versions, "a version of the copy reads differently"
    assert floe(str(copy), "check", "--all", "--deep").exit_code == 0
    swept = floe(str(copy), "gc", "--grace", "0s")
    assert swept.exit_code == 0, swept.output
    assert set(table_files(relocated)) == expected_live(relocated)
    assert every_version(Repository.open(copy, settings)) == versions, "gc of the copy removed a file it needs"
    assert "nothing to do" in floe(str(copy), "relocate").output

    writer = relocated.writer()
    writer.add_item(make_item("after-relocation", "c"))
    writer.commit("written to the copy")
    assert digests(original) == before, "the original root was written"
    assert every_version(Repository.open(original, settings)) == versions


def test_a_moved_repository_relocates_even_if_interrupted(tmp_path, monkeypatch):
    settings = Settings()
    original = tmp_path / "R"
    versions = every_version(build(str(original), settings))
    moved = tmp_path / "elsewhere" / "R"
    moved.parent.mkdir()
    shutil.move(original, moved)  # mv: the old root is gone

    class Interrupted(Exception):
        pass

    real_write = RootFiles.write
    writes = []

    def write_then_stop(self, relative, data):
        if len(writes) == 5:
            raise Interrupted(relative)
        writes.append(relative)
        real_write(self, relative, data)

    with monkeypatch.context() as patch:
        patch.setattr(RootFiles, "write", write_then_stop)
        with pytest.raises(Interrupted):
            relocate(Repository.open(moved, settings, moved_ok=True))
    assert len(writes) == 5
    with pytest.raises(RepositoryMoved):  # half-way: still refused
        Repository.open(moved, settings)
    report = relocate(Repository.open(moved, settings, moved_ok=True))
    assert report.old_root == str(original)
    assert every_version(Repository.open(moved, settings)) == versions


@pytest.mark.s3
def test_a_bucket_sync_is_refused_then_relocated(moto_server, s3_settings, tmp_path):
    bucket = moto_server.create_bucket()
    source_root, synced_root = f"s3://{bucket}/a", f"s3://{bucket}/b"
    versions = every_version(build(source_root, s3_settings))
    source = RootFiles(Repository.open(source_root, s3_settings).location)
    target = RootFiles(Repository.open(source_root, s3_settings).location.__class__.parse(synced_root, s3_settings))
    for path in source.list(""):
        target.write(path, source.read(path))  # what `aws s3 sync` does: the same bytes under another prefix
    # The copy's metadata is rewritten in place by relocation: a disk cache must keep none of it before.
    cached = s3_settings.model_copy(deep=True)
    cached.api.cache_dir = str(tmp_path / "cache")

    with pytest.raises(RepositoryMoved):
        Repository.open(synced_root, cached)
    relocate(Repository.open(synced_root, cached, moved_ok=True))
    assert not kept_files(tmp_path / "cache")
    assert every_version(Repository.open(synced_root, cached)) == versions
    assert kept_files(tmp_path / "cache")  # kept once the copy was relocated
    assert every_version(Repository.open(synced_root, cached)) == versions  # read back from the disk cache
    assert every_version(Repository.open(source_root, s3_settings)) == versions


def test_gc_and_check_refuse_metadata_that_names_another_root_even_when_opened_anyway(tmp_path):
    from datetime import timedelta

    from ingest.lifecycle import check, gc

    settings = Settings()
    build(str(tmp_path / "R"), settings)
    copy = tmp_path / "R2"
    shutil.copytree(tmp_path / "R", copy, symlinks=True)
    copied = digests(copy)
    opened_anyway = Repository.open(copy, settings, moved_ok=True)
    with pytest.raises(RepositoryMoved, match="relocate"):
        gc(opened_anyway, grace=timedelta(0))
    assert digests(copy) == copied
    problems = check(opened_anyway, all_refs=True)
    assert problems and all("not this root" in problem.what for problem in problems)


def test_gc_refuses_when_any_version_names_another_root(tmp_path):
    """Belt and braces: the tip looks at home (only its metadata.json rewritten), older files still name R."""
    from datetime import timedelta

    from ingest.lifecycle import gc
    from ingest.lifecycle._rewrite import rewrite_metadata_json

    settings = Settings()
    build(str(tmp_path / "R"), settings)
    copy = tmp_path / "R2"
    shutil.copytree(tmp_path / "R", copy, symlinks=True)
    opened = Repository.open(copy, settings, moved_ok=True)
    tip = Path(opened.metadata_location_of(opened.resolve("main")))
    tip.write_bytes(rewrite_metadata_json(tip.read_bytes(), str(tmp_path / "R" / "tables"), str(copy / "tables")))
    repository = Repository.open(copy, settings)  # the sentinel says home
    files = table_files(repository)
    with pytest.raises(RepositoryMoved, match="gc deleted no table file"):
        gc(repository, grace=timedelta(0))
    assert table_files(repository) == files
