"""Scale benchmark: floe against pgstac at archive size, loaded by their own tools, searched over HTTP, in one run.

Run:  .venv/bin/python scripts/bench_scale.py                    (10,000,000 items: hours, tens of GB of disk)
      .venv/bin/python scripts/bench_scale.py --items 100000     (a few minutes)
      .venv/bin/python scripts/bench_scale.py --quick            (20,000 items, 5 repeats: a smoke run)
      .venv/bin/python scripts/bench_scale.py --items 300000 --serve-workers 2 --load-clients 8   (load)

The questions: does floe load and search as well as pgstac when the archive is
large, does its ingest slow down as the table grows, and what ``floe optimize``
does to the table and to the searches.

1. Items are generated into one NDJSON file, streamed (never all in memory),
   deterministic from ``--seed``: 3 collections, datetimes over 2022-2024 in
   file order (as an archive is ingested), footprints 0.05-2 degrees wide over
   four land regions (Europe weighs most), ``eo:cloud_cover`` and a platform.
2. floe loads that file with its own CLI at its defaults, in a child process:
   ``FLOE_ROOT=<tmp>/floe python -m ingest.cli ingest --workers 0
   collection-*.json items.ndjson`` (batches of 5,000 items, one commit each;
   the ``[optimize]`` thresholds compact partitions as batches pile up). The
   rate of the first and the last tenth of its batches comes from the commit
   times in ``Repository.log()``. Beside the load, a *canary* (a fixed loop of
   single-threaded Python, timed every 5 s on a thread of this waiting process)
   measures how fast the machine itself ran during each tenth, so a slower last
   tenth can be told from a slower machine.
3. ``python -m ingest.cli optimize`` (timed); the table's live data files and
   their bytes are counted before and after from the scan plan at main.
4. pgstac (PostgreSQL 15 + PostGIS + pgstac, then stac-fastapi-pgstac; set up
   by scripts/bench_search.py's functions) loads the same file with
   ``pypgstac load items --method insert``, after the three collections and
   ``pypgstac load_queryables`` typing eo:cloud_cover, gsd and platform (pgstac
   sorts an undeclared property as text); ``--pgstac-index`` also indexes them.
5. Both servers run on 127.0.0.1. After a warm-up, every query is sent
   ``--repeats`` times as POST /search; each round sends every query to both
   servers, in alternating order, so a noisy neighbour hits both sides alike.
   Paging follows next links with pystac-client, floe and pgstac in turn.

The areas and time windows of the queries are fixed boxes, windows and a
polygon chosen to fall where items lie, not taken from any item. Sorted queries
(and unsorted ones that return everything they match) must return the same ids
on both sides; the table says whether they do.

``--before-optimize`` also times floe's search on the table as ingest left it
(against pgstac again, interleaved the same way) before running optimize.

``--serve-workers N`` runs each API with N server processes (``floe serve
--workers N``, uvicorn ``--workers N`` for stac-fastapi-pgstac). With
``--load-clients C``, after the timings each server in turn (alone on the
machine) gets C concurrent clients sending the query mix for
``--load-seconds``: searches per second, p50 and p99 latency, and the ratio
floe/pgstac (issue 48's load figure).

Every server listens on 127.0.0.1 and is stopped by its own process id at the
end, also when the run fails or is terminated. Prints markdown: load rates,
the table's files, search medians and p90s side by side with the ratio
floe/pgstac, and how long each phase took.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import itertools
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_search import (
    PROCESSES,
    REPO_ROOT,
    Stoppable,
    Timing,
    pypgstac,
    serve_floe,
    serve_pgstac,
    start_postgres,
)

COLLECTIONS = ("bench-a", "bench-b", "bench-c")
PLATFORMS = {
    "bench-a": ("sentinel-2a", "sentinel-2b"),
    "bench-b": ("landsat-8", "landsat-9"),
    "bench-c": ("sentinel-1a", "sentinel-1c"),
}
# Where footprint centres fall: (lon_min, lat_min, lon_max, lat_max) and the share of items; none crosses 180°.
REGIONS = (
    ((-10.0, 36.0, 30.0, 60.0), 0.40),  # Europe
    ((-125.0, 25.0, -70.0, 50.0), 0.25),  # North America
    ((-18.0, -35.0, 50.0, 15.0), 0.20),  # Africa
    ((95.0, -10.0, 140.0, 25.0), 0.15),  # South-East Asia
)
FIRST_SECOND = np.datetime64("2022-01-01T00:00:00", "s")
SPAN_SECONDS = int((np.datetime64("2025-01-01T00:00:00", "s") - FIRST_SECOND) / np.timedelta64(1, "s"))
FOOTPRINT_DEGREES = (0.05, 2.0)
CHUNK = 50_000
BATCH_MESSAGE = re.compile(r"\(batch (\d+)\)$")


def log(message: str) -> None:
    print(f"[bench_scale {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- CPU time: on a shared machine, wall time of a load measures the neighbours too ---------------------------------


def children_cpu_seconds() -> float:
    """User + system CPU of every child process of ours that has ended (and was waited for)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()  # the fields after "pid (comm)", from the state on


