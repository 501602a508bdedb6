"""Compaction: a partition's small, scattered files rewritten as a few clustered ones, in one hybrid commit.

:func:`select` picks the partitions due (size-tiered, :class:`CompactionPolicy`), :func:`compact` rewrites a
partition's rows as a run along the Hilbert curve, and :func:`optimize` lands the Iceberg ``replace``
(:class:`CompactionPlan`) through the commit protocol. The policy, and what happens next to other writers:
docs/lifecycle.md#table-layout-and-compaction-floe-optimize and docs/design.md §3 (compaction).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFile
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update import AssertTableUUID

from ingest.repository._append import AddedManifest, ManifestCache, plan_commit
from ingest.repository._commit import AppliedChange, Base, TableChange, commit_change
from ingest.repository._files import Run, StagedFile, data_file_path, month_label, run_of, stage, to_data_file
from ingest.repository._history import writable_session
from ingest.stac import HILBERT, clustered

if TYPE_CHECKING:
    from pyiceberg.io import FileIO
    from pyiceberg.table import Table

    from ingest.repository._catalog import PointerCatalog
    from ingest.repository._repo import Repository

PartitionKey = tuple[str, int | None]


@dataclass(frozen=True)
class CompactionPolicy:
    """Which partitions a compaction rewrites, and into files of what size."""

    target_file_rows: int = 10_000
    """Rows per compacted file (a run's files are split evenly, none larger)."""
    small_files: int = 16
    """Level-0 files (batches' own files) that make a partition due."""
    fan_in: int = 4
    """Runs of one level above 0 that make a partition due."""
    full: bool = False
    """Make every partition of more than one run one run, whatever the thresholds say."""
    collections: frozenset[str] | None = None
    """Only these collections (None: every collection)."""


@dataclass(frozen=True)
class Selection:
    """One partition's files chosen for one compaction, and the level of the run they make."""

    key: PartitionKey
    sources: tuple[DataFile, ...]
    level: int

    @property
    def rows(self) -> int:
        return sum(data_file.record_count for data_file in self.sources)

    @property
    def label(self) -> str:
        """``collection/YYYY-MM``, as messages name a partition."""
        collection, month = self.key
        return f"{collection}/{month_label(month)}"

    @property
    def size(self) -> int:
        return sum(data_file.file_size_in_bytes for data_file in self.sources)


def _runs(files: list[DataFile]) -> dict[str, tuple[int, list[DataFile]]]:
    """The runs of one partition's files: run id -> (level, files); each batch's file is a level-0 run of its own."""
    runs: dict[str, tuple[int, list[DataFile]]] = {}
    for data_file in files:
        run = run_of(data_file.file_path)
        if run is None:
            runs[data_file.file_path] = (0, [data_file])
        else:
            runs.setdefault(run.run_id, (run.level, []))[1].append(data_file)
    return runs


def _select_partition(key: PartitionKey, files: list[DataFile], policy: CompactionPolicy) -> Selection | None:
    runs = _runs(files)
    if len(runs) < 2:
        return None
    by_level: dict[int, int] = {}
    for level, _ in runs.values():
        by_level[level] = by_level.get(level, 0) + 1
    if policy.full:
        top = max(by_level)
    else:
        due = [
            level
            for level, count in sorted(by_level.items())
            if count >= (policy.small_files if level == 0 else policy.fan_in)
        ]
        if not due:
            return None
        top = due[0]
    sources = tuple(
        sorted(
            (data_file for level, members in runs.values() if level <= top for data_file in members),
            key=lambda data_file: data_file.file_path,
        )
    )
    if len(sources) < 2 and not policy.full:
        return None
    return Selection(key, sources, top + 1)


def select(
    live: Mapping[str, DataFile], policy: CompactionPolicy, only: Collection[PartitionKey] | None = None
) -> list[Selection]:
    """The partitions of a table version (its live files) that ``policy`` compacts, with their files."""
    partitions: dict[PartitionKey, list[DataFile]] = {}
    for data_file in live.values():
        key: PartitionKey = (data_file.partition[0], data_file.partition[1])
        if policy.collections is not None and key[0] not in policy.collections:
            continue
        if only is not None and key not in only:
            continue
        if data_file.record_count > 0:
            partitions.setdefault(key, []).append(data_file)
    selections = []
    for key in sorted(partitions, key=_order):
        selection = _select_partition(key, partitions[key], policy)
        if selection is not None:
            selections.append(selection)
    return selections


def _read(io: FileIO, data_file: DataFile) -> pa.Table:
    with io.new_input(data_file.file_path).open() as stream:
        return pq.read_table(stream).replace_schema_metadata(None)


def compact(
    io: FileIO, table_location: str, selection: Selection, target_file_rows: int, *, with_key: bool = True
) -> list[StagedFile]:
    """Write the rows of ``selection``'s files as one run: sorted along the curve, split evenly into files.

    ``with_key``: the table has the ``floe:hilbert`` column (one made before
    it gets the column from its next ingest, not from a compaction).
    """
    # Files written before a column existed lack it; struct columns may have grown: unify, filling nulls.
    rows = pa.concat_tables([_read(io, data_file) for data_file in selection.sources], promote_options="permissive")
    rows = clustered(rows, with_key=with_key)
    count = max(1, math.ceil(rows.num_rows / target_file_rows))
    per_file = math.ceil(rows.num_rows / count)
    run = Run(selection.level, uuid.uuid4().hex)
    collection, month = selection.key
    staged = []
    for start in range(0, rows.num_rows, per_file):
        path = data_file_path(table_location, collection, month, run)
        staged.append(stage(io, path, rows.slice(start, per_file), selection.key))
    return staged


@dataclass
class PartitionCompaction:
    """One partition's compaction as planned on one table version: the files it replaces, and their rewrite."""

    selection: Selection
    outputs: list[StagedFile]

    @property
    def label(self) -> str:
        return self.selection.label


@dataclass
class CompactionSummary:
    """What a compaction rewrote, partition by partition."""

    partitions: list[PartitionCompaction] = field(default_factory=list)
    replanned: int = 0
    """Partitions compacted again because a concurrent commit changed their files."""

    @property
    def files_before(self) -> int:
        return sum(len(part.selection.sources) for part in self.partitions)

    @property
    def files_after(self) -> int:
        return sum(len(part.outputs) for part in self.partitions)

    @property
    def bytes_before(self) -> int:
        return sum(part.selection.size for part in self.partitions)

    @property
    def bytes_after(self) -> int:
        return sum(staged.size for part in self.partitions for staged in part.outputs)

    @property
    def rows(self) -> int:
        return sum(part.selection.rows for part in self.partitions)


ProgressCallback = Callable[[PartitionCompaction], None]


class CompactionPlan(TableChange):
    """Compaction of the partitions a policy selects, as one table change replayable on any base."""

    def __init__(
        self,
        io: FileIO,
        catalog: PointerCatalog,
        manifests: ManifestCache,
        policy: CompactionPolicy,
        *,
        message: str,
        progress: ProgressCallback | None = None,
        selected: tuple[str, list[Selection]] | None = None,
    ) -> None:
        """``selected``: the selections already made at a table version (its metadata location), to reuse."""
        self._io = io
        self._selected = selected
        self._catalog = catalog
        self._manifests = manifests
        self._policy = policy
        self._message = message
        self._progress = progress
        self._added: AddedManifest | None = None
        self.summary = CompactionSummary()
        self._planned: dict[PartitionKey, PartitionCompaction] = {}

    def _compact(self, table: Table, selection: Selection) -> PartitionCompaction:
        with_key = HILBERT in table.schema().column_names
        outputs = compact(self._io, table.location(), selection, self._policy.target_file_rows, with_key=with_key)
        compaction = PartitionCompaction(selection, outputs)
        if self._progress is not None:
            self._progress(compaction)
        return compaction

    def prepare(self, base: Base) -> None:
        """Select the partitions due at the writer's base and write their runs."""
        table = base.table()
        if self._selected is not None and self._selected[0] == base.metadata_location:
            selections = self._selected[1]
        else:
            selections = select(self._manifests.live_files(table.metadata), self._policy)
        for selection in selections:
            self._planned[selection.key] = self._compact(table, selection)

    def apply(self, base: Base) -> AppliedChange:
        """Re-plan the partitions whose files the base changed, then write the ``replace`` snapshot."""
        table = base.table()
        live = self._manifests.live_files(table.metadata)
        stale = [
            key
            for key, planned in self._planned.items()
            if any(data_file.file_path not in live for data_file in planned.selection.sources)
        ]
        for key in stale:
            # A concurrent commit removed a file being compacted (it replaced rows in it, or compacted it):
            # the rows of this partition are what the base says now; compact them again from there.
            del self._planned[key]
            self.summary.replanned += 1
        for selection in select(live, self._policy, only=stale):
            self._planned[selection.key] = self._compact(table, selection)
        self.summary.partitions = [self._planned[key] for key in sorted(self._planned, key=_order)]
        if not self._planned:
            return AppliedChange(table.metadata_location)
        metadata = table.metadata
        outputs = [staged for part in self.summary.partitions for staged in part.outputs]
        removed = [data_file.file_path for part in self.summary.partitions for data_file in part.selection.sources]
        properties = {
            "floe.message": self._message[:200],
            "floe.compacted-partitions": str(len(self._planned)),
        }
        updates, head, self._added = plan_commit(
            metadata,
            [to_data_file(staged, metadata) for staged in outputs],
            self._manifests,
            properties,
            previous=self._added,
            removed=removed,
            operation=Operation.REPLACE,
            fingerprints={staged.path: staged.fingerprints for staged in outputs},
        )
        requirements = (AssertTableUUID(uuid=metadata.table_uuid), head)
        return AppliedChange(self._catalog.commit_table(table, requirements, updates).metadata_location)


def _order(key: PartitionKey) -> tuple[str, int]:
    return key[0], -1 if key[1] is None else key[1]


@dataclass(frozen=True)
class OptimizeResult:
    """What ``optimize`` did (or, with ``dry_run``, would do) on a branch."""

    branch: str
    selections: list[Selection]
    """The partitions due at the branch tip when it started, and their files."""
    summary: CompactionSummary | None
    """What was rewritten (None: nothing was due, or a dry run)."""
    snapshot_id: str | None = None
    attempts: int = 0
    dry_run: bool = False

    @property
    def files_before(self) -> int:
        if self.summary is not None:
            return self.summary.files_before
        return sum(len(selection.sources) for selection in self.selections)


def optimize(
    repository: Repository,
    branch: str,
    policy: CompactionPolicy,
    *,
    dry_run: bool = False,
    message: str = "floe optimize",
    progress: ProgressCallback | None = None,
) -> OptimizeResult:
    """Compact the partitions of ``branch`` that ``policy`` selects, in one commit next to any running writers."""
    session = writable_session(repository, branch)
    base = Base.at(repository, session.snapshot_id)
    manifests = repository.manifests
    selections = select(manifests.live_files(base.table().metadata), policy)
    if dry_run or not selections:
        return OptimizeResult(branch, selections, None, dry_run=dry_run)
    plan = CompactionPlan(
        repository.io,
        repository.catalog,
        manifests,
        policy,
        message=message,
        progress=progress,
        selected=(base.metadata_location or "", selections),
    )
    landed = commit_change(repository, session, branch, message, plan)
    return OptimizeResult(branch, selections, plan.summary, landed.snapshot_id, landed.attempts)
