"""write_granule/read_granule against a real Icechunk repository on local disk, with rasters made here."""

from __future__ import annotations

import warnings
from pathlib import Path

import icechunk
import numpy as np
import pytest
import rasterio
import rioxarray
import xarray as xr
import zarr
import zarr.errors
from rasterio.crs import CRS
from rasterio.errors import NotGeoreferencedWarning
from rasterio.transform import from_origin

from ingest.errors import FloeError
from ingest.rasters import GranuleArrays, InvalidRaster, read_granule, write_granule
from ingest.rasters import _copy as copy_module
from tests.conftest import group_exists

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
        # The first asset fixes the item group's grid.
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


@pytest.fixture
def repo(tmp_path: Path) -> icechunk.Repository:
    """A repository whose main branch has the collection group "c" committed, as the writer guarantees."""
    repository = icechunk.Repository.create(icechunk.local_filesystem_storage(str(tmp_path / "repo")))
    session = repository.writable_session("main")
    zarr.open_group(session.store, path="c", mode="a")
    session.commit("collection c")
    return repository


def committed_store(repository: icechunk.Repository) -> icechunk.IcechunkStore:
    return repository.readonly_session(branch="main").store


def open_raw(store, group: str) -> xr.Dataset:
    """Exactly the stored values: no CF masking or scaling."""
    return xr.open_zarr(store, group=group, consolidated=False, mask_and_scale=False)


def assert_same_raster(stored: xr.DataArray, source: Path) -> None:
    """Pixels, dtype, CRS, transform, coordinates and nodata equal the source file's."""
    expected = rioxarray.open_rasterio(source, masked=False)
    try:
        assert stored.dims == ("band", "y", "x")
        assert stored.dtype == expected.dtype
        np.testing.assert_array_equal(stored.values, expected.values, strict=True)
        assert stored.rio.crs == expected.rio.crs
        assert stored.rio.transform().almost_equals(expected.rio.transform())
        np.testing.assert_array_equal(stored.x.values, expected.x.values)
        np.testing.assert_array_equal(stored.y.values, expected.y.values)
        np.testing.assert_array_equal(stored.band.values, expected.band.values)
        assert stored.rio.nodata == expected.rio.nodata
    finally:
        expected.close()


def test_assets_on_the_first_grid_share_the_item_dataset_and_others_get_subgroups(repo, rasters):
    session = repo.writable_session("main")
    result = write_granule(session.store, "c/item1", rasters)
    session.commit("item1")

    store = committed_store(repo)
    item = open_raw(store, "c/item1")
    assert set(item.data_vars) == {"visual", "swir"}
    for key in ("visual", "swir"):
        assert_same_raster(item[key], rasters[key])
    for key in ("cloud", "scl"):
        assert key not in item.variables
        sub = open_raw(store, f"c/item1/{key}")
        assert list(sub.data_vars) == [key]
        assert_same_raster(sub[key], rasters[key])

    assert result == GranuleArrays(
        group="c/item1",
        variables={
            "visual": "c/item1/visual",
            "swir": "c/item1/swir",
            "cloud": "c/item1/cloud/cloud",
            "scl": "c/item1/scl/scl",
        },
        bytes_written=2 * 3 * 48 * 64 * 2 + 30 * 40 * 4 + 24 * 32 * 2,
        crs=UTM,
        shape=(3, 48, 64),
    )
    for path in result.variables.values():
        zarr.open_array(store, path=path, mode="r")


def test_same_pixels_grid_in_another_crs_or_band_count_is_a_different_grid(repo, rasters, tmp_path):
    """A Dataset has one CRS and one band dimension: either differing forces a subgroup."""
    pixels = np.arange(3 * 48 * 64, dtype=np.uint16).reshape(3, 48, 64)
    other_zone = make_tif(tmp_path / "zone34.tif", pixels, crs="EPSG:32634", transform=UTM_10M)
    one_band = make_tif(tmp_path / "one.tif", pixels[:1], crs=UTM, transform=UTM_10M)
    session = repo.writable_session("main")
    result = write_granule(
        session.store, "c/item1", {"visual": rasters["visual"], "zone34": other_zone, "b01": one_band}
    )
    session.commit("item1")

    assert result.variables == {
        "visual": "c/item1/visual",
        "zone34": "c/item1/zone34/zone34",
        "b01": "c/item1/b01/b01",
    }
    store = committed_store(repo)
    assert list(open_raw(store, "c/item1").data_vars) == ["visual"]
    assert_same_raster(open_raw(store, "c/item1/zone34").zone34, other_zone)
    assert_same_raster(open_raw(store, "c/item1/b01").b01, one_band)


