"""Running the STAC API: uvicorn in this process, or a supervisor and worker processes on one socket.

A search's CPU work (decoding Parquet, testing geometries, building items)
holds the GIL: in one process, every request waits for the heavy ones in
front of it, and a second core idles. ``floe serve --workers N`` (default: the
cores this process may run on) starts uvicorn's supervisor, which binds the
socket once and starts ``N`` worker processes (``spawn``, never ``fork``:
Icechunk's runtime does not survive a fork) that accept on it in turn.

Each worker opens the repository itself and builds its own application from
the environment (:func:`app_from_environment`), which the supervisor sets to
what its own command line said. Workers share nothing but the socket, so
they answer alike for the reason replicas behind a load balancer do: a page
token names its snapshot, and any process resolves it to the same table.
"""

from __future__ import annotations

import gc
import logging
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ingest.api._router import RefRouter
    from ingest.repository import Repository

ROOT_VARIABLE = "FLOE_ROOT"
"""Where a worker finds the root its supervisor serves (the setting ``root``)."""
TRANSACTIONS_VARIABLE = "FLOE_SERVE_TRANSACTIONS"
"""Set to ``1`` by a supervisor serving ``--transactions``, for its workers."""


def default_workers() -> int:
    """The cores this process may run on (its CPU affinity, not the machine's count).

    Returns:
        How many CPUs ``os.sched_getaffinity`` allows this process (the machine's count where Python has no
        ``sched_getaffinity``: macOS, Windows), at least 1.
    """
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def serve(
    repository: Repository,
    host: str = "127.0.0.1",
    port: int = 8080,
    *,
    log_level: str = "warning",
    transactions: bool = False,
    workers: int = 1,
) -> None:
    """Serve the STAC API with uvicorn until interrupted.

    Args:
        repository: the repository to serve (opened: its root is what workers open again).
        host: the address to listen on.
        port: the port to listen on.
        log_level: uvicorn's log level.
        transactions: accept writes (see ``_transactions``).
        workers: processes answering requests; 1 serves from this process.
    """
    import uvicorn

    if workers <= 1:
        from ingest.api._app import create_app

        application = create_app(repository, transactions=transactions)
        _tune_collector()
        uvicorn.run(application, host=host, port=port, log_level=log_level, access_log=False)
        return
    # Workers are new interpreters: they learn the root and the flags from the environment they inherit.
    os.environ[ROOT_VARIABLE] = repository.location.url
    os.environ[TRANSACTIONS_VARIABLE] = "1" if transactions else ""
    if repository.settings.api.cache_dir:
        # One directory for all workers: an object one of them fetched, the others read from the disk.
        os.environ["FLOE_API__CACHE_DIR"] = repository.settings.api.cache_dir
    uvicorn.run(
        f"{__name__}:app_from_environment",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=log_level,
        access_log=False,
    )


def app_from_environment() -> RefRouter:
    """A worker's application: the repository at ``$FLOE_ROOT`` with the settings of the environment (uvicorn's
    factory, called once in each worker process)."""
    # stac-fastapi warns at import time that its title/description settings are defaults; floe sets its own.
    logging.getLogger("stac_fastapi.types.config").setLevel(logging.ERROR)
    from ingest.api._app import create_app
    from ingest.repository import Repository

    repository = Repository.open()
    application = create_app(repository, transactions=os.environ.get(TRANSACTIONS_VARIABLE) == "1")
    _tune_collector()
    return application


def _tune_collector() -> None:
    """Process tuning for a server: the objects made at start-up (modules, models, the app) live as long as the
    process, so the cyclic collector stops re-scanning them; responses make many short-lived, acyclic dicts, so
    young collections can be rarer. Together they cut the CPU of a 1,000-item page by about a third here."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
