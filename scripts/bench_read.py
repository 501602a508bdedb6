"""Pixels of a release against the files: one pixel's time series and a window over every date (issue 51, item 2).

Run:  .venv/bin/python scripts/bench_read.py                     (100 x 2048 px and 1,000 x 512 px; ~10 min)
      .venv/bin/python scripts/bench_read.py --stacks 20x1024 --runs 3 --data /tmp/bench-read

For each stack ``N x S`` (``N`` acquisitions of one ``S`` x ``S`` uint16 tile in
UTM, one band, a COG each: deflate with predictor, 512 px blocks, as Sentinel-2
L2A's are), the COGs are ingested by floe's Ray pipeline at its defaults (a
copy into Icechunk) and then each selection is read by three readers, fresh
each round and in a rotating order:

* **floe**: ``ingest.open_search(root, "main", collections=[...])`` and the
  selection of its one Dataset loaded (the search, the tree and the pixels are
  all timed). floe's chunk cache is emptied before each round, so a round reads
  what a fresh process would (the operating system's page cache is warm for
  every reader alike).
* **rasterio loop**: the COGs opened one after the other and the window read
  from each (the files' paths known beforehand: no search is timed).
* **odc-stac**: ``odc.stac.load`` of the same items on their own grid (dask
  chunks of 512 px, the threaded scheduler), then the selection computed.

The selections: one pixel (its series over every date) and a 512 x 512 window
(not aligned to the blocks, so it overlaps four of them) over every date, at a
place that differs round by round. Every reader's values must equal the
others' exactly, or the script stops. Printed: each reader's median over the
rounds, and floe's time as a share of each baseline (the issue's targets: the
series at most 0.33x the rasterio loop and 0.1x odc-stac; the window at most
0.5x the rasterio loop). A second floe read of the same selection in the same
process (the cache warm) is printed beside.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
from rasterio.transform import from_origin
from rasterio.windows import Window

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ingest import Repository, Settings, open_search
from ingest.pipeline import ingest_with_ray, start_ray

ORIGIN = (500_000.0, 5_200_000.0)
RESOLUTION = 10.0
EPSG = 32633
WINDOW = 512


def log(message: str) -> None:
    print(f"[bench_read {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Stack:
    """``count`` acquisitions of one ``size`` x ``size`` tile."""

    count: int
    size: int

    @property
    def name(self) -> str:
        return f"s{self.count}x{self.size}"

    @classmethod
    def parse(cls, text: str) -> Stack:
        count, size = text.lower().split("x")
        return cls(int(count), int(size))


def make_cogs(folder: Path, stack: Stack) -> list[Path]:
    """The stack's COGs: a smooth field that drifts by date, plus noise (compresses as imagery does)."""
    folder.mkdir(parents=True, exist_ok=True)
    rows, cols = np.mgrid[0 : stack.size, 0 : stack.size].astype(np.float32)
    paths = []
    for index in range(stack.count):
        rng = np.random.default_rng(index)
        field = 2000 + 800 * np.sin(rows / 97.0 + index / 7.0) * np.cos(cols / 131.0 - index / 11.0)
        data = (field + rng.integers(0, 200, size=field.shape)).astype(np.uint16)
        profile = {
            "driver": "COG",
            "width": stack.size,
            "height": stack.size,
            "count": 1,
            "dtype": "uint16",
            "nodata": 0,
            "crs": f"EPSG:{EPSG}",
            "transform": from_origin(*ORIGIN, RESOLUTION, RESOLUTION),
            "compress": "deflate",
            "predictor": 2,
            "blocksize": 512,
        }
        path = folder / f"{stack.name}-{index:05d}.tif"
        with rasterio.open(path, "w", **profile) as target:
            target.write(data, 1)
        paths.append(path)
    return paths


