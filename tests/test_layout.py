"""The package's shape, checked: data flows one way, private modules stay in their package, one commit path.

These are the rules of CONVENTIONS.md's "Layout" and of the consolidation
(issue 10), written as tests so a change that breaks one says so by name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "ingest"
MODULES = sorted(PACKAGE.rglob("*.py"))

# What each subpackage may import from the others (besides the shared top-level modules below).
ALLOWED = {
    "stac": set(),
    "rasters": {"stac"},
    "repository": {"stac"},
    "pipeline": {"stac", "rasters", "repository"},
    "api": {"stac", "repository"},
    "export": {"stac", "repository"},
    "lifecycle": {"stac", "repository"},
    "cli": {"stac", "rasters", "repository", "pipeline", "api", "export", "lifecycle", "sample"},
}
SHARED = {"errors", "config", "storage", "remote", "_compat", "_faults", "_threads", "sample"}
MAX_LINES = 500


def package_of(path: Path) -> str:
    relative = path.relative_to(PACKAGE)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def imported_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
            found.extend(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return [name for name in found if name.startswith("ingest.")]


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(PACKAGE)))
def test_imports_follow_the_data_flow_and_keep_private_modules_private(path):
    own = package_of(path)
    for name in imported_modules(path):
        parts = name.split(".")
        target = parts[1]
        if target == own or target in SHARED:
            continue
        if own in ALLOWED:  # top-level modules (the package's public API, sample.py) may use any subpackage
            assert target in ALLOWED[own] or target not in ALLOWED, f"{own} must not import {name}"
        private = [part for part in parts[2:] if part.startswith("_")]
        assert not private, f"{path.relative_to(PACKAGE)} imports {name}, a private name of ingest.{target}"


def test_only_the_commit_protocol_commits_to_icechunk():
    callers = []
    for path in MODULES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "commit":
                receiver = ast.unparse(node.func.value)
                if "session" in receiver.lower():
                    callers.append(f"{path.relative_to(PACKAGE)}: {ast.unparse(node)[:60]}")
    assert callers == ["repository/_commit.py: session.commit(message, metadata=metadata, allow_empty=True)"]


def test_the_commit_records_keys_are_spelled_in_one_module():
    from ingest.repository._commit import FLOE_KEY

    record_keys = {FLOE_KEY, "items", "rows_added", "rows_replaced", "rows_deleted", "attempts"}
    spelled = set()
    for path in MODULES:
        for node in ast.walk(ast.parse(path.read_text())):
            # As a literal dict key, subscript or .get() argument: how a record is built or read by hand
            # (_commit.py itself names its keys once, as constants).
            if isinstance(node, ast.Dict):
                keys = node.keys
            elif isinstance(node, ast.Subscript):
                keys = [node.slice]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
                keys = node.args[:1]
            else:
                continue
            if any(isinstance(key, ast.Constant) and key.value in record_keys for key in keys):
                spelled.add(str(path.relative_to(PACKAGE)))
    assert spelled == set(), f"the commit record's keys are spelled as keys in {sorted(spelled)}"
    # The record's own words appear nowhere else at all ("floe", "items" and "attempts" are common words).
    anywhere = {
        str(path.relative_to(PACKAGE))
        for path in MODULES
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value in ("rows_added", "rows_replaced", "rows_deleted")
    }
    assert anywhere == {"repository/_commit.py"}


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(PACKAGE)))
def test_modules_stay_small_or_say_why(path):
    lines = path.read_text().count("\n")
    if lines > MAX_LINES:
        docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert "longer than" in docstring, f"{path.name} has {lines} lines and no reason at its top"
