"""Changes benchmark (issue 16): deleting by filter, and POSTing ItemCollections, floe against pgstac, one run.

Run:  .venv/bin/python scripts/bench_changes.py                  (1,000,000 items; about 15 minutes)
      .venv/bin/python scripts/bench_changes.py --items 20000    (a smoke run)

Both sides get the same generated items (scripts/bench_ingest.py's
generator: 3 collections, ``eo:cloud_cover`` uniform in 0-100):

* floe: ``ingest_items`` into a fresh repository, served by
  ``floe serve --transactions`` with a write token;
* pgstac: PostgreSQL 15 + PostGIS, ``pypgstac load`` (and its queryables, so
  ``eo:cloud_cover`` compares as a number), served by stac-fastapi-pgstac with
  its Transactions extension (``ENABLE_TRANSACTIONS_EXTENSIONS=true``).

Timed, in this order:

1. **Delete about 1% by filter** (``eo:cloud_cover < 1``). floe: ``floe delete
   --filter`` (the CLI: choose by the search engine, delete in one commit).
   pgstac, two ways: the ids from its ``/search`` with the same CQL2 filter,
   then one ``DELETE /collections/{c}/items/{id}`` each (what its API offers),
   and, on a second copy of the same rows, one SQL ``DELETE`` (what an operator
   with database access runs). The API is the issue's baseline; the SQL
   figure is printed beside it. Both sides must have deleted the same ids.
2. **POST ItemCollections** of ``--batch`` new items to
   ``/collections/bench-a/items``, ``--posts`` times per side, alternating
   sides. Items/s over all posts, and the median per post.
3. **DELETE one item at a time**: ``--deletes`` items the filter did not
   choose (drawn with a fixed seed), one ``DELETE /collections/{c}/items/{id}``
   each, alternating sides item by item. On floe each is one commit.
   Items/s, and the median per DELETE.

Every server listens on 127.0.0.1 and is stopped by its own pid (bench_search's helpers).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ingest import generated_items
from bench_scale import QUERYABLES
from bench_search import (
    PG_BIN,
    PROCESSES,
    REPO_ROOT,
    as_postgres,
    free_port,
    load_floe,
    load_pgstac,
    log,
    pypgstac,
    start_postgres,
    start_server,
    write_data,
)

from ingest.api import serve_command

TOKEN = "bench-changes-token"
FILTER = "eo:cloud_cover < 1"
FILTER_JSON = {"op": "<", "args": [{"property": "eo:cloud_cover"}, 1]}


def serve_floe_writable(workdir: Path, root: Path) -> str:
    port = free_port()
    command = serve_command(str(root), port, transactions=True)
    env = {**os.environ, "FLOE_API__WRITE_TOKEN": TOKEN}
    return start_server("floe serve --transactions", command, env, port, workdir / "floe-serve.log")


def serve_pgstac_writable(workdir: Path, pg_env: dict[str, str]) -> str:
    """stac-fastapi-pgstac with its Transactions extension (off unless ENABLE_TRANSACTIONS_EXTENSIONS is set)."""
    port = free_port()
    env = {**os.environ, **pg_env, "ENABLE_TRANSACTIONS_EXTENSIONS": "true"}
    command = [sys.executable, "-m", "uvicorn", "stac_fastapi.pgstac.app:create_app", "--factory"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    return start_server("stac-fastapi-pgstac (transactions)", command, env, port, workdir / "pgstac-serve.log")


def floe_cli(root: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "ingest.cli", "--root", str(root), *arguments]
    env = {**os.environ, "COLUMNS": "1000"}  # one summary line, unwrapped
    return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True)


def matching_ids(items: list[dict[str, Any]]) -> set[str]:
    return {item["id"] for item in items if item["properties"]["eo:cloud_cover"] < 1}


def pgstac_ids(client: httpx.Client, url: str) -> list[tuple[str, str]]:
    """The (collection, id) pgstac's search returns for the filter, following its next links (POST or GET)."""
    found: list[tuple[str, str]] = []
    request: tuple[str, str, dict[str, Any] | None] | None = (
        "POST",
        f"{url}/search",
        {"filter": FILTER_JSON, "filter-lang": "cql2-json", "limit": 1000},
    )
    while request is not None:
        method, target, body = request
        answer = client.post(target, json=body) if method == "POST" else client.get(target)
        page = answer.raise_for_status().json()
        found += [(feature["collection"], feature["id"]) for feature in page["features"]]
        following = next((link for link in page.get("links", []) if link.get("rel") == "next"), None)
        request = None
        if following is not None:
            request = (following.get("method", "GET"), following["href"], following.get("body"))
    return found


