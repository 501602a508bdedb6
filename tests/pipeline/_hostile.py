"""What the hostile-input tests share: the ``floe`` CLI in a subprocess, and one ingest read back and checked."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ingest import Repository
from tests._cli import floe_child

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Run:
    """One ingest: its exit status, stderr, report, the items exported after it, and the deep check's result."""

    ingest: subprocess.CompletedProcess
    report: list[dict]
    exported: dict[tuple[str, str], dict]
    check: subprocess.CompletedProcess | None


def ingest_and_read(
    root: Path, sources: list[Path], *extra: str, env: dict | None = None, export: bool = False, check: bool = True
) -> Run:
    """Ingest ``sources`` with the CLI, read every item back (with ``floe export -``, else in this process), check."""
    report = root.parent / f"{root.name}-report.jsonl"
    done = floe(root, "ingest", *map(str, sources), "--report", str(report), *extra, env=env)
    if export:
        exported = floe(root, "export", "-")
        assert exported.returncode == 0, exported.stderr
        items = [json.loads(line) for line in exported.stdout.splitlines()]
    else:  # each CLI start costs seconds on a loaded machine: the same rows, read by the library
        items = list(Repository.open(str(root)).view().items())
    by_key = {}
    for item in items:
        key = (item["collection"], item["id"])
        assert key not in by_key, f"{key} committed twice"
        by_key[key] = item
    lines = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
    rejected = [line for line in lines if line["outcome"] == "rejected"]
    checked = floe(root, "check", "--all", "--deep") if check else None
    return Run(done, rejected, by_key, checked)


def rejection_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("rejected ")]


def floe(root: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``floe --root ROOT ARGS`` in a child process (``tests._cli.floe_child``)."""
    return floe_child("--root", str(root), *args, env=env, cwd=REPO_ROOT)
