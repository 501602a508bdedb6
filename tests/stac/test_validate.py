"""Items that would break the table or escape a path are refused, with the reason."""

from __future__ import annotations

import pytest

from ingest import InvalidItem
from ingest.stac import refused_geometries, validate_item
from tests.conftest import load_real_items, make_item


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
        {"type": "Blob", "coordinates": [1, 2]},
        {"type": "Circle", "coordinates": [1, 2], "radius": 3},
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


# -- what the STAC and GeoJSON specifications call invalid (issue 14) ------------------------------------------------


def polygon(west: float, south: float, east: float, north: float) -> dict:
    ring = [[west, south], [east, south], [east, north], [west, north], [west, south]]
    return {"type": "Polygon", "coordinates": [ring]}


def shaped(geometry: dict, bbox: list | None = None) -> dict:
    item = make_item("shaped") | {"geometry": geometry}
    if bbox is None:
        del item["bbox"]
    else:
        item["bbox"] = bbox
    return item


def refuses_alone_and_in_a_batch(item: dict, reason: str) -> None:
    """The item-by-item check names ``reason``; the vectorized batch check flags the item too."""
    with pytest.raises(InvalidItem, match=reason):
        validate_item(item)
    try:
        checked = validate_item(item, check_geometry=False)
    except InvalidItem:
        return  # refused before any geometry is parsed (a bbox wrong on its own): never reaches the batch check
    assert refused_geometries([make_item("fine"), checked, make_item("fine2")]) == [1]


@pytest.mark.parametrize(
    ("geometry", "reason"),
    [
        ({"type": "Point", "coordinates": [500, 10]}, r"longitude 500 is outside \[-180, 180\]"),
        ({"type": "Point", "coordinates": [-180.02, 10]}, r"longitude -180.02 is outside"),
        (polygon(0, 0, 1, 200), r"latitude 200 is outside \[-90, 90\]"),
        ({"type": "Point", "coordinates": [float("nan"), 1.0]}, "coordinate nan is not a finite number"),
        ({"type": "Point", "coordinates": [float("inf"), 1.0]}, "coordinate inf is not a finite number"),
        ({"type": "Point", "coordinates": "here"}, "coordinates must be arrays of numbers, got 'here'"),
        ({"type": "Point", "coordinates": ["1", "2"]}, "coordinates hold a non-number '1'"),
        ({"type": "Point", "coordinates": [True, 2]}, "coordinates hold a non-number True"),
        ({"type": "Point", "coordinates": [1]}, r"position \[1\] must hold 2 or 3 numbers"),
        (
            {"type": "GeometryCollection", "geometries": [{"type": "Point", "coordinates": [0, 95]}]},
            "latitude 95 is outside",
        ),
        ({"type": "GeometryCollection", "geometries": 3}, "needs a geometries array"),
        ({"type": "Circle", "coordinates": [0, 0], "radius": 5}, "unknown geometry type 'Circle'"),
    ],
)
def test_positions_outside_the_spec_are_refused(geometry, reason):
    refuses_alone_and_in_a_batch(shaped(geometry), reason)


@pytest.mark.parametrize(
    ("bbox", "reason"),
    [
        ([1, 2, 3], r"bbox must be a list of 4 or 6 numbers, got \[1, 2, 3\]"),
        ([1, 2, 3, 4, 5], "bbox must be a list of 4 or 6 numbers"),
        ([0, 0, "1", 1], "bbox holds a non-number '1'"),
        ([0, float("nan"), 1, 1], "bbox value nan is not a finite number"),
        ([0, 1, 1, 0], "has south 1 north of north 0"),
        ([0, 0, 10, 1, 1, 5], "has bottom 10 above top 5"),
        ([0, 0, 1, 200], r"latitude outside \[-90, 90\]"),
        ([-500, 0, 1, 1], r"longitude outside \[-180, 180\]"),
    ],
)
def test_bboxes_outside_the_spec_are_refused(bbox, reason):
    refuses_alone_and_in_a_batch(shaped(polygon(0, 0, 1, 1), bbox), reason)


@pytest.mark.parametrize(
    ("geometry", "bbox"),
    [
        (polygon(0, 0, 1, 1), [50, 50, 51, 51]),  # far from its geometry
        (polygon(0, 0, 1, 1), [0, 0, 0.5, 1]),  # half of it
        (polygon(0, 0, 1, 1), [0, 0.02, 1, 1]),  # beyond the tolerance
        (polygon(0, 0, 1, 1), [170, 0, -170, 1]),  # west > east, but the geometry does not cross the antimeridian
    ],
)
def test_a_bbox_that_does_not_contain_its_geometry_is_refused(geometry, bbox):
    refuses_alone_and_in_a_batch(shaped(geometry, bbox), "does not contain the geometry")


def test_a_bbox_is_checked_in_a_batch_without_parsing_item_by_item():
    outside = validate_item(shaped(polygon(0, 0, 1, 1), [50, 50, 51, 51]), check_geometry=False)
    assert refused_geometries([make_item("a"), outside]) == [1]


