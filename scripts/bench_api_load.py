"""The STAC API under load while writers commit: every paginated run must return exactly its snapshot's items.

Run:  .venv/bin/python scripts/bench_api_load.py                    (3,000 items, 16 clients, 2 writers, 60 s)
      .venv/bin/python scripts/bench_api_load.py --seconds 10 --writers 4 --items 1000   (a smoke run)

1. A fresh repository (local storage, a temporary folder unless ``--root``)
   gets ``--items`` generated items in two collections (points, a ``cloud``
   cover, a ``version``), then ``floe serve`` starts on 127.0.0.1 (stopped by
   its process id at the end, also when the run fails).
2. For ``--seconds``, ``--writers`` writer processes (spawned) commit batches
   of new items and *replacements* of existing ones (a new version and cloud
   cover: an item moves in and out of filters), while ``--clients`` client
   threads page through searches, following next links to the end: unsorted,
   sorted by ``-datetime``, a bbox, a CQL2 filter on the cloud cover, one
   collection sorted by id; by GET and by POST.
3. Each run learns its snapshot from the ``Floe-Snapshot`` header of its first
   page (every later page must name the same one). Afterwards each run is
   checked against the table at that snapshot, read with pyiceberg's own scan
   (not floe's search engine), with the search's predicate applied here:
   *duplicates* (an item returned twice), *gaps* (an item of the snapshot
   matching the search and not returned), *unexpected* (returned though not
   matching at the snapshot), *stale* (returned in a version other than the
   snapshot's, or a page of another snapshot), *misordered* (a sorted run out of
   order).
4. The server's resident memory is sampled (psutil) every 0.2 s: at idle
   (after start-up and one warm-up search) and its peak under load.

Prints a markdown table of the figures.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import psutil  # noqa: E402 - after the path is set, with the project's imports

from ingest import Repository, Settings  # noqa: E402
from ingest.api import serve_command  # noqa: E402

COLLECTIONS = ("load-a", "load-b")
BBOX = [-90.0, -45.0, 90.0, 45.0]
CLOUD_BELOW = 30.0
PAGE = 100
SNAPSHOT_HEADER = "Floe-Snapshot"


# -- items and writers --------------------------------------------------------------------------------
def make_item(item_id: str, collection: str, rng: random.Random, version: int) -> dict[str, Any]:
    x, y = round(rng.uniform(-180, 180), 4), round(rng.uniform(-85, 85), 4)
    day = rng.randrange(0, 365)
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(1_704_067_200 + day * 86_400 + rng.randrange(86_400)))
    return {
        "type": "Feature",
        "stac_version": "1.0.0",
        "stac_extensions": [],
        "id": item_id,
        "collection": collection,
        "geometry": {"type": "Point", "coordinates": [x, y]},
        "bbox": [x, y, x, y],
        "properties": {"datetime": when, "cloud": round(rng.uniform(0, 100), 2), "version": version},
        "assets": {},
        "links": [],
    }


def seed(root: str, count: int) -> list[str]:
    repository = Repository.create(root, Settings())
    rng = random.Random(14)
    ids = [f"seed-{n:06d}" for n in range(count)]
    for start in range(0, count, 1000):
        writer = repository.writer()
        writer.add_items(make_item(i, COLLECTIONS[n % 2], rng, 0) for n, i in enumerate(ids[start : start + 1000]))
        writer.commit(f"seed {start}")
    return ids


def write(root: str, index: int, seeded: list[str], deadline: float, results: Any) -> None:
    """One writer process: commit 20 new items and 10 replacements per commit until ``deadline``."""
    repository = Repository.open(root, Settings())
    rng = random.Random(1000 + index)
    commits = added = replaced = 0
    while time.time() < deadline:
        writer = repository.writer()
        new = [make_item(f"w{index}-{added + n}", COLLECTIONS[n % 2], rng, 0) for n in range(20)]
        writer.add_items(new)
        chosen = rng.sample(range(len(seeded)), 10)
        version = time.time_ns() // 1000 * 10 + index  # only ever grows; distinct between writers
        writer.add_items([make_item(seeded[n], COLLECTIONS[n % 2], rng, version) for n in chosen], replace=True)
        writer.commit(f"writer {index}: 20 new, 10 replaced")
        commits, added, replaced = commits + 1, added + 20, replaced + 10
    results.put({"writer": index, "commits": commits, "added": added, "replaced": replaced})


# -- clients ------------------------------------------------------------------------------------------
@dataclass
class Run:
    """One paginated search from its first page to its last."""

    kind: str
    snapshot: str = ""
    items: list[tuple[str, str, int, Any]] = field(default_factory=list)  # (collection, id, version, sort key)
    pages: int = 0
    other_snapshot_pages: int = 0


SEARCHES: dict[str, tuple[str, dict[str, Any]]] = {
    "unsorted GET": ("GET", {"limit": PAGE}),
    "sorted -datetime GET": ("GET", {"limit": PAGE, "sortby": "-datetime"}),
    "bbox POST": ("POST", {"limit": PAGE, "bbox": BBOX}),
    "filter GET": ("GET", {"limit": PAGE, "filter": f"cloud < {CLOUD_BELOW}", "filter-lang": "cql2-text"}),
    "collection sorted id POST": (
        "POST",
        {"limit": PAGE, "collections": [COLLECTIONS[0]], "sortby": [{"field": "id", "direction": "asc"}]},
    ),
}


# The sorted searches, and whether each sorts descending.
SORTED_DESCENDING = {"sorted -datetime GET": True, "collection sorted id POST": False}


@dataclass
class Tally:
    runs: list[Run] = field(default_factory=list)
    requests: int = 0
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _fetch(url: str, method: str, body: dict[str, Any] | None) -> tuple[dict[str, Any], str]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read()), response.headers.get(SNAPSHOT_HEADER, "")


def paginate(base: str, kind: str, tally: Tally) -> Run:
    method, params = SEARCHES[kind]
    run = Run(kind)
    url = f"{base}/search" + ("?" + urllib.parse.urlencode(params) if method == "GET" else "")
    body: dict[str, Any] | None = params if method == "POST" else None
    sort_key = "datetime" if kind.startswith("sorted -datetime") else "id"
    while True:
        page, snapshot = _fetch(url, method, body)
        with tally.lock:
            tally.requests += 1
        run.pages += 1
        run.snapshot = run.snapshot or snapshot
        run.other_snapshot_pages += snapshot != run.snapshot
        for feature in page["features"]:
            key = feature["properties"]["datetime"] if sort_key == "datetime" else feature["id"]
            run.items.append((feature["collection"], feature["id"], feature["properties"]["version"], key))
        following = [link for link in page["links"] if link["rel"] == "next"]
        if not following:
            return run
        url, method = following[0]["href"], following[0].get("method", "GET")
        body = following[0].get("body")


def client(base: str, index: int, deadline: float, tally: Tally) -> None:
    kinds = list(SEARCHES)
    number = index
    while time.time() < deadline:
        kind = kinds[number % len(kinds)]
        number += 1
        try:
            run = paginate(base, kind, tally)
        except (urllib.error.URLError, OSError, ValueError, KeyError) as error:
            with tally.lock:
                tally.errors.append(f"{kind}: {error}")
            continue
        with tally.lock:
            tally.runs.append(run)


# -- checking -----------------------------------------------------------------------------------------
def snapshot_rows(repository: Repository, snapshot: str, cache: dict[str, dict[tuple[str, str], dict]]) -> dict:
    """(collection, id) -> row of the table at ``snapshot``, read with pyiceberg's own scan."""
    if snapshot not in cache:
        table = repository.table_at(snapshot).scan(selected_fields=("id", "collection", "cloud", "version", "bbox"))
        rows = table.to_arrow().to_pylist()
        cache[snapshot] = {(row["collection"], row["id"]): row for row in rows}
    return cache[snapshot]


