"""Virtual ingest (``--virtual``): COG tiles referenced from a real floe repository on local disk, nothing copied.

Rasters come from make_archive (the pipeline's own sample data) or are made
here with rasterio; all are small (at most 256 px a side).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import icechunk
import numpy as np
import pytest
import rasterio
import rioxarray
import xarray as xr
from rasterio.transform import from_origin

from ingest.errors import FloeError, InvalidRaster
from ingest.lifecycle import relocate
from ingest.rasters import (
    GranuleArrays,
    NotVirtualizable,
    VirtualGranuleArrays,
    write_granule,
    write_virtual_granule,
    write_virtual_or_copy,
)
from ingest.rasters import _virtual as virtual_module
from ingest.repository import Repository
from ingest.sample import make_archive
from ingest.storage import ARRAYS_DIR
from tests.conftest import group_exists


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    """make_archive's COGs by collection: optical (pixel-interleaved), dem and landcover (single band)."""
    out = tmp_path_factory.mktemp("archive")
    make_archive(out, granules=6, seed=7)
    return {name: sorted((out / f"sample-{name}").rglob("*.tif")) for name in ("optical", "dem", "landcover")}


def make_cog(path: Path, data: np.ndarray, *, crs: str, transform, nodata=None, **extra) -> Path:
    """A COG with ``data`` (band, y, x); band-interleaved unless told otherwise."""
    bands, height, width = data.shape
    profile = {
        "driver": "COG",
        "width": width,
        "height": height,
        "count": bands,
        "dtype": data.dtype.name,
        "crs": crs,
        "transform": transform,
        "nodata": nodata,
        "compress": "deflate",
        "blocksize": 128,
        "interleave": "band",
        **extra,
    }
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(data)
    return path


@pytest.fixture
def band_interleaved(tmp_path: Path) -> Path:
    """3-band uint16, band-interleaved, horizontal-differencing predictor, edge tiles partly outside the image."""
    rng = np.random.default_rng(11)
    data = rng.integers(0, 4000, size=(3, 150, 170), dtype=np.uint16)
    return make_cog(
        tmp_path / "band3.tif",
        data,
        crs="EPSG:32633",
        transform=from_origin(500_000.0, 6_000_000.0, 10.0, 10.0),
        nodata=0,
        predictor=2,
    )


@pytest.fixture
def repo(tmp_path: Path) -> Repository:
    """A floe repository that may reference files under the test's temporary directory."""
    repository = Repository.create(tmp_path / "repo")
    repository.allow_virtual_sources([tmp_path])
    return repository


def ingest(repository: Repository, granules: dict[str, dict[str, Path]], *, virtual: bool) -> dict[str, GranuleArrays]:
    """Write each item group ``c/<name>`` in one writer and commit it."""
    writer = repository.writer()
    writer.ensure_collection("c")
    results = {}
    for name, assets in granules.items():
        write = write_virtual_granule if virtual else write_granule
        results[name] = write(writer.store, f"c/{name}", assets)
    writer.commit(f"{'virtual' if virtual else 'copy'} {len(granules)} granules")
    return results


def open_group(repository: Repository, group: str, **kwargs) -> xr.Dataset:
    return xr.open_zarr(repository.view().session.store, group=group, consolidated=False, **kwargs)


def chunk_bytes(root: Path) -> int:
    chunks = root / ARRAYS_DIR / "chunks"
    return sum(path.stat().st_size for path in chunks.rglob("*") if path.is_file()) if chunks.exists() else 0


