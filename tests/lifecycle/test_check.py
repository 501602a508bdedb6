"""check finds what is missing or broken, per ref."""

from __future__ import annotations

from pathlib import Path

import pytest
import zarr

from ingest import Repository
from ingest.lifecycle import check
from tests.conftest import make_item


def ingest(repo, ids, message="items"):
    writer = repo.writer()
    writer.add_items([make_item(item_id, when=f"2024-0{len(item_id)}-01T00:00:00Z") for item_id in ids])
    return writer.commit(message)


def test_healthy_repository_has_no_problems(repo):
    ingest(repo, ["a", "bb"])
    repo.tag("v1")
    assert check(repo, all_refs=True) == []


def test_missing_data_file_is_reported_for_every_ref_that_needs_it(repo):
    ingest(repo, ["a"])
    repo.tag("v1")
    ingest(repo, ["bb"])
    view = repo.view("v1")
    (task,) = list(view.table.scan().plan_files())
    Path(task.file.file_path).unlink()
    problems = check(repo, all_refs=True)
    assert {(p.ref, p.what) for p in problems} == {
        ("branch:main", f"data file {task.file.file_path} is missing"),
        ("tag:v1", f"data file {task.file.file_path} is missing"),
    }
    assert check(repo, "main") and check(repo, "v1")


def test_truncated_manifest_and_missing_metadata_are_reported(repo):
    ingest(repo, ["a"])
    repo.tag("v1")
    ingest(repo, ["bb"])
    tip = repo.view()
    manifest = tip.table.current_snapshot().manifests(repo.io)[0].manifest_path
    Path(manifest).write_bytes(Path(manifest).read_bytes()[:40])
    Path(repo.view("v1").metadata_location).unlink()
    problems = {p.ref: p.what for p in check(repo, all_refs=True)}
    assert "cannot be read" in problems["branch:main"] and manifest in problems["branch:main"]
    assert problems["tag:v1"].startswith("table metadata") and "missing" in problems["tag:v1"]


def test_unknown_ref_is_a_problem_not_a_crash(repo):
    (problem,) = check(repo, "no-such-ref")
    assert "no branch, tag or snapshot" in problem.what


# -- deep checks: recorded sizes, truncated manifests, missing arrays ------------------------------------------
def test_deep_check_finds_a_deleted_data_file_a_truncated_manifest_and_a_missing_array_group(repo):
    from typer.testing import CliRunner

    from ingest.cli import EXIT_PROBLEMS, app
    from tests.lifecycle._writers import commit_with_arrays

    commit_with_arrays(repo, "a", 1)
    commit_with_arrays(repo, "b", 2)
    repo.tag("v1")
    assert check(repo, all_refs=True, deep=True) == []
    root = repo.location.url
    run = CliRunner()
    assert run.invoke(app, ["--root", root, "check", "--all", "--deep"]).exit_code == 0

    # An array group removed at the tip: its row is still there.
    writer = repo.writer()
    zarr.open_group(writer.store, path="c", mode="a").__delitem__("b")
    writer.commit("drop the arrays of b")
    (problem,) = check(repo, "main", deep=True)
    assert problem.what == "item 'b' (c): array group 'c/b' is missing"
    assert check(repo, "main") == [] and check(repo, "v1", deep=True) == []

    # A data file with a different size than recorded: only --deep sees it.
    files = {task.file.file_path: task.file for task in repo.view("v1").table.scan().plan_files()}
    grown, deleted = sorted(files)
    with open(grown, "ab") as stream:
        stream.write(b"tail")
    Path(deleted).unlink()
    problems = {p.what for p in check(repo, "v1", deep=True)}
    assert problems == {
        f"data file {grown} has {files[grown].file_size_in_bytes + 4} bytes, "
        f"the table records {files[grown].file_size_in_bytes}",
        f"data file {deleted} is missing",
    }
    assert {p.what for p in check(repo, "v1")} == {f"data file {deleted} is missing"}

    # A truncated manifest is a finding, not a crash.
    manifest = repo.view("v1").table.current_snapshot().manifests(repo.io)[0]
    Path(manifest.manifest_path).write_bytes(Path(manifest.manifest_path).read_bytes()[:100])
    found = [p.what for p in check(repo, "v1", deep=True)]
    assert f"manifest {manifest.manifest_path} has 100 bytes, the table records {manifest.manifest_length}" in found
    assert any(what.startswith(f"manifest {manifest.manifest_path} cannot be read") for what in found)

    result = run.invoke(app, ["--root", root, "check", "--all", "--deep"])
    assert result.exit_code == EXIT_PROBLEMS
    assert "has 100 bytes" in result.output and "cannot be read" in result.output


@pytest.mark.s3
def test_deep_check_on_s3(s3_root, s3_settings):
    from tests.lifecycle._writers import commit_with_arrays

    repository = Repository.create(s3_root, s3_settings)
    commit_with_arrays(repository, "a", 1)
    assert check(repository, all_refs=True, deep=True) == []
    (task,) = list(repository.view().table.scan().plan_files())
    repository.io.delete(task.file.file_path)
    assert [p.what for p in check(repository, deep=True)] == [f"data file {task.file.file_path} is missing"]


def test_deep_check_finds_a_missing_virtual_source(tmp_path):
    """Virtual arrays read their source COGs: a deleted source is a problem only --deep looks for."""
    from ingest.lifecycle import check
    from ingest.rasters import write_virtual_granule
    from ingest.sample import make_archive

    item_file = next(
        path for path in make_archive(tmp_path / "archive", granules=3, seed=4) if "sample-dem" in path.name
    )
    tif = next(item_file.parent.glob("*.tif"))
    repository = Repository.create(tmp_path / "repo")
    repository.allow_virtual_sources([tif])
    writer = repository.writer()
    writer.item_group("sample-dem", "one")
    write_virtual_granule(writer.store, "sample-dem/one", {"data": tif})
    writer.commit("one virtual granule")
    assert check(repository, deep=True) == []
    tif.unlink()
    problems = check(repository, deep=True)
    assert len(problems) == 1 and str(tif) in str(problems[0]) and "does not exist" in str(problems[0])
    assert check(repository) == []
