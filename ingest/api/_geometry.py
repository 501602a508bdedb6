"""Geometries a search sends (``intersects``, CQL2 spatial literals): GeoJSON checked as RFC 7946 says, or refused.

shapely builds a geometry from almost anything: it closes an open ring without
a word and builds a self-intersecting (bow-tie) polygon whose intersection
tests answer nothing. A search with such a geometry used to return 200 with
wrong or empty results; :func:`checked_geometry` refuses it with the reason.
"""

from __future__ import annotations

import math
from typing import Any

import shapely
import shapely.errors
import shapely.geometry

from ingest.errors import InvalidSearch

GEOMETRY_TYPES = frozenset(
    ("Point", "MultiPoint", "LineString", "MultiLineString", "Polygon", "MultiPolygon", "GeometryCollection")
)
# How deep each type's coordinates nest (positions are depth 0).
_COORDINATE_DEPTH = {
    "Point": 0,
    "MultiPoint": 1,
    "LineString": 1,
    "MultiLineString": 2,
    "Polygon": 2,
    "MultiPolygon": 3,
}
_MAX_COLLECTION_NESTING = 8


def is_geometry_literal(value: Any) -> bool:
    """Whether ``value`` is meant as a GeoJSON geometry (an object with a geometry type)."""
    return isinstance(value, dict) and value.get("type") in GEOMETRY_TYPES


def checked_geometry(document: Any, what: str) -> shapely.Geometry:
    """``document`` (a GeoJSON geometry object) as a valid, non-empty shapely geometry; InvalidSearch naming ``what``.

    Refused: anything that is not a GeoJSON geometry, positions that are not 2
    or 3 finite numbers inside longitude [-180, 180] and latitude [-90, 90],
    rings that are not closed or have fewer than four positions, and
    geometries that are not valid (self-intersecting rings, ...).
    """
    _check_structure(document, what, nesting=0)
    try:
        geometry = shapely.geometry.shape(document)
    except (shapely.errors.ShapelyError, ValueError, TypeError, KeyError, IndexError, AttributeError) as error:
        raise InvalidSearch(f"{what} is not a GeoJSON geometry: {error}") from error
    if geometry.is_empty:
        raise InvalidSearch(f"{what} is an empty geometry")
    if not shapely.is_valid(geometry):
        reason = shapely.is_valid_reason(geometry)
        raise InvalidSearch(f"{what} is not a valid geometry ({reason}): give simple, non-self-intersecting rings")
    return geometry


def _check_structure(document: Any, what: str, nesting: int) -> None:
    if not isinstance(document, dict):
        raise InvalidSearch(f"{what} must be a GeoJSON geometry object, not {type(document).__name__}")
    kind = document.get("type")
    if kind not in GEOMETRY_TYPES:
        raise InvalidSearch(
            f"{what} has type {str(kind)[:40]!r}: a GeoJSON geometry is one of {', '.join(sorted(GEOMETRY_TYPES))}"
        )
    if kind == "GeometryCollection":
        members = document.get("geometries")
        if not isinstance(members, list) or nesting >= _MAX_COLLECTION_NESTING:
            raise InvalidSearch(f"{what}: a GeometryCollection needs a list of geometries (nested at most 8 deep)")
        for member in members:
            _check_structure(member, what, nesting + 1)
        return
    _check_coordinates(document.get("coordinates"), _COORDINATE_DEPTH[kind], kind, what)


def _check_coordinates(value: Any, depth: int, kind: str, what: str) -> None:
    if depth == 0:
        _check_position(value, what)
        return
    if not isinstance(value, list):
        raise InvalidSearch(f"{what}: the coordinates of a {kind} must be nested {depth + 1} lists deep")
    ring_depth = {"Polygon": 1, "MultiPolygon": 1}.get(kind)
    if depth == ring_depth:
        _check_ring(value, what)
    for element in value:
        _check_coordinates(element, depth - 1, kind, what)


def _check_ring(ring: list[Any], what: str) -> None:
    if len(ring) < 4:
        raise InvalidSearch(f"{what}: a polygon ring needs at least 4 positions, this one has {len(ring)}")
    if ring[0] != ring[-1]:
        raise InvalidSearch(f"{what}: a polygon ring must be closed (its last position equal to its first)")


def _check_position(value: Any, what: str) -> None:
    if not isinstance(value, list) or len(value) not in (2, 3):
        raise InvalidSearch(f"{what}: a position is 2 or 3 numbers, not {str(value)[:60]}")
    if not all(isinstance(number, int | float) and not isinstance(number, bool) for number in value):
        raise InvalidSearch(f"{what}: a position is 2 or 3 numbers, not {str(value)[:60]}")
    if not all(math.isfinite(number) for number in value):
        raise InvalidSearch(f"{what}: position {value} is not finite")
    longitude, latitude = value[0], value[1]
    if not (-180 <= longitude <= 180 and -90 <= latitude <= 90):
        raise InvalidSearch(f"{what}: position {value} lies outside longitude [-180, 180] and latitude [-90, 90]")
