"""Sorted searches (``sortby``): the matching rows' sort keys gathered file by file, the files that may hold the
best rows first, one page taken from them, and only that page's rows read as items (with the engine's
candidate files, row tests and readers).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from ingest.api._cache import FILE_INDEX, ROW_NUMBER, SnapshotState, read_windows
from ingest.api._order import SortBounds, kth_best
from ingest.api._plan import SearchPlan, residual_matches
from ingest.api._request import PageToken, SearchPage

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile

    from ingest.api._search import SearchEngine


_NOTHING = pa.table({ROW_NUMBER: pa.array([], pa.int64())})
"""A file ruled out when it came to be read: no rows."""


def sorted_page(engine: SearchEngine, state: SnapshotState, plan: SearchPlan, offset: int) -> SearchPage:
    """Sort the matching rows' keys (only the key columns are read), take one page, read just those rows."""
    need = offset + plan.limit
    collected, unread = _sort_keys(engine, state, plan, need)
    if collected is None:
        return SearchPage([], state.snapshot_id)
    order = [(f"k{n}", "descending" if key.descending else "ascending") for n, key in enumerate(plan.sortby)]
    ordered = collected.sort_by([*order, (FILE_INDEX, "ascending"), (ROW_NUMBER, "ascending")])
    page = ordered.slice(offset, plan.limit)
    found = _items_at(engine, state, page.column(FILE_INDEX).to_numpy(), page.column(ROW_NUMBER).to_numpy())
    token = None
    if need < ordered.num_rows or (unread and len(found) == plan.limit):
        token = PageToken(state.snapshot_id, offset=need, search=plan.fingerprint).encode()
    return SearchPage(found, state.snapshot_id, token)


def _sort_keys(engine: SearchEngine, state: SnapshotState, plan: SearchPlan, need: int) -> tuple[pa.Table | None, bool]:
    """The sort keys (``k0``, ``k1``, ...), file index and row number of the matching rows a sorted page needs.

    Files are read in the order of their bounds on the first sort key (the
    newest first for ``-datetime``), and reading stops once ``need`` rows
    are in hand and no unread file can hold a row that sorts before the
    ``need``-th: a newest-N search reads the newest files only. Returns the
    keys (None: no match) and whether files were left unread.
    """
    columns = [key.column for key in plan.sortby]
    tests = engine.rows.row_tests(state, plan)
    first = plan.sortby[0]
    # Ranked by bounds alone: a file's test (whose overflow it must read) is made when the file is read.
    maybe = engine.candidates.maybe_matching(state, plan, tests, 0)
    candidates = [(index, state.files[index]) for index in maybe.indexes]
    bounds = SortBounds(state.schema, first.column, first.descending)
    candidates.sort(key=lambda candidate: bounds.rank(candidate[1]))
    keys: list[pa.Table] = []
    held = 0

    def matching(candidate: tuple[int, DataFile]) -> pa.Table:
        index, data_file = candidate
        test = engine.candidates.test_of(state, plan, tests, maybe, index)
        if test is None:
            return _NOTHING
        matched = engine.rows.matching_rows(state, plan, test, index, columns)
        if test.residual is not None and matched.num_rows:
            rows = matched.column(ROW_NUMBER).to_numpy()
            items = engine.rows.items(state.snapshot_id, engine.rows.rows(data_file.file_path, rows))
            mask = [residual_matches(test.residual, item) for item in items]
            matched = matched.filter(pa.array(mask, type=pa.bool_()))
        return matched

    # Files are read in windows (their reads overlap) and used in rank order:
    # the keys are those one file at a time would gather; a window read past the stop costs its reads only.
    for window in read_windows(candidates, engine.reads_at_once):
        if held >= need and bounds.cannot_improve(window[0][1], kth_best(keys, need, first.descending)):
            return pa.concat_tables(keys, promote_options="permissive"), True
        for (index, data_file), matched in zip(window, engine.rows.overlapped(matching, window), strict=True):
            if held >= need and bounds.cannot_improve(data_file, kth_best(keys, need, first.descending)):
                return pa.concat_tables(keys, promote_options="permissive"), True
            if matched.num_rows:
                keys.append(
                    pa.table(
                        {
                            **{f"k{n}": matched.column(column) for n, column in enumerate(columns)},
                            FILE_INDEX: pa.array(np.full(matched.num_rows, index, dtype=np.int64)),
                            ROW_NUMBER: matched.column(ROW_NUMBER),
                        }
                    )
                )
                held += matched.num_rows - matched.column(columns[0]).null_count
    return (pa.concat_tables(keys, promote_options="permissive") if keys else None), False


def _items_at(engine: SearchEngine, state: SnapshotState, files: np.ndarray, rows: np.ndarray) -> list[dict[str, Any]]:
    """The items at (file index, row) positions, in the order given, reading each file once (the files together)."""
    wanted = [
        (int(index), state.files[int(index)].file_path, np.sort(rows[files == index])) for index in np.unique(files)
    ]
    by_position: dict[tuple[int, int], dict[str, Any]] = {}
    for (index, _, selected), (_, table) in zip(wanted, engine.rows.rows_of_files(wanted, numbered=False), strict=True):
        for row, item in zip(selected, engine.rows.items(state.snapshot_id, table), strict=True):
            by_position[(index, int(row))] = item
    return [by_position[(int(index), int(row))] for index, row in zip(files, rows, strict=True)]
