"""The live set: every table file some version in the Icechunk history needs.

Icechunk decides which table versions are alive: each snapshot in the history
(ancestry) of a branch or tag carries a pointer to a metadata.json. A pointer's
metadata.json keeps its last few Iceberg snapshots (floe trims the log); each
of those has a manifest list, whose manifests name data files (and, in floe's
snapshots, have an id sketch beside them). Every file named
by any manifest entry is live, whatever its status (ADDED, EXISTING or
DELETED): a copy-on-write overwrite keeps the file it deleted readable at
the older versions that still point at it.

History may hold thousands of snapshots that share most of their files, so
each metadata.json, manifest list and manifest is read once (cached by path).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime

import icechunk
from pyiceberg.io import FileIO

from ingest.errors import UnreadableTableFile
from ingest.lifecycle._avro import field_position, read_avro, struct_fields
from ingest.repository import SKETCHED, CommitMetadata, sketch_location

log = logging.getLogger(__name__)

METADATA = "metadata.json"
MANIFEST_LIST = "manifest list"
MANIFEST = "manifest"
DATA = "data file"
ID_SKETCH = "id sketch"
"""floe's id sketch beside a manifest (``ingest.repository._sketch``): live while its manifest is, in a snapshot
whose summary says its manifests have them."""


def history(repo: icechunk.Repository) -> Iterator[icechunk.SnapshotInfo]:
    """Every snapshot in the history (ancestry) of any branch or tag, once each.

    A walk stops where it meets a snapshot another walk has seen (its ancestry
    is the same from there).
    """
    tips = [repo.lookup_branch(name) for name in sorted(repo.list_branches())]
    tips += [repo.lookup_tag(name) for name in sorted(repo.list_tags())]
    seen: set[str] = set()
    for tip in tips:
        for info in repo.ancestry(snapshot_id=tip):
            if info.id in seen:
                break
            seen.add(info.id)
            yield info


def reaches(repo: icechunk.Repository, tip: str, ancestor: str) -> bool:
    """Whether ``ancestor`` is in the history of ``tip`` (``tip`` itself included)."""
    return any(info.id == ancestor for info in repo.ancestry(snapshot_id=tip))


def history_pointers(repo: icechunk.Repository, *, expire_before: datetime | None = None) -> dict[str, str]:
    """Snapshot id -> table pointer (relative to ``<root>/tables/``) for every snapshot in any ref's history.

    Args:
        repo: the repository's Icechunk repository.
        expire_before: leave out what Icechunk's ``expire_snapshots`` would drop (snapshots written before it that
            no ref points at), for dry runs (default: leave out nothing).

    Returns:
        Snapshot id -> the pointer it carries, for every snapshot of the history that carries one (Icechunk's root
        snapshot carries none).
    """
    tips = {repo.lookup_branch(name) for name in repo.list_branches()}
    tips |= {repo.lookup_tag(name) for name in repo.list_tags()}
    pointers: dict[str, str] = {}
    for info in history(repo):
        if expire_before is not None and info.id not in tips and info.written_at < expire_before:
            continue
        record = CommitMetadata.decode(info.metadata)
        if record is not None and record.items is not None:
            pointers[info.id] = record.items
    return pointers


@dataclass
class LiveFiles:
    """Table files by absolute location, with their kind and (where recorded) their size."""

    kinds: dict[str, str] = field(default_factory=dict)
    recorded_sizes: dict[str, int] = field(default_factory=dict)
    """Sizes the table records: ``file_size_in_bytes`` of data files, ``manifest_length`` of manifests."""
    manifests_of: dict[str, list[str]] = field(default_factory=dict)
    """Manifest list -> its manifests."""
    lists_of: dict[str, list[str]] = field(default_factory=dict)
    """metadata.json -> its manifest lists."""
    files_of: dict[str, list[str]] = field(default_factory=dict)
    """Manifest -> the data files its entries name."""

    def __contains__(self, location: str) -> bool:
        return location in self.kinds

    def __len__(self) -> int:
        return len(self.kinds)


class TableWalker:
    """Reads table files once each and collects what a set of metadata.json files needs."""

    def __init__(self, io: FileIO, *, current_only: bool = False) -> None:
        self.io = io
        self.live = LiveFiles()
        self.reads = 0
        self.current_only = current_only
        """Walk only each metadata.json's current Iceberg snapshot (what a replica without history keeps)."""

    def _read(self, location: str, kind: str) -> bytes:
        self.reads += 1
        try:
            with self.io.new_input(location).open() as stream:
                return stream.read()
        except (OSError, FileNotFoundError) as error:
            raise UnreadableTableFile(f"{kind} {location} cannot be read: {error}") from error

    def add_metadata(self, location: str) -> None:
        """Add one metadata.json and everything its snapshots need."""
        live = self.live
        if location in live.lists_of:
            return
        try:
            document = json.loads(self._read(location, METADATA))
        except ValueError as error:
            raise UnreadableTableFile(f"{METADATA} {location} is not valid JSON: {error}") from error
        live.kinds[location] = METADATA
        snapshots = document.get("snapshots", [])
        if self.current_only:
            snapshots = [s for s in snapshots if s.get("snapshot-id") == document.get("current-snapshot-id")]
        lists = [snapshot["manifest-list"] for snapshot in snapshots]
        live.lists_of[location] = lists
        for snapshot in snapshots:
            sketched = (snapshot.get("summary") or {}).get(SKETCHED) == "true"
            self._add_manifest_list(snapshot["manifest-list"], sketched=sketched)

    def _add_manifest_list(self, location: str, *, sketched: bool) -> None:
        live = self.live
        if location in live.manifests_of:
            return
        data = self._read(location, MANIFEST_LIST)
        try:
            schema, _, manifests = read_avro(data)
            path_at = field_position(schema.fields, "manifest_path")
            length_at = field_position(schema.fields, "manifest_length")
        except Exception as error:  # a corrupt file is named, whatever the decoder raised
            raise UnreadableTableFile(f"{MANIFEST_LIST} {location} cannot be read: {error}") from error
        live.kinds[location] = MANIFEST_LIST
        live.manifests_of[location] = [manifest[path_at] for manifest in manifests]
        for manifest in manifests:
            self._add_manifest(manifest[path_at], manifest[length_at])
            if sketched:
                live.kinds[sketch_location(manifest[path_at])] = ID_SKETCH

    def _add_manifest(self, location: str, length: int) -> None:
        live = self.live
        if location in live.files_of:
            return
        data = self._read(location, MANIFEST)
        try:
            schema, _, entries = read_avro(data)
            data_file_at = field_position(schema.fields, "data_file")
            data_file_fields = struct_fields(schema.fields[data_file_at])
            path_at = field_position(data_file_fields, "file_path")
            size_at = field_position(data_file_fields, "file_size_in_bytes")
        except Exception as error:
            raise UnreadableTableFile(f"{MANIFEST} {location} cannot be read: {error}") from error
        live.kinds[location] = MANIFEST
        live.recorded_sizes[location] = length
        paths = []
        # Every entry's file, whatever its status: a DELETED entry's file is still read by older versions.
        for entry in entries:
            data_file = entry[data_file_at]
            path = data_file[path_at]
            live.kinds[path] = DATA
            live.recorded_sizes[path] = data_file[size_at]
            paths.append(path)
        live.files_of[location] = paths


def live_table_files(
    io: FileIO,
    metadata_locations: Iterable[str],
    *,
    skip: Callable[[str], bool] | None = None,
    current_only: bool = False,
) -> tuple[LiveFiles, int]:
    """The files the given metadata.json files need (those ``skip`` accepts are left out); and the reads it took.

    Each metadata.json, manifest list and manifest is read once; data files and id sketches are named, not read.
    Every file a manifest entry names is live, whatever its status.

    Args:
        io: the FileIO the table files are read through.
        metadata_locations: the absolute locations of the metadata.json files.
        skip: says which of ``metadata_locations`` to leave out (nothing is read for them; default: leave out
            none).
        current_only: only what each metadata.json's current snapshot needs.

    Returns:
        The live files (each with its kind and the size the table records, where it records one, and which files
        name which), and how many files were read.

    Raises:
        UnreadableTableFile: a metadata.json, manifest list or manifest is missing or cannot be read, or is not
            valid JSON or Avro.
    """
    walker = TableWalker(io, current_only=current_only)
    for location in sorted(set(metadata_locations)):
        if skip is not None and skip(location):
            continue
        walker.add_metadata(location)
    log.info("live set: %d table files from %d reads", len(walker.live), walker.reads)
    return walker.live, walker.reads
