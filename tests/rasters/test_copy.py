"""Copies into stacks (array layout 2) through a real Writer and commit, read back with ``View.item_arrays``.

Rasters are small GeoTIFF/COG files made here; each test reads them with
``read_assets`` and stages them with ``ingest.pipeline.stage_arrays``, as
``floe ingest`` does, and compares what the repository gives back with what
rioxarray reads from the files.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import rasterio
import rioxarray
import xarray as xr
import zarr
from rasterio.crs import CRS
from rasterio.errors import NotGeoreferencedWarning
from rasterio.transform import from_origin
from zarr.core.sync import sync

from ingest import Repository, Settings
from ingest.config import ArraysSettings
from ingest.errors import FloeError
from ingest.pipeline import _arrays as arrays_module
from ingest.pipeline import granule_from_item, stage_arrays
from ingest.pipeline._batch import commit_batch
from ingest.rasters import InvalidRaster, read_assets, read_granule
from ingest.stac import arrays_asset, read_arrays_asset, with_arrays_asset
from tests.conftest import make_item

UTM = "EPSG:32633"
UTM_10M = from_origin(500_000.0, 6_000_000.0, 10.0, 10.0)
UTM_20M = from_origin(500_000.0, 6_000_000.0, 20.0, 20.0)
WGS84_GRID = from_origin(15.0, 54.0, 0.001, 0.001)
CLOUD_NODATA = -9999.0
SCL_NODATA = 0


def make_tif(path: Path, data: np.ndarray, *, crs: str | None, transform=None, nodata=None, driver="COG", **extra):
    """A small GeoTIFF/COG with ``data`` (band, y, x) as its pixels."""
    bands, height, width = data.shape
    profile = {
        "driver": driver,
        "width": width,
        "height": height,
        "count": bands,
        "dtype": data.dtype.name,
        "transform": transform,
        "nodata": nodata,
    }
    if crs is not None:
        profile["crs"] = crs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotGeoreferencedWarning)
        with rasterio.open(path, "w", **profile) as dst:
            dst.write(data)
            for name, value in extra.items():
                setattr(dst, name, value)
    return path


@pytest.fixture
def rasters(tmp_path: Path) -> dict[str, Path]:
    """Four assets: two on one UTM grid, one on a coarser UTM grid, one in EPSG:4326 with nodata."""
    rng = np.random.default_rng(42)
    folder = tmp_path / "granule"
    folder.mkdir()
    cloud = rng.random((1, 30, 40), dtype=np.float32) * 100
    cloud[0, :3, :7] = CLOUD_NODATA
    scl = rng.integers(1, 12, size=(1, 24, 32), dtype=np.uint16)
    scl[0, -2:, :] = SCL_NODATA
    return {
        "visual": make_tif(
            folder / "visual.tif",
            rng.integers(0, 65535, size=(3, 48, 64), dtype=np.uint16),
            crs=UTM,
            transform=UTM_10M,
        ),
        "swir": make_tif(
            folder / "swir.tif",
            rng.integers(0, 65535, size=(3, 48, 64), dtype=np.uint16),
            crs=UTM,
            transform=UTM_10M,
            driver="GTiff",
        ),
        "cloud": make_tif(
            folder / "cloud.tif", cloud, crs="EPSG:4326", transform=WGS84_GRID, nodata=CLOUD_NODATA, driver="GTiff"
        ),
        "scl": make_tif(
            folder / "scl.tif",
            scl,
            crs=UTM,
            transform=UTM_20M,
            nodata=SCL_NODATA,
            driver="GTiff",
            scales=(0.0001,),
            offsets=(-0.1,),
        ),
    }


def stage(writer, item: dict, assets: dict[str, Path]) -> tuple[dict, int]:
    """Read and stage a granule as ``floe ingest`` does; the item (with ``floe:arrays``) is staged too."""
    placed, nbytes = stage_arrays(writer, item, read_assets(assets))
    staged = with_arrays_asset(item, arrays_asset(placed))
    writer.add_item(staged, replace=True)
    return staged, nbytes


def ingest(repository: Repository, item_id: str, assets: dict[str, Path], **item) -> dict:
    """One granule in one writer, committed; returns the item as staged."""
    writer = repository.writer()
    writer.ensure_collection("c")
    staged, _ = stage(writer, make_item(item_id, **item), assets)
    writer.commit(f"ingest {item_id}")
    return staged


def assert_same_raster(stored: xr.DataArray, source: Path) -> None:
    """Pixels, dtype, CRS, transform, coordinates and nodata equal the source file's."""
    expected = rioxarray.open_rasterio(source, masked=False)
    try:
        assert stored.dims == ("band", "y", "x")
        assert stored.dtype == expected.dtype
        np.testing.assert_array_equal(stored.values, expected.values, strict=True)
        assert stored.rio.crs == expected.rio.crs
        assert stored.rio.transform().almost_equals(expected.rio.transform())
        np.testing.assert_array_equal(stored.x.values, expected.x.values, strict=True)
        np.testing.assert_array_equal(stored.y.values, expected.y.values, strict=True)
        np.testing.assert_array_equal(stored.band.values, expected.band.values)
        assert stored.rio.nodata == expected.rio.nodata
    finally:
        expected.close()


