"""Which rows of which data files hold which item ids: hashes of every row's id, read once per file.

A batch's re-run check (which of its items the table holds already) and a
replacement's search must find the files that hold some ids (:class:`KeyIndex`,
per file, kept across versions); a search by ids must find the files and rows
that hold them (:class:`IdIndex`, one sorted array per table version).
Column bounds prune by id only when ids follow the order items arrive in;
real archives name items tile first (``S2B_T33UUP_20240105...``) and
compacted files are ordered by place, so every file's id range spans nearly
every id and each lookup would read the ids of the whole table again. Data
files never change, so their ids are read once per process and kept as sorted
32-bit fingerprints (4 bytes a row; the id sketches' own, ``_sketch.py``): a lookup probes them in memory and reads only
the files that hold an id, to confirm it, so its cost follows the ids asked
for, not the table.

Only the id is hashed, not (collection, id): a search by ids names no
collection, and an id held in another collection only adds a confirming read.
The key index probes files one by one, fine for the few files a batch's
partitions hold; a search by ids may reach every file of the table. Both
take a file's fingerprints from the id sketch beside its manifest where the
table version has them (``_sketch.py``), rather than reading the file.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile

from ingest.repository._read import READS_AT_ONCE, read_column
from ingest.repository._sketch import fingerprints, relative_to


def id_hashes(ids: Iterable[str]) -> np.ndarray:
    """Sorted, distinct fingerprints of ``ids`` (what the indexes and the id sketches hold)."""
    return np.unique(fingerprints(ids))


class _FileIds:
    """One file's id hashes, sorted."""

    __slots__ = ("hashes",)

    def __init__(self, hashes: np.ndarray) -> None:
        self.hashes = np.sort(hashes)

    def holds_any(self, wanted: np.ndarray) -> bool:
        """Whether any of ``wanted`` (sorted) is among the file's hashes. The shorter of the two is looked up in the
        other: a file of 5,000 rows asked about a batch of 50,000 ids makes 5,000 look-ups, not 50,000."""
        hashes = self.hashes
        if len(hashes) == 0 or len(wanted) == 0:
            return False
        few, many = (hashes, wanted) if len(hashes) < len(wanted) else (wanted, hashes)
        positions = np.searchsorted(many, few).clip(max=len(many) - 1)
        return bool(np.any(many[positions] == few))


class KeyIndex:
    """The id hashes of each data file read so far (files never change)."""

    def __init__(self, io: FileIO, sketched: Callable[[str], np.ndarray | None] | None = None) -> None:
        self.io = io
        self.sketched = sketched
        """A file's id fingerprints from its manifest's id sketch (None: it has none): no read of the file."""
        self._files: dict[str, _FileIds] = {}
        self._lock = threading.Lock()

    def _ids(self, data_file: DataFile) -> _FileIds:
        path = data_file.file_path
        with self._lock:
            cached = self._files.get(path)
        if cached is None:
            found = self.sketched(path) if self.sketched is not None else None
            if found is None:
                found = fingerprints(read_column(self.io, data_file, "id").to_pylist())
            cached = _FileIds(found)
            with self._lock:
                self._files[path] = cached
        return cached

    def holding(self, files: Iterable[DataFile], ids: Collection[str]) -> list[DataFile]:
        """The files of ``files`` that may hold one of ``ids`` (a hash collision may add one; none is missed)."""
        files = list(files)
        if not files:
            return []  # nothing to probe: the ids need no hashing (a batch whose id bounds ruled out every file)
        wanted = id_hashes(ids)
        if len(wanted) == 0:
            return []
        return [data_file for data_file in files if self._ids(data_file).holds_any(wanted)]

    def learn(self, path: str, hashes: np.ndarray) -> None:
        """The id fingerprints of a file this process wrote (it need not read them back when a later batch
        looks): the ones its staging computed for the sketch."""
        with self._lock:
            if path in self._files:
                return  # known already (a commit attempted again keeps its files)
        learned = _FileIds(hashes)
        with self._lock:
            self._files[path] = learned

    def retain(self, paths: Collection[str]) -> None:
        """Forget the files not in ``paths`` (no longer live in the version last listed)."""
        with self._lock:
            self._files = {path: entry for path, entry in self._files.items() if path in paths}


