"""Search benchmark: floe's STAC API against pgstac + stac-fastapi-pgstac, the same items, over HTTP, in one run.

Run:  .venv/bin/python scripts/bench_search.py                 (100,000 items; a few minutes)
      .venv/bin/python scripts/bench_search.py --quick         (5,000 items, fewer repeats: a smoke run)
      .venv/bin/python scripts/bench_search.py --pgstac-only   (the peer alone, e.g. without `floe serve`)

Both sides get the same generated items (3 collections, eo:cloud_cover, polygon
footprints; the generator of scripts/bench_ingest.py):

* floe: ``ingest_items`` into a fresh repository, served by ``floe serve``;
* pgstac: PostgreSQL 15 + PostGIS from Debian packages (``postgresql-15-postgis-3``
  is installed with apt-get when missing), a cluster made by ``initdb`` (as the
  ``postgres`` user) in a temporary folder, ``pypgstac migrate`` and
  ``pypgstac load``, served by ``stac-fastapi-pgstac`` under uvicorn.

Every server listens on 127.0.0.1 on a free port and is stopped by its own
process id at the end, also when the run fails. After a warm-up, each query is
sent ``--repeats`` times as POST /search with limit 100:

Q1 bbox + half-year datetime; Q2 one collection; Q3 no filter; Q4 collection +
bbox + datetime + CQL2 ``eo:cloud_cover < 20``; Q5 one id; then a full
pagination of one collection with pystac-client (items/s).

Prints a markdown table: median and p90 per side and the ratio floe/pgstac
(for pagination, items/s and the ratio of rates).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "scripts"))

from bench_ingest import generated_items  # noqa: E402 - the scripts folder is on the path only now

from ingest.api import serve_command  # noqa: E402

PG_BIN = Path("/usr/lib/postgresql/15/bin")
POSTGIS_PACKAGE = "postgresql-15-postgis-3"
COLLECTIONS = ("bench-a", "bench-b", "bench-c")
BBOX = [-10.0, 35.0, 30.0, 60.0]
HALF_YEAR = "2024-01-01T00:00:00Z/2024-06-30T23:59:59Z"
VENV_BIN = Path(sys.executable).parent


def log(message: str) -> None:
    print(f"[bench_search {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# -- processes we start, stopped by pid --------------------------------------------------------------------------


@dataclass
class Stoppable:
    """A process this script started: its pid and the signal that stops it cleanly."""

    name: str
    pid: int
    stop_signal: int = signal.SIGTERM
    popen: subprocess.Popen | None = None

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def stop(self, timeout: float = 30.0) -> None:
        if not self.alive():
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, self.stop_signal)
        deadline = time.monotonic() + timeout
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        if self.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=5)
        log(f"stopped {self.name} (pid {self.pid})")


@dataclass
class Processes:
    started: list[Stoppable] = field(default_factory=list)

    def add(self, process: Stoppable) -> Stoppable:
        self.started.append(process)
        return process

    def stop_all(self) -> None:
        while self.started:
            self.started.pop().stop()


PROCESSES = Processes()
atexit.register(PROCESSES.stop_all)


def wait_http(url: str, process: Stoppable, timeout: float = 120.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process.alive():
            raise RuntimeError(f"{process.name} exited before answering {url}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{process.name} did not answer {url} within {timeout:.0f} s")


def start_server(name: str, command: list[str], env: dict[str, str], port: int, log_path: Path) -> str:
    stream = log_path.open("wb")
    popen = subprocess.Popen(command, env=env, cwd=REPO_ROOT, stdout=stream, stderr=subprocess.STDOUT)
    process = PROCESSES.add(Stoppable(name, popen.pid, signal.SIGTERM, popen))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/", process)
    except RuntimeError:
        log(f"{name} log:\n{log_path.read_text(errors='replace')[-3000:]}")
        raise
    log(f"{name} serving at {url} (pid {popen.pid})")
    return url


# -- the data ------------------------------------------------------------------------------------------------------


def collection_documents(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    documents = []
    for collection in COLLECTIONS:
        members = [item for item in items if item["collection"] == collection]
        times = sorted(item["properties"]["datetime"] for item in members)
        documents.append(
            {
                "type": "Collection",
                "stac_version": "1.0.0",
                "stac_extensions": [],
                "id": collection,
                "description": f"Generated benchmark collection {collection}",
                "license": "other",
                "extent": {
                    "spatial": {
                        "bbox": [
                            [
                                min(item["bbox"][0] for item in members),
                                min(item["bbox"][1] for item in members),
                                max(item["bbox"][2] for item in members),
                                max(item["bbox"][3] for item in members),
                            ]
                        ]
                    },
                    "temporal": {"interval": [[times[0], times[-1]]]},
                },
                "links": [],
            }
        )
    return documents


def write_data(
    workdir: Path, count: int, items: list[dict[str, Any]] | None = None
) -> tuple[list[dict[str, Any]], Path, Path, list[Path]]:
    """``count`` generated items (or ``items``) and their collections, written as NDJSON and collection files."""
    items = generated_items(count) if items is None else items
    items_path = workdir / "items.ndjson"
    items_path.write_text("".join(json.dumps(item) + "\n" for item in items))
    collections = collection_documents(items)
    collections_path = workdir / "collections.ndjson"
    collections_path.write_text("".join(json.dumps(document) + "\n" for document in collections))
    collection_files = []
    for document in collections:
        path = workdir / f"collection-{document['id']}.json"
        path.write_text(json.dumps(document))
        collection_files.append(path)
    return items, items_path, collections_path, collection_files


# -- floe ----------------------------------------------------------------------------------------------------------


def floe_serve_available() -> bool:
    from ingest.cli import app

    names = {command.name or command.callback.__name__ for command in app.registered_commands if command.callback}
    return "serve" in names


def load_floe(workdir: Path, items_path: Path, collection_files: list[Path], count: int) -> tuple[Path, float]:
    from ingest import Repository, Settings
    from ingest.pipeline import ingest_items

    root = workdir / "floe"
    repository = Repository.create(root, Settings())
    started = time.perf_counter()
    report = ingest_items(repository, [*collection_files, items_path], batch_size=25_000, message="bench")
    seconds = time.perf_counter() - started
    if report.rows_added != count or report.rejected:
        raise RuntimeError(f"floe ingest added {report.rows_added} of {count} items ({len(report.rejected)} rejected)")
    return root, count / seconds


def serve_floe(workdir: Path, root: Path, workers: int = 1) -> str:
    port = free_port()
    command = serve_command(str(root), port, workers=workers)
    return start_server("floe serve", command, dict(os.environ), port, workdir / "floe-serve.log")


# -- pgstac --------------------------------------------------------------------------------------------------------


def ensure_postgis() -> None:
    control = Path("/usr/share/postgresql/15/extension/postgis.control")
    if control.exists():
        return
    if os.geteuid() != 0:
        raise RuntimeError(f"PostGIS is missing: install {POSTGIS_PACKAGE} (apt-get needs root)")
    log(f"installing {POSTGIS_PACKAGE} with apt-get")
    subprocess.run(
        ["apt-get", "install", "-y", "--no-install-recommends", POSTGIS_PACKAGE],
        check=True,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        stdout=subprocess.DEVNULL,
    )
    if not control.exists():
        raise RuntimeError(f"{POSTGIS_PACKAGE} installed but {control} is missing")


def as_postgres(command: list[str]) -> list[str]:
    """initdb and postgres refuse to run as root: run them as the postgres user when we are root."""
    if os.geteuid() != 0:
        return command
    return ["runuser", "-u", "postgres", "--", *command]


def start_postgres(workdir: Path) -> dict[str, str]:
    ensure_postgis()
    cluster = workdir / "pg"
    cluster.mkdir()
    if os.geteuid() == 0:
        account = pwd.getpwnam("postgres")
        os.chown(workdir, account.pw_uid, account.pw_gid)  # postgres must reach its data folder
        workdir.chmod(0o755)
        os.chown(cluster, account.pw_uid, account.pw_gid)
    data = cluster / "data"
    subprocess.run(
        as_postgres([str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"]),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    port = free_port()
    with (data / "postgresql.conf").open("a") as conf:
        conf.write(f"\nlisten_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{cluster}'\n")
    subprocess.run(
        as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(cluster / "postgres.log"), "-w", "start"]),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    pid = int((data / "postmaster.pid").read_text().splitlines()[0])
    # SIGINT is PostgreSQL's fast shutdown: the postmaster ends its backends and exits.
    PROCESSES.add(Stoppable("postgres", pid, signal.SIGINT))
    log(f"postgres on 127.0.0.1:{port} (pid {pid})")
    return {
        "PGHOST": "127.0.0.1",
        "PGPORT": str(port),
        "PGUSER": "postgres",
        "PGDATABASE": "postgres",
        "PGPASSWORD": "trust-auth-ignores-it",
    }


def pypgstac(pg_env: dict[str, str], *args: str) -> None:
    executable = VENV_BIN / "pypgstac"
    command = [str(executable)] if executable.exists() else [sys.executable, "-m", "pypgstac.pypgstac"]
    subprocess.run([*command, *args], check=True, env={**os.environ, **pg_env}, stdout=subprocess.DEVNULL)


def load_pgstac(pg_env: dict[str, str], items_path: Path, collections_path: Path, count: int) -> float:
    pypgstac(pg_env, "migrate")
    pypgstac(pg_env, "load", "collections", str(collections_path), "--method", "insert")
    started = time.perf_counter()
    pypgstac(pg_env, "load", "items", str(items_path), "--method", "insert")
    return count / (time.perf_counter() - started)


def serve_pgstac(workdir: Path, pg_env: dict[str, str], workers: int = 1) -> str:
    port = free_port()
    # stac-fastapi-pgstac 7.2 reads PGUSER, PGPASSWORD, PGHOST, PGPORT and PGDATABASE (its PostgresSettings);
    # the password is required even though trust authentication ignores it. All extensions are on by default.
    env = {**os.environ, **pg_env}
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        "stac_fastapi.pgstac.app:create_app",
        "--factory",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--workers",
        str(workers),
    ]
    return start_server("stac-fastapi-pgstac", command, env, port, workdir / "pgstac-serve.log")


# -- timing --------------------------------------------------------------------------------------------------------


def queries(count: int) -> dict[str, dict[str, Any]]:
    return {
        "Q1 bbox + half-year datetime": {"bbox": BBOX, "datetime": HALF_YEAR, "limit": 100},
        "Q2 one collection": {"collections": ["bench-b"], "limit": 100},
        "Q3 no filter": {"limit": 100},
        "Q4 collection + bbox + datetime + CQL2 eo:cloud_cover < 20": {
            "collections": ["bench-a"],
            "bbox": BBOX,
            "datetime": HALF_YEAR,
            "filter-lang": "cql2-json",
            "filter": {"op": "<", "args": [{"property": "eo:cloud_cover"}, 20]},
            "limit": 100,
        },
        "Q5 one id": {"ids": [f"item-{count // 2:07d}"], "limit": 100},
    }


@dataclass
class Timing:
    milliseconds: list[float]
    returned: int

    @property
    def median(self) -> float:
        return statistics.median(self.milliseconds)

    @property
    def p90(self) -> float:
        return statistics.quantiles(self.milliseconds, n=10, method="inclusive")[-1]


def time_query(client: Any, url: str, body: dict[str, Any], warmup: int, repeats: int) -> Timing:
    def once() -> int:
        response = client.post(f"{url}/search", json=body)
        if response.status_code != 200:
            raise RuntimeError(f"POST {url}/search {json.dumps(body)} -> {response.status_code}: {response.text[:500]}")
        return len(response.json()["features"])

    returned = 0
    for _ in range(warmup):
        returned = once()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        once()
        samples.append((time.perf_counter() - started) * 1000)
    return Timing(samples, returned)


def time_pagination(url: str, collection: str, page_size: int, runs: int) -> tuple[float, int]:
    """Median items/s of paging through a whole collection with pystac-client (POST), and the item count."""
    from pystac_client import Client

    rates, total = [], 0
    for _ in range(runs):
        client = Client.open(f"{url}/")
        started = time.perf_counter()
        total = sum(1 for _ in client.search(collections=[collection], limit=page_size, method="POST").items_as_dicts())
        rates.append(total / (time.perf_counter() - started))
    return statistics.median(rates), total


def measure(url: str, count: int, warmup: int, repeats: int, page_size: int, runs: int) -> dict[str, Any]:
    import httpx

    results: dict[str, Any] = {}
    with httpx.Client(timeout=120) as client:
        for name, body in queries(count).items():
            results[name] = time_query(client, url, body, warmup, repeats)
    from pystac_client import Client

    # Warm the pagination path with one page before timing whole runs.
    next(iter(Client.open(f"{url}/").search(collections=["bench-c"], limit=page_size, method="POST").pages()))
    results["pagination"] = time_pagination(url, "bench-c", page_size, runs)
    return results


# -- report --------------------------------------------------------------------------------------------------------


def table(floe: dict[str, Any] | None, pgstac: dict[str, Any], page_size: int) -> str:
    lines = [
        "| query (POST /search, limit 100) | floe median / p90 (ms) | pgstac median / p90 (ms) "
        "| ratio floe/pgstac (median) | items returned floe / pgstac |",
        "|---|---|---|---|---|",
    ]
    for name in [key for key in pgstac if key != "pagination"]:
        peer: Timing = pgstac[name]
        ours: Timing | None = floe[name] if floe else None
        lines.append(
            f"| {name} | "
            + (f"{ours.median:.1f} / {ours.p90:.1f}" if ours else "not run")
            + f" | {peer.median:.1f} / {peer.p90:.1f} | "
            + (f"{ours.median / peer.median:.2f}x" if ours else "-")
            + f" | {ours.returned if ours else '-'} / {peer.returned} |"
        )
    peer_rate, peer_total = pgstac["pagination"]
    if floe:
        our_rate, our_total = floe["pagination"]
        ours_text, ratio, returned = f"{our_rate:,.0f} items/s", f"{our_rate / peer_rate:.2f}x (rate)", our_total
    else:
        ours_text, ratio, returned = "not run", "-", "-"
    lines.append(
        f"| full pagination of bench-c with pystac-client, {page_size} per page | {ours_text} "
        f"| {peer_rate:,.0f} items/s | {ratio} | {returned} / {peer_total} |"
    )
    return "\n".join(lines)


def run(arguments: argparse.Namespace, workdir: Path, with_floe: bool) -> None:
    count = 5_000 if arguments.quick else arguments.items
    repeats = 5 if arguments.quick else arguments.repeats
    runs = 1 if arguments.quick else arguments.pagination_runs
    log(f"generating {count:,} items")
    _, items_path, collections_path, collection_files = write_data(workdir, count)

    floe_root = None
    if with_floe:
        log("loading floe")
        floe_root, floe_load = load_floe(workdir, items_path, collection_files, count)
        log(f"floe loaded {floe_load:,.0f} items/s")
    log("starting postgres + loading pgstac")
    pg_env = start_postgres(workdir)
    pgstac_load = load_pgstac(pg_env, items_path, collections_path, count)
    log(f"pgstac loaded {pgstac_load:,.0f} items/s")

    pgstac_url = serve_pgstac(workdir, pg_env)
    floe_url = serve_floe(workdir, floe_root) if floe_root is not None else None

    log("timing pgstac")
    pgstac = measure(pgstac_url, count, arguments.warmup, repeats, arguments.page_size, runs)
    floe = None
    if floe_url is not None:
        log("timing floe")
        floe = measure(floe_url, count, arguments.warmup, repeats, arguments.page_size, runs)

    print(
        f"\n{count:,} items in {len(COLLECTIONS)} collections; {repeats} timed requests per query after "
        f"{arguments.warmup} warm-up; pagination: median of {runs} run(s).\n"
    )
    print(table(floe, pgstac, arguments.page_size))
    print(
        f"\nload (not a target): pgstac `pypgstac load items --method insert` {pgstac_load:,.0f} items/s"
        + (f"; floe `ingest_items` {floe_load:,.0f} items/s" if with_floe else "")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=100_000, help="generated items loaded into each side")
    parser.add_argument("--quick", action="store_true", help="5,000 items, 5 repeats, 1 pagination run")
    parser.add_argument("--repeats", type=int, default=30, help="timed requests per query")
    parser.add_argument("--warmup", type=int, default=3, help="untimed requests per query first")
    parser.add_argument("--page-size", type=int, default=1000, help="items per page for the pagination run")
    parser.add_argument("--pagination-runs", type=int, default=3, help="full paginations per side (median)")
    parser.add_argument("--pgstac-only", action="store_true", help="measure pgstac alone (no floe serve)")
    parser.add_argument("--workdir", type=Path, help="keep data, clusters and server logs here (default: a temp dir)")
    arguments = parser.parse_args()

    with_floe = not arguments.pgstac_only
    if with_floe and not floe_serve_available():
        parser.error("this checkout has no `floe serve` command yet; run with --pgstac-only to measure pgstac alone")

    cleanup: Callable[[], None] | None = None
    if arguments.workdir is not None:
        arguments.workdir.mkdir(parents=True, exist_ok=False)
        workdir = arguments.workdir
    else:
        workdir = Path(tempfile.mkdtemp(prefix="floe-bench-search-"))
        cleanup = lambda: shutil.rmtree(workdir, ignore_errors=True)  # noqa: E731
    try:
        run(arguments, workdir, with_floe)
    finally:
        PROCESSES.stop_all()
        if cleanup is not None:
            cleanup()


if __name__ == "__main__":
    main()
