"""Benchmark: a repository on object storage against the same items on local disk (issue 48).

One run, with the items of ``bench_scale`` (``--items``, three collections, 2022-2024):

1. **Ingest**: ``floe ingest --workers 0`` of the same NDJSON into a local root and into an ``s3://`` root on moto
   behind a proxy that holds each request ``--delay-ms`` (a cloud round trip), items/s each, their ratio, and
   the S3 requests per 1,000 items.
2. **First search in a fresh process**, per query of ``bench_scale``: a new Python process opens the repository
   and runs the search (imports are not timed: the timer starts after them), on local disk and on S3; the
   milliseconds of each, their ratio, and the S3 requests it made (counted by tests/_signature_proxy.py, which
   sits between the latency proxy and moto). Both sides must return the same ids. The same process then runs
   the search 5 times more: the median of those is the *warm* search (on a branch, each one still looks up
   the branch's tip: one round trip, timed on its own after each warm search and reported beside it).
3. **A second server**: seconds from starting ``floe serve --workers 1`` on the root (as a replica that starts or
   restarts) to its first answer of ``/search``, imports included; then on S3 the same with the ``--cache-dir`` a
   first server filled (a replica restarting on its machine), and the S3 requests it made.
4. **Under load** (``--load-seconds S``): ``floe serve --workers W`` on each root in turn, ``--load-clients``
   threads sending the six searches for S seconds: searches/s, p50 and p99, S3 against local disk.

The chain on S3 is floe -> latency proxy -> counting proxy -> moto, each on 127.0.0.1 and stopped by its pid.
Run: ``.venv/bin/python scripts/bench_object_store.py --items 100000`` (figures in docs/benchmarks-history.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_remote import start_proxy
from bench_scale import Side, load, queries, write_data
from bench_search import PROCESSES, REPO_ROOT, Stoppable, free_port, start_server

from ingest.api import serve_command

PROBE = """
import json, sys, time
from ingest import Repository
from ingest.api import SearchEngine, SearchRequest
root, body = sys.argv[1], json.loads(sys.argv[2])
started = time.perf_counter()
engine = SearchEngine(Repository.open(root))
page = engine.search(SearchRequest(**body))
took = time.perf_counter() - started
mark = None
if len(sys.argv) > 3:  # the counting proxy: how many requests the store has seen once the first search is done
    import urllib.request
    with urllib.request.urlopen(sys.argv[3], timeout=30) as answer:
        mark = len(json.loads(answer.read()))
warm, tip = [], []
for _ in range(5):
    again = time.perf_counter()
    engine.search(SearchRequest(**body))
    warm.append((time.perf_counter() - again) * 1000)
    looked = time.perf_counter()
    engine.resolve()  # what a warm search on a branch cannot avoid: learning the branch's tip
    tip.append((time.perf_counter() - looked) * 1000)
ids = [item["id"] for item in page.items]
fields = [entry["field"] for entry in body.get("sortby") or []]
keys = [[(item.get("properties") or {}).get(f.removeprefix("properties."), item.get(f)) for f in fields]
        for item in page.items]
print(json.dumps({"ms": took * 1000, "ids": ids, "keys": keys, "warm": sorted(warm)[2], "tip": sorted(tip)[2],
                  "mark": mark}, default=str))
