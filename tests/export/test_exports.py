"""Exports round-trip the items at any ref: NDJSON, stac-geoparquet (geopandas, DuckDB, stac_geoparquet), catalogs."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import duckdb
import geopandas
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import shapely.geometry
from stac_geoparquet.arrow import stac_table_to_items
from stac_validator.validate import StacValidate

from ingest import Repository, Settings
from ingest.errors import InvalidExportTarget
from ingest.export import (
    export_catalog,
    export_geoparquet,
    export_ndjson,
    export_schema,
    read_geoparquet_items,
    safe_name,
)
from ingest.pipeline import ingest_items
from ingest.stac import parse_datetime, strip_nulls
from tests.conftest import load_real_items, make_item
from tests.export.conftest import generated_items, schema_map, write_ndjson

STRUCTURAL = {"self", "root", "parent", "collection"}
TIMESTAMPS = {"datetime", "start_datetime", "end_datetime", "created", "updated"}


def by_key(items: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(item["collection"], item["id"]): item for item in items}


def without_structural_links(item: dict[str, Any]) -> dict[str, Any]:
    return {**item, "links": [link for link in item.get("links", []) if link.get("rel") not in STRUCTURAL]}


def read_catalog(root: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Walk a static catalog by its links only: (catalog, collections by id, items)."""
    catalog = json.loads((root / "catalog.json").read_text())
    collections, items = {}, []
    for link in catalog["links"]:
        if link["rel"] != "child":
            continue
        collection_path = (root / unquote(link["href"])).resolve()
        assert collection_path.is_relative_to(root.resolve())
        collection = json.loads(collection_path.read_text())
        collections[collection["id"]] = collection
        for item_link in collection["links"]:
            if item_link["rel"] == "item":
                item_path = (collection_path.parent / unquote(item_link["href"])).resolve()
                assert item_path.is_relative_to(root.resolve())
                item = json.loads(item_path.read_text())
                rels = {entry["rel"]: entry["href"] for entry in item["links"] if entry["rel"] in STRUCTURAL}
                assert (item_path.parent / rels["root"]).resolve() == (root / "catalog.json").resolve()
                assert (item_path.parent / rels["collection"]).resolve() == collection_path
                items.append(item)
    return catalog, collections, items


def as_instants(item: dict[str, Any]) -> dict[str, Any]:
    """The item with its timestamp properties as instants (the same time may be written in several ways)."""
    properties = {
        key: parse_datetime(value) if key in TIMESTAMPS and isinstance(value, str) else value
        for key, value in item["properties"].items()
    }
    return {**item, "properties": properties}


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


# -- the 50 real items of 13 collections --------------------------------------------------------------------------


@pytest.mark.slow
def test_ndjson_round_trips_the_real_items(real_repo, tmp_path):
    view = real_repo.view("main")
    result = export_ndjson(view, tmp_path / "items.ndjson")
    exported = [json.loads(line) for line in (tmp_path / "items.ndjson").read_text().splitlines()]
    assert result.items == len(exported) == 50
    assert result.collections == 13
    assert exported == list(view.items())
    assert by_key(exported) == by_key(load_real_items())


def test_geoparquet_round_trips_the_real_items_and_geopandas_and_duckdb_read_it(real_repo, tmp_path):
    view = real_repo.view("main")
    path = tmp_path / "items.parquet"
    result = export_geoparquet(view, path)
    assert result.items == 50

    # floe's reader merges the overflow back: exactly the items at the ref.
    assert list(read_geoparquet_items(path)) == list(view.items())
    assert by_key(list(read_geoparquet_items(path))) == by_key(load_real_items())

    # One schema for every row group: the table's columns at the ref, with the GeoParquet footers.
    parquet = pq.ParquetFile(path)
    assert parquet.schema_arrow.remove_metadata() == export_schema(view)
    assert parquet.metadata.num_row_groups == 1  # 15 small data files gathered into one row group
    footer = parquet.schema_arrow.metadata
    geo = json.loads(footer[b"geo"])
    assert geo["primary_column"] == "geometry"
    assert set(geo["columns"]) == {"geometry"}  # proj:geometry is GeoJSON here, so not declared WKB
    stac_meta = json.loads(footer[b"stac-geoparquet"])
    assert set(stac_meta["collections"]) == {"3dep-lidar-copc"}  # the one stored collection

    frame = geopandas.read_parquet(path)
    assert frame.crs.to_epsg() == 4326
    originals = {item["id"]: item for item in load_real_items()}
    assert sorted(frame["id"]) == sorted(originals)
    for item_id, geometry in zip(frame["id"], frame.geometry, strict=True):
        assert geometry.equals(shapely.geometry.shape(originals[item_id]["geometry"]))

    rows = duckdb.sql(
        f"select collection, count(*), min(datetime), max(bbox.xmax) from read_parquet('{path}') group by 1"
    ).fetchall()
    assert sum(row[1] for row in rows) == 50
    assert {row[0]: row[1] for row in rows} == {
        collection: sum(1 for item in originals.values() if item["collection"] == collection)
        for collection in {item["collection"] for item in originals.values()}
    }
    for collection, _, _, xmax in rows:
        assert xmax == max(
            item["bbox"][-3 if len(item["bbox"]) == 6 else 2]
            for item in originals.values()
            if item["collection"] == collection
        )
    cloud = duckdb.sql(f'select id, "eo:cloud_cover" from read_parquet(\'{path}\') where "eo:cloud_cover" < 20')
    assert sorted(row[0] for row in cloud.fetchall()) == sorted(
        item["id"]
        for item in originals.values()
        if item["properties"].get("eo:cloud_cover") is not None and item["properties"]["eo:cloud_cover"] < 20
    )


