"""The ``floe`` command: parse arguments, call the library, render the result.

One module per group of commands, each a thin shell over library calls; importing them registers their commands.
The modules: docs/lifecycle.md#where-the-code-lives; exit statuses: docs/ingest.md#exit-status-and-ctrl-c.
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
