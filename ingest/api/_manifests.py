"""What a server keeps of manifests: each one's live data files and id sketch, by manifest path, across versions.

A manifest is written once and never rewritten, and consecutive versions of a
table share most of theirs, so a version's file list is its manifest list
(read once per version) plus the manifests not read yet. A commit landing on a
branch a server answers for costs it that commit's manifest list and new
manifests (and, for a search by ids, their sketches), not the table's whole
file list again. Shared by the server's request threads: entries are guarded
by a lock, loaded outside it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, ManifestFile
from pyiceberg.table.snapshots import Snapshot

from ingest.api._cache import Recent
from ingest.repository import READS_AT_ONCE, read_sketch

LISTS_KEPT = 64
"""Manifest lists kept (one a table version searched)."""
MANIFEST_FILES_KEPT = 1_000_000
"""Data-file entries of manifests kept (about a kilobyte each, with their column metrics)."""
SKETCH_ROWS_KEPT = 4_000_000
"""Rows of id sketches kept (a dozen bytes each, their files' names shared)."""


class ManifestFiles:
    """The live data files each manifest lists and its id sketch, by manifest path, least recently used dropped
    beyond a count."""

    def __init__(self, io: FileIO, max_files: int = MANIFEST_FILES_KEPT) -> None:
        self.io = io
        self.max_files = max_files
        self._files: OrderedDict[str, list[DataFile]] = OrderedDict()
        self._count = 0
        self._sketches: OrderedDict[str, pa.Table] = OrderedDict()
        self._sketch_rows = 0
        self._lists: Recent[list[ManifestFile]] = Recent(LISTS_KEPT)
        self._lock = threading.Lock()

    def manifests(self, snapshot: Snapshot) -> list[ManifestFile]:
        """The manifests of ``snapshot``'s manifest list, read once for the last few versions."""
        return self._lists.get(snapshot.manifest_list, lambda: snapshot.manifests(self.io))

    def live_files(self, manifests: Sequence[ManifestFile]) -> list[DataFile]:
        """The live data files of ``manifests`` (a table version's): those not read yet are read concurrently."""
        with self._lock:
            held = {m.manifest_path: self._files[m.manifest_path] for m in manifests if m.manifest_path in self._files}
        missing = [manifest for manifest in manifests if manifest.manifest_path not in held]
        if missing:
            with ThreadPoolExecutor(min(READS_AT_ONCE, len(missing)), thread_name_prefix="floe-manifests") as pool:
                held.update(zip((m.manifest_path for m in missing), pool.map(self._read, missing), strict=True))
        with self._lock:
            for path, files in held.items():
                if path in self._files:
                    self._files.move_to_end(path)
                else:
                    self._files[path] = files
                    self._count += len(files)
            while self._count > self.max_files and len(self._files) > len(manifests):
                _, dropped = self._files.popitem(last=False)
                self._count -= len(dropped)
        # What this call read or found stays in its answer even if another thread dropped an entry since.
        return [data_file for manifest in manifests for data_file in held[manifest.manifest_path]]

    def _read(self, manifest: ManifestFile) -> list[DataFile]:
        return [entry.data_file for entry in manifest.fetch_manifest_entry(self.io, discard_deleted=True)]

    def sketches(self, manifests: Sequence[ManifestFile]) -> list[pa.Table]:
        """The id sketches of ``manifests`` (of a sketched snapshot), those not read yet read concurrently; kept
        while their rows fit :data:`SKETCH_ROWS_KEPT` (a new version then reads only its new manifests')."""
        with self._lock:
            missing = [manifest for manifest in manifests if manifest.manifest_path not in self._sketches]
        read: list[pa.Table] = []
        if missing:
            with ThreadPoolExecutor(min(READS_AT_ONCE, len(missing)), thread_name_prefix="floe-sketches") as pool:
                read = list(pool.map(lambda manifest: read_sketch(self.io, manifest.manifest_path), missing))
        found = {manifest.manifest_path: sketch for manifest, sketch in zip(missing, read, strict=True)}
        with self._lock:
            for path, sketch in found.items():
                if path not in self._sketches:
                    self._sketches[path] = sketch
                    self._sketch_rows += sketch.num_rows
            for manifest in manifests:
                if manifest.manifest_path in self._sketches:
                    found[manifest.manifest_path] = self._sketches[manifest.manifest_path]
                    self._sketches.move_to_end(manifest.manifest_path)
            while self._sketch_rows > SKETCH_ROWS_KEPT and self._sketches:
                _, dropped = self._sketches.popitem(last=False)
                self._sketch_rows -= dropped.num_rows
        return [found[manifest.manifest_path] for manifest in manifests]
