"""Copies into fixed stacks move a COG's compressed tiles as they are (``arrays.layout = "fixed"``, ``tile_copy``).

Each granule goes through the pipeline's batch (what ``floe ingest`` runs) on
a real repository; the chunks the repository holds are compared byte for
byte with the tiles in the source file, and the pixels read back with
``View.item_arrays`` and with plain zarr are compared with rioxarray's
reading of the source.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rasterio
import rioxarray
import zarr
from rasterio.transform import from_origin
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from ingest.config import ArraysSettings, Settings
from ingest.pipeline import granule_from_item
from ingest.pipeline._batch import commit_batch
from ingest.repository import Repository
from ingest.stac import read_arrays_asset
from tests._fresh import last_json_line
from tests.conftest import make_item
from tests.rasters.test_copy import ingest_granule
from tests.rasters.test_virtual import make_cog

ORIGIN = from_origin(500_000.0, 6_000_000.0, 10.0, 10.0)


def fixed_repo(tmp_path: Path, name: str = "repo", **arrays) -> Repository:
    return Repository.create(tmp_path / name, Settings(arrays=ArraysSettings(layout="fixed", **arrays)))


def cog(tmp_path: Path, name: str, *, bands: int = 3, seed: int = 3, **profile) -> Path:
    """A band-interleaved uint16 COG of 300 x 280 px in tiles of 128 (edge tiles partly outside the image)."""
    data = np.random.default_rng(seed).integers(0, 3000, size=(bands, 300, 280), dtype=np.uint16)
    return make_cog(tmp_path / f"{name}.tif", data, crs="EPSG:32633", transform=ORIGIN, nodata=0, **profile)


def file_tiles(path: Path) -> dict[tuple[int, int, int], bytes]:
    """Each tile of the full-resolution image as stored in the file: (band, row, column) -> bytes."""
    tiles = {}
    with rasterio.open(path) as dataset:
        tile_height, tile_width = dataset.block_shapes[0]
        rows, columns = -(-dataset.height // tile_height), -(-dataset.width // tile_width)
        for band in range(dataset.count):
            for row in range(rows):
                for column in range(columns):
                    offset = int(dataset.get_tag_item(f"BLOCK_OFFSET_{column}_{row}", "TIFF", bidx=band + 1))
                    size = int(dataset.get_tag_item(f"BLOCK_SIZE_{column}_{row}", "TIFF", bidx=band + 1))
                    tiles[(band, row, column)] = (offset, size)
    body = path.read_bytes()
    return {index: body[offset : offset + size] for index, (offset, size) in tiles.items()}


def stored_chunks(repository: Repository, array_path: str, slot: int) -> dict[tuple[int, int, int], bytes]:
    """The chunks of ``array_path`` at ``slot`` as the repository stores them (no decoding)."""
    session = repository.view().session
    store = session.store

    async def collect() -> dict[tuple[int, int, int], bytes]:
        found = {}
        async for coordinates in session.chunk_coordinates(f"/{array_path}"):
            if coordinates[0] != slot:
                continue
            key = f"{array_path}/c/" + "/".join(str(index) for index in coordinates)
            found[tuple(coordinates[1:])] = (await store.get(key, default_buffer_prototype())).to_bytes()
        return found

    return sync(collect())


@pytest.mark.parametrize(
    "profile",
    [{"predictor": 2}, {"compress": "zstd"}, {"compress": "lzw", "predictor": 2}, {"compress": "none"}],
    ids=["deflate-predictor", "zstd", "lzw-predictor", "uncompressed"],
)
def test_a_copy_into_a_fixed_stack_stores_the_files_tiles_as_they_are(profile, tmp_path):
    source = cog(tmp_path, "granule", **profile)
    repository = fixed_repo(tmp_path)

    outcome = ingest_granule(repository, "granule", {"data": source})

    assert not outcome.rejected and not outcome.fallbacks and outcome.virtual == 0
    expected = rioxarray.open_rasterio(source, mask_and_scale=False).load()
    assert outcome.bytes_written == expected.nbytes
    view = repository.view()
    arrays = read_arrays_asset(view.item("c", "granule"))
    assert not arrays.virtual, "a copy is marked as a reference"
    assert view.session.all_virtual_chunk_locations() == [], "the copy references the file"
    (piece,) = arrays.pixels["data"].pieces
    assert stored_chunks(repository, f"{piece.stack}/{piece.array}", piece.slot) == file_tiles(source), (
        "the stored chunks are not the file's tiles byte for byte (decoded and re-encoded?)"
    )
    raw = view.item_arrays("c", "granule")
    np.testing.assert_array_equal(raw["data"].values, expected.values)
    assert raw.rio.crs == expected.rio.crs and raw.rio.transform() == expected.rio.transform()
    # A client without floe follows the asset's piece with zarr alone.
    array = zarr.open_array(view.session.store, path=f"{piece.stack}/{piece.array}", mode="r")
    np.testing.assert_array_equal(array[piece.slot], expected.values)


def test_the_copy_does_not_need_the_file_afterwards(tmp_path):
    source = cog(tmp_path, "granule")
    expected = rioxarray.open_rasterio(source, mask_and_scale=False).values
    repository = fixed_repo(tmp_path)
    ingest_granule(repository, "granule", {"data": source})
    source.unlink()
    np.testing.assert_array_equal(repository.view().item_arrays("c", "granule")["data"].values, expected)


def test_tile_copy_off_or_an_unreadable_layout_copies_by_decoding(tmp_path):
    """``tile_copy = False`` re-encodes (zstd, ``arrays.chunk`` chunks); a pixel-interleaved file, which zarr cannot
    decode tile by tile, is decoded too. Both read back equal to the source."""
    band = cog(tmp_path, "band")
    pixel = cog(tmp_path, "pixel", seed=4, interleave="pixel")
    off = fixed_repo(tmp_path, "off", tile_copy=False)
    on = fixed_repo(tmp_path, "on")

    for repository, name, source in ((off, "band", band), (on, "pixel", pixel)):
        outcome = ingest_granule(repository, name, {"data": source})
        assert not outcome.rejected
        view = repository.view()
        (piece,) = read_arrays_asset(view.item("c", name)).pixels["data"].pieces
        stored = stored_chunks(repository, f"{piece.stack}/{piece.array}", piece.slot)
        assert stored and set(stored.values()).isdisjoint(file_tiles(source).values()), f"{name}: tiles were moved"
        expected = rioxarray.open_rasterio(source, mask_and_scale=False).values
        np.testing.assert_array_equal(view.item_arrays("c", name)["data"].values, expected)


def test_a_corrupt_tile_is_a_rejection_naming_the_file_and_the_rest_of_the_batch_lands(tmp_path):
    """Every tile is decoded once before anything is written: a corrupt deflate stream in a later tile (the first
    one, which the layout probe reads, is intact) rejects the granule by name; its batch's other granule lands."""
    good = cog(tmp_path, "good")
    bad = cog(tmp_path, "bad", seed=9)
    tiles = file_tiles(bad)
    with rasterio.open(bad) as dataset:
        offset = int(dataset.get_tag_item("BLOCK_OFFSET_1_1", "TIFF", bidx=2))
    body = bytearray(bad.read_bytes())
    body[offset + 4 : offset + 40] = bytes(36)  # zero a stretch inside tile (band 1, row 1, column 1)
    bad.write_bytes(bytes(body))
    assert tiles[(0, 0, 0)] == file_tiles(bad)[(0, 0, 0)]
    repository = fixed_repo(tmp_path)

    granules = []
    for name, path in (("bad", bad), ("good", good)):
        item = make_item(name)
        item["assets"] = {"data": {"href": str(path), "type": "image/tiff; application=geotiff"}}
        granules.append(granule_from_item(item, f"{name}.json", None))
    outcome = commit_batch(repository, "main", granules, "one bad granule")

    (rejection,) = outcome.rejected
    assert rejection.item_id == "bad" and str(bad) in rejection.reason and "decode" in rejection.reason
    view = repository.view()
    assert [item["id"] for item in view.items()] == ["good"]
    expected = rioxarray.open_rasterio(good, mask_and_scale=False).values
    np.testing.assert_array_equal(view.item_arrays("c", "good")["data"].values, expected)
    assert all(set(view.slot_items(stack).values()) == {"good"} for stack in view.stacks("c"))


