"""Running floe's command line from tests: in this process (typer's runner), or as a child process whose output
is a pipe, as a shell script or CI sees it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner, Result

from ingest import Settings
from ingest.cli import app

CHECKOUT = Path(__file__).resolve().parents[1]


def floe_here(root: str, *args: str, settings: Settings | None = None) -> Result:
    """``floe --root ROOT ARGS`` in this process; an S3 endpoint of ``settings`` reaches it as ``FLOE_S3__*``."""
    env = {}
    if settings is not None and settings.s3.endpoint_url:
        env = {f"FLOE_S3__{key.upper()}": str(value) for key, value in settings.s3.model_dump().items() if value}
    return CliRunner().invoke(app, ["--root", root, *args], env=env, catch_exceptions=False)


def floe_child(*args: str, env: dict[str, str] | None = None, cwd: Path = CHECKOUT) -> subprocess.CompletedProcess[str]:
    """``floe ARGS`` in a child process of this checkout's floe (stdout and stderr are pipes, not a terminal;
    ``COLUMNS`` as pytest-xdist sets it is left out), with ``env`` over this process's environment."""
    environment = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
    return subprocess.run(
        [sys.executable, "-m", "ingest.cli", *args],
        cwd=cwd,
        env={**environment, "PYTHONPATH": str(CHECKOUT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
