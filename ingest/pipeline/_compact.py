"""Compaction while an ingest runs: partitions its batches make due are compacted then, not left to pile up."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ingest.errors import FloeError

if TYPE_CHECKING:
    from ingest.pipeline._report import BatchOutcome, IngestReport
    from ingest.repository import Repository

log = logging.getLogger(__name__)


class AutoCompactor:
    """Runs ``floe optimize --only-due`` every ``optimize.small_files`` commits of a run, and once at its end.

    Only partitions past the thresholds are rewritten (size-tiered: see
    :mod:`ingest.repository._optimize`), in commits of their own next to the
    run's writers. A compaction that fails (it lost every race, the store
    refused) is logged and recorded; the items are committed either way.
    """

    def __init__(self, repository: Repository, branch: str, report: IngestReport, *, enabled: bool = True) -> None:
        self.repository = repository
        self.branch = branch
        self.report = report
        self.every = repository.settings.optimize.small_files if enabled else 0
        self._commits_since = 0

    def after(self, outcome: BatchOutcome) -> None:
        """Count a batch's commit; compact once enough commits piled up since the last look."""
        if outcome.commit is None or not self.every:
            return
        self._commits_since += 1
        if self._commits_since >= self.every:
            self.run()

    def finish(self) -> None:
        """The last look, at the end of the run (only if something was committed since the previous one)."""
        if self._commits_since and self.every:
            self.run()

    def run(self) -> None:
        self._commits_since = 0
        try:
            result = self.repository.optimize(self.branch, full=False)
        except FloeError as error:
            log.warning("compaction after ingest failed (the ingested items are committed): %s", error)
            self.report.compaction_errors.append(str(error))
            return
        if result.summary is not None and result.summary.partitions:
            self.report.compactions.append(result)
