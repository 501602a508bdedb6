"""History benchmark: what Icechunk keeps under ``arrays/`` after N commits, and what ``floe gc`` leaves.

    python scripts/bench_history.py            # 1,000, 3,000 and 10,000 commits
    python scripts/bench_history.py --quick    # 200 and 500 commits (a smoke run)
    python scripts/bench_history.py --sizes 100,1000 --window 50

One history is grown by the cheapest real floe commit (``Writer``: one item, no
arrays, one Icechunk commit each, as an hourly pipeline's smallest commit
would be), with one tag at the start. At each size the repository is moved
aside and copied back to its own path (hard links: gc deletes and renames, it
never writes into a file; the same path, because the table metadata names its
root), and on the copy, in turn:

1. nothing (the baseline: no maintenance at all);
2. ``floe gc --grace 0s`` (Icechunk's GC, then this branch's sweep of
   ``arrays/overwritten/``, keeping the newest 10 copies of ``repo``);
3. ``floe gc --grace 0s --expire-older-than <age of the commit W back>``
   (history older than the newest W commits expired; W = 720 by default,
   30 days of an hourly pipeline); then 24 more commits (a day) and the same
   run again, as a daily schedule would have it: the 10 copies of ``repo`` the
   first run kept were made before the expiry shrank it, a day later they are
   copies of the small one;
4. ``floe gc --grace 0s --expire-older-than 0s`` (everything but tips and
   tags), and again after 24 more commits.

The baseline is the first row at each size (no maintenance); the last column
is each row's ``arrays/`` against it.

Each row gives the bytes of ``arrays/`` by Icechunk folder (``repo``,
``overwritten/``, ``snapshots/``, ``manifests/``, ``transactions/``, and the
rest: chunks, config) and the total against the baseline at the same size.
Sizes are on-disk file sizes; the same objects on S3 have the same sizes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ingest import Repository, Settings
from ingest.lifecycle import ArraysFootprint, arrays_footprint, gc
from ingest.storage import quiet_icechunk_logs

KINDS = ("repo", "overwritten", "snapshots", "manifests", "transactions")
DAY = 24  # commits an hourly pipeline makes between two daily gc runs


def tiny_item(number: int) -> dict:
    x = number % 360 - 180
    return {
        "type": "Feature",
        "stac_version": "1.0.0",
        "stac_extensions": [],
        "id": f"item-{number:06d}",
        "collection": "bench",
        "geometry": {"type": "Point", "coordinates": [x, 0.0]},
        "bbox": [x, 0.0, x, 0.0],
        "properties": {"datetime": f"2024-{number % 12 + 1:02d}-01T00:00:00Z"},
        "assets": {},
        "links": [],
    }


def commit_tiny(repository: Repository, number: int) -> None:
    writer = repository.writer()
    writer.add_item(tiny_item(number))
    writer.commit(f"hour {number}")


def link_copy(source: Path, target: Path) -> None:
    """A copy whose files are hard links: cheap, and safe because gc only deletes and renames."""
    shutil.copytree(source, target, copy_function=os.link)


def footprint_of(root: Path) -> ArraysFootprint:
    return arrays_footprint(Repository.open(str(root), Settings()).location)


def kib(count: int) -> str:
    return f"{count / 1024:,.0f}" if count >= 10 * 1024 else f"{count / 1024:,.1f}"


def row(commits: int, state: str, footprint: ArraysFootprint, baseline: int, seconds: float | None) -> str:
    cells = [f"{kib(footprint.bytes[kind])} ({footprint.objects[kind]:,})" for kind in KINDS]
    rest = footprint.bytes["chunks"] + footprint.bytes["other"]
    took = "" if seconds is None else f" ({seconds:.1f} s)"
    return (
        f"| {commits:,} | {state}{took} | {' | '.join(cells)} | {kib(rest)} | {kib(footprint.total_bytes)} "
        f"| {footprint.total_bytes / baseline:.3f}x |"
    )


def age_of_commit(repository: Repository, back: int) -> timedelta | None:
    """How long ago the commit ``back`` commits before main's tip was written (None: history shorter than that)."""
    for position, info in enumerate(repository.icechunk.ancestry(branch="main")):
        if position == back:
            return datetime.now(UTC) - info.written_at
    return None


