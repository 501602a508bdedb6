"""Ingest with Ray: actors copy granules into arrays and commit their batches, each through its own writer.

:func:`ingest_with_ray` reads and checks items on the driver (the granule stream), commits the batches without
rasters itself and hands the others to :class:`GranuleWriter` actors, starting a local Ray (:func:`start_ray`)
only when the first of those arrives. The design: docs/design.md §5 (Ray actors) and
docs/remote-sources.md#ray-actors-that-copy-and-commit.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from ingest._compat import keep_local_ray_on_loopback
from ingest.config import Settings
from ingest.errors import FloeError, RayUnavailable
from ingest.pipeline._backfill import backfill_with_ray
from ingest.pipeline._batch import changed_granules, commit_batch
from ingest.pipeline._compact import AutoCompactor
from ingest.pipeline._granules import AnyGranule, Granule, collections_of, select_assets
from ingest.pipeline._ingest import rare_collections
from ingest.pipeline._prune import SourceScope, prune_keys
from ingest.pipeline._report import BatchOutcome, IngestReport, ProgressCallback, record
from ingest.pipeline._stream import (
    VALIDATION_CHUNK,
    granule_stream,
    reaching,
    routed_batches,
    with_recorded_cursors,
)
from ingest.pipeline.sources import SourceName, SourceOptions, cursor_metadata, split_sources
from ingest.repository import Repository

log = logging.getLogger(__name__)

# Ray reads this once, when it is first imported: with it, a local cluster's servers
# (GCS, raylet, workers) listen on 127.0.0.1 instead of every interface.
LOOPBACK_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
os.environ.setdefault(LOOPBACK_SWITCH, "0")

#: Modules an ingest actor needs, imported by the workers of a local cluster as soon as they start.
WORKER_PRELOAD = ("ingest.pipeline._ray", "ingest.rasters")


class GranuleWriter:
    """The work of one Ray actor: open the repository once, then ingest batches of granules."""

    def __init__(self, root: str, settings: dict[str, Any], branch: str) -> None:
        self.repository = Repository.open(root, Settings.model_validate(settings))
        self.branch = branch

    def ingest(self, granules: list[AnyGranule], message: str, virtual: bool = False) -> BatchOutcome:
        import ray

        outcome = commit_batch(self.repository, self.branch, granules, message, virtual=virtual)
        # Asked only inside Ray: used directly in a plain process, Ray's runtime context would start a whole
        # default cluster (it did, in a test: every later actor of that process ran at nice 15).
        if ray.is_initialized():
            outcome.node = ray.get_runtime_context().get_node_id()
        return outcome


_RAY_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
"""The logger of Ray's notice that a new local cluster has token authentication (see :func:`start_ray`)."""


def start_ray(workers: int, address: str | None = None) -> bool:
    """Join ``address`` or start a local cluster bound to 127.0.0.1; returns whether this call started Ray.

    Does nothing where Ray is initialized in this process already.

    Args:
        workers: the CPUs a local cluster offers (at least 1); unused when joining ``address``.
        address: a running cluster to join (``HOST:PORT`` of its head; default: start a local cluster).

    Returns:
        True if this call initialized Ray (joined a cluster or started one), False if it was initialized already.

    Raises:
        RayUnavailable: the cluster at ``address`` cannot be joined (no answer, or it requires token
            authentication this process does not offer); the message says why and what to try.
    """
    import ray

    if ray.is_initialized():
        return False
    if address:
        try:
            ray.init(address=address, log_to_driver=False)
        except (ConnectionError, RuntimeError, ray.exceptions.AuthenticationError) as error:
            raise RayUnavailable(_join_failure(address, error)) from error
        return True
    # A local cluster listens on loopback only: never expose a cluster on the network by default.
    # If Ray was imported before this module set the switch, set what it derived from it.
    if os.environ.get(LOOPBACK_SWITCH) == "0":
        keep_local_ray_on_loopback()
    # A new local cluster gets token authentication, and Ray says so in a warning at every start unless the mode
    # is set (ray/_private/authentication/authentication_token_setup.py, enable_token_auth_by_default), which
    # broke the progress bar. That mode is the one floe wants, and setting RAY_AUTH_MODE=token instead would also
    # change how Ray finds the token (the driver was refused by its own cluster): only the warning is silenced.
    logging.getLogger(_RAY_AUTH_LOGGER).setLevel(logging.ERROR)
    ray.init(
        num_cpus=max(1, workers),
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        _node_ip_address="127.0.0.1",
        # The workers Ray starts with the cluster import floe right away, alongside the rest of the start-up and
        # the driver reading its sources; an actor placed on one once it has is ready in ~0.2 s, not ~2-3 s.
        # Ray starts workers at nice 15 (worker_niceness): next to anything else running, the actors, which do
        # all of an ingest's work, then got a sliver of the CPU (a 5,000-item batch: 0.6 s in the driver's
        # process, 16-55 s in an actor beside two busy processes). The driver waits on them: same priority.
        _system_config={"preload_python_modules": list(WORKER_PRELOAD), "worker_niceness": 0},
    )
    return True


