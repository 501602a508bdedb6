"""Crash anywhere: SIGKILL floe commands at random points, on local and S3 (moto) storage, and count what broke.

Each trial builds a scenario (metadata ingest, Ray ingest of COGs, two
concurrent writers, a replacement, gc after replacements, tag, branch,
replicate), runs its ``floe`` command and kills it, either at a named fault
point (``FLOE_FAULT=point:N``, see ``ingest/_faults.py``) or with SIGKILL to
its process group after a random delay. Then ``check --all --deep`` must pass,
every committed item must be there exactly once and equal to its input,
nothing half-visible, and a re-run of the command must complete with every
input item there exactly once. The trial logic lives in
``tests/lifecycle/_crash.py`` (CI runs a few trials of it too).

S3 trials run against a moto server this script starts on 127.0.0.1 (a free
port) and stops by its pid. Trials run in ``--jobs`` spawned processes.

    nice -n 10 python scripts/crash_harness.py --trials 100 --storage both --seed 1

prints a markdown table per storage and scenario, and one per fault point.
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.lifecycle._crash import SCENARIO_POINTS, Findings, Storage, TrialResult, run_trial

#: How far into its run a fault point may strike (the N of ``point:N``), by point.
HITS = {
    "write.data_file": 12,
    "commit.after_metadata": 4,
    "commit.before_swap": 4,
    "commit.after_swap": 4,
    "gc.between_deletions": 4,
    "replicate.between_copies": 6,
    "replicate.between_rewrites": 4,
}
#: First guesses of a command's run time (seconds), replaced by the median of the re-runs measured.
FIRST_GUESS = {"ingest-ray": 12.0}
METADATA_SCENARIOS = [name for name in SCENARIO_POINTS if name != "ingest-ray"]


@dataclass(frozen=True)
class Task:
    storage: str
    scenario: str
    name: str
    seed: int
    fault: str | None
    delay: float | None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20, help="trials per storage kind (default 20)")
    parser.add_argument("--storage", choices=("local", "s3", "both"), default="local")
    parser.add_argument("--seed", type=int, default=0, help="seed of the trial choices (default 0)")
    parser.add_argument("--ray", action=argparse.BooleanOptionalAction, default=True, help="mix in Ray ingests")
    parser.add_argument("--ray-share", type=float, default=0.12, help="share of Ray trials (default 0.12)")
    parser.add_argument("--fault-share", type=float, default=0.5, help="share of fault-point kills (default 0.5)")
    parser.add_argument("--jobs", type=int, default=2, help="trials run at once (default 2)")
    parser.add_argument("--out", type=Path, help="also write the tables to this file")
    return parser.parse_args(argv)


def choose(rng: random.Random, storage: str, index: int, args: argparse.Namespace) -> Task:
    """One random trial: a scenario, and a fault point (with its hit) or a kill after a delay (set at submit)."""
    ray = args.ray and rng.random() < args.ray_share
    scenario = "ingest-ray" if ray else rng.choice(METADATA_SCENARIOS)
    fault = None
    if rng.random() < args.fault_share:
        point = rng.choice(SCENARIO_POINTS[scenario])
        hit = rng.randint(1, HITS.get(point, 1))
        fault = f"{point}:{hit}"
    return Task(storage, scenario, f"{storage}-{index:04d}-{scenario}", rng.randrange(2**31), fault, None)


def work(task: Task, storage: Storage, workdir: str, archive: str) -> TrialResult:
    """Run one trial (in a spawned worker process)."""
    return run_trial(
        storage,
        task.scenario,
        Path(workdir),
        name=task.name,
        seed=task.seed,
        faults=[task.fault] if task.fault else [],
        delay=task.delay,
        archive=Path(archive),
    )


@contextmanager
def storages(kinds: list[str], workdir: Path) -> Iterator[dict[str, Storage]]:
    """The storages of this run; S3 is a moto server started here on 127.0.0.1 and stopped by its pid."""
    found = {}
    if "local" in kinds:
        (workdir / "roots").mkdir()
        found["local"] = Storage.local(workdir / "roots")
    server = None
    try:
        if "s3" in kinds:
            from tests.conftest import MotoServer

            server = MotoServer()
            found["s3"] = Storage.s3(server.endpoint, server.create_bucket())
        yield found
    finally:
        if server is not None:
            server.stop()


class Delays:
    """Kill delays for random-delay trials: uniform over most of the command's measured run time."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.seen: dict[tuple[str, str], list[float]] = defaultdict(list)

    def record(self, result: TrialResult) -> None:
        if result.rerun_completed:
            self.seen[(result.storage, result.scenario)].append(result.command_seconds)

    def pick(self, storage: str, scenario: str) -> float:
        seen = self.seen[(storage, scenario)]
        typical = statistics.median(seen) if seen else FIRST_GUESS.get(scenario, 3.0)
        return round(self.rng.uniform(0.3, 1.1) * typical, 2)