def items_of(stack: Stack, paths: list[Path]) -> list[dict[str, Any]]:
    """One STAC item per COG, with the projection fields odc-stac needs to load without opening the files."""
    from pyproj import Transformer

    to_lonlat = Transformer.from_crs(EPSG, 4326, always_xy=True)
    x0, y0 = ORIGIN
    x1, y1 = x0 + stack.size * RESOLUTION, y0 - stack.size * RESOLUTION
    corners = [to_lonlat.transform(x, y) for x, y in ((x0, y0), (x1, y0), (x1, y1), (x0, y1))]
    lons, lats = [lon for lon, _ in corners], [lat for _, lat in corners]
    items = []
    for index, path in enumerate(paths):
        day = np.datetime64("2024-01-01") + np.timedelta64(index, "D")
        items.append(
            {
                "type": "Feature",
                "stac_version": "1.1.0",
                "stac_extensions": ["https://stac-extensions.github.io/projection/v2.0.0/schema.json"],
                "id": path.stem,
                "collection": stack.name,
                "geometry": {"type": "Polygon", "coordinates": [[list(corner) for corner in [*corners, corners[0]]]]},
                "bbox": [min(lons), min(lats), max(lons), max(lats)],
                "properties": {
                    "datetime": f"{day}T10:00:00Z",
                    "proj:code": f"EPSG:{EPSG}",
                    "proj:shape": [stack.size, stack.size],
                    "proj:transform": [RESOLUTION, 0.0, x0, 0.0, -RESOLUTION, y0],
                },
                "assets": {
                    "B04": {
                        "href": str(path),
                        "type": "image/tiff; application=geotiff; profile=cloud-optimized",
                        "roles": ["data"],
                    }
                },
                "links": [],
            }
        )
    return items


# -- the readers ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """Rows and columns of the stack's grid: one pixel or a window."""

    kind: str
    row: int
    col: int
    height: int
    width: int


def floe_read(root: Path, stack: Stack, selection: Selection) -> np.ndarray:
    tree = open_search(Repository.open(root, Settings()), "main", collections=[stack.name], assets=["B04"])
    (child,) = tree.children.values()
    array = child.ds["B04"].isel(
        band=0,
        y=slice(selection.row, selection.row + selection.height),
        x=slice(selection.col, selection.col + selection.width),
    )
    return np.asarray(array.values)


def rasterio_read(paths: list[Path], selection: Selection) -> np.ndarray:
    window = Window(selection.col, selection.row, selection.width, selection.height)
    out = []
    for path in paths:
        with rasterio.open(path) as source:
            out.append(source.read(1, window=window))
    return np.stack(out)


def odc_read(items: list[Any], stack: Stack, selection: Selection) -> np.ndarray:
    import odc.stac
    from affine import Affine
    from odc.geo.geobox import GeoBox

    geobox = GeoBox(
        (stack.size, stack.size), Affine(RESOLUTION, 0.0, ORIGIN[0], 0.0, -RESOLUTION, ORIGIN[1]), f"EPSG:{EPSG}"
    )
    loaded = odc.stac.load(items, bands=["B04"], geobox=geobox, chunks={"x": 512, "y": 512})
    array = loaded["B04"].isel(
        y=slice(selection.row, selection.row + selection.height),
        x=slice(selection.col, selection.col + selection.width),
    )
    return np.asarray(array.compute(scheduler="threads").values)


def clear_floe_cache() -> None:
    """Empty floe's chunk cache, where this floe has one (so each round reads as a fresh process would)."""
    try:
        from ingest.repository import clear_chunk_cache
    except ImportError:
        return
    clear_chunk_cache()


def selections(stack: Stack, rounds: int) -> list[tuple[Selection, Selection]]:
    """Per round a pixel and a window, at places that differ round by round (and from each other's blocks)."""
    rng = np.random.default_rng(stack.size * 7 + stack.count)
    out = []
    for _ in range(rounds):
        row, col = (int(value) for value in rng.integers(0, stack.size, size=2))
        high = max(stack.size - WINDOW, 0)
        top, left = (int(value) for value in rng.integers(0, high + 1, size=2))
        size = min(WINDOW, stack.size)
        out.append((Selection("pixel", row, col, 1, 1), Selection("window", top, left, size, size)))
    return out


def timed(read: Callable[[], np.ndarray]) -> tuple[float, np.ndarray]:
    started = time.perf_counter()
    values = read()
    return time.perf_counter() - started, values


