"""A release read by a distributed engine: Ray Data reading a tag through ``floe serve``'s Iceberg REST catalog.

Run:  .venv/bin/python scripts/bench_ray_data.py                  (1,000,000 items; a few minutes)
      .venv/bin/python scripts/bench_ray_data.py --items 10000000 --stream
                                                   (issue 52's size: generated and ingested in ~25 min, then read)
      .venv/bin/python scripts/bench_ray_data.py --root PATH      (a repository with tag v1 already)

Generated items (``scripts/bench_ingest.py``'s: three collections over 2022-2024) are ingested into a fresh
local repository and tagged ``v1``; ``floe serve`` (one worker, 127.0.0.1) serves its REST catalog, and a local
Ray cluster (2 CPUs, loopback) reads the tag with ``ray.data.read_iceberg`` in 1, then 2 read tasks
(``override_num_blocks``), every column, all rows materialized in Ray's object store, after one read that is
not timed (it starts Ray Data's workers). The baseline, measured in
the same run: PyIceberg alone reading the same tag through the same catalog (``scan().to_arrow()``, one process,
its own threads). Each is timed ``--rounds`` times, alternating; the medians count.

Prints rows/s of each and the ratios, and what a cluster of ``--nodes`` nodes of this size would do on paper:
tasks scale with the tag's data files (one task reads whole files) until the store's bandwidth or the
catalog's one planning request sets the pace; the paper figure is the 2-task rate per node times the nodes,
which holds only while the files outnumber the tasks and the store keeps up.

``--stream`` (for sizes whose rows do not fit in memory: 10,000,000 of them are about 10 GB as Arrow) makes
every reader stream instead of materializing: Ray Data's ``iter_batches`` in the driver, PyIceberg's
``to_arrow_batch_reader``; rows are counted as they pass. Its items are ``bench_scale.py``'s, written as they are
generated, and ingested as a metadata backfill (``--assets none --workers 2``).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))

from bench_search import PROCESSES, load_floe, log, serve_floe, write_data  # noqa: E402

READ_TASKS = r"Operator \d+ ReadIceberg[^:\n]*: (\d+) tasks executed"
"""How Ray Data's stats count the read operator's tasks."""


def read_with_pyiceberg(uri: str, ref: str, stream: bool = False) -> int:
    """Rows PyIceberg alone reads at ``ref`` (every column), in one table or streamed batch by batch."""
    from pyiceberg.catalog import load_catalog

    table = load_catalog(f"floe-{ref}", type="rest", uri=uri, warehouse=ref).load_table("floe.items")
    if stream:
        return sum(batch.num_rows for batch in table.scan().to_arrow_batch_reader())
    return table.scan().to_arrow().num_rows


def read_with_ray(uri: str, ref: str, tasks: int, stream: bool = False) -> tuple[int, int]:
    """Rows Ray Data reads at ``ref`` in ``tasks`` read tasks (materialized, or streamed to this process), and the
    read tasks its stats count."""
    import re

    import ray

    dataset = ray.data.read_iceberg(
        table_identifier="floe.items",
        catalog_kwargs={"name": f"floe-{ref}", "type": "rest", "uri": uri, "warehouse": ref},
        override_num_blocks=tasks,
    )
    if stream:
        rows = sum(batch.num_rows for batch in dataset.iter_batches(batch_size=None, batch_format="pyarrow"))
    else:
        dataset = dataset.materialize()
        rows = dataset.count()
    ran = sum(int(found) for found in re.findall(READ_TASKS, dataset.stats()))
    del dataset
    return rows, ran


def timed(work: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    result = work()
    return time.perf_counter() - started, result


def measure(uri: str, count: int, rounds: int, stream: bool = False) -> dict[str, list[float]]:
    """Rows/s of each reader, ``rounds`` times, alternating."""
    rates: dict[str, list[float]] = {"pyiceberg": [], "ray-1": [], "ray-2": []}
    # Ray Data's first read starts its workers and imports PyIceberg and PyArrow in them: not part of a read.
    read_with_ray(uri, "v1", 2, stream)
    read_with_pyiceberg(uri, "v1", stream)
    for round_number in range(rounds):
        for name, values in rates.items():
            if name == "pyiceberg":
                seconds, rows = timed(lambda: read_with_pyiceberg(uri, "v1", stream))
                ran = 1
            else:
                tasks = int(name.split("-")[1])
                seconds, (rows, ran) = timed(lambda tasks=tasks: read_with_ray(uri, "v1", tasks, stream))
            if rows != count:
                raise RuntimeError(f"{name} read {rows:,} rows of {count:,}")
            values.append(rows / seconds)
            log(f"round {round_number + 1}: {name} {rows / seconds:,.0f} rows/s ({seconds:.2f} s, {ran} read task(s))")
    return rates


def report(rates: dict[str, list[float]], count: int, files: int, nodes: int) -> str:
    medians = {name: statistics.median(values) for name, values in rates.items()}
    base = medians["pyiceberg"]
    lines = [
        f"## bench_ray_data: tag v1 of {count:,} items in {files} data files, read through floe serve's catalog",
        "",
        "| reader | rows/s (median) | rounds | against PyIceberg alone |",
        "|---|---|---|---|",
        *(
            f"| {name} | {medians[name]:,.0f} | {', '.join(f'{value:,.0f}' for value in values)} | "
            f"{medians[name] / base:.2f}x |"
            for name, values in rates.items()
        ),
        "",
        f"2 tasks / 1 task: {medians['ray-2'] / medians['ray-1']:.2f}x on this machine's 2 cores.",
        f"On paper, {nodes} nodes like this one, 2 tasks each: {medians['ray-2'] * nodes:,.0f} rows/s, while the "
        f"tag's {files} files outnumber the {2 * nodes} tasks and the store keeps up.",
    ]
    return "\n".join(lines)


def backfilled(root: Path, workdir: Path, count: int) -> Path:
    """``count`` of ``bench_scale.py``'s items, written as generated and ingested into ``root`` as a metadata
    backfill (2 Ray actors), tagged ``v1``."""
    from bench_scale import write_data as stream_data

    from ingest import Repository, Settings
    from ingest.pipeline import ingest_with_ray

    log(f"{count:,} generated items, written as they are made ...")
    data = stream_data(workdir, count, seed=7)
    repository = Repository.create(root, Settings())
    started = time.perf_counter()
    report = ingest_with_ray(repository, [*data.collection_files, data.items], workers=2, assets="none")
    seconds = time.perf_counter() - started
    if report.rows_added != count or report.rejected:
        raise RuntimeError(f"the backfill added {report.rows_added:,} of {count:,} ({len(report.rejected)} rejected)")
    log(f"backfilled at {count / seconds:,.0f} items/s ({len(report.commits)} commits); tagging v1")
    repository.tag("v1")
    data.items.unlink()
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=1_000_000, help="generated items to ingest (default 1,000,000)")
    parser.add_argument("--rounds", type=int, default=3, help="timings of each reader, alternating (default 3)")
    parser.add_argument("--nodes", type=int, default=4, help="the cluster size of the paper figure (default 4)")
    parser.add_argument("--root", type=Path, help="read this repository's tag v1 instead of making one")
    parser.add_argument("--stream", action="store_true", help="stream every read (sizes beyond memory; see above)")
    parser.add_argument("--keep", type=Path, help="make the repository here and keep it (for a later --root)")
    arguments = parser.parse_args()

    from ingest import Repository, Settings
    from ingest.pipeline import start_ray

    workdir = Path(tempfile.mkdtemp(prefix="floe-bench-ray-data-"))
    started_ray = False
    try:
        root = arguments.root
        if root is None and arguments.stream:
            root = backfilled(arguments.keep or workdir / "floe", workdir, arguments.items)
        elif root is None:
            log(f"{arguments.items:,} generated items ...")
            _items, items_path, _collections, collection_files = write_data(workdir, arguments.items)
            del _items
            root, rate = load_floe(workdir, items_path, collection_files, arguments.items)
            log(f"ingested at {rate:,.0f} items/s; tagging v1")
            Repository.open(root, Settings()).tag("v1")
        view = Repository.open(root, Settings()).view("v1")
        count = view.count()
        files = sum(1 for _ in view.table.scan().plan_files())
        uri = serve_floe(workdir, root) + "/iceberg"
        started_ray = start_ray(2)
        import ray

        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False
        context.print_on_execution_start = False
        rates = measure(uri, count, arguments.rounds, arguments.stream)
        print(report(rates, count, files, arguments.nodes))
    finally:
        if started_ray:
            import ray

            ray.shutdown()
        PROCESSES.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
