"""The search caches: decoded columns stay within their byte budget, least recently used first out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs
from pyiceberg.io.pyarrow import PyArrowFileIO

from ingest.api._cache import ROW_NUMBER, ColumnCache, SnapshotCache, SnapshotState


def _write(path: Path, rows: int, row_group_size: int | None = None) -> str:
    pq.write_table(
        pa.table({"a": np.arange(rows, dtype=np.int64), "b": np.ones(rows)}), path, row_group_size=row_group_size
    )
    return str(path)


class _CountingFiles(fs.FileSystemHandler):
    """The local file system, noting each file opened for reading (the cache reads through a filesystem)."""

    def __init__(self, opened: list[str]) -> None:
        self.local = fs.LocalFileSystem()
        self.opened = opened

    def __eq__(self, other: object) -> bool:
        return other is self

    def __ne__(self, other: object) -> bool:
        return other is not self

    def __hash__(self) -> int:
        return id(self)

    def get_type_name(self) -> str:
        return "counting-local"

    def normalize_path(self, path: str) -> str:
        return self.local.normalize_path(path)

    def get_file_info(self, paths: list[str]) -> list[fs.FileInfo]:
        return self.local.get_file_info(paths)

    def get_file_info_selector(self, selector: fs.FileSelector) -> list[fs.FileInfo]:
        return self.local.get_file_info(selector)

    def open_input_file(self, path: str) -> pa.NativeFile:
        self.opened.append(path)
        return self.local.open_input_file(path)

    def open_input_stream(self, path: str) -> pa.NativeFile:
        self.opened.append(path)
        return self.local.open_input_stream(path)

    def create_dir(self, path, recursive):  # not used by reads
        raise NotImplementedError

    delete_dir = delete_dir_contents = delete_root_dir_contents = delete_file = move = copy_file = create_dir
    open_output_stream = open_append_stream = create_dir


class _CountingIO(PyArrowFileIO):
    """Local files, counting how many times each is opened."""

    def __init__(self) -> None:
        super().__init__()
        self.opened: list[str] = []
        counting = fs.PyFileSystem(_CountingFiles(self.opened))
        self.fs_by_scheme = lambda scheme, netloc: counting


def test_columns_are_decoded_once_and_only_those_asked_for(tmp_path: Path) -> None:
    io = _CountingIO()
    cache = ColumnCache(io, max_bytes=10_000_000)
    path = _write(tmp_path / "one.parquet", 100)
    assert cache.read(path, ["a", "missing"]).column_names == ["a", ROW_NUMBER]
    assert io.opened == [path, path]  # the footer, then the column
    assert cache.read(path, ["a"]).column("a").to_pylist() == list(range(100))
    assert io.opened == [path, path]  # the second read came from the cache
    assert cache.read(path, []).column(ROW_NUMBER).to_pylist() == list(range(100))
    assert cache.read(path).column_names == ["a", "b", ROW_NUMBER]
    assert io.opened == [path, path, path]  # only "b" was still to decode


def test_only_the_row_groups_asked_for_are_decoded(tmp_path: Path) -> None:
    io = _CountingIO()
    path = _write(tmp_path / "groups.parquet", 1000, row_group_size=100)
    whole = ColumnCache(io, max_bytes=10_000_000)
    whole.read(path, ["a"])
    cache = ColumnCache(io, max_bytes=10_000_000)
    assert cache.layout(path).num_row_groups == 10
    table = cache.read(path, ["a"], np.array([2, 7]))
    assert table.column("a").to_pylist() == [*range(200, 300), *range(700, 800)]
    assert table.column(ROW_NUMBER).to_pylist() == table.column("a").to_pylist()
    assert cache.cached_bytes * 5 == whole.cached_bytes  # two row groups of ten
    rows = cache.rows(path, np.array([5, 250, 999]))
    assert rows.column_names == ["a", "b"]
    assert rows.column("a").to_pylist() == [5, 250, 999]
    io.opened.clear()
    cache.read(path, ["a"], np.array([2]))  # cached: groups 0, 2, 7 and 9 only
    assert io.opened == []
    assert cache.read(path, ["a"]).column("a").to_pylist() == list(range(1000))
    assert io.opened == [path]  # the six missing row groups, in one read


def test_the_least_recently_used_file_goes_once_over_budget(tmp_path: Path) -> None:
    io = _CountingIO()
    paths = [_write(tmp_path / f"{n}.parquet", 1000) for n in range(3)]
    one_file = ColumnCache(io, max_bytes=10_000_000)
    one_file.read(paths[0], ["a"])
    budget = 2 * one_file.cached_bytes  # room for two files' column "a", not three
    cache = ColumnCache(io, max_bytes=budget)
    for path in paths[:2]:
        cache.read(path, ["a"])
    cache.read(paths[0], ["a"])  # paths[0] is now the most recently used
    cache.read(paths[2], ["a"])  # over budget: paths[1] goes
    assert cache.cached_bytes <= budget
    io.opened.clear()
    cache.read(paths[0], ["a"])
    cache.read(paths[2], ["a"])
    assert io.opened == []
    cache.read(paths[1], ["a"])
    assert io.opened == [paths[1]]  # its footer stayed: only the column is read again


def test_snapshot_states_are_loaded_once_and_the_oldest_dropped() -> None:
    loaded: list[str] = []

    def load(snapshot_id: str) -> SnapshotState:
        loaded.append(snapshot_id)
        # Only the id matters to the cache; a real state's table and schema are left out.
        return SnapshotState(snapshot_id, table=None, schema=None, arrow_schema=pa.schema([]), files=[])  # type: ignore[arg-type]

    cache = SnapshotCache(load, size=2)
    assert cache.get("a") is cache.get("a")
    cache.get("b")
    cache.get("a")
    cache.get("c")  # "b" is the least recently used
    cache.get("a")
    cache.get("b")
    assert loaded == ["a", "b", "c", "b"]
