"""Virtual ingest benchmark: referencing COGs (``--virtual``) against copying the same granules, in one run.

Run:  .venv/bin/python scripts/bench_virtual.py                   (20 granules of each kind; 1024 and 2048 px)
      .venv/bin/python scripts/bench_virtual.py --granules 12 --sizes 512

Both modes go through floe's own writer (each granule a slice of its grid's
stack, its item staged with it, a commit every 10 granules) on a local
repository; only the raster step differs: ``read_assets`` then
``ingest.pipeline.stage_arrays`` (a copy into tiled stacks) against
``stage_references`` (references into fixed stacks), as ``floe ingest``
does. Two sets of virtualizable granules:

* make_archive's single-band COGs (sample-dem 128x96 float32, sample-landcover
  200x200 uint8): tiny, so fixed per-granule costs dominate both modes;
* band-interleaved 3-band uint16 COGs of each of ``--sizes`` px a side
  (deflate, 512 px tiles), closer to real scenes (a Sentinel-2 band is
  10980 px a side).

Prints a markdown table (granules/s for each mode and the ratio).
``bench_virtual(workdir, granules, sizes)`` returns the rows for
scripts/bench_ingest.py.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import rasterio
from rasterio.transform import from_origin

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ingest import Repository
from ingest.pipeline import stage_arrays
from ingest.pipeline._arrays import stage_references
from ingest.rasters import read_assets
from ingest.sample import make_archive
from ingest.stac import arrays_asset, with_arrays_asset

COMMIT_EVERY = 10


def sample_granules(workdir: Path, granules: int) -> list[Path]:
    """``granules`` virtualizable COGs from make_archive (its optical COGs are pixel-interleaved: left out)."""
    archive = workdir / "archive"
    make_archive(archive, granules=granules * 3 // 2 + 2, seed=5)
    paths = sorted(archive.rglob("sample-dem-*.tif")) + sorted(archive.rglob("sample-landcover-*.tif"))
    return paths[:granules]


def large_granules(workdir: Path, granules: int, size: int, grids: int | None = None) -> list[Path]:
    """Band-interleaved 3-band uint16 COGs, smooth with noise (compresses like imagery); each on a grid of its own,
    or with ``grids``, granule ``n`` on grid ``n % grids`` (a tile seen again on later dates)."""
    folder = workdir / f"large-{size}"
    folder.mkdir()
    rows, cols = np.mgrid[0:size, 0:size]
    paths = []
    for index in range(granules):
        rng = np.random.default_rng(index)
        base = (rows * 3 + cols * 2 + index * 50) % 4000
        data = np.stack([base + rng.integers(0, 200, size=(size, size)) + band * 500 for band in range(3)])
        path = folder / f"scene-{index:04d}.tif"
        profile = {
            "driver": "COG",
            "width": size,
            "height": size,
            "count": 3,
            "dtype": "uint16",
            "crs": "EPSG:32633",
            "transform": from_origin(500_000.0 + (index % (grids or granules)) * size * 10, 6_000_000.0, 10.0, 10.0),
            "compress": "deflate",
            "predictor": 2,
            "blocksize": 512,
            "interleave": "band",
        }
        with rasterio.open(path, "w", **profile) as dst:
            dst.write(data.astype(np.uint16))
        paths.append(path)
    return paths


def granule_item(path: Path, number: int) -> dict:
    """A small valid STAC item for the granule at ``path`` (its arrays are added when staged)."""
    return {
        "type": "Feature",
        "stac_version": "1.0.0",
        "stac_extensions": [],
        "id": path.stem,
        "collection": "bench",
        "geometry": {"type": "Point", "coordinates": [15.0, 54.0]},
        "bbox": [15.0, 54.0, 15.0, 54.0],
        "properties": {"datetime": f"2024-01-01T00:{number // 60 % 60:02d}:{number % 60:02d}Z"},
        "assets": {"data": {"href": str(path), "type": "image/tiff; application=geotiff"}},
        "links": [],
    }


def timed_ingest(root: Path, paths: list[Path], *, virtual: bool) -> float:
    """Seconds to stage and commit ``paths`` (granule and item) through floe's writer."""
    repository = Repository.create(root)
    if virtual:
        repository.allow_virtual_sources(paths)
    settings = repository.settings.arrays
    started = time.perf_counter()
    writer = repository.writer()
    writer.ensure_collection("bench")
    for number, path in enumerate(paths, start=1):
        item = granule_item(path, number)
        if virtual:
            # A NotVirtualizable here is a bench set that is not all virtualizable: fail loudly.
            pixels, _referenced = stage_references(writer, item, {"data": str(path)}, settings)
        else:
            pixels, _written = stage_arrays(writer, item, read_assets({"data": path}), settings)
        writer.add_item(with_arrays_asset(item, arrays_asset(pixels, virtual=virtual)))
        if number % COMMIT_EVERY == 0 or number == len(paths):
            writer.commit(f"batch ending at {number}")
            if number < len(paths):
                writer = repository.writer()
    return time.perf_counter() - started


def compare(workdir: Path, name: str, label: str, paths: list[Path]) -> tuple[str, str, str, str]:
    megabytes = 0.0
    for path in paths:
        with rasterio.open(path) as source:
            megabytes += source.count * source.width * source.height * np.dtype(source.dtypes[0]).itemsize / 1e6
    copy_seconds = timed_ingest(workdir / f"{name}-copy", paths, virtual=False)
    virtual_seconds = timed_ingest(workdir / f"{name}-virtual", paths, virtual=True)
    count = len(paths)
    return (
        f"--virtual against copy, {count} {label} ({megabytes:.0f} MB of pixels) (granules/s)",
        f"{count / virtual_seconds:.1f}",
        f"{count / copy_seconds:.1f} (copy through the same writer)",
        f"{copy_seconds / virtual_seconds:.1f}x",
    )


def bench_virtual(
    workdir: Path, granules: int, sizes: tuple[int, ...] = (1024, 2048)
) -> list[tuple[str, str, str, str]]:
    """Rows (figure, floe, baseline, ratio) for virtual against copy ingest of the same granules."""
    rows = [compare(workdir, "sample", "make_archive single-band COGs", sample_granules(workdir, granules))]
    for size in sizes:
        paths = large_granules(workdir, granules, size)
        rows.append(compare(workdir, f"large-{size}", f"band-interleaved 3x{size}x{size} uint16 COGs", paths))
        shutil.rmtree(paths[0].parent)  # the next size needs the disk space more than this one
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--granules", type=int, default=20, help="granules of each kind (default 20)")
    parser.add_argument(
        "--sizes", default="1024,2048", help="comma-separated sides of the large COGs in px (default 1024,2048)"
    )
    arguments = parser.parse_args()
    sizes = tuple(int(size) for size in arguments.sizes.split(",") if size)
    with tempfile.TemporaryDirectory(prefix="floe-bench-virtual-") as temporary:
        rows = bench_virtual(Path(temporary), arguments.granules, sizes)
    print("| figure | floe --virtual | baseline (same run) | ratio |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
