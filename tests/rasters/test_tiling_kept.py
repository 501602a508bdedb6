"""A repository keeps the tile and chunk its stacks were cut with, whatever a later run's settings say.

``arrays.tile`` and ``arrays.chunk`` are settings, so a later run (another
machine, another ``FLOE_ARRAYS__CHUNK``) can ask for others. Written as asked,
a granule's chunks would land under the keys of an array chunked otherwise
(read back as other pixels), and a stack cut with another tile size would
take its pixels at the wrong place. A repository records both when it is
created and writes with those; one created before it recorded them writes
each array in its own chunks and refuses a stack of another tile size.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import zarr

from ingest import Repository, Settings
from ingest.config import ArraysSettings
from ingest.errors import UnsupportedLayout
from ingest.rasters import plan_granule
from ingest.stac import TILING_ATTR, read_arrays_asset
from tests.conftest import make_item, raster_dataset, stage_raster

# Lattice row -420032 and column 50048 (10 m pixels) are multiples of 64: a granule here is in one 64-px tile.
CORNER = (500_480.0, 4_200_320.0)


def pixels(seed: int, size: int = 40) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 60_000, (2, size, size), dtype=np.uint16)


def stage_and_commit(repository: Repository, item_id: str, values: np.ndarray, origin: tuple[float, float]) -> dict:
    writer = repository.writer()
    item = stage_raster(writer, make_item(item_id), values, origin=origin)
    writer.add_item(item)
    writer.commit(f"add {item_id}")
    return item


def array_chunks(repository: Repository, item: dict) -> tuple[int, ...]:
    (piece, *_) = read_arrays_asset(item).pixels["data"].pieces
    return zarr.open_array(repository.view().session.store, path=f"{piece.stack}/{piece.array}", mode="r").chunks


def forget_tiling(root: Path) -> None:
    """Make the repository at ``root`` one created before floe recorded its tiling."""
    repository = Repository.open(root, Settings())
    tip = repository.icechunk.lookup_snapshot(repository.icechunk.lookup_branch("main"))
    session = repository.icechunk.writable_session("main")
    group = zarr.open_group(session.store, mode="a")
    attributes = dict(group.attrs)
    del attributes[TILING_ATTR]
    group.attrs.put(attributes)
    session.commit("as before tilings were recorded", metadata=tip.metadata)  # the same items-table pointer


def test_a_repository_records_its_tiling_and_later_runs_write_with_it(tmp_path, caplog):
    created = Repository.create(tmp_path / "repo", Settings(arrays=ArraysSettings(tile=64, chunk=16)))
    first = stage_and_commit(created, "first", pixels(1), CORNER)

    with caplog.at_level(logging.WARNING, logger="ingest.repository._layout"):
        later = Repository.open(tmp_path / "repo", Settings(arrays=ArraysSettings(tile=128, chunk=32)))
    assert (later.settings.arrays.tile, later.settings.arrays.chunk) == (64, 16)
    assert "tile 64, chunk 16" in caplog.text and "tile 128, chunk 32" in caplog.text
    second_pixels = pixels(2)
    second = stage_and_commit(later, "second", second_pixels, (CORNER[0] + 80.0, CORNER[1] - 80.0))

    view = later.view()
    np.testing.assert_array_equal(view.item_arrays("c", "first").data.values, pixels(1))
    np.testing.assert_array_equal(view.item_arrays("c", "second").data.values, second_pixels)
    assert array_chunks(later, first) == array_chunks(later, second) == (1, 1, 16, 16)
    # A new repository takes the settings as they are.
    fresh = Repository.create(tmp_path / "fresh", Settings(arrays=ArraysSettings(tile=128, chunk=32)))
    assert (fresh.settings.arrays.tile, fresh.settings.arrays.chunk) == (128, 32)


@pytest.mark.parametrize("chunk", [16, 64])
def test_an_array_made_before_the_chunk_setting_changed_keeps_its_chunks(tmp_path, chunk):
    # Without a recorded tiling (a repository from before), the settings' chunk reaches the writer: the array's
    # own chunks must still be the ones written (16: keys past the array's chunk grid; 64: blocks under keys
    # that mean other pixels).
    Repository.create(tmp_path / "repo", Settings(arrays=ArraysSettings(tile=64, chunk=32)))
    forget_tiling(tmp_path / "repo")
    before = Repository.open(tmp_path / "repo", Settings(arrays=ArraysSettings(tile=64, chunk=32)))
    first = stage_and_commit(before, "first", pixels(1), CORNER)

    later = Repository.open(tmp_path / "repo", Settings(arrays=ArraysSettings(tile=64, chunk=chunk)))
    assert later.settings.arrays.chunk == chunk
    second_pixels = pixels(2)
    second = stage_and_commit(later, "second", second_pixels, (CORNER[0] + 80.0, CORNER[1] - 80.0))

    view = later.view()
    np.testing.assert_array_equal(view.item_arrays("c", "second").data.values, second_pixels)
    np.testing.assert_array_equal(view.item_arrays("c", "first").data.values, pixels(1))
    assert array_chunks(later, first) == array_chunks(later, second) == (1, 1, 32, 32)


def test_a_stack_cut_with_another_tile_size_is_refused_not_written(tmp_path):
    Repository.create(tmp_path / "repo", Settings(arrays=ArraysSettings(tile=64, chunk=16)))
    forget_tiling(tmp_path / "repo")
    before = Repository.open(tmp_path / "repo", Settings(arrays=ArraysSettings(tile=64, chunk=16)))
    stage_and_commit(before, "first", pixels(1, size=8), CORNER)
    # Tile (-6563, 782) of 64 px holds the first granule; with 32-px tiles, tile (-6563, 782) is elsewhere:
    # the same stack name on another grid.
    elsewhere = (782 * 32 * 10.0, 6563 * 32 * 10.0)
    planned = [
        plan_granule("c", {"data": raster_dataset(pixels(n, size=8), origin=origin)}, tile=tile, chunk=16)
        for n, origin, tile in ((1, CORNER, 64), (2, elsewhere, 32))
    ]
    assert planned[0].stack_paths() == planned[1].stack_paths()

    later = Repository.open(tmp_path / "repo", Settings(arrays=ArraysSettings(tile=32, chunk=16)))
    tip = later.icechunk.lookup_branch("main")
    writer = later.writer()
    with pytest.raises(UnsupportedLayout, match=r"64 x 64 pixels.*32 x 32.*FLOE_ARRAYS__TILE=64"):
        stage_raster(writer, make_item("second"), pixels(2, size=8), origin=elsewhere)
    assert later.icechunk.lookup_branch("main") == tip
    np.testing.assert_array_equal(later.view().item_arrays("c", "first").data.values, pixels(1, size=8))
