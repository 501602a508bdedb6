"""check finds what is missing or broken, per ref."""

from __future__ import annotations

from pathlib import Path

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
