"""Remote sources benchmark (issue 13): a STAC API search and COGs on S3 behind a 20 ms round trip, one run.

Run:  .venv/bin/python scripts/bench_remote.py        (100,000 items; 64 scenes of 1024 px, 16 of 4096; ~15 min)
      .venv/bin/python scripts/bench_remote.py --items 5000 --scenes 4 --scene-size 512   (a smoke run)

1. **Ingest from a STAC API.** ``--items`` generated items (scripts/bench_ingest.py's
   generator) are loaded into a floe repository and served by ``floe serve``.
   The baseline pages the search of all three collections into a list with
   pystac-client (``items_as_dicts``, ``--page-size`` a page); floe ingests
   the same search (``ingest_items`` with a STAC API source, the defaults: for an API on 127.0.0.1 one
   search, pages fetched ahead on a thread, then by a page reader process, while batches commit) into a fresh
   repository, then again with ``ingest_with_ray`` (``floe ingest``'s default,
   ``--workers 2``: the driver commits batches of items alone itself, no Ray
   started), then in-process in 3 lanes, one search per collection at once (``remote.search_lanes`` 3, the
   default for an API on another host; one collection is split into intervals of time, a lane for each
   read at once), then as a metadata backfill (``--assets none``: the search's time lanes read and committed
   by 2 Ray actors, issue 52). Alternating, ``--runs`` each; the median items/s and the ratios
   floe/pystac-client (target: at least 0.8x), lanes/one search and backfill/lanes.
   As the COGs of part 2, the API is reached through the latency proxy, each request held 20 ms (a cloud round
   trip: the setting of the issue's targets); then the same comparison with the API reached directly on
   127.0.0.1, where the server, floe's two processes and pystac-client share the two cores and no round trip is
   left to overlap (``--api-delay-ms 20,0``, the default; ``--api-delay-ms 100`` for a far API);
   ``--crowded`` gives the items times that crowd toward the end of the year (as many an instant as the
   square of the time since its start, as in an archive whose missions multiply), where equal intervals of
   time hold unequal work.
2. **Remote copy.** For each ``--scene-size`` (px a side), as many scene
   COGs as ``--scenes`` says (3-band uint16, 512-px deflate tiles, scene
   ``n`` on tile ``n % --grids``, a date each) and their items go to a
   moto S3 server; every request reaches it through a
   proxy on 127.0.0.1 that holds each request ``--delay-ms`` before passing it
   on (a cloud round trip). The baseline reads the objects one after another
   with rioxarray (GDAL ``/vsis3/`` through the proxy) and writes each into an
   Icechunk repository (``to_zarr``, one commit at the end); floe ingests the
   S3 folder with Ray (``--workers``, ``--remote-assets``; a Ray started for
   each run, before the clock, as ``floe ingest`` starts one). Granules/s
   and MB/s of pixels, and the ratio (target: at least 2x, by overlapping
   requests). Small scenes show the round trips; large ones are bound by
   what moto (Python, on the same two cores) serves, about 50 MB/s here.
   ``--raster-runs`` rounds (rioxarray, copy, ``--virtual``, each into a
   fresh repository, GDAL's cache of remote reads emptied before rioxarray's
   turn): a round takes seconds, so the table gives medians and each round's
   ratio. ``--layout fixed`` copies into the fixed layout, whose copy stores
   the COGs' compressed tiles as they are (floe's default, tiled, decodes and
   re-encodes them).

3. **``--virtual``** references the same scenes in place: scenes/s against
   the remote copy (target: at least 10x at scene size).
4. **Header reads per second**: ``rasterio.open`` one object after another,
   against async-tiff opening every header at once (asyncio) and against
   floe's reference planning (HEAD, GDAL header, tile index), 8 on threads as
   an actor plans them.

Every server (floe serve, moto, the proxy) listens on 127.0.0.1 and is stopped by its own pid.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ingest import generated_items
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


def crowded(items: list[dict[str, Any]], seed: int = 1) -> list[dict[str, Any]]:
    """``items`` with times in 2024 whose density grows as the square of the time since the year's start: the last
    third of the year holds 70% of them, the first 4%."""
    from ingest.pipeline.sources._api_lanes import rfc3339

    rng = np.random.default_rng(seed)
    start, year = datetime(2024, 1, 1, tzinfo=UTC), timedelta(days=366)
    for item, share in zip(items, rng.random(len(items)) ** (1 / 3), strict=True):
        when = (start + year * float(share)).replace(microsecond=0)
        item["properties"]["datetime"] = rfc3339(when)
    return items


def bench_api(
    workdir: Path,
    count: int,
    page_size: int,
    runs: int,
    delays_ms: tuple[float, ...] = (0.0,),
    collections: tuple[str, ...] = (),
    *,
    crowd: bool = False,
) -> dict[float, dict[str, Any]]:
    """The medians for each of ``delays_ms`` (0: the API reached directly), against one ``floe serve``."""
    # The generated items are not kept alive through the comparison: neither side needs them.
    written = write_data(workdir, count, crowded(generated_items(count)) if crowd else None)
    items_path, collection_files = written[1], written[3]
    del written
    root, _rate = load_floe(workdir, items_path, collection_files, count)
    direct = serve_floe(workdir, root)
    collections = collections or COLLECTIONS
    medians: dict[float, dict[str, Any]] = {}
    for delay_ms in delays_ms:
        url = direct
        if delay_ms:
            # Both clients reach the API through the proxy (floe serve writes its links from the Host it was asked).
            url = f"http://127.0.0.1:{start_proxy(int(direct.rsplit(':', 1)[1]), delay_ms)}"
            log(f"the API is reached through the proxy at {url}: {delay_ms:g} ms a request")
        else:
            log(f"the API is reached directly at {url}")
        medians[delay_ms] = _compare(workdir, url, count, page_size, runs, collections)
    return medians


def _compare(
    workdir: Path, url: str, count: int, page_size: int, runs: int, collections: tuple[str, ...]
) -> dict[str, Any]:
    """pystac-client and floe's ingests of the search at ``url``, alternating, ``runs`` each: the median items/s,
    and each run's ratio of floe (in process) to pystac-client (``ratios``)."""
    from pystac_client import Client

    from ingest.config import RemoteSettings
    from ingest.pipeline import SearchParameters, SourceOptions, ingest_items, ingest_with_ray

    baseline, ours, defaults, lanes, backfills = [], [], [], [], []
    for run in range(runs):
        started = time.perf_counter()
        listed = list(Client.open(url).search(collections=list(collections), limit=page_size).items_as_dicts())
        baseline.append(len(listed) / (time.perf_counter() - started))
        if len(listed) != count and collections == COLLECTIONS:
            raise RuntimeError(f"pystac-client listed {len(listed)} of {count} items")
        count = len(listed)  # what floe must ingest too
        del listed
        target, search = workdir / f"ingested-{run}", SearchParameters(collections=collections, page_size=page_size)
        in_process = functools.partial(ingest_items, sources=[url], options=SourceOptions(search=search))
        ours.append(_timed_ingest(target, count, "in-process", in_process))
        # What `floe ingest URL` runs by default (--workers 2): the Ray pipeline, whose driver commits batches of
        # items alone itself (Ray is started only for rasters).
        with_ray = functools.partial(ingest_with_ray, sources=[url], workers=2, options=SourceOptions(search=search))
        defaults.append(_timed_ingest(target, count, "Ray", with_ray))
        # One search per collection, three at once (remote.search_lanes 3): what an API on another host gets by
        # default (this one is on 127.0.0.1, the proxy too, so the defaults read the search as one).
        in_lanes = SourceOptions(search=search, remote=RemoteSettings(search_lanes=3))
        in_lanes_ingest = functools.partial(ingest_items, sources=[url], options=in_lanes)
        lanes.append(_timed_ingest(target, count, "in lanes", in_lanes_ingest))
        # A metadata backfill (--assets none): the search's lanes (planned for 4 at once, 2 for each of the 2 actors)
        # read, checked and committed by the actors themselves (Ray's start inside the timing).
        # The API is on 127.0.0.1 here, where a backfill leaves a search to one process unless the lanes are set.
        spread = SourceOptions(search=search, remote=RemoteSettings(search_lanes=4))
        backfill = functools.partial(ingest_with_ray, sources=[url], workers=2, assets="none", options=spread)
        backfills.append(_timed_ingest(target, count, "backfill", backfill))
        log(
            f"run {run + 1}: pystac-client {baseline[-1]:,.0f} items/s, floe ingest {ours[-1]:,.0f} items/s "
            f"(in-process), {defaults[-1]:,.0f} items/s (Ray pipeline, the CLI's default), "
            f"{lanes[-1]:,.0f} items/s (in-process, 3 lanes), {backfills[-1]:,.0f} items/s (backfill, 2 actors)"
        )
    return {
        "baseline": statistics.median(baseline),
        "floe": statistics.median(ours),
        "defaults": statistics.median(defaults),
        "lanes": statistics.median(lanes),
        "backfill": statistics.median(backfills),
        "ratios": [floe / listing for floe, listing in zip(ours, baseline, strict=True)],
    }


