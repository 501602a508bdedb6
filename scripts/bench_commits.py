"""Commit benchmark: floe's hybrid commit against a plain pyiceberg append, writers in parallel, long histories.

Run:  .venv/bin/python scripts/bench_commits.py            (about 10 minutes here)
      .venv/bin/python scripts/bench_commits.py --quick    (a smoke run)

Prints a markdown table; every figure comes with the baseline measured in the
same run and their ratio. Absolute times on a shared machine are noise.

* single-writer latency: one commit of 10 STAC items (and, separately, 10 items
  plus one 64x64 array) against `table.append` of the same 10 rows to a
  pyiceberg SqlCatalog (sqlite) table with the same partition spec;
* aggregate commits/s and attempts per commit with 1, 2, 4 and 8 uncoordinated
  writer processes on one branch, and how many data files the retries rewrote;
* the cost of a commit after 1,000 commits against the 10th.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ingest import Repository, Settings
from ingest.pipeline import georeferenced, stage_arrays
from ingest.stac import arrays_asset, with_arrays_asset

ROWS = 10


def make_items(prefix: str, rows: int = ROWS) -> list[dict[str, Any]]:
    rng = np.random.default_rng(zlib.crc32(prefix.encode()))
    items = []
    for row in range(rows):
        x, y = float(rng.uniform(-170, 170)), float(rng.uniform(-80, 80))
        items.append(
            {
                "type": "Feature",
                "stac_version": "1.0.0",
                "stac_extensions": [],
                "id": f"{prefix}-{row}",
                "collection": "bench",
                "geometry": {
                    "type": "Polygon",
                    "coordinates": [[[x, y], [x + 1, y], [x + 1, y + 1], [x, y + 1], [x, y]]],
                },
                "bbox": [x, y, x + 1, y + 1],
                "properties": {
                    "datetime": "2024-05-17T10:20:30Z",
                    "eo:cloud_cover": float(rng.uniform(0, 100)),
                    "platform": "sentinel-2a",
                },
                "assets": {"B04": {"href": f"s3://archive/{prefix}-{row}/B04.tif", "type": "image/tiff"}},
                "links": [],
            }
        )
    return items


def floe_commit(repository: Repository, prefix: str, with_array: bool) -> tuple[float, Any]:
    started = time.perf_counter()
    writer = repository.writer()
    items = make_items(prefix)
    if with_array:
        # One 64x64 granule on a grid every writer shares: its slice goes into the same stack as theirs.
        pixels = np.full((64, 64), 7, dtype="uint16")
        granule = georeferenced(pixels, "EPSG:32633", (10.0, 0.0, 500_000.0, 0.0, -10.0, 4_200_000.0))
        placed, _ = stage_arrays(writer, items[0], {"B04": granule})
        items[0] = with_arrays_asset(items[0], arrays_asset(placed))
    writer.add_items(items)
    result = writer.commit(prefix)
    return time.perf_counter() - started, result


def pyiceberg_baseline(workdir: Path, commits: int) -> list[float]:
    """Plain pyiceberg: append the same 10 rows per commit to a SqlCatalog (sqlite) table."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.transforms import MonthTransform

    from ingest.stac import items_to_arrow

    workdir.mkdir(parents=True, exist_ok=True)
    catalog = SqlCatalog("bench", uri=f"sqlite:///{workdir}/catalog.db", warehouse=f"file://{workdir}/warehouse")
    catalog.create_namespace("bench")
    sample = items_to_arrow(make_items("schema"))
    table = catalog.create_table("bench.items", schema=sample.schema)
    with table.update_spec() as spec:
        spec.add_identity("collection")
        spec.add_field("datetime", MonthTransform(), "datetime_month")
    latencies = []
    for number in range(commits):
        rows = items_to_arrow(make_items(f"p{number}"))
        started = time.perf_counter()
        table.append(rows)
        latencies.append(time.perf_counter() - started)
    return latencies


def parallel_worker(root: str, worker: int, commits: int, start_at: float) -> list[dict[str, Any]]:
    repository = Repository.open(root, Settings())
    time.sleep(max(0.0, start_at - time.time()))
    done = []
    for number in range(commits):
        started = time.time()
        _, result = floe_commit(repository, f"w{worker}-{number}", with_array=True)
        done.append(
            {"start": started, "end": time.time(), "attempts": result.attempts, "rewritten": result.files_rewritten}
        )
    return done


