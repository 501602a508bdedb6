"""From a search to pixels: ``ingest.open_search`` and ``View.open_items`` give one lazy tree, one Dataset per grid.

The repository holds granules on one grid that crosses the corner of four
stack tiles (so every granule is four pieces), granules on a second grid
400 km away, and items without arrays. The tree must hold each grid's
granules along ``time`` in datetime order, read back exactly the staged
pixels (whole, and any window with any step), read them at the search's
snapshot even after the branch moves, and hold only what the search matched.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import xarray as xr

import ingest
from ingest import Repository, Settings
from ingest.repository._series import PiecesArray
from ingest.stac import read_arrays_asset
from tests.conftest import make_item, stage_raster

CORNER = (532180.0, 4178120.0)
"""30 pixels west and 20 north of a corner of 4,096-pixel tiles (10 m pixels): a 48x40 granule covers four tiles."""
FAR = (900000.0, 4200000.0)
SHAPE = (2, 40, 48)


def pixels(item_id: str, shape: tuple[int, ...] = SHAPE) -> np.ndarray:
    return np.random.default_rng(zlib.crc32(item_id.encode())).integers(0, 60000, size=shape, dtype="uint16")


@pytest.fixture
def archive(repo: Repository) -> Repository:
    writer = repo.writer()
    for day, item_id in ((3, "corner-b"), (1, "corner-a"), (2, "corner-c")):  # staged out of time order
        item = make_item(item_id, "s2", when=f"2024-01-0{day}T10:00:00Z", tile="corner")
        writer.add_item(stage_raster(writer, item, pixels(item_id), origin=CORNER))
    writer.add_item(make_item("no-arrays", "s2", when="2024-01-02T00:00:00Z", tile="corner"))
    writer.commit("corner granules")
    writer = repo.writer()
    for day, item_id in ((5, "far-a"), (4, "far-b")):
        item = make_item(item_id, "s2", when=f"2024-01-0{day}T10:00:00Z", tile="far")
        writer.add_item(stage_raster(writer, item, pixels(item_id, (2, 16, 16)), origin=FAR))
    writer.commit("far granules")
    return repo


def _datasets(tree: xr.DataTree) -> dict[tuple[str, ...], xr.Dataset]:
    """The tree's Datasets by the items they hold."""
    return {tuple(node.ds["item"].values.tolist()): node.to_dataset() for node in tree.children.values()}


def test_a_search_opens_one_dataset_per_grid_in_time_order_with_exact_pixels(archive: Repository) -> None:
    corner = archive.view().item("s2", "corner-a")
    assert len(read_arrays_asset(corner).pixels["data"].pieces) == 4, "the fixture's granule must span four tiles"

    tree = ingest.open_search(archive, collections=["s2"])
    datasets = _datasets(tree)
    assert set(datasets) == {("corner-a", "corner-c", "corner-b"), ("far-b", "far-a")}
    assert tree.attrs["floe:snapshot"] == archive.resolve("main")
    assert tree.attrs["floe:without_arrays"] == 1
    stacked = datasets[("corner-a", "corner-c", "corner-b")]
    assert stacked["data"].dims == ("time", "band", "y", "x") and stacked["data"].shape == (3, *SHAPE)
    assert list(stacked["time"].values) == sorted(stacked["time"].values)
    expected = np.stack([pixels(item_id) for item_id in ("corner-a", "corner-c", "corner-b")])
    np.testing.assert_array_equal(stacked["data"].values, expected)
    # Georeferenced as View.item_arrays (rioxarray's layout) gives each one.
    single = archive.view().item_arrays("s2", "corner-c")
    xr.testing.assert_equal(stacked["x"], single["x"])
    xr.testing.assert_equal(stacked["y"], single["y"])
    assert stacked["spatial_ref"].attrs["crs_wkt"] == single["spatial_ref"].attrs["crs_wkt"]
    np.testing.assert_array_equal(
        datasets[("far-b", "far-a")]["data"].values, np.stack([pixels(i, (2, 16, 16)) for i in ("far-b", "far-a")])
    )


def test_variables_are_lazy_and_any_window_reads_what_the_whole_holds(archive: Repository) -> None:
    tree = archive.view().open_items(archive.view().items())
    (stacked,) = [dataset for items, dataset in _datasets(tree).items() if len(items) == 3]
    variable = stacked["data"].variable
    assert not isinstance(variable._data, np.ndarray), "opening read the pixels"
    whole = stacked["data"].values
    windows = [
        {"time": 1, "band": 0},
        {"time": slice(None, None, -1), "y": slice(10, 30), "x": slice(25, 35)},  # across the tile corner
        {"y": slice(None, None, 3), "x": slice(47, 0, -5)},
        {"time": [2, 0], "x": 29},
        {"y": slice(0, 0)},
    ]
    for window in windows:
        np.testing.assert_array_equal(stacked["data"].isel(window).values, whole[_numpy_key(window)], str(window))


