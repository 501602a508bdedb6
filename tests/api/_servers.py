"""A real `floe serve` (uvicorn) on 127.0.0.1 for the API tests, stopped by its pid."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from ingest.api import serve_command
from tests.conftest import free_port

WORKTREE = Path(__file__).resolve().parents[2]


class FloeServer:
    def __init__(
        self,
        root: Path | str,
        *,
        env: dict[str, str] | None = None,
        log_dir: Path | None = None,
        transactions: bool = False,
    ) -> None:
        """Serve ``root``; an ``s3://`` root needs ``log_dir`` (the log goes beside a local root by default)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        name = f"serve-{self.port}.log"
        self.log = log_dir / name if log_dir is not None else Path(f"{root}.{name}")
        command = serve_command(str(root), self.port, transactions=transactions)
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                command, cwd=WORKTREE, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
            )
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(self.url + "/conformance", timeout=2)
                return
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"floe serve did not start: {self.log.read_text()[-2000:]}") from None
                time.sleep(0.2)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=5)


def run_validator(*arguments: str) -> str:
    """stac-api-validator (offline, see run_validator.py) with ``arguments``: its whole output."""
    result = subprocess.run(
        [sys.executable, "-W", "ignore", str(Path(__file__).with_name("run_validator.py")), *arguments],
        check=False,
        cwd=WORKTREE,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return result.stdout + result.stderr


def assert_validator_passed(output: str) -> None:
    # The validator exits 0 even when it crashes: its verdict is in the output.
    assert "Failed." not in output, output[-5000:]
    assert "Errors: none" in output, "\n".join(
        line for line in output.splitlines() if line.startswith(("- ", "Errors", "Failed"))
    )
