"""Arrays at archive scale: what one commit costs as granules pile up, stacked by grid against a group per item.

Run:  .venv/bin/python scripts/bench_arrays.py                 (1,000 to 1,000,000 granules: about an hour)
      .venv/bin/python scripts/bench_arrays.py --sizes 1000,10000 --quick

The question (issue 12): does a commit cost the same at a million granules as
at a thousand? Icechunk writes the list of every node into each snapshot, so
with a group per granule (layout 1, floe before stacks) a commit's cost grew
with the granules already stored. With stacks (layout 2) granules that share
a grid are slices of one array, so nodes grow with grids.

For each size N (granules already in the repository):

* **stacks**: a repository whose N granules (64x64 uint16, one band) lie on
  ``--grids`` fixed grids, each grid in its own tile (tiled layout, the
  default). The repository grows to N by *seeding*: whole runs of slots are
  written into the stacks with zarr in big commits (pixels, ``item`` and
  ``datetime`` coordinates), which is much faster than staging granules one
  by one and gives the same Icechunk state a real ingest would (no table rows
  are seeded: the table's own cost is issue 11's). Then ``--commits``
  measured commits, each of ``--batch`` real granules staged through floe's
  ``stage_arrays``, with their rows, committed by ``Writer.commit``; we time
  ``commit`` only. A commit rewrites the newest manifest split of every stack
  it appends to, so what it costs depends on how many stacks it touches:
  ``--spreads`` measures commits whose granules fall on all the grids at
  random (the worst case) and on a few (what a batch routed by area, as
  floe's Ray pipeline routes them, touches).
* **groups**: the baseline, the layout floe had before: a group per granule
  with the nodes an item group had (the group, a ``(band, y, x)`` array and
  ``band``/``x``/``y``/``spatial_ref`` coordinates), seeded the same way, and
  measured commits of ``--batch`` such groups. Run up to ``--group-sizes``
  (its cost grows with N: a million is out of reach).

Per commit we record its latency, the bytes of its snapshot file and the
bytes of the manifests it wrote. Medians are printed, and for each layout
the ratio to its value at the smallest N (the issue's target: at most 2x at
1,000,000 against 1,000).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import rioxarray  # noqa: F401 - registers the .rio accessor
import xarray as xr
import zarr
from affine import Affine

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ingest import Repository, Settings
from ingest.pipeline import stage_arrays
from ingest.stac import arrays_asset, with_arrays_asset

SIZE = 64
RES = 10.0
TILE = 4096
CRS = "EPSG:32633"


def log(message: str) -> None:
    print(f"[bench_arrays {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def grid_origin(grid: int) -> tuple[float, float]:
    """Each grid in a tile of its own (a 64-column band of tiles), 1 km inside the tile's corner."""
    column, row = grid % 64, grid // 64
    return 200_000.0 + column * TILE * RES + 1_000, 5_000_000.0 - row * TILE * RES - 1_000


def raster(pixels: np.ndarray, grid: int) -> xr.Dataset:
    x0, y0 = grid_origin(grid)
    array = xr.DataArray(
        pixels[np.newaxis],
        dims=("band", "y", "x"),
        coords={
            "band": [1],
            "x": x0 + RES * (np.arange(SIZE) + 0.5),
            "y": y0 - RES * (np.arange(SIZE) + 0.5),
        },
    )
    array = array.rio.write_crs(CRS).rio.write_transform(Affine(RES, 0, x0, 0, -RES, y0))
    return array.to_dataset(name="data")


def item(item_id: str, number: int) -> dict[str, Any]:
    return {
        "type": "Feature",
        "stac_version": "1.0.0",
        "stac_extensions": [],
        "id": item_id,
        "collection": "bench",
        "geometry": {"type": "Point", "coordinates": [15.0, 45.0]},
        "bbox": [15.0, 45.0, 15.0, 45.0],
        "properties": {"datetime": f"2024-01-{1 + number % 28:02d}T00:00:00Z"},
        "assets": {},
        "links": [],
    }


def pixels_for(rng: np.random.Generator, count: int) -> np.ndarray:
    """Pixels that compress like imagery (a smooth field plus noise), not to nothing and not inline."""
    base = np.add.outer(np.arange(SIZE), np.arange(SIZE)).astype("uint16") * 8
    noise = rng.integers(0, 64, size=(count, SIZE, SIZE), dtype="uint16")
    return base[np.newaxis] + noise


@dataclass
class Measured:
    layout: str
    granules: int
    latency: list[float]
    snapshot_bytes: list[int]
    manifest_bytes: list[int]
    nodes: int


def files_under(path: Path) -> dict[str, int]:
    return {str(file): file.stat().st_size for file in path.glob("*") if file.is_file()}


# -- stacks ---------------------------------------------------------------------------------------------------


