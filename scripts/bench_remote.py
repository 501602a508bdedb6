"""Remote sources benchmark (issue 13): a STAC API search and COGs on S3 behind a 20 ms round trip, one run.

Run:  .venv/bin/python scripts/bench_remote.py                       (100,000 items, 40 granules; minutes)
      .venv/bin/python scripts/bench_remote.py --items 5000 --granules 6   (a smoke run)

1. **Ingest from a STAC API.** ``--items`` generated items (scripts/bench_ingest.py's
   generator) are loaded into a floe repository and served by ``floe serve``.
   The baseline pages the search of all three collections into a list with
   pystac-client (``items_as_dicts``, ``--page-size`` a page); floe ingests
   the same search (``ingest_items`` with a STAC API source, the defaults:
   pages fetched ahead on a thread while batches commit) into a fresh
   repository. Alternating, ``--runs`` each; the median items/s and the ratio
   floe/pystac-client (target: at least 0.8x).
2. **Remote copy.** ``--granules`` COGs (``ingest.sample.make_archive``) and
   their items go to a moto S3 server; every request reaches it through a
   proxy on 127.0.0.1 that holds each request ``--delay-ms`` before passing it
   on (a cloud round trip). The baseline reads the objects one after another
   with rioxarray (GDAL ``/vsis3/`` through the proxy) and writes each into an
   Icechunk repository (``to_zarr``, one commit at the end); floe ingests the
   S3 folder with Ray (``--workers``, ``--remote-assets``; Ray started before
   the clock). Granules/s and MB/s of pixels, and the ratio (target: at
   least 2x, by overlapping requests).

Not measured: ``--virtual`` for remote rasters (not built: remote rasters are
copied), and header reads per second (floe reads no header apart from a copy).

Every server (floe serve, moto, the proxy) listens on 127.0.0.1 and is stopped by its own pid.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_search import (
    PROCESSES,
    REPO_ROOT,
    Stoppable,
    free_port,
    load_floe,
    serve_floe,
    write_data,
)

COLLECTIONS = ("bench-a", "bench-b", "bench-c")


def log(message: str) -> None:
    print(f"[bench_remote {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- the proxy: each request held --delay-ms before it goes on ------------------------------------------------


async def _proxy(listen: int, target: int, delay: float) -> None:
    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, hold: float) -> None:
        try:
            while chunk := await reader.read(65536):
                if hold:
                    await asyncio.sleep(hold)
                writer.write(chunk)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(pipe(client_reader, server_writer, delay), pipe(server_reader, client_writer, 0.0))

    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


def start_proxy(target: int, delay_ms: float) -> int:
    port = free_port()
    command = [sys.executable, __file__, "--proxy", str(port), str(target), str(delay_ms)]
    popen = subprocess.Popen(command, cwd=REPO_ROOT)
    PROCESSES.add(Stoppable("latency proxy", popen.pid, popen=popen))
    deadline = time.monotonic() + 30
    import socket

    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return port
        time.sleep(0.1)
    raise RuntimeError("the latency proxy did not start")


# -- 1. a STAC API search -------------------------------------------------------------------------------------


def bench_api(workdir: Path, count: int, page_size: int, runs: int) -> dict[str, float]:
    from pystac_client import Client

    from ingest import Repository, Settings
    from ingest.pipeline import SearchParameters, SourceOptions, ingest_items

    _items, items_path, _collections, collection_files = write_data(workdir, count)
    root, _rate = load_floe(workdir, items_path, collection_files, count)
    url = serve_floe(workdir, root)
    baseline, ours = [], []
    for run in range(runs):
        started = time.perf_counter()
        listed = list(Client.open(url).search(collections=list(COLLECTIONS), limit=page_size).items_as_dicts())
        baseline.append(len(listed) / (time.perf_counter() - started))
        if len(listed) != count:
            raise RuntimeError(f"pystac-client listed {len(listed)} of {count} items")
        del listed
        target = workdir / f"ingested-{run}"
        repository = Repository.create(target, Settings())
        options = SourceOptions(search=SearchParameters(collections=COLLECTIONS, page_size=page_size))
        started = time.perf_counter()
        report = ingest_items(repository, [url], options=options)
        ours.append(report.rows_added / (time.perf_counter() - started))
        if report.rows_added != count or report.rejected:
            raise RuntimeError(f"floe ingested {report.rows_added} of {count} ({len(report.rejected)} rejected)")
        shutil.rmtree(target)
        log(f"run {run + 1}: pystac-client {baseline[-1]:,.0f} items/s, floe ingest {ours[-1]:,.0f} items/s")
    return {"baseline": statistics.median(baseline), "floe": statistics.median(ours)}


# -- 2. COGs on S3 behind a round trip ------------------------------------------------------------------------


def bench_copy(workdir: Path, granules: int, delay_ms: float, workers: int) -> dict[str, float]:
    import boto3
    import icechunk
    import rioxarray

    from ingest import Repository, Settings
    from ingest.config import S3Settings
    from ingest.pipeline import SourceOptions, ingest_with_ray, start_ray
    from ingest.remote import gdal_options, gdal_path
    from ingest.sample import make_archive

    sys.path.insert(0, str(REPO_ROOT))
    from tests.conftest import MotoServer

    moto = MotoServer()
    PROCESSES.add(Stoppable("moto", moto.process.pid, popen=moto.process))
    proxy = start_proxy(moto.port, delay_ms)
    endpoint = f"http://127.0.0.1:{proxy}"
    archive = workdir / "archive"
    make_archive(archive, granules=granules, seed=5)
    bucket = moto.create_bucket()
    client = boto3.client(
        "s3",
        endpoint_url=moto.endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    cogs = sorted(archive.rglob("*.tif"))
    for path in sorted(archive.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), bucket, f"archive/{path.relative_to(archive).as_posix()}")
    pixel_bytes = sum(int(rioxarray.open_rasterio(path).nbytes) for path in cogs)
    s3 = S3Settings(
        endpoint_url=endpoint,
        region="us-east-1",
        access_key_id="testing",
        secret_access_key="testing",
        allow_http=True,
        force_path_style=True,
    )
    urls = [f"s3://{bucket}/archive/{path.relative_to(archive).as_posix()}" for path in cogs]

    # Baseline: one object after another, rioxarray through the proxy, into Icechunk.
    import rasterio

    repository = icechunk.Repository.create(icechunk.local_filesystem_storage(str(workdir / "baseline")))
    session = repository.writable_session("main")
    started = time.perf_counter()
    # rasterio takes keys only from a session or the environment: the environment, as a user's script would.
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    options = {key: value for key, value in gdal_options(s3).items() if "ACCESS_KEY" not in key}
    with rasterio.Env(**options):
        for number, url in enumerate(urls):
            data = rioxarray.open_rasterio(gdal_path(url)).load()
            data.to_dataset(name="data").to_zarr(session.store, group=f"g{number}", mode="w", consolidated=False)
    session.commit("baseline")
    baseline = time.perf_counter() - started

    start_ray(workers)
    floe = Repository.create(workdir / "floe-copy", Settings(s3=s3))
    started = time.perf_counter()
    report = ingest_with_ray(
        floe, [f"s3://{bucket}/archive/"], workers=workers, options=SourceOptions(remote_assets=True)
    )
    ours = time.perf_counter() - started
    if report.rows_added != granules or report.rejected:
        raise RuntimeError(f"floe copied {report.rows_added} of {granules} ({report.rejected[:3]})")
    return {
        "granules": granules,
        "megabytes": pixel_bytes / 1e6,
        "baseline_s": baseline,
        "floe_s": ours,
    }


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--proxy":
        asyncio.run(_proxy(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]) / 1000))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--page-size", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--granules", type=int, default=40)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--workers", type=int, default=2)
    arguments = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="floe-bench-remote-"))
    os.environ.setdefault("PYTHONPATH", str(REPO_ROOT))
    try:
        api = bench_api(workdir, arguments.items, arguments.page_size, arguments.runs)
        copy = bench_copy(workdir, arguments.granules, arguments.delay_ms, arguments.workers)
    finally:
        PROCESSES.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"## bench_remote: {arguments.items:,} items, {arguments.granules} granules, {arguments.delay_ms:g} ms\n")
    print("| what | floe | baseline | ratio |")
    print("|---|---|---|---|")
    print(
        f"| STAC API search -> repository, items/s (page {arguments.page_size}) | {api['floe']:,.0f} "
        f"| {api['baseline']:,.0f} (pystac-client into a list) | {api['floe'] / api['baseline']:.2f}x |"
    )
    granules, megabytes = copy["granules"], copy["megabytes"]
    print(
        f"| remote copy, granules/s (MB/s of pixels) | {granules / copy['floe_s']:.2f} "
        f"({megabytes / copy['floe_s']:.1f}) | {granules / copy['baseline_s']:.2f} "
        f"({megabytes / copy['baseline_s']:.1f}) (rioxarray, one after another) "
        f"| {copy['baseline_s'] / copy['floe_s']:.2f}x |"
    )


if __name__ == "__main__":
    main()