def measure(root: Path, stack: Stack, paths: list[Path], items: list[Any], rounds: int) -> dict[str, dict[str, float]]:
    """Median seconds per (selection kind, reader)."""
    readers: dict[str, Callable[[Selection], np.ndarray]] = {
        "floe": lambda selection: floe_read(root, stack, selection),
        "rasterio loop": lambda selection: rasterio_read(paths, selection),
        "odc-stac": lambda selection: odc_read(items, stack, selection),
    }
    names = list(readers)
    seconds: dict[str, dict[str, list[float]]] = {"pixel": {}, "window": {}}
    for number, pair in enumerate(selections(stack, rounds)):
        for selection in pair:
            order = names[number % len(names) :] + names[: number % len(names)]
            values = {}
            for name in order:
                if name == "floe":
                    clear_floe_cache()
                took, values[name] = timed(lambda name=name, selection=selection: readers[name](selection))
                seconds[selection.kind].setdefault(name, []).append(took)
            took, again = timed(lambda selection=selection: readers["floe"](selection))
            seconds[selection.kind].setdefault("floe, cache warm", []).append(took)
            expected = values["rasterio loop"]
            for name, got in [*values.items(), ("floe, cache warm", again)]:
                if got.shape != expected.shape or not np.array_equal(got, expected):
                    raise SystemExit(f"{stack.name} {selection}: {name} read other values than the rasterio loop")
            log(
                f"{stack.name} round {number + 1} {selection.kind}: "
                + ", ".join(
                    f"{name} {seconds[selection.kind][name][-1] * 1000:.0f} ms" for name in seconds[selection.kind]
                )
            )
    return {kind: {name: statistics.median(values) for name, values in by.items()} for kind, by in seconds.items()}


def prepare(data: Path, stack: Stack) -> tuple[Path, list[Path], list[dict[str, Any]]]:
    """The stack's COGs, items and floe repository under ``data`` (made once; re-used while its marker is there)."""
    folder = data / stack.name
    marker = folder / "ready"
    items_path = folder / "items.ndjson"
    root = folder / "floe"
    if not marker.exists():
        shutil.rmtree(folder, ignore_errors=True)
        log(f"{stack.name}: writing {stack.count} COGs ...")
        paths = make_cogs(folder / "cogs", stack)
        items = items_of(stack, paths)
        items_path.write_text("".join(json.dumps(item) + "\n" for item in items))
        log(f"{stack.name}: floe ingest (Ray, 2 workers, defaults) ...")
        repository = Repository.create(root, Settings())
        report = ingest_with_ray(repository, [items_path], workers=2)
        if report.rows_added != stack.count or report.rejected:
            raise SystemExit(f"{stack.name}: ingest added {report.rows_added} rows, rejected {report.rejected[:3]}")
        marker.write_text("ok\n")
    items = [json.loads(line) for line in items_path.read_text().splitlines()]
    paths = [Path(item["assets"]["B04"]["href"]) for item in items]
    return root, paths, items


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--stacks", default="100x2048,1000x512", help="stacks as COUNTxSIZE, comma-separated (100x2048,1000x512)"
    )
    parser.add_argument("--runs", type=int, default=3, help="rounds per stack; medians are printed (3)")
    parser.add_argument("--data", type=Path, help="keep the COGs and repositories here and re-use them next time")
    arguments = parser.parse_args()
    stacks = [Stack.parse(text) for text in arguments.stacks.split(",")]
    data = arguments.data or Path(tempfile.mkdtemp(prefix="floe-bench-read-"))
    import pystac
    import ray

    results = []
    try:
        started_ray = False
        prepared = {}
        for stack in stacks:
            if not (data / stack.name / "ready").exists() and not started_ray:
                start_ray(2)
                started_ray = True
            prepared[stack] = prepare(data, stack)
        if started_ray:
            ray.shutdown()
        for stack in stacks:
            root, paths, items = prepared[stack]
            stac_items = [pystac.Item.from_dict(item) for item in items]
            results.append((stack, measure(root, stack, paths, stac_items, arguments.runs)))
    finally:
        if arguments.data is None:
            shutil.rmtree(data, ignore_errors=True)

    print(f"**bench_read: median of {arguments.runs} rounds, each reader fresh, in a rotating order**\n")
    print(
        "| stack | selection | floe | rasterio loop | odc-stac | floe / rasterio | floe / odc-stac | floe, cache warm |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for stack, by_kind in results:
        for kind, medians in by_kind.items():
            floe, loop, odc = medians["floe"], medians["rasterio loop"], medians["odc-stac"]
            label = "one pixel, every date" if kind == "pixel" else f"{WINDOW} x {WINDOW} window, every date"
            print(
                f"| {stack.count} x {stack.size} px | {label} | {floe * 1000:,.0f} ms | {loop * 1000:,.0f} ms | "
                f"{odc * 1000:,.0f} ms | **{floe / loop:.2f}x** | {floe / odc:.2f}x | "
                f"{medians['floe, cache warm'] * 1000:,.0f} ms |"
            )


if __name__ == "__main__":
    main()