@pytest.mark.parametrize(
    ("geometry", "bbox"),
    [
        # RFC 7946 5.2: a geometry across the antimeridian, split in two, with west > east in its bbox.
        (
            {
                "type": "MultiPolygon",
                "coordinates": [polygon(170, 0, 180, 1)["coordinates"], polygon(-180, 0, -170, 1)["coordinates"]],
            },
            [170, 0, -170, 1],
        ),
        (polygon(-180.0013888888889, -89.99986, -179.0013888888889, -88.99986), None),  # Copernicus DEM's edge
        (polygon(-112.48554, 38.1261, -112.48163, 38.13389), [-112.48332, 38.1275, -112.4822, 38.13247]),  # 3DEP
        (polygon(0, 0, 1, 1), [-1, -1, 0, 2, 2, 10]),  # a 3D bbox, and a bbox larger than its geometry
        ({"type": "Point", "coordinates": [180, -90, 5]}, [180, -90, 180, -90]),
        ({"type": "Point", "coordinates": []}, [0, 0, 0, 0]),  # an empty geometry has no bounds to contain
    ],
)
def test_valid_geometries_and_bboxes_are_kept(geometry, bbox):
    item = shaped(geometry, bbox)
    assert validate_item(item) is item
    suspects = refused_geometries([validate_item(item, check_geometry=False)])
    assert suspects == ([0] if bbox and bbox[0] > bbox[len(bbox) // 2] else [])  # a crossing is checked alone


def test_every_real_item_is_valid():
    items = load_real_items()
    for item in items:
        validate_item(item)
    assert refused_geometries(items) == []


@pytest.mark.parametrize(
    "value",
    [
        "2021-01-01",
        "2021-W01",
        "2021-01-01T00:00:00",
        " 2021-01-01T00:00:00Z",
        "2021-13-01T00:00:00Z",
        "２０２１-01-01T00:00:00Z",
        "2021-01-01T00:00:00+0200",
        "20210101T000000Z",
        "yesterday",
        20210101,
    ],
)
@pytest.mark.parametrize("key", ["datetime", "start_datetime", "end_datetime"])
def test_timestamps_must_be_rfc3339_with_a_time_zone(key, value):
    item = make_item("timed")
    item["properties"].update(start_datetime="2020-01-01T00:00:00Z", end_datetime="2022-01-01T00:00:00Z")
    item["properties"][key] = value
    with pytest.raises(InvalidItem, match=f"properties.{key} .*RFC 3339"):
        validate_item(item)


@pytest.mark.parametrize(
    "value",
    [
        "2021-01-01T00:00:00Z",
        "2021-01-01t00:00:00z",
        "2021-01-01 04:59:04.220006+00:00",
        "2021-01-01T00:00:00.123456789-08:00",
    ],
)
def test_rfc3339_timestamps_are_kept(value):
    item = make_item("timed", when=value)
    assert validate_item(item) is item


def test_start_after_end_is_refused_and_equal_is_kept():
    item = make_item("ranged")
    item["properties"].update(datetime=None, start_datetime="2024-02-01T00:00:00Z", end_datetime="2024-01-01T00:00:00Z")
    with pytest.raises(InvalidItem, match="start_datetime '2024-02-01T00:00:00Z' is after end_datetime"):
        validate_item(item)
    item["properties"].update(start_datetime="2024-01-01T01:00:00+01:00")  # the same instant as the end
    assert validate_item(item) is item


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("%2e%2e", r"percent-decodes to '\.\.', which starts with '\.'"),
        ("%2E%2e", "percent-decodes to '..'"),
        ("%252e%252e", "percent-decodes to '..'"),  # decoded twice (a proxy, then the application)
        ("a%2Fb", "percent-decodes to 'a/b', which contains a path separator"),
        ("a%5cb", "which contains a path separator"),
        ("x%00", "which contains control characters"),
        ("%20x", "which has leading or trailing whitespace"),
        ("\ud800x", "not valid Unicode"),
    ],
)
@pytest.mark.parametrize("what", ["id", "collection"])
def test_names_that_decode_to_something_unsafe_are_refused(what, name, reason):
    with pytest.raises(InvalidItem, match=f"{what} .*{reason}"):
        validate_item(make_item("ok") | {what: name})


@pytest.mark.parametrize("name", ["100%", "a%20b", "50%off", "%zz", "%e2%82%ac"])
def test_names_with_harmless_percent_signs_are_kept(name):
    assert validate_item(make_item(name, collection=name))["id"] == name


def test_a_huge_id_is_named_short_with_its_length():
    with pytest.raises(InvalidItem) as raised:
        validate_item(make_item("a" * 10_000))
    message = str(raised.value)
    assert "(10,000 characters)" in message and len(message) < 300
    assert raised.value.item_id == "a" * 80 + "… (10,000 characters)"


def test_text_that_is_not_unicode_is_refused_anywhere_in_the_item():
    for extra in ({}, {"huge": 2**70}):  # orjson stops at the first problem: the walk finds the surrogate anyway
        with pytest.raises(InvalidItem, match="not valid Unicode"):
            validate_item(make_item("lone", "c", note="\udcff", **extra))
