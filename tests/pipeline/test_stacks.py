"""Granules stacked by grid through the real pipeline: fixed grids and snapped scenes, Ray, concurrent runs."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio
import rioxarray
import zarr
from affine import Affine
from pyproj import Transformer

from ingest import Repository
from ingest.lifecycle import check
from ingest.pipeline import ingest_with_ray
from ingest.stac import read_arrays_asset

TILE = 4096
FIXED_RES, SCENE_RES = 10.0, 30.0
# Tile-aligned corners well inside one tile of each lattice, so every grid lies in exactly one tile.
FIXED_ORIGINS = [(409_600.0 + TILE * FIXED_RES * index + 1_000, 4_587_520.0 - 1_000) for index in range(4)]
SCENE_BASE = (491_520.0 + 300, 4_546_560.0 - 300)


def _write_granule(
    folder: Path,
    collection: str,
    item_id: str,
    when: str,
    pixels: np.ndarray,
    transform: Affine,
    crs: str,
    nodata: int | None = None,
) -> Path:
    item_dir = folder / collection / item_id
    item_dir.mkdir(parents=True)
    tif = item_dir / f"{item_id}.tif"
    bands, height, width = pixels.shape
    profile = {
        "driver": "COG",
        "width": width,
        "height": height,
        "count": bands,
        "dtype": str(pixels.dtype),
        "crs": crs,
        "transform": transform,
        "compress": "deflate",
        "blocksize": 64,
    }
    if nodata is not None:
        profile["nodata"] = nodata
    with rasterio.open(tif, "w", **profile) as dst:
        dst.write(pixels)
    to_lonlat = Transformer.from_crs(crs, "EPSG:4326", always_xy=True)
    xs = [transform.c, transform.c + transform.a * width]
    ys = [transform.f, transform.f + transform.e * height]
    lons, lats = to_lonlat.transform([xs[0], xs[1], xs[1], xs[0]], [ys[0], ys[0], ys[1], ys[1]])
    ring = [[lon, lat] for lon, lat in zip(lons, lats, strict=True)] + [[lons[0], lats[0]]]
    item = {
        "type": "Feature",
        "stac_version": "1.0.0",
        "stac_extensions": [],
        "id": item_id,
        "collection": collection,
        "geometry": {"type": "Polygon", "coordinates": [ring]},
        "bbox": [min(lons), min(lats), max(lons), max(lats)],
        "properties": {"datetime": when},
        "assets": {
            "data": {
                "href": tif.name,
                "type": "image/tiff; application=geotiff; profile=cloud-optimized",
                "roles": ["data"],
            }
        },
        "links": [],
    }
    path = item_dir / f"{item_id}.json"
    path.write_text(json.dumps(item))
    return path


def make_grids_archive(folder: Path, fixed: int = 200, scenes: int = 50, seed: int = 3) -> list[Path]:
    """``fixed`` 64x64 granules on 4 fixed grids (EPSG:32633, 10 m) and ``scenes`` snapped scenes of varying extent
    (EPSG:32634, 30 m, one pixel alignment), each a GeoTIFF with its STAC item."""
    rng = np.random.default_rng(seed)
    paths = []
    for index in range(fixed):
        x0, y0 = FIXED_ORIGINS[index % 4]
        pixels = rng.integers(1, 10_000, size=(1, 64, 64), dtype="uint16")
        when = f"2024-{1 + index // 60:02d}-{1 + index % 28:02d}T10:{index % 60:02d}:00Z"
        paths.append(
            _write_granule(
                folder,
                "fixed",
                f"fixed-{index:04d}",
                when,
                pixels,
                Affine(FIXED_RES, 0, x0, 0, -FIXED_RES, y0),
                "EPSG:32633",
            )
        )
    for index in range(scenes):
        height, width = (int(value) for value in rng.integers(90, 160, size=2))
        dx, dy = (int(value) for value in rng.integers(0, 200, size=2))
        pixels = rng.integers(1, 4_000, size=(2, height, width), dtype="int16")
        pixels[:, : int(rng.integers(0, 40)), :] = -1  # a nodata margin, as real scenes have
        x0, y0 = SCENE_BASE[0] + dx * SCENE_RES, SCENE_BASE[1] - dy * SCENE_RES
        paths.append(
            _write_granule(
                folder,
                "scenes",
                f"scene-{index:03d}",
                f"2023-{1 + index % 12:02d}-15T00:00:00Z",
                pixels,
                Affine(SCENE_RES, 0, x0, 0, -SCENE_RES, y0),
                "EPSG:32634",
                nodata=-1,
            )
        )
    return paths


@pytest.fixture(scope="module")
def grids_archive(tmp_path_factory) -> tuple[Path, list[Path]]:
    folder = tmp_path_factory.mktemp("grids")
    return folder, make_grids_archive(folder)


def plain_zarr_read(store: Any, row: dict) -> dict[str, np.ndarray]:
    """An item's pixels put together with plain zarr from its ``floe:arrays`` asset alone (no floe reader)."""
    asset = row["assets"]["floe:arrays"]
    root = zarr.open_group(store, mode="r")
    out = {}
    for key, where in asset["floe:pieces"].items():
        first = root[f"{where['pieces'][0]['stack']}/{where['pieces'][0]['array']}"]
        pixels = np.full(where["shape"], first.fill_value, dtype=first.dtype)
        for piece in where["pieces"]:
            row0, col0, height, width = piece["window"]
            at_row, at_col = piece["at"]
            window = root[f"{piece['stack']}/{piece['array']}"][
                piece["slot"], :, row0 : row0 + height, col0 : col0 + width
            ]
            pixels[:, at_row : at_row + height, at_col : at_col + width] = window
        out[key] = pixels
    return out