def tree_cpu_seconds(pid: int) -> float:
    """CPU of a daemon we did not fork (PostgreSQL's postmaster): its own, its ended children's, its live ones'."""
    ticks = os.sysconf("SC_CLK_TCK")
    fields = _stat_fields(pid)
    if fields is None:
        return 0.0
    total = sum(int(value) for value in fields[11:15])  # utime, stime, cutime, cstime
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            child = _stat_fields(int(entry.name))
            if child is not None and int(child[1]) == pid:  # its parent is the postmaster: a live backend
                total += int(child[11]) + int(child[12])
    return total / ticks


@dataclass(frozen=True)
class Load:
    """One side's load of the items: wall seconds and CPU seconds of every process that did the work."""

    items: int
    seconds: float
    cpu_seconds: float

    @property
    def rate(self) -> float:
        return self.items / self.seconds

    @property
    def cpu_rate(self) -> float:
        return self.items / max(self.cpu_seconds, 1e-9)


# -- the items -------------------------------------------------------------------------------------------------------


@dataclass
class Extent:
    """A collection's extent, grown as its items are written."""

    bbox: list[float] = field(default_factory=lambda: [180.0, 90.0, -180.0, -90.0])
    first: str = ""
    last: str = ""
    count: int = 0

    def add(self, bbox: list[float], when: str) -> None:
        self.bbox = [
            min(self.bbox[0], bbox[0]),
            min(self.bbox[1], bbox[1]),
            max(self.bbox[2], bbox[2]),
            max(self.bbox[3], bbox[3]),
        ]
        self.first = self.first or when  # items come in time order
        self.last = when
        self.count += 1


def item_chunks(count: int, seed: int) -> Iterator[list[dict[str, Any]]]:
    """The generated items, ``CHUNK`` at a time, in time order; the same ``seed`` gives the same items."""
    rng = np.random.default_rng(seed)
    boxes = np.array([box for box, _ in REGIONS])
    weights = np.array([weight for _, weight in REGIONS])
    for start in range(0, count, CHUNK):
        size = min(CHUNK, count - start)
        index = np.arange(start, start + size, dtype=np.int64)
        # Integer seconds, increasing with the index: unique while count < SPAN_SECONDS (94.7 million).
        seconds = index * SPAN_SECONDS // max(count, 1)
        times = np.datetime_as_string(FIRST_SECOND + seconds.astype("timedelta64[s]"), unit="s")
        region = rng.choice(len(REGIONS), size=size, p=weights)
        low, high = boxes[region, :2], boxes[region, 2:]
        centre = low + rng.random((size, 2)) * (high - low)
        width = rng.uniform(*FOOTPRINT_DEGREES, size=size)
        height = width * rng.uniform(0.7, 1.3, size=size)
        skew = 0.1 * width  # a swath's footprint leans: a parallelogram, not its bbox
        collection = rng.integers(0, len(COLLECTIONS), size=size)
        platform = rng.integers(0, 2, size=size)
        cloud = np.round(rng.uniform(0, 100, size=size), 2)
        x0 = centre[:, 0] - width / 2
        x1 = centre[:, 0] + width / 2
        y0 = centre[:, 1] - height / 2
        y1 = centre[:, 1] + height / 2
        chunk = []
        for row in range(size):
            name = COLLECTIONS[collection[row]]
            number = int(index[row])
            left, right, bottom, top, lean = (
                round(float(x0[row]), 6),
                round(float(x1[row]), 6),
                round(float(y0[row]), 6),
                round(float(y1[row]), 6),
                round(float(skew[row]), 6),
            )
            ring = [
                [left + lean, bottom],
                [right + lean, bottom],
                [right - lean, top],
                [left - lean, top],
                [left + lean, bottom],
            ]
            chunk.append(
                {
                    "type": "Feature",
                    "stac_version": "1.0.0",
                    "stac_extensions": ["https://stac-extensions.github.io/eo/v1.1.0/schema.json"],
                    "id": f"item-{number:09d}",
                    "collection": name,
                    "geometry": {"type": "Polygon", "coordinates": [ring]},
                    "bbox": [left - lean, bottom, right + lean, top],
                    "properties": {
                        "datetime": f"{times[row]}Z",
                        "eo:cloud_cover": float(cloud[row]),
                        "platform": PLATFORMS[name][platform[row]],
                        "gsd": 10 if name == "bench-a" else 30,
                    },
                    "assets": {
                        "data": {
                            "href": f"s3://archive/{name}/{number}/data.tif",
                            "type": "image/tiff; application=geotiff; profile=cloud-optimized",
                            "roles": ["data"],
                        },
                        "thumbnail": {
                            "href": f"s3://archive/{name}/{number}/thumb.png",
                            "type": "image/png",
                            "roles": ["thumbnail"],
                        },
                    },
                    # An item naming its collection links to it (STAC item-spec); a relative link, as in a catalog.
                    "links": [{"rel": "collection", "href": f"../{name}.json", "type": "application/json"}],
                }
            )
        yield chunk


def collection_document(collection: str, extent: Extent) -> dict[str, Any]:
    return {
        "type": "Collection",
        "stac_version": "1.0.0",
        "stac_extensions": [],
        "id": collection,
        "description": f"Generated scale-benchmark collection {collection}",
        "license": "other",
        "extent": {"spatial": {"bbox": [extent.bbox]}, "temporal": {"interval": [[extent.first, extent.last]]}},
        "links": [],
    }


@dataclass
class Data:
    items: Path
    collections_ndjson: Path
    collection_files: list[Path]