def chunk_slots(session, array_path: str) -> set[int]:
    """The slots at which ``array_path`` has chunks in ``session``."""

    async def collect() -> set[int]:
        return {coordinates[0] async for coordinates in session.chunk_coordinates(f"/{array_path}")}

    return sync(collect())


def existing_chunk_slots(session, array_path: str) -> set[int]:
    """The slots at which ``array_path`` has chunks in an uncommitted session.

    A writable session's ``chunk_coordinates`` also lists chunks deleted in it
    (Icechunk 2.3), so each is looked up.
    """

    async def collect() -> set[int]:
        found = set()
        async for coordinates in session.chunk_coordinates(f"/{array_path}"):
            key = f"{array_path}/c/" + "/".join(str(index) for index in coordinates)
            if await session.store.exists(key):
                found.add(coordinates[0])
        return found

    return sync(collect())


def test_every_asset_reads_back_equal_to_its_source_grid_by_grid(repo, rasters):
    writer = repo.writer()
    writer.ensure_collection("c")
    staged, nbytes = stage(writer, make_item("item1"), rasters)
    writer.commit("item1")
    view = repo.view()

    assert nbytes == 2 * 3 * 48 * 64 * 2 + 30 * 40 * 4 + 24 * 32 * 2
    same_grid = view.item_arrays("c", "item1", assets=["visual", "swir"])
    assert list(same_grid.data_vars) == ["visual", "swir"]
    for key in ("visual", "swir"):
        assert_same_raster(same_grid[key], rasters[key])
    for key in ("cloud", "scl"):
        alone = view.item_arrays("c", "item1", assets=[key])
        assert list(alone.data_vars) == [key]
        assert_same_raster(alone[key], rasters[key])

    # The row says where each asset is, and on which grid; the committed row is the staged one.
    arrays = read_arrays_asset(view.item("c", "item1"))
    assert arrays == read_arrays_asset(staged)
    for key, path in rasters.items():
        with rasterio.open(path) as source:
            assert arrays.pixels[key].crs == source.crs.to_string()
            assert arrays.pixels[key].transform == tuple(source.transform)[:6]
            assert arrays.pixels[key].shape == (source.count, source.height, source.width)
    # Assets on one grid share the stacks (one array each); the others are on lattices of their own.
    stacks = {key: {piece.stack for piece in where.pieces} for key, where in arrays.pixels.items()}
    assert stacks["visual"] == stacks["swir"]
    assert len({frozenset(paths) for paths in stacks.values()}) == 3
    assert set(view.stacks("c")) == set().union(*stacks.values())
    for where in arrays.pixels.values():
        for piece in where.pieces:
            assert view.has_array(f"{piece.stack}/{piece.array}")
            assert view.slot_items(piece.stack) == {piece.slot: "item1"}


def test_assets_on_different_grids_cannot_share_a_dataset(repo, rasters):
    ingest(repo, "item1", rasters)
    view = repo.view()
    with pytest.raises(ValueError, match="another grid") as everything:
        view.item_arrays("c", "item1")
    assert "'cloud'" in str(everything.value) and "'scl'" in str(everything.value)
    with pytest.raises(ValueError, match=r"\['cloud'\]"):
        view.item_arrays("c", "item1", assets=["visual", "cloud"])
    with pytest.raises(ValueError, match="nir"):
        view.item_arrays("c", "item1", assets=["nir"])