def pgstac_sql(pg_env: dict[str, str], sql: str) -> str:
    command = as_postgres([str(PG_BIN / "psql"), "-v", "ON_ERROR_STOP=1", "-At", "-c", sql])
    return subprocess.run(command, env={**os.environ, **pg_env}, capture_output=True, text=True, check=True).stdout


def delete_round(workdir: Path, floe_root: Path, pg_env: dict[str, str], pgstac_url: str, expected: set[str]) -> dict:
    figures: dict[str, Any] = {"expected": len(expected)}
    # pgstac, SQL, on a copy of the rows (the API deletes the originals next).
    pgstac_sql(pg_env, "CREATE TABLE pgstac.items_copy AS SELECT * FROM pgstac.items")
    started = time.perf_counter()
    deleted = pgstac_sql(
        pg_env,
        "WITH gone AS (DELETE FROM pgstac.items_copy WHERE (content->'properties'->>'eo:cloud_cover')::float < 1 "
        "RETURNING 1) SELECT count(*) FROM gone",
    )
    figures["pgstac_sql_s"] = time.perf_counter() - started
    figures["pgstac_sql_rows"] = int(deleted.strip())
    pgstac_sql(pg_env, "DROP TABLE pgstac.items_copy")
    # pgstac, its API: search the ids, then DELETE each.
    with httpx.Client(timeout=120) as client:
        started = time.perf_counter()
        keys = pgstac_ids(client, pgstac_url)
        for collection, item_id in keys:
            client.delete(f"{pgstac_url}/collections/{collection}/items/{item_id}").raise_for_status()
        figures["pgstac_api_s"] = time.perf_counter() - started
    figures["pgstac_api_rows"] = len(keys)
    if {item_id for _, item_id in keys} != expected:
        raise RuntimeError(f"pgstac's search chose {len(keys)} items, not the {len(expected)} expected")
    # floe, the CLI.
    started = time.perf_counter()
    answer = floe_cli(floe_root, "delete", "--filter", FILTER, "-m", "bench: delete 1%")
    figures["floe_s"] = time.perf_counter() - started
    figures["floe_said"] = answer.stderr.strip().splitlines()[-1]
    log(f"floe: {figures['floe_said']}")
    from ingest import Repository, Settings

    left = {item["id"] for item in Repository.open(floe_root, Settings()).view().items()}
    if left & expected:
        raise RuntimeError(f"floe left {len(left & expected)} of the items it should have deleted")
    return figures


def post_round(floe_url: str, pgstac_url: str, posts: int, batch: int) -> dict[str, Any]:
    times: dict[str, list[float]] = {"floe": [], "pgstac": []}
    template = generated_items(batch, seed=99)
    with httpx.Client(timeout=600) as client:
        for number in range(posts):
            order = [("floe", floe_url), ("pgstac", pgstac_url)]
            if number % 2:
                order.reverse()
            for side, url in order:
                features = []
                for index, item in enumerate(template):
                    features.append({**item, "id": f"posted-{side}-{number:03d}-{index:05d}", "collection": "bench-a"})
                headers = {"Authorization": f"Bearer {TOKEN}"} if side == "floe" else {}
                started = time.perf_counter()
                answer = client.post(
                    f"{url}/collections/bench-a/items",
                    json={"type": "FeatureCollection", "features": features},
                    headers=headers,
                )
                elapsed = time.perf_counter() - started
                if answer.status_code not in (200, 201):
                    raise RuntimeError(f"{side} answered {answer.status_code}: {answer.text[:500]}")
                times[side].append(elapsed)
    return times


def single_delete_round(floe_url: str, pgstac_url: str, keys: list[tuple[str, str]]) -> dict[str, list[float]]:
    """DELETE each of ``keys`` on both sides, one request at a time, alternating which side goes first."""
    times: dict[str, list[float]] = {"floe": [], "pgstac": []}
    with httpx.Client(timeout=600) as client:
        for number, (collection, item_id) in enumerate(keys):
            order = [("floe", floe_url), ("pgstac", pgstac_url)]
            if number % 2:
                order.reverse()
            for side, url in order:
                headers = {"Authorization": f"Bearer {TOKEN}"} if side == "floe" else {}
                started = time.perf_counter()
                answer = client.delete(f"{url}/collections/{collection}/items/{item_id}", headers=headers)
                elapsed = time.perf_counter() - started
                if answer.status_code not in (200, 204):
                    raise RuntimeError(f"{side} answered {answer.status_code} to DELETE {item_id}: {answer.text[:500]}")
                times[side].append(elapsed)
    return times


