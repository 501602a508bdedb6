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


@pytest.mark.parametrize("command", ["refs", "log"])
def test_listing_refs_or_history_loads_no_table_stack(tmp_path, command: str) -> None:
    """`floe refs` and `floe log` read Icechunk only (issue 49: they answer in well under a second): the items
    table's stack (PyIceberg, PyArrow) is never imported, on a repository with a tag and a commit of rows."""
    from ingest.config import Settings
    from ingest.repository import Repository
    from tests.conftest import make_item

    root = tmp_path / "repo"
    repository = Repository.create(root, Settings(root=str(root)))
    writer = repository.writer()
    writer.add_items([make_item("a")])
    writer.commit("rows")
    repository.tag("v1")
    check = (
        "import sys\nfrom ingest.cli import run\n"
        f"sys.argv = ['floe', '--root', {str(root)!r}, {command!r}]\n"
        "try:\n    run()\nexcept SystemExit as done:\n    assert not done.code, done.code\n"
        "loaded = sorted(name for name in ('pyiceberg', 'pyarrow', 'ingest.pipeline') if name in sys.modules)\n"
        "print('loaded:', *loaded)\n"
    )
    result = subprocess.run([sys.executable, "-c", check], cwd=WORKTREE, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "v1" in result.stdout  # it did list the tag
    assert result.stdout.splitlines()[-1] == "loaded:", result.stdout


LAZY_PACKAGES = ("ingest", "ingest.pipeline", "ingest.pipeline.sources", "ingest.repository", "ingest.stac")


def test_every_name_a_lazy_package_exports_resolves_to_its_home() -> None:
    """A lazy package lists each name twice (its home, ``__all__``): a name filed under the wrong home fails only
    when first asked for, so each is asked for here (in a fresh interpreter, one for all the packages)."""
    check = (
        "import importlib\nmissing = []\n"
        f"for package in {LAZY_PACKAGES!r}:\n"
        "    module = importlib.import_module(package)\n"
        "    missing += [f'{package}.{name}' for name in module.__all__ if not hasattr(module, name)]\n"
        "assert not missing, missing"
    )
    result = subprocess.run([sys.executable, "-c", check], cwd=WORKTREE, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
