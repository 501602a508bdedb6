"""Batch ingestion of STAC items (metadata only): read, validate, commit every N items."""

from __future__ import annotations

import gc
import json
import logging
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ingest.errors import CommitConflict, FloeError, InvalidItem, InvalidRaster, InvalidSource
from ingest.pipeline._granules import Granule, describe_source, sources_unchanged
from ingest.pipeline._sources import SourcedItem, read_items
from ingest.repository import CommitResult, Repository, Writer
from ingest.stac import (
    ARRAYS_ASSET,
    arrays_asset,
    item_as_dict,
    paused_collection,
    read_arrays_asset,
    unparseable_geometries,
    validate_item,
    with_arrays_asset,
    without_arrays_asset,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rejection:
    """One input that was not ingested, and why."""

    source: str
    item_id: str | None
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "id": self.item_id, "reason": self.reason}

    def __str__(self) -> str:
        what = f"item {self.item_id!r} " if self.item_id else ""
        return f"{self.source}: {what}{self.reason}"


@dataclass
class IngestReport:
    """What an ingest run did."""

    items_read: int = 0
    commits: list[CommitResult] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    skipped: int = 0
    """Items (and their arrays) that were in the repository already, unchanged."""
    replaced: int = 0
    """Items whose row (and arrays, if their rasters changed) replaced an older version."""
    replans: int = 0
    """Batches planned again because another writer changed the same items' arrays first."""
    virtual: int = 0
    """Granules whose rasters are referenced in place (``--virtual``), not copied."""
    fallbacks: list[Rejection] = field(default_factory=list)
    """Granules ``--virtual`` had to copy, and why."""
    bytes_written: int = 0
    """Uncompressed pixel bytes copied into arrays."""

    @property
    def rows_added(self) -> int:
        return sum(commit.rows_added for commit in self.commits)

    @property
    def conflicts_retried(self) -> int:
        return sum(commit.attempts - 1 for commit in self.commits)

    def write_report(self, path: Path) -> None:
        """The rejections (``"outcome": "rejected"``) and virtual fallbacks (``"copied"``) as JSON lines."""
        with path.open("w", encoding="utf-8") as stream:
            for rejection in self.rejected:
                stream.write(json.dumps({**rejection.to_json(), "outcome": "rejected"}) + "\n")
            for fallback in self.fallbacks:
                stream.write(json.dumps({**fallback.to_json(), "outcome": "copied"}) + "\n")


ProgressCallback = Callable[[IngestReport], None]


def store_collection(repository: Repository, sourced: SourcedItem, report: IngestReport, branch: str | None) -> None:
    """Keep a STAC Collection found in the sources with the repository; a bad one is a rejection."""
    assert sourced.collection is not None
    try:
        repository.store_collection(sourced.collection, branch=branch)
    except FloeError as error:
        report.rejected.append(Rejection(sourced.source, sourced.collection.get("id"), str(error)))


def _rejection(error: Exception, source: str) -> Rejection:
    if isinstance(error, InvalidItem):
        return Rejection(error.source or source, error.item_id, error.reason)
    return Rejection(source, None, str(error))


@dataclass
class BatchOutcome:
    """What one batch did."""

    commit: CommitResult | None
    rejected: list[Rejection] = field(default_factory=list)
    skipped: int = 0
    granules: int = 0
    replaced: int = 0
    bytes_written: int = 0
    replans: int = 0
    virtual: int = 0
    fallbacks: list[Rejection] = field(default_factory=list)


VALIDATION_CHUNK = 2048
"""Items validated together (their geometries parsed in one vectorized call)."""

REPLANS = 3
"""How often a batch is planned again after another writer changed the same item's arrays first."""


def commit_batch(
    repository: Repository, branch: str, granules: list[Granule], message: str, *, virtual: bool = False
) -> BatchOutcome:
    """Stage a batch's new and changed granules (arrays and rows) and commit them; unchanged ones are skipped.

    Every row is staged as a replacement, so the table keeps one version per
    item even when other writers ingest the same items meanwhile. Two writers
    rewriting one item's arrays cannot be merged: the loser plans its batch
    again on the winner's version (a bounded number of times). With
    ``virtual``, rasters are referenced in place where they can be and copied
    where they cannot (``fallbacks`` says which and why).
    """
    for attempt in range(1, REPLANS + 1):
        try:
            outcome = _commit_batch_once(repository, branch, granules, message, virtual=virtual)
        except CommitConflict:
            if attempt == REPLANS:
                raise
            log.info("batch %r met another writer on the same items; planning it again", message)
            continue
        outcome.replans = attempt - 1
        return outcome
    raise AssertionError("unreachable")


