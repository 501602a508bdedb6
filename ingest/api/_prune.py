"""Which data files a search may need, decided for all files of a snapshot at once from their column bounds.

pyiceberg tests one data file at a time in Python (its inclusive metrics
evaluator, about 20 µs a predicate a file); a ten-million-item table has a
thousand files or more, so a search spent tens of milliseconds deciding what
not to read. Here each file's bounds, null and NaN counts of a column are
decoded once per snapshot into arrays, and a bound expression is evaluated
over all files in a few numpy operations, with the evaluator's semantics
(``_InclusiveMetricsEvaluationVisitor``, pyiceberg/expressions/visitors.py):
a file is ruled out only when its metrics prove no row can match.

Predicates on types kept as arrays (integers, timestamps, dates, floats,
strings, booleans) are decided here; any other predicate keeps every file and
marks the answer inexact, so the caller asks pyiceberg for the survivors.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from pyiceberg.conversions import from_bytes
from pyiceberg.expressions import (
    AlwaysFalse,
    AlwaysTrue,
    And,
    BooleanExpression,
    BoundEqualTo,
    BoundGreaterThan,
    BoundGreaterThanOrEqual,
    BoundIn,
    BoundIsNull,
    BoundLessThan,
    BoundLessThanOrEqual,
    BoundNotEqualTo,
    BoundNotIn,
    BoundNotNull,
    BoundPredicate,
    Or,
)
from pyiceberg.manifest import DataFile
from pyiceberg.types import (
    BooleanType,
    DateType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    PrimitiveType,
    StringType,
    TimestampType,
    TimestamptzType,
    TimeType,
)

IN_LIMIT = 200
"""Above this many values an IN keeps every file (pyiceberg's IN_PREDICATE_LIMIT, the same rule)."""

_COMPARISONS = (BoundLessThan, BoundLessThanOrEqual, BoundGreaterThan, BoundGreaterThanOrEqual, BoundEqualTo)
_INTEGERS = (IntegerType, LongType, TimestampType, TimestamptzType, DateType, TimeType, BooleanType)
_FLOATS = (FloatType, DoubleType)


@dataclass(frozen=True)
class _Column:
    """One column's metrics over every file: bounds (with presence masks) and what its counts prove."""

    lower: np.ndarray
    has_lower: np.ndarray
    upper: np.ndarray
    has_upper: np.ndarray
    nan_bound: np.ndarray
    """A bound is NaN: pyiceberg takes the bounds as unreliable (the file may match)."""
    nulls_only: np.ndarray
    nans_only: np.ndarray
    no_nulls: np.ndarray
    """The file records a null count of 0."""


def _dtype(field_type: IcebergType) -> Any:
    if isinstance(field_type, _INTEGERS):
        return np.int64
    if isinstance(field_type, _FLOATS):
        return np.float64
    if isinstance(field_type, StringType):
        return object
    return None


class FileStats:
    """The column metrics of a snapshot's data files, as arrays, decoded per column on first use."""

    def __init__(self, files: list[DataFile]) -> None:
        self.files = files
        self.record_counts = np.array([data_file.record_count for data_file in files], dtype=np.int64)
        self._columns: dict[int, _Column | None] = {}
        self._lock = threading.Lock()

    def column(self, field_id: int, field_type: IcebergType) -> _Column | None:
        """The metrics of one column (None: a type not kept as an array)."""
        with self._lock:
            if field_id in self._columns:
                return self._columns[field_id]
        made = self._decode(field_id, field_type)
        with self._lock:
            self._columns[field_id] = made
        return made

    def _decode(self, field_id: int, field_type: IcebergType) -> _Column | None:
        dtype = _dtype(field_type)
        if dtype is None or not isinstance(field_type, PrimitiveType):
            return None
        count = len(self.files)
        lower = np.zeros(count, dtype=dtype)
        upper = np.zeros(count, dtype=dtype)
        has_lower = np.zeros(count, dtype=bool)
        has_upper = np.zeros(count, dtype=bool)
        nan_bound = np.zeros(count, dtype=bool)
        nulls_only = np.zeros(count, dtype=bool)
        nans_only = np.zeros(count, dtype=bool)
        no_nulls = np.zeros(count, dtype=bool)
        for index, data_file in enumerate(self.files):
            for bounds, values, present in (
                (data_file.lower_bounds, lower, has_lower),
                (data_file.upper_bounds, upper, has_upper),
            ):
                raw = (bounds or {}).get(field_id)
                if raw is None:
                    continue
                value = from_bytes(field_type, raw)
                if isinstance(value, float) and math.isnan(value):
                    nan_bound[index] = True
                    continue
                values[index] = int(value) if dtype is np.int64 else value
                present[index] = True
            value_count = (data_file.value_counts or {}).get(field_id)
            null_count = (data_file.null_value_counts or {}).get(field_id)
            nan_count = (data_file.nan_value_counts or {}).get(field_id)
            nulls_only[index] = bool(value_count) and bool(null_count) and value_count == null_count
            nans_only[index] = bool(nan_count) and bool(value_count) and nan_count == value_count
            no_nulls[index] = null_count == 0
        return _Column(lower, has_lower, upper, has_upper, nan_bound, nulls_only, nans_only, no_nulls)

    def may_match(self, bound: BooleanExpression) -> tuple[np.ndarray, bool]:
        """For each file, whether rows may match ``bound`` (bound, NOT rewritten away); and whether that is exact.

        Exact means every predicate was decided here as pyiceberg would; when
        not, the files kept must still be tested one by one.
        """
        evaluation = _Evaluation(self)
        keep = evaluation.visit(bound)
        keep &= self.record_counts != 0
        keep |= self.record_counts < 0
        return keep, evaluation.exact


class _Evaluation:
    def __init__(self, stats: FileStats) -> None:
        self.stats = stats
        self.count = len(stats.files)
        self.exact = True

    def _all(self, value: bool) -> np.ndarray:
        return np.full(self.count, value, dtype=bool)

    def _undecided(self) -> np.ndarray:
        self.exact = False
        return self._all(True)

    def visit(self, expression: BooleanExpression) -> np.ndarray:
        if isinstance(expression, AlwaysTrue):
            return self._all(True)
        if isinstance(expression, AlwaysFalse):
            return self._all(False)
        if isinstance(expression, And):
            return self.visit(expression.left) & self.visit(expression.right)
        if isinstance(expression, Or):
            return self.visit(expression.left) | self.visit(expression.right)
        if isinstance(expression, BoundPredicate):
            return self._predicate(expression)
        return self._undecided()

    def _predicate(self, predicate: BoundPredicate) -> np.ndarray:
        field = predicate.term.ref().field
        if isinstance(predicate, BoundNotEqualTo | BoundNotIn):
            return self._all(True)
        column = self.stats.column(field.field_id, field.field_type)
        if column is None:
            return self._undecided()
        if isinstance(predicate, BoundIsNull):
            return ~column.no_nulls
        if isinstance(predicate, BoundNotNull):
            return ~column.nulls_only
        # Every comparison below: a column of nulls (or NaNs) only cannot match; a NaN bound may.
        empty = column.nulls_only | column.nans_only
        if isinstance(predicate, BoundIn):
            values = [literal.value for literal in predicate.literals]
            if len(values) > IN_LIMIT:
                return ~empty
            return ~empty & (column.nan_bound | self._any_within(column, values))
        if not isinstance(predicate, _COMPARISONS):
            return self._undecided()
        try:
            ruled_out = _ruled_out(predicate, column)
        except (TypeError, OverflowError):
            return self._undecided()
        return ~empty & (column.nan_bound | ~ruled_out)

    def _any_within(self, column: _Column, values: list[Any]) -> np.ndarray:
        """Whether some value lies within each file's bounds (a missing bound does not limit)."""
        if not values:
            return self._all(False)
        try:
            ordered = np.array(sorted(values), dtype=column.lower.dtype)
            # The first value at or above each file's lower bound (the first value when there is none) ...
            first = np.zeros(self.count, dtype=np.int64)
            present = np.flatnonzero(column.has_lower)
            first[present] = np.searchsorted(ordered, column.lower[present], side="left")
            inside = first < len(ordered)
            candidate = ordered[np.minimum(first, len(ordered) - 1)]
            # ... must not be above its upper bound.
            bounded = np.flatnonzero(column.has_upper)
            above = np.zeros(self.count, dtype=bool)
            above[bounded] = candidate[bounded] > column.upper[bounded]
        except (TypeError, OverflowError, ValueError):
            return self._undecided()
        return inside & ~above


def _ruled_out(predicate: BoundPredicate, column: _Column) -> np.ndarray:
    """Files whose bounds prove no row passes a comparison."""
    value = predicate.literal.value
    if isinstance(predicate, BoundLessThan):
        return _where(column.has_lower, column.lower, lambda bound: bound >= value)
    if isinstance(predicate, BoundLessThanOrEqual):
        return _where(column.has_lower, column.lower, lambda bound: bound > value)
    if isinstance(predicate, BoundGreaterThan):
        return _where(column.has_upper, column.upper, lambda bound: bound <= value)
    if isinstance(predicate, BoundGreaterThanOrEqual):
        return _where(column.has_upper, column.upper, lambda bound: bound < value)
    below = _where(column.has_lower, column.lower, lambda bound: bound > value)
    return below | _where(column.has_upper, column.upper, lambda bound: bound < value)


def _where(present: np.ndarray, bounds: np.ndarray, test: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """``test`` of each recorded bound; False where a file records none (placeholders are never compared)."""
    result = np.zeros(len(present), dtype=bool)
    index = np.flatnonzero(present)
    result[index] = test(bounds[index])
    return result