class Stacks:
    def __init__(self, root: Path, grids: int, seed: int, split: int) -> None:
        self.repo = Repository.create(root, Settings(arrays={"manifest_split": split}))
        self.root = root
        self.grids = grids
        self.rng = np.random.default_rng(seed)
        self.granules = 0
        self.next_slot = [0] * grids
        self.stacks: list[str] = []
        self.repo.ensure_groups(["bench"], branch="main")
        # One real granule per grid makes every stack (and its arrays) the way ingest does.
        writer = self.repo.writer()
        for grid in range(grids):
            self._stage(writer, f"first-{grid}", grid)
        writer.commit("first granule of each grid")
        view = self.repo.view()
        self.stacks = sorted(view.stacks("bench"))
        self.granules = grids
        self.next_slot = [1] * grids

    def _stage(self, writer: Any, item_id: str, grid: int) -> None:
        granule = raster(pixels_for(self.rng, 1)[0], grid)
        placed, _ = stage_arrays(writer, item(item_id, self.granules), {"data": granule})
        writer.add_item(with_arrays_asset(item(item_id, self.granules), arrays_asset(placed)))

    def seed_to(self, target: int, per_commit: int) -> None:
        """Write runs of slots straight into the stacks until the repository holds ``target`` granules."""
        while self.granules < target:
            count = min(per_commit, target - self.granules)
            writer = self.repo.writer()
            store = writer.store
            per_stack = np.full(self.grids, count // self.grids)
            per_stack[: count % self.grids] += 1
            for index, stack in enumerate(self.stacks):
                many = int(per_stack[index])
                if not many:
                    continue
                first = self.next_slot[index]
                slots = slice(first, first + many)
                data = zarr.open_array(store, path=f"{stack}/data", mode="r+")
                # Each stack is one tile; the grid's pixels sit 100 pixels in from the tile's corner.
                data[slots, 0, 100 : 100 + SIZE, 100 : 100 + SIZE] = pixels_for(self.rng, many)
                zarr.open_array(store, path=f"{stack}/item", mode="r+")[slots] = np.array(
                    [f"seed-{index}-{slot}" for slot in range(first, first + many)], dtype=object
                )
                zarr.open_array(store, path=f"{stack}/datetime", mode="r+")[slots] = np.full(
                    many, 1_700_000_000_000_000
                )
                self.next_slot[index] += many
            writer.commit(f"seed {count} granules")
            self.granules += count
            log(f"stacks: {self.granules:,} granules")

    def measure(self, commits: int, batch: int, spread: int) -> Measured:
        """Commits of ``batch`` granules, each commit's granules on ``spread`` grids picked at random."""
        latency, snapshots, manifests = [], [], []
        for _ in range(commits):
            writer = self.repo.writer()
            grids = self.rng.choice(self.grids, size=min(spread, self.grids), replace=False)
            for number in range(batch):
                self._stage(writer, f"g-{self.granules + number}", int(self.rng.choice(grids)))
            before = files_under(self.root / "arrays" / "manifests")
            started = time.perf_counter()
            result = writer.commit("measured batch")
            latency.append(time.perf_counter() - started)
            snapshots.append((self.root / "arrays" / "snapshots" / result.snapshot_id).stat().st_size)
            after = files_under(self.root / "arrays" / "manifests")
            manifests.append(sum(size for name, size in after.items() if name not in before))
            self.granules += batch
            self.next_slot = [0] * self.grids  # unknown now; seeding continues from the stacks themselves
            self._refresh_slots()
        layout = f"stacks, {spread} grids a commit"
        return Measured(layout, self.granules, latency, snapshots, manifests, count_nodes(self.repo))

    def _refresh_slots(self) -> None:
        view = self.repo.view()
        from ingest.repository._slots import next_free_slot

        self.next_slot = [next_free_slot(view.session, stack) for stack in self.stacks]


# -- groups (the layout before stacks) -------------------------------------------------------------------------


class Groups:
    def __init__(self, root: Path, seed: int) -> None:
        self.repo = Repository.create(root, Settings())
        self.root = root
        self.rng = np.random.default_rng(seed)
        self.granules = 0
        self.repo.ensure_groups(["bench"], branch="main")

    def _group(self, store: Any, name: str, pixels: np.ndarray) -> None:
        group = zarr.open_group(store, path=f"bench/{name}", mode="a")
        group.create_array("data", data=pixels[np.newaxis], chunks=(1, SIZE, SIZE))
        group.create_array("band", data=np.array([1]))
        group.create_array("x", data=np.arange(SIZE, dtype="float64"))
        group.create_array("y", data=np.arange(SIZE, dtype="float64"))
        group.create_array("spatial_ref", data=np.array(0), attributes={"crs_wkt": CRS})

    def seed_to(self, target: int, per_commit: int) -> None:
        while self.granules < target:
            count = min(per_commit, target - self.granules)
            writer = self.repo.writer()
            for number, pixels in enumerate(pixels_for(self.rng, count)):
                self._group(writer.store, f"seed-{self.granules + number}", pixels)
            writer.commit(f"seed {count} groups")
            self.granules += count
            log(f"groups: {self.granules:,} granules")

    def measure(self, commits: int, batch: int) -> Measured:
        latency, snapshots, manifests = [], [], []
        for _ in range(commits):
            writer = self.repo.writer()
            for number, pixels in enumerate(pixels_for(self.rng, batch)):
                self._group(writer.store, f"g-{self.granules + number}", pixels)
                writer.add_item(item(f"g-{self.granules + number}", number))
            before = files_under(self.root / "arrays" / "manifests")
            started = time.perf_counter()
            result = writer.commit("measured batch")
            latency.append(time.perf_counter() - started)
            snapshots.append((self.root / "arrays" / "snapshots" / result.snapshot_id).stat().st_size)
            after = files_under(self.root / "arrays" / "manifests")
            manifests.append(sum(size for name, size in after.items() if name not in before))
            self.granules += batch
        return Measured("groups", self.granules, latency, snapshots, manifests, count_nodes(self.repo))


def count_nodes(repo: Repository) -> int:
    root = zarr.open_group(repo.view().session.store, mode="r")
    return 1 + sum(1 for _ in root.members(max_depth=None))


def table(results: list[Measured]) -> str:
    lines = [
        "| layout | granules in the repository | Icechunk nodes | commit median (ms) | vs smallest | "
        "snapshot bytes | vs smallest | manifest bytes written | vs smallest |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    first: dict[str, Measured] = {}
    for result in sorted(results, key=lambda measured: (measured.layout, measured.granules)):
        base = first.setdefault(result.layout, result)
        latency = statistics.median(result.latency)
        snapshot = statistics.median(result.snapshot_bytes)
        manifest = statistics.median(result.manifest_bytes)
        lines.append(
            f"| {result.layout} | {result.granules:,} | {result.nodes:,} | {latency * 1000:.0f} | "
            f"{latency / statistics.median(base.latency):.2f}x | {snapshot:,.0f} | "
            f"{snapshot / statistics.median(base.snapshot_bytes):.2f}x | {manifest:,.0f} | "
            f"{manifest / max(1.0, statistics.median(base.manifest_bytes)):.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000,100000,1000000", help="granules in the repository")
    parser.add_argument("--group-sizes", default="1000,10000,30000", help="sizes measured for the old layout")
    parser.add_argument("--grids", type=int, default=300, help="grids (each its own stack) the granules lie on")
    parser.add_argument("--batch", type=int, default=100, help="granules per measured commit")
    parser.add_argument("--commits", type=int, default=5, help="measured commits per size")
    parser.add_argument("--seed-commit", type=int, default=50_000, help="granules per seeding commit")
    parser.add_argument(
        "--spreads",
        default="300,10",
        help="grids the granules of one measured commit fall on: all of them at random (the worst case), and a few "
        "(what Ray's routing by area gives a batch)",
    )
    parser.add_argument("--split", type=int, default=Settings().arrays.manifest_split, help="arrays.manifest_split")
    parser.add_argument("--no-groups", action="store_true", help="skip the layout-1 baseline")
    parser.add_argument("--quick", action="store_true", help="1,000 and 10,000 only, 3 commits")
    parser.add_argument("--keep", action="store_true", help="keep the repositories")
    arguments = parser.parse_args()
    sizes = [int(size) for size in arguments.sizes.split(",")]
    group_sizes = [int(size) for size in arguments.group_sizes.split(",")]
    if arguments.quick:
        sizes, group_sizes, arguments.commits = [1000, 10000], [1000, 10000], 3
    workdir = Path(tempfile.mkdtemp(prefix="floe-bench-arrays-"))
    log(f"working in {workdir}")
    results: list[Measured] = []
    groups = Groups(workdir / "groups", seed=1)
    for size in [] if arguments.no_groups else group_sizes:
        groups.seed_to(size, min(arguments.seed_commit, 5_000))
        results.append(groups.measure(arguments.commits, arguments.batch))
        log(f"groups at {size:,}: {statistics.median(results[-1].latency) * 1000:.0f} ms")
    stacks = Stacks(workdir / "stacks", arguments.grids, seed=2, split=arguments.split)
    spreads = [int(spread) for spread in arguments.spreads.split(",")]
    for size in sizes:
        stacks.seed_to(size, arguments.seed_commit)
        for spread in spreads:
            results.append(stacks.measure(arguments.commits, arguments.batch, spread))
            log(f"stacks at {size:,}, {spread} grids a commit: {statistics.median(results[-1].latency) * 1000:.0f} ms")
    print(
        f"\n{arguments.batch} granules (64x64 uint16) per measured commit, median of {arguments.commits}; "
        f"stacks on {arguments.grids} grids (one tile each), manifests split every {arguments.split} slots.\n"
    )
    print(table(results))
    if not arguments.keep:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    else:
        log(f"kept {workdir}")


if __name__ == "__main__":
    main()
