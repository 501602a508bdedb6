"""Do rows pay as rows? stac-geoparquet's row path and its nested-column shortcut, NDJSON's reader processes, and
a STAC API search's page reader sending rows, each against its fallback.

Run:  .venv/bin/python scripts/bench_rows.py                     (300,000 items, 3 rounds: ~12 min here)
      .venv/bin/python scripts/bench_rows.py --items 50000 --rounds 1 --only ndjson

``scripts/bench_ingest.py``'s generated items, written once by stac-geoparquet's own writer, once as NDJSON and
once as a static STAC API's search pages (1,000 items a page, served by ``tests/_http_server.py`` on 127.0.0.1: a
server that sends files costs the two cores little, so the ingest is what is measured), are ingested by
``ingest_items`` (``floe ingest --workers 0``) at its defaults into a fresh local repository, in a fresh process
each run (``python -c``, never a fork), two arms at a time:

* ``rows``: as shipped, against every row made into an item (``geoparquet_rows`` patched to decline every batch,
  the reader's own fallback: the item path as it was before the row path);
* ``nested``: as shipped, against nested columns made into Python values and typed by the item path's function
  (``nested_as_is`` patched to decline: ``_nested``'s own fallback);
* ``ndjson``: an NDJSON file read as rows by reader processes, against every line read as an item in this
  process (``ndjson_sourced`` patched to what a small stream gets: ``ndjson_items``);
* ``readers``: NDJSON's two reader processes against one;
* ``pages``: a search's page reader laying out the items it accepts as rows, against it sending them as items
  (``page_rows`` patched to None: the reader as it was before). The first 20,000 items are read by the ingest
  itself in both, as items, while the reader starts (``HANDOFF_ITEMS``);
* ``sharing``: the pages' layout shared between the reader and the ingest (``LAYOUT = "shared"``: the ingest lays
  out a page when it waits for pages), against the reader laying out every page (``"reader"``).

ON and OFF alternate round by round (the order flipped every round, so drift on a shared machine touches both
alike); the median of each counts, and ``gain`` is OFF's median time over ON's. The team's rule: a fast path that
makes the run less than 5% faster goes. Every run checks it added every item; nothing asserts on a time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DECLINE = "lambda *args, **kwargs: None"
ITEMS = "lambda stream, label, path=None, **kwargs: ndjson_items(stream, label, path)"

ARMS = {
    "rows": ("parquet", "ingest.pipeline.sources._geoparquet", "geoparquet_rows", DECLINE),
    "nested": ("parquet", "ingest.stac._geoparquet_rows", "nested_as_is", DECLINE),
    "ndjson": ("ndjson", "ingest.pipeline.sources._files", "ndjson_sourced", ITEMS),
    "readers": ("ndjson", "ingest.pipeline.sources._ndjson_rows", "READERS", "1"),
    "pages": ("api", "ingest.pipeline.sources._api", "page_rows", "lambda options: None"),
    "sharing": ("api", "ingest.pipeline.sources._api_reader", "LAYOUT", "'reader'"),
}
"""Each arm: the source it reads, and the name its OFF variant replaces (module, name, the replacement)."""

_CHILD = """
import importlib, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from ingest import Repository, Settings
from ingest.pipeline import ingest_items
from ingest.pipeline.sources._documents import ndjson_items
module, name, variant, source, root, count, off = sys.argv[2:9]
if variant == "off":
    setattr(importlib.import_module(module), name, eval(off))
repository = Repository.create(root, Settings())
started = time.perf_counter()
report = ingest_items(repository, [source if "://" in source else Path(source)])
seconds = time.perf_counter() - started
assert report.rows_added == int(count) and not report.rejected, (report.rows_added, report.rejected[:3])
print(seconds)
"""


def write_sources(workdir: Path, count: int) -> dict[str, Path]:
    """The generated items as a stac-geoparquet file and as an NDJSON file."""
    import pyarrow as pa
    import stac_geoparquet.arrow as sga

    from scripts.bench_ingest import generated_items

    items = generated_items(count)
    table = pa.Table.from_batches(sga.parse_stac_items_to_arrow(items))
    sga.to_parquet(table, workdir / "items.parquet")
    (workdir / "items.ndjson").write_text("".join(json.dumps(item) + "\n" for item in items))
    return {"parquet": workdir / "items.parquet", "ndjson": workdir / "items.ndjson"}


@contextlib.contextmanager
def served_api(folder: Path, items: list[dict]) -> Iterator[str]:
    """``items`` as a static STAC API's search, 1,000 a page, served from ``folder`` by tests/_http_server.py on
    127.0.0.1 (stopped by its pid); yields the API's URL."""
    from tests.pipeline._static_api import write_static_api

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/api"
    write_static_api(folder / "api", url, items, 1000)
    server = subprocess.Popen(
        [sys.executable, "-m", "tests._http_server", str(folder), str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/__stats__", timeout=5).read()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("the static API's server did not start") from None
                time.sleep(0.1)
        yield url
    finally:
        os.kill(server.pid, signal.SIGTERM)
        server.wait(timeout=10)


def run(arm: str, variant: str, source: Path | str, root: Path, count: int) -> float:
    _, module, name, off = ARMS[arm]
    arguments = [str(ROOT), module, name, variant, str(source), str(root), str(count), off]
    done = subprocess.run([sys.executable, "-c", _CHILD, *arguments], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{arm} {variant} failed:\n{done.stderr[-3000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=300_000, help="generated items in the stac-geoparquet file")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each variant, alternating")
    parser.add_argument("--only", default=",".join(ARMS), help="arms to measure, comma-separated")
    arguments = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="floe-bench-rows-") as temporary, contextlib.ExitStack() as servers:
        workdir = Path(temporary)
        sources: dict[str, Path | str] = dict(write_sources(workdir, arguments.items))
        if any(ARMS[arm][0] == "api" for arm in arguments.only.split(",")):
            from scripts.bench_ingest import generated_items

            sources["api"] = servers.enter_context(served_api(workdir, generated_items(arguments.items)))
        for arm in arguments.only.split(","):
            source = sources[ARMS[arm][0]]
            seconds: dict[str, list[float]] = {"on": [], "off": []}
            for round_number in range(arguments.rounds):
                for variant in ("on", "off") if round_number % 2 == 0 else ("off", "on"):
                    root = workdir / f"{arm}-{variant}-{round_number}"
                    seconds[variant].append(run(arm, variant, source, root, arguments.items))
                    print(f"{arm} {variant}: {seconds[variant][-1]:.2f} s", file=sys.stderr, flush=True)
            on, off = statistics.median(seconds["on"]), statistics.median(seconds["off"])
            rounds = ", ".join(f"{a:.2f}/{b:.2f}" for a, b in zip(seconds["on"], seconds["off"], strict=True))
            rows.append((arm, on, off, rounds))
    print(f"{arguments.items:,} items, {arguments.rounds} rounds (median seconds; every round's on/off)")
    print("| arm | on (as shipped) | off (its fallback) | gain off/on | rounds |")
    print("|---|---|---|---|---|")
    for arm, on, off, rounds in rows:
        rate = f"{arguments.items / on:,.0f} / {arguments.items / off:,.0f} items/s"
        print(f"| {arm} | {on:.2f} s | {off:.2f} s | **{off / on:.2f}x** ({rate}) | {rounds} |")


if __name__ == "__main__":
    main()
