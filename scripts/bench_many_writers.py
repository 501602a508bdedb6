"""Many uncoordinated writers on S3 (moto): hundreds of commits mixing appends, shared replacements and new columns.

Run:  .venv/bin/python scripts/bench_many_writers.py                 (8 writers, at least 400 commits)
      .venv/bin/python scripts/bench_many_writers.py --writers 4 --commits 40   (a smoke run)

Starts a moto S3 server on 127.0.0.1 (a free port; stopped by its pid at the
end), creates a floe repository at ``s3://<bucket>/floe``, seeds 50 shared
items, then runs ``--writers`` writer *processes* (spawn) that commit until
together they have made at least ``--commits`` commits. Each commit (see
``tests/repository/_writers.py``, which the CI test shares) appends 3 fresh
items (one with a group and an array of its own), replaces 2 of the 50 shared
items that every writer replaces (every fifth has arrays, so two writers
replacing it at once write the same chunk and the loser re-plans), and widens
the schema (a string property per writer, a new float property every tenth
commit, a property that is an integer in some items and a float in others).
Every item and array carries its commit's version, (writer, sequence) in one
number.

Afterwards it verifies: the history holds every commit, each writer's in its
order; every item exactly once; each shared item at the version of the last
commit in the history (``floe log``) that replaced it, and its arrays holding
that version; every property as committed; ``floe check --all --deep``
clean; no writer starved (each made at least a third of its fair share).

Livelock: earth-mover/icechunk#1205 reports many writers that rebase on every
lost race livelocking (each rebase loses to the next writer, nobody lands).
floe's commit looks at the tip before doing the doomed work, re-applies only
the table change, and backs off with a jitter that *shrinks* with each lost
race (``ingest/repository/_commit.py``, ``backoff_seconds``), so the writers
that waited most win next. The table shows what rules livelock out: the
worst number of attempts of any commit (bounded far below
``commit.max_attempts``), the longest wait, and the commits of the slowest
writer next to the fastest's (every writer progresses).

Prints a markdown table. Absolute times on a shared machine are noise.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ingest import Repository, Settings
from tests.conftest import MotoServer
from tests.repository._writers import APPENDS, Meeting, mixed_worker, seed_shared, verify_mixed


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def spread(values: list[float], unit: str = "", digits: int = 0) -> str:
    """p50 / p95 / max of ``values``."""
    return " / ".join(
        f"{value:.{digits}f}{unit}" for value in (statistics.median(values), percentile(values, 0.95), max(values))
    )


def run(writers: int, commits: int, server: MotoServer) -> tuple[list[tuple[str, str]], dict[str, str]]:
    settings = Settings(s3=server.s3_settings())
    root = f"s3://{server.create_bucket()}/floe"
    repository = Repository.create(root, settings)
    seed = seed_shared(repository)
    with tempfile.TemporaryDirectory(prefix="floe-writers-") as directory:
        meeting = Meeting(directory)
        context = multiprocessing.get_context("spawn")
        started = time.monotonic()
        with context.Pool(writers) as pool:
            pending = [
                pool.apply_async(
                    mixed_worker, (root, settings.model_dump(), worker, meeting, writers), {"total": commits}
                )
                for worker in range(writers)
            ]
            results: list[list[dict[str, Any]]] = [result.get() for result in pending]
        elapsed = time.monotonic() - started  # includes the writers' start (imports, opening the repository)

    outcomes = verify_mixed(Repository.open(root, settings), seed, results)
    made = [commit for worker in results for commit in worker]
    attempts = [float(commit["attempts"]) for commit in made]
    per_writer = [len(worker) for worker in results]
    figures = [
        ("writers (processes)", str(writers)),
        ("commits", f"{len(made)} (+1 seeding 50 shared items)"),
        ("items appended", str(APPENDS * len(made))),
        ("shared items replaced (rows replaced)", str(sum(commit["rows_replaced"] for commit in made))),
        ("lost races (retries: attempts beyond the first)", str(sum(commit["attempts"] - 1 for commit in made))),
        ("re-plans (CommitConflict: same shared array)", str(sum(commit["replans"] for commit in made))),
        ("commits that needed > 1 attempt", str(sum(1 for commit in made if commit["attempts"] > 1))),
        ("attempts per commit p50 / p95 / max", spread(attempts)),
        ("wait (first attempt to success) p50 / p95 / max", spread([commit["wait"] for commit in made], " s", 2)),
        ("commits/s (all writers, wall time incl. start)", f"{len(made) / elapsed:.2f}"),
        (
            "commits per writer min / max",
            f"{min(per_writer)} / {max(per_writer)} (fair share {len(made) / writers:.0f})",
        ),
        ("wall time", f"{elapsed:.0f} s"),
    ]
    return figures, outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writers", type=int, default=8, help="writer processes (default 8)")
    parser.add_argument("--commits", type=int, default=400, help="commits all writers make together, at least (400)")
    args = parser.parse_args()

    server = MotoServer()
    try:
        figures, outcomes = run(args.writers, args.commits, server)
    finally:
        server.stop()
    print(f"\n## {args.writers} writers on moto S3, at least {args.commits} commits\n")
    print("| figure | value |\n|---|---|")
    for name, value in figures:
        print(f"| {name} | {value} |")
    for name, outcome in outcomes.items():
        print(f"| verified: {name} | {outcome} |")
    if any(outcome.startswith("FAILED") for outcome in outcomes.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