def _join_failure(address: str, error: BaseException) -> str:
    causes: list[str] = []
    cause: BaseException | None = error
    while cause is not None and len(causes) < 4:
        causes.append(str(cause))
        cause = cause.__cause__ or cause.__context__
    detail = " ".join(causes)
    if "InvalidAuthToken" in detail or "Authentication" in detail:
        # Ray sends its token only to clusters it finds itself, never to an address it is given.
        return (
            f"the Ray cluster at {address} requires token authentication: set RAY_AUTH_MODE=token, with the "
            "cluster's token in RAY_AUTH_TOKEN or ~/.ray/auth_token"
        )
    return f"cannot join the Ray cluster at {address}: {causes[0].splitlines()[0] if causes else 'no answer'}"


def ingest_with_ray(
    repository: Repository,
    sources: Iterable[SourceName],
    *,
    workers: int = 2,
    batch_size: int | None = None,
    ray_address: str | None = None,
    assets: str = "all",
    branch: str | None = None,
    message: str | None = None,
    default_collection: str | None = None,
    progress: ProgressCallback | None = None,
    virtual: bool = False,
    prune: bool = False,
    options: SourceOptions | None = None,
    report_to: TextIO | None = None,
) -> IngestReport:
    """Ingest granules (rasters as arrays, items as rows) with ``workers`` Ray actors, one commit per batch.

    Batches without rasters are committed by this process; Ray starts with the
    first batch that has rasters to write (an unchanged batch is skipped without
    it). A run that copies no rasters (``assets="none"``), of files only and
    without ``prune``, is a metadata backfill instead: its files are cut into
    parts that the actors read, check and commit themselves (``_backfill.py``).
    With ``prune``, the last batch is committed by the driver once the actors
    are done, with the deletions of the items the sources no longer hold
    (see ``_prune.py``); so is it when ``options`` name STAC API searches, with
    their cursors. A compaction that fails is recorded in the report
    (``compaction_errors``), not raised. Batches committed before an error stay;
    either way the actors are stopped, and Ray is shut down in this process if
    this call initialized it.

    Args:
        repository: the repository to ingest into.
        sources: paths and URLs of items, folders and STAC APIs, as :func:`~ingest.pipeline.read_items` reads them.
        workers: the Ray actors copying granules and committing batches.
        batch_size: items per commit (default: ``settings.batch_size``), fewer once a batch's rasters reach
            ``settings.batch_raster_mb``.
        ray_address: a running Ray cluster to join (``HOST:PORT`` of its head), joined before any source is read
            (default: a local cluster bound to 127.0.0.1, see :func:`start_ray`).
        assets: the raster assets to copy: ``all`` (every raster asset), ``none``, or comma-separated keys; remote
            ones only with ``options.remote_assets``.
        branch: the branch to commit to (default: the configured branch).
        message: the commit message, each batch's followed by `` (batch N)`` (default: ``floe ingest``).
        default_collection: the collection of items that name none.
        progress: called with the report as batches are handed out and land.
        virtual: reference rasters in place (Icechunk virtual chunks) instead of copying them; granules that cannot
            be referenced are copied and listed in the report's ``fallbacks``.
        prune: delete in the last commit the items of the sources' collections that the sources no longer hold;
            nothing is deleted if some input could not be read (the report's ``prune_skipped`` says why).
        options: how to reach remote sources and what to ask STAC APIs (default: nothing asked); the searches
            read are added to its ``searches``.
        report_to: gets a JSON line per committed granule as its batch lands, naming the Ray node whose actor
            wrote it.

    Returns:
        What the run did: items read, skipped and replaced, the commits, the rejections and fallbacks, the bytes
        copied, the compactions.

    Raises:
        RayUnavailable: the cluster at ``ray_address`` cannot be joined (before any source is read).
        CommitConflict: a batch's commit (the driver's or an actor's) could not be reconciled with another
            writer's in any of its :data:`~ingest.pipeline._batch.REPLANS` plans.
        ConflictRetriesExhausted: a batch's commit lost ``commit.max_attempts`` races in a row, or so did every
            attempt to create the group of a collection the batch brings.
        UnsupportedLayout: a batch's granules go into a stack array whose slices are another size than this
            floe's ``arrays.tile`` cuts (the repository was written with another tile).
    """
    branch = branch or repository.settings.branch
    given = batch_size  # a backfill's actors take the defaults of an in-process ingest (rows_batch_size too)
    batch_size = batch_size or repository.settings.batch_size
    raster_bytes = repository.settings.batch_raster_mb << 20
    message = message or "floe ingest"
    sources = list(sources)
    options = reaching(repository, options if options is not None else SourceOptions())
    metadata_only = assets.strip() == "none" and not (virtual or prune)
    shares = _backfill_shares(repository, sources, options, branch, workers) if metadata_only else None
    # One share is one reader's work: the driver reads it (below) without starting Ray for it.
    if shares is not None and (len(shares) > 1 or ray_address):
        with _ray_for(workers, ray_address):
            return backfill_with_ray(
                repository,
                shares,
                workers=workers,
                branch=branch,
                batch_size=given,
                message=message,
                default_collection=default_collection,
                progress=progress,
                options=options,
                report_to=report_to,
            )
    report = IngestReport(landed_sink=report_to)
    if virtual:
        _allow_virtual_sources(repository, sources)
    pool = _ActorPool(
        repository, branch, workers, ray_address, report, progress, AutoCompactor(repository, branch, report)
    )
    known_collections: set[str] = set()
    scope = SourceScope()
    granules = granule_stream(
        repository,
        sources,
        report,
        branch=branch,
        default_collection=default_collection,
        assets=select_assets(assets),
        chunk=min(VALIDATION_CHUNK, batch_size),
        scope=scope,
        options=options,
    )
    try:
        if ray_address:
            pool.start()  # a cluster named on purpose is joined first: an address that cannot be joined fails at once
        with rare_collections() as collect:
            batches = routed_batches(granules, workers, batch_size, raster_bytes, virtual=virtual)
            number = 0
            for number, (lane, batch, last) in enumerate(batches, start=1):
                collect(number)
                # A collection's group is created in a commit of its own before writers stage arrays under it.
                collections = collections_of(batch) - known_collections
                if collections:
                    repository.ensure_groups(sorted(collections), branch=branch)
                    known_collections |= collections
                metadata = cursor_metadata(options.searches) if last else None
                if last and (prune or metadata):
                    # Deletions are planned, and cursors recorded, once every other batch has landed.
                    pool.drain()
                    delete = prune_keys(repository, branch, scope, report) if prune else []
                    pool.collect(
                        commit_batch(
                            repository,
                            branch,
                            batch,
                            f"{message} (batch {number})",
                            virtual=virtual,
                            delete=delete,
                            metadata=metadata,
                        )
                    )
                elif any(isinstance(granule, Granule) and granule.rasters for granule in batch):
                    # Only what changed goes to an actor: an unchanged batch (a re-run) is skipped here, and a run
                    # that has nothing to copy never starts Ray.
                    changed, unchanged = changed_granules(repository, branch, batch)
                    if unchanged:
                        pool.collect(BatchOutcome(commit=None, skipped=unchanged))
                    if changed:
                        pool.submit(changed, f"{message} (batch {number})", virtual, lane=lane)
                else:
                    # Items alone: committed here, beside whatever the actors are committing (sending them to an actor
                    # costs more: docs/remote-sources.md#ray-actors-that-copy-and-commit).
                    pool.collect(commit_batch(repository, branch, batch, f"{message} (batch {number})"))
            pool.drain()
            if prune and number == 0 and (delete := prune_keys(repository, branch, scope, report)):
                pool.collect(commit_batch(repository, branch, [], f"{message} (prune)", delete=delete))
            pool.compactor.finish()
    finally:
        pool.close()
    if virtual:
        # The actors may have added containers (remote buckets and hosts): this object reads them from now on.
        repository.reload_config()
    return report