def test_plain_open_zarr_is_georeferenced_without_decode_coords(repo, rasters):
    """spatial_ref must come back as a coordinate with the default decode_coords, or rio.crs is None."""
    session = repo.writable_session("main")
    write_granule(session.store, "c/item1", {"visual": rasters["visual"], "cloud": rasters["cloud"]})
    session.commit("item1")
    store = committed_store(repo)

    item = xr.open_zarr(store, group="c/item1", consolidated=False)
    assert "spatial_ref" in item.coords
    assert list(item.data_vars) == ["visual"]
    assert item.rio.crs == CRS.from_user_input(UTM)
    assert item.rio.transform().almost_equals(UTM_10M)
    # No identity scale/offset attrs: plain decoding keeps the integer dtype.
    assert item.visual.dtype == np.uint16

    cloud = xr.open_zarr(store, group="c/item1/cloud", consolidated=False)
    assert cloud.rio.crs == CRS.from_epsg(4326)
    assert cloud.rio.transform().almost_equals(WGS84_GRID)


def test_nodata_and_scale_offset_are_kept_as_cf_attributes(repo, rasters):
    session = repo.writable_session("main")
    write_granule(session.store, "c/item1", rasters)
    session.commit("item1")
    store = committed_store(repo)

    raw_scl = open_raw(store, "c/item1/scl").scl
    assert raw_scl.dtype == np.uint16
    assert raw_scl.rio.nodata == SCL_NODATA
    assert raw_scl.attrs["scale_factor"] == pytest.approx(0.0001)
    assert raw_scl.attrs["add_offset"] == pytest.approx(-0.1)
    assert "scale_factor" not in open_raw(store, "c/item1").visual.attrs

    # Default decoding masks nodata and applies scale/offset, like open_rasterio(mask_and_scale=True).
    decoded = xr.open_zarr(store, group="c/item1/cloud", consolidated=False).cloud
    assert decoded.rio.encoded_nodata == CLOUD_NODATA
    source = rioxarray.open_rasterio(rasters["cloud"], masked=True)
    np.testing.assert_array_equal(decoded.values, source.values)
    assert np.isnan(decoded.values[0, :3, :7]).all()
    source.close()

    decoded_scl = xr.open_zarr(store, group="c/item1/scl", consolidated=False).scl
    expected = rioxarray.open_rasterio(rasters["scl"], mask_and_scale=True)
    np.testing.assert_allclose(decoded_scl.values, expected.values, equal_nan=True)
    expected.close()


@pytest.mark.parametrize(("chunk", "expected"), [(512, (1, 48, 64)), (32, (1, 32, 32))])
def test_chunks_are_one_band_by_chunk_clipped_to_the_array(repo, rasters, chunk, expected):
    session = repo.writable_session("main")
    result = write_granule(session.store, "c/item1", {"visual": rasters["visual"]}, chunk=chunk)
    assert zarr.open_array(session.store, path=result.variables["visual"], mode="r").chunks == expected
    session.commit("item1")
    assert_same_raster(open_raw(committed_store(repo), "c/item1").visual, rasters["visual"])


def test_only_the_item_group_and_below_are_staged(repo, rasters):
    session = repo.writable_session("main")
    write_granule(session.store, "c/item1", rasters)
    status = session.status()
    touched = status.new_groups | status.new_arrays | status.updated_groups | status.updated_arrays
    assert "/c/item1" in status.new_groups
    assert "/c/item1/cloud" in status.new_groups
    assert all(path.startswith("/c/item1") for path in touched)
    assert not status.deleted_groups
    assert not status.deleted_arrays


def test_rewriting_an_item_replaces_it_whole(repo, rasters):
    session = repo.writable_session("main")
    write_granule(session.store, "c/item1", rasters)
    session.commit("first")

    session = repo.writable_session("main")
    write_granule(session.store, "c/item1", {"swir": rasters["swir"]})
    session.commit("second")

    store = committed_store(repo)
    item = open_raw(store, "c/item1")
    assert list(item.data_vars) == ["swir"]
    assert_same_raster(item.swir, rasters["swir"])
    assert not group_exists(store, "c/item1/cloud")
    assert not group_exists(store, "c/item1/scl")


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


@pytest.mark.parametrize("which", ["truncated", "text", "missing"])
def test_a_bad_asset_stages_nothing_of_the_granule(repo, rasters, broken, which):
    session = repo.writable_session("main")
    assets = {"visual": rasters["visual"], "cloud": rasters["cloud"], "bad": broken[which], "swir": rasters["swir"]}
    with pytest.raises(InvalidRaster) as caught:
        write_granule(session.store, "c/item2", assets)
    assert str(broken[which]) in str(caught.value)
    assert session.status().is_empty()
    assert not session.has_uncommitted_changes
    assert not group_exists(session.store, "c/item2")


