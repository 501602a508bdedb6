"""Each private name floe reaches in another library (through ingest._compat) still behaves as floe expects.

An upgrade of pyiceberg, stac-geoparquet, rioxarray, virtualizarr, virtual-tiff
or Ray that moves one of them fails here, by name, before anything else does
(pyiceberg's catalog internals among them: floe's PointerCatalog stages and
writes table versions through them).
"""

from __future__ import annotations

import uuid

import numpy as np
import pyarrow as pa
import pytest
import rasterio
from pyiceberg.expressions import EqualTo
from rasterio.transform import from_origin

from ingest import Repository, Settings, _compat
from tests.conftest import make_item


@pytest.fixture(scope="module")
def two_files(tmp_path_factory):
    """A table with one data file per collection: (table, file of 'a', file of 'b')."""
    repository = Repository.create(tmp_path_factory.mktemp("compat") / "repo", Settings())
    writer = repository.writer()
    writer.add_items([make_item("a1", "a"), make_item("a2", "a"), make_item("b1", "b")])
    writer.commit("two collections")
    table = repository.view().table
    files = {task.file.partition[0]: task.file for task in table.scan().plan_files()}
    return table, files["a"], files["b"]


def test_may_match_rules_out_files_by_their_bounds(two_files):
    table, file_a, file_b = two_files
    test = _compat.may_match(table.schema(), EqualTo("collection", "a"))
    assert test(file_a) is True
    assert test(file_b) is False


def test_must_match_says_when_every_row_matches(two_files):
    table, file_a, _ = two_files
    assert _compat.must_match(table.schema(), EqualTo("collection", "a"))(file_a) is True
    assert _compat.must_match(table.schema(), EqualTo("id", "a1"))(file_a) is False  # a2 is there too


def test_transaction_updates_hold_a_schema_union(two_files):
    from pyiceberg.table.update import AddSchemaUpdate

    table, _, _ = two_files
    transaction = table.transaction()
    with transaction.update_schema() as update:
        update.union_by_name(pa.schema([pa.field("compat_new_column", pa.string())]))
    updates = _compat.transaction_updates(transaction)
    assert any(isinstance(update, AddSchemaUpdate) for update in updates)


def test_a_table_update_is_staged_checked_and_written_as_the_next_version(two_files, tmp_path):
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.table.update import AssertTableUUID, SetPropertiesUpdate

    table, _, _ = two_files
    catalog = table.catalog
    update = (SetPropertiesUpdate(updates={"compat.check": "yes"}),)
    staged = _compat.staged_update(catalog, table, (AssertTableUUID(uuid=table.metadata.table_uuid),), update)
    assert staged.metadata.properties["compat.check"] == "yes"
    assert staged.metadata_location != table.metadata_location  # a new version, not yet written
    assert not table.io.new_input(staged.metadata_location).exists()
    _compat.write_table_metadata(catalog, staged.metadata, table.io, staged.metadata_location)
    assert catalog.load_at(staged.metadata_location).properties["compat.check"] == "yes"

    stranger = AssertTableUUID(uuid=uuid.uuid4())
    with pytest.raises(CommitFailedException):
        _compat.staged_update(catalog, table, (stranger,), update)


def test_geoparquet_metadata_gives_the_geo_and_stac_footers():
    schema = pa.schema([pa.field("id", pa.string()), pa.field("geometry", pa.binary())])
    footer = _compat.geoparquet_metadata(schema, schema_version="1.1.0")
    assert b"geo" in footer
    assert b"stac-geoparquet" in footer


def test_rasterio_attributes_equal_what_rioxarray_gives(tmp_path):
    import rioxarray

    path = tmp_path / "nodata.tif"
    profile = {"driver": "GTiff", "width": 8, "height": 8, "count": 1, "dtype": "int16", "crs": "EPSG:32633"}
    with rasterio.open(path, "w", nodata=-9999, transform=from_origin(500000, 4000000, 10, 10), **profile) as out:
        out.write(np.arange(64, dtype="int16").reshape(1, 8, 8))
    with rasterio.open(path) as dataset:
        attributes = _compat.rasterio_attributes(dataset)
    opened = rioxarray.open_rasterio(path, mask_and_scale=False)
    assert attributes["_FillValue"] == -9999
    assert {key: attributes[key] for key in opened.attrs} == dict(opened.attrs)