def _backfill_shares(
    repository: Repository, sources: list[SourceName], options: SourceOptions, branch: str, workers: int
) -> list[list[SourceName]] | None:
    """What a metadata backfill's actors would read (:func:`~ingest.pipeline.sources.split_sources`), None where
    one reader reads the sources. A STAC API search's lanes resume from the cursor ``branch`` recorded for it."""
    with_recorded_cursors(repository, options, sources, branch)
    return split_sources(sources, repository.settings.part_bytes, options, workers=workers)


@contextmanager
def _ray_for(workers: int, address: str | None) -> Iterator[None]:
    """Ray started (or ``address`` joined) for a block, and shut down after it if this started it."""
    started = start_ray(workers, address)
    try:
        yield
    finally:
        if started:
            import ray

            ray.shutdown()


def _allow_virtual_sources(repository: Repository, sources: list[SourceName]) -> None:
    """Actors read the repository config when they open it: the virtual chunk containers must be there first."""
    paths = [Path(source) for source in sources if isinstance(source, (str, Path)) and str(source) != "-"]
    local = [path.resolve() for path in paths if path.exists()]
    try:
        repository.allow_virtual_sources(local)
    except ValueError as error:  # a path a file:// URL cannot hold: those granules are copied, and say why
        log.warning("cannot reference rasters in place under every source: %s", error)


