"""Where rows go: the order of items along a Hilbert curve of their footprints' centres.

Every data file floe writes keeps its rows in this order (then by datetime),
and compaction cuts a partition's rows, so ordered, into files: neighbours on
the ground share files and row groups, whose bbox bounds then stay small.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

HILBERT = "floe:hilbert"
"""The column holding each row's Hilbert key: the first field of the items table's sort order."""

HILBERT_ORDER = 16
"""Bits per axis of the Hilbert curve floe orders rows along (a 65,536 x 65,536 grid: about 600 m cells)."""


def hilbert_index(x: np.ndarray, y: np.ndarray, order: int = HILBERT_ORDER) -> np.ndarray:
    """The distance along a Hilbert curve of the cells (x, y) of a 2**order grid (vectorised over arrays).

    Neighbouring cells get nearby distances and, unlike a Z-order curve, the
    curve never jumps: a run of consecutive distances covers one compact area,
    so a file or row group holding a run of rows has small bounds.
    """
    x = x.astype(np.uint64)
    y = y.astype(np.uint64)
    distance = np.zeros(x.shape, dtype=np.uint64)
    side = np.uint64((1 << order) - 1)
    level = np.uint64(1 << (order - 1))
    while level > 0:
        right = (x & level) > 0
        upper = (y & level) > 0
        distance += level * level * ((np.uint64(3) * right.astype(np.uint64)) ^ upper.astype(np.uint64))
        # Rotate the quadrant so the curve inside it starts and ends where the next level expects.
        flip = ~upper & right
        x = np.where(flip, side - x, x)
        y = np.where(flip, side - y, y)
        swap = ~upper
        x, y = np.where(swap, y, x), np.where(swap, x, y)
        level >>= np.uint64(1)
    return distance


def spatial_key(bbox: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Each row's position along the Hilbert curve of its bbox centre (rows without a bbox come last)."""
    if isinstance(bbox, pa.ChunkedArray):
        bbox = bbox.combine_chunks()
    if len(bbox) == 0:
        return np.zeros(0, dtype=np.uint64)
    scale = float((1 << HILBERT_ORDER) - 1)
    xmin, ymin, xmax, ymax = (
        bbox.field(name).to_numpy(zero_copy_only=False).astype(np.float64) for name in ("xmin", "ymin", "xmax", "ymax")
    )
    x = np.clip(((xmin + xmax) / 2 + 180.0) / 360.0, 0, 1) * scale
    y = np.clip(((ymin + ymax) / 2 + 90.0) / 180.0, 0, 1) * scale
    missing = np.isnan(x) | np.isnan(y)
    if bbox.null_count:
        missing |= ~np.asarray(bbox.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    key = hilbert_index(np.nan_to_num(x).astype(np.uint64), np.nan_to_num(y).astype(np.uint64))
    key[missing] = np.iinfo(np.uint64).max
    return key


def spatial_order(bbox: pa.Array | pa.ChunkedArray, times: pa.Array | pa.ChunkedArray | None = None) -> np.ndarray:
    """Row order along the Hilbert curve of bbox centres, then by datetime, so neighbours share files and row groups."""
    return _order(spatial_key(bbox), times)


def _order(key: np.ndarray, times: pa.Array | pa.ChunkedArray | None) -> np.ndarray:
    if times is None or len(key) == 0:
        return np.argsort(key, kind="stable")
    micros = pc.fill_null(pc.cast(times, pa.int64()), np.iinfo(np.int64).max).to_numpy(zero_copy_only=False)
    return np.lexsort((micros, key))


def clustered(rows: pa.Table, *, with_key: bool = True) -> pa.Table:
    """``rows`` in the items table's sort order, (Hilbert key ascending, datetime ascending, nulls last).

    With ``with_key`` the key is stored in the :data:`HILBERT` column (added,
    or recomputed where it exists), so the order a file follows is a column
    other engines can see and the table's Iceberg sort order can name; rows
    without a bbox have a null key. Without it (a table whose schema predates
    the column) any such column is dropped.
    """
    key = spatial_key(rows.column("bbox"))
    order = _order(key, rows.column("datetime"))
    if HILBERT in rows.column_names:
        rows = rows.drop_columns([HILBERT])
    if with_key:
        missing = key == np.iinfo(np.uint64).max
        stored = pa.array(np.where(missing, 0, key).astype(np.int64), type=pa.int64(), mask=missing)
        rows = rows.append_column(HILBERT, stored)
    return rows.take(order)