def run_parallel(workdir: Path, writers: int, commits_each: int) -> dict[str, float]:
    root = str(workdir / f"parallel-{writers}")
    workdir.mkdir(parents=True, exist_ok=True)
    repository = Repository.create(root, Settings())
    repository.ensure_groups(["bench"])
    context = multiprocessing.get_context("spawn")
    start_at = time.time() + 3.0 + writers * 0.5
    with context.Pool(writers) as pool:
        results = pool.starmap(parallel_worker, [(root, w, commits_each, start_at) for w in range(writers)])
    commits = [commit for worker in results for commit in worker]
    wall = max(c["end"] for c in commits) - min(c["start"] for c in commits)
    data_files = len(list(Path(root, "tables", "items", "data").rglob("*.parquet")))
    return {
        "commits_per_s": len(commits) / wall,
        "attempts": statistics.mean(c["attempts"] for c in commits),
        "rewritten": sum(c["rewritten"] for c in commits),
        "files_per_commit": data_files / len(commits),
        "row_count": sum(len(batch) for batch in repository.view().batches(columns=["id"])),
        "expected_rows": len(commits) * ROWS,
    }


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small counts, for a smoke run")
    parser.add_argument("--writers", default="1,2,4,8", help="writer counts to run in parallel (comma-separated)")
    parser.add_argument("--only-parallel", action="store_true", help="skip the latency and history parts")
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs per writer count; the median commits/s is reported (default 3)"
    )
    arguments = parser.parse_args()
    latency_commits = 30 if arguments.quick else 100
    parallel_commits = 8 if arguments.quick else 40
    history = 60 if arguments.quick else 1010
    rows_out: list[tuple[str, str, str, str]] = []

    with tempfile.TemporaryDirectory(prefix="floe-bench-") as temporary:
        workdir = Path(temporary)

        # 1. Single-writer latency, floe against pyiceberg's SqlCatalog append of the same rows.
        if arguments.only_parallel:
            latency_commits = history = 0
        repository = Repository.create(workdir / "single", Settings())
        repository.ensure_groups(["bench"])
        floe_rows = [floe_commit(repository, f"s{n}", with_array=False)[0] for n in range(latency_commits)]
        floe_array = [floe_commit(repository, f"a{n}", with_array=True)[0] for n in range(latency_commits)]
        baseline = pyiceberg_baseline(workdir / "pyiceberg", latency_commits)
        base_median, base_p90 = (pct(baseline, 50), pct(baseline, 90)) if baseline else (0.0, 0.0)
        for label, values in (("10 rows", floe_rows), ("10 rows + 1 array", floe_array)) if baseline else ():
            rows_out.append(
                (
                    f"commit latency, {label} (median / p90 ms)",
                    f"{pct(values, 50):.1f} / {pct(values, 90):.1f}",
                    f"{base_median:.1f} / {base_p90:.1f} (pyiceberg SqlCatalog append, 10 rows)",
                    f"{pct(values, 50) / base_median:.2f}x / {pct(values, 90) / base_p90:.2f}x",
                )
            )

        # 2. Uncoordinated writers.
        single = None
        for writers in sorted({1, *(int(count) for count in arguments.writers.split(","))}):
            runs = []
            for repeat in range(1 if arguments.quick else arguments.repeat):
                run = run_parallel(workdir / f"r{repeat}", writers, parallel_commits)
                assert run["row_count"] == run["expected_rows"], "rows lost or duplicated"
                runs.append(run)
            measured = sorted(runs, key=lambda run: run["commits_per_s"])[len(runs) // 2]
            single = single or measured
            rows_out.append(
                (
                    f"{writers} writer(s): commits/s, attempts/commit, files rewritten, data files/commit",
                    f"{measured['commits_per_s']:.1f}, {measured['attempts']:.2f}, "
                    f"{measured['rewritten']}, {measured['files_per_commit']:.2f}",
                    f"{single['commits_per_s']:.1f} commits/s (1 writer)",
                    f"{measured['commits_per_s'] / single['commits_per_s']:.2f}x",
                )
            )

        # 3. Commit cost as history grows.
        if not history:
            print_table(rows_out)
            return
        repository = Repository.create(workdir / "history", Settings())
        repository.ensure_groups(["bench"])
        latencies = [floe_commit(repository, f"h{n}", with_array=True)[0] for n in range(history)]
        early = statistics.median(latencies[5:15])
        late = statistics.median(latencies[-10:])
        metadata_size = Path(repository.view().metadata_location).stat().st_size
        manifests = len(repository.view().table.current_snapshot().manifests(repository.io))
        rows_out.append(
            (
                f"commit at ~{history - 5} commits of history (median ms; metadata.json bytes, manifests)",
                f"{late * 1000:.1f} ({metadata_size} B, {manifests} manifests)",
                f"{early * 1000:.1f} (commit ~10)",
                f"{late / early:.2f}x",
            )
        )

    print_table(rows_out)


def print_table(rows: list[tuple[str, str, str, str]]) -> None:
    print("| figure | floe | baseline (same run) | ratio |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