@dataclass
class _Step:
    """What a batch does with one granule, decided before any raster is read."""

    granule: Granule
    previous: dict[str, Any] | None
    arrays: dict[str, Any] | None
    """The ``floe:arrays`` asset the row keeps (the stored one until the rasters are written again)."""
    write_rasters: bool


READ_AHEAD = 1
"""Granules whose rasters are read (and hashed) on a second thread while the current one is written."""


def _plan_steps(writer: Writer, granules: list[Granule]) -> tuple[list[_Step], int]:
    """Each granule's step, and how many are in the repository unchanged (skipped: a re-run commits nothing)."""
    stored = writer.stored_items((granule.item["collection"], granule.item["id"]) for granule in granules)
    steps: list[_Step] = []
    skipped = 0
    for granule in granules:
        item = granule.item
        group = f"{item['collection']}/{item['id']}"
        previous = stored.get((item["collection"], item["id"]))
        stored_arrays = read_arrays_asset(previous) if previous is not None else None
        # The row keeps its stored asset as it is until the rasters are written again.
        arrays = ((previous or {}).get("assets") or {}).get(ARRAYS_ASSET) if stored_arrays is not None else None
        # Without rasters selected this run, arrays already in the repository are kept as they are.
        same_rasters = not granule.rasters or (
            stored_arrays is not None
            and writer.group_exists(group)
            and sources_unchanged(stored_arrays.sources, granule.rasters, virtual=stored_arrays.virtual)
        )
        if previous is not None and same_rasters and without_arrays_asset(previous) == without_arrays_asset(item):
            skipped += 1
            continue
        steps.append(_Step(granule, previous, arrays, write_rasters=bool(granule.rasters) and not same_rasters))
    return steps, skipped


