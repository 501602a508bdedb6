"""Run the test suite on a loaded machine: busy loops on every core while pytest runs, several times in a row.

Run:  .venv/bin/python scripts/loaded_suite.py                 (the whole suite, 3 runs, one busy loop per core)
      .venv/bin/python scripts/loaded_suite.py --runs 1 -- tests/api      (pytest arguments after --)

A test that passes only on a quiet machine fails someone's CI (CONVENTIONS.md): this is how we look for one.
The busy loops are plain Python processes spinning at the same priority as the suite, so the suite gets about
half the CPU it would alone; each is started here and stopped by its own process id. Prints a markdown table:
each run's outcome, counts and wall time, against the wall time of one run of the same tests with no load
when ``--baseline`` is given.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = re.compile(r"^=*\s*(?P<summary>.*\d+ (?:passed|failed|error).*) in [\d.]+s")
SPIN = "while True: pass"


def run_suite(pytest_args: list[str]) -> tuple[int, str, float]:
    """(exit status, pytest's summary line, wall seconds) of one run."""
    started = time.monotonic()
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.monotonic() - started
    lines = completed.stdout.splitlines()
    summary = next((match["summary"] for line in reversed(lines) if (match := SUMMARY.search(line))), "no summary")
    if completed.returncode != 0:
        failed = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
        print("\n".join(failed[:20]) or completed.stdout[-3000:], file=sys.stderr)
    return completed.returncode, summary, elapsed


def start_load(workers: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(workers)]


def stop_load(load: list[subprocess.Popen[bytes]]) -> None:
    for process in load:
        process.kill()
        process.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="runs in a row under load (default 3)")
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 2, help="busy loops (default: one per core)")
    parser.add_argument("--baseline", action="store_true", help="first run the tests once with no load")
    parser.add_argument("pytest_args", nargs="*", help="arguments for pytest (after --); default: the whole suite")
    args = parser.parse_args()

    rows = []
    if args.baseline:
        status, summary, elapsed = run_suite(args.pytest_args)
        rows.append(("no load", status, summary, elapsed))
    for run in range(1, args.runs + 1):
        load = start_load(args.busy)
        try:
            status, summary, elapsed = run_suite(args.pytest_args)
        finally:
            stop_load(load)
        rows.append((f"run {run}, {args.busy} busy loops", status, summary, elapsed))
        print(f"{rows[-1][0]}: exit {status}, {summary}, {elapsed:.0f} s", file=sys.stderr, flush=True)

    quiet = rows[0][3] if args.baseline else None
    print("| run | exit | pytest | wall (s) | vs no load |")
    print("|---|---|---|---|---|")
    for name, status, summary, elapsed in rows:
        ratio = f"{elapsed / quiet:.2f}x" if quiet else "-"
        print(f"| {name} | {status} | {summary} | {elapsed:.0f} | {ratio} |")
    return 0 if all(status == 0 for _, status, _, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
