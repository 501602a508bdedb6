"""Virtual ingest (``--virtual``): COG tiles referenced from fixed stacks of a real floe repository, nothing copied.

Rasters come from make_archive (the pipeline's own sample data) or are made
here with rasterio; all are small (at most 256 px a side). Granules go
through ``stage_references`` (and the copy through ``stage_arrays``) with a
real Writer and commit, or through the pipeline's batch where the fallback to
a copy is the point, and are read back with ``View.item_arrays``.
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
from zarr.core.sync import sync

from ingest.errors import FloeError, InvalidRaster
from ingest.lifecycle import relocate
from ingest.pipeline import _arrays as arrays_module
from ingest.pipeline import stage_arrays
from ingest.pipeline._arrays import stage_references
from ingest.rasters import NotVirtualizable, read_assets
from ingest.repository import Repository
from ingest.sample import make_archive
from ingest.stac import STACKS, arrays_asset, read_arrays_asset, with_arrays_asset
from ingest.storage import ARRAYS_DIR
from tests.conftest import make_item
from tests.rasters.test_copy import chunk_slots, existing_chunk_slots, ingest_granule


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


def ingest(
    repository: Repository, granules: dict[str, dict[str, Path]], *, virtual: bool
) -> dict[str, tuple[dict, int]]:
    """Stage each granule (item ``<name>`` of collection ``c``) in one writer and commit; returns the staged items
    and the bytes each stands for (referenced or copied)."""
    writer = repository.writer()
    writer.ensure_collection("c")
    results = {}
    for number, (name, assets) in enumerate(granules.items()):
        item = make_item(name, when=f"2024-01-{number + 1:02d}T00:00:00Z")
        if virtual:
            rasters = {key: str(path) for key, path in assets.items()}
            placed, nbytes = stage_references(writer, item, rasters, repository.settings.arrays)
        else:
            placed, nbytes = stage_arrays(writer, item, read_assets(assets))
        staged = with_arrays_asset(item, arrays_asset(placed, virtual=virtual))
        writer.add_item(staged)
        results[name] = (staged, nbytes)
    writer.commit(f"{'virtual' if virtual else 'copy'} {len(granules)} granules")
    return results


def url(path: Path) -> str:
    return "file://" + str(path.resolve())


def chunk_bytes(root: Path) -> int:
    chunks = root / ARRAYS_DIR / "chunks"
    return sum(path.stat().st_size for path in chunks.rglob("*") if path.is_file()) if chunks.exists() else 0


def assert_nothing_staged(repository: Repository, writer, tip: str) -> None:
    """Checked before anything was written: no change in the writer's session, no stack committed."""
    assert not writer.session.has_uncommitted_changes
    assert repository.log()[0].snapshot_id == tip
    assert repository.view().stacks("c") == []


