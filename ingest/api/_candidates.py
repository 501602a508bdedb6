"""Which data files a search reads, and the row test each needs, decided from the files' bounds first.

A snapshot's files are ruled out without reading any: by their bbox bounds
(all at once, in one numpy pass), by the key index for a search by ids, and by
their column bounds (:class:`Maybe`). Each file left gets the plan's
translated row test, except a file that keeps a filtered property in
``floe:overflow`` in some row (its value had a type conflicting with the
column): its typed column is null there, so its rows are tested without the
translated filter and matched against the whole filter instead. Which
properties a file keeps in overflow is read from the file once (files never
change) and only when the file's turn comes: a sorted search ranks its
candidates by bounds alone and reads the newest few, not every candidate's
overflow first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow.compute as pc
from pyiceberg.manifest import DataFile

from ingest.api._cache import ColumnCache, SnapshotState, read_windows
from ingest.api._plan import RowTest, RowTests, SearchPlan
from ingest.stac import OVERFLOW, overflow_keys


@dataclass(frozen=True)
class Maybe:
    """What a search's bounds say of a snapshot's files, before any is read."""

    indexes: list[int]
    """The files no bound rules out, in file order."""
    full: np.ndarray
    """Per file: the translated filter's bounds do not rule it out."""
    full_exact: bool
    """Whether ``full`` decided every file (else a file's own test may still rule it out)."""
    loose_exact: bool
    """Whether the filter-free bounds decided every file."""


class Candidates:
    """The files a search reads and their row tests (see the module); keeps each file's overflowed properties."""

    def __init__(
        self,
        columns: ColumnCache,
        overlapped: Callable[[Callable[[int], Any], list[int]], list[Any]],
        reads_at_once: int,
        named_rows: Callable[[SnapshotState, SearchPlan], dict[int, np.ndarray]],
    ) -> None:
        self.columns = columns
        self.overlapped = overlapped
        """Runs a read for each of several entries, overlapped where the store is remote (the engine's)."""
        self.reads_at_once = reads_at_once
        self.named_rows = named_rows
        """File index -> rows holding an id a search by ids names (the engine's key index)."""
        self._overflow: dict[str, frozenset[str]] = {}
        self._lock = threading.Lock()

    def of(
        self, state: SnapshotState, plan: SearchPlan, tests: RowTests, start: int = 0
    ) -> Iterator[tuple[int, DataFile, RowTest]]:
        """The data files from index ``start`` on that may hold matches, each with the test its rows need."""
        maybe = self.maybe_matching(state, plan, tests, start)
        for window in read_windows(maybe.indexes, self.reads_at_once):
            if plan.filtered_properties:
                # Which properties overflowed in each file: a column read a file, the window's read together.
                self.overlapped(lambda index: self.overflow_keys(state, state.files[index]), window)
            for index in window:
                test = self.test_of(state, plan, tests, maybe, index)
                if test is not None:
                    yield index, state.files[index], test

    def maybe_matching(self, state: SnapshotState, plan: SearchPlan, tests: RowTests, start: int) -> Maybe:
        """The files from index ``start`` on that the search's bounds do not rule out, decided without reading."""
        # Files whose bboxes cannot reach the search area go first, all at once (pyiceberg tests one at a time);
        # then the files whose column bounds rule out the filter-free test (a superset of what the full test
        # rules out: files it rules out are out either way, unread), also all at once.
        without_filter = tests.without_filter
        stats = state.file_stats()
        keep = stats.record_counts != 0
        keep[:start] = False
        if plan.geometries:
            keep &= state.file_bounds().may_reach(plan.geometries)
        if plan.id_hashes is not None:  # a search by ids: only the files holding one of them
            holding = np.zeros(len(state.files), dtype=bool)
            holding[list(self.named_rows(state, plan))] = True
            keep &= holding
        loose_exact = True
        if without_filter.bound_prune is not None:
            loose, loose_exact = stats.may_match(without_filter.bound_prune)
            keep &= loose
        full, full_exact = (
            stats.may_match(tests.translated.bound_prune) if tests.translated.bound_prune is not None else (keep, True)
        )
        return Maybe(np.flatnonzero(keep).tolist(), full, full_exact, loose_exact)

    def test_of(
        self, state: SnapshotState, plan: SearchPlan, tests: RowTests, maybe: Maybe, index: int
    ) -> RowTest | None:
        """The test the rows of file ``index`` need (None: the file's bounds rule it out after all); a file keeping
        a filtered property in floe:overflow is tested without the translated filter (its overflow is read)."""
        data_file = state.files[index]
        without_filter = tests.without_filter
        if not maybe.loose_exact and without_filter.may_match is not None and not without_filter.may_match(data_file):
            return None
        test = tests.translated
        if plan.filtered_properties and plan.filtered_properties & self.overflow_keys(state, data_file):
            return without_filter
        if not maybe.full[index] or (
            not maybe.full_exact and test.may_match is not None and not test.may_match(data_file)
        ):
            return None
        return test

    def overflow_known(self, data_file: DataFile) -> bool:
        """Whether the file's overflowed properties are known without a read."""
        with self._lock:
            return data_file.file_path in self._overflow

    def overflow_keys(self, state: SnapshotState, data_file: DataFile) -> frozenset[str]:
        """The property and top-level keys any row of a file keeps in floe:overflow (cached: files never change)."""
        path = data_file.file_path
        with self._lock:
            known = self._overflow.get(path)
        if known is not None:
            return known
        overflow_field = state.schema.find_field(OVERFLOW) if OVERFLOW in state.schema.column_names else None
        null_counts = data_file.null_value_counts or {}
        if overflow_field is None or null_counts.get(overflow_field.field_id) == data_file.record_count:
            keys: frozenset[str] = frozenset()
        else:
            found: set[str] = set()
            table = self.columns.read(path, [OVERFLOW])
            if OVERFLOW in table.column_names:
                for text in pc.unique(table.column(OVERFLOW)).to_pylist():
                    found.update(overflow_keys(text))
            keys = frozenset(found)
        with self._lock:
            self._overflow[path] = keys
        return keys

    def snapshot_overflow_keys(self, state: SnapshotState) -> frozenset[str]:
        """Every property some row of the snapshot keeps only in floe:overflow (each file's keys are cached)."""
        every = list(range(len(state.files)))
        keys: set[str] = set()
        for found in self.overlapped(lambda index: self.overflow_keys(state, state.files[index]), every):
            keys |= found
        return frozenset(keys)