def write_data(workdir: Path, count: int, seed: int) -> Data:
    """Stream the items to items.ndjson, then write the collections (their extents are known only at the end)."""
    extents = {name: Extent() for name in COLLECTIONS}
    items_path = workdir / "items.ndjson"
    with items_path.open("wb") as stream:
        for chunk in item_chunks(count, seed):
            for item in chunk:
                extents[item["collection"]].add(item["bbox"], item["properties"]["datetime"])
            stream.write(b"".join(orjson.dumps(item, option=orjson.OPT_APPEND_NEWLINE) for item in chunk))
    documents = [collection_document(name, extent) for name, extent in extents.items() if extent.count]
    collections_path = workdir / "collections.ndjson"
    collections_path.write_bytes(b"".join(orjson.dumps(d, option=orjson.OPT_APPEND_NEWLINE) for d in documents))
    collection_files = []
    for document in documents:
        path = workdir / f"collection-{document['id']}.json"
        path.write_bytes(orjson.dumps(document))
        collection_files.append(path)
    return Data(items_path, collections_path, collection_files)


# -- floe, through its CLI -------------------------------------------------------------------------------------------


def floe_env(root: Path) -> dict[str, str]:
    """The environment of a floe CLI child: this checkout's ``ingest`` first, the root, nothing else changed."""
    path = os.pathsep.join([str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    # COLUMNS: rich wraps what the CLI prints to a file at 80 columns; its summary line should stay one line.
    return {**os.environ, "PYTHONPATH": path, "FLOE_ROOT": str(root), "COLUMNS": "1000"}


def run_floe(root: Path, arguments: list[str], log_path: Path) -> tuple[float, float]:
    """Run ``python -m ingest.cli ARGUMENTS`` to the end (stopped with us if we are): its wall and CPU seconds."""
    command = [sys.executable, "-m", "ingest.cli", *arguments]
    cpu = children_cpu_seconds()
    started = time.perf_counter()
    with log_path.open("wb") as output:
        popen = subprocess.Popen(command, env=floe_env(root), cwd=REPO_ROOT, stdout=output, stderr=subprocess.STDOUT)
        process = PROCESSES.add(Stoppable(f"floe {arguments[0]}", popen.pid, signal.SIGTERM, popen))
        try:
            code = popen.wait()
        finally:
            stop_process(process)
    seconds = time.perf_counter() - started
    if code != 0:
        raise RuntimeError(
            f"`floe {' '.join(arguments)}` exited {code}:\n{log_path.read_text(errors='replace')[-3000:]}"
        )
    return seconds, children_cpu_seconds() - cpu


def last_line(log_path: Path) -> str:
    lines = [line.strip() for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else ""


@dataclass(frozen=True)
class Commit:
    written_at: dt.datetime
    message: str
    rows: int


def canary_work() -> int:
    """A fixed piece of single-threaded Python (dict and integer work, about 30 ms here)."""
    table: dict[int, int] = {}
    total = 0
    for number in range(150_000):
        table[number & 4095] = total
        total = (total + number * number) % 1_000_003
    return total + len(table)


class Canary:
    """Times :func:`canary_work` every ``every`` seconds on a thread while the body of a ``with`` runs (this
    process only waits for floe's child then, so the thread has a core of the machine's two to itself), and
    reads the resident memory of this process's children (floe's CLI) at the same moments."""

    def __init__(self, every: float = 5.0) -> None:
        self.every = every
        self.samples: list[tuple[dt.datetime, float]] = []
        self.memory: list[tuple[dt.datetime, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="canary", daemon=True)

    def __enter__(self) -> Canary:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._stop.wait(self.every):
            started = time.perf_counter()
            canary_work()
            now = dt.datetime.now(dt.UTC)
            self.samples.append((now, time.perf_counter() - started))
            resident = 0
            for child in me.children(recursive=True):
                with contextlib.suppress(psutil.Error):  # a child that ended meanwhile
                    resident += child.memory_info().rss
            self.memory.append((now, resident))

    def peak_memory(self, span: tuple[dt.datetime, dt.datetime]) -> int | None:
        """The most resident memory of the children seen within ``span``, in bytes (None: no sample)."""
        inside = [resident for at, resident in self.memory if span[0] <= at <= span[1]]
        return max(inside) if inside else None

    def median_ms(self, span: tuple[dt.datetime, dt.datetime]) -> float | None:
        """The median time of the canary's runs that ended within ``span``, in ms (None: no run did)."""
        inside = [seconds for at, seconds in self.samples if span[0] <= at <= span[1]]
        return statistics.median(inside) * 1000 if inside else None


@dataclass
class BatchRates:
    batches: int
    first_tenth: float
    last_tenth: float
    tenth: int
    commit_span_rate: float
    """Items/s from the commit before the first batch to the last batch's commit (no process start-up)."""
    compactions: int
    compaction_seconds: float
    """Commits of the ``[optimize]`` compaction during the ingest, and the time since the commit before each."""
    first_span: tuple[dt.datetime, dt.datetime] = (dt.datetime.min.replace(tzinfo=dt.UTC),) * 2
    last_span: tuple[dt.datetime, dt.datetime] = (dt.datetime.min.replace(tzinfo=dt.UTC),) * 2
    """From the commit before a tenth's first batch to its last batch's commit."""
    tenths: list[tuple[float, tuple[dt.datetime, dt.datetime]]] = field(default_factory=list)
    """Every tenth's items/s and span, in order (the batches cut into ten runs as equal as they divide)."""


def floe_commits(root: Path) -> list[Commit]:
    from ingest import Repository

    entries = Repository.open(root).log()
    return [Commit(entry.written_at, entry.message, entry.rows_added) for entry in reversed(entries)]


def batch_rates(commits: list[Commit]) -> BatchRates:
    """Items/s of the first and last tenth of the ingest's batches, from the commit times (oldest first).

    A tenth's rate is its rows over the time from the commit before its first
    batch to its last batch's commit, so it includes the reading, validation
    and compactions between those commits: what a user waits for.
    """
    positions = [number for number, commit in enumerate(commits) if BATCH_MESSAGE.search(commit.message)]
    if not positions or positions[0] == 0:
        raise RuntimeError("no ingest batches (or no commit before the first) in the floe log")

    def rate(chosen: list[int]) -> float:
        rows = sum(commits[position].rows for position in chosen)
        seconds = (commits[chosen[-1]].written_at - commits[chosen[0] - 1].written_at).total_seconds()
        return rows / max(seconds, 1e-6)

    def span(chosen: list[int]) -> tuple[dt.datetime, dt.datetime]:
        return commits[chosen[0] - 1].written_at, commits[chosen[-1]].written_at

    tenth = max(1, len(positions) // 10)
    parts = min(10, len(positions))
    cuts = [round(number * len(positions) / parts) for number in range(parts + 1)]
    first, last = positions[0], positions[-1]
    compactions = [
        number
        for number in range(first, last + 1)
        if commits[number].message.startswith("floe optimize") and not BATCH_MESSAGE.search(commits[number].message)
    ]
    return BatchRates(
        batches=len(positions),
        first_tenth=rate(positions[:tenth]),
        last_tenth=rate(positions[-tenth:]),
        tenth=tenth,
        commit_span_rate=rate(positions),
        compactions=len(compactions),
        compaction_seconds=sum(
            (commits[number].written_at - commits[number - 1].written_at).total_seconds() for number in compactions
        ),
        first_span=span(positions[:tenth]),
        last_span=span(positions[-tenth:]),
        tenths=[(rate(positions[start:end]), span(positions[start:end])) for start, end in itertools.pairwise(cuts)],
    )


@dataclass(frozen=True)
class TableFiles:
    files: int
    bytes: int
    rows: int
    parquet_on_disk: int
    parquet_bytes_on_disk: int
    """Every Parquet file under the root, live or replaced (replaced ones stay until ``floe gc``)."""


def table_files(root: Path) -> TableFiles:
    """The live data files of the items table at main (from its scan plan), and the Parquet files on disk."""
    from ingest import Repository

    tasks = list(Repository.open(root).view("main").table.scan().plan_files())
    on_disk = [path.stat().st_size for path in root.rglob("*.parquet")]
    return TableFiles(
        files=len(tasks),
        bytes=sum(task.file.file_size_in_bytes for task in tasks),
        rows=sum(task.file.record_count for task in tasks),
        parquet_on_disk=len(on_disk),
        parquet_bytes_on_disk=sum(on_disk),
    )


# -- pgstac ----------------------------------------------------------------------------------------------------------

# The properties the queries filter and sort by, typed. pgstac knows only id, geometry and datetime until told:
# without this it sorts eo:cloud_cover as text ("10.3" before "2.59"), a wrong answer rather than a slow one.
QUERYABLES = {
    "$schema": "https://json-schema.org/draft/2019-09/schema",
    "type": "object",
    "title": "bench_scale queryables",
    "properties": {
        "eo:cloud_cover": {"type": "number", "minimum": 0, "maximum": 100},
        "platform": {"type": "string"},
        "gsd": {"type": "number"},
    },
}


def load_pgstac(
    pg_env: dict[str, str], postmaster: int, workdir: Path, data: Data, count: int, index_queryables: bool
) -> Load:
    """Migrate, load the collections and the queryables, then time ``pypgstac load items`` (and PostgreSQL's CPU)."""
    pypgstac(pg_env, "migrate")
    pypgstac(pg_env, "load", "collections", str(data.collections_ndjson), "--method", "insert")
    queryables = workdir / "queryables.json"
    queryables.write_bytes(orjson.dumps(QUERYABLES))
    index = ["--index_fields", orjson.dumps(sorted(QUERYABLES["properties"])).decode()] if index_queryables else []
    pypgstac(pg_env, "load_queryables", str(queryables), *index)
    cpu = children_cpu_seconds() + tree_cpu_seconds(postmaster)
    started = time.perf_counter()
    pypgstac(pg_env, "load", "items", str(data.items), "--method", "insert")
    seconds = time.perf_counter() - started
    time.sleep(0.5)  # the loader's backend ends after its client: let the postmaster reap it into its own count
    return Load(count, seconds, children_cpu_seconds() + tree_cpu_seconds(postmaster) - cpu)


# -- the queries -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Query:
    name: str
    body: dict[str, Any]

    @property
    def sorted(self) -> bool:
        return "sortby" in self.body


def cloud_and_platform(cloud_below: float, platform: str) -> dict[str, Any]:
    return {
        "op": "and",
        "args": [
            {"op": "<", "args": [{"property": "eo:cloud_cover"}, cloud_below]},
            {"op": "=", "args": [{"property": "platform"}, platform]},
        ],
    }


def queries(count: int, seed: int) -> list[Query]:
    """The timed searches; their boxes, windows and polygon are fixed (held out), none comes from an item."""
    ids = sorted(np.random.default_rng(seed + 1).choice(count, size=min(50, count), replace=False).tolist())
    # An irregular pentagon over the Alps and the Rhine, counter-clockwise as RFC 7946 asks.
    pentagon = [[5.0, 47.0], [9.0, 46.0], [11.0, 48.5], [8.0, 51.0], [4.5, 50.0], [5.0, 47.0]]
    return [
        Query(
            "Q1 AOI 3°x3° + 3-month window, limit 100",
            {"bbox": [4.0, 45.0, 7.0, 48.0], "datetime": "2023-03-01T00:00:00Z/2023-05-31T23:59:59Z", "limit": 100},
        ),
        Query(
            "Q2 AOI 3°x3° newest 10 (sortby -datetime, all 3 years)",
            {"bbox": [12.0, 41.0, 15.0, 44.0], "sortby": [{"field": "datetime", "direction": "desc"}], "limit": 10},
        ),
        Query(
            "Q3 collection + CQL2 eo:cloud_cover < 10 and platform, sortby -datetime, limit 10",
            {
                "collections": ["bench-b"],
                "filter-lang": "cql2-json",
                "filter": cloud_and_platform(10, "landsat-9"),
                "sortby": [{"field": "datetime", "direction": "desc"}],
                "limit": 10,
            },
        ),
        Query(
            "Q4 collection + CQL2 + 1-month window, sortby eo:cloud_cover, limit 10",
            {
                "collections": ["bench-a"],
                "datetime": "2024-07-01T00:00:00Z/2024-07-31T23:59:59Z",
                "filter-lang": "cql2-json",
                "filter": cloud_and_platform(30, "sentinel-2b"),
                "sortby": [{"field": "eo:cloud_cover", "direction": "asc"}],
                "limit": 10,
            },
        ),
        Query(
            "Q5 intersects a pentagon (~21 sq°) + year 2024, limit 100",
            {
                "intersects": {"type": "Polygon", "coordinates": [pentagon]},
                "datetime": "2024-01-01T00:00:00Z/2024-12-31T23:59:59Z",
                "limit": 100,
            },
        ),
        Query(f"Q6 {len(ids)} ids, limit 100", {"ids": [f"item-{number:09d}" for number in ids], "limit": 100}),
    ]


PAGING_COLLECTION = "bench-c"
PAGING_WINDOW = "2023-01-01T00:00:00Z/2023-12-31T23:59:59Z"


@dataclass
class Side:
    """One server's results: timings per query, the ids it returned last, paging rates."""

    url: str
    timings: dict[str, list[float]] = field(default_factory=dict)
    returned: dict[str, list[str]] = field(default_factory=dict)
    keys: dict[str, list[tuple[Any, ...]]] = field(default_factory=dict)
    """The sort keys of what a sorted query returned last, in order (to tell ties from wrong answers)."""
    paging_rates: list[float] = field(default_factory=list)
    paged_ids: list[str] = field(default_factory=list)


def search_once(client: Any, side: Side, query: Query) -> float:
    started = time.perf_counter()
    response = client.post(f"{side.url}/search", json=query.body)
    milliseconds = (time.perf_counter() - started) * 1000
    if response.status_code != 200:
        raise RuntimeError(f"POST {side.url}/search {query.name} -> {response.status_code}: {response.text[:500]}")
    features = response.json()["features"]
    side.returned[query.name] = [feature["id"] for feature in features]
    if query.sorted:
        side.keys[query.name] = [sort_key(feature, query.body["sortby"]) for feature in features]
    return milliseconds


def sort_key(feature: dict[str, Any], sortby: list[dict[str, str]]) -> tuple[Any, ...]:
    """A returned feature's values of the query's sort fields (``properties.x`` or a top-level member)."""
    values = []
    for entry in sortby:
        name = entry["field"]
        holder = feature.get("properties", {}) if name.startswith("properties.") else feature
        values.append(holder.get(name.removeprefix("properties.")))
    return tuple(values)


def page_through(side: Side, page_size: int, max_items: int, *, record: bool = True) -> None:
    """Follow next links with pystac-client (POST) up to ``max_items`` items; record items/s and the ids."""
    from pystac_client import Client

    client = Client.open(f"{side.url}/")
    search = client.search(
        collections=[PAGING_COLLECTION],
        datetime=PAGING_WINDOW,
        limit=page_size,
        max_items=max_items,
        method="POST",
    )
    started = time.perf_counter()
    ids = [item["id"] for item in search.items_as_dicts()]
    if record:
        side.paging_rates.append(len(ids) / max(time.perf_counter() - started, 1e-9))
        side.paged_ids = ids


def measure(
    sides: dict[str, Side], all_queries: list[Query], warmup: int, repeats: int, page_size: int, paging: tuple[int, int]
) -> None:
    """Time every query on every side, round by round, alternating which side goes first; then page in turn."""
    import httpx

    names = list(sides)
    with contextlib.ExitStack() as stack:
        clients = {name: stack.enter_context(httpx.Client(timeout=600)) for name in names}
        for _ in range(warmup):
            for query in all_queries:
                for name in names:
                    search_once(clients[name], sides[name], query)
        for number in range(repeats):
            order = names if number % 2 == 0 else names[::-1]
            for query in all_queries:
                for name in order:
                    sides[name].timings.setdefault(query.name, []).append(
                        search_once(clients[name], sides[name], query)
                    )
    runs, max_items = paging
    for name in names:  # warm the paging path with one page
        page_through(sides[name], page_size, page_size, record=False)
    for number in range(runs):
        for name in names if number % 2 == 0 else names[::-1]:
            page_through(sides[name], page_size, max_items)


@dataclass
class LoadResult:
    """One server under ``clients`` concurrent clients sending the query mix."""

    searches: int
    seconds: float
    latencies: list[float]

    @property
    def rate(self) -> float:
        return self.searches / self.seconds

    def percentile(self, share: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def load(side: Side, all_queries: list[Query], clients: int, seconds: float) -> LoadResult:
    """``clients`` threads, each with its own connection, sending the queries in turn (each from another one)
    for ``seconds``: every search's milliseconds. One side at a time, so each has the machine to itself."""
    import httpx

    latencies: list[list[float]] = [[] for _ in range(clients)]
    deadline = time.perf_counter() + seconds

    def client(number: int) -> None:
        with httpx.Client(timeout=600) as connection:
            for query in itertools.islice(itertools.cycle(all_queries), number, None):
                if time.perf_counter() >= deadline:
                    return
                scratch = Side(side.url)
                latencies[number].append(search_once(connection, scratch, query))

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(number,)) for number in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [latency for mine in latencies for latency in mine]
    return LoadResult(len(every), time.perf_counter() - started, every)


def load_table(results: dict[str, LoadResult], clients: int, workers: int) -> str:
    floe, pgstac = results["floe"], results["pgstac"]
    rows = [
        f"| {clients} clients, the query mix, {workers} server process(es) each | floe | pgstac | floe / pgstac |",
        "|---|---|---|---|",
        f"| searches/s | {floe.rate:.1f} | {pgstac.rate:.1f} | {floe.rate / pgstac.rate:.2f}x |",
    ]
    for label, share in (("p50 ms", 0.5), ("p99 ms", 0.99)):
        ours, theirs = floe.percentile(share), pgstac.percentile(share)
        rows.append(f"| {label} | {ours:,.0f} | {theirs:,.0f} | {ours / theirs:.2f}x |")
    return "\n".join(rows)


def agreement(
    query: Query,
    floe: list[str],
    pgstac: list[str],
    floe_keys: list[tuple[Any, ...]] | None = None,
    pgstac_keys: list[tuple[Any, ...]] | None = None,
) -> str:
    """Whether both sides returned the same ids: in order for a sorted query, as sets when both returned all.

    Items with equal sort keys come back in an order neither API specifies: a sorted page whose keys are the
    same, in the same order, on both sides is one answer with its ties in another order.
    """
    limit = query.body.get("limit", 10)
    if query.sorted:
        if floe == pgstac:
            return "same ids, same order"
        if floe_keys is not None and floe_keys == pgstac_keys:
            return "same sort keys; tied items in another order"
        return "**differ**"
    if len(floe) < limit and len(pgstac) < limit:
        return "same ids" if set(floe) == set(pgstac) else "**differ**"
    if len(floe) == len(pgstac):
        return "full pages (order not specified)"
    return "**differ in count**"


# -- report ----------------------------------------------------------------------------------------------------------


def ratio(ours: float, theirs: float) -> str:
    return f"{ours / theirs:.2f}x" if theirs else "-"


def search_table(floe: Side, pgstac: Side, all_queries: list[Query], page_size: int, max_items: int) -> str:
    lines = [
        "| query (POST /search) | floe median / p90 (ms) | pgstac median / p90 (ms) | ratio floe/pgstac median "
        "| ratio p90 | returned floe / pgstac | results |",
        "|---|---|---|---|---|---|---|",
    ]
    for query in all_queries:
        ours, theirs = Timing(floe.timings[query.name], 0), Timing(pgstac.timings[query.name], 0)
        ours_ids, their_ids = floe.returned[query.name], pgstac.returned[query.name]
        lines.append(
            f"| {query.name} | {ours.median:.1f} / {ours.p90:.1f} | {theirs.median:.1f} / {theirs.p90:.1f} "
            f"| {ratio(ours.median, theirs.median)} | {ratio(ours.p90, theirs.p90)} "
            f"| {len(ours_ids)} / {len(their_ids)} "
            f"| {agreement(query, ours_ids, their_ids, floe.keys.get(query.name), pgstac.keys.get(query.name))} |"
        )
    ours_rate, their_rate = statistics.median(floe.paging_rates), statistics.median(pgstac.paging_rates)
    same = set(floe.paged_ids) == set(pgstac.paged_ids)
    complete = len(floe.paged_ids) < max_items and len(pgstac.paged_ids) < max_items
    lines.append(
        f"| paging bench-c in 2023 with pystac-client, {page_size} per page, up to {max_items:,} items "
        f"(median of {len(floe.paging_rates)}) | {ours_rate:,.0f} items/s | {their_rate:,.0f} items/s "
        f"| {ratio(ours_rate, their_rate)} (rate) | - | {len(floe.paged_ids):,} / {len(pgstac.paged_ids):,} "
        f"| {'same ids' if same else ('**differ**' if complete else 'first items differ (order not specified)')} |"
    )
    return "\n".join(lines)


def megabytes(count: int) -> str:
    return f"{count / 1e6:,.1f} MB"


def print_report(
    count: int,
    arguments: argparse.Namespace,
    loads: dict[str, Load],
    load_rates: tuple[BatchRates, Canary],
    files: dict[str, TableFiles],
    optimize_line: str,
    searches: dict[str, tuple[Side, Side]],
    all_queries: list[Query],
    phases: dict[str, float],
) -> None:
    rates, canary = load_rates
    print(
        f"\n## bench_scale: {count:,} items, seed {arguments.seed}\n\n"
        f"3 collections, 2022-2024 in file order, footprints {FOOTPRINT_DEGREES[0]}-{FOOTPRINT_DEGREES[1]}°; "
        f"{arguments.repeats} timed rounds after {arguments.warmup} warm-up, each round every query on both "
        "servers in alternating order. Loopback HTTP; absolute times on a shared machine are noise, ratios are "
        "the result.\n"
    )
    print("### Load\n")
    print("| figure | floe | pgstac | ratio floe/pgstac |\n|---|---|---|---|")
    print(
        f"| load, items/s (wall time of the loading process) | {loads['floe'].rate:,.0f} "
        f"(`python -m ingest.cli ingest --workers 0`, defaults) | {loads['pgstac'].rate:,.0f} "
        f"(`pypgstac load items --method insert`; queryables typed, "
        f"{'indexed' if arguments.pgstac_index else 'not indexed'}) "
        f"| {ratio(loads['floe'].rate, loads['pgstac'].rate)} |"
    )
    print(
        f"| load, items per CPU-second (floe: the CLI process; pgstac: pypgstac + PostgreSQL's processes) "
        f"| {loads['floe'].cpu_rate:,.0f} ({loads['floe'].cpu_seconds:,.1f} CPU s) "
        f"| {loads['pgstac'].cpu_rate:,.0f} ({loads['pgstac'].cpu_seconds:,.1f} CPU s) "
        f"| {ratio(loads['floe'].cpu_rate, loads['pgstac'].cpu_rate)} |"
    )
    print(
        f"| floe, first to last batch commit, items/s ({rates.batches} batches; "
        f"{rates.compactions} compaction commits took {rates.compaction_seconds:.1f} s of it) "
        f"| {rates.commit_span_rate:,.0f} | - | - |"
    )
    print(
        f"| floe, last tenth of batches against first tenth ({rates.tenth} batch(es) each), items/s "
        f"| {rates.last_tenth:,.0f} (last) / {rates.first_tenth:,.0f} (first) | - "
        f"| {ratio(rates.last_tenth, rates.first_tenth)} (last/first) |"
    )
    first_ms, last_ms = canary.median_ms(rates.first_span), canary.median_ms(rates.last_span)
    if first_ms is not None and last_ms is not None:
        machine = first_ms / last_ms
        print(
            f"| the machine beside floe's load: canary ({canary.every:.0f} s apart; a fixed Python loop on a thread "
            f"of the waiting benchmark), median ms in the last / first tenth's span | {last_ms:.1f} (last) / "
            f"{first_ms:.1f} (first) | - | {machine:.2f}x (machine speed last/first) |"
        )
        print(
            f"| floe's last/first tenth over the machine's speed last/first | - | - "
            f"| {rates.last_tenth / rates.first_tenth / machine:.2f}x |"
        )
    print("\n### floe's load by tenth of its batches\n")
    print("| tenth | items/s | canary, median ms (lower: a faster machine) | floe CLI resident memory, peak |")
    print("|---|---|---|---|")
    for number, (rate, span) in enumerate(rates.tenths, 1):
        ms, peak = canary.median_ms(span), canary.peak_memory(span)
        print(
            f"| {number} | {rate:,.0f} | {'-' if ms is None else f'{ms:.1f}'} "
            f"| {'-' if peak is None else f'{peak / 2**30:.2f} GiB'} |"
        )
    print("\n### floe's items table at main\n")
    print(
        "| when | live data files | live bytes | rows | Parquet files on disk (incl. replaced) |\n|---|---|---|---|---|"
    )
    for when, found in files.items():
        print(
            f"| {when} | {found.files:,} | {megabytes(found.bytes)} | {found.rows:,} "
            f"| {found.parquet_on_disk:,} ({megabytes(found.parquet_bytes_on_disk)}) |"
        )
    before, after = files["after ingest"], files["after floe optimize"]
    print(
        f"\n`floe optimize` took {phases['floe optimize']:.1f} s: files {ratio(after.files, before.files)}, "
        f"bytes {ratio(after.bytes, before.bytes)} (after/before). It said: {optimize_line}"
    )
    for label, (floe, pgstac) in searches.items():
        print(f"\n### Search, {label}\n")
        print(search_table(floe, pgstac, all_queries, arguments.page_size, arguments.page_items))
    print("\n### Phases\n\n| phase | seconds |\n|---|---|")
    for phase, seconds in phases.items():
        print(f"| {phase} | {seconds:,.1f} |")


# -- the run ---------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def phase(phases: dict[str, float], name: str) -> Iterator[None]:
    log(f"{name} ...")
    started = time.perf_counter()
    yield
    phases[name] = time.perf_counter() - started
    log(f"{name}: {phases[name]:.1f} s")


def stop_process(process: Stoppable) -> None:
    """Stop one process we started, before the end of the run."""
    process.stop()
    with contextlib.suppress(ValueError):  # stop_all took it already
        PROCESSES.started.remove(process)


def run(arguments: argparse.Namespace, workdir: Path) -> None:
    count = arguments.items
    phases: dict[str, float] = {}
    all_queries = queries(count, arguments.seed)
    paging = (arguments.pagination_runs, arguments.page_items)

    with phase(phases, f"generate {count:,} items to NDJSON"):
        data = write_data(workdir, count, arguments.seed)
    log(f"items.ndjson: {megabytes(data.items.stat().st_size)}")

    root = workdir / "floe"
    with phase(phases, "floe ingest (CLI)"), Canary() as canary:
        seconds, cpu_seconds = run_floe(
            root,
            ["ingest", "--workers", "0", *map(str, data.collection_files), str(data.items)],
            workdir / "floe-ingest.log",
        )
    log(last_line(workdir / "floe-ingest.log"))
    loads = {"floe": Load(count, seconds, cpu_seconds)}
    rates = batch_rates(floe_commits(root))
    files = {"after ingest": table_files(root)}
    if files["after ingest"].rows != count:
        raise RuntimeError(f"floe holds {files['after ingest'].rows} rows, not {count}: see floe-ingest.log")

    with phase(phases, "postgres start (initdb)"):
        pg_env = start_postgres(workdir)
        postmaster = next(process.pid for process in PROCESSES.started if process.name == "postgres")
    with phase(phases, "pgstac migrate + pypgstac load"):
        loads["pgstac"] = load_pgstac(pg_env, postmaster, workdir, data, count, arguments.pgstac_index)
    with phase(phases, "serve pgstac (start)"):
        pgstac_url = serve_pgstac(workdir, pg_env, arguments.serve_workers)

    searches: dict[str, tuple[Side, Side]] = {}
    if arguments.before_optimize:
        with phase(phases, "serve floe before optimize (start)"):
            floe_url = serve_floe(workdir, root, arguments.serve_workers)
            floe_server = PROCESSES.started[-1]
        sides = {"floe": Side(floe_url), "pgstac": Side(pgstac_url)}
        with phase(phases, "search, floe before optimize"):
            measure(sides, all_queries, arguments.warmup, arguments.repeats, arguments.page_size, paging)
        searches["floe before `floe optimize`"] = (sides["floe"], sides["pgstac"])
        stop_process(floe_server)

    with phase(phases, "floe optimize"):
        _, optimize_cpu = run_floe(root, ["optimize"], workdir / "floe-optimize.log")
    optimize_line = f"{last_line(workdir / 'floe-optimize.log')} ({optimize_cpu:.1f} CPU s)"
    log(optimize_line)
    files["after floe optimize"] = table_files(root)

    with phase(phases, "serve floe (start)"):
        floe_url = serve_floe(workdir, root, arguments.serve_workers)
    sides = {"floe": Side(floe_url), "pgstac": Side(pgstac_url)}
    with phase(phases, "search, floe after optimize"):
        measure(sides, all_queries, arguments.warmup, arguments.repeats, arguments.page_size, paging)
    searches["floe after `floe optimize`"] = (sides["floe"], sides["pgstac"])
    if arguments.load_clients:
        with phase(phases, "load, each side alone"):
            results = {
                name: load(side, all_queries, arguments.load_clients, arguments.load_seconds)
                for name, side in sides.items()
            }
        print(load_table(results, arguments.load_clients, arguments.serve_workers) + "\n")

    print_report(count, arguments, loads, (rates, canary), files, optimize_line, searches, all_queries, phases)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=10_000_000, help="generated items loaded into each side")
    parser.add_argument("--repeats", type=int, default=20, help="timed rounds (every query on both sides)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated items (and of the ids query)")
    parser.add_argument("--page-size", type=int, default=1000, help="items per page when paging")
    parser.add_argument("--page-items", type=int, default=20_000, help="stop paging after this many items")
    parser.add_argument("--pagination-runs", type=int, default=3, help="paging runs per side (median)")
    parser.add_argument("--before-optimize", action="store_true", help="also time floe's search before `floe optimize`")
    parser.add_argument(
        "--pgstac-index",
        action="store_true",
        help="also index pgstac's queryables (eo:cloud_cover, gsd, platform) before loading items",
    )
    parser.add_argument("--serve-workers", type=int, default=1, help="server processes of each API (default 1)")
    parser.add_argument(
        "--load-clients", type=int, default=0, help="after the timings, this many clients send the query mix at once"
    )
    parser.add_argument("--load-seconds", type=float, default=60.0, help="how long each side is loaded")
    parser.add_argument("--quick", action="store_true", help="20,000 items, 5 repeats, 1 warm-up, 1 paging run")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (data, clusters, logs)")
    arguments = parser.parse_args()
    if arguments.quick:
        arguments.items, arguments.repeats, arguments.warmup, arguments.pagination_runs = 20_000, 5, 1, 1
    if arguments.items < 1 or arguments.repeats < 2:
        parser.error("--items must be positive and --repeats at least 2 (a p90 needs two samples)")

    # A SIGTERM (or SIGHUP) ends the run through the finally below, which stops every server we started.
    for stop in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, lambda number, _frame: sys.exit(128 + number))
    workdir = Path(tempfile.mkdtemp(prefix="floe-bench-scale-"))
    log(f"working in {workdir}")
    try:
        run(arguments, workdir)
    finally:
        PROCESSES.stop_all()
        if arguments.keep:
            log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