@pytest.mark.parametrize("kind", ["dem", "landcover", "band_interleaved"])
def test_virtual_granule_reads_back_like_the_source_and_like_the_copy(kind, archive, band_interleaved, repo, tmp_path):
    source = band_interleaved if kind == "band_interleaved" else archive[kind][0]
    copy_repo = Repository.create(tmp_path / "copy")

    result = ingest(repo, {"item": {"data": source}}, virtual=True)["item"]
    ingest(copy_repo, {"item": {"data": source}}, virtual=False)

    expected = rioxarray.open_rasterio(source, mask_and_scale=False).load()
    assert isinstance(result, VirtualGranuleArrays)
    assert result.bytes_written == 0
    assert result.sources == {"data": "file://" + str(source.resolve())}
    assert result.shape == expected.shape
    assert result.bytes_referenced == expected.nbytes
    assert result.crs == expected.rio.crs.to_string()

    raw = open_group(repo, "c/item", mask_and_scale=False)
    np.testing.assert_array_equal(raw["data"].values, expected.values)
    assert raw.rio.crs == expected.rio.crs
    assert raw.rio.transform() == expected.rio.transform()
    # Same layout, names, coordinates and attributes as the copy: the same reading code works on either.
    for options in ({}, {"mask_and_scale": False}):
        xr.testing.assert_identical(
            open_group(repo, "c/item", **options).load(), open_group(copy_repo, "c/item", **options).load()
        )
    # The pixels are references to the source file, the full-resolution image only.
    assert set(repo.view().session.all_virtual_chunk_locations()) == {result.sources["data"]}
    with rasterio.open(source) as dataset:
        tile_height, tile_width = dataset.block_shapes[0]
        tiles = dataset.count * -(-dataset.height // tile_height) * -(-dataset.width // tile_width)
    assert result.references == tiles


def test_multi_asset_granule_keeps_the_copy_layout(archive, repo, tmp_path):
    """Assets on the first asset's grid share its Dataset; an asset on another grid gets its own subgroup."""
    dem = archive["dem"][0]
    with rasterio.open(dem) as src:
        twin = make_cog(
            tmp_path / "twin.tif", src.read() * 2, crs=src.crs.to_string(), transform=src.transform, nodata=src.nodata
        )
    assets = {"elevation": dem, "doubled": twin, "landcover": archive["landcover"][0]}
    copy_repo = Repository.create(tmp_path / "copy")

    result = ingest(repo, {"item": assets}, virtual=True)["item"]
    copied = ingest(copy_repo, {"item": assets}, virtual=False)["item"]

    assert (
        result.variables
        == copied.variables
        == {
            "elevation": "c/item/elevation",
            "doubled": "c/item/doubled",
            "landcover": "c/item/landcover/landcover",
        }
    )
    for group in ("c/item", "c/item/landcover"):
        xr.testing.assert_identical(open_group(repo, group).load(), open_group(copy_repo, group).load())
    assert set(repo.view().session.all_virtual_chunk_locations()) == {
        "file://" + str(path.resolve()) for path in assets.values()
    }


def test_repository_holds_no_copy_of_the_pixels(archive, repo, tmp_path):
    granules = {path.stem: {"data": path} for kind in ("dem", "landcover") for path in archive[kind]}
    copy_repo = Repository.create(tmp_path / "copy")

    virtual = ingest(repo, granules, virtual=True)
    copied = ingest(copy_repo, granules, virtual=False)

    pixel_bytes = sum(result.bytes_written for result in copied.values())
    assert pixel_bytes == sum(result.bytes_referenced for result in virtual.values()) > 0
    coordinate_bytes = 0
    for name in granules:
        dataset = open_group(repo, f"c/{name}")
        coordinate_bytes += sum(dataset[coord].nbytes for coord in dataset.coords)
    virtual_chunks, copy_chunks = chunk_bytes(tmp_path / "repo"), chunk_bytes(tmp_path / "copy")
    # Only coordinates (x, y, band, spatial_ref) are stored as chunks; the copy stores every pixel (compressed).
    assert virtual_chunks <= coordinate_bytes
    assert copy_chunks > virtual_chunks + pixel_bytes // 10
    locations = repo.view().session.all_virtual_chunk_locations()
    assert set(locations) == {"file://" + str(path.resolve()) for path in granules_paths(granules)}


def granules_paths(granules: dict[str, dict[str, Path]]) -> list[Path]:
    return [path for assets in granules.values() for path in assets.values()]


def test_pixel_interleaved_cog_is_not_virtualizable_and_falls_back_to_a_copy(archive, repo):
    optical = archive["optical"][0]
    writer = repo.writer()
    writer.ensure_collection("c")

    with pytest.raises(NotVirtualizable) as raised:
        write_virtual_granule(writer.store, "c/optical", {"visual": optical})
    assert isinstance(raised.value, FloeError) and raised.value.kind == "not-virtualizable"
    assert str(optical) in str(raised.value) and "pixel-interleaved" in str(raised.value)
    assert not group_exists(writer.store, "c/optical")  # checked before anything was written

    outcome = write_virtual_or_copy(writer.store, "c/optical", {"visual": optical})
    assert not outcome.virtual and outcome.fallback == raised.value.reason
    assert type(outcome.arrays) is GranuleArrays and outcome.arrays.bytes_written > 0
    writer.commit("fallback")
    expected = rioxarray.open_rasterio(optical, mask_and_scale=False)
    np.testing.assert_array_equal(open_group(repo, "c/optical", mask_and_scale=False)["visual"].values, expected.values)
    assert repo.view().session.all_virtual_chunk_locations() == []


def test_granule_with_one_unreferenceable_asset_is_copied_whole(archive, repo):
    writer = repo.writer()
    writer.ensure_collection("c")
    outcome = write_virtual_or_copy(writer.store, "c/mixed", {"dem": archive["dem"][0], "rgb": archive["optical"][0]})
    assert str(archive["optical"][0]) in outcome.fallback
    assert type(outcome.arrays) is GranuleArrays
    writer.commit("mixed")
    assert repo.view().session.all_virtual_chunk_locations() == []


def test_a_repository_without_a_container_for_the_file_falls_back(archive, tmp_path):
    bare = Repository.create(tmp_path / "bare")
    writer = bare.writer()
    writer.ensure_collection("c")
    dem = archive["dem"][0]
    with pytest.raises(NotVirtualizable, match="no virtual chunk container"):
        write_virtual_granule(writer.store, "c/dem", {"data": dem})
    assert not group_exists(writer.store, "c/dem")


def test_virtual_sources_are_allowed_once_and_persist(tmp_path):
    repository = Repository.create(tmp_path / "repo")
    top = "file:///" + tmp_path.resolve().parts[1] + "/"
    assert repository.allow_virtual_sources([tmp_path / "a.tif"]) == [top]
    assert repository.allow_virtual_sources([tmp_path / "b" / "c.tif"]) == []
    reopened = Repository.open(tmp_path / "repo")
    assert list(reopened.icechunk.config.virtual_chunk_containers) == [top]
    assert top in reopened.icechunk.authorized_virtual_container_prefixes


def test_missing_source_after_ingest_gives_an_error_naming_the_file(tmp_path):
    make_archive(tmp_path / "src", granules=2, seed=3)
    dem = next((tmp_path / "src").rglob("sample-dem-*.tif"))
    repository = Repository.create(tmp_path / "repo")
    repository.allow_virtual_sources([dem])
    ingest(repository, {"dem": {"data": dem}}, virtual=True)
    # A copy elsewhere (relocated, as every copy must be) carries the containers in its config and reads the
    # same files...
    shutil.copytree(tmp_path / "repo", tmp_path / "replica")
    relocate(Repository.open(tmp_path / "replica", moved_ok=True))
    replica = Repository.open(tmp_path / "replica")
    expected = rioxarray.open_rasterio(dem, mask_and_scale=False).values
    np.testing.assert_array_equal(open_group(replica, "c/dem", mask_and_scale=False)["data"].values, expected)

    # ...until the source is gone: reading then names the missing file.
    dem.unlink()
    dataset = open_group(replica, "c/dem")
    with pytest.raises(icechunk.IcechunkError, match=str(dem)) as raised:
        dataset["data"].values  # noqa: B018 - the read is the point
    assert "not found" in str(raised.value)


def test_source_modified_after_ingest_is_refused_not_misread(tmp_path, archive):
    dem = Path(shutil.copy(archive["dem"][0], tmp_path / "dem.tif"))
    repository = Repository.create(tmp_path / "repo")
    repository.allow_virtual_sources([dem])
    ingest(repository, {"dem": {"data": dem}}, virtual=True)
    stat = dem.stat()
    os.utime(dem, (stat.st_atime, time.time() + 5))
    with pytest.raises(icechunk.IcechunkError, match=str(dem)):
        open_group(repository, "c/dem")["data"].values  # noqa: B018


def test_truncated_cog_is_an_invalid_raster(archive, repo, tmp_path):
    whole = archive["landcover"][0].read_bytes()
    truncated = tmp_path / "truncated.tif"
    truncated.write_bytes(whole[: len(whole) - 200])
    writer = repo.writer()
    writer.ensure_collection("c")
    with pytest.raises(InvalidRaster, match="truncated"):
        write_virtual_granule(writer.store, "c/t", {"data": truncated})
    with pytest.raises(InvalidRaster, match="no such file"):
        write_virtual_granule(writer.store, "c/t", {"data": tmp_path / "absent.tif"})
    assert not group_exists(writer.store, "c/t")


def test_reingest_replaces_the_previous_version_whole(archive, repo):
    writer = repo.writer()
    writer.ensure_collection("c")
    write_granule(writer.store, "c/item", {"data": archive["dem"][0], "landcover": archive["landcover"][0]})
    write_virtual_granule(writer.store, "c/item", {"data": archive["dem"][1]})
    writer.commit("replace")
    assert not group_exists(repo.view().session.store, "c/item/landcover")
    expected = rioxarray.open_rasterio(archive["dem"][1], mask_and_scale=False).values
    np.testing.assert_array_equal(open_group(repo, "c/item", mask_and_scale=False)["data"].values, expected)


def test_a_failed_write_leaves_no_group(archive, repo, monkeypatch):
    writer = repo.writer()
    writer.ensure_collection("c")

    async def refuse(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(virtual_module, "_write_references", refuse)
    with pytest.raises(OSError, match="disk full"):
        write_virtual_granule(writer.store, "c/item", {"data": archive["dem"][0]})
    assert not group_exists(writer.store, "c/item")


def test_sparse_cog_falls_back_to_a_copy_that_reads_nodata_like_gdal(repo, tmp_path):
    """Unwritten tiles of a SPARSE_OK GTiff have no bytes; virtualizarr refuses zero-length references, so copy."""
    path = tmp_path / "sparse.tif"
    profile = {
        "driver": "GTiff",
        "width": 256,
        "height": 256,
        "count": 1,
        "dtype": "int16",
        "crs": "EPSG:3857",
        "transform": from_origin(0.0, 0.0, 30.0, 30.0),
        "nodata": -1,
        "tiled": True,
        "blockxsize": 128,
        "blockysize": 128,
        "sparse_ok": True,
    }
    written = np.arange(128 * 128, dtype=np.int16).reshape(1, 128, 128)
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(written, window=rasterio.windows.Window(0, 0, 128, 128))
    with rasterio.open(path) as src:
        expected = src.read()
    assert (expected[0, 128:, :] == -1).all()

    writer = repo.writer()
    writer.ensure_collection("c")
    outcome = write_virtual_or_copy(writer.store, "c/sparse", {"data": path})
    assert not outcome.virtual and str(path) in outcome.fallback and "zero-length" in outcome.fallback
    writer.commit("sparse")
    np.testing.assert_array_equal(open_group(repo, "c/sparse", mask_and_scale=False)["data"].values, expected)


@pytest.mark.parametrize(
    ("name", "profile", "virtual"),
    [
        ("strips", {"driver": "GTiff", "blockysize": 20, "compress": "lzw"}, True),
        ("zstd", {"driver": "COG", "compress": "zstd", "predictor": 2}, True),
        ("partial-strip", {"driver": "GTiff", "blockysize": 16}, False),
        ("jpeg-ycbcr", {"driver": "GTiff", "compress": "jpeg", "photometric": "ycbcr", "tiled": True}, False),
    ],
)
def test_layouts_are_referenced_or_copied_with_a_reason(name, profile, virtual, repo, tmp_path):
    rng = np.random.default_rng(5)
    bands = 3 if name == "jpeg-ycbcr" else 1
    data = rng.integers(0, 255, size=(bands, 100, 120), dtype=np.uint8)
    path = tmp_path / f"{name}.tif"
    base = {"width": 120, "height": 100, "count": bands, "dtype": "uint8", "crs": "EPSG:32633"}
    with rasterio.open(path, "w", transform=from_origin(0.0, 0.0, 10.0, 10.0), **base, **profile) as dst:
        dst.write(data)
    writer = repo.writer()
    writer.ensure_collection("c")
    outcome = write_virtual_or_copy(writer.store, f"c/{name}", {"data": path})
    writer.commit(name)

    assert outcome.virtual is virtual
    if not virtual:
        assert str(path) in outcome.fallback
    expected = rioxarray.open_rasterio(path, mask_and_scale=False).values
    np.testing.assert_array_equal(open_group(repo, f"c/{name}", mask_and_scale=False)["data"].values, expected)
    assert bool(repo.view().session.all_virtual_chunk_locations()) is virtual


@pytest.mark.s3
def test_repository_on_object_storage_references_local_files(archive, s3_root, s3_settings):
    """The containers live in the repository's config on S3 too; another process opening it can read the arrays."""
    dem = archive["dem"][0]
    repository = Repository.create(s3_root, s3_settings)
    assert repository.allow_virtual_sources([dem]) == ["file:///" + dem.resolve().parts[1] + "/"]
    result = ingest(repository, {"dem": {"data": dem}}, virtual=True)["dem"]
    assert isinstance(result, VirtualGranuleArrays)

    reopened = Repository.open(s3_root, s3_settings)
    expected = rioxarray.open_rasterio(dem, mask_and_scale=False).values
    np.testing.assert_array_equal(open_group(reopened, "c/dem", mask_and_scale=False)["data"].values, expected)
    assert set(reopened.view().session.all_virtual_chunk_locations()) == {result.sources["data"]}