@pytest.mark.slow
def test_catalog_round_trips_the_real_items_and_each_document_is_valid_stac(real_repo, tmp_path):
    view = real_repo.view("main")
    result = export_catalog(view, tmp_path / "catalog")
    catalog, collections, items = read_catalog(tmp_path / "catalog")
    assert result.items == len(items) == 50
    assert len(collections) == 13
    assert by_key([without_structural_links(item) for item in items]) == by_key(
        [without_structural_links(item) for item in view.items()]
    )
    # The stored collection is kept (links and extent aside); the others are made up with extents from the items.
    stored = real_repo.collections("main")["3dep-lidar-copc"]
    kept = collections["3dep-lidar-copc"]
    assert {k: v for k, v in kept.items() if k not in ("links", "extent")} == {
        k: v for k, v in stored.items() if k not in ("links", "extent")
    }
    for collection_id, collection in collections.items():
        members = [item for item in items if item["collection"] == collection_id]
        (xmin, ymin, xmax, ymax) = collection["extent"]["spatial"]["bbox"][0]
        for item in members:
            box = item["bbox"] if len(item["bbox"]) == 4 else [item["bbox"][i] for i in (0, 1, 3, 4)]
            assert xmin <= box[0] and ymin <= box[1] and box[2] <= xmax and box[3] <= ymax
        assert len([link for link in collection["links"] if link["rel"] == "item"]) == len(members)
    # Core STAC validity of every document, offline. (Their extensions' schemas are not vendored; the
    # recursive validation with extensions runs on generated items below.)
    documents = [tmp_path / "catalog" / "catalog.json", *sorted((tmp_path / "catalog").rglob("*/*.json"))]
    assert len(documents) == 1 + 13 + 50
    for document in documents:
        validator = StacValidate(str(document), core=True, schema_map=schema_map())
        assert validator.run(), (document, validator.message)
    assert catalog["stac_version"] == "1.1.0"  # the newest version among the exported documents


# -- generated items: stac-validator recursive, stac_geoparquet's reader, schema evolution, tags --------------------


@pytest.fixture(scope="module")
def evolving_repo(tmp_path_factory) -> Repository:
    """v1: 30 items in two collections; then 20 more with a new collection, new columns and new asset fields."""
    base = tmp_path_factory.mktemp("evolving")
    repository = Repository.create(base / "repo", Settings())
    first = generated_items(30)
    first[0]["assets"]["floe:arrays"] = {"href": "alpha/gen-0000", "type": "application/vnd+zarr", "roles": ["data"]}
    ingest_items(repository, [write_ndjson(base / "first.ndjson", first)], batch_size=15, message="first")
    repository.tag("v1", "main")
    later = generated_items(50, collections=("alpha", "beta", "gamma"))[30:]
    for index, item in enumerate(later):
        item["properties"]["sat:orbit_state"] = "ascending"
        item["properties"]["created"] = "2024-02-01T00:00:00.000Z" if index == 0 else "2024-03-01T12:00:00Z"
        item["assets"]["data"]["file:size"] = 1000 + index
        item["stac_extensions"] = item["stac_extensions"][:1]
    ingest_items(repository, [write_ndjson(base / "later.ndjson", later)], batch_size=10, message="later")
    return repository


