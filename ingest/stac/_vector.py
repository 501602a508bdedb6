"""Columns converted a whole batch at a time in Arrow, where every value takes the common form.

:func:`~ingest.stac._rows.items_to_arrow` decides, value by value in Python,
what types exactly and what goes to the overflow. Most batches of a real
archive are uniform: every timestamp written as floe writes it back, every
footprint a plain polygon. For those the answer is the same for every row and
Arrow's kernels can give it; anything else (one row is enough) returns None
and the caller takes the row-by-row path, so the result never depends on
which path ran.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

TIMESTAMP = pa.timestamp("us", tz="UTC")
ABSENT: Any = object()
"""A member an item does not have (``None`` is an explicit null)."""

# Python's datetime holds years 1 to 9999; Arrow reads year 0 and beyond 9999, which no reader could give back.
_EARLIEST = pa.scalar(datetime(1, 1, 1, tzinfo=UTC), TIMESTAMP)
_LATEST = pa.scalar(datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), TIMESTAMP)
_CANONICAL = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{6})?Z$"
_ZERO_FRACTION = ".000000Z"


def canonical_times(texts: list[Any], *, null_is_absent: bool = False) -> pa.Array | None:
    """The timestamp column of ``texts`` (strings or :data:`ABSENT`; None too, with ``null_is_absent``) if every
    string is a time in floe's canonical form (``render_datetime``: ``2024-01-05T10:20:30Z``, six digits of
    fraction when there is one), which reads back as the same text. None when any is not: the row-by-row path
    then keeps the original text of each other form in the overflow."""
    if not all(type(text) is str or text is ABSENT or (text is None and null_is_absent) for text in texts):
        return None
    strings = pa.array([text if type(text) is str else None for text in texts], pa.string())
    try:
        times = strings.cast(TIMESTAMP)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if times.null_count == len(times):
        return times
    bounds = pc.min_max(times)
    if pc.less(bounds["min"], _EARLIEST).as_py() or pc.greater(bounds["max"], _LATEST).as_py():
        return None
    # Text of this shape that Arrow parses is what render_datetime writes for the time it names (a zero fraction
    # is not: floe writes none), which is cheaper to check than rendering every time again.
    canonical = pc.match_substring_regex(strings, _CANONICAL)
    if pc.all(pc.fill_null(canonical, True)).as_py() is not True:
        return None
    if pc.any(pc.ends_with(strings, _ZERO_FRACTION)).as_py():
        return None
    return times


_RING_LISTS = pa.list_(pa.list_(pa.float64()))
_POLYGON_HEAD = np.frombuffer(b"\x01\x03\x00\x00\x00\x01\x00\x00\x00", dtype=np.uint8)
"""ISO WKB of a 2D polygon with one ring, little-endian: byte order, type 3, one ring (its count follows)."""


def one_ring_positions(geometries: list[Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """Every position (an ``(n, 2)`` array of doubles) and each geometry's count of them, if every geometry is
    a 2D ``Polygon`` of one closed ring of at least 4 positions of finite numbers (the footprint of most items):
    what :func:`~ingest.stac._wkb.simple_wkb` takes on its shortest path. None when any is not."""
    rings = []
    for geometry in geometries:
        ring = _only_ring(geometry)
        if ring is None:
            return None
        rings.append(ring)
    if not rings:
        return None
    try:
        # Integers a double cannot hold exactly are refused by Arrow; strings and objects too. A boolean becomes
        # 1.0 or 0.0, as GEOS's path makes it (validation refuses booleans among coordinates).
        positions = pa.array(rings, _RING_LISTS)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
        return None
    points = positions.flatten()
    if positions.null_count or points.null_count:
        return None
    counts = pc.list_value_length(positions).to_numpy(zero_copy_only=False)
    if len(counts) and counts.min() < 4:
        return None
    sizes = pc.list_value_length(points).to_numpy(zero_copy_only=False)
    numbers = points.flatten()
    if numbers.null_count or (len(sizes) and (sizes.min() != 2 or sizes.max() != 2)):
        return None
    xy = numbers.to_numpy(zero_copy_only=False).reshape(-1, 2)
    if not np.isfinite(xy).all():
        return None
    first = np.concatenate(([0], np.cumsum(counts)[:-1]))
    if not (xy[first] == xy[first + counts - 1]).all():
        return None
    return xy, counts


_LISTS = frozenset((list,))


def _only_ring(geometry: Any) -> list[Any] | None:
    """The ring of a ``{"type": "Polygon", "coordinates": [ring]}`` whose positions are lists, else None."""
    if type(geometry) is not dict or len(geometry) != 2 or geometry.get("type") != "Polygon":
        return None
    coordinates = geometry.get("coordinates")
    if type(coordinates) is not list or len(coordinates) != 1:
        return None
    ring = coordinates[0]
    # Lists only, as JSON gives them: GEOS's path keeps a geometry of tuples aside, as one it cannot give back.
    if type(ring) is not list or not _LISTS.issuperset(map(type, ring)):
        return None
    return ring


def one_ring_polygons_wkb(geometries: list[Any]) -> pa.Array | None:
    """The ISO WKB of ``geometries`` as :func:`~ingest.stac._wkb.simple_wkb` writes it, built for the whole
    batch in numpy, if every one is a polygon :func:`one_ring_positions` takes; None when any is not."""
    found = one_ring_positions(geometries)
    return None if found is None else _polygon_wkb(*found)


def _polygon_wkb(xy: np.ndarray, counts: np.ndarray) -> pa.Array:
    """Binary array of one-ring polygons: ``counts`` positions each, taken in order from ``xy``."""
    lengths = 13 + 16 * counts
    ends = np.cumsum(lengths)
    starts = ends - lengths
    out = np.empty(int(ends[-1]) if len(ends) else 0, dtype=np.uint8)
    out[starts[:, None] + np.arange(9)] = _POLYGON_HEAD
    out[starts[:, None] + np.arange(9, 13)] = counts.astype("<u4").view(np.uint8).reshape(-1, 4)
    data = np.ascontiguousarray(xy, dtype="<f8").view(np.uint8).ravel()
    widths = 16 * counts
    # Each byte of the numbers goes to its polygon's start + 13 + its place within that polygon's numbers.
    shift = np.repeat(starts + 13 - (np.cumsum(widths) - widths), widths)
    out[shift + np.arange(len(data))] = data
    offsets = np.concatenate(([0], ends)).astype(np.int32)
    return pa.Array.from_buffers(pa.binary(), len(counts), [None, pa.py_buffer(offsets), pa.py_buffer(out)])


_BBOX_LISTS = pa.list_(pa.float64())


def plain_bboxes(bboxes: list[Any], bbox_type: pa.DataType) -> pa.Array | None:
    """The ``bbox_type`` struct column of ``bboxes`` if every one is a list of 4 numbers (each taken as the
    double ``float()`` makes of it, as the row-by-row path does); None when any is absent or has 6."""
    if not all(type(bbox) is list and len(bbox) == 4 for bbox in bboxes):
        return None
    try:
        values = pa.array(bboxes, _BBOX_LISTS).flatten()
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
        return None
    if values.null_count:
        return None
    sides = values.to_numpy(zero_copy_only=False).reshape(-1, 4)
    return pa.StructArray.from_arrays([pa.array(sides[:, index]) for index in range(4)], fields=list(bbox_type))
