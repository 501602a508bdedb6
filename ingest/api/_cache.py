"""What searches keep between requests: decoded Parquet columns, and what each snapshot resolves to.

Both are safe to cache because what they hold never changes: a data file is
written once and never rewritten, and a snapshot id always names the same
table version. Both caches are shared by the server's request threads, so
each guards its entries with a lock; loading happens outside the lock (two
threads may load the same entry at once; either result is correct).
"""

from __future__ import annotations

import struct
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
    bounds: FileBounds | None = None
    """The files' bbox bounds as arrays, made on first use (under ``lock``)."""
    compiled: OrderedDict[str, Any] = field(default_factory=OrderedDict)
    """Row tests compiled for recent searches, by search fingerprint (under ``lock``)."""

    def file_bounds(self) -> FileBounds:
        with self.lock:
            if self.bounds is None:
                self.bounds = FileBounds.of(self.schema, self.files)
            return self.bounds

    def compiled_for(self, fingerprint: str, compile_tests: Callable[[], Any]) -> Any:
        """What ``compile_tests`` makes for a search, kept for the next page and the next identical search."""
        with self.lock:
            found = self.compiled.get(fingerprint)
            if found is not None:
                self.compiled.move_to_end(fingerprint)
                return found
        made = compile_tests()
        with self.lock:
            self.compiled[fingerprint] = made
            while len(self.compiled) > COMPILED_SEARCHES:
                self.compiled.popitem(last=False)
        return made


COMPILED_SEARCHES = 64
"""Searches whose compiled row tests a snapshot keeps (binding expressions costs milliseconds a request)."""


_BBOX_COLUMNS = ("bbox.xmin", "bbox.ymin", "bbox.xmax", "bbox.ymax")


@dataclass(frozen=True)
class FileBounds:
    """Each data file's bounds on the bbox columns, as arrays: which files a search area can touch, at once.

    pyiceberg evaluates column bounds file by file in Python (about 0.1 ms a
    file); an area search over thousands of files first drops, in one numpy
    pass, the files whose bboxes cannot reach it. A bound a file does not
    record is taken as unbounded (the file stays).
    """

    xmin_low: np.ndarray
    xmin_high: np.ndarray
    xmax_low: np.ndarray
    xmax_high: np.ndarray
    ymin_low: np.ndarray
    ymax_high: np.ndarray

    @classmethod
    def of(cls, schema: Schema, files: list[DataFile]) -> FileBounds:
        ids: dict[str, int | None] = {}
        for name in _BBOX_COLUMNS:
            try:
                ids[name] = schema.find_field(name).field_id
            except ValueError:
                ids[name] = None

        def column(name: str, upper: bool) -> np.ndarray:
            field_id = ids[name]
            values = np.full(len(files), np.inf if upper else -np.inf)
            if field_id is None:
                return values
            for index, data_file in enumerate(files):
                raw = (data_file.upper_bounds if upper else data_file.lower_bounds) or {}
                found = raw.get(field_id)
                if found is not None and len(found) == 8:
                    values[index] = struct.unpack("<d", found)[0]
            return values

        return cls(
            xmin_low=column("bbox.xmin", upper=False),
            xmin_high=column("bbox.xmin", upper=True),
            xmax_low=column("bbox.xmax", upper=False),
            xmax_high=column("bbox.xmax", upper=True),
            ymin_low=column("bbox.ymin", upper=False),
            ymax_high=column("bbox.ymax", upper=True),
        )

    def may_reach(self, geometries: tuple[Any, ...]) -> np.ndarray:
        """True for each file whose rows' bboxes may overlap every geometry's bounds (antimeridian boxes too)."""
        keep = np.ones(len(self.xmin_low), dtype=bool)
        for geometry in geometries:
            parts = list(geometry.geoms) if hasattr(geometry, "geoms") else [geometry]
            reach = np.zeros_like(keep)
            for part in parts:
                qxmin, qymin, qxmax, qymax = (float(value) for value in part.bounds)
                plain = (self.xmin_low <= qxmax) & (self.xmax_high >= qxmin)
                # Rows crossing the antimeridian have xmin > 0 > xmax and cover [xmin, 180] and [-180, xmax].
                crossing = (
                    (self.xmin_high > 0) & (self.xmax_low < 0) & ((self.xmin_low <= qxmax) | (self.xmax_high >= qxmin))
                )
                latitude = (self.ymin_low <= qymax) & (self.ymax_high >= qymin)
                reach |= (plain | crossing) & latitude
            keep &= reach
        return keep


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
