"""Run a probe script in a fresh Python process (nothing this test session imported or started is in it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def last_json_line(script: str, *arguments: str) -> dict:
    """Run ``script`` with ``arguments`` in a fresh Python process at the repository root; the JSON of its last
    output line (the process must exit 0: its stderr is the assertion's message otherwise)."""
    done = subprocess.run(
        [sys.executable, "-c", script, *arguments],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        cwd=REPO_ROOT,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