def matches(kind: str, row: dict[str, Any]) -> bool:
    if kind.startswith("bbox"):
        box = row["bbox"]
        return BBOX[0] <= box["xmin"] <= BBOX[2] and BBOX[1] <= box["ymin"] <= BBOX[3]
    if kind.startswith("filter"):
        return row["cloud"] is not None and row["cloud"] < CLOUD_BELOW
    if kind.startswith("collection"):
        return row["collection"] == COLLECTIONS[0]
    return True


def check(run: Run, rows: dict[tuple[str, str], dict]) -> Counter[str]:
    found: Counter[str] = Counter()
    keys = [(collection, item_id) for collection, item_id, _, _ in run.items]
    found["duplicates"] = len(keys) - len(set(keys))
    expected = {key for key, row in rows.items() if matches(run.kind, row)}
    found["gaps"] = len(expected - set(keys))
    found["unexpected"] = len(set(keys) - expected)
    found["stale"] = run.other_snapshot_pages + sum(
        1
        for collection, item_id, version, _ in run.items
        if rows.get((collection, item_id), {}).get("version") != version
    )
    if run.kind in SORTED_DESCENDING:
        order = [key for _, _, _, key in run.items]
        wanted = sorted(order, reverse=SORTED_DESCENDING[run.kind])
        found["misordered"] = int(order != wanted)
        if order != wanted:
            at = next(n for n, (got, want) in enumerate(zip(order, wanted, strict=True)) if got != want)
            print(
                f"out of order: {run.kind} at {run.snapshot}, position {at}: {order[at - 1 : at + 2]}", file=sys.stderr
            )
    return found