class _ActorPool:
    """``workers`` GranuleWriter actors, each given one batch at a time; outcomes go to the run's report.

    Ray is started and the actors made when the first batch is submitted (a ``ray_address`` is joined at
    once: ``ingest_with_ray`` starts the pool before reading anything).
    """

    def __init__(  # noqa: PLR0917
        self,
        repository: Repository,
        branch: str,
        workers: int,
        ray_address: str | None,
        report: IngestReport,
        progress: ProgressCallback | None,
        compactor: AutoCompactor,
    ) -> None:
        self.repository = repository
        self.branch = branch
        self.workers = workers
        self.ray_address = ray_address
        self.actors: list[Any] = []
        self.idle: list[Any] = []
        self.in_flight: dict[Any, Any] = {}
        self.report = report
        self.progress = progress
        self.compactor = compactor
        self.started_ray = False

    def start(self) -> None:
        """Start Ray (or join ``ray_address``) and make the actors."""
        import ray

        self.started_ray = start_ray(self.workers, self.ray_address)
        actor_class: Any = ray.remote(num_cpus=1)(GranuleWriter)
        settings = self.repository.settings.model_dump()
        url = self.repository.location.url
        self.actors = [actor_class.remote(url, settings, self.branch) for _ in range(self.workers)]
        self.idle = list(self.actors)

    def submit(self, batch: list[AnyGranule], message: str, virtual: bool, *, lane: int | None = None) -> None:
        """Give ``batch`` to actor ``lane`` (any actor: None) once it is idle, waiting for it if it is not.

        Routing a lane's batches to one actor keeps the slices of a stack with
        one writer within a run (``routed_batches``).
        """
        if not self.actors:
            self.start()
        wanted = self.actors[lane % len(self.actors)] if lane is not None else None
        while not self.idle or (wanted is not None and wanted not in self.idle):
            self._collect_one()
        actor = wanted if wanted is not None else self.idle[-1]
        self.idle.remove(actor)
        self.in_flight[actor.ingest.remote(batch, message, virtual)] = actor
        self._report_progress()

    def drain(self) -> None:
        """Wait for every batch in flight."""
        while self.in_flight:
            self._collect_one()

    def _collect_one(self) -> None:
        import ray

        done, _ = ray.wait(list(self.in_flight), num_returns=1)
        for reference in done:
            self.idle.append(self.in_flight.pop(reference))
            try:
                outcome: BatchOutcome = ray.get(reference)
            except ray.exceptions.RayTaskError as error:
                cause = error.cause if isinstance(error.cause, FloeError) else error
                raise cause from None
            self.collect(outcome)

    def collect(self, outcome: BatchOutcome) -> None:
        """Add a batch's outcome to the run (an actor's, or the driver's own last batch)."""
        record(self.report, outcome)
        self.compactor.after(outcome)
        self._report_progress()

    def _report_progress(self) -> None:
        if self.progress:
            self.progress(self.report)

    def close(self) -> None:
        """Stop the actors, and the Ray this run started (if it started one)."""
        if not self.actors and not self.started_ray:
            return
        import ray

        for actor in self.actors:
            ray.kill(actor)
        if self.started_ray:
            ray.shutdown()
