"""The ``floe`` command: parse arguments, call the library, render the result.

Exit status: 0 success, 1 error, 2 usage error, 3 some input was rejected
(the rest was committed), 4 ``check`` found problems, 130 interrupted (Ctrl-C).

Modules (each command is a thin shell over library calls):

- ``_app``: the Typer application, global options, shared error rendering and consoles;
- ``_demo``: ``demo``;
- ``_ingest``: ``ingest`` (``_ingest_report``: its progress bar and summary);
- ``_read``: ``export``, ``log``, ``tag``, ``branch``, ``refs``;
- ``_changes``: ``delete``;
- ``_lifecycle``: ``init``, ``check``, ``gc``, ``replicate``, ``relocate``, ``optimize``;
- ``_api``: ``serve``, ``search``, ``browser install``;
- ``_interrupt``: Ctrl-C acts within seconds even inside a storage call (:func:`run` arms it).

Importing them registers their commands, in the order ``floe --help`` lists them.
"""

import importlib

from ingest.cli import _interrupt
from ingest.cli._app import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_PROBLEMS, EXIT_REJECTED, app

# In the order `floe --help` lists them (Typer lists commands as they are registered).
for _module in ("_ingest", "_demo", "_changes", "_read", "_lifecycle", "_api"):
    importlib.import_module(f"ingest.cli.{_module}")


def run() -> None:
    """The ``floe`` command (the console script, ``python -m ingest.cli``): :data:`app` with Ctrl-C's watchdog
    armed (:mod:`ingest.cli._interrupt`). Calling ``app`` itself (a test's CliRunner) arms nothing."""
    _interrupt.arm()
    app()


__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_PROBLEMS", "EXIT_REJECTED", "app", "run"]
