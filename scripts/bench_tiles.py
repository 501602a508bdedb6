"""Map tiles of a release from `floe serve` against titiler over the source COGs (issue 51, item 1).

Run:  .venv/bin/python scripts/bench_tiles.py                 (20 COGs of 2048 px, 500 tiles; ~5 min)
      .venv/bin/python scripts/bench_tiles.py --cogs 4 --requests 100 --data /tmp/bench-tiles

``--cogs`` COGs of 2048 x 2048 uint16 (deflate with predictor, 512 px
blocks, overviews as GDAL's COG driver makes them: what titiler is deployed
over), each on a place of its own in UTM 33N, are copied into a floe
repository by its Ray pipeline at its defaults and tagged ``v1``. Then the
same ``--requests`` PNG tiles (``rescale=0,4000``; zoom 11 to 14, where a web
tile covers 16 to 1 of a COG's 512 px blocks) are asked of:

* **floe**: ``floe serve`` (its default workers, one per core), at
  ``/refs/v1/collections/{c}/items/{id}/tiles/WebMercatorQuad/{z}/{x}/{y}.png``;
* **titiler**: titiler-core's ``TilerFactory`` over the COG files, served by
  uvicorn with one worker per core, at ``/cog/tiles/WebMercatorQuad/{z}/{x}/{y}.png?url=...``.

Each server answers the same list, first by 10 concurrent clients (tiles/s,
p50, p95), then by one client (p50), then by 10 clients again (the second
round: caches warm). Servers listen on 127.0.0.1 and are stopped by their
process ids. Every answer must be a 200 PNG. Printed: a table with the
ratios floe / titiler (the issue's targets: at least 1.5x titiler's tiles/s
with 10 clients, a lone client's p50 at most 50 ms).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import rasterio
from rasterio.transform import from_origin

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ingest import Repository, Settings
from ingest.api import serve_command
from ingest.pipeline import ingest_with_ray, start_ray

SIZE = 2048
RESOLUTION = 10.0
EPSG = 32633
COLLECTION = "bench-tiles"
RESCALE = "0,4000"


def log(message: str) -> None:
    print(f"[bench_tiles {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def origin(index: int) -> tuple[float, float]:
    """Granule ``index``'s top-left corner: a row of places 30 km apart."""
    return 400_000.0 + (index % 5) * 30_000.0, 5_300_000.0 - (index // 5) * 30_000.0


def make_cogs(folder: Path, count: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    rows, cols = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)
    paths = []
    for index in range(count):
        rng = np.random.default_rng(index)
        field = 2000 + 900 * np.sin(rows / 150.0 + index) * np.cos(cols / 210.0 - index)
        data = (field + rng.integers(0, 150, size=field.shape)).astype(np.uint16)
        profile = {
            "driver": "COG",
            "width": SIZE,
            "height": SIZE,
            "count": 1,
            "dtype": "uint16",
            "nodata": 0,
            "crs": f"EPSG:{EPSG}",
            "transform": from_origin(*origin(index), RESOLUTION, RESOLUTION),
            "compress": "deflate",
            "predictor": 2,
            "blocksize": 512,
        }
        path = folder / f"granule-{index:03d}.tif"
        with rasterio.open(path, "w", **profile) as target:
            target.write(data, 1)
        paths.append(path)
    return paths


def items_of(paths: list[Path]) -> list[dict]:
    from rasterio.warp import transform_bounds

    items = []
    for index, path in enumerate(paths):
        with rasterio.open(path) as source:
            west, south, east, north = transform_bounds(source.crs, "EPSG:4326", *source.bounds)
        ring = [[west, south], [east, south], [east, north], [west, north], [west, south]]
        items.append(
            {
                "type": "Feature",
                "stac_version": "1.1.0",
                "stac_extensions": [],
                "id": path.stem,
                "collection": COLLECTION,
                "geometry": {"type": "Polygon", "coordinates": [ring]},
                "bbox": [west, south, east, north],
                "properties": {"datetime": f"2024-05-{1 + index % 28:02d}T10:00:00Z"},
                "assets": {"B04": {"href": str(path), "type": "image/tiff; application=geotiff", "roles": ["data"]}},
                "links": [],
            }
        )
    return items


def tile_list(items: list[dict], count: int) -> list[tuple[str, Path, int, int, int]]:
    """``count`` tiles (item id, COG, z, x, y) inside the granules, zoom 11 to 14, in a fixed random order."""
    import morecantile

    tms = morecantile.tms.get("WebMercatorQuad")
    rng = random.Random(7)
    from rio_tiler.io import Reader

    candidates = []
    for item in items:
        west, south, east, north = item["bbox"]
        path = Path(item["assets"]["B04"]["href"])
        with Reader(str(path)) as reader:  # not the tiles that only touch the granule's edge
            for zoom in (11, 12, 13, 14):
                for tile in tms.tiles(west, south, east, north, [zoom]):
                    if reader.tile_exists(tile.x, tile.y, tile.z):
                        candidates.append((item["id"], path, tile.z, tile.x, tile.y))
    return [rng.choice(candidates) for _ in range(count)]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(url: str, process: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"server exited: {log_path.read_text()[-2000:]}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"server did not start: {log_path.read_text()[-2000:]}")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=5)


def start_floe(root: Path, workdir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    log_path = workdir / "floe-serve.log"
    with log_path.open("w") as out:
        process = subprocess.Popen(
            serve_command(str(root), port, workers=workers), stdout=out, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    wait_for(f"{url}/conformance", process, log_path)
    return process, url


def start_titiler(workdir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    app = workdir / "titiler_app.py"
    app.write_text(
        textwrap.dedent(
            """
            from fastapi import FastAPI
            from titiler.core.factory import TilerFactory

            app = FastAPI()
            app.include_router(TilerFactory().router, prefix="/cog")
            """
        )
    )
    log_path = workdir / "titiler.log"
    command = [
        sys.executable, "-m", "uvicorn", "titiler_app:app", "--host", "127.0.0.1", "--port", str(port),
        "--workers", str(workers), "--log-level", "warning",
    ]  # fmt: skip
    with log_path.open("w") as out:
        process = subprocess.Popen(command, cwd=workdir, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_for(f"{url}/docs", process, log_path)
    return process, url


def floe_url(base: str, tile: tuple[str, Path, int, int, int]) -> str:
    item_id, _, z, x, y = tile
    return (
        f"{base}/refs/v1/collections/{COLLECTION}/items/{item_id}/tiles/WebMercatorQuad/{z}/{x}/{y}.png"
        f"?assets=B04&rescale={RESCALE}"
    )


def titiler_url(base: str, tile: tuple[str, Path, int, int, int]) -> str:
    _, path, z, x, y = tile
    return f"{base}/cog/tiles/WebMercatorQuad/{z}/{x}/{y}.png?url={path}&rescale={RESCALE}"


def run(urls: list[str], clients: int) -> tuple[float, list[float]]:
    """Tiles/s and each request's seconds, ``clients`` at once."""

    def one(client: httpx.Client, url: str) -> float:
        started = time.perf_counter()
        response = client.get(url, timeout=120)
        took = time.perf_counter() - started
        if response.status_code != 200 or not response.content.startswith(b"\x89PNG"):
            raise SystemExit(f"{url}: {response.status_code} {response.text[:300]}")
        return took

    with httpx.Client() as client, ThreadPoolExecutor(clients) as pool:
        started = time.perf_counter()
        seconds = list(pool.map(lambda url: one(client, url), urls))
        elapsed = time.perf_counter() - started
    return len(urls) / elapsed, seconds


def percentile(values: list[float], share: float) -> float:
    return float(np.percentile(values, share * 100))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cogs", type=int, default=20, help="COGs of 2048 x 2048 (20)")
    parser.add_argument("--requests", type=int, default=500, help="tile requests per round (500)")
    parser.add_argument("--lone", type=int, default=100, help="requests of the lone client (100)")
    parser.add_argument("--data", type=Path, help="keep the COGs and the repository here and re-use them")
    arguments = parser.parse_args()
    data = arguments.data or Path(tempfile.mkdtemp(prefix="floe-bench-tiles-"))
    data.mkdir(parents=True, exist_ok=True)
    root, marker = data / "floe", data / f"ready-{arguments.cogs}"
    try:
        if not marker.exists():
            shutil.rmtree(root, ignore_errors=True)
            log(f"writing {arguments.cogs} COGs ...")
            paths = make_cogs(data / "cogs", arguments.cogs)
            items = items_of(paths)
            (data / "items.ndjson").write_text("".join(json.dumps(item) + "\n" for item in items))
            log("floe ingest (Ray, 2 workers, defaults) ...")
            start_ray(2)
            import ray

            repository = Repository.create(root, Settings())
            report = ingest_with_ray(repository, [data / "items.ndjson"], workers=2)
            ray.shutdown()
            if report.rows_added != len(items) or report.rejected:
                raise SystemExit(f"ingest added {report.rows_added}, rejected {report.rejected[:3]}")
            repository.tag("v1")
            marker.write_text("ok\n")
        items = [json.loads(line) for line in (data / "items.ndjson").read_text().splitlines()]
        tiles = tile_list(items, arguments.requests)
        lone = tiles[: arguments.lone]
        results: dict[str, dict[str, float]] = {}
        for name, start, to_url in (
            ("titiler", lambda: start_titiler(data), titiler_url),
            ("floe", lambda: start_floe(root, data), floe_url),
        ):
            log(f"{name}: starting ...")
            process, base = start()
            try:
                urls = [to_url(base, tile) for tile in tiles]
                run(urls[:5], 1)  # each worker imports what it needs
                rate, seconds = run(urls, 10)
                _, alone = run([to_url(base, tile) for tile in lone], 1)
                warm_rate, warm = run(urls, 10)
            finally:
                stop(process)
            results[name] = {
                "rate": rate,
                "p50": percentile(seconds, 0.5),
                "p95": percentile(seconds, 0.95),
                "lone": statistics.median(alone),
                "warm": warm_rate,
                "warm_p50": percentile(warm, 0.5),
            }
            log(f"{name}: {rate:.1f} tiles/s, p50 {results[name]['p50'] * 1000:.0f} ms; lone p50 "
                f"{results[name]['lone'] * 1000:.0f} ms; warm {warm_rate:.1f} tiles/s")  # fmt: skip
    finally:
        if arguments.data is None:
            shutil.rmtree(data, ignore_errors=True)

    floe, titiler = results["floe"], results["titiler"]
    print(
        f"**bench_tiles: {arguments.requests} PNG tiles (zoom 11-14, rescale {RESCALE}) over {arguments.cogs} "
        f"COGs of {SIZE} x {SIZE} uint16; floe serve at a tag against titiler-core over the COGs, one worker a core**\n"
    )
    print("| figure | floe | titiler | floe / titiler |")
    print("|---|---|---|---|")
    ratio = floe["rate"] / titiler["rate"]
    print(f"| 10 clients: tiles/s | {floe['rate']:.1f} | {titiler['rate']:.1f} | **{ratio:.2f}x** |")
    for key, label in (("p50", "10 clients: p50"), ("p95", "10 clients: p95"), ("lone", "one client: p50")):
        print(
            f"| {label} | {floe[key] * 1000:.0f} ms | {titiler[key] * 1000:.0f} ms | {floe[key] / titiler[key]:.2f}x |"
        )
    print(
        f"| second round, 10 clients: tiles/s | {floe['warm']:.1f} | {titiler['warm']:.1f} | "
        f"**{floe['warm'] / titiler['warm']:.2f}x** |"
    )


if __name__ == "__main__":
    main()
