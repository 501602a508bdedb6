"""`floe search` loads the engine without the web stack, the web app loads without the ingest pipeline, and the
command line starts without the storage stack.

Each check runs in a fresh interpreter: this test session has imported everything already.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.api._servers import WORKTREE


@pytest.mark.parametrize(
    ("statement", "not_loaded"),
    [
        ("from ingest.api import SearchEngine, SearchRequest", "fastapi"),
        ("from ingest.api import SearchEngine, SearchRequest", "stac_fastapi"),
        ("from ingest.api import create_app", "ingest.pipeline"),
        # The command line answers --help, --version and usage errors without the storage stack or the settings.
        ("import ingest.cli", "icechunk"),
        ("import ingest.cli", "pyiceberg"),
        ("import ingest.cli", "ingest.repository"),
        ("import ingest.cli", "pydantic_settings"),
    ],
)
def test_importing_loads_only_what_it_needs(statement: str, not_loaded: str) -> None:
    check = f"import sys\n{statement}\nassert {not_loaded!r} not in sys.modules, 'loaded'"
    result = subprocess.run([sys.executable, "-c", check], cwd=WORKTREE, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"{statement!r} loaded {not_loaded}: {result.stderr[-2000:]}"
