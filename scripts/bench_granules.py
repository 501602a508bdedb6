"""Real-sized granules on fixed grids through Ray (issue 12): floe's copies against rioxarray into Icechunk.

Run:  .venv/bin/python scripts/bench_granules.py                        (10,000 granules: ~40 min, ~35 GB of disk)
      .venv/bin/python scripts/bench_granules.py --granules 1000 --files 100      (a few minutes)
      .venv/bin/python scripts/bench_granules.py --quick                           (a smoke run)

The data: ``--files`` distinct COGs, 3x1024x1024 uint16, band-interleaved,
deflate with the horizontal predictor, tiles of 512 px, smooth with noise
(6 bits of noise a pixel; the run prints the bytes each file takes), on ``--grids`` fixed grids (file ``n``
on grid ``n % grids``: a tile seen again on later dates). ``--granules``
STAC items (one NDJSON file) name them in turn: item ``k`` is file
``k % files`` with an id and a datetime of its own. Neither writer can tell
that pixels repeat (Icechunk does not deduplicate chunks), so every granule
costs what a new one would; repeating files only spares the disk.

Measured in one run, one after another (the machine has 2 cores; Ray gets
both, the baseline is one process as it is written):

1. the *ceiling* of a decoding copy: GDAL's decode plus zstd's encode (level
   1, 512 px chunks, floe's codec) of the same files on one core, MB/s of
   pixels;
2. the *baseline*: rioxarray reading each granule and ``to_zarr`` into an
   Icechunk repository, a commit every 10 granules, no floe, over the first
   ``--baseline-granules`` items;
3. floe ``ingest --layout fixed`` through Ray (2 actors, start-up included),
   every granule: a stack per grid, each COG's compressed tiles stored as
   they are (decoded once in memory to check them);
4. floe's default copy (``--layout tiled``: decoded and re-encoded into
   lattice tiles) through Ray over the baseline's items;
5. floe ``--virtual`` through Ray, every granule.

Prints a markdown table: MB/s of pixels (uncompressed: what a user reads
back) and granules/s, each against the baseline or the copy, with ratios.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import rasterio
from rasterio.transform import from_origin

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ingest import Repository, Settings
from ingest.config import ArraysSettings
from ingest.pipeline import ingest_with_ray, start_ray
from scripts.bench_ingest import direct_write_rasters

SIZE = 1024
BANDS = 3
PIXEL_MB = BANDS * SIZE * SIZE * 2 / 1e6


def log(message: str) -> None:
    print(f"[bench_granules {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def make_files(folder: Path, files: int, grids: int) -> list[Path]:
    """``files`` COGs as the module docstring says; file ``n`` on grid ``n % grids``."""
    folder.mkdir(parents=True)
    rows, cols = np.mgrid[0:SIZE, 0:SIZE]
    paths = []
    for index in range(files):
        rng = np.random.default_rng(index)
        base = (rows * 3 + cols * 2 + index * 50) % 4000
        data = np.stack([base + rng.integers(0, 64, size=(SIZE, SIZE)) + band * 500 for band in range(BANDS)])
        grid = index % grids
        profile = {
            "driver": "COG",
            "width": SIZE,
            "height": SIZE,
            "count": BANDS,
            "dtype": "uint16",
            "crs": "EPSG:32633",
            "transform": from_origin(300_000.0 + grid % 10 * SIZE * 10, 5_000_000.0 + grid // 10 * SIZE * 10, 10, 10),
            "compress": "deflate",
            "predictor": 2,
            "blocksize": 512,
            "interleave": "band",
        }
        path = folder / f"file-{index:05d}.tif"
        with rasterio.open(path, "w", **profile) as dst:
            dst.write(data.astype(np.uint16))
        paths.append(path)
    return paths


def write_items(path: Path, files: list[Path], granules: int, grids: int) -> None:
    """``granules`` items, item ``k`` naming file ``k % len(files)``; each grid's items in a one-degree cell of
    their own (Ray routes granules by collection and cell)."""
    with path.open("w") as out:
        for number in range(granules):
            grid = number % len(files) % grids
            lon, lat = 10.5 + grid % 10 * 1.5, 40.5 + grid // 10 * 1.5
            day, second = divmod(number, 86_400)
            item = {
                "type": "Feature",
                "stac_version": "1.0.0",
                "stac_extensions": [],
                "id": f"granule-{number:06d}",
                "collection": "bench",
                "geometry": {"type": "Point", "coordinates": [lon, lat]},
                "bbox": [lon, lat, lon, lat],
                "properties": {
                    "datetime": f"2024-01-{1 + day:02d}T{second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}Z"
                },
                "assets": {
                    "data": {"href": str(files[number % len(files)]), "type": "image/tiff; application=geotiff"}
                },
                "links": [],
            }
            out.write(json.dumps(item) + "\n")


def ceiling(files: list[Path]) -> float:
    """MB/s of pixels that GDAL's decode plus zstd level 1 in 512 px chunks reach on one core."""
    import numcodecs  # zstd level 1 on 512 px chunks: the codec and chunks floe's tiled stacks use

    compressor = numcodecs.Zstd(level=1)
    started = time.perf_counter()
    for path in files:
        with rasterio.open(path) as source:
            pixels = source.read()
        for band in pixels:
            for row in range(0, SIZE, 512):
                for column in range(0, SIZE, 512):
                    compressor.encode(np.ascontiguousarray(band[row : row + 512, column : column + 512]))
    return len(files) * PIXEL_MB / (time.perf_counter() - started)