def test_another_crs_is_another_stack_and_another_band_count_another_array(repo, rasters, tmp_path):
    pixels = np.arange(3 * 48 * 64, dtype=np.uint16).reshape(3, 48, 64)
    other_zone = make_tif(tmp_path / "zone34.tif", pixels, crs="EPSG:32634", transform=UTM_10M)
    one_band = make_tif(tmp_path / "one.tif", pixels[:1], crs=UTM, transform=UTM_10M)
    staged = ingest(repo, "item1", {"visual": rasters["visual"], "zone34": other_zone, "b01": one_band})
    view = repo.view()

    pieces = read_arrays_asset(staged).pixels
    assert {p.stack for p in pieces["zone34"].pieces}.isdisjoint(p.stack for p in pieces["visual"].pieces)
    assert [p.stack for p in pieces["b01"].pieces] == [p.stack for p in pieces["visual"].pieces]
    assert {p.array for p in pieces["b01"].pieces} == {"b01"} and {p.array for p in pieces["visual"].pieces} == {
        "visual"
    }
    assert_same_raster(view.item_arrays("c", "item1", assets=["visual"]).visual, rasters["visual"])
    assert_same_raster(view.item_arrays("c", "item1", assets=["zone34"]).zone34, other_zone)
    assert_same_raster(view.item_arrays("c", "item1", assets=["b01"]).b01, one_band)


def test_assets_with_other_band_counts_are_named_when_mixed(repo, rasters, tmp_path):
    """A Dataset has one ``band`` dimension: a 1-band and a 3-band asset cannot share it, and the error says which."""
    one_band = make_tif(tmp_path / "one.tif", np.ones((1, 48, 64), dtype=np.uint16), crs=UTM, transform=UTM_10M)
    ingest(repo, "item1", {"visual": rasters["visual"], "b01": one_band})
    with pytest.raises(ValueError) as mixed:
        repo.view().item_arrays("c", "item1", assets=["visual", "b01"])
    # Named, with what to do (as for assets on another grid), not xarray's own complaint about sizes.
    assert "'b01'" in str(mixed.value) and "on their own" in str(mixed.value)


def test_item_arrays_are_what_rioxarray_reads_and_the_stack_is_georeferenced(repo, rasters):
    """What ``to_zarr`` of the files would have given: same values, attributes and coordinates, georeferenced."""
    ingest(repo, "item1", {"visual": rasters["visual"], "swir": rasters["swir"], "cloud": rasters["cloud"]})
    view = repo.view()

    item = view.item_arrays("c", "item1", assets=["visual", "swir"])
    assert "spatial_ref" in item.coords
    assert item.rio.crs == CRS.from_user_input(UTM)
    assert item.rio.transform().almost_equals(UTM_10M)
    # No identity scale/offset attrs: plain decoding keeps the integer dtype.
    assert item.visual.dtype == np.uint16 and xr.decode_cf(item).visual.dtype == np.uint16
    for key in ("visual", "swir"):
        expected = read_granule(rasters[key])["data"]
        got = item[key]
        xr.testing.assert_equal(got.drop_vars("spatial_ref"), expected.drop_vars("spatial_ref").rename(key))
        assert got.attrs == expected.attrs
        assert got.rio.crs == expected.rio.crs and got.rio.transform() == expected.rio.transform()
    cloud = view.item_arrays("c", "item1", assets=["cloud"])
    assert cloud.rio.crs == CRS.from_epsg(4326)
    assert cloud.rio.transform().almost_equals(WGS84_GRID)

    # The stack itself is a plain georeferenced Dataset: any xarray reads it without floe.
    (piece,) = read_arrays_asset(view.item("c", "item1")).pixels["visual"].pieces
    stack = xr.open_zarr(view.session.store, group=piece.stack, consolidated=False, chunks=None)
    assert stack.rio.crs == CRS.from_user_input(UTM)
    row, column, height, width = piece.window
    np.testing.assert_array_equal(stack.x.values[column : column + width], item.x.values)
    np.testing.assert_array_equal(stack.y.values[row : row + height], item.y.values)
    window = stack.visual.isel(slot=piece.slot, y=slice(row, row + height), x=slice(column, column + width))
    np.testing.assert_array_equal(window.values, item.visual.values)


