"""ISO WKB for the GeoJSON geometries real footprints are, written in Python, exact by construction.

GEOS reaches WKB from GeoJSON through text: serialize the dict, parse it, write
WKB, and (to prove the round trip) read it back to GeoJSON and compare. For
the simple geometries of STAC items that chain costs more than the walk
itself. :func:`simple_wkb` writes the same bytes as
``shapely.to_wkb(shapely.from_geojson(text), output_dimension=3, flavor="iso")``
straight from the dict, and only for geometries whose round trip through
GEOS is exact: one of the six simple types, members ``type`` and
``coordinates`` only, every position 2 or 3 floats (one dimension throughout),
no empty part, rings closed with at least 4 positions, lines with at least 2.
GEOS writes every finite double back in its shortest exact form, so a reader
gets the dict back. Anything else is None: the caller takes GEOS's path.
"""

from __future__ import annotations

import struct
from array import array
from typing import Any

_CODES = {"Point": 1, "LineString": 2, "Polygon": 3, "MultiPoint": 4, "MultiLineString": 5, "MultiPolygon": 6}
_DEPTHS = {"Point": 0, "LineString": 1, "MultiPoint": 1, "Polygon": 2, "MultiLineString": 2, "MultiPolygon": 3}
"""How deep a geometry's coordinates nest above its positions."""
_COUNT = struct.Struct("=I").pack
_ORDER = b"\x01" if array("H", [1]).tobytes() == b"\x01\x00" else b"\x00"
_HEADS = {
    (code, dimensions): _ORDER + _COUNT(code + (1000 if dimensions == 3 else 0))  # ISO WKB: Z adds 1000
    for code in _CODES.values()
    for dimensions in (2, 3)
}


class _NotSimple(Exception):
    """The geometry leaves the simple path (GEOS decides what it is)."""


def _positions(positions: Any, dimensions: int, least: int, flat: list[Any], parts: list[Any]) -> None:
    """Append a run of positions: its count to ``parts``, its numbers to ``flat``; then a placeholder."""
    if type(positions) is not list or len(positions) < least:
        raise _NotSimple
    for position in positions:
        if type(position) is not list or len(position) != dimensions:
            raise _NotSimple
        flat += position
    parts.append(_COUNT(len(positions)))
    parts.append(len(positions) * dimensions)  # this run's doubles, filled in once every number is known exact


def _ring(ring: Any, dimensions: int, flat: list[Any], parts: list[Any]) -> None:
    _positions(ring, dimensions, 4, flat, parts)
    if ring[0] != ring[-1]:
        raise _NotSimple


def _members(members: Any, parts: list[Any]) -> list[Any]:
    if type(members) is not list or not members:
        raise _NotSimple
    parts.append(_COUNT(len(members)))
    return members


def _exact(doubles: array[float], flat: list[Any]) -> bool:
    """Whether the doubles are the numbers as given: not an integer beyond 2**53 rounded, not a NaN (which
    equals nothing), not a boolean (``array`` takes True as 1.0)."""
    if doubles.tolist() != flat:
        return False
    return not ((True in flat or False in flat) and any(type(value) is bool for value in flat))


def _dimensions(depth: int, coordinates: Any) -> int:
    """The length of the geometry's first position (the one every other must share)."""
    node = coordinates
    for _ in range(depth):
        if type(node) is not list or not node:
            raise _NotSimple
        node = node[0]
    if type(node) is not list or len(node) not in (2, 3):
        raise _NotSimple
    return len(node)


def _walk(kind: str, coordinates: Any, dimensions: int, flat: list[Any], parts: list[Any]) -> None:
    if kind == "Polygon":
        for ring in _members(coordinates, parts):
            _ring(ring, dimensions, flat, parts)
    elif kind == "MultiPolygon":
        for polygon in _members(coordinates, parts):
            parts.append(_HEADS[3, dimensions])
            for ring in _members(polygon, parts):
                _ring(ring, dimensions, flat, parts)
    elif kind == "Point":
        flat += coordinates
        parts.append(dimensions)
    elif kind == "LineString":
        _positions(coordinates, dimensions, 2, flat, parts)
    elif kind == "MultiPoint":
        for point in _members(coordinates, parts):
            parts.append(_HEADS[1, dimensions])
            if type(point) is not list or len(point) != dimensions:
                raise _NotSimple
            flat += point
            parts.append(dimensions)
    else:  # MultiLineString
        for line in _members(coordinates, parts):
            parts.append(_HEADS[2, dimensions])
            _positions(line, dimensions, 2, flat, parts)


def simple_wkb(geometry: Any) -> tuple[bytes, int, list[float]] | None:
    """The geometry's ISO WKB, its dimensions (2 or 3) and its numbers flattened; None off the simple path.

    Integers are taken as the doubles they equal (as GEOS's text path does);
    an integer no double holds exactly, a boolean or a non-number is not simple.
    """
    if type(geometry) is not dict or len(geometry) != 2:
        return None
    kind = geometry.get("type")
    depth = _DEPTHS.get(kind)  # type: ignore[arg-type]
    if depth is None:
        return None
    coordinates = geometry.get("coordinates")
    if depth == 2 and kind == "Polygon":
        ring = _one_ring(coordinates)
        if ring is not None:  # the footprint of most items: one ring of 2D positions, checked inline
            return _polygon_of_one_ring(ring)
    flat: list[Any] = []
    parts: list[Any] = []
    try:
        dimensions = _dimensions(depth, coordinates)
        parts.append(_HEADS[_CODES[kind], dimensions])  # type: ignore[index]
        _walk(kind, coordinates, dimensions, flat, parts)  # type: ignore[arg-type]
        doubles = array("d", flat)
    except (_NotSimple, TypeError, OverflowError):
        return None
    if not _exact(doubles, flat):
        return None
    data = doubles.tobytes()
    offset = 0
    for index, part in enumerate(parts):
        if type(part) is int:  # a run of ``part`` doubles
            parts[index] = data[offset : offset + 8 * part]
            offset += 8 * part
    return b"".join(parts), dimensions, flat


def _one_ring(coordinates: Any) -> list[Any] | None:
    if type(coordinates) is list and len(coordinates) == 1:
        ring = coordinates[0]
        if type(ring) is list and len(ring) >= 4 and type(ring[0]) is list and len(ring[0]) == 2:
            return ring
    return None


_POLYGON_2D = _HEADS[3, 2] + _COUNT(1)


def _polygon_of_one_ring(ring: list[Any]) -> tuple[bytes, int, list[float]] | None:
    if ring[0] != ring[-1]:
        return None
    flat: list[Any] = []
    for position in ring:
        if type(position) is not list or len(position) != 2:
            return None
        flat += position
    try:
        doubles = array("d", flat)
    except (TypeError, OverflowError):
        return None
    if not _exact(doubles, flat):
        return None
    return _POLYGON_2D + _COUNT(len(ring)) + doubles.tobytes(), 2, flat