def floe_run(root: Path, items: Path, expected: int, *, layout: str = "tiled", virtual: bool = False) -> float:
    """Seconds for ``ingest_with_ray`` of ``items`` with 2 actors into a new repository, start-up included."""
    repository = Repository.create(root, Settings(arrays=ArraysSettings(layout=layout)))
    started = time.perf_counter()
    report = ingest_with_ray(repository, [items], workers=2, virtual=virtual)
    seconds = time.perf_counter() - started
    if report.rows_added != expected or report.rejected or (virtual and report.virtual != expected):
        raise SystemExit(f"{root.name}: {report.rows_added} rows, {report.virtual} virtual, {report.rejected[:3]}")
    return seconds


def disk_mb(root: Path) -> float:
    return sum(path.stat().st_size for path in root.rglob("*") if path.is_file()) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--granules", type=int, default=10_000, help="granules (items) to ingest (default 10,000)")
    parser.add_argument("--files", type=int, default=500, help="distinct COG files they name (default 500)")
    parser.add_argument("--grids", type=int, default=50, help="fixed grids the files are on (default 50)")
    parser.add_argument(
        "--baseline-granules", type=int, default=1000, help="items the baseline and the tiled copy ingest (1,000)"
    )
    parser.add_argument("--quick", action="store_true", help="60 granules of 20 files on 5 grids")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    arguments = parser.parse_args()
    if arguments.quick:
        arguments.granules, arguments.files, arguments.grids, arguments.baseline_granules = 60, 20, 5, 20
    granules, sample = arguments.granules, min(arguments.baseline_granules, arguments.granules)
    workdir = Path(tempfile.mkdtemp(prefix="floe-bench-granules-"))
    log(f"working in {workdir}")
    try:
        log(f"{arguments.files} COG files on {arguments.grids} grids ...")
        files = make_files(workdir / "files", arguments.files, arguments.grids)
        source_mb = sum(path.stat().st_size for path in files) / 1e6
        every, first = workdir / "items.ndjson", workdir / "sample.ndjson"
        write_items(every, files, granules, arguments.grids)
        write_items(first, files, sample, arguments.grids)

        log("ceiling: decode + zstd on one core ...")
        ceiling_mb_s = ceiling(files[: min(len(files), 50)])
        log("baseline: rioxarray -> Icechunk ...")
        baseline_seconds = direct_write_rasters(
            workdir / "baseline",
            [("bench", f"granule-{k:06d}", files[k % len(files)]) for k in range(sample)],
        )
        shutil.rmtree(workdir / "baseline")
        start_ray(2)
        import ray

        try:
            time.sleep(5)  # as the CLI reads its sources meanwhile: the workers started with Ray import floe
            log(f"floe --layout fixed (tile copy), {granules:,} granules ...")
            fixed_seconds = floe_run(workdir / "fixed", every, granules, layout="fixed")
            fixed_mb = disk_mb(workdir / "fixed")
            shutil.rmtree(workdir / "fixed")
            log(f"floe --layout tiled (decode and re-encode), {sample:,} granules ...")
            tiled_seconds = floe_run(workdir / "tiled", first, sample)
            shutil.rmtree(workdir / "tiled")
            log(f"floe --virtual, {granules:,} granules ...")
            virtual_seconds = floe_run(workdir / "virtual", every, granules, virtual=True)
        finally:
            ray.shutdown()
    finally:
        if not arguments.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    def rate(count: int, seconds: float) -> str:
        return f"{count * PIXEL_MB / seconds:,.1f} MB/s, {count / seconds:,.1f} granules/s"

    baseline_rate = sample * PIXEL_MB / baseline_seconds
    fixed_rate = granules * PIXEL_MB / fixed_seconds
    tiled_rate = sample * PIXEL_MB / tiled_seconds
    virtual_rate = granules / virtual_seconds
    print(
        f"**bench_granules: {granules:,} granules of {BANDS}x{SIZE}x{SIZE} uint16 ({PIXEL_MB:.1f} MB of pixels each) "
        f"on {arguments.grids} fixed grids, {arguments.files} distinct files ({source_mb / len(files):.2f} MB each "
        f"as stored, deflate + predictor); baseline and tiled copy over the first {sample:,}**\n"
    )
    print("| figure | floe | baseline (same run) | ratio |")
    print("|---|---|---|---|")
    print(
        f"| copy, `--layout fixed` (tiles moved as stored), 2 Ray actors, {granules:,} granules | "
        f"{rate(granules, fixed_seconds)} | {rate(sample, baseline_seconds)} (rioxarray -> Icechunk, one process, "
        f"{sample:,} granules) | {fixed_rate / baseline_rate:.2f}x |"
    )
    print(
        f"| copy, `--layout tiled` (the default: decoded, re-encoded), 2 Ray actors, {sample:,} granules | "
        f"{rate(sample, tiled_seconds)} | {rate(sample, baseline_seconds)} | {tiled_rate / baseline_rate:.2f}x |"
    )
    print(
        f"| ceiling of a decoding copy: GDAL decode + zstd level 1 encode, one core | {ceiling_mb_s:,.1f} MB/s | "
        f"{rate(sample, baseline_seconds)} | {ceiling_mb_s / baseline_rate:.2f}x |"
    )
    print(
        f"| `--virtual`, 2 Ray actors, {granules:,} granules | {virtual_rate:,.1f} granules/s | "
        f"{granules / fixed_seconds:,.1f} granules/s (`--layout fixed` copy); {sample / tiled_seconds:,.1f} "
        f"(`--layout tiled` copy) | {fixed_seconds / virtual_seconds:.2f}x; "
        f"{virtual_rate / (sample / tiled_seconds):.2f}x |"
    )
    print(
        f"\nRepository after the fixed copy: {fixed_mb:,.0f} MB for {granules:,} granules "
        f"({fixed_mb / granules:.2f} MB each; the files hold {source_mb / len(files):.2f} MB each)."
    )


if __name__ == "__main__":
    main()