def test_item_coordinates_are_rioxarray_s_to_the_last_bit(repo, rasters):
    ingest(repo, "item1", {"cloud": rasters["cloud"]})
    cloud = repo.view().item_arrays("c", "item1").cloud
    expected = rioxarray.open_rasterio(rasters["cloud"], masked=False)
    np.testing.assert_array_equal(cloud.x.values, expected.x.values)
    np.testing.assert_array_equal(cloud.y.values, expected.y.values)
    expected.close()


def test_nodata_and_scale_offset_are_kept_as_cf_attributes(repo, rasters):
    ingest(repo, "item1", rasters)
    view = repo.view()

    raw_scl = view.item_arrays("c", "item1", assets=["scl"]).scl
    assert raw_scl.dtype == np.uint16
    assert raw_scl.rio.nodata == SCL_NODATA
    assert raw_scl.attrs["scale_factor"] == pytest.approx(0.0001)
    assert raw_scl.attrs["add_offset"] == pytest.approx(-0.1)
    assert "scale_factor" not in view.item_arrays("c", "item1", assets=["visual"]).visual.attrs

    # CF decoding masks nodata and applies scale/offset, like open_rasterio(mask_and_scale=True).
    decoded = xr.decode_cf(view.item_arrays("c", "item1", assets=["cloud"])).cloud
    assert decoded.encoding["_FillValue"] == CLOUD_NODATA
    source = rioxarray.open_rasterio(rasters["cloud"], masked=True)
    np.testing.assert_array_equal(decoded.values, source.values)
    assert np.isnan(decoded.values[0, :3, :7]).all()
    source.close()

    decoded_scl = xr.decode_cf(view.item_arrays("c", "item1", assets=["scl"])).scl
    expected = rioxarray.open_rasterio(rasters["scl"], mask_and_scale=True)
    np.testing.assert_allclose(decoded_scl.values, expected.values, equal_nan=True)
    expected.close()

    # The stacks' own arrays carry the same attributes: xarray decodes a stack the same way.
    (piece,) = read_arrays_asset(view.item("c", "item1")).pixels["scl"].pieces
    stack = xr.open_zarr(view.session.store, group=piece.stack, consolidated=False, chunks=None)
    row, column, height, width = piece.window
    window = stack.scl.isel(slot=piece.slot, y=slice(row, row + height), x=slice(column, column + width))
    np.testing.assert_allclose(window.values, decoded_scl.values, equal_nan=True)


@pytest.mark.parametrize(
    ("tile", "chunk", "expected"),
    [(4096, 512, (1, 1, 512, 512)), (64, 32, (1, 1, 32, 32)), (16, 32, (1, 1, 16, 16))],
)
def test_chunks_are_one_slot_and_one_band_by_chunk_clipped_to_the_tile(tmp_path, rasters, tile, chunk, expected):
    repository = Repository.create(tmp_path / "chunked", Settings(arrays=ArraysSettings(tile=tile, chunk=chunk)))
    staged = ingest(repository, "item1", {"visual": rasters["visual"]})
    view = repository.view()
    pieces = read_arrays_asset(staged).pixels["visual"].pieces
    for piece in pieces:
        assert zarr.open_array(view.session.store, path=f"{piece.stack}/{piece.array}", mode="r").chunks == expected
    # 48x64 pixels cover 1 tile of 4096 or 64 (once aligned), many of 16.
    assert len(pieces) > 1 if tile == 16 else len(pieces) <= 2
    assert_same_raster(view.item_arrays("c", "item1").visual, rasters["visual"])


def test_stacks_are_created_in_a_commit_of_their_own_and_the_writer_stages_only_slices(repo, rasters):
    """Every writer of a grid shares its stacks: they are committed alone, so writers never collide on nodes."""
    writer = repo.writer()
    writer.ensure_collection("c")
    before = repo.log()[0].snapshot_id
    staged, _ = stage(writer, make_item("item1"), rasters)

    created = repo.log()[0]
    assert created.parent_id == before and created.message.startswith("floe: create 3 stack(s)")
    status = writer.session.status()
    assert not (status.new_groups or status.new_arrays or status.updated_groups or status.updated_arrays)
    assert not (status.deleted_groups or status.deleted_arrays)
    pieces = read_arrays_asset(staged).pieces()
    slots = {(piece.stack, piece.slot) for piece in pieces}
    changed = {path: coordinates for path, coordinates in status.updated_chunks.items()}
    assert {path.rsplit("/", 1)[0].lstrip("/") for path in changed} == {stack for stack, _ in slots}
    for path, coordinates in changed.items():
        stack = path.rsplit("/", 1)[0].lstrip("/")
        assert {coordinate[0] for coordinate in coordinates} == {slot for name, slot in slots if name == stack}
    writer.commit("item1")

    # A second granule on the same grids needs no new node: no commit before its own.
    second = repo.writer()
    tip = repo.log()[0].snapshot_id
    stage(second, make_item("item2"), rasters)
    assert repo.log()[0].snapshot_id == tip
    second.commit("item2")
    view = repo.view()
    for stack in view.stacks("c"):
        assert sorted(view.slot_items(stack).values()) == ["item1", "item2"]