def _read_copy(rasters: dict[str, str]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """A copy's inputs, read off the writing thread: each raster's fingerprint, then its pixels."""
    from ingest.rasters import read_assets

    return _fingerprints(rasters), read_assets(rasters)


def _fingerprints(rasters: dict[str, str], *, digest: bool = True) -> dict[str, dict[str, Any]]:
    """:func:`describe_source` of each raster; a file that vanished or cannot be opened is an InvalidRaster."""
    described = {}
    for key, path in rasters.items():
        try:
            described[key] = describe_source(path, digest=digest)
        except OSError as error:
            raise InvalidRaster(f"granule {path} cannot be read: {error.strerror or error}", path=path) from error
    return described


class _ReadAhead:
    """:func:`_read_copy` of the steps that copy rasters, in order, on a second thread, ``READ_AHEAD`` in flight."""

    def __init__(self, pool: ThreadPoolExecutor, steps: list[_Step]) -> None:
        self._pool = pool
        self._todo = iter([step.granule.rasters for step in steps if step.write_rasters])
        self._pending: deque[Future[Any]] = deque()

    def next(self) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
        """The next copy's fingerprints and pixels; raises what reading it raised (InvalidRaster)."""
        while len(self._pending) <= READ_AHEAD:
            rasters = next(self._todo, None)
            if rasters is None:
                break
            self._pending.append(self._pool.submit(_read_copy, rasters))
        return self._pending.popleft().result()

    def cancel(self) -> None:
        """Drop the reads not started yet (a batch that failed will not write them)."""
        for future in self._pending:
            future.cancel()


def _commit_batch_once(
    repository: Repository, branch: str, granules: list[Granule], message: str, *, virtual: bool
) -> BatchOutcome:
    writer = repository.writer(branch)
    steps, skipped = _plan_steps(writer, granules)
    outcome = BatchOutcome(commit=None, skipped=skipped)
    # Copies read the next granule's rasters (GDAL decodes without the GIL) while this one is written.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="floe-read") as pool:
        reads = _ReadAhead(pool, [] if virtual else steps)
        try:
            for step in steps:
                _stage(writer, step, outcome, reads, virtual=virtual)
        finally:
            reads.cancel()
    if writer.pending_items or writer.session.has_uncommitted_changes:
        outcome.commit = writer.commit(message)
    return outcome


def _stage(writer: Writer, step: _Step, outcome: BatchOutcome, reads: _ReadAhead, *, virtual: bool) -> None:
    """Stage one granule's arrays (when its rasters are new or changed) and row; bad input becomes a rejection."""
    granule, arrays = step.granule, step.arrays
    item = granule.item
    group = f"{item['collection']}/{item['id']}"
    try:
        if step.write_rasters:
            from ingest.rasters import write_granule, write_virtual_or_copy

            referenced = False
            if virtual:
                sources = _fingerprints(granule.rasters, digest=False)
                stored_as = write_virtual_or_copy(writer.store, group, granule.rasters)
                written, referenced = stored_as.arrays, stored_as.virtual
                if stored_as.fallback is not None:
                    outcome.fallbacks.append(Rejection(granule.source, item["id"], stored_as.fallback))
                # A reference is stale after any change to its file; only a copy is worth a digest.
                if not referenced:
                    sources = _fingerprints(granule.rasters)
            else:
                sources, read = reads.next()
                written = write_granule(writer.store, group, granule.rasters, read=read)
            arrays = arrays_asset(group, sorted(written.variables), sources, virtual=referenced)
            outcome.bytes_written += written.bytes_written
            outcome.virtual += referenced
        if arrays is not None:
            item = with_arrays_asset(item, arrays)
        writer.add_item(item, source=granule.source, replace=True, validated=True)
        outcome.granules += 1
        outcome.replaced += step.previous is not None
    except (InvalidItem, InvalidRaster) as error:
        outcome.rejected.append(Rejection(granule.source, item["id"], getattr(error, "reason", str(error))))


def record(report: IngestReport, outcome: BatchOutcome) -> None:
    """Add a batch's outcome to the run's report."""
    report.rejected.extend(outcome.rejected)
    report.skipped += outcome.skipped
    report.replaced += outcome.replaced
    report.replans += outcome.replans
    report.bytes_written += outcome.bytes_written
    report.virtual += outcome.virtual
    report.fallbacks.extend(outcome.fallbacks)
    if outcome.commit is not None:
        report.commits.append(outcome.commit)


def ingest_items(
    repository: Repository,
    sources: Iterable[str | Path],
    *,
    branch: str | None = None,
    batch_size: int | None = None,
    message: str | None = None,
    default_collection: str | None = None,
    progress: ProgressCallback | None = None,
) -> IngestReport:
    """Ingest every item found in ``sources`` in this process (metadata only), one commit per ``batch_size`` items.

    Bad input (unreadable files, invalid items, ids repeated within the run) is
    rejected with its source named; everything else is committed. Items the
    branch holds already, unchanged, are skipped; changed ones replace their row.
    """
    branch = branch or repository.settings.branch
    batch_size = batch_size or repository.settings.batch_size
    message = message or "floe ingest"
    report = IngestReport()
    seen: dict[tuple[str, str], str] = {}
    batch: list[Granule] = []

    def flush() -> None:
        if batch:
            number = len(report.commits) + 1
            outcome = commit_batch(repository, branch, batch, f"{message} (batch {number})")
            record(report, outcome)
            if outcome.commit is not None:
                result = outcome.commit
                log.info(
                    "committed %d items as %s (%d attempts)", result.rows_added, result.snapshot_id, result.attempts
                )
            if progress:
                progress(report)
        batch.clear()
        gc.collect()

    pending: list[SourcedItem] = []

    def drain() -> None:
        """Validate the pending items (geometries in one vectorized parse), then batch them in order."""
        checked: list[tuple[SourcedItem, dict[str, Any] | InvalidItem | InvalidSource]] = []
        for sourced in pending:
            try:
                item = validate_item(
                    item_as_dict(sourced.item),
                    source=sourced.source,
                    default_collection=default_collection,
                    check_geometry=False,
                )
            except (InvalidItem, InvalidSource) as error:
                checked.append((sourced, error))
            else:
                checked.append((sourced, item))
        valid = [index for index, (_, outcome) in enumerate(checked) if isinstance(outcome, dict)]
        for position in unparseable_geometries([checked[index][1] for index in valid]):  # type: ignore[misc]
            sourced, _ = checked[valid[position]]
            try:  # the item-by-item parse names the problem
                validate_item(item_as_dict(sourced.item), source=sourced.source, default_collection=default_collection)
            except (InvalidItem, InvalidSource) as error:
                checked[valid[position]] = (sourced, error)
        pending.clear()
        for sourced, outcome in checked:
            if not isinstance(outcome, dict):
                report.rejected.append(_rejection(outcome, sourced.source))
                continue
            key = (outcome["collection"], outcome["id"])
            if key in seen:
                report.rejected.append(
                    Rejection(sourced.source, outcome["id"], f"duplicate id (first seen in {seen[key]})")
                )
                continue
            seen[key] = sourced.source
            batch.append(Granule(item=outcome, source=sourced.source))
            if len(batch) >= batch_size:
                flush()
        if progress:
            progress(report)

    # Reading and validating allocate millions of small acyclic objects; Python's cyclic collector would walk
    # the whole pending batch again and again. Pause it while a batch fills, and collect once per batch.
    with paused_collection():
        for sourced in read_items(sources):
            if sourced.collection is not None:
                store_collection(repository, sourced, report, branch)
                continue
            if sourced.error is not None:
                report.rejected.append(_rejection(sourced.error, sourced.source))
                if progress:
                    progress(report)
                continue
            report.items_read += 1
            pending.append(sourced)
            if len(pending) >= VALIDATION_CHUNK:
                drain()
        drain()
    flush()
    return report