def count_nodes(repo: Repository) -> int:
    """Every group and array of the Icechunk tree at the tip of main."""
    root = zarr.open_group(repo.view().session.store, mode="r")
    return 1 + sum(1 for _ in root.members(max_depth=None))


def assert_every_item_equals_its_source(repo: Repository, item_files: list[Path]) -> None:
    view = repo.view()
    rows = {row["id"]: row for row in view.items()}
    for item_file in item_files:
        item = json.loads(item_file.read_text())
        source = rioxarray.open_rasterio(item_file.parent / item["assets"]["data"]["href"])
        row = rows[item["id"]]
        dataset = view.item_arrays(item["collection"], item["id"])
        assert np.array_equal(dataset["data"].values, source.values), item["id"]
        assert dataset.rio.crs == source.rio.crs and dataset.rio.transform() == source.rio.transform()
        assert np.array_equal(plain_zarr_read(view.session.store, row)["data"], source.values), item["id"]
        for piece in read_arrays_asset(row).pieces():
            assert view.slot_items(piece.stack)[piece.slot] == item["id"]


@pytest.mark.usefixtures("ray_cluster")
def test_fixed_grids_and_snapped_scenes_stack_and_read_back_exactly(tmp_path, grids_archive):
    folder, item_files = grids_archive
    repo = Repository.create(tmp_path / "repo")
    # Every grid and the scenes' tile already get granules in the first half.
    first_half = [
        path for path in item_files if int(path.stem.rsplit("-", 1)[1]) < (100 if "fixed" in path.stem else 25)
    ]
    report = ingest_with_ray(repo, [path.parent for path in first_half], workers=2, batch_size=25)
    assert report.rejected == []
    nodes_half = count_nodes(repo)
    report = ingest_with_ray(repo, [folder], workers=2, batch_size=25)
    assert report.rejected == [] and report.rows_added == len(item_files) - len(first_half)
    assert_every_item_equals_its_source(repo, item_files)

    view = repo.view()
    fixed, scenes = view.stacks("fixed"), view.stacks("scenes")
    assert len(fixed) == 4 and len(scenes) == 1, (fixed, scenes)
    # Nodes grow with grids, not granules: the second half (125 granules on the same grids) added none.
    assert count_nodes(repo) == nodes_half
    # root, 2 collection groups, 2 `stacks` groups, 2 lattices, and per stack: group, x, y, spatial_ref,
    # item, datetime and the `data` array.
    assert count_nodes(repo) == 1 + 2 + 2 + 2 + 7 * 5
    assert sum(len(view.slot_items(stack)) for stack in fixed) == 200
    series = view.stack(scenes[0])
    assert series.sizes["time"] == 50
    assert np.all(np.diff(series["datetime"].values.astype("int64")) >= 0)
    assert check(repo, deep=True) == []