"""


def log(message: str) -> None:
    print(f"[bench_object_store {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Counter:
    """tests/_signature_proxy.py in front of moto: every request noted."""

    def __init__(self, moto_port: int) -> None:
        self.port = free_port()
        popen = subprocess.Popen(
            [sys.executable, "-m", "tests._signature_proxy", str(self.port), str(moto_port)], cwd=REPO_ROOT
        )
        PROCESSES.add(Stoppable("counting proxy", popen.pid, popen=popen))
        deadline = time.monotonic() + 30
        while True:
            try:
                self.count()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def count(self) -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/__requests__", timeout=30) as answer:
            return len(json.loads(answer.read()))


def environment(endpoint: str) -> dict[str, str]:
    kept = {name: value for name, value in os.environ.items() if not name.startswith(("FLOE_", "AWS_"))}
    return {
        **kept,
        "PYTHONPATH": str(REPO_ROOT),
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }


def ingest(root: str, sources: list[Path], env: dict[str, str]) -> float:
    """Seconds ``floe ingest --workers 0`` took for ``sources`` into ``root``."""
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "ingest.cli", "--root", root, "ingest", *map(str, sources), "--workers", "0"],
        cwd=REPO_ROOT,
        env=env,
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - started


def first_search(root: str, body: dict, env: dict[str, str], counter: str | None = None) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, root, json.dumps(body), *([counter] if counter else [])],
        cwd=REPO_ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def first_answer(root: str, env: dict[str, str], cache_dir: Path | None = None) -> float:
    """Seconds from starting ``floe serve --workers 1`` on ``root`` (another server's root: a replica that starts
    or restarts; with ``cache_dir``, its ``--cache-dir``) to its first answer of a search; the server is stopped
    by its pid."""
    port = free_port()
    started = time.perf_counter()
    cache = ["--cache-dir", str(cache_dir)] if cache_dir is not None else []
    popen = subprocess.Popen(
        [sys.executable, "-m", "ingest.cli", "--root", root, "serve", "--port", str(port), "--workers", "1", *cache],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = Stoppable("floe serve", popen.pid, popen=popen)
    PROCESSES.add(server)
    try:
        while time.perf_counter() - started < 120:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/search?limit=10", timeout=30) as answer:
                    if answer.status == 200 and json.loads(answer.read())["features"]:
                        return time.perf_counter() - started
            except OSError:
                time.sleep(0.05)
        raise SystemExit(f"floe serve on {root} did not answer within 120 s")
    finally:
        server.stop()
        PROCESSES.started.remove(server)


def under_load(arguments: argparse.Namespace, workdir: Path, *sides: tuple[str, dict[str, str]]) -> list:
    """``floe serve --workers W`` on each root in turn, alone, loaded by ``--load-clients`` threads sending
    bench_scale's six searches for ``--load-seconds`` (after one warm-up round): each side's searches and
    latencies (bench_scale's ``load``)."""
    import httpx

    results = []
    for root, env in sides:
        port = free_port()
        command = serve_command(root, port, workers=arguments.load_workers)
        url = start_server("floe serve", command, env, port, workdir / f"serve-{port}.log")
        server = PROCESSES.started[-1]
        try:
            with httpx.Client(timeout=600) as client:
                for query in queries(arguments.items, arguments.seed):
                    client.post(f"{url}/search", json=query.body).raise_for_status()
            results.append(
                load(
                    Side(url), queries(arguments.items, arguments.seed), arguments.load_clients, arguments.load_seconds
                )
            )
        finally:
            server.stop()
            PROCESSES.started.remove(server)
        log(f"under load on {root}: {results[-1].rate:.1f} searches/s")
    return results


def same_answer(is_sorted: bool, limit: int, local: dict, remote: dict) -> bool:
    """Whether both sides answered alike: a sorted search with the same sort keys in the same order (items tied on
    their keys may come in another order, or be other items of the same keys at the page's end: the two roots'
    files were written in other batches), an unsorted one as sets when both returned every match. A full page
    of an unsorted search is any ``limit`` matches."""
    if is_sorted:
        return local["keys"] == remote["keys"]
    if len(local["ids"]) < limit or len(remote["ids"]) < limit:
        return sorted(local["ids"]) == sorted(remote["ids"])
    return len(local["ids"]) == len(remote["ids"])


def run(arguments: argparse.Namespace, workdir: Path) -> None:
    sys.path.insert(0, str(REPO_ROOT))
    from tests.conftest import MotoServer

    moto = MotoServer()
    PROCESSES.add(Stoppable("moto", moto.process.pid, popen=moto.process))
    counter = Counter(moto.port)
    slow = f"http://127.0.0.1:{start_proxy(counter.port, arguments.delay_ms)}"
    s3_env = environment(slow)
    local_env = environment(moto.endpoint)
    bucket = moto.create_bucket()
    s3_root, local_root = f"s3://{bucket}/archive", str(workdir / "local")

    log(f"writing {arguments.items:,} items")
    data = write_data(workdir, arguments.items, arguments.seed)
    sources = [*data.collection_files, data.items]
    local_seconds = ingest(local_root, sources, local_env)
    before = counter.count()
    s3_seconds = ingest(s3_root, sources, s3_env)
    ingest_requests = counter.count() - before
    log(f"ingested: local {local_seconds:.1f} s, S3 {s3_seconds:.1f} s ({ingest_requests:,} requests)")

    rows = []
    for query in queries(arguments.items, arguments.seed):
        body = {key.replace("-", "_"): value for key, value in query.body.items()}
        local_ms, s3_ms, requests, local_warm, s3_warm, s3_tip = [], [], [], [], [], []
        for _ in range(arguments.runs):
            local = first_search(local_root, body, local_env)
            before = counter.count()
            remote = first_search(s3_root, body, s3_env, f"http://127.0.0.1:{counter.port}/__requests__")
            requests.append(remote["mark"] - before)
            if not same_answer(query.sorted, body.get("limit", 10), local, remote):
                raise SystemExit(f"{query.name}: S3 returned other items than local disk")
            local_ms.append(local["ms"])
            s3_ms.append(remote["ms"])
            local_warm.append(local["warm"])
            s3_warm.append(remote["warm"])
            s3_tip.append(remote["tip"])
        rows.append(
            (
                query.name,
                statistics.median(local_ms),
                statistics.median(s3_ms),
                max(requests),
                len(local["ids"]),
                statistics.median(local_warm),
                statistics.median(s3_warm),
                statistics.median(s3_tip),
            )
        )
        log(f"{query.name}: local {rows[-1][1]:.0f} ms, S3 {rows[-1][2]:.0f} ms, {rows[-1][3]} requests")

    starts = [(first_answer(local_root, local_env), first_answer(s3_root, s3_env)) for _ in range(arguments.runs)]
    local_start = statistics.median(start for start, _ in starts)
    s3_start = statistics.median(start for _, start in starts)
    log(f"a second floe serve answered after {local_start:.2f} s (local), {s3_start:.2f} s (S3)")
    # A replica that restarts with the --cache-dir its predecessor filled: the first start fills it.
    cache_dir = workdir / "object-cache"
    first_answer(s3_root, s3_env, cache_dir)
    restarts = []
    for _ in range(arguments.runs):
        before = counter.count()
        restarts.append((first_answer(s3_root, s3_env, cache_dir), counter.count() - before))
    s3_restart = statistics.median(seconds for seconds, _ in restarts)
    restart_requests = max(requests for _, requests in restarts)
    log(f"restarted with a filled --cache-dir: {s3_restart:.2f} s, {restart_requests} requests")

    loads = (
        under_load(arguments, workdir, (local_root, local_env), (s3_root, s3_env)) if arguments.load_seconds else None
    )

    setting = f"S3 on moto behind {arguments.delay_ms:g} ms a request; medians of {arguments.runs} fresh processes"
    print(f"\n{arguments.items:,} items, {setting}\n")
    print("| ingest | local disk | S3 | ratio (S3/local) | S3 requests per 1,000 items |")
    print("|---|---|---|---|---|")
    local_rate, s3_rate = arguments.items / local_seconds, arguments.items / s3_seconds
    per_thousand = ingest_requests * 1000 / arguments.items
    print(f"| items/s | {local_rate:,.0f} | {s3_rate:,.0f} | {s3_rate / local_rate:.2f}x | {per_thousand:.1f} |\n")
    print("| a second `floe serve --workers 1` on the root: seconds to its first answer | local disk | S3 |")
    print("|---|---|---|")
    print(f"| from the process's start (imports included) | {local_start:.2f} | {s3_start:.2f} |")
    print(
        f"| the same, restarted with the `--cache-dir` a first server filled | - | {s3_restart:.2f} "
        f"({restart_requests} requests) |\n"
    )
    print(
        "| first search in a fresh process | items | local disk ms | S3 ms | S3 requests | S3/local "
        "| warm local ms | warm S3 ms | S3 tip look-up ms | (warm S3 - look-up) / warm local |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, local_first, s3_first, requests_made, items, local_warm_ms, s3_warm_ms, tip_ms in rows:
        print(
            f"| {name} | {items} | {local_first:,.0f} | {s3_first:,.0f} | {requests_made} "
            f"| {s3_first / max(local_first, 1e-9):.1f}x | {local_warm_ms:,.1f} | {s3_warm_ms:,.1f} | {tip_ms:,.1f} "
            f"| {(s3_warm_ms - tip_ms) / max(local_warm_ms, 1e-9):.1f}x |"
        )
    if loads is not None:
        print()
        local_load, s3_load = loads
        print(
            f"| {arguments.load_clients} clients, the query mix, `floe serve --workers {arguments.load_workers}` "
            f"for {arguments.load_seconds:g} s | local disk | S3 | S3 / local |"
        )
        print("|---|---|---|---|")
        print(f"| searches/s | {local_load.rate:.1f} | {s3_load.rate:.1f} | {s3_load.rate / local_load.rate:.2f}x |")
        for label, share in (("p50 ms", 0.5), ("p99 ms", 0.99)):
            ours, theirs = s3_load.percentile(share), local_load.percentile(share)
            print(f"| {label} | {theirs:,.0f} | {ours:,.0f} | {ours / theirs:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=100_000, help="generated items (bench_scale's)")
    parser.add_argument("--delay-ms", type=float, default=20.0, help="the proxy's hold of each S3 request")
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per query and side (medians)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--load-seconds", type=float, default=0.0, help="each side's load (0: no load phase)")
    parser.add_argument("--load-clients", type=int, default=8)
    parser.add_argument("--load-workers", type=int, default=2, help="floe serve --workers under load")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="floe-bench-object-store-") as workdir:
        try:
            run(arguments, Path(workdir))
        finally:
            PROCESSES.stop_all()


if __name__ == "__main__":
    main()
