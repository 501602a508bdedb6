"""Geometries a search sends (``intersects``, CQL2 spatial literals): GeoJSON checked as RFC 7946 says, or refused.

shapely builds a geometry from almost anything: it closes an open ring without
a word and builds a self-intersecting (bow-tie) polygon whose intersection
tests answer nothing. A search with such a geometry used to return 200 with
wrong or empty results; :func:`checked_geometry` refuses it with the reason.
"""

from __future__ import annotations

from typing import Any

import shapely
import shapely.errors
import shapely.geometry

from ingest.errors import InvalidSearch
from ingest.stac import GEOMETRY_TYPES, coordinates_problem

_MAX_COLLECTION_NESTING = 8


def is_geometry_literal(value: Any) -> bool:
    """Whether ``value`` is meant as a GeoJSON geometry (an object with a geometry type)."""
    return isinstance(value, dict) and value.get("type") in GEOMETRY_TYPES


def checked_geometry(document: Any, what: str) -> shapely.Geometry:
    """``document`` (a GeoJSON geometry object) as a valid, non-empty shapely geometry; InvalidSearch naming ``what``.

    Refused: what items may not hold either (:func:`ingest.stac.coordinates_problem`: unknown types,
    positions that are not 2 or 3 finite numbers inside longitude [-180, 180] and latitude [-90, 90]),
    and, stricter than for items, rings that are not closed or have fewer than four positions,
    GeometryCollections nested more than 8 deep, and geometries that are not valid (self-intersecting
    rings, ...): an item's footprint is data to keep, a search's geometry is a question to answer right.
    """
    if not isinstance(document, dict):
        raise InvalidSearch(f"{what} must be a GeoJSON geometry object, not {type(document).__name__}")
    problem = coordinates_problem(document) or _ring_or_nesting_problem(document)
    if problem is not None:
        raise InvalidSearch(f"{what}: {problem}")
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


def _ring_or_nesting_problem(document: dict[str, Any]) -> str | None:
    """Rings shapely would close silently or refuse, and collections nested too deep (walked without recursion)."""
    pending = [(document, 0)]
    while pending:
        node, nesting = pending.pop()
        if node["type"] == "GeometryCollection":
            if nesting >= _MAX_COLLECTION_NESTING:
                return "a GeometryCollection may be nested at most 8 deep"
            pending.extend((member, nesting + 1) for member in node["geometries"])
            continue
        polygons = {"Polygon": [node["coordinates"]], "MultiPolygon": node["coordinates"]}.get(node["type"], [])
        for ring in (ring for polygon in polygons for ring in polygon):
            if len(ring) < 4:
                return f"a polygon ring needs at least 4 positions, this one has {len(ring)}"
            if ring[0] != ring[-1]:
                return "a polygon ring must be closed (its last position equal to its first)"
    return None