def _race_worker(root: str, paths: list[str], barrier: Any, out: Any) -> None:
    """One `ingest` run (in-process batch) whose commit waits until the other run has staged too."""
    from ingest.pipeline._batch import commit_batch
    from ingest.pipeline._granules import granule_from_item
    from ingest.repository import _commit

    original = _commit._swap
    waited = []

    def swap_after_barrier(*args: Any, **kwargs: Any) -> str:
        if not waited:
            waited.append(True)
            barrier.wait(timeout=120)
        return original(*args, **kwargs)

    _commit._swap = swap_after_barrier  # type: ignore[assignment]
    repo = Repository.open(root)
    granules = [granule_from_item(json.loads(Path(p).read_text()), p, Path(p)) for p in paths]
    outcome = commit_batch(repo, "main", granules, "race")
    out.put((outcome.commit.attempts, outcome.replans, len(outcome.rejected)))


@pytest.mark.slow
def test_two_runs_adding_slices_to_the_same_stacks_at_once_both_land_whole(tmp_path, grids_archive):
    """A forced race: both runs stage their slices on the same base, then both commit; the loser's slots move."""
    _, item_files = grids_archive
    fixed = [path for path in item_files if path.parent.parent.name == "fixed"]
    repo = Repository.create(tmp_path / "repo")
    from ingest.pipeline._batch import commit_batch
    from ingest.pipeline._granules import granule_from_item

    seed = [granule_from_item(json.loads(p.read_text()), str(p), p) for p in fixed[:4]]
    repo.ensure_groups(["fixed"], branch="main")
    commit_batch(repo, "main", seed, "stacks exist")
    one, two = fixed[4:40:2], fixed[5:40:2]
    context = multiprocessing.get_context("spawn")
    barrier, out = context.Manager().Barrier(2), context.Queue()
    runs = [
        context.Process(target=_race_worker, args=(str(repo.location.url), [str(p) for p in paths], barrier, out))
        for paths in (one, two)
    ]
    for run in runs:
        run.start()
    for run in runs:
        run.join(timeout=300)
        assert run.exitcode == 0
    results = sorted(out.get(timeout=10) for _ in runs)
    # One won at once; the other moved its slots at commit time, without planning its batch again.
    assert results[0][0] == 1 and results[1][0] >= 2, results
    assert all(replans == 0 and rejected == 0 for _attempts, replans, rejected in results), results
    assert_every_item_equals_its_source(repo, fixed[:40])
    slots = [(piece.stack, piece.slot) for row in repo.view().items() for piece in read_arrays_asset(row).pieces()]
    assert len(slots) == len(set(slots)) == 40
    assert check(repo, deep=True) == []


def test_a_granule_that_finds_its_stack_full_is_rejected_by_name_and_the_rest_commits(tmp_path, grids_archive):
    from ingest import Settings
    from ingest.pipeline._batch import commit_batch
    from ingest.pipeline._granules import granule_from_item

    _, item_files = grids_archive
    on_one_grid = [path for path in item_files if path.parent.parent.name == "fixed"][0:12:4]  # index % 4 == 0
    repo = Repository.create(tmp_path / "repo", Settings(arrays={"stack_capacity": 2}))
    repo.ensure_groups(["fixed"], branch="main")
    granules = [granule_from_item(json.loads(path.read_text()), str(path), path) for path in on_one_grid]
    outcome = commit_batch(repo, "main", granules, "three granules, room for two")
    assert outcome.granules == 2
    (rejected,) = outcome.rejected
    assert rejected.item_id == granules[2].item["id"] and "is full (2 slots" in rejected.reason
    assert sorted(row["id"] for row in repo.view().items()) == sorted(g.item["id"] for g in granules[:2])
    assert check(repo, deep=True) == []
