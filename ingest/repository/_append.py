"""One Iceberg commit (append or copy-on-write overwrite), built directly.

floe writes the manifest, manifest list, snapshot and next metadata.json itself.

pyiceberg's ``Transaction`` re-derives (and deep-copies) the whole table
metadata every time it is consulted, about twenty times per append; inside the
commit loop that cost is paid again on every lost race and widens the window
in which other writers win. floe's append has one shape (new data files onto
the current snapshot), so it writes the files itself and applies the metadata
updates once. Small manifests are merged once ``commit.manifest.min-count-to-merge``
of them pile up, so the manifest list, and every scan, stays bounded.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyiceberg.avro.codecs import AvroCompressionCodec
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DataFile,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
    write_manifest,
    write_manifest_list,
)
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.snapshots import (
    Operation,
    Snapshot,
    SnapshotSummaryCollector,
    Summary,
    update_snapshot_summaries,
)
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER_ID
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    SetSnapshotRefUpdate,
    TableUpdate,
)

from ingest._compat import transaction_updates
from ingest.repository._catalog import sort_order_columns
from ingest.repository._keys import KeyIndex
from ingest.repository._sketch import (
    SKETCHED,
    by_file,
    is_sketched,
    read_sketch,
    relative_to,
    sketched_files,
    without_files,
    write_sketch,
)
from ingest.stac import HILBERT

log = logging.getLogger(__name__)

MIN_MERGE_PROPERTY = "commit.manifest.min-count-to-merge"
TARGET_SIZE_PROPERTY = "commit.manifest.target-size-bytes"
LISTS_KEPT = 8
"""Manifest lists a writer keeps read (its base's, and a few a lost race brings)."""
AVRO_COMPRESSION: AvroCompressionCodec = "deflate"
"""Manifests and manifest lists are Avro with deflate, Iceberg's default (``gzip``): every engine reads it (DuckDB's
Avro reader refuses zstandard)."""


def _metadata_path(metadata: TableMetadata, name: str) -> str:
    return f"{metadata.location}/metadata/{name}"


def _manifest_writer(io: FileIO, metadata: TableMetadata, snapshot_id: int, name: str) -> ManifestWriter:
    return write_manifest(
        format_version=metadata.format_version,
        spec=metadata.spec(),
        schema=metadata.schema(),
        output_file=io.new_output(_metadata_path(metadata, name)),
        snapshot_id=snapshot_id,
        avro_compression=AVRO_COMPRESSION,
    )


def _write_added_manifest(
    io: FileIO,
    metadata: TableMetadata,
    snapshot_id: int,
    data_files: Sequence[DataFile],
    commit_id: uuid.UUID,
    *,
    fingerprints: Mapping[str, np.ndarray],
) -> tuple[ManifestFile, bool]:
    """The manifest of ``data_files``, and whether it got an id sketch (every file's ``fingerprints`` known)."""
    sketch = sketched_files(metadata.location, data_files, fingerprints)
    if sketch is not None:
        write_sketch(io, _metadata_path(metadata, f"{commit_id}-m0.avro"), sketch)
    with _manifest_writer(io, metadata, snapshot_id, f"{commit_id}-m0.avro") as writer:
        for data_file in data_files:
            writer.add(
                ManifestEntry.from_args(
                    status=ManifestEntryStatus.ADDED,
                    snapshot_id=snapshot_id,
                    sequence_number=None,
                    file_sequence_number=None,
                    data_file=data_file,
                )
            )
    return writer.to_manifest_file(), sketch is not None


class ManifestCache:
    """Live entries of manifests by path: manifests never change once written, so one read serves every attempt.

    One cache serves every writer of a repository object (``Repository.manifests``): the next batch's
    commit reads only the manifests written since the last one, not the whole table's file list again.
    Each :meth:`live_files` keeps only the manifests of the version it listed, so memory follows the
    table's current size, not its history.
    """

    def __init__(self, io: FileIO) -> None:
        self.io = io
        self._entries: dict[str, list[ManifestEntry]] = {}
        self._sketches: dict[str, pa.Table] = {}
        self._lists: dict[str, list[ManifestFile]] = {}
        self._grouped: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
        """A manifest's sketch by file (``_sketch.by_file``), made when a writer's key index first asks."""
        self._listed_in: dict[str, ManifestFile] = {}
        """Data file -> the manifest listing it, in the version last listed when that version is sketched."""
        self._table_location = ""
        self.keys = KeyIndex(io, self._sketched_fingerprints)
        """Which (collection, id) keys each live data file holds, read once per file."""

    def entries(self, manifest: ManifestFile) -> list[ManifestEntry]:
        cached = self._entries.get(manifest.manifest_path)
        if cached is None:
            cached = manifest.fetch_manifest_entry(self.io, discard_deleted=True)
            self._entries[manifest.manifest_path] = cached
        return cached

    def manifests(self, snapshot: Snapshot) -> list[ManifestFile]:
        """The manifests of ``snapshot``'s manifest list, read once (PyIceberg reads the list at every call)."""
        found = self._lists.get(snapshot.manifest_list)
        if found is None:
            found = self._lists[snapshot.manifest_list] = snapshot.manifests(self.io)
            while len(self._lists) > LISTS_KEPT:
                del self._lists[next(iter(self._lists))]
        return found

    def sketch(self, manifest: ManifestFile) -> pa.Table:
        """The id sketch of ``manifest`` (of a sketched snapshot: see ``_sketch.py``), read once.

        Raises:
            SketchUnreadable: it is missing or cannot be read.
        """
        cached = self._sketches.get(manifest.manifest_path)
        if cached is None:
            try:
                cached = read_sketch(self.io, manifest.manifest_path)
            except Exception as error:  # missing, or not Parquet: the same for a writer
                raise SketchUnreadable(f"the id sketch of {manifest.manifest_path} cannot be read: {error}") from error
            self._sketches[manifest.manifest_path] = cached
        return cached

    def live_files(self, metadata: TableMetadata) -> dict[str, DataFile]:
        """Path -> DataFile of every live data file of the current snapshot of ``metadata``."""
        snapshot = metadata.current_snapshot()
        if snapshot is None:
            return {}
        manifests = self.manifests(snapshot)
        live = {
            entry.data_file.file_path: entry.data_file for manifest in manifests for entry in self.entries(manifest)
        }
        current = {manifest.manifest_path for manifest in manifests}
        self._entries = {path: entries for path, entries in self._entries.items() if path in current}
        self._sketches = {path: sketch for path, sketch in self._sketches.items() if path in current}
        self._grouped = {path: files for path, files in self._grouped.items() if path in current}
        self._listed_in = {}
        if is_sketched(snapshot):
            self._table_location = metadata.location
            for manifest in manifests:
                for entry in self.entries(manifest):
                    self._listed_in[entry.data_file.file_path] = manifest
        self.keys.retain(live)
        return live

    def _sketched_fingerprints(self, path: str) -> np.ndarray | None:
        """The id fingerprints of the live file at ``path``, in row order, from its manifest's sketch (None: the
        version last listed is not sketched, or does not list it)."""
        manifest = self._listed_in.get(path)
        if manifest is None:
            return None
        try:
            sketch = self.sketch(manifest)
        except SketchUnreadable as error:
            log.warning("%s; reading the ids of %s instead", error, path)
            return None
        grouped = self._grouped.get(manifest.manifest_path)
        if grouped is None:  # one sort of the sketch serves every file it names
            grouped = self._grouped[manifest.manifest_path] = by_file(sketch)
        found = grouped.get(relative_to(self._table_location, path))
        return None if found is None else found[1]


class SketchUnreadable(OSError):
    """An id sketch a sketched version's manifest should have is missing or unreadable."""


def _tier(manifest: ManifestFile, fan_in: int) -> int:
    """A manifest's tier: 0 below ``fan_in`` live entries, 1 below ``fan_in``², and so on."""
    entries = (manifest.added_files_count or 0) + (manifest.existing_files_count or 0)
    tier = 0
    while entries >= fan_in:
        entries //= fan_in
        tier += 1
    return tier


def _merge_small_manifests(
    cache: ManifestCache,
    metadata: TableMetadata,
    snapshot_id: int,
    existing: list[ManifestFile],
    commit_id: uuid.UUID,
    *,
    sketched: bool,
) -> list[ManifestFile]:
    """Merge manifests in tiers, like a log-structured merge, so their number stays logarithmic in the files.

    Once ``commit.manifest.min-count-to-merge`` manifests of one tier pile up,
    they become one manifest of the next tier. Merging every small manifest
    into one growing manifest instead would rewrite the whole file list every
    few commits: quadratic bytes over a long history, for writers and for gc,
    which reads every manifest any version needs.
    """
    fan_in = max(2, int(metadata.properties.get(MIN_MERGE_PROPERTY, "100")))
    target = int(metadata.properties.get(TARGET_SIZE_PROPERTY, str(8 * 1024 * 1024)))
    spec_id = metadata.default_spec_id
    # A manifest whose files an earlier commit all removed lists nothing live: later snapshots drop it.
    # This commit's own manifests of removals stay as they are: they record what this snapshot deleted.
    existing = [
        manifest
        for manifest in existing
        if manifest.added_snapshot_id == snapshot_id
        or (manifest.added_files_count or 0) + (manifest.existing_files_count or 0) > 0
    ]
    tiers: dict[int, list[ManifestFile]] = {}
    for manifest in existing:
        if (
            manifest.manifest_length < target
            and manifest.partition_spec_id == spec_id
            and manifest.added_snapshot_id != snapshot_id
        ):
            tiers.setdefault(_tier(manifest, fan_in), []).append(manifest)
    # The new commit's manifest joins tier 0, so that tier merges one commit early.
    full = [tier for tier, members in sorted(tiers.items()) if len(members) + (tier == 0) >= fan_in]
    if not full:
        return existing
    merging = tiers[full[0]]
    if sketched:  # the merged manifest's sketch: its members' (every manifest of a sketched base has one)
        sketches = [cache.sketch(manifest) for manifest in merging]
        write_sketch(cache.io, _metadata_path(metadata, f"{commit_id}-m1.avro"), pa.concat_tables(sketches))
    with _manifest_writer(cache.io, metadata, snapshot_id, f"{commit_id}-m1.avro") as writer:
        for manifest in merging:
            for entry in cache.entries(manifest):
                writer.existing(entry)
    kept = [m for m in existing if m not in merging]
    return [writer.to_manifest_file(), *kept]


def _remove_files(
    cache: ManifestCache,
    metadata: TableMetadata,
    snapshot_id: int,
    existing: list[ManifestFile],
    *,
    removed: set[str],
    commit_id: uuid.UUID,
    sketched: bool,
) -> tuple[list[ManifestFile], list[DataFile]]:
    """Rewrite the manifests that list a removed file, marking it deleted; return the manifests and removed files.

    With ``sketched`` (every manifest of the base has an id sketch), each rewritten manifest gets its original's
    sketch without the removed files."""
    manifests: list[ManifestFile] = []
    removed_files: list[DataFile] = []
    for index, manifest in enumerate(existing):
        entries = cache.entries(manifest)
        if not any(entry.data_file.file_path in removed for entry in entries):
            manifests.append(manifest)
            continue
        rewritten = _metadata_path(metadata, f"{commit_id}-d{index}.avro")
        if sketched:
            write_sketch(cache.io, rewritten, without_files(cache.sketch(manifest), metadata.location, removed))
        with _manifest_writer(cache.io, metadata, snapshot_id, f"{commit_id}-d{index}.avro") as writer:
            for entry in entries:
                if entry.data_file.file_path in removed:
                    writer.delete(entry)
                    removed_files.append(entry.data_file)
                else:
                    writer.existing(entry)
        manifests.append(writer.to_manifest_file())
    return manifests, removed_files


@dataclass(frozen=True)
class AddedManifest:
    """The manifest of a writer's data files, kept across attempts of one commit."""

    snapshot_id: int
    data_files: tuple[DataFile, ...]
    manifest: ManifestFile | None
    """None when the change adds no file (a deletion): Iceberg has no empty manifests."""
    sketched: bool = False
    """Whether the manifest has an id sketch (True too when there is no manifest: nothing lacks one)."""


def _rewritten(
    cache: ManifestCache,
    metadata: TableMetadata,
    snapshot_id: int,
    base: list[ManifestFile],
    *,
    removed: set[str],
    commit_id: uuid.UUID,
    sketched: bool,
) -> tuple[list[DataFile], list[ManifestFile]]:
    """The files ``removed`` (marked deleted in rewritten manifests) and the base's manifests after that and tier
    merging (with their sketches when ``sketched``; SketchUnreadable if one of the base's cannot be read)."""
    existing: list[ManifestFile] = base
    removed_files: list[DataFile] = []
    if removed:
        existing, removed_files = _remove_files(
            cache, metadata, snapshot_id, base, removed=removed, commit_id=commit_id, sketched=sketched
        )
        missing = removed - {data_file.file_path for data_file in removed_files}
        if missing:
            raise ValueError(f"cannot remove files that are not live in the base version: {sorted(missing)}")
    merged = _merge_small_manifests(cache, metadata, snapshot_id, existing, commit_id, sketched=sketched)
    return removed_files, merged


def plan_commit(
    metadata: TableMetadata,
    data_files: Sequence[DataFile],
    cache: ManifestCache,
    snapshot_properties: dict[str, str],
    *,
    previous: AddedManifest | None = None,
    removed: Iterable[str] = (),
    operation: Operation | None = None,
    fingerprints: Mapping[str, np.ndarray] | None = None,
) -> tuple[tuple[TableUpdate, ...], AssertRefSnapshotId, AddedManifest]:
    """Write what adding ``data_files`` to (and removing the files ``removed`` from) ``metadata`` needs.

    Returns the updates, the requirement and the manifest of the added files.
    ``metadata`` is the version being changed (the base, possibly with a
    schema union applied); the requirement pins the branch head it saw. A
    replay passes the previous attempt's ``AddedManifest``: if the data files
    (and their statistics) are unchanged and its snapshot id is still free, the
    manifest is reused and only a manifest list and metadata.json are new.
    Removing files (copy-on-write replacement of rows) makes an ``overwrite``
    snapshot, a ``delete`` when nothing is added (``operation`` overrides: a
    compaction, which changes no row, is a ``replace``); every path in
    ``removed`` must be live in ``metadata``. ``fingerprints`` (path -> the
    fingerprints of a new file's ids, in row order) give the new manifest an
    id sketch; the snapshot is marked sketched when its base was and every
    new manifest got one (``_sketch.py``).
    """
    io = cache.io
    commit_id = uuid.uuid4()
    data_files = tuple(data_files)
    removed = set(removed)
    if (
        previous is not None
        and previous.data_files == data_files
        and metadata.snapshot_by_id(previous.snapshot_id) is None
    ):
        added = previous
    else:
        snapshot_id = previous.snapshot_id if previous is not None else metadata.new_snapshot_id()
        if metadata.snapshot_by_id(snapshot_id) is not None:
            snapshot_id = metadata.new_snapshot_id()
        if data_files:
            manifest, has_sketch = _write_added_manifest(
                io, metadata, snapshot_id, data_files, commit_id, fingerprints=fingerprints or {}
            )
            added = AddedManifest(snapshot_id, data_files, manifest, has_sketch)
        else:
            added = AddedManifest(snapshot_id, data_files, None, sketched=True)
    snapshot_id = added.snapshot_id
    parent = metadata.current_snapshot()
    sketched = is_sketched(parent) and added.sketched
    sequence_number = metadata.next_sequence_number()
    base = cache.manifests(parent) if parent is not None else []
    try:
        removed_files, merged = _rewritten(
            cache, metadata, snapshot_id, base, removed=removed, commit_id=commit_id, sketched=sketched
        )
    except SketchUnreadable as error:
        # A sketch the base claims is gone or unreadable (removed by hand, half copied): this version goes
        # without sketches (readers then read the ids); the commit does not fail for an index.
        log.warning("%s; table version %d is written without id sketches", error, snapshot_id)
        sketched = False
        removed_files, merged = _rewritten(
            cache, metadata, snapshot_id, base, removed=removed, commit_id=commit_id, sketched=False
        )
    if sketched:
        snapshot_properties = {**snapshot_properties, SKETCHED: "true"}
    manifests = [*([added.manifest] if added.manifest is not None else []), *merged]
    manifest_list = _metadata_path(metadata, f"snap-{snapshot_id}-0-{commit_id}.avro")
    with write_manifest_list(
        format_version=metadata.format_version,
        output_file=io.new_output(manifest_list),
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent.snapshot_id if parent else None,
        sequence_number=sequence_number,
        avro_compression=AVRO_COMPRESSION,
    ) as writer:
        writer.add_manifests(manifests)

    collector = SnapshotSummaryCollector()
    schema, spec = metadata.schema(), metadata.spec()
    for data_file in data_files:
        collector.add_file(data_file=data_file, partition_spec=spec, schema=schema)
    for data_file in removed_files:
        collector.remove_file(data_file=data_file, partition_spec=spec, schema=schema)
    if operation is None:
        operation = (Operation.OVERWRITE if data_files else Operation.DELETE) if removed_files else Operation.APPEND
    # pyiceberg 0.12 totals only append, overwrite and delete summaries (table/snapshots.py,
    # update_snapshot_summaries): a replace is totalled as an overwrite, then named for what it is.
    totalled = Operation.OVERWRITE if operation == Operation.REPLACE else operation
    summary = update_snapshot_summaries(
        summary=Summary(operation=totalled, **collector.build(), **snapshot_properties),
        previous_summary=parent.summary if parent is not None else None,
    )
    if summary.operation != operation:
        summary = Summary(operation=operation, **summary.additional_properties)
    snapshot = Snapshot(
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent.snapshot_id if parent else None,
        manifest_list=manifest_list,
        sequence_number=sequence_number,
        summary=summary,
        schema_id=metadata.current_schema_id,
    )
    updates: tuple[TableUpdate, ...] = (
        AddSnapshotUpdate(snapshot=snapshot),
        SetSnapshotRefUpdate(
            snapshot_id=snapshot_id,
            parent_snapshot_id=parent.snapshot_id if parent else None,
            ref_name=MAIN_BRANCH,
            type=SnapshotRefType.BRANCH,
            max_ref_age_ms=None,
            max_snapshot_age_ms=None,
            min_snapshots_to_keep=None,
        ),
    )
    requirement = AssertRefSnapshotId(snapshot_id=parent.snapshot_id if parent else None, ref=MAIN_BRANCH)
    return updates, requirement, added


def schema_union_updates(table: Table, schema: pa.Schema) -> tuple[tuple[TableUpdate, ...], TableMetadata]:
    """The updates of a schema union (and the name mapping that follows it) and the metadata after them."""
    transaction = table.transaction()
    with transaction.update_schema() as update:
        update.union_by_name(schema)
    if transaction.table_metadata.default_sort_order_id == UNSORTED_SORT_ORDER_ID and HILBERT in schema.names:
        # A table made before floe stored the key: the batch that adds the column records the order its files follow.
        with transaction.update_sort_order() as order:
            for name, transform, null_order in sort_order_columns():
                order.asc(name, transform, null_order)
    return transaction_updates(transaction), transaction.table_metadata
