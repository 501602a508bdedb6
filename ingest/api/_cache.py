"""What searches keep between requests: decoded Parquet columns, and what each snapshot resolves to.

Both are safe to cache because what they hold never changes: a data file is
written once and never rewritten, and a snapshot id always names the same
table version. Both caches are shared by the server's request threads, so
each guards its entries with a lock; loading happens outside the lock (two
threads may load the same entry at once; either result is correct).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import Table

DEFAULT_CACHE_MB = 256
SNAPSHOT_CACHE_SIZE = 64
ROW_NUMBER = "__floe_row"
"""The column of row numbers within a data file that searches add to what they read."""


@dataclass
class _CachedFile:
    """Decoded columns of one data file (data files are immutable)."""

    names: list[str] | None = None
    num_rows: int = 0
    metadata: pq.FileMetaData | None = None
    columns: dict[str, pa.ChunkedArray] = field(default_factory=dict)
    nbytes: int = 0


class ColumnCache:
    """Decoded columns of data files, by path, least recently used dropped beyond a budget in bytes."""

    def __init__(self, io: FileIO, max_bytes: int) -> None:
        self.io = io
        self.max_bytes = max_bytes
        self._files: OrderedDict[str, _CachedFile] = OrderedDict()
        self._cached_bytes = 0
        self._lock = threading.Lock()

    @property
    def cached_bytes(self) -> int:
        """The bytes of decoded columns held now."""
        with self._lock:
            return self._cached_bytes

    def read(self, path: str, names: list[str] | None = None) -> pa.Table:
        """Columns ``names`` (None: all) of one data file; columns the file lacks are left out.

        Data files never change, so a column once decoded serves every later
        request; only the columns a request needs are read, and the least
        recently used files are dropped once the cache exceeds its budget.
        With no column wanted, the table holds just the row numbers
        (:data:`ROW_NUMBER`), so callers still see how many rows there are.
        """
        with self._lock:
            cached = self._files.get(path)
            if cached is not None:
                self._files.move_to_end(path)
        if cached is None:
            cached = _CachedFile()
        parquet = None
        if cached.names is None:
            parquet = pq.ParquetFile(self.io.new_input(path).open())
            cached.names = list(parquet.schema_arrow.names)
            cached.num_rows = parquet.metadata.num_rows
            cached.metadata = parquet.metadata
        wanted = cached.names if names is None else [name for name in names if name in cached.names]
        missing = [name for name in wanted if name not in cached.columns]
        if missing:
            if parquet is None:
                parquet = pq.ParquetFile(self.io.new_input(path).open(), metadata=cached.metadata)
            # One thread per request: the server runs requests side by side already.
            self._keep(path, cached, parquet.read(columns=missing, use_threads=False))
        if not wanted:
            return pa.table({ROW_NUMBER: pa.array(np.arange(cached.num_rows, dtype=np.int64))})
        return pa.table({name: cached.columns[name] for name in wanted})

    def _keep(self, path: str, cached: _CachedFile, table: pa.Table) -> None:
        """Add newly read columns to a file's entry, then drop least recently used files beyond the budget."""
        with self._lock:
            for name in table.column_names:
                column = table.column(name)
                if name not in cached.columns:
                    cached.columns[name] = column
                    cached.nbytes += column.nbytes
            self._files[path] = cached
            self._files.move_to_end(path)
            self._cached_bytes = sum(entry.nbytes for entry in self._files.values())
            while self._cached_bytes > self.max_bytes and len(self._files) > 1:
                _, dropped = self._files.popitem(last=False)
                self._cached_bytes -= dropped.nbytes


@dataclass
class SnapshotState:
    """Everything a snapshot resolves to that searches need (immutable, so cached)."""

    snapshot_id: str
    table: Table
    schema: Schema
    arrow_schema: pa.Schema
    files: list[DataFile]
    """Every live data file, in path order (token positions index this list)."""
    collections: dict[str, dict[str, Any]] | None = None
    """Collection documents by id, filled on first use (under ``lock``)."""
    lock: threading.Lock = field(default_factory=threading.Lock)


class SnapshotCache:
    """The states of the most recently used snapshots, loaded on first use."""

    def __init__(self, load: Callable[[str], SnapshotState], size: int = SNAPSHOT_CACHE_SIZE) -> None:
        self.load = load
        self.size = size
        self._states: OrderedDict[str, SnapshotState] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, snapshot_id: str) -> SnapshotState:
        """The state of ``snapshot_id``, loaded (outside the lock: loading reads the store) when not cached."""
        with self._lock:
            state = self._states.get(snapshot_id)
            if state is not None:
                self._states.move_to_end(snapshot_id)
                return state
        state = self.load(snapshot_id)
        with self._lock:
            self._states[snapshot_id] = state
            while len(self._states) > self.size:
                self._states.popitem(last=False)
        return state