@pytest.mark.parametrize("key", ["a/b", ".zattrs", ".hidden", "__meta", "", "x", "spatial_ref"])
def test_hostile_asset_keys_are_refused(repo, rasters, key):
    session = repo.writable_session("main")
    with pytest.raises(InvalidRaster) as caught:
        write_granule(session.store, "c/item3", {"visual": rasters["visual"], key: rasters["swir"]})
    assert repr(key) in str(caught.value)
    assert caught.value.asset == key
    assert session.status().is_empty()


def test_a_failed_write_removes_the_half_written_item(repo, rasters, monkeypatch):
    real_write = copy_module._write_layout
    written: list[str] = []

    async def failing_write(store, layout, *, chunk):
        await real_write(store, layout[:1], chunk=chunk)  # the item group lands, then the storage fails
        written.append(layout[0][0])
        raise OSError("disk full")

    monkeypatch.setattr(copy_module, "_write_layout", failing_write)
    session = repo.writable_session("main")
    with pytest.raises(OSError, match="disk full"):
        write_granule(session.store, "c/item4", rasters)
    assert written == ["c/item4"]
    assert not group_exists(session.store, "c/item4")
    assert session.status().is_empty()


def test_the_collection_group_must_exist(tmp_path, rasters):
    repository = icechunk.Repository.create(icechunk.local_filesystem_storage(str(tmp_path / "bare")))
    session = repository.writable_session("main")
    zarr.open_group(session.store, path="", mode="a")
    session.commit("root")
    session = repository.writable_session("main")
    with pytest.raises(ValueError, match="'nope' does not exist"):
        write_granule(session.store, "nope/item", {"visual": rasters["visual"]})
    assert session.status().is_empty()


@pytest.mark.parametrize("group", ["", "/c/item", "c/item/", "c//item", "c/../item"])
def test_group_paths_that_zarr_would_normalise_are_refused(repo, rasters, group):
    session = repo.writable_session("main")
    with pytest.raises(ValueError, match="group"):
        write_granule(session.store, group, {"visual": rasters["visual"]})
    assert session.status().is_empty()


def _documents(store, prefix: str) -> dict[str, dict]:
    """Every zarr.json under ``prefix``, parsed, by path relative to it."""
    import json

    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    async def collect() -> dict[str, dict]:
        found = {}
        async for key in store.list_prefix(prefix):
            if key.endswith("zarr.json"):
                document = await store.get(key, default_buffer_prototype())
                found[key[len(prefix) :]] = json.loads(document.to_bytes())
        return found

    return sync(collect())


def _xarray_reference(store, path: str, members: dict[str, xr.Dataset], chunk: int) -> None:
    """What floe's copies are defined as: xarray's own to_zarr of the item Dataset, with floe's encoding."""
    arrays, encoding = {}, {}
    for key, ds in members.items():
        array = ds[copy_module.GRANULE_VARIABLE].copy(deep=False)
        array.encoding = {**array.encoding, "coordinates": copy_module.GRID_MAPPING}
        arrays[key] = array
        _bands, height, width = array.shape
        encoding[key] = {"chunks": (1, min(chunk, height), min(chunk, width))}
    encoding.update({name: {"_FillValue": None} for name in ("x", "y")})
    xr.Dataset(arrays).to_zarr(store, group=path, mode="w", zarr_format=3, consolidated=False, encoding=encoding)


def test_copies_are_the_documents_and_values_xarray_itself_writes(repo, rasters):
    """floe writes the Zarr nodes directly (faster than to_zarr); readers must not see any difference."""
    session = repo.writable_session("main")
    arrays = write_granule(session.store, "c/floe", rasters, chunk=32)
    # The same layout through xarray: the item Dataset (assets on the first grid), then each other grid.
    read = {key: read_granule(path) for key, path in rasters.items()}
    groups: dict[str, dict[str, xr.Dataset]] = {}
    for key, path in arrays.variables.items():
        groups.setdefault(path.rsplit("/", 1)[0].replace("c/floe", "c/xarray", 1), {})[key] = read[key]
    for group, members in sorted(groups.items()):  # the item group first: mode "w" clears it
        _xarray_reference(session.store, group, members, chunk=32)

    ours, theirs = _documents(session.store, "c/floe/"), _documents(session.store, "c/xarray/")
    assert len(ours) > 10 and ours == theirs
    for group in groups:
        mine = group.replace("c/xarray", "c/floe", 1)
        for mask_and_scale in (False, True):
            expected = xr.open_zarr(session.store, group=group, consolidated=False, mask_and_scale=mask_and_scale)
            got = xr.open_zarr(session.store, group=mine, consolidated=False, mask_and_scale=mask_and_scale)
            xr.testing.assert_identical(got.load(), expected.load())
            assert got.rio.crs == expected.rio.crs and got.rio.transform() == expected.rio.transform()
