"""Benchmark: how long `floe` takes to answer, start to exit, against `python -c pass` in the same run (issue 49).

One run: ``floe demo`` in a temporary folder (the demo archive, ingested and tagged v1), then ``--runs`` times
each of ``python -c pass``, ``floe --help``, ``floe --version``, ``floe refs`` and ``floe log`` (in turn, so a
busy moment of the machine touches them alike), each a fresh process. Printed: the median seconds of each, and
how much it takes above ``python -c pass`` (the interpreter's own start). Targets: ``--help`` and ``--version``
at most 0.5 s above it, ``refs`` and ``log`` at most 1 s.

Run: ``.venv/bin/python scripts/bench_cli.py`` (about a minute; the demo needs a local Ray).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLOE = str(Path(sys.executable).parent / "floe")
COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "floe --help": [FLOE, "--help"],
    "floe --version": [FLOE, "--version"],
    "floe refs": [FLOE, "refs"],
    "floe log": [FLOE, "log"],
}
TARGETS = {"floe --help": 0.5, "floe --version": 0.5, "floe refs": 1.0, "floe log": 1.0}


def seconds(command: list[str], folder: Path) -> float:
    started = time.perf_counter()
    subprocess.run(command, cwd=folder, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=9, help="fresh processes per command (medians)")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="floe-bench-cli-") as directory:
        folder = Path(directory)
        print("floe demo ...", file=sys.stderr, flush=True)
        subprocess.run([FLOE, "demo", "--workers", "1"], cwd=folder, check=True, capture_output=True)
        timings: dict[str, list[float]] = {name: [] for name in COMMANDS}
        for _ in range(arguments.runs):
            for name, command in COMMANDS.items():
                timings[name].append(seconds(command, folder))
    baseline = statistics.median(timings["python -c pass"])
    print(f"\nmedians of {arguments.runs} fresh processes each, on the demo archive\n")
    print("| command | seconds | above `python -c pass` | target above it |")
    print("|---|---|---|---|")
    for name, values in timings.items():
        median = statistics.median(values)
        target = f"≤ {TARGETS[name]:.1f} s" if name in TARGETS else "-"
        print(f"| `{name}` | {median:.2f} | {median - baseline:+.2f} | {target} |")


if __name__ == "__main__":
    main()
