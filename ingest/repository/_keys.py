"""Which data files hold which items: hashes of every row's (collection, id), read once per file.

A batch's re-run check (which of its items the table holds already) and a
replacement's search must find the files that hold some keys. Column bounds
prune by id only when ids follow the order items arrive in; real archives name
items tile first (``S2B_T33UUP_20240105...``), so every file's id range spans
nearly every id and each batch would read the ids of the whole table again.
Data files never change, so their keys are read once per process and kept as
sorted 64-bit hashes (8 bytes a row): a lookup probes them in memory and reads
only the files that hold a key (to confirm it), so its cost follows the batch.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterable

import numpy as np
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile

Key = tuple[str, str]


def key_hashes(keys: Iterable[Key]) -> np.ndarray:
    """Sorted hashes of ``keys`` (Python's string hash: stable within a process, which is all the index lives)."""
    return np.sort(np.fromiter((hash(key) for key in keys), dtype=np.int64))


class KeyIndex:
    """The hashes of the keys of each data file read so far (files never change)."""

    def __init__(self, io: FileIO) -> None:
        self.io = io
        self._files: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    def _hashes(self, data_file: DataFile) -> np.ndarray:
        path = data_file.file_path
        with self._lock:
            cached = self._files.get(path)
        if cached is None:
            with self.io.new_input(path).open() as stream:
                columns = pq.read_table(stream, columns=["collection", "id"])
            cached = key_hashes(
                zip(columns.column("collection").to_pylist(), columns.column("id").to_pylist(), strict=True)
            )
            with self._lock:
                self._files[path] = cached
        return cached

    def holding(self, files: Iterable[DataFile], keys: Collection[Key]) -> list[DataFile]:
        """The files of ``files`` that may hold one of ``keys`` (a hash collision may add one; none is missed)."""
        wanted = key_hashes(keys)
        if len(wanted) == 0:
            return []
        found = []
        for data_file in files:
            held = self._hashes(data_file)
            if len(held) == 0:
                continue
            positions = np.searchsorted(held, wanted).clip(max=len(held) - 1)
            if np.any(held[positions] == wanted):
                found.append(data_file)
        return found

    def retain(self, paths: Collection[str]) -> None:
        """Forget the files not in ``paths`` (no longer live in the version last listed)."""
        with self._lock:
            self._files = {path: hashes for path, hashes in self._files.items() if path in paths}
