"""What GeoJSON (RFC 7946) and STAC call an invalid geometry or bbox, checked item by item and a batch at once.

:func:`geometry_problem` checks one item and :func:`refused_geometries` a batch at once, each rule with
:data:`TOLERANCE` degrees of slack. The rules: docs/ingest.md#bad-input.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson
import shapely

from ingest.stac._text import one_line, shown
from ingest.stac._wkb import one_ring_positions, simple_wkb

TOLERANCE = 0.01
"""Degrees (about 1.1 km at the equator) a coordinate or a geometry may stray beyond its limit or its bbox, for
footprints traced from pixel edges: Copernicus DEM tiles start at -180.0014, and USGS 3DEP lidar items have footprints
up to 0.0022 degrees outside their bbox. Far narrower than a bbox that describes another place."""
GEOMETRY_TYPES = frozenset(
    ("Point", "MultiPoint", "LineString", "MultiLineString", "Polygon", "MultiPolygon", "GeometryCollection")
)
"""The geometry types of RFC 7946."""
_LONGITUDE = 180.0 + TOLERANCE
_LATITUDE = 90.0 + TOLERANCE


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def position_problem(position: list[Any]) -> str | None:
    """Why one GeoJSON position is invalid (not 2-3 finite numbers, out of range), or None."""
    for number in position:
        if not _is_number(number):
            return f"geometry coordinates hold a non-number {shown(number)}"
        if not math.isfinite(number):
            return f"geometry coordinate {number!r} is not a finite number"
    if len(position) not in (2, 3):
        return f"geometry position {shown(position)} must hold 2 or 3 numbers"
    longitude, latitude = position[0], position[1]
    if abs(longitude) > _LONGITUDE:
        return f"geometry longitude {longitude!r} is outside [-180, 180]"
    if abs(latitude) > _LATITUDE:
        return f"geometry latitude {latitude!r} is outside [-90, 90]"
    return None


def _coordinates_problem(coordinates: Any) -> str | None:
    """Why a ``coordinates`` member is invalid (walked without recursion: nesting is the caller's to bound)."""
    pending = [coordinates]
    while pending:
        node = pending.pop()
        if not isinstance(node, list):
            return f"geometry coordinates must be arrays of numbers, got {shown(node)}"
        if node and all(not isinstance(entry, list) for entry in node):
            problem = position_problem(node)
            if problem is not None:
                return problem
            continue
        pending.extend(node)
    return None


def coordinates_problem(geometry: dict[str, Any]) -> str | None:
    """Why a geometry's positions are invalid (anywhere in a GeometryCollection too), or None."""
    pending = [geometry]
    while pending:
        node = pending.pop()
        if node.get("type") not in GEOMETRY_TYPES:
            return f"geometry is not valid GeoJSON (unknown geometry type {shown(node.get('type'))})"
        if node.get("type") == "GeometryCollection":
            members = node.get("geometries")
            if not isinstance(members, list) or not all(isinstance(member, dict) for member in members):
                return "GeometryCollection needs a geometries array of geometry objects"
            pending.extend(members)
            continue
        if "coordinates" not in node:
            return f"geometry of type {shown(node.get('type'))} has no coordinates"
        problem = _coordinates_problem(node["coordinates"])
        if problem is not None:
            return problem
    return None


def bbox_problem(bbox: Any) -> str | None:
    """Why a bbox is invalid on its own (its shape, numbers, ranges and order), or None."""
    if not isinstance(bbox, list) or len(bbox) not in (4, 6):
        return f"bbox must be a list of 4 or 6 numbers, got {shown(bbox)}"
    for number in bbox:
        if type(number) is not float and not _is_number(number):  # (a float needs no more than its type)
            return f"bbox holds a non-number {shown(number)}"
        if not math.isfinite(number):
            return f"bbox value {number!r} is not a finite number"
    half = len(bbox) // 2
    west, south, east, north = bbox[0], bbox[1], bbox[half], bbox[half + 1]
    if half == 3 and bbox[2] > bbox[5]:
        return f"bbox {shown(bbox)} has bottom {bbox[2]!r} above top {bbox[5]!r}"
    if south > north:
        return f"bbox {shown(bbox)} has south {south!r} north of north {north!r}"
    if max(abs(west), abs(east)) > _LONGITUDE:
        return f"bbox {shown(bbox)} has a longitude outside [-180, 180]"
    if max(abs(south), abs(north)) > _LATITUDE:
        return f"bbox {shown(bbox)} has a latitude outside [-90, 90]"
    return None


def _sides(bbox: list[Any]) -> tuple[float, float, float, float]:
    half = len(bbox) // 2
    return float(bbox[0]), float(bbox[1]), float(bbox[half]), float(bbox[half + 1])


def containment_problem(bbox: list[Any], shape: Any) -> str | None:
    """Why ``bbox`` (valid on its own) does not contain the parsed geometry ``shape``, or None."""
    west, south, east, north = _sides(bbox)
    xmin, ymin, xmax, ymax = (float(bound) for bound in shapely.bounds(shape))
    if math.isnan(xmin):  # an empty geometry has no bounds to contain
        return None
    if ymin < south - TOLERANCE or ymax > north + TOLERANCE:
        return f"bbox {shown(bbox)} does not contain the geometry (latitudes {ymin!r} to {ymax!r})"
    if west <= east:
        outside = xmin < west - TOLERANCE or xmax > east + TOLERANCE
    else:  # crossing the antimeridian: every longitude east of west or west of east
        longitudes = shapely.get_coordinates(shape)[:, 0]
        outside = bool(np.any((longitudes < west - TOLERANCE) & (longitudes > east + TOLERANCE)))
    if outside:
        return f"bbox {shown(bbox)} does not contain the geometry (longitudes {xmin!r} to {xmax!r})"
    return None


def geometry_problem(item: dict[str, Any]) -> str | None:
    """Why an item's geometry (a dict with a string ``type``) or its bbox is invalid, or None."""
    geometry = item["geometry"]
    problem = coordinates_problem(geometry)
    if problem is not None:
        return problem
    try:
        shape = shapely.from_geojson(orjson.dumps(geometry))
    except (shapely.errors.GEOSException, TypeError, ValueError) as error:
        return f"geometry is not valid GeoJSON ({one_line(str(error))})"
    if "bbox" in item:
        return containment_problem(item["bbox"], shape)
    return None


def refused_geometries(items: list[dict[str, Any]]) -> list[int]:
    """Indexes of the items :func:`geometry_problem` may refuse, found with a few vectorized calls.

    Parsing and checking item by item costs tens of microseconds each; a batch
    costs a fraction. Simple geometries (see :func:`~ingest.stac._wkb.simple_wkb`)
    are walked in Python with no GEOS parse; the others are parsed by GEOS in
    one call. An index returned is a suspect, not a verdict: the caller
    checks it alone (which names the problem). Antimeridian bboxes are always
    suspects. The items' bboxes must have passed :func:`bbox_problem`.
    """
    if not items:
        return []
    suspect = np.zeros(len(items), dtype=bool)
    bounds = np.full((len(items), 4), np.nan)
    polygons = one_ring_positions([item["geometry"] for item in items])
    if polygons is not None:  # every one a plain footprint: checked for the whole batch in numpy
        _check_positions(np.arange(len(items)), *polygons, suspect, bounds)
    else:
        walked = [simple_wkb(item["geometry"]) for item in items]
        simple = [index for index, found in enumerate(walked) if found is not None]
        others = [index for index, found in enumerate(walked) if found is None]
        if simple:
            _check_simple(simple, [found for found in walked if found is not None], suspect, bounds)
        if others and not _check_parsed(items, others, suspect, bounds):
            return list(range(len(items)))
    with_bbox = [index for index, item in enumerate(items) if "bbox" in item]
    if with_bbox:
        sides = np.array([_sides(items[index]["bbox"]) for index in with_bbox], dtype=np.float64).reshape(-1, 4)
        xmin, ymin, xmax, ymax = bounds[with_bbox].T
        west, south, east, north = sides.T
        outside = (ymin < south - TOLERANCE) | (ymax > north + TOLERANCE) | (west > east)
        outside |= (xmin < west - TOLERANCE) | (xmax > east + TOLERANCE)
        suspect[np.asarray(with_bbox)[outside]] = True
    return [int(index) for index in np.flatnonzero(suspect)]


def _check_simple(
    indexes: list[int], walked: list[tuple[bytes, int, list[float]]], suspect: np.ndarray, bounds: np.ndarray
) -> None:
    """Mark simple geometries with a non-finite or out-of-range coordinate; fill their bounds."""
    values: list[float] = []
    xs: list[float] = []
    ys: list[float] = []
    lengths, positions = [], []
    for _, dimensions, flat in walked:
        values.extend(flat)
        xs.extend(flat[0::dimensions])
        ys.extend(flat[1::dimensions])
        lengths.append(len(flat))
        positions.append(len(flat) // dimensions)
    value_starts = np.cumsum([0, *lengths[:-1]])
    finite = np.logical_and.reduceat(np.isfinite(np.array(values, dtype=np.float64)), value_starts)
    chosen = np.asarray(indexes)
    suspect[chosen[~finite]] = True
    xy = np.column_stack([np.array(xs, dtype=np.float64), np.array(ys, dtype=np.float64)])
    _check_positions(chosen, xy, np.array(positions), suspect, bounds)


def _check_positions(
    chosen: np.ndarray, xy: np.ndarray, counts: np.ndarray, suspect: np.ndarray, bounds: np.ndarray
) -> None:
    """Mark the geometries ``chosen`` (``counts`` positions each, in order in ``xy``) with a coordinate out of
    range (a non-finite one included); fill their bounds."""
    starts = np.cumsum([0, *counts[:-1]])
    x, y = xy[:, 0], xy[:, 1]
    with np.errstate(invalid="ignore"):
        inside = (np.abs(x) <= _LONGITUDE) & (np.abs(y) <= _LATITUDE)
        suspect[chosen[~np.logical_and.reduceat(inside, starts)]] = True
        bounds[chosen] = np.column_stack(
            [
                np.minimum.reduceat(x, starts),
                np.minimum.reduceat(y, starts),
                np.maximum.reduceat(x, starts),
                np.maximum.reduceat(y, starts),
            ]
        )


def _check_parsed(items: list[dict[str, Any]], indexes: list[int], suspect: np.ndarray, bounds: np.ndarray) -> bool:
    """Parse other geometries with GEOS in one call: mark those it refuses or with stray coordinates; fill
    bounds. False when one holds a value that is not JSON (every item is then a suspect)."""
    try:
        texts = [orjson.dumps(items[index]["geometry"]) for index in indexes]
    except TypeError:
        return False  # someone holds a non-JSON value: let the per-item check say who
    chosen = np.asarray(indexes)
    # orjson writes NaN as null, which GEOS refuses: NaN coordinates are suspects too.
    parsed = shapely.from_geojson(texts, on_invalid="ignore")
    suspect[chosen[shapely.is_missing(parsed)]] = True
    coordinates, owner = shapely.get_coordinates(parsed, return_index=True)
    strays = ~np.isfinite(coordinates).all(axis=1)
    strays |= (np.abs(coordinates[:, 0]) > _LONGITUDE) | (np.abs(coordinates[:, 1]) > _LATITUDE)
    suspect[chosen[owner[strays]]] = True
    bounds[chosen] = shapely.bounds(parsed)
    return True
