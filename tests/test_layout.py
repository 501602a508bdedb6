"""The package's shape, checked: data flows one way, imports run one way, private names stay in their module,
one commit path.

These are the rules of docs/development.md's layout section (the consolidation of issue 10, and issue 50's
imports that run one way), written as tests so a change that breaks one says so by name.
"""

from __future__ import annotations

import ast
import sys
import warnings
from collections.abc import Iterator
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
LONG_MODULE = 500
"""Lines past which a module is reported, asking for a split where its ideas part (never for squeezed lines)."""


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


# -- imports that run one way ----------------------------------------------------------------------------------


def module_names(root: Path, package: str) -> dict[str, Path]:
    """Every module of ``package`` (a folder under ``root``) by its dotted name (a package by its own name)."""
    found = {}
    for path in sorted((root / package.replace(".", "/")).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import a module may run: at its top or inside functions, not those only a type checker reads."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (child for branch in node.orelse for child in _runtime_imports(ast.Module([branch], [])))
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        else:
            yield from _runtime_imports(node)


def _absolute(node: ast.ImportFrom, name: str, path: Path) -> str:
    """The module an ``ImportFrom`` in module ``name`` (at ``path``) names, relative imports resolved."""
    if not node.level:
        return node.module or ""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
    return f"{base}.{node.module}" if node.module else base


def _homes(modules: dict[str, Path]) -> dict[str, dict[str, str]]:
    """For each package, where the names its ``__init__`` binds by importing them come from (eagerly, lazily or
    for the type checker alike: a lazy package loads its names from those modules)."""
    homes: dict[str, dict[str, str]] = {}
    for name, path in modules.items():
        if path.name != "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                source = _absolute(node, name, path)
                if source in modules:
                    homes.setdefault(name, {}).update({alias.asname or alias.name: source for alias in node.names})
    return homes


def import_edges(root: Path, package: str) -> dict[str, dict[str, list[str]]]:
    """Which module of ``package`` imports which (at run time), with the names it imports from each.

    A name imported from a package counts as imported from the module the package gets it from; the package's
    own ``__init__`` counts only where the name is its own. Imports for the type checker alone are left out.
    """
    modules = module_names(root, package)
    homes = _homes(modules)
    edges: dict[str, dict[str, list[str]]] = {name: {} for name in modules}
    for name, path in modules.items():
        for node in _runtime_imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in modules:
                        edges[name].setdefault(alias.name, [])
                continue
            source = _absolute(node, name, path)
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    target, imported = f"{source}.{alias.name}", "*module*"
                elif source in modules:
                    target, imported = homes.get(source, {}).get(alias.name, source), alias.name
                else:
                    continue
                if target != name:
                    edges[name].setdefault(target, []).append(imported)
    return edges


def import_cycles(edges: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or around a loop (strongly connected, more than
    one module), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in edges.get(module, {}):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(edges) + 100))
    try:
        for module in sorted(edges):
            if module not in index:
                visit(module)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(cycles)


def private_imports(edges: dict[str, dict[str, list[str]]]) -> list[str]:
    """Each import of a private name (``_name``, not a module) of another module: ``importer <- module._name``."""
    return sorted(
        f"{module} <- {target}.{imported}"
        for module, targets in edges.items()
        for target, names in targets.items()
        for imported in names
        if imported.startswith("_") and not imported.startswith("__") and imported != "*module*"
    )


def long_modules(root: Path, package: str, limit: int = LONG_MODULE) -> dict[str, int]:
    """The modules of ``package`` longer than ``limit`` lines, by name, with their lengths."""
    lengths = {name: path.read_text().count("\n") for name, path in module_names(root, package).items()}
    return {name: lines for name, lines in sorted(lengths.items()) if lines > limit}


def test_no_module_of_ingest_imports_another_that_imports_it_back():
    cycles = import_cycles(import_edges(PACKAGE.parent, "ingest"))
    assert cycles == [], f"modules that import each other at run time (imports run one way): {cycles}"


def test_no_module_of_ingest_imports_a_private_name_of_another():
    found = private_imports(import_edges(PACKAGE.parent, "ingest"))
    assert found == [], f"private names imported from other modules (make them public, or move them): {found}"


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_checks_find_a_cycle_a_private_import_and_a_long_module(tmp_path):
    """The three checks above, on a package made to break each rule (one cycle through a function's import and a
    lazy package's name, one private name, one long module), and on one that keeps them."""
    root = _package(
        tmp_path,
        {
            "__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg._b import B\n",
            "_a.py": "def f():\n    from pkg import B\n    return B\n",
            "_b.py": "from pkg._c import _helper\nB = 1\n",
            "_c.py": "from pkg._a import f\n_helper = f\n",
            "_d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg._e import E\n",
            "_e.py": "from pkg._d import D\nE = 2\n" + "# a line\n" * 600,
        },
    )
    edges = import_edges(root, "pkg")
    assert import_cycles(edges) == [["pkg._a", "pkg._b", "pkg._c"]]  # _d <-> _e is for the type checker only
    assert private_imports(edges) == ["pkg._b <- pkg._c._helper"]
    assert long_modules(root, "pkg") == {"pkg._e": 602}

    kept = _package(tmp_path / "kept", {"__init__.py": "", "_a.py": "X = 1\n", "_b.py": "from pkg._a import X\n"})
    assert import_cycles(import_edges(kept, "pkg")) == [] and private_imports(import_edges(kept, "pkg")) == []


def test_long_modules_are_reported_for_a_split_by_concept():
    """Not a limit: a module past :data:`LONG_MODULE` lines is named in a warning (pytest's summary shows it),
    asking for a split where its ideas part. Never join lines or trim a docstring to get under it."""
    long = long_modules(PACKAGE.parent, "ingest")
    if long:
        listed = ", ".join(f"{name} ({lines})" for name, lines in long.items())
        warnings.warn(
            f"modules over {LONG_MODULE} lines: {listed}. Split a module where its ideas part, if they do; "
            "never squeeze lines to get under the mark",
            UserWarning,
            stacklevel=1,
        )
    assert all(lines > LONG_MODULE for lines in long.values())