def test_granules_of_one_grid_share_the_stack_and_a_changed_file_replaces_its_slice(tmp_path):
    """Two granules of one grid are two slots of one array; a re-run after one file changed writes that granule's
    tiles again (new slot, the old one cleared) and skips the other."""
    first, second = cog(tmp_path, "first", seed=1), cog(tmp_path, "second", seed=2)
    repository = fixed_repo(tmp_path)
    ingest_granule(repository, "first", {"data": first})
    ingest_granule(repository, "second", {"data": second})
    view = repository.view()
    pieces = {name: read_arrays_asset(view.item("c", name)).pixels["data"].pieces[0] for name in ("first", "second")}
    assert pieces["first"].stack == pieces["second"].stack and pieces["first"].array == pieces["second"].array
    assert pieces["first"].slot != pieces["second"].slot

    again = ingest_granule(repository, "second", {"data": second})
    assert again.skipped == 1 and again.commit is None
    cog(tmp_path, "second", seed=5)  # the file changes
    changed = ingest_granule(repository, "second", {"data": second})
    assert changed.replaced == 1 and not changed.rejected
    view = repository.view()
    new = read_arrays_asset(view.item("c", "second")).pixels["data"].pieces[0]
    assert new.slot != pieces["second"].slot
    assert view.slot_items(new.stack) == {pieces["first"].slot: "first", new.slot: "second"}
    assert stored_chunks(repository, f"{new.stack}/{new.array}", new.slot) == file_tiles(second)
    for name, path in (("first", first), ("second", second)):
        expected = rioxarray.open_rasterio(path, mask_and_scale=False).values
        np.testing.assert_array_equal(view.item_arrays("c", name)["data"].values, expected)