def _timed_ingest(target: Path, wanted: int, what: str, ingest: Any) -> float:
    """Items/s of ``ingest(repository)`` into a fresh repository at ``target`` (removed after); it must ingest
    ``wanted`` items and reject none."""
    from ingest import Repository, Settings

    repository = Repository.create(target, Settings())
    started = time.perf_counter()
    report = ingest(repository)
    rate = report.rows_added / (time.perf_counter() - started)
    if report.rows_added != wanted or report.rejected:
        raise RuntimeError(f"floe ({what}) ingested {report.rows_added} of {wanted} ({len(report.rejected)} rejected)")
    shutil.rmtree(target)
    return float(rate)


# -- 2. COGs on S3 behind a round trip ------------------------------------------------------------------------


def write_scenes(workdir: Path, count: int, size: int, grids: int) -> list[Path]:
    """``count`` scene-sized COGs (bench_virtual's: 3-band uint16, band-interleaved, 512-px deflate tiles) and an
    item beside each, in a folder of their own under ``workdir``: scene ``n`` is on tile ``n % grids`` (its pixel
    grid, and a one-degree cell of its own, so Ray routes tiles over the actors) at a date of its own."""
    import json

    from bench_virtual import granule_item, large_granules

    cogs = large_granules(workdir, count, size, grids)
    for number, cog in enumerate(cogs):
        item = granule_item(cog, number)
        tile = number % grids
        west, south = -170.0 + 3 * tile, -60.0 + (tile % 40) * 3
        item["bbox"] = [west, south, west + 0.5, south + 0.5]
        item["geometry"] = {
            "type": "Polygon",
            "coordinates": [
                [[west, south], [west + 0.5, south], [west + 0.5, south + 0.5], [west, south + 0.5], [west, south]]
            ],
        }
        item["assets"]["data"]["href"] = cog.name  # relative: resolved against the item's own URL
        cog.with_suffix(".json").write_text(json.dumps(item))
    return cogs