@pytest.mark.parametrize("kind", ["dem", "landcover", "band_interleaved"])
def test_virtual_granule_reads_back_like_the_source_and_like_the_copy(kind, archive, band_interleaved, repo, tmp_path):
    source = band_interleaved if kind == "band_interleaved" else archive[kind][0]
    copy_repo = Repository.create(tmp_path / "copy")

    staged, referenced = ingest(repo, {"item": {"data": source}}, virtual=True)["item"]
    ingest(copy_repo, {"item": {"data": source}}, virtual=False)

    expected = rioxarray.open_rasterio(source, mask_and_scale=False).load()
    assert referenced == expected.nbytes
    arrays = read_arrays_asset(repo.view().item("c", "item"))
    assert arrays.virtual and arrays == read_arrays_asset(staged)
    where = arrays.pixels["data"]
    assert where.shape == expected.shape and where.crs == expected.rio.crs.to_string()
    (piece,) = where.pieces
    assert piece.stack.startswith(f"c/{STACKS}/g") and piece.window == (0, 0, *expected.shape[1:])

    view = repo.view()
    raw = view.item_arrays("c", "item")
    np.testing.assert_array_equal(raw["data"].values, expected.values)
    assert raw.rio.crs == expected.rio.crs
    assert raw.rio.transform() == expected.rio.transform()
    # Same names, coordinates, values and attributes as the copy: the same reading code works on either.
    xr.testing.assert_identical(raw, copy_repo.view().item_arrays("c", "item"))
    # The pixels are references to the source file, the full-resolution image only: one per tile.
    assert set(view.session.all_virtual_chunk_locations()) == {url(source)}
    with rasterio.open(source) as dataset:
        tile_height, tile_width = dataset.block_shapes[0]
        tiles = dataset.count * -(-dataset.height // tile_height) * -(-dataset.width // tile_width)

    async def references() -> int:
        return len([c async for c in view.session.chunk_coordinates(f"/{piece.stack}/{piece.array}")])

    assert sync(references()) == tiles


def test_multi_asset_granule_reads_like_the_copy_grid_by_grid(archive, repo, tmp_path):
    """Assets on one grid share a fixed stack and read together; an asset on another grid is read on its own."""
    dem = archive["dem"][0]
    with rasterio.open(dem) as src:
        twin = make_cog(
            tmp_path / "twin.tif", src.read() * 2, crs=src.crs.to_string(), transform=src.transform, nodata=src.nodata
        )
    assets = {"elevation": dem, "doubled": twin, "landcover": archive["landcover"][0]}
    copy_repo = Repository.create(tmp_path / "copy")

    staged, _ = ingest(repo, {"item": assets}, virtual=True)["item"]
    ingest(copy_repo, {"item": assets}, virtual=False)

    pixels = read_arrays_asset(staged).pixels
    assert pixels["elevation"].pieces[0].stack == pixels["doubled"].pieces[0].stack
    assert pixels["landcover"].pieces[0].stack != pixels["elevation"].pieces[0].stack
    view, copied = repo.view(), copy_repo.view()
    for keys in (["elevation", "doubled"], ["landcover"]):
        xr.testing.assert_identical(view.item_arrays("c", "item", keys), copied.item_arrays("c", "item", keys))
    for key, path in assets.items():
        expected = rioxarray.open_rasterio(path, mask_and_scale=False).values
        np.testing.assert_array_equal(view.item_arrays("c", "item", [key])[key].values, expected)
    with pytest.raises(ValueError, match="landcover"):
        view.item_arrays("c", "item")
    assert set(view.session.all_virtual_chunk_locations()) == {url(path) for path in assets.values()}


def test_repository_holds_no_copy_of_the_pixels(archive, repo, tmp_path):
    granules = {path.stem: {"data": path} for kind in ("dem", "landcover") for path in archive[kind]}
    copy_repo = Repository.create(tmp_path / "copy")

    virtual = ingest(repo, granules, virtual=True)
    copied = ingest(copy_repo, granules, virtual=False)

    pixel_bytes = sum(nbytes for _, nbytes in copied.values())
    assert pixel_bytes == sum(nbytes for _, nbytes in virtual.values()) > 0
    # Only coordinates are stored as chunks: x, y and spatial_ref once a stack, item and datetime once a slot.
    view = repo.view()
    stacks = view.stacks("c")
    coordinate_bytes = 0
    for stack in stacks:
        dataset = view.stack(stack)
        coordinate_bytes += dataset.x.nbytes + dataset.y.nbytes + 8
    chunks = 3 * len(stacks) + 2 * len(granules)
    virtual_chunks, copy_chunks = chunk_bytes(tmp_path / "repo"), chunk_bytes(tmp_path / "copy")
    # Each stored chunk adds a compression frame (tens of bytes); no pixel is among them.
    assert virtual_chunks <= coordinate_bytes + 64 * chunks + sum(len(name) for name in granules)
    assert copy_chunks > virtual_chunks + pixel_bytes // 10
    assert set(view.session.all_virtual_chunk_locations()) == {url(assets["data"]) for assets in granules.values()}


def test_pixel_interleaved_cog_is_not_virtualizable_and_falls_back_to_a_copy(archive, repo):
    optical = archive["optical"][0]
    writer = repo.writer()
    writer.ensure_collection("c")
    tip = repo.log()[0].snapshot_id

    with pytest.raises(NotVirtualizable) as raised:
        stage_references(writer, make_item("optical"), {"visual": str(optical)}, repo.settings.arrays)
    assert isinstance(raised.value, FloeError) and raised.value.kind == "not-virtualizable"
    assert str(optical) in str(raised.value) and "pixel-interleaved" in str(raised.value)
    assert_nothing_staged(repo, writer, tip)

    outcome = ingest_granule(repo, "optical", {"visual": optical}, virtual=True)
    assert outcome.virtual == 0 and outcome.bytes_written > 0
    assert [(fallback.item_id, fallback.reason) for fallback in outcome.fallbacks] == [("optical", raised.value.reason)]
    view = repo.view()
    assert not read_arrays_asset(view.item("c", "optical")).virtual
    expected = rioxarray.open_rasterio(optical, mask_and_scale=False)
    np.testing.assert_array_equal(view.item_arrays("c", "optical")["visual"].values, expected.values)
    assert view.session.all_virtual_chunk_locations() == []


def test_granule_with_one_unreferenceable_asset_is_copied_whole(archive, repo):
    outcome = ingest_granule(repo, "mixed", {"dem": archive["dem"][0], "rgb": archive["optical"][0]}, virtual=True)
    (fallback,) = outcome.fallbacks
    assert str(archive["optical"][0]) in fallback.reason
    assert outcome.virtual == 0
    view = repo.view()
    assert not read_arrays_asset(view.item("c", "mixed")).virtual
    expected = rioxarray.open_rasterio(archive["dem"][0], mask_and_scale=False).values
    np.testing.assert_array_equal(view.item_arrays("c", "mixed", ["dem"])["dem"].values, expected)
    assert view.session.all_virtual_chunk_locations() == []


def test_a_repository_without_a_container_for_the_file_falls_back(archive, tmp_path):
    bare = Repository.create(tmp_path / "bare")
    writer = bare.writer()
    writer.ensure_collection("c")
    tip = bare.log()[0].snapshot_id
    dem = archive["dem"][0]
    with pytest.raises(NotVirtualizable, match="no virtual chunk container"):
        stage_references(writer, make_item("dem"), {"data": str(dem)}, bare.settings.arrays)
    assert_nothing_staged(bare, writer, tip)


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
    np.testing.assert_array_equal(replica.view().item_arrays("c", "dem")["data"].values, expected)

    # ...until the source is gone: reading then names the missing file.
    dem.unlink()
    with pytest.raises(icechunk.IcechunkError, match=str(dem)) as raised:
        replica.view().item_arrays("c", "dem")
    assert "not found" in str(raised.value)


def test_source_modified_after_ingest_is_refused_not_misread(tmp_path, archive):
    dem = Path(shutil.copy(archive["dem"][0], tmp_path / "dem.tif"))
    repository = Repository.create(tmp_path / "repo")
    repository.allow_virtual_sources([dem])
    ingest(repository, {"dem": {"data": dem}}, virtual=True)
    stat = dem.stat()
    os.utime(dem, (stat.st_atime, time.time() + 5))
    with pytest.raises(icechunk.IcechunkError, match=str(dem)):
        repository.view().item_arrays("c", "dem")


def test_truncated_cog_is_an_invalid_raster(archive, repo, tmp_path):
    whole = archive["landcover"][0].read_bytes()
    truncated = tmp_path / "truncated.tif"
    truncated.write_bytes(whole[: len(whole) - 200])
    writer = repo.writer()
    writer.ensure_collection("c")
    tip = repo.log()[0].snapshot_id
    with pytest.raises(InvalidRaster, match="truncated"):
        stage_references(writer, make_item("t"), {"data": str(truncated)}, repo.settings.arrays)
    with pytest.raises(InvalidRaster, match="no such file"):
        stage_references(writer, make_item("t"), {"data": str(tmp_path / "absent.tif")}, repo.settings.arrays)
    assert_nothing_staged(repo, writer, tip)


def test_reingest_replaces_the_previous_version_whole(archive, repo):
    """A copied item re-ingested as references: the new slices replace the old, whose slots are freed."""
    first = ingest_granule(repo, "item", {"data": archive["dem"][0], "landcover": archive["landcover"][0]})
    assert first.virtual == 0 and not first.rejected
    old = read_arrays_asset(repo.view().item("c", "item"))

    second = ingest_granule(repo, "item", {"data": archive["dem"][1]}, virtual=True)
    assert second.virtual == 1 and second.replaced == 1 and not second.fallbacks
    view = repo.view()
    new = read_arrays_asset(view.item("c", "item"))
    assert new.virtual and sorted(new.pixels) == ["data"]
    expected = rioxarray.open_rasterio(archive["dem"][1], mask_and_scale=False).values
    np.testing.assert_array_equal(view.item_arrays("c", "item")["data"].values, expected)
    for piece in old.pieces():
        assert piece.slot not in view.slot_items(piece.stack)
        assert piece.slot not in chunk_slots(view.session, f"{piece.stack}/{piece.array}")
    occupied = {(stack, slot) for stack in view.stacks("c") for slot in view.slot_items(stack)}
    assert occupied == {(piece.stack, piece.slot) for piece in new.pieces()}
    assert set(view.session.all_virtual_chunk_locations()) == {url(archive["dem"][1])}


def test_a_failed_write_leaves_no_reference(archive, repo, monkeypatch):
    writer = repo.writer()
    writer.ensure_collection("c")
    real_write = arrays_module.write_references
    written = []

    async def failing_write(store, references, **kwargs):
        written.append(await real_write(store, references, **kwargs))  # the references land, then storage fails
        raise OSError("disk full")

    monkeypatch.setattr(arrays_module, "write_references", failing_write)
    with pytest.raises(OSError, match="disk full"):
        stage_references(writer, make_item("item"), {"data": str(archive["dem"][0])}, repo.settings.arrays)
    assert written and written[0] > 0
    for path in writer.session.status().updated_chunks:
        assert existing_chunk_slots(writer.session, path.lstrip("/")) == set(), path
    writer.commit("nothing but the failed granule's cleared slot")
    view = repo.view()
    assert view.session.all_virtual_chunk_locations() == []
    assert all(view.slot_items(stack) == {} for stack in view.stacks("c"))


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

    outcome = ingest_granule(repo, "sparse", {"data": path}, virtual=True)
    (fallback,) = outcome.fallbacks
    assert outcome.virtual == 0 and str(path) in fallback.reason and "zero-length" in fallback.reason
    np.testing.assert_array_equal(repo.view().item_arrays("c", "sparse")["data"].values, expected)


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
    outcome = ingest_granule(repo, name, {"data": path}, virtual=True)

    assert outcome.virtual == int(virtual)
    if virtual:
        assert outcome.fallbacks == []
    else:
        (fallback,) = outcome.fallbacks
        assert fallback.item_id == name and str(path) in fallback.reason
    view = repo.view()
    assert read_arrays_asset(view.item("c", name)).virtual is virtual
    expected = rioxarray.open_rasterio(path, mask_and_scale=False).values
    np.testing.assert_array_equal(view.item_arrays("c", name)["data"].values, expected)
    assert bool(view.session.all_virtual_chunk_locations()) is virtual


@pytest.mark.s3
def test_repository_on_object_storage_references_local_files(archive, s3_root, s3_settings):
    """The containers live in the repository's config on S3 too; another process opening it can read the arrays."""
    dem = archive["dem"][0]
    repository = Repository.create(s3_root, s3_settings)
    assert repository.allow_virtual_sources([dem]) == ["file:///" + dem.resolve().parts[1] + "/"]
    staged, _ = ingest(repository, {"dem": {"data": dem}}, virtual=True)["dem"]
    assert read_arrays_asset(staged).virtual

    reopened = Repository.open(s3_root, s3_settings)
    expected = rioxarray.open_rasterio(dem, mask_and_scale=False).values
    np.testing.assert_array_equal(reopened.view().item_arrays("c", "dem")["data"].values, expected)
    assert set(reopened.view().session.all_virtual_chunk_locations()) == {url(dem)}
