"""check finds what is missing or broken, per ref."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import zarr

from ingest import Repository
from ingest.lifecycle import check
from ingest.stac import ITEM, Piece, read_arrays_asset
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


# -- deep checks: recorded sizes, truncated manifests, rows and slots that disagree -------------------------------
def pieces_of(view, item_id: str) -> list[Piece]:
    asset = read_arrays_asset(view.item("c", item_id))
    assert asset is not None and asset.pieces(), f"{item_id} has no pieces"
    return asset.pieces()


def edit_arrays(repo: Repository, branch: str, message: str, edit: Callable[[zarr.Group], None]) -> None:
    """A commit on a new branch from v1 that edits the arrays directly (no row changes)."""
    repo.branch(branch, "v1")
    writer = repo.writer(branch)
    edit(zarr.open_group(writer.store, mode="a"))
    writer.commit(message)


def test_deep_check_finds_a_deleted_data_file_a_truncated_manifest_and_rows_and_slots_that_disagree(repo):
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
    view = repo.view("v1")
    a_pieces, b_pieces = pieces_of(view, "a"), pieces_of(view, "b")
    assert {(piece.stack, piece.array) for piece in a_pieces} == {(piece.stack, piece.array) for piece in b_pieces}
    assert all(view.slot_items(piece.stack)[piece.slot] == "b" for piece in b_pieces)

    # A stack array removed (its rows are still there): every row with a piece in it names it; nothing else.
    stack, array = b_pieces[0].stack, b_pieces[0].array
    edit_arrays(repo, "no-array", f"drop {stack}/{array}", lambda root: root[stack].__delitem__(array))
    assert not repo.view("no-array").has_array(f"{stack}/{array}")
    assert {p.what for p in check(repo, "no-array", deep=True)} == {
        f"item {item_id!r} (c): stack array '{stack}/{array}' is missing"
        for item_id, pieces in (("a", a_pieces), ("b", b_pieces))
        if any((piece.stack, piece.array) == (stack, array) for piece in pieces)
    }

    # A slot whose item coordinate names another item: b's slot now says "a".
    def b_slot_says_a(root: zarr.Group) -> None:
        for piece in b_pieces:
            root[f"{piece.stack}/{ITEM}"][piece.slot] = "a"

    edit_arrays(repo, "wrong-item", "b's slots say a", b_slot_says_a)
    assert {p.what for p in check(repo, "wrong-item", deep=True)} == {
        f"item 'b' (c): slot {piece.slot} of {piece.stack!r} holds 'a', not this item" for piece in b_pieces
    }

    # An occupied slot no row names: a slice (pixels and item id) written past the last slot, without a row.
    ghost_slot = max(view.slot_items(stack)) + 1

    def slice_without_row(root: zarr.Group) -> None:
        root[f"{stack}/{ITEM}"][ghost_slot] = "ghost"
        pixels = root[f"{stack}/{array}"]
        pixels[ghost_slot] = np.ones(pixels.shape[1:], dtype=pixels.dtype)

    edit_arrays(repo, "ghost", "a slice without its row", slice_without_row)
    assert repo.view("ghost").slot_items(stack)[ghost_slot] == "ghost"
    assert [p.what for p in check(repo, "ghost", deep=True)] == [
        f"slot {ghost_slot} of {stack!r} holds 'ghost', which no row names (a slice without row)"
    ]

    # Only --deep looks at the arrays; the versions the defects branched from are untouched.
    for branch in ("no-array", "wrong-item", "ghost"):
        assert check(repo, branch) == []
    assert check(repo, "v1", deep=True) == [] and check(repo, "main", deep=True) == []
    result = run.invoke(app, ["--root", root, "check", "--all", "--deep"])
    assert result.exit_code == EXIT_PROBLEMS
    assert "is missing" in result.output and "not this item" in result.output and "no row names" in result.output
    for branch in ("no-array", "wrong-item", "ghost"):
        assert branch in result.output

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
    from ingest.pipeline._arrays import stage_references
    from ingest.sample import make_archive
    from ingest.stac import arrays_asset, with_arrays_asset

    item_file = next(
        path for path in make_archive(tmp_path / "archive", granules=3, seed=4) if "sample-dem" in path.name
    )
    tif = next(item_file.parent.glob("*.tif"))
    repository = Repository.create(tmp_path / "repo")
    repository.allow_virtual_sources([tif])
    writer = repository.writer()
    writer.ensure_collection("sample-dem")
    item = make_item("one", "sample-dem")
    placed, _ = stage_references(writer, item, {"data": str(tif)}, repository.settings.arrays)
    writer.add_item(with_arrays_asset(item, arrays_asset(placed, virtual=True)))
    writer.commit("one virtual granule")
    assert check(repository, deep=True) == []
    tif.unlink()
    problems = check(repository, deep=True)
    assert len(problems) == 1 and str(tif) in str(problems[0]) and "does not exist" in str(problems[0])
    assert check(repository) == []
