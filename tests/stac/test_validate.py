"""Items that would break the table or escape a path are refused, with the reason."""

from __future__ import annotations

import pytest

from ingest import InvalidItem
from ingest.stac import validate_item
from tests.conftest import make_item


@pytest.mark.parametrize(
    ("item_id", "reason"),
    [
        ("../etc", "path separator"),
        ("a/b", "path separator"),
        ("a\\b", "path separator"),
        ("..", "starts with '.'"),
        (".hidden", "starts with '.'"),
        ("__zarr", "reserves"),
        ("", "empty"),
        ("tab\there", "control characters"),
        (" padded", "whitespace"),
        ("x" * 300, "longer than"),
        (42, "must be a string"),
    ],
)
def test_hostile_ids_are_refused(item_id, reason):
    with pytest.raises(InvalidItem, match=reason):
        validate_item(make_item("ok") | {"id": item_id}, source="batch.ndjson:3")


def test_hostile_collection_is_refused():
    with pytest.raises(InvalidItem, match=r"collection '\.\./c' contains a path separator"):
        validate_item(make_item("ok", collection="../c"))


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda item: item.pop("id"), "no id"),
        (lambda item: item.update(geometry=None), "no geometry"),
        (lambda item: item.update(geometry={"coordinates": [1, 2]}), "not a GeoJSON geometry"),
        (lambda item: item["properties"].pop("datetime"), "datetime is required"),
        (lambda item: item["properties"].update(datetime=None), "no datetime"),
        (lambda item: item["properties"].update(datetime="yesterday"), "not an RFC 3339"),
        (lambda item: item.update(type="Collection"), "type must be 'Feature'"),
        (lambda item: item.update(bbox=[1, 2, 3]), "bbox"),
        (lambda item: item.update(properties=None), "no properties"),
        (lambda item: item.update(assets=[]), "assets must be an object"),
        (lambda item: item.pop("collection"), "no collection"),
    ],
)
def test_invalid_items_name_the_item_and_source(change, reason):
    item = make_item("the-item")
    change(item)
    with pytest.raises(InvalidItem, match=reason) as raised:
        validate_item(item, source="items.json")
    assert "items.json" in str(raised.value)


def test_datetime_range_without_datetime_is_valid():
    item = make_item("ranged")
    item["properties"].update(datetime=None, start_datetime="2024-01-01T00:00:00Z", end_datetime="2024-02-01T00:00:00Z")
    assert validate_item(item) is item


def test_default_collection_fills_missing_collection():
    item = make_item("x")
    del item["collection"]
    assert validate_item(item, default_collection="fallback")["collection"] == "fallback"
    assert "collection" not in item  # the caller's item is not modified


@pytest.mark.parametrize(
    "geometry",
    [
        {"type": "Polygon", "coordinates": [[1, 2]]},
        {"type": "Point", "coordinates": "here"},
        {"type": "Blob", "coordinates": [1, 2]},
    ],
)
def test_malformed_geometry_is_refused_at_validation(geometry):
    with pytest.raises(InvalidItem, match="geometry is not valid GeoJSON"):
        validate_item(make_item("bad-geometry") | {"geometry": geometry})


def test_an_item_nested_beyond_the_limit_is_refused_even_when_orjson_cannot_serialize_it():
    deep: object = 1
    for _ in range(300):
        deep = {"a": deep}
    for extra in ({}, {"huge": 2**70}):  # orjson refuses integers beyond 64 bits: the walk decides instead
        item = make_item("deep", "c", deep=deep, **extra)
        with pytest.raises(InvalidItem, match="nests more than 255 levels"):
            validate_item(item)
    assert validate_item(make_item("shallow", "c", huge=2**70, nested={"a": {"b": [1, 2]}}))["id"] == "shallow"
