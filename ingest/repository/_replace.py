"""Replacing rows: find where items live, rewrite those files without them (copy-on-write).

Replacement is planned against one table version and re-planned against the
next when a commit loses its race. Data files never change once written, so a
planned rewrite stays right as long as the file it rewrites is still live; a
re-plan only drops rewrites of files the winner removed and searches the files
the winner added (which may hold the winner's version of the same item).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata

from ingest.repository._append import ManifestCache
from ingest.repository._files import StagedFile, data_file_path, run_of, stage
from ingest.repository._read import data_fragment

Key = tuple[str, str]


def candidate_files(cache: ManifestCache, metadata: TableMetadata, keys: Iterable[Key]) -> list[DataFile]:
    """The live files of ``metadata``'s current snapshot that may hold any of ``keys``.

    Prunes by the collection partition and by each file's id bounds. (Binding
    an Iceberg ``In`` of thousands of ids costs seconds; bisecting sorted ids
    against each file's bounds costs microseconds.)
    """
    by_collection: dict[str, list[str]] = {}
    for collection, item_id in keys:
        by_collection.setdefault(collection, []).append(item_id)
    for ids in by_collection.values():
        ids.sort()
    id_field = metadata.schema().find_field("id").field_id
    candidates = []
    for data_file in cache.live_files(metadata).values():
        wanted = by_collection.get(data_file.partition[0])
        if not wanted:
            continue
        lower = (data_file.lower_bounds or {}).get(id_field)
        upper = (data_file.upper_bounds or {}).get(id_field)
        if lower is not None and upper is not None:
            low, high = lower.decode("utf-8", "replace"), upper.decode("utf-8", "replace")
            first = bisect.bisect_left(wanted, low)
            if first == len(wanted) or wanted[first] > high:
                continue
        candidates.append(data_file)
    return candidates


def locate(cache: ManifestCache, files: Iterable[DataFile], keys: set[Key]) -> dict[str, tuple[DataFile, set[Key]]]:
    """Path -> (file, the keys it holds) for the files that hold any of ``keys``.

    The repository's key index rules out, in memory, the files that hold none
    of them; only the rest are read, to confirm which keys they hold.
    """
    files = list(files)
    if not files:
        return {}  # the usual case of a new batch, whose id bounds ruled out every file: nothing to go over per key
    collections = {collection for collection, _ in keys}
    io = cache.io
    found: dict[str, tuple[DataFile, set[Key]]] = {}
    files = [data_file for data_file in files if data_file.partition[0] in collections]
    for data_file in cache.keys.holding(files, {item_id for _, item_id in keys}):
        fragment = data_fragment(io, data_file.file_path, data_file.file_size_in_bytes)  # opened by its size
        columns = fragment.to_table(columns=["collection", "id"], use_threads=False)
        held = set(zip(columns.column("collection").to_pylist(), columns.column("id").to_pylist(), strict=True))
        hits = held & keys
        if hits:
            found[data_file.file_path] = (data_file, hits)
    return found


def key_mask(table: pa.Table, keys: set[Key]) -> pa.ChunkedArray | pa.Array:
    """True for the rows of ``table`` whose (collection, id) is in ``keys``."""
    mask: pa.ChunkedArray | pa.Array = pa.array([False] * table.num_rows, pa.bool_())
    for collection in sorted({collection for collection, _ in keys}):
        ids = pa.array(sorted(item_id for c, item_id in keys if c == collection), pa.string())
        match = pc.and_(pc.equal(table.column("collection"), collection), pc.is_in(table.column("id"), ids))
        mask = pc.or_(mask, pc.fill_null(match, False))
    return mask


def read_rows(io: FileIO, data_file: DataFile, keys: set[Key]) -> pa.Table:
    """The rows of ``keys`` in one data file, all columns."""
    with io.new_input(data_file.file_path).open() as stream:
        table = pq.ParquetFile(stream).read()
    return table.filter(key_mask(table, keys))


def rewrite_without(io: FileIO, table_location: str, data_file: DataFile, keys: set[Key]) -> StagedFile | None:
    """Write a copy of ``data_file`` without the rows of ``keys``; None when no row is left.

    The copy keeps the file's schema and its GeoParquet footers, so it is
    registered exactly like the original.
    """
    with io.new_input(data_file.file_path).open() as stream:
        table = pq.ParquetFile(stream).read()
    kept = table.filter(pc.invert(key_mask(table, keys)))
    if kept.num_rows == 0:
        return None
    partition = data_file.partition
    # The copy stays in the compaction run of the original (if any): its rows keep their place on the curve.
    path = data_file_path(table_location, partition[0], partition[1], run_of(data_file.file_path))
    return stage(io, path, kept.replace_schema_metadata(None), (partition[0], partition[1]))


@dataclass(frozen=True)
class Located:
    """Where some keys were found in one table version."""

    metadata_location: str
    searched: frozenset[Key]
    found: dict[str, tuple[DataFile, set[Key]]]


def find(cache: ManifestCache, table: Table, keys: Iterable[Key]) -> Located:
    """Search ``table`` for ``keys``: prune by partition and id bounds, then read only the collection and id columns."""
    keys = frozenset(keys)
    candidates = candidate_files(cache, table.metadata, keys) if keys else []
    found = locate(cache, candidates, set(keys)) if candidates else {}
    return Located(table.metadata_location, keys, found)


class ReplacementPlan:
    """Which live files hold rows being replaced, and their rewrites, as of one table version."""

    def __init__(self, keys: set[Key], primed: Located | None = None) -> None:
        self.keys = keys
        self._primed = primed
        self.rewrites: dict[str, StagedFile | None] = {}
        self._found: dict[str, int] = {}
        self.found_files: dict[str, tuple[DataFile, set[Key]]] = {}
        self.found_later: set[str] = set()
        """Files among ``found_files`` that appeared after the first version planned: a concurrent writer's."""
        """Live file -> (its DataFile, the keys it holds that the plan drops), as of the last version planned."""
        self._live: set[str] | None = None
        # The keys the writer's base held (when it looked them up there): the first version planned may be later.
        self._ever_found: set[Key] = {key for _, hits in primed.found.values() for key in hits} if primed else set()
        self._ever_found &= keys
        self.vanished: set[Key] = set()
        """Keys a version planned earlier held and the last one holds nowhere: a concurrent commit deleted them."""

    def plan(self, cache: ManifestCache, table: Table) -> int:
        """Bring the plan up to ``table``; returns how many files it rewrote."""
        if not self.keys:
            return 0
        io = cache.io
        live = cache.live_files(table.metadata)
        found: dict[str, tuple[DataFile, set[Key]]] = {}
        if self._live is None:
            unsearched = self.keys
            if self._primed is not None and self._primed.metadata_location == table.metadata_location:
                # Looked up at this very version already (by Writer.stored_items): only the rest needs a search.
                unsearched = self.keys - self._primed.searched
                for path, (data_file, hits) in self._primed.found.items():
                    if hits & self.keys:
                        found[path] = (data_file, hits & self.keys)
            candidates = candidate_files(cache, table.metadata, unsearched) if unsearched else []
        else:
            for path in [path for path in self.rewrites if path not in live]:
                # The winner removed (or rewrote) this file: its rows are not ours to drop any more.
                del self.rewrites[path]
                del self._found[path]
                del self.found_files[path]
                self.found_later.discard(path)
            candidates = [data_file for path, data_file in live.items() if path not in self._live]
        found.update(locate(cache, candidates, self.keys))
        for path, (data_file, hits) in found.items():
            self.rewrites[path] = rewrite_without(io, table.location(), data_file, hits)
            self._found[path] = len(hits)
            self.found_files[path] = (data_file, hits)
            if self._live is not None:
                self.found_later.add(path)
        self._live = set(live)
        present = {key for _, hits in self.found_files.values() for key in hits}
        self._ever_found |= present
        self.vanished = self._ever_found - present
        return len(found)

    @property
    def primed_paths(self) -> set[str]:
        """The files the writer read the stored rows from (``Writer.stored_items``): rows it planned against."""
        return set(self._primed.found) if self._primed is not None else set()

    @property
    def rows_removed(self) -> int:
        """Rows the plan drops from live files (as of the version it was last brought up to)."""
        return sum(self._found.values())

    @property
    def removed_paths(self) -> list[str]:
        return sorted(self.rewrites)

    @property
    def rewritten_files(self) -> list[StagedFile]:
        return [staged for _, staged in sorted(self.rewrites.items()) if staged is not None]
