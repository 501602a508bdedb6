"""Every example a reader would paste runs: the ``bash`` and ``python`` blocks of README.md and docs/*.md, page by
page, in order, after ``floe demo`` (issue 49, item 2).

Each page runs in a copy of one demo folder (``floe-data`` and ``floe-demo-archive``, made once by ``floe
demo``; the copy relocated, as a copied repository must be), so what one page changes no other sees; within a
page, blocks run in order and see what the blocks before them did. ``.venv/bin`` is first on PATH, so a block
calls ``floe`` as a reader whose environment is activated does. A block that cannot run here says so, with its
reason, in an HTML comment on the line just before its fence: ``<!-- not-run: starts a server that runs until
Ctrl-C -->``. A failing block fails its page's test, which names the block's first line and shows its output.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[1]
PAGES = [CHECKOUT / "README.md", *sorted((CHECKOUT / "docs").glob("*.md"))]
RUNNABLE = {"bash": "bash", "sh": "bash", "python": "python"}
NOT_RUN = re.compile(r"<!--\s*not-run:\s*(?P<reason>.+?)\s*-->")
FENCE = re.compile(r"^(?P<indent> *)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```\s*$", re.M | re.S)


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    language: str
    code: str
    skipped: str | None
    """Why it is not run (its ``not-run`` comment), or None."""


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page`` in a language this runner runs, in order."""
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        language = match["info"].strip().split(" ")[0].lower()
        if language not in RUNNABLE:
            continue
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = NOT_RUN.search(before)
        line = text.count("\n", 0, match.start()) + 1
        code = "\n".join(row[len(match["indent"]) :] for row in match["body"].splitlines())
        found.append(Block(page.name, line, RUNNABLE[language], code, marker["reason"] if marker else None))
    return found


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder where ``floe demo`` ran (``floe-data``, ``floe-demo-archive``): what every page starts from."""
    folder = tmp_path_factory.mktemp("demo")
    done = subprocess.run(
        [str(CHECKOUT / ".venv" / "bin" / "floe"), "demo", "--workers", "1"],
        cwd=folder,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


def run(command: list[str], folder: Path) -> subprocess.CompletedProcess[str]:
    """``command`` in ``folder`` with the readers' environment, its output kept."""
    environ = environment()
    return subprocess.run(command, cwd=folder, env=environ, capture_output=True, text=True, timeout=600, check=False)


def environment() -> dict[str, str]:
    """This environment without floe's settings, and without the COLUMNS pytest's workers set (a reader's shell
    piping output has none), with ``.venv/bin`` first on PATH."""
    kept = {name: value for name, value in os.environ.items() if not name.startswith("FLOE_") and name != "COLUMNS"}
    path = os.pathsep.join([str(Path(sys.executable).parent), kept.get("PATH", "")])
    return {**kept, "PATH": path, "PYTHONPATH": str(CHECKOUT)}


def test_every_page_has_its_blocks_found_and_each_skip_says_why():
    every = [block for page in PAGES for block in blocks(page)]
    assert any(block.page == "README.md" and block.skipped is None for block in every)
    assert all(block.skipped for block in every if block.skipped is not None)  # a reason, not an empty marker


@pytest.mark.slow
@pytest.mark.parametrize("page", [page for page in PAGES if any(not b.skipped for b in blocks(page))], ids=str)
def test_the_examples_of_a_page_run_after_floe_demo(page: Path, demo: Path, tmp_path: Path):
    folder = tmp_path / "demo"
    shutil.copytree(demo, folder, symlinks=True)
    # A copied repository names the root it came from until relocated (floe refuses it until then).
    relocated = run([sys.executable, "-m", "ingest.cli", "--root", "floe-data", "relocate"], folder)
    assert relocated.returncode == 0, relocated.stderr
    for block in blocks(page):
        if block.skipped:
            continue
        command = (
            ["bash", "-euo", "pipefail", "-c", block.code]
            if block.language == "bash"
            else [
                sys.executable,
                "-c",
                block.code,
            ]
        )
        done = run(command, folder)
        first = block.code.strip().splitlines()[0] if block.code.strip() else ""
        assert done.returncode == 0, (
            f"{block.page}:{block.line} ({first!r}) exited {done.returncode}\n"
            f"stdout:\n{done.stdout[-2000:]}\nstderr:\n{done.stderr[-3000:]}"
        )