def run(arguments: argparse.Namespace, workdir: Path) -> None:
    count = arguments.items
    log(f"generating {count:,} items")
    items, items_path, collections_path, collection_files = write_data(workdir, count)
    expected = matching_ids(items)
    singles = random.Random(7).sample(
        [(item["collection"], item["id"]) for item in items if item["id"] not in expected], arguments.deletes
    )
    del items
    log("loading floe")
    floe_root, floe_load = load_floe(workdir, items_path, collection_files, count)
    log(f"floe loaded {floe_load:,.0f} items/s")
    log("starting postgres + loading pgstac")
    pg_env = start_postgres(workdir)
    pgstac_load = load_pgstac(pg_env, items_path, collections_path, count)
    log(f"pgstac loaded {pgstac_load:,.0f} items/s")
    # Typed, so pgstac compares eo:cloud_cover as a number (not as text).
    queryables = workdir / "queryables.json"
    queryables.write_bytes(orjson.dumps(QUERYABLES))
    pypgstac(pg_env, "load_queryables", str(queryables))
    pgstac_url = serve_pgstac_writable(workdir, pg_env)

    log(f"deleting {len(expected):,} items ({FILTER}) on both sides")
    deletion = delete_round(workdir, floe_root, pg_env, pgstac_url, expected)
    floe_url = serve_floe_writable(workdir, floe_root)
    log(f"posting {arguments.posts} ItemCollections of {arguments.batch:,} items to each side")
    posts = post_round(floe_url, pgstac_url, arguments.posts, arguments.batch)
    log(f"deleting {len(singles)} items one DELETE at a time on each side")
    single = single_delete_round(floe_url, pgstac_url, singles)

    floe_rate = arguments.batch * len(posts["floe"]) / sum(posts["floe"])
    pgstac_rate = arguments.batch * len(posts["pgstac"]) / sum(posts["pgstac"])
    print(f"\n{count:,} items; {len(expected):,} match `{FILTER}`.\n")
    print("| what | floe | pgstac | speed floe/pgstac |")
    print("|---|---|---|---|")
    print(
        f"| delete by filter, seconds | {deletion['floe_s']:.1f} (`floe delete --filter`, one commit) | "
        f"{deletion['pgstac_api_s']:.1f} (search + {deletion['pgstac_api_rows']:,} API DELETEs); "
        f"{deletion['pgstac_sql_s']:.1f} (one SQL DELETE, {deletion['pgstac_sql_rows']:,} rows) | "
        f"{deletion['pgstac_api_s'] / deletion['floe_s']:.2f}x its API; "
        f"{deletion['pgstac_sql_s'] / deletion['floe_s']:.2f}x its SQL |"
    )
    print(
        f"| POST ItemCollection of {arguments.batch:,}, items/s ({arguments.posts} posts each) | {floe_rate:,.0f} | "
        f"{pgstac_rate:,.0f} | {floe_rate / pgstac_rate:.2f}x |"
    )
    print(
        f"| POST ItemCollection, median seconds per post | {statistics.median(posts['floe']):.2f} | "
        f"{statistics.median(posts['pgstac']):.2f} | - |"
    )
    floe_single = len(single["floe"]) / sum(single["floe"])
    pgstac_single = len(single["pgstac"]) / sum(single["pgstac"])
    print(
        f"| DELETE one item per request, items/s ({len(singles)} each) | {floe_single:,.1f} | "
        f"{pgstac_single:,.1f} | {floe_single / pgstac_single:.2f}x |"
    )
    print(
        f"| DELETE one item, median ms per request | {1000 * statistics.median(single['floe']):.0f} | "
        f"{1000 * statistics.median(single['pgstac']):.0f} | - |"
    )
    print(f"\nfloe said: {deletion['floe_said']}")
    print(f"load (not a target): floe {floe_load:,.0f} items/s, pgstac {pgstac_load:,.0f} items/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=1_000_000, help="generated items loaded into each side")
    parser.add_argument("--posts", type=int, default=10, help="ItemCollections POSTed to each side")
    parser.add_argument("--batch", type=int, default=1000, help="items per ItemCollection")
    parser.add_argument("--deletes", type=int, default=100, help="items DELETEd one request at a time on each side")
    parser.add_argument("--workdir", type=Path, help="keep data, clusters and logs here (default: a temp dir)")
    arguments = parser.parse_args()
    if arguments.workdir is not None:
        arguments.workdir.mkdir(parents=True, exist_ok=False)
        workdir, keep = arguments.workdir, True
    else:
        workdir, keep = Path(tempfile.mkdtemp(prefix="floe-bench-changes-")), False
    try:
        run(arguments, workdir)
    finally:
        PROCESSES.stop_all()
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