# -- the server and its memory ----------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(root: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    with log.open("w") as out:
        process = subprocess.Popen(serve_command(root, port), cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(base + "/conformance", timeout=2)
            return process, base
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                stop(process)
                raise SystemExit(f"floe serve did not start: {log.read_text()[-2000:]}") from None
            time.sleep(0.3)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=5)


class MemorySampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.process = psutil.Process(pid)
        self.peak = 0
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.2):
            try:
                self.peak = max(self.peak, self.process.memory_info().rss)
            except psutil.Error:
                return


# -- the run ------------------------------------------------------------------------------------------
def load(base: str, root: str, seeded: list[str], args: argparse.Namespace) -> tuple[Tally, list[dict]]:
    deadline = time.time() + args.seconds
    context = multiprocessing.get_context("spawn")  # never fork a process that opened an Icechunk repository
    results = context.Queue()
    writers = [context.Process(target=write, args=(root, n, seeded, deadline, results)) for n in range(args.writers)]
    for process in writers:
        process.start()
    tally = Tally()
    clients = [threading.Thread(target=client, args=(base, n, deadline, tally)) for n in range(args.clients)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    reports = [results.get(timeout=600) for _ in writers]
    for process in writers:
        process.join(timeout=60)
    return tally, reports


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=3000, help="items seeded before the load (default 3000)")
    parser.add_argument("--clients", type=int, default=16, help="concurrent paging clients (default 16)")
    parser.add_argument("--writers", type=int, default=2, help="concurrent writer processes (default 2)")
    parser.add_argument("--seconds", type=float, default=60, help="how long clients and writers run (default 60)")
    parser.add_argument("--root", help="repository folder (default: a new temporary folder, removed afterwards)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="floe-api-load-") as scratch:
        root = args.root or str(Path(scratch) / "repo")
        seeded = seed(root, args.items)
        process, base = start_server(root, Path(scratch) / "serve.log")
        try:
            paginate(base, "unsorted GET", Tally())  # warm-up: the snapshot's files are listed once
            idle = psutil.Process(process.pid).memory_info().rss
            sampler = MemorySampler(process.pid)
            sampler.start()
            started = time.monotonic()
            tally, writers = load(base, root, seeded, args)
            elapsed = time.monotonic() - started
            sampler.stopped.set()
            alive = process.poll() is None
        finally:
            stop(process)
        report(root, args, tally, writers, elapsed, idle, max(sampler.peak, idle), alive)


def report(
    root: str,
    args: argparse.Namespace,
    tally: Tally,
    writers: list[dict],
    elapsed: float,
    idle: int,
    peak: int,
    alive: bool,
) -> None:
    repository = Repository.open(root, Settings())
    cache: dict[str, dict[tuple[str, str], dict]] = {}
    totals: Counter[str] = Counter()
    for run in tally.runs:
        totals.update(check(run, snapshot_rows(repository, run.snapshot, cache)))
    multi_page = sum(1 for run in tally.runs if run.pages > 1)
    by_kind = Counter(run.kind for run in tally.runs)
    commits = sum(writer["commits"] for writer in writers)
    rows = [
        ("seconds of load", f"{elapsed:.0f}"),
        ("clients / writer processes", f"{args.clients} / {args.writers}"),
        (
            "items at start / at end",
            f"{args.items:,} / {len(snapshot_rows(repository, repository.resolve('main'), cache)):,}",
        ),
        (
            "writer commits (items added, replaced)",
            f"{commits} ({sum(w['added'] for w in writers):,}, {sum(w['replaced'] for w in writers):,})",
        ),
        ("paginated runs (with more than one page)", f"{len(tally.runs)} ({multi_page})"),
        ("runs by search", ", ".join(f"{kind}: {count}" for kind, count in sorted(by_kind.items()))),
        ("distinct snapshots the runs started at", f"{len({run.snapshot for run in tally.runs})}"),
        ("requests", f"{tally.requests:,}"),
        ("errors", f"{len(tally.errors)}"),
        ("duplicates", f"{totals['duplicates']}"),
        ("gaps (missing items)", f"{totals['gaps']}"),
        ("unexpected items", f"{totals['unexpected']}"),
        ("stale (other version or page of another snapshot)", f"{totals['stale']}"),
        ("sorted runs out of order", f"{totals['misordered']}"),
        ("server RSS at idle / peak (MB)", f"{idle / 1e6:.0f} / {peak / 1e6:.0f}"),
        ("server alive at the end", "yes" if alive else "NO"),
    ]
    print("| figure | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    for error in tally.errors[:10]:
        print(f"error: {error}", file=sys.stderr)


if __name__ == "__main__":
    main()