def ingest_granule(repository: Repository, item_id: str, assets: dict[str, Path], *, virtual: bool = False):
    """One granule through the pipeline's batch (what ``floe ingest`` runs): new, changed or replaced."""
    item = make_item(item_id)
    item["assets"] = {
        key: {"href": str(path), "type": "image/tiff; application=geotiff"} for key, path in assets.items()
    }
    granule = granule_from_item(item, f"{item_id}.json", None)
    assert set(granule.rasters) == set(assets)
    return commit_batch(repository, repository.settings.branch, [granule], f"ingest {item_id}", virtual=virtual)


def test_reingest_replaces_the_old_slices_and_frees_their_slots(repo, rasters):
    first = ingest_granule(repo, "item1", rasters)
    assert first.commit.rows_added == 1 and not first.rejected
    view = repo.view()
    old = read_arrays_asset(view.item("c", "item1"))

    # The same item again with one asset only (its raster set changed): its row and arrays are replaced.
    second = ingest_granule(repo, "item1", {"swir": rasters["swir"]})
    assert second.replaced == 1 and not second.rejected
    view = repo.view()
    new = read_arrays_asset(view.item("c", "item1"))
    assert sorted(new.pixels) == ["swir"]
    assert_same_raster(view.item_arrays("c", "item1").swir, rasters["swir"])
    with pytest.raises(ValueError, match="visual"):
        view.item_arrays("c", "item1", assets=["visual"])

    # Every old slot is free and none of its chunks is left, in every array the old pieces used.
    new_slots = {(piece.stack, piece.slot) for piece in new.pieces()}
    assert new_slots.isdisjoint((piece.stack, piece.slot) for piece in old.pieces())
    for piece in old.pieces():
        assert piece.slot not in view.slot_items(piece.stack)
        assert piece.slot not in chunk_slots(view.session, f"{piece.stack}/{piece.array}")
    occupied = {(stack, slot) for stack in view.stacks("c") for slot in view.slot_items(stack)}
    assert occupied == new_slots


@pytest.fixture
def broken(tmp_path: Path, rasters) -> dict[str, Path]:
    folder = tmp_path / "broken"
    folder.mkdir()
    truncated = folder / "truncated.tif"
    truncated.write_bytes(rasters["visual"].read_bytes()[:1000])
    text = folder / "notes.tif"
    text.write_text("this is not a TIFF\n")
    return {"truncated": truncated, "text": text, "missing": folder / "missing.tif"}


@pytest.mark.parametrize(
    ("which", "reason"),
    [("truncated", "truncated or corrupt"), ("text", "not a readable GeoTIFF"), ("missing", "no such file")],
)
def test_read_granule_refuses_unreadable_files(broken, which, reason):
    with pytest.raises(InvalidRaster) as caught:
        read_granule(broken[which])
    assert str(broken[which]) in str(caught.value)
    assert reason in str(caught.value)
    assert caught.value.path == str(broken[which])
    assert caught.value.kind == "invalid-raster"
    assert isinstance(caught.value, FloeError)


def test_read_granule_refuses_a_raster_without_crs(tmp_path):
    path = make_tif(tmp_path / "plain.tif", np.ones((1, 8, 8), dtype=np.uint8), crs=None, driver="GTiff")
    with pytest.warns(NotGeoreferencedWarning), pytest.raises(InvalidRaster, match="no CRS") as caught:
        read_granule(path)
    assert str(path) in str(caught.value)


