"""What searches keep between requests: decoded Parquet columns, and what each snapshot resolves to.

Both are safe to cache because what they hold never changes: a data file is
written once and never rewritten, and a snapshot id always names the same
table version. Columns are kept by data file, not by snapshot, so a new
commit on a branch costs a server only the files that commit added (the
manifests' side of that: ``_manifests.py``). Both caches are shared by the
server's request threads, so each guards its entries with a lock; loading
happens outside the lock (two threads may load the same entry at once; either
result is correct).
"""

from __future__ import annotations

import itertools
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from ingest.api._prune import FileStats
from ingest.api._turns import pace
from ingest.repository import READS_AT_ONCE, data_fragment

DEFAULT_CACHE_MB = 256
SNAPSHOT_CACHE_SIZE = 64
ROW_NUMBER = "__floe_row"
"""The column of row numbers within a data file that searches add to what they read."""
FILE_INDEX = "__floe_file"
"""The column of data-file indexes (in a snapshot's list of files) that searches add to rows they gather."""


@dataclass
class FileLayout:
    """What a data file's footer says that reads need: its columns, its row groups, their bbox bounds."""

    schema: pa.Schema
    names: list[str]
    metadata: pq.FileMetaData
    starts: np.ndarray
    """The first row of each row group, then the number of rows."""
    fragment: ds.ParquetFileFragment
    """The file, its footer read: reads of its row groups start with their bytes."""
    _bounds: BoxBounds | None = None

    @classmethod
    def of(cls, fragment: ds.ParquetFileFragment) -> FileLayout:
        fragment.ensure_complete_metadata()
        metadata = fragment.metadata
        sizes = [metadata.row_group(index).num_rows for index in range(metadata.num_row_groups)]
        schema = fragment.physical_schema
        starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        return cls(schema, list(schema.names), metadata, starts, fragment)

    @property
    def num_rows(self) -> int:
        return int(self.starts[-1])

    @property
    def num_row_groups(self) -> int:
        return len(self.starts) - 1

    def groups_of(self, rows: np.ndarray) -> np.ndarray:
        """The row groups holding ``rows`` (row numbers), sorted, each once."""
        return np.unique(np.searchsorted(self.starts, rows, side="right") - 1)

    def groups_reaching(self, geometries: tuple[Any, ...]) -> np.ndarray:
        """The row groups whose bbox statistics may overlap every geometry's bounds (all when not recorded)."""
        if self._bounds is None:
            self._bounds = BoxBounds.of_row_groups(self.metadata)
        return np.flatnonzero(self._bounds.may_reach(geometries))


@dataclass
class _Piece:
    """Decoded columns of one row group of one data file (data files are immutable)."""

    columns: dict[str, pa.ChunkedArray] = field(default_factory=dict)
    nbytes: int = 0


LAYOUTS_KEPT = 8192
"""Footers kept (a compacted file's is about 24 KB): enough for every file of a ten-million-item table."""
SIZES_KEPT = 8 * LAYOUTS_KEPT
"""Data-file sizes kept (a path and a number each), learned from the snapshots searched."""


def read_windows[T](candidates: Iterable[T], most: int = READS_AT_ONCE) -> Iterator[list[T]]:
    """``candidates`` in windows of 2, then twice as many each time up to ``most``: the files of a window are read
    together, and a search that stops early has read few more than it used. ``most`` 1: one at a time."""
    iterator = iter(candidates)
    size = min(2, most)
    while window := list(itertools.islice(iterator, size)):
        yield window
        pace(len(window))  # a search that has become long waits here for its turn (_turns.py)
        size = min(2 * size, most)


