"""Benchmark: do short searches keep their pace while long ones crowd a server? (issue 48, item 5: long searches
take turns, ``ingest/api/_turns.py``).

One run: bench_scale's items (``--items``) ingested into a local root as ``floe ingest`` leaves them (not
optimized: one data file per batch and partition, so a filter no statistic prunes reads thousands of files),
then the same ``floe serve --workers W`` twice, alone on the machine each time: once with long searches taking
turns (``api.long_searches`` 1, the default) and once without a limit (0). Each time, after one warm-up round,
``--short-clients`` threads send bench_scale's six searches in turn while ``--long-clients`` threads send a long
search (``HEAVY``: a filter on a pattern of a property, which reads every file) for ``--seconds``. Printed: the
long search alone; then for each setting the short searches' rate, p50 and p99 and the long searches' rate and
p50, and the ratio of the two settings.

Run: ``.venv/bin/python scripts/bench_turns.py --items 300000`` (figures in docs/benchmarks-history.md). Every
server runs on 127.0.0.1 and is stopped by its pid.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_scale import Query, Side, floe_env, queries, run_floe, search_once, write_data
from bench_search import PROCESSES, free_port, start_server

from ingest.api import serve_command

HEAVY = Query(
    "a pattern of platform and a rare cloud cover, limit 100",
    {"filter-lang": "cql2-text", "filter": "platform LIKE '%-9' AND eo:cloud_cover < 0.05", "limit": 100},
)
"""A long search: no file's statistics can rule the pattern out, and few rows match, so every file is read."""


def log(message: str) -> None:
    print(f"[bench_turns {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def serve(workdir: Path, root: Path, workers: int, long_searches: int) -> str:
    port = free_port()
    environment = {**floe_env(root), "FLOE_API__LONG_SEARCHES": str(long_searches)}
    log_path = workdir / f"serve-{long_searches}.log"
    return start_server("floe serve", serve_command(str(root), port, workers=workers), environment, port, log_path)


def crowd(
    url: str, short_queries: list[Query], clients: tuple[int, int], seconds: float
) -> tuple[list[float], list[float]]:
    """Milliseconds of every short and every long search that ``clients`` (short, long) threads sent in
    ``seconds``: the short ones each send the six searches in turn, the long ones :data:`HEAVY` again and again."""
    import httpx

    short_clients, long_clients = clients
    short: list[list[float]] = [[] for _ in range(short_clients)]
    long: list[list[float]] = [[] for _ in range(long_clients)]
    deadline = time.perf_counter() + seconds

    def client(mine: list[float], sequence: itertools.islice[Query]) -> None:
        with httpx.Client(timeout=600) as connection:
            for query in sequence:
                if time.perf_counter() >= deadline:
                    return
                mine.append(search_once(connection, Side(url), query))

    threads = [
        threading.Thread(target=client, args=(short[n], itertools.islice(itertools.cycle(short_queries), n, None)))
        for n in range(short_clients)
    ]
    threads += [
        threading.Thread(target=client, args=(long[n], itertools.islice(itertools.repeat(HEAVY), None)))
        for n in range(long_clients)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [ms for mine in short for ms in mine], [ms for mine in long for ms in mine]


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else float("nan")


def run(arguments: argparse.Namespace, workdir: Path) -> None:
    import httpx

    log(f"writing and ingesting {arguments.items:,} items")
    data = write_data(workdir, arguments.items, 0)
    root = workdir / "floe"
    sources = [str(path) for path in [*data.collection_files, data.items]]
    run_floe(root, ["ingest", *sources, "--workers", "0"], workdir / "ingest.log")
    short_queries = queries(arguments.items, 0)
    rows = []
    alone = 0.0
    for long_searches in (1, 0):
        url = serve(workdir, root, arguments.workers, long_searches)
        server = PROCESSES.started[-1]
        with httpx.Client(timeout=600) as connection:
            for query in [*short_queries, HEAVY]:
                search_once(connection, Side(url), query)  # warm: each search once
            if long_searches:
                alone = statistics.median(search_once(connection, Side(url), HEAVY) for _ in range(3))
        log(f"api.long_searches={long_searches}: {arguments.short_clients} short + {arguments.long_clients} long")
        clients = (arguments.short_clients, arguments.long_clients)
        short, long = crowd(url, short_queries, clients, arguments.seconds)
        server.stop()
        PROCESSES.started.remove(server)
        rows.append((long_searches, short, long))
    print(
        f"\n{arguments.items:,} items as ingested, local disk, floe serve --workers {arguments.workers}, "
        f"{arguments.short_clients} short + {arguments.long_clients} long clients for {arguments.seconds:g} s; "
        f"the long search alone (warm, median of 3): {alone:,.0f} ms\n"
    )
    print("| api.long_searches | short searches/s | short p50 ms | short p99 ms | long searches/s | long p50 ms |")
    print("|---|---|---|---|---|---|")
    for long_searches, short, long in rows:
        print(
            f"| {long_searches or '0 (no limit)'} | {len(short) / arguments.seconds:.1f} | "
            f"{percentile(short, 0.5):,.0f} | {percentile(short, 0.99):,.0f} | "
            f"{len(long) / arguments.seconds:.2f} | {percentile(long, 0.5):,.0f} |"
        )
    (_, guarded, guarded_long), (_, free, free_long) = rows
    print(
        f"\nwith turns / without: short p50 {percentile(guarded, 0.5) / percentile(free, 0.5):.2f}x, "
        f"short p99 {percentile(guarded, 0.99) / percentile(free, 0.99):.2f}x, "
        f"short searches/s {len(guarded) / max(len(free), 1):.2f}x, "
        f"long searches/s {len(guarded_long) / max(len(free_long), 1):.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=300_000, help="generated items (bench_scale's)")
    parser.add_argument("--workers", type=int, default=1, help="floe serve --workers")
    parser.add_argument("--short-clients", type=int, default=4)
    parser.add_argument("--long-clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=45.0, help="each setting's load")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="floe-bench-turns-") as workdir:
        try:
            run(arguments, Path(workdir))
        finally:
            PROCESSES.stop_all()


if __name__ == "__main__":
    main()
