"""What a sorted search knows before reading a file: the bounds of its first sort key, from the column metrics.

A search sorted by a column with metrics (``datetime``, ``id``, ``collection``)
reads files in the order of those bounds (the file that may hold the newest
row first, for ``-datetime``) and stops once it holds a page's worth of rows
and no unread file can hold a row that sorts before the last of them
(:meth:`SortBounds.cannot_improve`). Nulls sort after every value, as Arrow
sorts them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.conversions import from_bytes
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    StringType,
    TimestampType,
    TimestamptzType,
)


class SortBounds:
    """A data file's bounds on one sort column (from the table's column metrics), as values rows compare with."""

    def __init__(self, schema: Schema, column: str, descending: bool) -> None:
        self.descending = descending
        found = schema.find_field(column) if column in schema.column_names else None
        field_type = found.field_type if found is not None else None
        self.field_id = found.field_id if found is not None else None
        self.field_type = field_type if isinstance(field_type, _BOUNDED_TYPES) else None

    def best(self, data_file: DataFile) -> Any | None:
        """The best value (the largest when descending) any row of the file can have; None when unknown."""
        if self.field_type is None or self.field_id is None:
            return None
        recorded = (data_file.upper_bounds if self.descending else data_file.lower_bounds) or {}
        raw = recorded.get(self.field_id)
        return from_bytes(self.field_type, raw) if raw is not None else None

    def all_null(self, data_file: DataFile) -> bool:
        counts = data_file.null_value_counts or {}
        return self.field_id is not None and counts.get(self.field_id) == data_file.record_count

    def rank(self, data_file: DataFile) -> tuple[int, Any]:
        """Files without known bounds first (they must be read), then by best value, files of nulls only last."""
        if self.all_null(data_file):
            return (2, 0)
        best = self.best(data_file)
        if best is None:
            return (0, 0)
        return (1, _Reversed(best) if self.descending else best)

    def cannot_improve(self, data_file: DataFile, kth: Any | None) -> bool:
        """Whether no row of the file sorts before (or ties with) ``kth``, the worst value a page still needs."""
        if kth is None:
            return False
        if self.all_null(data_file):
            return True  # nulls sort after every value
        best = self.best(data_file)
        if best is None:
            return False
        return best < kth if self.descending else best > kth


_BOUNDED_TYPES = (TimestampType, TimestamptzType, LongType, IntegerType, DoubleType, FloatType, StringType)


@dataclass(frozen=True)
class _Reversed:
    """Orders values backwards (sorting files by their upper bounds, largest first)."""

    value: Any

    def __lt__(self, other: _Reversed) -> bool:
        return bool(self.value > other.value)


def kth_best(keys: list[pa.Table], k: int, descending: bool) -> Any | None:
    """The ``k``-th best non-null first sort key held so far, as the metrics' values (timestamps as µs)."""
    values = pc.drop_null(pa.chunked_array([table.column("k0") for table in keys]).combine_chunks())
    if len(values) < k:
        return None
    if pa.types.is_timestamp(values.type):
        values = values.cast(pa.int64())
    best = pc.select_k_unstable(values, k, sort_keys=[("dummy", "descending" if descending else "ascending")])
    return values[best[k - 1].as_py()].as_py()