class IdIndex:
    """Every row's id hash of a set of files in one sorted array: the files and rows holding some ids, in one probe.

    A search by ids over a large table would otherwise probe each file's
    hashes in turn: ids follow time and compacted files follow place, so at
    ten million items about 30 files' id bounds contain each id. 12 bytes a
    row (hash, file, row); built once per table version that is searched by ids, from the id sketches of its
    manifests where they have them.
    """

    def __init__(self, hashes: np.ndarray, files: np.ndarray, rows: np.ndarray) -> None:
        self.hashes, self.files, self.rows = hashes, files, rows

    @classmethod
    def build(cls, data_files: list[DataFile], read_ids: Callable[[DataFile], pa.ChunkedArray]) -> IdIndex:
        """The ids of ``data_files`` as ``read_ids`` reads them (file numbers are positions in that list),
        ``READS_AT_ONCE`` files at a time: on object storage each file is a round trip or two, and a table's
        files are hundreds."""
        parts, owners, numbers = [], [], []
        with ThreadPoolExecutor(READS_AT_ONCE, thread_name_prefix="floe-ids") as pool:
            columns = pool.map(read_ids, data_files)
            for position, column in enumerate(columns):
                parts.append(fingerprints(column.to_pylist()))
                owners.append(np.full(len(parts[-1]), position, dtype=np.int32))
                numbers.append(np.arange(len(parts[-1]), dtype=np.int32))
        return cls.of_parts(parts, owners, numbers)

    @classmethod
    def of_sketches(cls, table_location: str, data_files: list[DataFile], sketches: Iterable[pa.Table]) -> IdIndex:
        """The index of ``data_files`` (file numbers are positions in that list) from the id sketches of the
        manifests that list them (``_sketch.py``): no data file is read.

        Raises:
            ValueError: a sketch names a file that is not among ``data_files`` (it disagrees with its manifest).
        """
        position = {relative_to(table_location, data_file.file_path): n for n, data_file in enumerate(data_files)}
        parts, owners, numbers = [], [], []
        for sketch in sketches:
            names = sketch.column("file").combine_chunks().dictionary_encode()
            try:
                of_name = np.array([position[name] for name in names.dictionary.to_pylist()], dtype=np.int32)
            except KeyError as error:
                raise ValueError(f"an id sketch names {error.args[0]}, which its manifest does not list") from None
            owners.append(of_name[names.indices.to_numpy(zero_copy_only=False)] if len(of_name) else np.empty(0))
            parts.append(sketch.column("fingerprint").to_numpy())
            numbers.append(sketch.column("row").to_numpy())
        return cls.of_parts(parts, owners, numbers)

    @classmethod
    def of_parts(cls, parts: list[np.ndarray], owners: list[np.ndarray], numbers: list[np.ndarray]) -> IdIndex:
        """The index of rows given as fingerprints, file numbers and row numbers (any order, in parts)."""
        if not parts:
            empty = np.empty(0, dtype=np.int32)
            return cls(empty, empty, empty)
        hashes = np.concatenate(parts).astype(np.int32, copy=False)
        order = np.argsort(hashes, kind="stable")
        files = np.concatenate(owners).astype(np.int32, copy=False)
        return cls(hashes[order], files[order], np.concatenate(numbers).astype(np.int32, copy=False)[order])

    def locate(self, wanted: np.ndarray) -> dict[int, np.ndarray]:
        """File number -> sorted row numbers whose id hash is one of ``wanted`` (confirm them: hashes may collide)."""
        if len(self.hashes) == 0 or len(wanted) == 0:
            return {}
        starts = np.searchsorted(self.hashes, wanted, side="left")
        ends = np.searchsorted(self.hashes, wanted, side="right")
        spans = [np.arange(start, end) for start, end in zip(starts, ends, strict=True) if end > start]
        if not spans:
            return {}
        found = np.concatenate(spans)
        files, rows = self.files[found], self.rows[found].astype(np.int64)
        return {int(file): np.sort(rows[files == file]) for file in np.unique(files)}