@pytest.mark.slow
def test_catalog_of_generated_items_passes_stac_validator_recursively_offline(evolving_repo, tmp_path):
    export_catalog(evolving_repo.view("main"), tmp_path / "catalog")
    validator = StacValidate(str(tmp_path / "catalog" / "catalog.json"), recursive=True, schema_map=schema_map())
    assert validator.run(), validator.message
    validated = [entry for entry in validator.message if entry.get("valid_stac")]
    assert len(validated) == 1 + 3 + 50  # the catalog, three collections, every item
    assert any("eo/v1.1.0" in str(entry.get("schema")) for entry in validated)  # extensions were checked too

    # The validator really validates: a broken copy fails (an extension rule, then a core rule).
    broken = tmp_path / "broken"
    shutil.copytree(tmp_path / "catalog", broken)
    item_path = next((broken / "alpha" / "items").glob("*.json"))
    item = json.loads(item_path.read_text())
    item["properties"]["eo:cloud_cover"] = 150
    item_path.write_text(json.dumps(item))
    assert not StacValidate(str(broken / "catalog.json"), recursive=True, schema_map=schema_map()).run()
    shutil.rmtree(broken)
    shutil.copytree(tmp_path / "catalog", broken)
    collection = json.loads((broken / "beta" / "collection.json").read_text())
    del collection["extent"]
    (broken / "beta" / "collection.json").write_text(json.dumps(collection))
    assert not StacValidate(str(broken / "catalog.json"), recursive=True, schema_map=schema_map()).run()


def test_geoparquet_unifies_files_of_different_schemas(evolving_repo, tmp_path):
    view = evolving_repo.view("main")
    path = tmp_path / "items.parquet"
    export_geoparquet(view, path)
    table = pq.read_table(path)
    assert table.num_rows == 50
    # Rows from files written before the new column or asset field existed read as null there.
    orbit = dict(zip(table.column("id").to_pylist(), table.column("sat:orbit_state").to_pylist(), strict=True))
    assert {key for key, value in orbit.items() if value is None} == {f"gen-{i:04d}" for i in range(30)}
    sizes = table.column("assets").combine_chunks().field("data").field("file:size").to_pylist()
    assert sum(size is None for size in sizes) == 30
    # Text timestamps stac-geoparquet wants typed are typed; text that is not canonical survives exactly.
    assert table.schema.field("created").type == pa.timestamp("us", tz="UTC")
    assert list(read_geoparquet_items(path)) == list(view.items())
    assert by_key(list(read_geoparquet_items(path)))[("alpha", "gen-0000")]["assets"]["floe:arrays"] == {
        "href": "alpha/gen-0000",
        "type": "application/vnd+zarr",
        "roles": ["data"],
    }


def test_stac_geoparquet_reader_reads_the_export(evolving_repo, tmp_path):
    view = evolving_repo.view("main")
    path = tmp_path / "items.parquet"
    export_geoparquet(view, path)
    read_back = list(stac_table_to_items(pq.read_table(path)))
    expected = by_key(list(view.items()))
    assert len(read_back) == len(expected) == 50
    overflowed = {}
    for item in read_back:
        overflow = json.loads(item["properties"].pop("floe:overflow") or "{}")
        original = expected[(item["collection"], item["id"])]
        # What a column cannot hold exactly (here: a timestamp's own text) is in floe's overflow; empty link lists
        # have a typed column (EMPTY_LINKS_TYPE) and stac-geoparquet reads them back as they were.
        item.update(overflow.get("top", {}))
        item["properties"].update(overflow.get("properties", {}))
        # stac_geoparquet fills absent struct fields and columns with nulls, and writes timestamps its own way.
        assert as_instants(strip_nulls(item)) == as_instants(strip_nulls(original))
        overflowed[item["id"]] = overflow
    assert {key for overflow in overflowed.values() for key in overflow.get("top", {})} == set()
    in_properties = {key: overflow["properties"] for key, overflow in overflowed.items() if "properties" in overflow}
    assert in_properties == {"gen-0030": {"created": "2024-02-01T00:00:00.000Z"}}


def test_a_tag_exports_exactly_its_items_after_more_commits_and_reruns_are_identical(evolving_repo, tmp_path):
    tagged = evolving_repo.view("v1")
    v1_items = list(tagged.items())
    assert len(v1_items) == 30 and evolving_repo.view("main").count() == 50
    expected = by_key(generated_items(30))
    expected[("alpha", "gen-0000")]["assets"]["floe:arrays"] = {
        "href": "alpha/gen-0000",
        "type": "application/vnd+zarr",
        "roles": ["data"],
    }

    export_ndjson(tagged, tmp_path / "a.ndjson")
    assert by_key([json.loads(line) for line in (tmp_path / "a.ndjson").read_text().splitlines()]) == expected
    export_geoparquet(tagged, tmp_path / "a.parquet")
    assert by_key(list(read_geoparquet_items(tmp_path / "a.parquet"))) == expected
    assert "sat:orbit_state" not in pq.read_schema(tmp_path / "a.parquet").names  # the schema of v1, not of main
    export_catalog(tagged, tmp_path / "a-catalog")
    _, collections, items = read_catalog(tmp_path / "a-catalog")
    assert set(collections) == {"alpha", "beta"}
    assert by_key([without_structural_links(item) for item in items]) == {
        key: without_structural_links(item) for key, item in expected.items()
    }

    # Same ref, same bytes; an earlier export in the way is replaced whole.
    export_ndjson(tagged, tmp_path / "b.ndjson")
    export_geoparquet(tagged, tmp_path / "b.parquet")
    first_tree = tree_bytes(tmp_path / "a-catalog")
    export_catalog(tagged, tmp_path / "a-catalog")
    assert (tmp_path / "a.ndjson").read_bytes() == (tmp_path / "b.ndjson").read_bytes()
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    assert tree_bytes(tmp_path / "a-catalog") == first_tree
    assert not [path for path in tmp_path.iterdir() if path.name.startswith(".")]  # no staging left behind