def run(args: argparse.Namespace) -> list[TrialResult]:
    from ingest.sample import make_archive

    rng = random.Random(args.seed)
    kinds = ["local", "s3"] if args.storage == "both" else [args.storage]
    tasks = [choose(rng, kind, index, args) for index in range(args.trials) for kind in kinds]
    delays = Delays(random.Random(args.seed + 1))
    results: list[TrialResult] = []
    with tempfile.TemporaryDirectory(prefix="floe-crash-") as directory, storages(kinds, Path(directory)) as found:
        workdir = Path(directory)
        archive = workdir / "archive"
        make_archive(archive, granules=6, seed=args.seed)
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(args.jobs, mp_context=context) as pool:
            pending: dict[Future[TrialResult], Task] = {}
            queue = list(tasks)
            started = time.monotonic()
            while queue or pending:
                while queue and len(pending) < args.jobs:
                    task = queue.pop(0)
                    if task.fault is None:
                        task = Task(**{**task.__dict__, "delay": delays.pick(task.storage, task.scenario)})
                    pending[pool.submit(work, task, found[task.storage], str(workdir), str(archive))] = task
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    result = outcome(future, pending.pop(future))
                    delays.record(result)
                    results.append(result)
                    print(progress_line(len(results), len(tasks), result, started), file=sys.stderr, flush=True)
    return results


def outcome(future: Future[TrialResult], task: Task) -> TrialResult:
    """The trial's result; a trial that raised counts as a failed one (the harness goes on)."""
    try:
        return future.result()
    except Exception as error:  # one broken trial must not end the run
        broken = Findings(corrupt=[f"the trial raised {error!r}"[:500]])
        return TrialResult(
            task.storage,
            task.scenario,
            "fault" if task.fault else "delay",
            task.fault,
            False,
            broken,
            Findings(),
            False,
            0.0,
            0.0,
        )


def progress_line(count: int, total: int, result: TrialResult, started: float) -> str:
    how = result.point or "delay"
    status = "ok" if result.clean else f"FAILED {result.after_kill.summary()} | {result.final.summary()} {result.notes}"
    killed = "killed" if result.killed else "not killed"
    return (
        f"[{count}/{total} {time.monotonic() - started:.0f}s] {result.storage} {result.scenario} {how}: "
        f"{killed}, {status}"
    )


def table(results: list[TrialResult]) -> str:
    rows = defaultdict(list)
    for result in results:
        rows[(result.storage, result.scenario)].append(result)
    for result in results:
        rows[(result.storage, "all")].append(result)
    lines = [
        "| storage | scenario | trials | killed at a fault point | killed after a random delay | not killed "
        "| check failures | duplicates | lost | corrupt/unequal | re-runs completed |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    order = sorted(rows, key=lambda key: (key[0], key[1] == "all", key[1]))
    for storage, scenario in order:
        group = rows[(storage, scenario)]
        faults = sum(1 for r in group if r.killed and r.kill == "fault")
        delays = sum(1 for r in group if r.killed and r.kill == "delay")
        counts = [
            sum(len(getattr(r.after_kill, kind)) + len(getattr(r.final, kind)) for r in group)
            for kind in ("check", "duplicates", "lost", "corrupt")
        ]
        name = f"**{scenario}**" if scenario == "all" else scenario
        lines.append(
            f"| {storage} | {name} | {len(group)} | {faults} | {delays} | {len(group) - faults - delays} | "
            + " | ".join(str(count) for count in counts)
            + f" | {sum(r.rerun_completed for r in group)}/{len(group)} |"
        )
    return "\n".join(lines)


def point_table(results: list[TrialResult]) -> str:
    by_point: dict[tuple[str, str], list[TrialResult]] = defaultdict(list)
    for result in results:
        if result.point is not None:
            by_point[(result.point.partition(":")[0], result.storage)].append(result)
    lines = ["| fault point | storage | trials | killed | clean |", "|---|---|---:|---:|---:|"]
    for (point, storage), group in sorted(by_point.items()):
        lines.append(
            f"| {point} | {storage} | {len(group)} | {sum(r.killed for r in group)} | {sum(r.clean for r in group)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    results = run(args)
    failures = [r for r in results if not r.clean]
    report = "\n\n".join(
        [
            table(results),
            point_table(results),
            f"{len(results)} trials in {time.monotonic() - started:.0f} s; {len(failures)} with findings."
            " Counts of duplicates, lost and corrupt are findings (an item or a ref each), after the kill and"
            " after the re-run together; check failures are problems `check --all --deep` reported.",
        ]
    )
    details = [
        f"- {r.storage} {r.scenario} {r.point or 'delay'}: {r.after_kill.summary()} | {r.final.summary()} {r.notes}"
        for r in failures
    ]
    if details:
        report += "\n\nFindings:\n" + "\n".join(details)
    print(report)
    if args.out:
        args.out.write_text(report + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
