"""A metadata backfill on Ray: the sources cut into parts, each read, checked and committed by an actor.

Where a run copies no rasters (``floe ingest --assets none``), the driver has nothing to do but read, and one
process reads no faster than one core parses. So :func:`backfill_with_ray` cuts the sources into parts
(:func:`~ingest.pipeline.sources.split_sources`: byte ranges of NDJSON, runs of rows of stac-geoparquet,
small files several together) and gives these shares, one at a time, to :class:`PartIngester` actors. Each reads
its share as sources of its own and ingests them as :func:`~ingest.pipeline.ingest_items` does (checks,
de-duplication within the share, data files written by the actor, one commit per batch through the commit
protocol, racing the other actors' commits); the driver only plans, numbers and gathers.
docs/ingest.md#a-metadata-backfill-on-a-cluster.

Rejections name the file's own lines and rows (an NDJSON part's first line number is counted by the actors
first) and come back in the sources' order. What differs from one reader: an id repeated in two shares is not
rejected as a duplicate; the table still holds it once (every row is staged as a replacement), as the share whose
commit landed last has it.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TextIO

from ingest._stages import budget
from ingest.config import Settings
from ingest.errors import FloeError
from ingest.pipeline._compact import AutoCompactor
from ingest.pipeline._ingest import ingest_items
from ingest.pipeline._report import BatchOutcome, IngestReport, ProgressCallback
from ingest.pipeline.sources import (
    ApiSearch,
    SearchLane,
    SourceName,
    SourceOptions,
    SourcePart,
    count_lines,
    cursor_metadata,
    merged_searches,
    numbered,
)
from ingest.repository import Repository

log = logging.getLogger(__name__)


@dataclass
class PartOutcome:
    """What an actor's ingest of one part did."""

    report: IngestReport
    landed: str = ""
    """The JSON lines of the items it committed (``--report`` only)."""
    node: str | None = None
    """The Ray node the actor ran on."""
    searches: list[ApiSearch] = field(default_factory=list)
    """The lanes of STAC API searches it read, with what it counted of them (their cursor is the driver's)."""


class PartIngester:
    """The work of one Ray actor of a backfill: open the repository once, then ingest parts of the sources."""

    def __init__(self, root: str, settings: dict[str, Any], branch: str, options: SourceOptions) -> None:
        self.repository = Repository.open(root, Settings.model_validate(settings))
        self.branch = branch
        self.options = options

    def count_lines(self, part: SourcePart) -> int:
        """The lines of an NDJSON part (0 if it cannot be read: ingesting it says why)."""
        try:
            return count_lines(part, self.options)
        except Exception:  # noqa: BLE001 - the part's own read reports the failure, by its name
            return 0

    def ingest(
        self,
        share: list[SourceName],
        message: str,
        batch_size: int | None,
        default_collection: str | None,
        keep_landed: bool,
    ) -> PartOutcome:
        import ray

        sink = io.StringIO() if keep_landed else None
        options = replace(self.options, searches=[])
        report = ingest_items(
            self.repository,
            share,
            branch=self.branch,
            batch_size=batch_size,
            message=message,
            default_collection=default_collection,
            options=options,
            report_to=sink,
            compact=False,
        )
        report.landed_sink = None
        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        return PartOutcome(report, sink.getvalue() if sink is not None else "", node, options.searches)


def backfill_with_ray(
    repository: Repository,
    shares: Sequence[list[SourceName]],
    *,
    workers: int,
    branch: str,
    batch_size: int | None = None,
    message: str = "floe ingest",
    default_collection: str | None = None,
    progress: ProgressCallback | None = None,
    options: SourceOptions,
    report_to: TextIO | None = None,
) -> IngestReport:
    """Ingest ``shares`` (metadata only) with ``workers`` Ray actors, each committing its share's batches itself.

    Ray is initialized already (``ingest_with_ray`` starts or joins it); the actors are stopped at the end.

    Args:
        repository: the repository to ingest into.
        shares: what :func:`~ingest.pipeline.sources.split_sources` planned.
        workers: the actors (one CPU each).
        branch: the branch the actors commit to.
        batch_size: items per commit of each actor (default: an in-process ingest's, ``ingest_items``).
        message: the commit message, each batch's followed by `` (share N) (batch M)``.
        default_collection: the collection of items that name none.
        progress: called with the run's report as shares land.
        options: how to reach remote sources (shipped to the actors without its open stores).
        report_to: gets a JSON line per committed item, naming the node whose actor committed it.

    Returns:
        What the run did; rejections in the sources' order; ``stages`` summed over the actors.

    Raises:
        CommitConflict, ConflictRetriesExhausted: an actor's batch could not be committed (batches committed before
            stay).
    """
    import ray

    report = IngestReport(landed_sink=report_to)
    if not shares:
        return report
    actor_class: Any = ray.remote(num_cpus=1)(PartIngester)
    settings, url = repository.settings.model_dump(), repository.location.url
    shipped = replace(options, searches=[])
    actors = [actor_class.remote(url, settings, branch, shipped) for _ in range(workers)]
    compactor = AutoCompactor(repository, branch, report)
    try:
        numbered_shares = _numbered(actors, shares)
        log.info("backfill: %d shares over %d actors", len(numbered_shares), len(actors))
        keep_landed = report_to is not None
        outcomes: dict[int, PartOutcome] = {}

        def ingest(actor: Any, index: int) -> Any:
            return actor.ingest.remote(
                numbered_shares[index], f"{message} (share {index + 1})", batch_size, default_collection, keep_landed
            )

        outcome: PartOutcome
        for index, outcome in _spread(actors, range(len(numbered_shares)), ingest):
            outcomes[index] = outcome
            _gather(report, outcome, compactor)
            if progress:
                progress(report)
        # Rejections in the sources' order, as one reader reports them.
        for index in sorted(outcomes):
            report.rejected.extend(outcomes[index].report.rejected)
            report.fallbacks.extend(outcomes[index].report.fallbacks)
        _record_cursors(
            repository,
            branch,
            message=message,
            shares=shares,
            outcomes=outcomes.values(),
            options=options,
            report=report,
        )
        compactor.finish()
    finally:
        for actor in actors:
            ray.kill(actor)
    log.info("%s (summed over the actors)", budget(report.stages, report.seconds))
    if progress:
        progress(report)
    return report


