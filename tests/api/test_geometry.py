"""Geometries a search sends (intersects, CQL2 literals) are checked as GeoJSON says, or refused naming why."""

from __future__ import annotations

import math
from typing import Any

import pytest

from ingest.api._filter import parse_filter
from ingest.api._geometry import checked_geometry
from ingest.errors import InvalidSearch

SQUARE = [[0, 0], [10, 0], [10, 10], [0, 10], [0, 0]]
HOLE = [[2, 2], [2, 4], [4, 4], [4, 2], [2, 2]]


@pytest.mark.parametrize(
    "geometry",
    [
        {"type": "Point", "coordinates": [1, 2]},
        {"type": "Point", "coordinates": [1, 2, 30]},
        {"type": "LineString", "coordinates": [[0, 0], [1, 1]]},
        {"type": "Polygon", "coordinates": [SQUARE, HOLE]},
        {"type": "MultiPolygon", "coordinates": [[SQUARE], [[[20, 20], [30, 20], [30, 30], [20, 20]]]]},
        {"type": "GeometryCollection", "geometries": [{"type": "Point", "coordinates": [180, -90]}]},
    ],
)
def test_valid_geometries_are_accepted(geometry: dict[str, Any]) -> None:
    assert not checked_geometry(geometry, "intersects").is_empty


@pytest.mark.parametrize(
    ("geometry", "reason"),
    [
        ({"type": "Polygon", "coordinates": [[[0, 0], [10, 10], [10, 0], [0, 10], [0, 0]]]}, "Self-intersection"),
        ({"type": "Polygon", "coordinates": [SQUARE[:-1]]}, "closed"),
        ({"type": "Polygon", "coordinates": [[[0, 0], [1, 1], [0, 0]]]}, "at least 4 positions"),
        ({"type": "MultiPolygon", "coordinates": [[SQUARE], [SQUARE[:-1]]]}, "closed"),
        ({"type": "Polygon", "coordinates": [SQUARE, [[20, 20], [20, 30], [30, 30], [20, 20]]]}, "not a valid"),
        ({"type": "Point", "coordinates": [500, 200]}, "outside"),
        ({"type": "Point", "coordinates": [math.nan, 0]}, "finite"),
        ({"type": "Point", "coordinates": [1]}, "2 or 3 numbers"),
        ({"type": "Point", "coordinates": [True, 1]}, "non-number True"),
        ({"type": "Point", "coordinates": ["1", "2"]}, "non-number '1'"),
        ({"type": "LineString", "coordinates": [[0, 0]]}, "GeoJSON geometry"),
        ({"type": "Polygon", "coordinates": "x"}, "arrays of numbers"),
        ({"type": "Foo", "coordinates": [1, 2]}, "Foo"),
        ({"type": "Point"}, "no coordinates"),
        ({"type": "GeometryCollection"}, "geometries array"),
        ([1, 2], "object"),
        ("POINT(1 2)", "object"),
    ],
)
def test_invalid_geometries_are_refused_with_the_reason(geometry: Any, reason: str) -> None:
    with pytest.raises(InvalidSearch, match=reason):
        checked_geometry(geometry, "intersects")


def test_a_geometry_collection_nested_too_deep_is_refused() -> None:
    geometry: dict[str, Any] = {"type": "Point", "coordinates": [0, 0]}
    for _ in range(20):
        geometry = {"type": "GeometryCollection", "geometries": [geometry]}
    with pytest.raises(InvalidSearch, match="nested at most"):
        checked_geometry(geometry, "intersects")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("S_INTERSECTS(geometry, POLYGON((0 0, 10 0, 10 10, 0 10)))", "closed"),
        ("S_WITHIN(geometry, POLYGON((0 0, 10 10, 10 0, 0 10, 0 0)))", "Self-intersection"),
        ("S_INTERSECTS(geometry, BBOX(0, 10, 10, 0))", "southern edge"),
    ],
)
def test_invalid_geometry_literals_in_a_filter_are_refused(text: str, reason: str) -> None:
    with pytest.raises(InvalidSearch, match=reason):
        parse_filter(text, "cql2-text")


@pytest.mark.parametrize(
    ("document", "reason"),
    [
        ({"op": "=", "args": [{"property": "id"}]}, "takes 2 arguments, not 1"),
        ({"op": "<", "args": [{"property": "a"}, 1, 2]}, "takes 2 arguments, not 3"),
        ({"op": "and", "args": [{"op": "=", "args": [{"property": "id"}, "x"]}]}, "at least 2"),
        ({"op": "not", "args": []}, "takes 1 arguments"),
        ({"op": "between", "args": [{"property": "a"}]}, "2 to 3"),
        ({"op": "isNull", "args": "id"}, "cql2-json"),  # the parser refuses it first
        ({"op": "or", "args": [{"op": "=", "args": [{"property": "id"}, "x"]}, {"op": "=", "args": ["y"]}]}, "not 1"),
    ],
)
def test_operators_with_the_wrong_number_of_arguments_are_refused(document: dict[str, Any], reason: str) -> None:
    with pytest.raises(InvalidSearch, match=reason):
        parse_filter(document, "cql2-json")


def test_well_formed_filters_still_parse() -> None:
    for document in (
        {"op": "between", "args": [{"property": "cloud"}, 0, 50]},
        {"op": "between", "args": [{"property": "cloud"}, [0, 50]]},
        {"op": "isNull", "args": [{"property": "cloud"}]},
        {"op": "in", "args": [{"property": "id"}, ["a", "b"]]},
        {"op": "s_intersects", "args": [{"property": "geometry"}, {"type": "Polygon", "coordinates": [SQUARE]}]},
    ):
        assert parse_filter(document, "cql2-json") is not None
