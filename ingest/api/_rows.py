"""The rows a search reads: which rows of a snapshot's data files match a plan, the rows themselves, read on one
pool of threads, and the items they make.

The engine (``_search.py``) pages through files with these; a sorted search's pages (``_sorted.py``) use the same.
Only the row groups that may hold a match are read (their bbox statistics reach the area; for a search by ids,
those holding a row whose id the id index names), and rows of different files are read together on the engine's
one pool, never more than ``reads_at_once`` at a time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import shapely

from ingest.api._cache import FILE_INDEX, ROW_NUMBER, ColumnCache, SnapshotState
from ingest.api._ids import IdIndexes
from ingest.api._plan import RowTest, RowTests, SearchPlan, row_tests
from ingest.stac import ServedArrays, arrow_to_items, served_arrays_asset

NO_ROWS = np.empty(0, dtype=np.int64)
POSITION = (FILE_INDEX, ROW_NUMBER)
"""Columns searches add to rows read (which file, which row): never part of an item."""
_ON_POOL = threading.local()
"""``active`` on the engine's read pool's threads: their own overlapped work runs in turn, never queued behind
them (a pool waiting on itself)."""
_In = TypeVar("_In")
_Out = TypeVar("_Out")


class FileRows:
    """The rows of a snapshot's data files that searches read, through the engine's column cache and id indexes."""

    def __init__(self, columns: ColumnCache, id_indexes: IdIndexes, reads_at_once: int, arrays: ServedArrays) -> None:
        self.columns = columns
        self.id_indexes = id_indexes
        self.reads_at_once = reads_at_once
        """Files read at once (1 on a local disk, where threads would only add their cost)."""
        self.arrays = arrays
        """Where the repository's arrays are: the served ``floe:arrays`` and stack assets name it."""
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def row_tests(self, state: SnapshotState, plan: SearchPlan) -> RowTests:
        """The plan's row tests, compiled once per search at a snapshot (the next page reuses them)."""
        if not plan.fingerprint:
            return row_tests(plan, state.schema, state.arrow_schema)
        compiled: RowTests = state.compiled_for(
            plan.fingerprint, lambda: row_tests(plan, state.schema, state.arrow_schema)
        )
        return compiled

    def matching_rows(
        self,
        state: SnapshotState,
        plan: SearchPlan,
        test: RowTest,
        index: int,
        extra_columns: list[str],
        *,
        first_row: int = 0,
    ) -> pa.Table:
        """Row numbers (and ``extra_columns``) of the rows of one file that pass the Arrow filter and geometry test.

        Only the row groups that may hold a match are read: those whose bbox
        statistics reach the search area and, for a search by ids, those
        holding a row whose id the key index names (those rows alone are tested).
        """
        data_file = state.files[index]
        path = data_file.file_path
        filter_columns = test.filter_columns
        wanted = sorted(set(filter_columns) | set(extra_columns) | ({"geometry"} if test.geometries else set()))
        groups, only = self._groups_to_read(state, plan, test, index, first_row)
        table = self.columns.read(path, wanted, groups)
        if only is not None:
            # The named rows that the row groups read hold (a group the area rules out is not read).
            numbers = table.column(ROW_NUMBER).to_numpy()
            positions = np.searchsorted(numbers, only).clip(max=max(len(numbers) - 1, 0))
            held = positions[numbers[positions] == only] if len(numbers) else positions[:0]
            table = table.take(pa.array(held))
        if first_row:
            table = table.filter(pc.greater_equal(table.column(ROW_NUMBER), first_row))
        for name in extra_columns:
            if name not in table.column_names:
                table = table.append_column(name, pa.nulls(table.num_rows, state.arrow_schema.field(name).type))
        return self.passing(test, table)

    def rows_of_ids_by_file(self, state: SnapshotState, plan: SearchPlan) -> dict[int, np.ndarray]:
        """File index -> the rows whose id hash the search names (one probe of the id index, kept per search)."""
        assert plan.id_hashes is not None
        hashes = plan.id_hashes
        if not plan.fingerprint:
            return self.id_indexes.of(state).locate(hashes)
        named: dict[int, np.ndarray] = state.compiled_for(
            f"{plan.fingerprint}/ids", lambda: self.id_indexes.of(state).locate(hashes)
        )
        return named

    def rows_of_ids_in_file(self, state: SnapshotState, plan: SearchPlan, index: int) -> np.ndarray:
        """The rows of file ``index`` whose id hash the search names (none: an empty array)."""
        return self.rows_of_ids_by_file(state, plan).get(index, NO_ROWS)

    def _groups_to_read(
        self, state: SnapshotState, plan: SearchPlan, test: RowTest, index: int, first_row: int
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """The row groups of a file that may hold a match from ``first_row`` on, and the only rows to test (ids)."""
        layout = self.columns.layout(state.files[index].file_path)
        groups = np.arange(layout.num_row_groups)
        only = self.rows_of_ids_in_file(state, plan, index) if plan.id_hashes is not None else None
        if only is not None:
            groups = layout.groups_of(only)
        if test.geometries:
            groups = np.intersect1d(groups, layout.groups_reaching(test.geometries), assume_unique=True)
        if first_row:
            groups = groups[layout.starts[groups + 1] > first_row]
        return groups, only

    def matching_row_numbers(
        self, state: SnapshotState, plan: SearchPlan, test: RowTest, index: int, first_row: int
    ) -> np.ndarray:
        """The numbers of the rows of one file, from ``first_row`` on, that the test's filters let through."""
        data_file = state.files[index]
        all_rows_match = test.all_rows_match is not None and test.all_rows_match(data_file)
        if test.needs_rows_test and not all_rows_match:
            matched = self.matching_rows(state, plan, test, index, [], first_row=first_row)
            return matched.column(ROW_NUMBER).to_numpy()
        return np.arange(first_row, data_file.record_count, dtype=np.int64)

    def rows(self, path: str, rows: np.ndarray) -> pa.Table:
        """The full rows at ``rows`` (sorted row numbers) of one file: only the row groups holding them are read."""
        return self.columns.rows(path, rows)

    def rows_of_files(
        self, wanted: list[tuple[int, str, np.ndarray]], *, numbered: bool = True
    ) -> list[tuple[int, pa.Table]]:
        """(file index, its rows) for each (file index, path, sorted row numbers) of ``wanted``, in that order, the
        files read together (rows of different files are different requests: they overlap)."""

        def read(entry: tuple[int, str, np.ndarray]) -> tuple[int, pa.Table]:
            index, path, rows = entry
            return index, self.columns.rows(path, rows, numbered=numbered)

        return self.overlapped(read, wanted)

    def overlapped(self, work: Callable[[_In], _Out], entries: list[_In]) -> list[_Out]:
        """``work`` of each entry, in order, up to ``reads_at_once`` at once (their reads overlap; Arrow's and the
        store's I/O leave the GIL). One pool serves every request of the engine: no threads are started per
        search (a warm search's reads are memory reads, where starting threads would be most of its cost), and
        the reads of all requests together stay bounded. Work already on the pool runs its entries in turn."""
        if len(entries) <= 1 or self.reads_at_once <= 1 or getattr(_ON_POOL, "active", False):
            return [work(entry) for entry in entries]
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.reads_at_once, thread_name_prefix="floe-reads")
            pool = self._pool

        def on_pool(entry: _In) -> _Out:
            _ON_POOL.active = True
            return work(entry)

        return list(pool.map(on_pool, entries))

    def items(self, snapshot_id: str, table: pa.Table) -> list[dict[str, Any]]:
        """The items of ``table``'s rows, their ``floe:arrays`` and stack assets naming the arrays at
        ``snapshot_id``."""
        return [served_arrays_asset(item, self.arrays, snapshot_id) for item in arrow_to_items(table)]

    def passing(self, test: RowTest, table: pa.Table) -> pa.Table:
        """The rows of ``table`` that pass the test's Arrow filter and geometries.

        Files written before a column existed lack it: it is null there, as Iceberg reads it.
        """
        added = [name for name in test.filter_columns if name not in table.column_names]
        for name in added:
            table = table.append_column(name, pa.nulls(table.num_rows, test.filter_columns[name]))
        if test.arrow_filter is not None and table.num_rows:
            table = table.filter(test.arrow_filter)
        if test.geometries and table.num_rows:
            shapes = shapely.from_wkb(table.column("geometry").to_numpy(zero_copy_only=False))
            mask = np.ones(table.num_rows, dtype=bool)
            for geometry in test.geometries:
                mask &= shapely.intersects(shapes, geometry)
            table = table.filter(pa.array(mask))
        return table.drop_columns(added)

    def items_of(self, snapshot_id: str, tables: list[pa.Table]) -> list[dict[str, Any]]:
        """The items of ``tables`` in order, converting each run of tables with one schema at once."""
        items: list[dict[str, Any]] = []
        for table in runs_of_one_schema(tables):
            added = [name for name in POSITION if name in table.column_names]
            items.extend(self.items(snapshot_id, table.drop_columns(added)))
        return items


def runs_of_one_schema(tables: list[pa.Table]) -> Iterator[pa.Table]:
    """``tables`` in order, each run of consecutive tables with the same schema concatenated into one."""
    start = 0
    while start < len(tables):
        end = start + 1
        while end < len(tables) and tables[end].schema == tables[start].schema:
            end += 1
        # One chunk a column: Arrow's filter pays per chunk (50 rows from 48 files took 6.7 ms as 48 chunks).
        yield pa.concat_tables(tables[start:end]).combine_chunks() if end - start > 1 else tables[start]
        start = end