def _record_cursors(
    repository: Repository,
    branch: str,
    *,
    message: str,
    shares: Sequence[list[SourceName]],
    outcomes: Iterable[PartOutcome],
    options: SourceOptions,
    report: IngestReport,
) -> None:
    """The STAC API searches whose lanes the actors read, merged (``options.searches`` gets them); where some
    item landed, a last commit records the cursors of those read to their end, as one reader's last batch does."""
    planned = [source for share in shares for source in share if isinstance(source, SearchLane)]
    if not planned:
        return
    searches = merged_searches(planned, [search for outcome in outcomes for search in outcome.searches])
    options.searches.extend(searches)
    metadata = cursor_metadata(searches)
    if metadata is None or not report.commits:
        return
    writer = repository.writer(branch)
    report.commits.append(writer.commit(f"{message} (cursors)", metadata=metadata))


def _numbered(actors: list[Any], shares: Sequence[list[SourceName]]) -> list[list[SourceName]]:
    """``shares`` with each NDJSON part's first line number, from the lines the parts before it in its file hold
    (counted by the actors, a part each)."""
    places = [(share, place) for share, sources in enumerate(shares) for place in range(len(sources))]
    parts = [shares[share][place] for share, place in places]
    by_file: dict[str, list[int]] = {}
    for index, part in enumerate(parts):
        if isinstance(part, SourcePart) and part.kind == "ndjson":
            by_file.setdefault(part.file, []).append(index)
    # A file's last part numbers no other: only the parts before it are counted.
    counted = [index for indexes in by_file.values() if len(indexes) > 1 for index in indexes[:-1]]
    counts: dict[int, int] = dict(_spread(actors, counted, lambda actor, index: actor.count_lines.remote(parts[index])))
    out = [list(sources) for sources in shares]
    for indexes in by_file.values():
        if len(indexes) > 1:
            file_parts = [parts[index] for index in indexes]
            lines = [counts.get(index, 0) for index in indexes]
            for index, part in zip(indexes, numbered(file_parts, lines), strict=True):  # type: ignore[arg-type]
                share, place = places[index]
                out[share][place] = part
    return out


def _spread[T](actors: list[Any], tasks: Sequence[int], submit: Callable[[Any, int], Any]) -> Iterator[tuple[int, T]]:
    """Each of ``tasks`` handed to an idle actor (``submit(actor, task)`` gives the call's reference), one at a time
    per actor; yields ``(task, result)`` as they finish. An actor's FloeError is raised as itself."""
    import ray

    pending = list(reversed(tasks))
    idle = list(actors)
    running: dict[Any, tuple[Any, int]] = {}
    while pending or running:
        while pending and idle:
            actor, task = idle.pop(), pending.pop()
            running[submit(actor, task)] = (actor, task)
        done, _ = ray.wait(list(running), num_returns=1)
        for reference in done:
            actor, task = running.pop(reference)
            idle.append(actor)
            try:
                result = ray.get(reference)
            except ray.exceptions.RayTaskError as error:
                cause = error.cause if isinstance(error.cause, FloeError) else error
                raise cause from None
            yield task, result


def _gather(report: IngestReport, outcome: PartOutcome, compactor: AutoCompactor) -> None:
    """Add a part's counts and commits to the run's report (its rejections are added in order at the end)."""
    part = outcome.report
    report.items_read += part.items_read
    report.skipped += part.skipped
    report.replaced += part.replaced
    report.replans += part.replans
    report.compaction_errors.extend(part.compaction_errors)
    report.seconds += part.seconds
    for stage, seconds in part.stages.items():
        report.stages[stage] = report.stages.get(stage, 0.0) + seconds
    for commit in part.commits:
        report.commits.append(commit)
        compactor.after(BatchOutcome(commit=commit))
    if report.landed_sink is not None and outcome.landed:
        for line in outcome.landed.splitlines():
            landed = json.loads(line)
            if outcome.node is not None:
                landed["node"] = outcome.node
            report.landed_sink.write(json.dumps(landed) + "\n")
