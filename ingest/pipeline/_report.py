"""What an ingest run reports: what it committed, what it skipped, and every input it rejected (and why)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ingest.repository import CommitResult, OptimizeResult
from ingest.stac import one_line, shorten, shown

SHOWN_SOURCE = 300
"""Characters of a source label a rejection prints (a path, and a line or feature number)."""
SHOWN_REASON = 500
"""Characters of a reason a rejection prints (a GDAL or GEOS message can be long)."""


@dataclass(frozen=True)
class Rejection:
    """One input that was not ingested, and why."""

    source: str
    item_id: str | None
    reason: str

    @classmethod
    def of(cls, error: Exception, source: str, item_id: str | None = None) -> Rejection:
        """The rejection an error means: the source, item and reason it names (else ``source`` and its message)."""
        return cls(
            getattr(error, "source", None) or source,
            getattr(error, "item_id", None) or item_id,
            getattr(error, "reason", None) or str(error),
        )

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "id": self.item_id, "reason": self.reason}

    def __str__(self) -> str:
        """One line: the source, the item (its id cut short if huge) and the reason, control characters escaped."""
        what = f"item {shown(self.item_id)} " if self.item_id else ""
        return one_line(f"{shorten(self.source, SHOWN_SOURCE)}: {what}{shorten(self.reason, SHOWN_REASON)}")


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
    compactions: list[OptimizeResult] = field(default_factory=list)
    """Compactions of the partitions the run made due (``[optimize]`` thresholds)."""
    compaction_errors: list[str] = field(default_factory=list)
    stages: dict[str, float] = field(default_factory=dict)
    """Seconds per stage of an in-process ingest (``ingest._stages``: parse, validate, to Arrow, write, commit);
    summed over the actors for a metadata backfill; empty for a Ray ingest that copies rasters."""
    seconds: float = 0.0
    """Wall seconds of the run the stages were measured over (a backfill: its actors' seconds, summed)."""
    prune_skipped: str | None = None
    """Why ``--prune`` deleted nothing although asked to (some input could not be read), or None."""
    landed_sink: TextIO | None = field(default=None, repr=False)
    """Where each committed granule is written as it lands (``--report``), as a JSON line: its source, id,
    snapshot and the Ray node whose actor wrote it. Streamed, so a run of millions keeps no list of them."""

    @property
    def pruned(self) -> int:
        """Items ``--prune`` deleted (the sources no longer hold them)."""
        return sum(commit.rows_deleted for commit in self.commits)

    @property
    def rows_added(self) -> int:
        return sum(commit.rows_added for commit in self.commits)

    @property
    def conflicts_retried(self) -> int:
        return sum(commit.attempts - 1 for commit in self.commits)

    def write_report(self, path: Path, *, append: bool = False) -> None:
        """The rejections (``"outcome": "rejected"``) and virtual fallbacks (``"copied"``) as JSON lines.

        With ``append``, after the committed granules :attr:`landed_sink` wrote there.
        """
        with path.open("a" if append else "w", encoding="utf-8") as stream:
            for rejection in self.rejected:
                stream.write(json.dumps({**rejection.to_json(), "outcome": "rejected"}) + "\n")
            for fallback in self.fallbacks:
                stream.write(json.dumps({**fallback.to_json(), "outcome": "copied"}) + "\n")


ProgressCallback = Callable[[IngestReport], None]
"""Called with the run's report as it grows (the CLI draws its progress bar from it)."""


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
    landed: list[tuple[str, str, str]] = field(default_factory=list)
    """(source, collection, id) of each granule staged: committed with the batch's commit."""
    node: str | None = None
    """The Ray node whose actor committed the batch (None: the driver's own process)."""


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
        if report.landed_sink is not None:
            snapshot, node = outcome.commit.snapshot_id, outcome.node
            for source, collection, item_id in outcome.landed:
                line = {"outcome": "committed", "source": source, "collection": collection, "id": item_id}
                line.update(snapshot=snapshot, **({"node": node} if node is not None else {}))
                report.landed_sink.write(json.dumps(line) + "\n")