class ColumnCache:
    """Decoded columns of data files' row groups, least recently used dropped beyond a budget in bytes."""

    def __init__(self, io: FileIO, max_bytes: int) -> None:
        self.io = io
        self.max_bytes = max_bytes
        self._layouts: OrderedDict[str, FileLayout] = OrderedDict()
        self._sizes: OrderedDict[str, int] = OrderedDict()
        self._pieces: OrderedDict[tuple[str, int], _Piece] = OrderedDict()
        self._cached_bytes = 0
        self._held: OrderedDict[str, int] = OrderedDict()
        """Files whose layout holds their bytes (read whole), oldest first, and their sizes."""
        self._held_bytes = 0
        self._lock = threading.Lock()

    @property
    def cached_bytes(self) -> int:
        """The bytes of decoded columns held now."""
        with self._lock:
            return self._cached_bytes

    def know(self, files: Sequence[DataFile]) -> None:
        """Learn the sizes of ``files`` (their manifests record them), so that reading one asks the store no
        size first (see ``ingest.repository.data_fragment``)."""
        with self._lock:
            for data_file in files:
                self._sizes[data_file.file_path] = data_file.file_size_in_bytes
                self._sizes.move_to_end(data_file.file_path)
            while len(self._sizes) > SIZES_KEPT:
                self._sizes.popitem(last=False)

    def prefetch(self, paths: Sequence[str]) -> None:
        """Read the footers of those of ``paths`` not read yet, ``READS_AT_ONCE`` at a time (a search about to
        read them one after another would otherwise wait a round trip for each)."""
        with self._lock:
            missing = [path for path in dict.fromkeys(paths) if path not in self._layouts]
        if len(missing) > 1:
            with ThreadPoolExecutor(min(READS_AT_ONCE, len(missing)), thread_name_prefix="floe-footers") as pool:
                list(pool.map(self.layout, missing))

    def layout(self, path: str) -> FileLayout:
        """A data file's columns and row groups (its footer, read once)."""
        with self._lock:
            known = self._layouts.get(path)
            if known is not None:
                self._layouts.move_to_end(path)
                if path in self._held:
                    self._held.move_to_end(path)
                return known
            size = self._sizes.get(path)
        if size is None:
            size = len(self.io.new_input(path))  # a file of no known snapshot: ask the store
        made = FileLayout.of(data_fragment(self.io, path, size))
        with self._lock:
            self._layouts[path] = made
            self._held_bytes -= self._held.pop(path, 0)  # another thread read it too: counted once
            if made.fragment.buffer is not None:
                # A small file on object storage, read whole: its bytes stay with its footer, within a share of
                # the budget (the oldest such files are dropped, read again in one GET when next needed).
                self._held[path] = made.fragment.buffer.size
                self._held_bytes += made.fragment.buffer.size
            while len(self._layouts) > LAYOUTS_KEPT or (self._held_bytes > self.max_bytes // 4 and self._held):
                dropped = next(iter(self._held)) if self._held_bytes > self.max_bytes // 4 else None
                if dropped is not None:
                    del self._layouts[dropped]
                else:
                    dropped, _ = self._layouts.popitem(last=False)
                self._held_bytes -= self._held.pop(dropped, 0)
        return made

    def read(self, path: str, names: list[str] | None = None, row_groups: np.ndarray | None = None) -> pa.Table:
        """Columns ``names`` (None: all) of the row groups ``row_groups`` (None: all) of one data file.

        The table also holds each row's number within the file
        (:data:`ROW_NUMBER`); columns the file lacks are left out. Data files
        never change, so a row group's column once decoded serves every later
        request; only the columns and row groups a request needs are read, and
        the least recently used row groups are dropped beyond the budget.
        """
        layout = self.layout(path)
        groups = range(layout.num_row_groups) if row_groups is None else [int(group) for group in row_groups]
        wanted = layout.names if names is None else [name for name in names if name in layout.names]
        pieces = self._pieces_of(path, groups)
        missing = [position for position, piece in enumerate(pieces) if any(name not in piece for name in wanted)]
        if missing:
            missing_names = [name for name in wanted if any(name not in pieces[position] for position in missing)]
            # One thread per request: the server runs requests side by side already. Groups are in ascending order.
            part = layout.fragment.subset(row_group_ids=[groups[p] for p in missing])
            table = part.to_table(columns=missing_names, use_threads=False)
            offset = 0
            for position in missing:
                group = groups[position]
                size = int(layout.starts[group + 1] - layout.starts[group])
                # What this read saw cached stays in its answer even if another thread dropped the entry since.
                pieces[position] = {**pieces[position], **self._keep((path, group), table.slice(offset, size))}
                offset += size
        if pieces:
            columns = {
                name: pa.chunked_array(
                    [chunk for piece in pieces for chunk in piece[name].chunks], type=pieces[0][name].type
                )
                for name in wanted
            }
        else:
            empty = layout.schema.empty_table()
            columns = {name: empty.column(name) for name in wanted}
        numbers = [np.arange(layout.starts[group], layout.starts[group + 1], dtype=np.int64) for group in groups]
        columns[ROW_NUMBER] = pa.chunked_array(
            [pa.array(np.concatenate(numbers) if numbers else np.empty(0, dtype=np.int64))]
        )
        return pa.table(columns)

    def whole_column(self, path: str, name: str) -> pa.ChunkedArray:
        """Column ``name`` of every row of a file, not kept (an index made from it is): the footer is shared."""
        return self.layout(path).fragment.to_table(columns=[name], use_threads=False).column(name)

    def rows(self, path: str, rows: np.ndarray, *, numbered: bool = False) -> pa.Table:
        """Every column of the rows numbered ``rows`` (sorted) of one file: only their row groups are read.

        With ``numbered``, the table keeps :data:`ROW_NUMBER`.
        """
        layout = self.layout(path)
        if len(rows) == layout.num_rows:
            table = self.read(path)
        else:
            table = self.read(path, row_groups=layout.groups_of(rows))
            table = table.take(pa.array(np.searchsorted(table.column(ROW_NUMBER).to_numpy(), rows)))
        return table if numbered else table.drop_columns([ROW_NUMBER])

    def _pieces_of(self, path: str, groups: Sequence[int]) -> list[dict[str, pa.ChunkedArray]]:
        """The columns cached for each of ``groups`` (empty for a group not cached), marked recently used."""
        found: list[dict[str, pa.ChunkedArray]] = []
        with self._lock:
            for group in groups:
                piece = self._pieces.get((path, group))
                if piece is None:
                    found.append({})
                else:
                    self._pieces.move_to_end((path, group))
                    found.append(dict(piece.columns))
        return found

    def _keep(self, key: tuple[str, int], table: pa.Table) -> dict[str, pa.ChunkedArray]:
        """Add newly read columns to a row group's entry, then drop least recently used entries beyond the budget."""
        with self._lock:
            piece = self._pieces.get(key) or _Piece()
            for name in table.column_names:
                if name not in piece.columns:
                    column = table.column(name)
                    piece.columns[name] = column
                    piece.nbytes += column.nbytes
                    self._cached_bytes += column.nbytes
            if key in self._pieces:
                self._pieces.move_to_end(key)
            else:
                self._pieces[key] = piece
            while self._cached_bytes > self.max_bytes and len(self._pieces) > 1:
                _, dropped = self._pieces.popitem(last=False)
                self._cached_bytes -= dropped.nbytes
            return dict(piece.columns)


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
    stacked: frozenset[str] = frozenset()
    """The collections with stacks (arrays), filled with ``collections``."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    bounds: BoxBounds | None = None
    """The files' bbox bounds as arrays, made on first use (under ``lock``)."""
    stats: FileStats | None = None
    """The files' column metrics as arrays, made on first use (under ``lock``)."""
    compiled: OrderedDict[str, Any] = field(default_factory=OrderedDict)
    """Row tests compiled for recent searches, by search fingerprint (under ``lock``)."""

    def file_bounds(self) -> BoxBounds:
        with self.lock:
            if self.bounds is None:
                self.bounds = BoxBounds.of_files(self.schema, self.files)
            return self.bounds

    def file_stats(self) -> FileStats:
        with self.lock:
            if self.stats is None:
                self.stats = FileStats(self.files)
            return self.stats

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
class BoxBounds:
    """Bounds on the bbox columns of each of several data files (or row groups), as arrays.

    A search area is tested against all of them in one numpy pass. pyiceberg
    evaluates column bounds file by file in Python (about 0.1 ms a file), and
    nothing reads Parquet row-group statistics for nested columns. A bound not
    recorded is taken as unbounded (the file or row group stays).
    """

    xmin_low: np.ndarray
    xmin_high: np.ndarray
    xmax_low: np.ndarray
    xmax_high: np.ndarray
    ymin_low: np.ndarray
    ymax_high: np.ndarray

    @classmethod
    def of_files(cls, schema: Schema, files: list[DataFile]) -> BoxBounds:
        """From the files' Iceberg column bounds."""
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

        return cls._of(column)

    @classmethod
    def of_row_groups(cls, metadata: pq.FileMetaData) -> BoxBounds:
        """From a Parquet file's row-group statistics."""
        count = metadata.num_row_groups
        positions: dict[str, int] = {}
        if count:
            first = metadata.row_group(0)
            positions = {first.column(index).path_in_schema: index for index in range(first.num_columns)}

        def column(name: str, upper: bool) -> np.ndarray:
            values = np.full(count, np.inf if upper else -np.inf)
            position = positions.get(name)
            if position is None:
                return values
            for group in range(count):
                statistics = metadata.row_group(group).column(position).statistics
                if statistics is not None and statistics.has_min_max:
                    bound = statistics.max if upper else statistics.min
                    if isinstance(bound, float) and not np.isnan(bound):
                        values[group] = bound
            return values

        return cls._of(column)

    @classmethod
    def _of(cls, column: Callable[[str, bool], np.ndarray]) -> BoxBounds:
        return cls(
            xmin_low=column("bbox.xmin", False),
            xmin_high=column("bbox.xmin", True),
            xmax_low=column("bbox.xmax", False),
            xmax_high=column("bbox.xmax", True),
            ymin_low=column("bbox.ymin", False),
            ymax_high=column("bbox.ymax", True),
        )

    def may_reach(self, geometries: tuple[Any, ...]) -> np.ndarray:
        """True for each file (row group) whose rows' bboxes may overlap every geometry's bounds.

        Antimeridian boxes too.
        """
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


class Recent[V]:
    """Values by key, the most recently used ``size`` kept; a missing one is made on first use."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._values: OrderedDict[str, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str, make: Callable[[], V]) -> V:
        """The value of ``key``, made by ``make`` (outside the lock: making one reads the store) when not kept."""
        with self._lock:
            if key in self._values:
                self._values.move_to_end(key)
                return self._values[key]
        value = make()
        with self._lock:
            self._values[key] = value
            while len(self._values) > self.size:
                self._values.popitem(last=False)
        return value


class SnapshotCache:
    """The states of the most recently used snapshots, loaded on first use."""

    def __init__(self, load: Callable[[str], SnapshotState], size: int = SNAPSHOT_CACHE_SIZE) -> None:
        self.load = load
        self._states: Recent[SnapshotState] = Recent(size)

    def get(self, snapshot_id: str) -> SnapshotState:
        """The state of ``snapshot_id``, loaded (outside the lock: loading reads the store) when not cached."""
        return self._states.get(snapshot_id, lambda: self.load(snapshot_id))
