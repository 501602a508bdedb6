"""Ingest in this process, without Ray: the granule stream, one commit per batch (metadata only)."""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TextIO

from ingest._stages import budget, measuring, timed
from ingest.pipeline._batch import commit_batch
from ingest.pipeline._compact import AutoCompactor
from ingest.pipeline._prune import SourceScope, prune_keys
from ingest.pipeline._report import IngestReport, ProgressCallback, record
from ingest.pipeline._sizing import BatchSizer, Stopwatch
from ingest.pipeline._stream import VALIDATION_CHUNK, batched, granule_stream
from ingest.pipeline.sources import SourceName, SourceOptions, cursor_metadata
from ingest.repository import Repository
from ingest.stac import paused_collection

log = logging.getLogger(__name__)

COLLECT_EVERY = 50
"""Batches between collections of Python's cyclic garbage during an ingest.

Batches make almost no cycles (a million-item run collected nothing), and a
collection costs 25-40 ms whatever it finds, 130 ms by the end of a
million-item run: once a batch, it was a fifth of the last batches' time.
"""


@contextmanager
def rare_collections() -> Iterator[Callable[[int], None]]:
    """Python's cyclic collector paused for a run; the function it gives collects after every
    :data:`COLLECT_EVERY`-th batch (call it with each batch's number).

    Reading and validating allocate millions of small acyclic objects, which
    the collector would walk again and again. What is alive before the run
    (modules, the repository, its caches) outlives it: frozen, it is left out
    of those collections (a walk of everything cost ~0.25 s).
    """

    def collect(number: int) -> None:
        if number % COLLECT_EVERY == 0:
            gc.collect()

    gc.freeze()
    try:
        with paused_collection():
            yield collect
    finally:
        gc.unfreeze()


def ingest_items(
    repository: Repository,
    sources: Iterable[SourceName],
    *,
    branch: str | None = None,
    batch_size: int | None = None,
    message: str | None = None,
    default_collection: str | None = None,
    progress: ProgressCallback | None = None,
    prune: bool = False,
    options: SourceOptions | None = None,
    report_to: TextIO | None = None,
    compact: bool = True,
) -> IngestReport:
    """Ingest every item found in ``sources`` in this process (metadata only), one commit per ``batch_size`` items.

    Bad input (unreadable files, invalid items, ids repeated within the run) is
    rejected with its source named; everything else is committed. Items the
    branch holds already, unchanged, are skipped; changed ones replace their row.
    The last commit records the cursors of the STAC API searches read to the
    end. A compaction that fails after a batch is recorded in the report
    (``compaction_errors``), not raised. Batches committed before an error stay.

    Args:
        repository: the repository to ingest into.
        sources: paths and URLs of items, folders and STAC APIs, as :func:`~ingest.pipeline.read_items` reads them.
        branch: the branch to commit to (default: the configured branch).
        batch_size: items per commit (default: ``settings.batch_size``, growing on object storage up to
            ``settings.batch_max_size``: ``_sizing.py``; for items that come as rows, ``settings.rows_batch_size``).
        message: the commit message, each batch's followed by `` (batch N)`` (default: ``floe ingest``).
        default_collection: the collection of items that name none.
        progress: called with the report after each batch, and once at the end.
        prune: delete in the last commit the items of the sources' collections that the sources no longer hold (see
            ``_prune.py``); nothing is deleted if some input could not be read (the report's ``prune_skipped`` says
            why).
        options: how to reach remote sources and what to ask STAC APIs (default: nothing asked); the searches
            read are added to its ``searches``.
        report_to: gets a JSON line per committed item as its batch lands.
        compact: compact the partitions the run makes due as it goes (``[optimize]``); a backfill's actors leave
            that to their driver.

    Returns:
        What the run did: items read, skipped and replaced, the commits, the rejections, the compactions.

    Raises:
        RefNotFound: no branch ``branch`` exists (found when the first batch commits, or when ``prune`` looks for
            the items to delete).
        CommitConflict: a batch's commit could not be reconciled with another writer's in any of its
            :data:`~ingest.pipeline._batch.REPLANS` plans.
        ConflictRetriesExhausted: a batch's commit lost ``commit.max_attempts`` races in a row.
    """
    branch = branch or repository.settings.branch
    settings = repository.settings
    # A size given is kept; the configured one grows on object storage (_sizing.py).
    grows = batch_size is None and not repository.location.is_local
    rows_size = batch_size or settings.rows_batch_size  # a size given holds for rows too
    batch_size = batch_size or settings.batch_size
    sizer = BatchSizer(batch_size, settings.batch_max_size if grows else batch_size)
    raster_bytes = repository.settings.batch_raster_mb << 20
    message = message or "floe ingest"
    report = IngestReport(landed_sink=report_to)
    scope = SourceScope()
    options = options if options is not None else SourceOptions()
    granules = granule_stream(
        repository,
        sources,
        report,
        branch=branch,
        default_collection=default_collection,
        chunk=min(VALIDATION_CHUNK, batch_size),
        scope=scope,
        options=options,
    )
    compactor = AutoCompactor(repository, branch, report, enabled=compact)
    with measuring() as clock, rare_collections() as collect:
        batches = batched(granules, sizer, raster_bytes, rows_size)
        number = 0
        started = Stopwatch()
        for number, (batch, last) in enumerate(batches, start=1):
            delete = prune_keys(repository, branch, scope, report) if prune and last else []
            metadata = cursor_metadata(options.searches) if last else None
            committing = Stopwatch()
            with timed("commit"):
                outcome = commit_batch(
                    repository, branch, batch, f"{message} (batch {number})", delete=delete, metadata=metadata
                )
            sizer.observe(started.seconds(), committing.waiting())
            started = Stopwatch()
            record(report, outcome)
            compactor.after(outcome)
            if outcome.commit is not None:
                result = outcome.commit
                log.info(
                    "committed %d items as %s (%d attempts; batch of %d, next %d)",
                    result.rows_added,
                    result.snapshot_id,
                    result.attempts,
                    len(batch),
                    sizer.items,
                )
            if progress:
                progress(report)
            collect(number)
        if prune and number == 0 and (delete := prune_keys(repository, branch, scope, report)):
            # The sources hold no item at all: the deletions are a commit of their own.
            record(report, commit_batch(repository, branch, [], f"{message} (prune)", delete=delete))
        report.stages, report.seconds = dict(clock.seconds), clock.wall()
    log.info("%s", budget(report.stages, report.seconds))
    compactor.finish()
    if progress:
        progress(report)
    return report
