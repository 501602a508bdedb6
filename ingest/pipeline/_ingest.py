"""Batch ingestion of STAC items (metadata only): read, validate, commit every N items."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ingest.errors import FloeError, InvalidItem, InvalidSource
from ingest.pipeline._sources import SourcedItem, read_items
from ingest.repository import CommitResult, Repository, Writer

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
    """Granules whose arrays were in the repository already."""
    bytes_written: int = 0
    """Uncompressed pixel bytes copied into arrays."""

    @property
    def rows_added(self) -> int:
        return sum(commit.rows_added for commit in self.commits)

    @property
    def conflicts_retried(self) -> int:
        return sum(commit.attempts - 1 for commit in self.commits)

    def write_report(self, path: Path) -> None:
        """The rejections as JSON lines."""
        with path.open("w", encoding="utf-8") as stream:
            for rejection in self.rejected:
                stream.write(json.dumps(rejection.to_json()) + "\n")


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
    """Ingest every item found in ``sources``, one commit per ``batch_size`` valid items.

    Bad input (unreadable files, invalid items, ids repeated within the run) is
    rejected with its source named; everything else is committed.
    """
    batch_size = batch_size or repository.settings.batch_size
    message = message or "floe ingest"
    report = IngestReport()
    seen: dict[tuple[str, str], str] = {}
    writer: Writer | None = None

    def flush() -> None:
        nonlocal writer
        if writer is not None and writer.pending_items:
            number = len(report.commits) + 1
            result = writer.commit(f"{message} (batch {number})")
            report.commits.append(result)
            log.info("committed %d items as %s (%d attempts)", result.rows_added, result.snapshot_id, result.attempts)
            if progress:
                progress(report)
        writer = None

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
        if writer is None:
            writer = repository.writer(branch)
        item = sourced.item
        try:
            writer.add_item(item, source=sourced.source, default_collection=default_collection)
        except (InvalidItem, InvalidSource) as error:
            report.rejected.append(_rejection(error, sourced.source))
        else:
            key = (item.get("collection") or default_collection, item["id"])
            if key in seen:
                # The writer only sees its own batch; an id repeated across batches of one run is refused too.
                writer.discard_item(*key)
                report.rejected.append(
                    Rejection(sourced.source, item["id"], f"duplicate id (first seen in {seen[key]})")
                )
            else:
                seen[key] = sourced.source
        if progress:
            progress(report)
        if writer.pending_items >= batch_size:
            flush()
    flush()
    return report
