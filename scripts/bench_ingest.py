"""Ingest benchmark: floe's pipeline against writing the same data without floe, in one run.

Run:  .venv/bin/python scripts/bench_ingest.py              (100,000 items, 300 small COGs, 120 scenes)
      .venv/bin/python scripts/bench_ingest.py --quick      (a smoke run)

Prints a markdown table; each figure comes with its baseline measured in the
same run and the ratio:

* metadata-only ingest of generated items (items/s) against stac-geoparquet
  writing the same items to one Parquet file;
* issue 52's limits: ``floe ingest --workers 0`` at its defaults from NDJSON
  and from stac-geoparquet, against orjson alone parsing the same lines and
  pyarrow alone reading and rewriting the same file, and each as a metadata
  backfill (``--assets none --workers 2``) against the ``--workers 0`` run
  (``--metadata-only --items 1000000`` runs only these); the stac-geoparquet run
  also against itself with its rows made into items as before the row path, and
  with nested columns made into Python values (``nested_as_is`` off);
* raster ingest in copy mode through Ray (granules/s, MB/s), actor start-up
  included, against writing the same rasters straight into an Icechunk
  repository with rioxarray (no floe); floe and the baseline run alternately
  ``--rounds`` times and the fastest run of each counts (the machine is shared);
* 2 Ray workers against 1, and what starting one actor costs;
* ``--virtual`` (references to the COGs' tiles) against copying the same
  granules through the same writer (scripts/bench_virtual.py), for small
  sample COGs and for 3-band 1024 and 2048 px ones.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ingest import Repository, Settings
from ingest.pipeline import ingest_items, ingest_with_ray, start_ray
from ingest.sample import make_archive
from scripts.bench_virtual import bench_virtual, large_granules


def generated_items(count: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    collections = ["bench-a", "bench-b", "bench-c"]
    items = []
    for index in range(count):
        x, y = float(rng.uniform(-170, 170)), float(rng.uniform(-80, 80))
        month = 1 + index % 12
        items.append(
            {
                "type": "Feature",
                "stac_version": "1.0.0",
                "stac_extensions": ["https://stac-extensions.github.io/eo/v1.1.0/schema.json"],
                "id": f"item-{index:07d}",
                "collection": collections[index % 3],
                "geometry": {
                    "type": "Polygon",
                    "coordinates": [[[x, y], [x + 0.5, y], [x + 0.5, y + 0.5], [x, y + 0.5], [x, y]]],
                },
                "bbox": [x, y, x + 0.5, y + 0.5],
                "properties": {
                    "datetime": f"2024-{month:02d}-{1 + index % 28:02d}T10:00:00Z",
                    "eo:cloud_cover": float(rng.uniform(0, 100)),
                    "platform": "sentinel-2a",
                    "gsd": 10,
                },
                "assets": {"B04": {"href": f"s3://archive/{index}/B04.tif", "type": "image/tiff", "roles": ["data"]}},
                "links": [],
            }
        )
    return items


def bench_metadata(workdir: Path, count: int) -> list[tuple[str, str, str, str]]:
    import pyarrow as pa
    import stac_geoparquet.arrow as sga

    items = generated_items(count)
    source = workdir / "items.ndjson"
    source.write_text("".join(json.dumps(item) + "\n" for item in items))

    started = time.perf_counter()
    table = pa.Table.from_batches(sga.parse_stac_items_to_arrow(items))
    sga.to_parquet(table, workdir / "baseline.parquet")
    baseline = count / (time.perf_counter() - started)
    del items, table

    repository = Repository.create(workdir / "metadata-repo", Settings())
    started = time.perf_counter()
    report = ingest_items(repository, [source], batch_size=25_000)
    floe_rate = count / (time.perf_counter() - started)
    assert report.rows_added == count and not report.rejected
    return [
        (
            f"metadata-only ingest of {count:,} items from NDJSON (items/s, in-process writer)",
            f"{floe_rate:,.0f}",
            f"{baseline:,.0f} (stac-geoparquet to one Parquet file, from dicts)",
            f"{floe_rate / baseline:.2f}x",
        ),
        *bench_limits(workdir, source, workdir / "baseline.parquet", count),
    ]


def bench_limits(
    workdir: Path, ndjson: Path, geoparquet: Path, count: int, workers: int = 2
) -> list[tuple[str, str, str, str]]:
    """Issue 52's rows: ``floe ingest --workers 0`` at its defaults from NDJSON and from stac-geoparquet, each
    against the machine's limit measured in the same run: orjson alone parsing the same lines, and pyarrow
    alone reading the same stac-geoparquet file and writing it again; then each as a metadata backfill with
    ``workers`` Ray actors. The stage budget of each floe run is printed on stderr."""
    import orjson
    import pyarrow.parquet as pq

    from ingest._stages import budget

    started = time.perf_counter()
    with ndjson.open("rb") as lines:
        for line in lines:
            orjson.loads(line)
    parse = time.perf_counter() - started

    started = time.perf_counter()
    pq.write_table(pq.read_table(geoparquet), workdir / "rewritten.parquet", compression="zstd")
    rewrite = time.perf_counter() - started

    rows = []
    for name, path, limit, what in (
        ("NDJSON", ndjson, parse, "orjson alone parsing the same lines"),
        ("stac-geoparquet", geoparquet, rewrite, "pyarrow alone reading the same file and writing it again"),
    ):
        repository = Repository.create(workdir / f"limit-{name}", Settings())
        started = time.perf_counter()
        report = ingest_items(repository, [path])
        seconds = time.perf_counter() - started
        assert report.rows_added == count and not report.rejected, report.rejected[:3]
        print(f"{name}: {budget(report.stages, report.seconds)}", file=sys.stderr)
        rows.append(
            (
                f"metadata-only ingest of {count:,} items from {name}, `--workers 0` at its defaults (items/s; "
                "ratio: times the limit's time)",
                f"{count / seconds:,.0f}",
                f"{count / limit:,.0f} ({what})",
                f"{seconds / limit:.1f}x",
            )
        )
        if name == "stac-geoparquet":
            rows += row_path_rows(workdir, path, count, seconds)
        rows.append(backfill_row(workdir, name, path, count, seconds, workers))
    return rows


def row_path_rows(workdir: Path, path: Path, count: int, rows_seconds: float) -> list[tuple[str, str, str, str]]:
    """The stac-geoparquet run again with its fast paths switched off, each against the run as shipped: every
    row made into an item (the row path off), and every nested column made into values (``nested_as_is`` off)."""
    from unittest import mock

    import ingest.pipeline.sources._geoparquet as geoparquet_source
    import ingest.stac._geoparquet_rows as geoparquet_rows

    figures = []
    for what, target in (
        ("every row made into an item, as before the row path", (geoparquet_source, "geoparquet_rows")),
        ("nested columns made into Python values (`nested_as_is` off)", (geoparquet_rows, "nested_as_is")),
    ):
        repository = Repository.create(workdir / f"off-{target[1]}", Settings())
        with mock.patch.object(*target, lambda *_args, **_kwargs: None):
            started = time.perf_counter()
            report = ingest_items(repository, [path])
            seconds = time.perf_counter() - started
        assert report.rows_added == count and not report.rejected, report.rejected[:3]
        figures.append(
            (
                f"the same stac-geoparquet ingest, {what} (items/s; ratio: its time over the row path's)",
                f"{count / rows_seconds:,.0f}",
                f"{count / seconds:,.0f}",
                f"{seconds / rows_seconds:.2f}x",
            )
        )
    return figures


def backfill_row(
    workdir: Path, name: str, path: Path, count: int, alone: float, workers: int
) -> tuple[str, str, str, str]:
    """The same file as a metadata backfill (``--assets none --workers N``: parts read and committed by Ray actors,
    a local Ray started inside the timing), against the ``--workers 0`` run just measured."""
    from ingest._stages import budget

    repository = Repository.create(workdir / f"backfill-{name}", Settings())
    started = time.perf_counter()
    report = ingest_with_ray(repository, [path], workers=workers, assets="none")
    seconds = time.perf_counter() - started
    assert report.rows_added == count and not report.rejected, report.rejected[:3]
    print(f"{name} backfill: {budget(report.stages, report.seconds)} (summed over actors)", file=sys.stderr)
    return (
        f"the same as a metadata backfill, `--assets none --workers {workers}` (items/s; ratio: speed-up)",
        f"{count / seconds:,.0f}",
        f"{count / alone:,.0f} (`--workers 0`, above)",
        f"{alone / seconds:.2f}x",
    )


def direct_write(root: Path, item_files: list[Path]) -> float:
    """Baseline: rioxarray straight into an Icechunk repository, one commit per 10 granules, no floe."""
    granules = []
    for item_file in item_files:
        item = json.loads(item_file.read_text())
        granules.append((item["collection"], item["id"], item_file.parent / item["assets"]["data"]["href"]))
    return direct_write_rasters(root, granules)


def direct_write_rasters(root: Path, granules: list[tuple[str, str, Path]]) -> float:
    """Baseline: (collection, id, raster) -> rioxarray -> Icechunk, one commit per 10 granules, no floe."""
    import icechunk
    import rioxarray
    import zarr

    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(root)))
    started = time.perf_counter()
    session = repo.writable_session("main")
    for number, (collection, item_id, raster) in enumerate(granules, start=1):
        zarr.open_group(session.store, path=collection, mode="a")
        with rioxarray.open_rasterio(raster) as source:
            data = source.load()
        data.to_dataset(name="data").to_zarr(
            session.store, group=f"{collection}/{item_id}", zarr_format=3, consolidated=False, mode="w"
        )
        if number % 10 == 0:
            session.commit(f"batch {number}")
            session = repo.writable_session("main")
    if session.has_uncommitted_changes:
        session.commit("last")
    return time.perf_counter() - started


def actor_start_seconds(repository: Repository, count: int) -> list[float]:
    """Seconds until each of ``count`` ingest actors, created one after another, is ready.

    The first ones land on the workers Ray started with the cluster, which
    preloaded floe; once those are used up, an actor needs a new worker that
    imports floe first.
    """
    import ray

    from ingest.pipeline._ray import GranuleWriter

    seconds = []
    for _ in range(count):
        started = time.perf_counter()
        actor = ray.remote(num_cpus=1)(GranuleWriter).remote(
            repository.location.url, repository.settings.model_dump(), repository.settings.branch
        )
        ray.get(actor.__ray_ready__.remote())
        seconds.append(time.perf_counter() - started)
        ray.kill(actor)
    return seconds


def ray_ingest_seconds(root: Path, source: Path, workers: int, expected: int, **options: Any) -> float:
    """Seconds for ``ingest_with_ray`` of ``source`` into a new repository, actor start-up included."""
    repository = Repository.create(root, Settings())
    started = time.perf_counter()
    report = ingest_with_ray(repository, [source], workers=workers, batch_size=10, **options)
    seconds = time.perf_counter() - started
    assert report.rows_added == expected and not report.rejected, report.rejected
    return seconds


def bench_rasters(workdir: Path, granules: int, scene_count: int, rounds: int) -> list[tuple[str, str, str, str]]:
    """Copy-mode rows; floe and its baseline run alternately ``rounds`` times and the fastest of each counts."""
    archive = workdir / "archive"
    item_files = make_archive(archive, granules=granules, seed=1)
    megabytes = 0.0
    for item_file in item_files:
        import rasterio

        item = json.loads(item_file.read_text())
        with rasterio.open(item_file.parent / item["assets"]["data"]["href"]) as source:
            megabytes += source.count * source.width * source.height * np.dtype(source.dtypes[0]).itemsize / 1e6
    (workdir / "scenes").mkdir()
    scenes = large_granules(workdir / "scenes", scene_count, 1024)
    scene_megabytes = sum(3 * 1024 * 1024 * 2 / 1e6 for _ in scenes)

    import ray

    start_ray(2)
    direct: dict[str, list[float]] = {"tiny": [], "scenes": []}
    floe: dict[str, list[float]] = {"tiny": [], "scenes": [], "two": []}
    try:
        time.sleep(5)  # as the CLI reads its sources meanwhile: the workers started with Ray import floe
        # Two workers were started with the cluster (num_cpus=2); the third actor needs a new one. Every timed run
        # below starts its actors on new workers too.
        startup = actor_start_seconds(Repository.create(workdir / "startup", Settings()), 3)
        for number in range(rounds):
            direct["tiny"].append(direct_write(workdir / f"direct-{number}", item_files))
            floe["tiny"].append(ray_ingest_seconds(workdir / f"tiny-1-{number}", archive, 1, granules))
            floe["two"].append(ray_ingest_seconds(workdir / f"tiny-2-{number}", archive, 2, granules))
            direct["scenes"].append(
                direct_write_rasters(workdir / f"direct-scenes-{number}", [("scenes", p.stem, p) for p in scenes])
            )
            floe["scenes"].append(
                ray_ingest_seconds(
                    workdir / f"scenes-{number}", scenes[0].parent, 1, len(scenes), default_collection="scenes"
                )
            )
    finally:
        ray.shutdown()
    best_direct = {name: min(times) for name, times in direct.items()}
    best = {name: min(times) for name, times in floe.items()}
    return [
        (
            f"raster copy ingest, {granules} small COGs (make_archive), 1 worker, actor start-up included "
            "(granules/s, MB/s)",
            f"{granules / best['tiny']:.1f}, {megabytes / best['tiny']:.1f}",
            f"{granules / best_direct['tiny']:.1f}, {megabytes / best_direct['tiny']:.1f} "
            "(rioxarray -> Icechunk, no floe)",
            f"{best_direct['tiny'] / best['tiny']:.2f}x",
        ),
        (
            f"raster copy ingest, {len(scenes)} bare 3x1024x1024 uint16 COGs (items by rio-stac), 1 worker, "
            "actor start-up included (granules/s, MB/s)",
            f"{len(scenes) / best['scenes']:.1f}, {scene_megabytes / best['scenes']:.1f}",
            f"{len(scenes) / best_direct['scenes']:.1f}, {scene_megabytes / best_direct['scenes']:.1f} "
            "(rioxarray -> Icechunk, no floe)",
            f"{best_direct['scenes'] / best['scenes']:.2f}x",
        ),
        (
            "raster copy ingest, 2 workers against 1, small COGs (granules/s)",
            f"{granules / best['two']:.1f}",
            f"{granules / best['tiny']:.1f} (1 worker)",
            f"{best['tiny'] / best['two']:.2f}x",
        ),
        (
            "start-up of one ingest actor on a new worker (s; counted in every Ray row above)",
            f"{startup[-1]:.2f}",
            f"{startup[0]:.2f} (on a worker started with the cluster, floe preloaded)",
            f"{startup[-1] / startup[0]:.1f}x",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small counts, for a smoke run")
    parser.add_argument("--items", type=int, default=100_000, help="items for the metadata-only part")
    parser.add_argument("--granules", type=int, default=300, help="small COG granules for the raster part")
    parser.add_argument("--scenes", type=int, default=120, help="3x1024x1024 COG scenes for the raster part")
    parser.add_argument("--rounds", type=int, default=2, help="alternate runs of floe and baseline (fastest counts)")
    parser.add_argument(
        "--metadata-only", action="store_true", help="only the metadata rows (issue 52's: e.g. --items 1000000)"
    )
    arguments = parser.parse_args()
    items = 5_000 if arguments.quick else arguments.items
    granules = 12 if arguments.quick else arguments.granules
    with tempfile.TemporaryDirectory(prefix="floe-bench-ingest-") as temporary:
        workdir = Path(temporary)
        scenes = 6 if arguments.quick else arguments.scenes
        rows = bench_metadata(workdir, items)
        if not arguments.metadata_only:
            rows += bench_rasters(workdir, granules, scenes, 1 if arguments.quick else arguments.rounds)
            sizes = (512,) if arguments.quick else (1024, 2048)
            rows += bench_virtual(workdir, 6 if arguments.quick else 20, sizes)
    print("| figure | floe | baseline (same run) | ratio |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
