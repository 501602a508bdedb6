"""Id sketches: for each manifest, which row of which of its data files holds which id fingerprint.

A sketch (:func:`sketch_location`: ``<manifest>.ids.parquet``) holds each live row's file, row number and 32-bit id
fingerprint (:func:`fingerprints`); :func:`is_sketched` says whether readers of a snapshot may trust its sketches.
Why, what a sketch holds, when one is written and who keeps it: docs/design.md §3 (id sketches).
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping, Sequence

import mmh3
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, ManifestContent, ManifestFile
from pyiceberg.table.snapshots import Snapshot

SKETCHED = "floe.id-sketches"
"""Snapshot summary property: "true" when every data manifest of the snapshot has an id sketch."""
_SCHEMA = pa.schema([("file", pa.string()), ("row", pa.int32()), ("fingerprint", pa.int32())])


def fingerprints(ids: Iterable[str]) -> np.ndarray:
    """The 32-bit MurmurHash3 of each id (UTF-8), in order: the same in every process and on every machine."""
    return np.fromiter(map(mmh3.hash, ids), dtype=np.int32)


def sketch_location(manifest_path: str) -> str:
    """Where the id sketch of the manifest at ``manifest_path`` is (beside it)."""
    return f"{manifest_path.removesuffix('.avro')}.ids.parquet"


def is_sketched(snapshot: Snapshot | None) -> bool:
    """Whether every data manifest of ``snapshot`` has an id sketch (None, no snapshot: trivially)."""
    return snapshot is None or (snapshot.summary is not None and snapshot.summary.get(SKETCHED) == "true")


def relative_to(table_location: str, path: str) -> str:
    """A data file's path relative to the table's location (what a sketch records)."""
    prefix = table_location.rstrip("/") + "/"
    if not path.startswith(prefix):
        raise ValueError(f"data file {path} is not under the table's location {table_location}")
    return path[len(prefix) :]


def sketch_table(table_location: str, files: Sequence[tuple[str, np.ndarray]]) -> pa.Table:
    """The sketch of ``files`` ((absolute path, fingerprints of its rows' ids in row order), in manifest order)."""
    if not files:
        return _SCHEMA.empty_table()
    names = pa.array([relative_to(table_location, path) for path, _ in files], pa.string())
    lengths = [len(found) for _, found in files]
    owners = np.repeat(np.arange(len(files), dtype=np.int32), lengths)
    return pa.table(
        {
            "file": names.take(pa.array(owners)),
            "row": pa.array(np.concatenate([np.arange(length, dtype=np.int32) for length in lengths])),
            "fingerprint": pa.array(np.concatenate([np.asarray(found, dtype=np.int32) for _, found in files])),
        },
        schema=_SCHEMA,
    )


def write_sketch(file_io: FileIO, manifest_path: str, table: pa.Table) -> None:
    """Write ``table`` as the sketch of the manifest at ``manifest_path`` (before the manifest is committed)."""
    sink = io.BytesIO()
    pq.write_table(table.cast(_SCHEMA), sink, compression="zstd", use_dictionary=["file"])
    with file_io.new_output(sketch_location(manifest_path)).create(overwrite=True) as stream:
        stream.write(sink.getvalue())


def read_sketch(file_io: FileIO, manifest_path: str) -> pa.Table:
    """The sketch of the manifest at ``manifest_path``, read whole (one GET on object storage).

    Raises:
        FileNotFoundError: the manifest has no sketch.
    """
    with file_io.new_input(sketch_location(manifest_path)).open() as stream:
        return pq.read_table(pa.BufferReader(stream.read())).cast(_SCHEMA)


def by_file(sketch: pa.Table) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A sketch's (row numbers, fingerprints) by file (relative path), rows in order: one sort of the sketch."""
    ordered = sketch.sort_by([("file", "ascending"), ("row", "ascending")])
    names = ordered.column("file").to_numpy(zero_copy_only=False)
    rows, prints = ordered.column("row").to_numpy(), ordered.column("fingerprint").to_numpy()
    if len(names) == 0:
        return {}
    starts = np.flatnonzero(np.concatenate([[True], names[1:] != names[:-1]]))
    ends = np.append(starts[1:], len(names))
    return {str(names[a]): (rows[a:b], prints[a:b]) for a, b in zip(starts, ends, strict=True)}


def without_files(table: pa.Table, table_location: str, removed: Iterable[str]) -> pa.Table:
    """``table`` (a sketch) without the rows of the files at the absolute paths ``removed``."""
    gone = pa.array([relative_to(table_location, path) for path in removed], pa.string())
    return table.filter(pc.invert(pc.is_in(table.column("file"), value_set=gone)))


def data_manifests(manifests: Sequence[ManifestFile]) -> list[ManifestFile]:
    """The manifests of data files (floe writes no delete files: it deletes by rewriting data files)."""
    return [manifest for manifest in manifests if manifest.content == ManifestContent.DATA]


def sketched_files(
    table_location: str, data_files: Sequence[DataFile], known: Mapping[str, np.ndarray]
) -> pa.Table | None:
    """The sketch of a new manifest of ``data_files`` from the fingerprints ``known`` by path (None: some file's
    are not known, so the manifest gets no sketch)."""
    if not all(data_file.file_path in known for data_file in data_files):
        return None
    return sketch_table(table_location, [(f.file_path, known[f.file_path]) for f in data_files])