@pytest.mark.parametrize("where", ["s3", "http"])
def test_remote_cogs_are_copied_tile_by_tile(where, tmp_path, moto_server, http_server):
    """A COG on S3 (moto) or over HTTP: the tiles are read with range requests and stored as they are."""
    source = cog(tmp_path, f"remote-{where}")
    if where == "s3":
        from tests.pipeline._remote_archive import s3_client

        bucket = moto_server.create_bucket()
        s3_client(moto_server).upload_file(str(source), bucket, "cogs/granule.tif")
        href = f"s3://{bucket}/cogs/granule.tif"
    else:
        served = http_server.folder / f"tiles-{tmp_path.name}"
        served.mkdir()
        (served / "granule.tif").write_bytes(source.read_bytes())
        href = f"{http_server.url}/{served.name}/granule.tif"
    repository = Repository.create(
        tmp_path / "repo", Settings(s3=moto_server.s3_settings(), arrays=ArraysSettings(layout="fixed"))
    )
    item = make_item("granule")
    item["assets"] = {"data": {"href": href, "type": "image/tiff; application=geotiff"}}
    granule = granule_from_item(item, "granule.json", None, remote=True)
    assert granule.rasters == {"data": href}

    outcome = commit_batch(repository, "main", [granule], "remote")

    assert not outcome.rejected and outcome.virtual == 0
    view = repository.view()
    (piece,) = read_arrays_asset(view.item("c", "granule")).pixels["data"].pieces
    assert stored_chunks(repository, f"{piece.stack}/{piece.array}", piece.slot) == file_tiles(source)
    expected = rioxarray.open_rasterio(source, mask_and_scale=False).values
    np.testing.assert_array_equal(view.item_arrays("c", "granule")["data"].values, expected)


READ_IN_A_FRESH_PROCESS = """
import json, sys
root, collection, item_id, stack_array, slot = sys.argv[1:]
result = {}
if stack_array:  # plain icechunk and zarr, as a client without floe reads the asset's piece (README, "Arrays")
    import icechunk, zarr
    import virtual_tiff  # registers the TIFF predictor's codec with zarr
    repository = icechunk.Repository.open(icechunk.local_filesystem_storage(root + "/arrays"))
    array = zarr.open_array(repository.readonly_session("main").store, path=stack_array, mode="r")
    result["sum"] = int(array[int(slot)].sum())
else:
    from ingest import Repository
    result["sum"] = int(Repository.open(root).view().item_arrays(collection, item_id)["data"].values.sum())
print(json.dumps(result))
"""


def read_in_a_fresh_process(*arguments: str) -> int:
    """The sum of a granule's pixels, read by a new Python process that never parsed a TIFF."""
    return last_json_line(READ_IN_A_FRESH_PROCESS, *arguments)["sum"]


@pytest.mark.parametrize("virtual", [False, True], ids=["tile-copy", "virtual"])
@pytest.mark.slow
def test_arrays_with_the_tiff_predictor_read_in_a_process_that_parsed_no_tiff(virtual, tmp_path):
    """The predictor is virtual-tiff's own codec, which zarr knows only once virtual-tiff is imported: floe
    (``View.item_arrays``) reads it in any process, and a client without floe reads a copy's piece with icechunk,
    zarr and ``import virtual_tiff``."""
    source = cog(tmp_path, "granule", predictor=2)
    expected = int(rioxarray.open_rasterio(source, mask_and_scale=False).values.astype(np.int64).sum())
    repository = fixed_repo(tmp_path)
    if virtual:
        repository.allow_virtual_sources([tmp_path])
    item = make_item("granule")
    item["assets"] = {"data": {"href": str(source), "type": "image/tiff; application=geotiff"}}
    outcome = commit_batch(repository, "main", [granule_from_item(item, "g.json", None)], "one", virtual=virtual)
    assert outcome.virtual == int(virtual) and not outcome.rejected
    (piece,) = read_arrays_asset(repository.view().item("c", "granule")).pixels["data"].pieces

    root = str(tmp_path / "repo")
    assert read_in_a_fresh_process(root, "c", "granule", "", "") == expected
    if not virtual:
        plain = read_in_a_fresh_process(root, "c", "granule", f"{piece.stack}/{piece.array}", str(piece.slot))
        assert plain == expected
