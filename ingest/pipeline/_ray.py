"""Ingest with Ray: actors copy granules into arrays and commit their batches, each through its own writer.

The driver reads and validates items, rejects bad input by name, makes sure
every collection group exists (one small commit, before writers need it), and
hands batches to the actors. Each actor stages a batch's arrays and rows in
one Icechunk session and commits it with the rebase-and-reconcile loop: actors
never wait for each other, and a granule's arrays and row land in the same
commit or not at all.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ingest._compat import keep_local_ray_on_loopback
from ingest.config import Settings
from ingest.errors import FloeError, RayUnavailable
from ingest.pipeline._batch import commit_batch
from ingest.pipeline._granules import Granule, select_assets
from ingest.pipeline._report import BatchOutcome, IngestReport, ProgressCallback, record
from ingest.pipeline._stream import VALIDATION_CHUNK, batched, granule_stream
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

    def ingest(self, granules: list[Granule], message: str, virtual: bool = False) -> BatchOutcome:
        return commit_batch(self.repository, self.branch, granules, message, virtual=virtual)


def start_ray(workers: int, address: str | None = None) -> bool:
    """Join ``address`` or start a local cluster bound to 127.0.0.1; returns whether this call started Ray."""
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
    ray.init(
        num_cpus=max(1, workers),
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        _node_ip_address="127.0.0.1",
        # The workers Ray starts with the cluster import floe right away, alongside the rest of the start-up and
        # the driver reading its sources; an actor placed on one once it has is ready in ~0.2 s, not ~2-3 s.
        _system_config={"preload_python_modules": list(WORKER_PRELOAD)},
    )
    return True


def _join_failure(address: str, error: BaseException) -> str:
    causes = []
    while error is not None and len(causes) < 4:
        causes.append(str(error))
        error = error.__cause__ or error.__context__
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
    sources: Iterable[str | Path],
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
) -> IngestReport:
    """Ingest granules (rasters as arrays, items as rows) with ``workers`` Ray actors, one commit per batch.

    With ``virtual``, local rasters are referenced in place (Icechunk virtual
    chunks) instead of copied; granules that cannot be referenced are copied
    and listed in the report's ``fallbacks``.
    """
    import ray

    branch = branch or repository.settings.branch
    batch_size = batch_size or repository.settings.batch_size
    message = message or "floe ingest"
    report = IngestReport()
    sources = list(sources)
    if virtual:
        # Actors read the repository config when they open it: the containers must be there first.
        local = [Path(source).resolve() for source in sources if str(source) != "-" and Path(source).exists()]
        try:
            repository.allow_virtual_sources(local)
        except ValueError as error:  # a path a file:// URL cannot hold: those granules are copied, and say why
            log.warning("cannot reference rasters in place under every source: %s", error)
    started = start_ray(workers, ray_address)
    actor_class = ray.remote(num_cpus=1)(GranuleWriter)
    actors = [
        actor_class.remote(repository.location.url, repository.settings.model_dump(), branch) for _ in range(workers)
    ]
    idle = list(actors)
    in_flight: dict[Any, Any] = {}
    known_collections: set[str] = set()
    granules = granule_stream(
        repository,
        sources,
        report,
        branch=branch,
        default_collection=default_collection,
        assets=select_assets(assets),
        chunk=min(VALIDATION_CHUNK, batch_size),
    )

    def collect(done: list[Any]) -> None:
        for reference in done:
            idle.append(in_flight.pop(reference))
            try:
                outcome: BatchOutcome = ray.get(reference)
            except ray.exceptions.RayTaskError as error:
                cause = error.cause if isinstance(error.cause, FloeError) else error
                raise cause from None
            record(report, outcome)
            if progress:
                progress(report)

    try:
        for number, batch in enumerate(batched(granules, batch_size), start=1):
            collections = {granule.item["collection"] for granule in batch} - known_collections
            if collections:
                repository.ensure_groups(sorted(collections), branch=branch)
                known_collections |= collections
            if not idle:
                done, _ = ray.wait(list(in_flight), num_returns=1)
                collect(done)
            actor = idle.pop()
            in_flight[actor.ingest.remote(batch, f"{message} (batch {number})", virtual)] = actor
            if progress:
                progress(report)
        while in_flight:
            done, _ = ray.wait(list(in_flight), num_returns=1)
            collect(done)
    finally:
        for actor in actors:
            ray.kill(actor)
        if started:
            ray.shutdown()
    return report
