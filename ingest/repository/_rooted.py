"""Is the repository where its table metadata says? The check that refuses a copy not yet relocated.

Iceberg metadata holds absolute locations; Icechunk's objects and floe's
pointers do not. So after ``cp -a``, ``mv`` or a bucket sync a repository
opens fine but its table metadata names the old root: reads would read there,
and gc would delete this root's files as unreferenced. One metadata.json
tells: the one the tip of the *sentinel branch* (``main``, or the first
branch by name) points at, which ``floe relocate`` rewrites last of all
(docs/lifecycle.md).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from ingest.errors import RepositoryMoved
from ingest.storage import TABLES_DIR

if TYPE_CHECKING:
    from ingest.repository._repo import Repository

ITEMS_TABLE_DIR = "items"
"""The items table's folder under ``<root>/tables/``."""
_PLAIN_METADATA = re.compile(r"(?<!\.gz)\.metadata\.json$")
"""A table metadata file written without compression (PyIceberg names a gzipped one ``*.gz.metadata.json``)."""


def sentinel_branch(repository: Repository) -> str:
    """The branch whose tip tells where the table lives: ``main``, or the first branch by name.

    Args:
        repository: the repository.

    Returns:
        The branch's name.
    """
    branches = sorted(repository.icechunk.list_branches())
    return "main" if "main" in branches else branches[0]


def recorded_table_location(repository: Repository, main_tip: str | None = None) -> str:
    """The table location the metadata of the sentinel branch's tip records.

    Args:
        repository: the repository.
        main_tip: the snapshot id at the tip of ``main``, if the caller has just read it (default: look up the
            sentinel branch's tip).

    Returns:
        The table location that metadata records, without a trailing ``/``.

    Raises:
        CorruptRepository: that tip carries no items-table pointer.
    """
    tip = main_tip if main_tip is not None else repository.icechunk.lookup_branch(sentinel_branch(repository))
    metadata_location = repository.metadata_location_of(tip)
    light = "catalog" not in vars(repository) and _PLAIN_METADATA.search(metadata_location)
    if repository.location.is_local and light:
        # One field of a local JSON file: opening a repository to list its refs or history does not import
        # PyIceberg for it (the catalog, once made, has the file parsed already).
        return str(json.loads(Path(metadata_location).read_bytes())["location"]).rstrip("/")
    return repository.table_at(tip).location().rstrip("/")


def check_rooted(repository: Repository, main_tip: str | None = None) -> None:
    """Raise ``RepositoryMoved`` if the table metadata names another root than the repository's.

    Args:
        repository: the repository.
        main_tip: the snapshot id at the tip of ``main``, if the caller has just read it (default: look up the
            sentinel branch's tip).

    Raises:
        RepositoryMoved: the table metadata names another root than this one.
        CorruptRepository: the tip read carries no items-table pointer.
    """
    recorded = recorded_table_location(repository, main_tip)
    if recorded == repository.table_location:
        return
    suffix = f"/{TABLES_DIR}/{ITEMS_TABLE_DIR}"
    old_root = recorded[: -len(suffix)] if recorded.endswith(suffix) else recorded
    url = repository.location.url
    raise RepositoryMoved(
        f"the repository at {url} was copied or moved from {old_root}: its table metadata still names that "
        f"root. Run `floe --root {url} relocate` to rewrite it for this root; until then floe neither reads nor "
        "writes it here",
        recorded_root=old_root,
        root=url,
    )