# -- names and targets ----------------------------------------------------------------------------------------------


def test_safe_names_stay_inside_and_stay_distinct():
    hostile = ["..", ".", "../etc", "a/b", "a\\b", ".hidden", "x" * 400, "x" * 400 + "y", "a%2Fb", "a b:c", ""]
    names = [safe_name(text) for text in hostile]
    assert len(set(names)) == len(names)
    for name in names:
        assert "/" not in name and "\\" not in name and not name.startswith(".") and 0 < len(name) <= 180


def test_odd_but_valid_ids_get_files_their_links_resolve_to(tmp_path):
    repository = Repository.create(tmp_path / "repo", Settings())
    items = [make_item("a b%25:c", "col %41"), make_item("d~e", "col %41"), make_item("ünï", "z")]
    ingest_items(repository, [write_ndjson(tmp_path / "odd.ndjson", items)])
    export_catalog(repository.view("main"), tmp_path / "catalog")
    _, collections, read_back = read_catalog(tmp_path / "catalog")
    assert set(collections) == {"col %41", "z"}
    assert by_key([without_structural_links(item) for item in read_back]) == by_key(items)
    assert (tmp_path / "catalog" / "col%20%2541" / "items" / "a%20b%2525%3Ac.json").is_file()


def test_catalog_refuses_to_replace_a_folder_that_is_not_an_export(real_repo, tmp_path):
    precious = tmp_path / "mine"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(InvalidExportTarget, match="not an earlier export"):
        export_catalog(real_repo.view("main"), precious)
    assert (precious / "notes.txt").read_text() == "keep me"


def test_conform_fills_absent_struct_fields_in_lists_of_sliced_arrays():
    from ingest.export._geoparquet import conform

    source = pa.array(
        [None, [{"name": "a"}], [], [{"name": "b"}, {"name": "c"}]],
        type=pa.list_(pa.struct([("name", pa.string())])),
    ).slice(1)
    target = pa.list_(pa.struct([("name", pa.string()), ("size", pa.int64())]))
    assert conform(source, target).to_pylist() == [
        [{"name": "a", "size": None}],
        [],
        [{"name": "b", "size": None}, {"name": "c", "size": None}],
    ]
    widened = conform(pa.array([{"x": 1}, None]), pa.struct([("x", pa.float64()), ("y", pa.string())]))
    assert widened.to_pylist() == [{"x": 1.0, "y": None}, None]


@pytest.fixture
def umask_027():
    """Exports run under umask 027 (group may read, others nothing), restored afterwards."""
    previous = os.umask(0o027)
    try:
        yield
    finally:
        os.umask(previous)


def test_exports_get_the_mode_the_umask_gives_not_a_private_one(real_repo, tmp_path, umask_027):
    view = real_repo.view()
    export_ndjson(view, tmp_path / "items.ndjson")
    export_geoparquet(view, tmp_path / "items.parquet")
    export_catalog(view, tmp_path / "catalog")
    assert stat.S_IMODE((tmp_path / "items.ndjson").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "items.parquet").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "catalog").stat().st_mode) == 0o750
    inside = [path for path in (tmp_path / "catalog").rglob("*")]
    assert inside
    assert {stat.S_IMODE(path.stat().st_mode) for path in inside if path.is_file()} == {0o640}
    assert {stat.S_IMODE(path.stat().st_mode) for path in inside if path.is_dir()} == {0o750}


def test_a_re_export_keeps_the_mode_of_the_file_it_replaces(real_repo, tmp_path, umask_027):
    target = tmp_path / "items.ndjson"
    target.write_text("old\n")
    target.chmod(0o604)
    export_ndjson(real_repo.view(), target)
    assert stat.S_IMODE(target.stat().st_mode) == 0o604
    assert target.read_text() != "old\n"