def _numpy_key(window: dict) -> tuple:
    order = ("time", "band", "y", "x")
    return tuple(window.get(name, slice(None)) for name in order)


def test_the_tree_reads_the_searched_snapshot_after_the_branch_moves(archive: Repository) -> None:
    tree = ingest.open_search(archive, ids=["corner-a", "corner-b"])
    (stacked,) = _datasets(tree).values()
    writer = archive.writer()
    stored = writer.stored_items([("s2", "corner-a")])[("s2", "corner-a")]
    writer.clear_pieces(read_arrays_asset(stored).pixels["data"].pieces)
    item = make_item("corner-a", "s2", when="2024-01-01T10:00:00Z", tile="corner")
    writer.add_item(stage_raster(writer, item, pixels("changed"), origin=CORNER), replace=True)
    writer.commit("corner-a's pixels change")
    np.testing.assert_array_equal(stacked["data"].values[0], pixels("corner-a"))
    (now,) = _datasets(ingest.open_search(archive, ids=["corner-a"])).values()
    np.testing.assert_array_equal(now["data"].values[0], pixels("changed"))


def test_only_what_the_search_matched_and_the_chosen_assets(archive: Repository) -> None:
    tree = ingest.open_search(archive, "main", filter="tile = 'far'", assets=["data"])
    assert set(_datasets(tree)) == {("far-b", "far-a")}
    assert set(_datasets(ingest.open_search(archive, filter="tile = 'far'", assets=["other"]))) == set()
    limited = ingest.open_search(archive, collections=["s2"], sortby="-datetime", max_items=1)
    assert set(_datasets(limited)) == {("far-a",)}


def test_pieces_array_fills_what_no_piece_covers(archive: Repository) -> None:
    view = archive.view()
    where = read_arrays_asset(view.item("s2", "corner-a")).pixels["data"]
    # Drop the piece at the granule's top-left: its pixels read as the fill value, the rest as stored.
    kept = [piece for piece in where.pieces if piece.at != (0, 0)]
    lazy = PiecesArray(
        view.session.store, [type(where)(where.crs, where.transform, where.shape, kept)], np.dtype("uint16"), 7
    )
    values = lazy._read((0, slice(None), slice(None), slice(None)))
    dropped = next(piece for piece in where.pieces if piece.at == (0, 0))
    height, width = dropped.window[2:]
    assert (values[:, :height, :width] == 7).all()
    np.testing.assert_array_equal(values[:, height:, :], pixels("corner-a")[:, height:, :])


@pytest.mark.slow
def test_a_search_over_the_demo_archive_reads_back_the_source_rasters(tmp_path, ray_cluster) -> None:
    """The sample archive (three collections, three CRSs, uint16 / float32 with nodata / uint8), ingested by Ray
    actors: every time step of every grid equals its granule's GeoTIFF as rioxarray reads it."""
    from ingest.pipeline import ingest_with_ray
    from ingest.rasters import read_granule
    from ingest.sample import make_archive

    archive = tmp_path / "archive"
    make_archive(archive, granules=6, seed=4)
    repository = Repository.create(tmp_path / "repo", Settings())
    report = ingest_with_ray(repository, [archive], workers=1)
    assert report.rows_added == 6 and not report.rejected
    repository.tag("v1")

    tree = ingest.open_search(repository, "v1", sortby="datetime")
    compared = []
    for node in tree.children.values():
        dataset = node.to_dataset()
        for position, item_id in enumerate(dataset["item"].values.tolist()):
            (source,) = archive.rglob(f"{item_id}.tif")
            expected = read_granule(source)["data"]
            found = dataset["data"].isel(time=position)
            assert found.dtype == expected.dtype and found.shape == expected.shape, item_id
            np.testing.assert_array_equal(found.values, expected.values, err_msg=item_id)
            np.testing.assert_allclose(found["x"].values, expected["x"].values)
            np.testing.assert_allclose(found["y"].values, expected["y"].values)
            compared.append(item_id)
    assert len(compared) == 6 and len(set(compared)) == 6
    assert len(tree.children) >= 3, "three collections in three CRSs cannot share a grid"