class _S3Archive:
    """Scenes on a moto S3 server, reached through the latency proxy."""

    def __init__(self, workdir: Path, scenes: int, size: int, delay_ms: float, grids: int) -> None:
        import boto3

        from ingest.config import S3Settings

        sys.path.insert(0, str(REPO_ROOT))
        from tests.conftest import MotoServer

        moto = MotoServer()
        PROCESSES.add(Stoppable("moto", moto.process.pid, popen=moto.process))
        proxy = start_proxy(moto.port, delay_ms)
        self.cogs = write_scenes(workdir, scenes, size, grids)
        folder = self.cogs[0].parent
        self.bucket = moto.create_bucket()
        client = boto3.client(
            "s3",
            endpoint_url=moto.endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        for path in sorted(folder.iterdir()):
            client.upload_file(str(path), self.bucket, f"scenes/{path.name}")
        self.prefix = f"s3://{self.bucket}/scenes/"
        self.urls = [self.prefix + path.name for path in self.cogs]
        self.pixel_bytes = sum(_pixel_bytes(path) for path in self.cogs)
        self.file_bytes = sum(path.stat().st_size for path in self.cogs)
        self.s3 = S3Settings(
            endpoint_url=f"http://127.0.0.1:{proxy}",
            region="us-east-1",
            access_key_id="testing",
            secret_access_key="testing",
            allow_http=True,
            force_path_style=True,
        )


def _pixel_bytes(path: Path) -> int:
    import rioxarray

    with rioxarray.open_rasterio(path) as data:
        return int(data.nbytes)


Layout = Literal["tiled", "fixed"]


def bench_rasters(
    workdir: Path, scenes: int, size: int, delay_ms: float, workers: int, grids: int, runs: int, layout: Layout | None
) -> dict[str, Any]:
    """Remote copy against rioxarray one object after another, and ``--virtual`` against remote copy: ``runs``
    rounds (rioxarray, copy, virtual in each), each into a fresh repository; the median of each and of the
    per-round ratios (a round takes seconds, so one round swings with the machine)."""
    archive = _S3Archive(workdir, scenes, size, delay_ms, grids)
    rounds: list[dict[str, float]] = []
    for run in range(runs):
        folder = workdir / f"round-{run}"
        folder.mkdir()
        rounds.append(_raster_round(archive, folder, workers, scenes, layout))
        log(
            f"round {run + 1}: rioxarray {rounds[-1]['baseline_s']:.1f} s ({rounds[-1]['baseline_busy']:.0%} of the "
            f"CPUs busy), copy {rounds[-1]['copy_s']:.1f} s ({rounds[-1]['copy_busy']:.0%}), "
            f"virtual {rounds[-1]['virtual_s']:.1f} s ({rounds[-1]['virtual_busy']:.0%})"
        )
        shutil.rmtree(folder, ignore_errors=True)
    headers = bench_headers(archive, workdir)
    return {
        "scenes": scenes,
        "megabytes": archive.pixel_bytes / 1e6,
        "file_megabytes": archive.file_bytes / 1e6,
        **{key: statistics.median(entry[key] for entry in rounds) for key in rounds[0]},
        "copy_ratios": [entry["baseline_s"] / entry["copy_s"] for entry in rounds],
        "virtual_ratios": [entry["copy_s"] / entry["virtual_s"] for entry in rounds],
        **headers,
    }


def _cpu_ticks() -> tuple[int, int]:
    """The machine's busy and total CPU ticks so far, every core (``/proc/stat``)."""
    fields = [int(value) for value in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    return sum(fields) - idle, sum(fields)


def _busy_since(start: tuple[int, int]) -> float:
    """The share of the machine's CPU time (every core) that was busy since ``start``: near 1, a phase is bound by
    the cores; well below, by waiting (the round trips)."""
    busy, total = _cpu_ticks()
    return (busy - start[0]) / max(1, total - start[1])


def _forget_gdal_reads() -> None:
    """Empty this process's GDAL caches of remote files (sizes, headers, byte ranges), so each round's rioxarray
    reads the objects as the first did: rasterio has no call for it, so ``VSICurlClearCache`` of its own GDAL."""
    import ctypes

    import rasterio

    libraries = sorted((Path(rasterio.__file__).parent.parent / "rasterio.libs").glob("libgdal-*.so*"))
    if not libraries:
        raise RuntimeError("rasterio's GDAL was not found: later rounds would read from its cache")
    ctypes.CDLL(str(libraries[0])).VSICurlClearCache()


def _raster_round(
    archive: _S3Archive, workdir: Path, workers: int, scenes: int, layout: Layout | None
) -> dict[str, float]:
    """One round: rioxarray one object after another into Icechunk, then floe's remote copy, then ``--virtual``
    (``layout``: the repositories' ``[arrays] layout``; None: floe's default)."""
    import icechunk
    import rasterio
    import ray
    import rioxarray

    from ingest import Repository, Settings
    from ingest.config import ArraysSettings
    from ingest.pipeline import SourceOptions, ingest_with_ray, start_ray
    from ingest.remote import gdal_options, gdal_path

    repository = icechunk.Repository.create(icechunk.local_filesystem_storage(str(workdir / "baseline")))
    session = repository.writable_session("main")
    _forget_gdal_reads()
    ticks = _cpu_ticks()
    started = time.perf_counter()
    # rasterio takes keys only from a session or the environment: the environment, as a user's script would.
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    options = {key: value for key, value in gdal_options(archive.s3).items() if "ACCESS_KEY" not in key}
    with rasterio.Env(**options):
        for number, url in enumerate(archive.urls):
            # Closed as it is read: a file rioxarray leaves open is closed at interpreter exit, which printed an
            # empty "Error in sys.excepthook" for each.
            with rioxarray.open_rasterio(gdal_path(url)) as source:
                data = source.load()
            data.to_dataset(name="data").to_zarr(session.store, group=f"g{number}", mode="w", consolidated=False)
    session.commit("baseline")
    timings = {"baseline_s": time.perf_counter() - started, "baseline_busy": _busy_since(ticks)}
    for mode in ("copy", "virtual"):
        # Each run on a Ray started for it, before the clock, as `floe ingest` starts one: its workers are started
        # with floe imported, so actors are ready in a fraction of a second. (Actors made again on a cluster whose
        # earlier actors were killed wait for new workers: about 1.7 s here.)
        ray.shutdown()
        start_ray(workers)
        arrays = ArraysSettings() if layout is None else ArraysSettings(layout=layout)
        floe = Repository.create(workdir / f"floe-{mode}", Settings(s3=archive.s3, arrays=arrays))
        time.sleep(2)  # the workers Ray starts with the cluster finish importing floe
        ticks = _cpu_ticks()
        started = time.perf_counter()
        report = ingest_with_ray(
            floe,
            [archive.prefix],
            workers=workers,
            virtual=mode == "virtual",
            options=SourceOptions(remote_assets=True),
        )
        timings[f"{mode}_s"] = time.perf_counter() - started
        timings[f"{mode}_busy"] = _busy_since(ticks)
        if report.rows_added != scenes or report.rejected or report.fallbacks:
            raise RuntimeError(
                f"floe {mode}: {report.rows_added} of {scenes} ({report.rejected[:2]}, {report.fallbacks[:2]})"
            )
        if mode == "virtual" and report.virtual != scenes:
            raise RuntimeError(f"floe referenced {report.virtual} of {scenes}")
    ray.shutdown()
    return timings


def bench_headers(archive: _S3Archive, workdir: Path, rounds: int = 4) -> dict[str, float]:
    """Header reads per second: ``rasterio.open`` in a loop, against async-tiff opening every header at once and
    against floe's reference planning (HEAD, header, tile index; 8 on threads, as an actor does)."""
    import asyncio as aio
    from concurrent.futures import ThreadPoolExecutor

    import rasterio
    from async_tiff import TIFF

    from ingest.rasters import plan_references
    from ingest.remote import Stores, gdal_options, gdal_path

    urls = archive.urls * rounds
    options = {key: value for key, value in gdal_options(archive.s3).items() if "ACCESS_KEY" not in key}
    # Every open reads its header again, as distinct objects would: no block cache, no /vsicurl/ region cache.
    options.update(VSI_CACHE="FALSE", CPL_VSIL_CURL_NON_CACHED=f"/vsis3/{archive.bucket}/")
    started = time.perf_counter()
    with rasterio.Env(**options):
        for url in urls:
            with rasterio.open(gdal_path(url)) as dataset:
                dataset.profile  # noqa: B018 - what a header read is for
    rasterio_rate = len(urls) / (time.perf_counter() - started)

    stores = Stores(s3=archive.s3)
    store, _ = stores.locate(archive.urls[0])

    async def open_all() -> None:
        await aio.gather(*(TIFF.open(url.split("/", 3)[3], store=store) for url in urls))

    started = time.perf_counter()
    aio.run(open_all())
    async_rate = len(urls) / (time.perf_counter() - started)

    prefixes = (f"s3://{archive.bucket}/",)
    env = gdal_options(archive.s3)

    def plan(url: str) -> None:  # one Stores for all, as a batch has
        plan_references(None, "bench", {"data": url}, stores=stores, gdal_env=env, prefixes=prefixes)

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(plan, urls))
    floe_rate = len(urls) / (time.perf_counter() - started)
    log(f"headers/s: rasterio {rasterio_rate:.1f}, async-tiff {async_rate:.1f}, floe plans {floe_rate:.1f}")
    return {"headers_rasterio": rasterio_rate, "headers_async_tiff": async_rate, "headers_floe": floe_rate}


def _ratios(values: list[float]) -> str:
    return ", ".join(f"{value:.2f}x" for value in values)


def _numbers[N: (int, float)](text: str, kind: type[N]) -> list[N]:
    return [kind(part) for part in text.split(",") if part.strip()]


def _delays(text: str) -> list[float]:
    return _numbers(text, float)


def _sizes(text: str) -> list[int]:
    return _numbers(text, int)


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--proxy":
        asyncio.run(_proxy(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]) / 1000))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--page-size", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3, help="API ingest runs, alternating with pystac-client")
    parser.add_argument(
        "--raster-runs", type=int, default=3, help="rounds of rioxarray, remote copy and --virtual per scene size"
    )
    parser.add_argument(
        "--scenes", type=_sizes, default=[64, 16], help="scene COGs on S3 for each --scene-size (part 2): 64,16"
    )
    parser.add_argument(
        "--scene-size",
        type=_sizes,
        default=[1024, 4096],
        help="pixels a side of the scenes (3 bands), one set of scenes each: 1024,4096",
    )
    parser.add_argument("--grids", type=int, default=4, help="tiles the scenes are on (scene n on tile n %% grids)")
    parser.add_argument("--delay-ms", type=float, default=20.0, help="the proxy's hold of each S3 request (part 2)")
    parser.add_argument(
        "--api-delay-ms",
        type=_delays,
        default=[20.0, 0.0],
        help="part 1 is measured for each: the STAC API reached through the proxy, each request held this long "
        "(20: a cloud round trip, as the COGs get: the target's setting), or directly (0); default 20,0",
    )
    parser.add_argument(
        "--collections",
        default=",".join(COLLECTIONS),
        help="the collections the search names (part 1; one collection is read in lanes of time)",
    )
    parser.add_argument(
        "--crowded", action="store_true", help="the items' times crowd toward the end of the year (part 1)"
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--layout",
        choices=("tiled", "fixed"),
        default=None,
        help="floe's [arrays] layout for the copies (default: floe's own, tiled; fixed copies COG tiles undecoded)",
    )
    parser.add_argument("--skip-api", action="store_true", help="part 2 only")
    parser.add_argument("--skip-rasters", action="store_true", help="part 1 only")
    arguments = parser.parse_args()
    if len(arguments.scenes) != len(arguments.scene_size):
        parser.error("--scenes and --scene-size need as many numbers each")
    workdir = Path(tempfile.mkdtemp(prefix="floe-bench-remote-"))
    os.environ.setdefault("PYTHONPATH", str(REPO_ROOT))
    try:
        api_medians = (
            None
            if arguments.skip_api
            else bench_api(
                workdir,
                arguments.items,
                arguments.page_size,
                arguments.runs,
                tuple(arguments.api_delay_ms),
                tuple(name for name in arguments.collections.split(",") if name),
                crowd=arguments.crowded,
            )
        )
        sets = []
        for scenes, size in [] if arguments.skip_rasters else zip(arguments.scenes, arguments.scene_size, strict=True):
            folder = workdir / f"scenes-{size}"
            folder.mkdir()
            sets.append(
                (
                    size,
                    bench_rasters(
                        folder,
                        scenes,
                        size,
                        arguments.delay_ms,
                        arguments.workers,
                        arguments.grids,
                        arguments.raster_runs,
                        arguments.layout,
                    ),
                )
            )
    finally:
        PROCESSES.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    crowd = ", crowded in time" if arguments.crowded else ""
    print(
        f"## bench_remote: {'no API part' if arguments.skip_api else f'{arguments.items:,} items{crowd}'}; "
        f"scenes on {arguments.grids} tiles; "
        f"{arguments.delay_ms:g} ms a request; arrays layout {arguments.layout or 'default'}\n"
    )
    print("| what | floe | baseline | ratio |")
    print("|---|---|---|---|")
    for delay_ms, api in (api_medians or {}).items():
        where = (
            f"API behind {delay_ms:g} ms a request" if delay_ms else "API on 127.0.0.1 directly, sharing the 2 cores"
        )
        print(
            f"| STAC API search -> repository, items/s (page {arguments.page_size}; {where}) | {api['floe']:,.0f} "
            f"| {api['baseline']:,.0f} (pystac-client into a list) | {api['floe'] / api['baseline']:.2f}x "
            f"(runs: {_ratios(api['ratios'])}) |"
        )
        print(
            f"| the same, through `floe ingest`'s default Ray pipeline (--workers 2), items/s | "
            f"{api['defaults']:,.0f} | {api['baseline']:,.0f} (pystac-client into a list) | "
            f"{api['defaults'] / api['baseline']:.2f}x |"
        )
        print(
            f"| the same in-process, in 3 lanes at once (remote.search_lanes 3, the default for an API on another "
            f"host; {arguments.collections}), items/s | {api['lanes']:,.0f} | {api['floe']:,.0f} (the search read "
            f"as one, the default on 127.0.0.1) | {api['lanes'] / api['floe']:.2f}x |"
        )
        print(
            f"| the same as a metadata backfill (--assets none --workers 2, remote.search_lanes 4: the lanes read "
            f"and committed by 2 actors; {where}), items/s | {api['backfill']:,.0f} | "
            f"{api['lanes']:,.0f} (in-process, 3 lanes) | {api['backfill'] / api['lanes']:.2f}x |"
        )
        print(
            f"| the same 3 lanes at once against pystac-client ({where}) | {api['lanes']:,.0f} | "
            f"{api['baseline']:,.0f} (pystac-client into a list) | {api['lanes'] / api['baseline']:.2f}x |"
        )
    for size, rasters in sets:
        scenes, megabytes = rasters["scenes"], rasters["megabytes"]
        what = f"{scenes} scenes of 3x{size}x{size} uint16"
        print(
            f"| {what}: remote copy, scenes/s (MB/s of pixels) | {scenes / rasters['copy_s']:.2f} "
            f"({megabytes / rasters['copy_s']:.1f}) | {scenes / rasters['baseline_s']:.2f} "
            f"({megabytes / rasters['baseline_s']:.1f}) (rioxarray, one after another, into Icechunk) "
            f"| {rasters['baseline_s'] / rasters['copy_s']:.2f}x (rounds: {_ratios(rasters['copy_ratios'])}) |"
        )
        print(
            f"| {what}: share of both CPUs busy, remote copy | {rasters['copy_busy']:.0%} "
            f"| {rasters['baseline_busy']:.0%} (rioxarray) | - |"
        )
        print(
            f"| {what}: --virtual, scenes/s | {scenes / rasters['virtual_s']:.2f} | {scenes / rasters['copy_s']:.2f} "
            f"(remote copy) | {rasters['copy_s'] / rasters['virtual_s']:.2f}x "
            f"(rounds: {_ratios(rasters['virtual_ratios'])}) |"
        )
        print(
            f"| {what}: header reads/s, floe's reference plans, 8 threads | {rasters['headers_floe']:.1f} "
            f"| {rasters['headers_rasterio']:.1f} (rasterio.open in a loop) "
            f"| {rasters['headers_floe'] / rasters['headers_rasterio']:.2f}x |"
        )
        print(
            f"| {what}: header reads/s, async-tiff, all at once | {rasters['headers_async_tiff']:.1f} "
            f"| {rasters['headers_rasterio']:.1f} (rasterio.open in a loop) "
            f"| {rasters['headers_async_tiff'] / rasters['headers_rasterio']:.2f}x |"
        )


if __name__ == "__main__":
    main()