def test_read_granule_loads_pixels_eagerly_and_keeps_the_dtype(rasters):
    granule = read_granule(rasters["cloud"])
    assert list(granule.data_vars) == ["data"]
    assert isinstance(granule.data.variable._data, np.ndarray)
    assert granule.data.dtype == np.float32
    assert granule.data.rio.nodata == CLOUD_NODATA
    assert_same_raster(granule.data, rasters["cloud"])


def assert_nothing_staged(repository: Repository, writer, tip: str) -> None:
    """No array change in the writer's session and no commit (of stacks) on the branch."""
    assert writer.session.status().is_empty()
    assert not writer.session.has_uncommitted_changes
    assert repository.log()[0].snapshot_id == tip
    assert repository.view().stacks("c") == []


@pytest.mark.parametrize("which", ["truncated", "text", "missing"])
def test_a_bad_asset_stages_nothing_of_the_granule(repo, rasters, broken, which):
    writer = repo.writer()
    writer.ensure_collection("c")
    tip = repo.log()[0].snapshot_id
    assets = {"visual": rasters["visual"], "cloud": rasters["cloud"], "bad": broken[which], "swir": rasters["swir"]}
    with pytest.raises(InvalidRaster) as caught:
        stage(writer, make_item("item2"), assets)
    assert str(broken[which]) in str(caught.value)
    assert_nothing_staged(repo, writer, tip)
    assert writer.pending_items == 0


@pytest.mark.parametrize("key", ["a/b", ".zattrs", ".hidden", "__meta", "", "x", "spatial_ref", "item", "datetime"])
def test_hostile_asset_keys_are_refused(repo, rasters, key):
    """Asset keys name arrays beside a stack's coordinates: one that would land elsewhere or clobber one is refused."""
    writer = repo.writer()
    writer.ensure_collection("c")
    tip = repo.log()[0].snapshot_id
    with pytest.raises(InvalidRaster) as caught:
        read_assets({"visual": rasters["visual"], key: rasters["swir"]})
    assert repr(key) in str(caught.value) and caught.value.asset == key
    # stage_arrays is a library entry point of its own: it refuses the key even when the files were read elsewhere.
    read = {"visual": read_granule(rasters["visual"]), key: read_granule(rasters["swir"])}
    with pytest.raises(InvalidRaster) as caught:
        stage_arrays(writer, make_item("item3"), read)
    assert caught.value.asset == key
    assert_nothing_staged(repo, writer, tip)


@pytest.mark.parametrize("collection", ["", "a/b", "..", "%2e%2e"])
def test_a_collection_that_is_not_one_path_segment_is_refused(repo, rasters, collection):
    writer = repo.writer()
    tip = repo.log()[0].snapshot_id
    with pytest.raises(ValueError, match="collection"):
        stage_arrays(writer, make_item("item1", collection=collection), read_assets({"visual": rasters["visual"]}))
    assert writer.session.status().is_empty() and repo.log()[0].snapshot_id == tip


def test_a_failed_write_clears_what_it_staged_and_nothing_else(repo, rasters, monkeypatch):
    writer = repo.writer()
    writer.ensure_collection("c")
    kept, _ = stage(writer, make_item("kept"), {"visual": rasters["visual"]})
    real_write = arrays_module.write_slices
    failed = []

    async def failing_write(store, plan, **kwargs):
        failed.append(await real_write(store, plan, **kwargs))  # the slices land, then the storage fails
        raise OSError("disk full")

    monkeypatch.setattr(arrays_module, "write_slices", failing_write)
    with pytest.raises(OSError, match="disk full"):
        stage_arrays(writer, make_item("lost"), read_assets({"visual": rasters["visual"], "cloud": rasters["cloud"]}))
    assert failed and failed[0] > 0
    monkeypatch.undo()

    # Only the kept granule's slices are staged: the lost one's chunks and slot coordinates are gone.
    kept_slots = {(piece.stack, piece.slot) for piece in read_arrays_asset(kept).pieces()}
    for path in writer.session.status().updated_chunks:
        stack = path.rsplit("/", 1)[0].lstrip("/")
        assert {(stack, slot) for slot in existing_chunk_slots(writer.session, path.lstrip("/"))} <= kept_slots, path
    writer.commit("kept")
    view = repo.view()
    assert_same_raster(view.item_arrays("c", "kept").visual, rasters["visual"])
    occupied = {(stack, slot): item for stack in view.stacks("c") for slot, item in view.slot_items(stack).items()}
    assert occupied == dict.fromkeys(kept_slots, "kept")