def test_a_parsed_tiffs_manifest_entries_name_its_tiles(tmp_path):
    from obspec_utils.registry import ObjectStoreRegistry
    from obstore.store import LocalStore
    from virtual_tiff import VirtualTIFF

    path = tmp_path / "tiles.tif"
    profile = {"driver": "COG", "width": 256, "height": 256, "count": 1, "dtype": "uint8", "blocksize": 128}
    with rasterio.open(path, "w", crs="EPSG:4326", transform=from_origin(0, 1, 0.01, 0.01), **profile) as out:
        out.write(np.full((1, 256, 256), 7, dtype="uint8"))
    parsed = VirtualTIFF(ifd=0)(f"file://{path}", ObjectStoreRegistry({"file://": LocalStore()}))
    image = _compat.tiff_image(parsed, 0)
    paths, offsets, lengths = _compat.manifest_entries(image.manifest)
    assert image.shape == (256, 256)
    assert paths.shape == offsets.shape == lengths.shape == (2, 2)  # 2x2 tiles of 128 pixels
    assert set(paths.flatten().tolist()) == {f"file://{path}"}
    assert int((offsets + lengths).max()) <= path.stat().st_size


def test_keep_local_ray_on_loopback_switches_the_cluster_flag_off(monkeypatch):
    from ray._private import ray_constants

    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", True)
    _compat.keep_local_ray_on_loopback()
    assert ray_constants.ENABLE_RAY_CLUSTER is False


LAZY_CODECS_PROBE = """
import json, sys
import zarr.registry
from ingest._compat import VIRTUAL_TIFF_CODECS, find_virtual_tiff_codecs_lazily
before = "virtual_tiff" in sys.modules
find_virtual_tiff_codecs_lazily()
registered = "virtual_tiff" in sys.modules
found = [(c.__module__, c.__name__) for c in map(zarr.registry.get_codec_class, VIRTUAL_TIFF_CODECS)]
print(json.dumps({"imported_before": before, "imported_by_registering": registered, "found": found}))
"""


def test_virtual_tiff_codecs_are_found_under_the_names_their_metadata_gives():
    """In a fresh process: registering imports nothing, and the first lookup finds virtual-tiff's classes."""
    from ingest._compat import VIRTUAL_TIFF_CODECS
    from tests._fresh import last_json_line

    assert last_json_line(LAZY_CODECS_PROBE) == {
        "imported_before": False,
        "imported_by_registering": False,
        "found": [["virtual_tiff.codecs", name] for name in VIRTUAL_TIFF_CODECS],
    }


def test_azure_store_options_give_back_what_the_store_was_made_with():
    import icechunk

    from ingest._compat import azure_store_options

    store = icechunk.storage.azure_store(account="acct", config={"endpoint": "http://127.0.0.1:9/acct"})
    assert azure_store_options(store) == {"account": "acct", "endpoint": "http://127.0.0.1:9/acct"}
    assert azure_store_options(icechunk.http_store()) == {}


def test_stac_json_batch_lays_the_rows_out_as_stac_json():
    import stac_geoparquet.arrow as sga

    from ingest._compat import stac_json_batch

    (batch,) = pa.Table.from_batches(sga.parse_stac_items_to_arrow([make_item("j1")])).to_batches()
    json_batch = stac_json_batch(batch)
    assert "properties" in json_batch.schema.names and "datetime" not in json_batch.schema.names
    row = json_batch.to_pylist()[0]
    assert row["properties"]["datetime"].startswith("2024-01-05T00:00:00")  # RFC 3339 text, not a timestamp
    assert isinstance(row["bbox"], list) and isinstance(row["geometry"], bytes)
