"""The STAC API: a stac-fastapi application over any ref, and the search engine behind it and `floe search`."""

from typing import Any

from ingest.api._changes import Deletion, delete_items
from ingest.api._open import open_search
from ingest.api._request import MAX_LIMIT, SearchPage, SearchRequest, SortKey
from ingest.api._search import SearchEngine
from ingest.api._serve import default_workers, serve

__all__ = [
    "MAX_LIMIT",
    "Deletion",
    "SearchEngine",
    "SearchPage",
    "SearchRequest",
    "SortKey",
    "browser_home",
    "create_app",
    "default_workers",
    "delete_items",
    "install_browser",
    "installed_build",
    "open_search",
    "serve",
    "serve_command",
]


def serve_command(
    root: str, port: int, host: str = "127.0.0.1", *, transactions: bool = False, workers: int = 1
) -> list[str]:
    """The command line of a `floe serve` child process (this interpreter, this checkout's floe) on ``host:port``,
    answering from ``workers`` processes (one by default here: a test's server need not take every core).

    Args:
        root: the repository to serve: a local path or ``s3://bucket/prefix``.
        port: the port to listen on.
        host: the address to listen on.
        transactions: accept writes (``--transactions``; the child refuses to start without ``api.write_token``,
            e.g. ``FLOE_API__WRITE_TOKEN`` in its environment).
        workers: the processes answering requests.

    Returns:
        The arguments, for :class:`subprocess.Popen`; nothing is started.
    """
    import sys

    command = "from ingest.cli import app; app()"
    writes = ["--transactions"] if transactions else []
    where = ["--host", host, "--port", str(port), "--workers", str(workers)]
    return [sys.executable, "-c", command, "--root", root, "serve", *where, *writes]


def __getattr__(name: str) -> Any:
    # The web stack (stac-fastapi, FastAPI) loads only when an application is wanted, not for `floe search`.
    if name == "create_app":
        import logging

        # stac-fastapi warns at import time that its title/description settings are defaults; floe sets its own.
        logging.getLogger("stac_fastapi.types.config").setLevel(logging.ERROR)
        from ingest.api import _app

        return _app.create_app
    if name in _BROWSER:
        # STAC Browser's install and build lookup (Starlette's responses come with the module).
        from ingest.api import _browser

        return getattr(_browser, name)
    raise AttributeError(name)


_BROWSER = ("browser_home", "install_browser", "installed_build")