def measure(source: Path, commits: int, window: int) -> list[str]:
    """Run the gc steps on a copy of ``source`` at ``source``'s own path; ``source`` is as it was afterwards."""
    before = footprint_of(source)
    aside = source.with_name(f"{source.name}.aside")
    source.rename(aside)
    link_copy(aside, source)
    try:
        baseline = before.total_bytes
        rows = [row(commits, "no maintenance (baseline)", before, baseline, None)]
        copy = source
        repository = Repository.open(str(copy), Settings())
        # (what the row says, the expiry: None, a timedelta or "window", commits made on the copy first)
        steps: list[tuple[str, timedelta | str | None, int]] = [
            ("gc --grace 0s", None, 0),
            (f"+ --expire-older-than (newest {window:,} commits kept)", "window", 0),
            (f"+ {DAY} commits, the same run again (a day later)", "window", DAY),
            ("+ --expire-older-than 0s (tips and tags only)", timedelta(0), 0),
            (f"+ {DAY} commits, the same run again (a day later)", timedelta(0), DAY),
        ]
        extra = 0
        for state, step, more in steps:
            for _ in range(more):
                commit_tiny(repository, 10_000_000 + commits + extra)
                extra += 1
            # The window's age is taken right before its run: commits land every few ms here.
            expire = age_of_commit(repository, window) if step == "window" else step
            if step == "window" and expire is None:
                continue
            assert not isinstance(expire, str)
            started = time.perf_counter()
            report = gc(repository, grace=timedelta(0), expire_older_than=expire)
            seconds = time.perf_counter() - started
            rows.append(row(commits + extra, state, footprint_of(copy), baseline, seconds))
            print(
                f"  {commits} commits, {state}: {seconds:.1f} s, {len(report.history.deleted):,} copies of repo and "
                f"{report.icechunk_objects_deleted:,} Icechunk objects deleted, {report.expired_snapshots:,} expired",
                file=sys.stderr,
            )
        return rows
    finally:
        shutil.rmtree(source)
        aside.rename(source)
        restored = footprint_of(source)
        assert (restored.objects, restored.bytes) == (before.objects, before.bytes), "gc changed the original"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="200 and 500 commits, window 100: a smoke run")
    parser.add_argument("--sizes", type=lambda text: [int(n) for n in text.split(",")], default=None)
    parser.add_argument("--window", type=int, default=None, help="commits kept by the windowed expiry (720)")
    parser.add_argument("--workdir", type=Path, default=None, help="where the repository grows (a temporary dir)")
    args = parser.parse_args()
    quiet_icechunk_logs()
    sizes = args.sizes or ([200, 500] if args.quick else [1_000, 3_000, 10_000])
    window = args.window or (100 if args.quick else 720)
    with tempfile.TemporaryDirectory(prefix="floe-bench-history-", dir=args.workdir) as directory:
        workdir = Path(directory)
        source = workdir / "repo"
        repository = Repository.create(str(source), Settings())
        repository.ensure_groups(["bench"])
        commit_tiny(repository, 0)
        repository.tag("first")
        made, rows = 1, []
        started = time.perf_counter()
        for size in sizes:
            while made < size:
                commit_tiny(repository, made)
                made += 1
                if made % 1000 == 0:
                    print(f"{made} commits, {time.perf_counter() - started:.0f} s", file=sys.stderr)
            rows += measure(source, size, window)
            repository = Repository.open(str(source), Settings())
    print(
        "| commits | state | repo KiB (objects) | overwritten/ KiB (objects) | snapshots/ KiB (objects) "
        "| manifests/ KiB (objects) | transactions/ KiB (objects) | chunks + other KiB | arrays/ KiB "
        "| arrays/ vs baseline |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
