"""What the CLI prints where people read it: `floe log` one line a commit with the refs at each and floe's own
commits hidden, nothing hard-wrapped in a pipe, `floe --version`, numbers that read naturally, and no Ray banner
(issue 49, item 3)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ingest import Repository, Settings
from ingest.cli import app
from ingest.cli._app import counted
from tests._cli import floe_child as floe
from tests.conftest import make_item

CHECKOUT = Path(__file__).resolve().parents[1]
LONG_MESSAGE = "hourly update of the archive " + "with a very long explanation " * 8


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three batches (after floe's own first commit), a tag at the second."""
    root = tmp_path_factory.mktemp("log") / "repo"
    repository = Repository.create(root, Settings())
    for number, collection in enumerate(("alpha", "beta", "gamma")):
        writer = repository.writer()
        writer.add_items([make_item(f"{collection}-{n}", collection) for n in range(number + 1)])
        writer.commit(LONG_MESSAGE if number == 2 else f"batch {number}")
        if number == 1:
            repository.tag("v1")
    return root


@pytest.mark.slow
def test_floe_log_piped_is_one_line_a_commit_with_its_refs_and_no_housekeeping(history):
    done = floe("--root", str(history), "log")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    header, rows = lines[0], lines[1:]
    assert "refs" in header and "message" in header
    assert len(rows) == 3, done.stdout  # the three batches; the first commit is floe's own
    assert LONG_MESSAGE.strip() in rows[0] and "main" in rows[0]  # newest first, whole, on one line
    assert "tag: v1" in rows[1] and "batch 1" in rows[1]
    assert "batch 0" in rows[2] and "floe:" not in done.stdout

    everything = floe("--root", str(history), "log", "--all")
    messages = everything.stdout
    assert "floe: initialize repository" in messages
    assert len([line for line in messages.splitlines() if line.strip()]) > len(lines)

    newest = floe("--root", str(history), "log", "-n", "1")
    assert len([line for line in newest.stdout.splitlines() if line.strip()]) == 2  # the header and one commit


def test_floe_log_shows_twenty_commits_unless_asked(tmp_path):
    repository = Repository.create(tmp_path / "repo", Settings())
    for number in range(22):
        writer = repository.writer()
        writer.add_item(make_item(f"i-{number}", "c"))
        writer.commit(f"commit {number}")
    shown = CliRunner().invoke(app, ["--root", str(tmp_path / "repo"), "log"])
    rows = [line for line in shown.stdout.splitlines()[1:] if line.strip()]
    assert len(rows) == 20 and "commit 21" in rows[0] and "commit 2 " in rows[-1] + " "
    more = CliRunner().invoke(app, ["--root", str(tmp_path / "repo"), "log", "--limit", "30"])
    assert len([line for line in more.stdout.splitlines()[1:] if line.strip()]) == 22


def test_floe_version_names_the_installed_version():
    from importlib.metadata import version

    done = floe("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"floe {version('floe')}"


def test_counts_read_naturally():
    assert counted(1, "item") == "1 item"
    assert counted(0, "item") == "0 items"
    assert counted(12_000, "commit") == "12,000 commits"
    assert counted(2, "child", "children") == "2 children"


@pytest.mark.slow
def test_an_ingest_with_ray_says_nothing_of_ray_and_an_unchanged_rerun_starts_none(tmp_path):
    from ingest.sample import make_archive

    make_archive(tmp_path / "archive", granules=2, seed=0)
    arguments = ("--root", str(tmp_path / "repo"), "ingest", str(tmp_path / "archive"), "--workers", "1")
    # Each run's Ray keeps its session under its own RAY_TMPDIR (short: Ray's sockets live there).
    first_ray, second_ray = (Path(tempfile.mkdtemp(prefix="r", dir="/tmp")) for _ in range(2))
    try:
        done = floe(*arguments, env={"RAY_TMPDIR": str(first_ray)})
        assert done.returncode == 0, done.stderr
        assert "Token authentication" not in done.stderr and "RAY_AUTH_MODE" not in done.stderr, done.stderr
        summary = next(line for line in done.stderr.splitlines() if line.startswith("ingested "))
        assert summary.startswith("ingested 2 items in ") and "rejected" in summary, summary
        assert any(first_ray.iterdir())  # the rasters were copied by Ray's actors

        again = floe(*arguments, env={"RAY_TMPDIR": str(second_ray)})
        assert again.returncode == 0, again.stderr
        assert "0 new, 0 replaced, 2 unchanged" in again.stderr, again.stderr
        assert not any(second_ray.iterdir())  # nothing to copy: no Ray
    finally:
        for folder in (first_ray, second_ray):
            shutil.rmtree(folder, ignore_errors=True)


def test_the_demo_hints_call_floe_as_it_can_be_called_here(tmp_path, monkeypatch):
    from ingest.cli._demo import invocation

    monkeypatch.chdir(CHECKOUT)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # the environment not activated: floe is not on the PATH
    assert invocation() == os.path.relpath(Path(sys.executable).parent / "floe")
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:/usr/bin:/bin")
    assert invocation() == "floe"
