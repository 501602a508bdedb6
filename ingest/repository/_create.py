"""Creating a repository, in two steps that a crash may separate, and completing one whose creation stopped.

:func:`icechunk_repository` creates Icechunk's repository with floe's configuration; :func:`commit_first_version`
makes floe's first commit (the root group's attributes and version 0 of the items table) through the commit
protocol. A repository with the first and not the second is *half-made*:
docs/lifecycle.md#creating-a-repository-floe-init.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import icechunk
import zarr

from ingest.errors import CommitConflict, RepositoryExists, StoreUnreachable
from ingest.repository._commit import AppliedChange, Base, TableChange, commit_change, pointer_of
from ingest.stac import SLOT
from ingest.storage import Location

if TYPE_CHECKING:
    from ingest.repository._catalog import PointerCatalog
    from ingest.repository._repo import Repository

log = logging.getLogger(__name__)

FIRST_MESSAGE = "floe: initialize repository"
"""The message of floe's first commit in every repository."""


def stack_config(split: int) -> icechunk.RepositoryConfig:
    """The Icechunk configuration of a new repository: manifests split every ``split`` slots of a stack.

    A commit rewrites the manifest of every array it touches; split along the
    slot axis, that is the newest split of each stack it appends to, so the
    cost of a commit stays bounded by its granules, not by the stack's length.
    """
    config = icechunk.RepositoryConfig.default()
    config.manifest = icechunk.ManifestConfig(
        splitting=icechunk.ManifestSplittingConfig.from_dict(
            {
                icechunk.ManifestSplitCondition.path_matches(".*"): {
                    icechunk.ManifestSplitDimCondition.DimensionName(f"^{SLOT}$"): split
                }
            }
        )
    )
    return config


def first_commit_made(repo: icechunk.Repository) -> bool:
    """Whether floe's first commit (the empty items table) is on ``main``: else Icechunk's repository is there and
    floe's creation of it stopped before it was done (or is under way)."""
    branches = repo.list_branches()
    if "main" not in branches:
        return bool(branches)
    return pointer_of(repo, repo.lookup_branch("main")) is not None


@contextlib.contextmanager
def reaching(location: Location) -> Iterator[None]:
    """Icechunk's errors reaching the store as one line naming the root and the cause (``StoreUnreachable``)."""
    try:
        yield
    except icechunk.StorageError as error:
        location.probe()  # its cause in a line, where the table's client sees it too
        raise StoreUnreachable(location.unreachable(error)) from None


def icechunk_repository(
    location: Location, config: icechunk.RepositoryConfig, *, force: bool = False
) -> icechunk.Repository:
    """Step 1: Icechunk's repository at ``location``, created with ``config``, or the half-made one found there.

    Args:
        location: the root.
        config: the configuration of a new Icechunk repository (a half-made one keeps the one it was made with).
        force: remove a half-made repository and create it anew instead of returning it.

    Returns:
        An Icechunk repository without floe's first commit.

    Raises:
        RepositoryExists: a complete floe repository is there.
        StoreUnreachable: the store or its bucket cannot be reached; nothing was written.
    """
    location.probe()
    storage = location.icechunk_storage()
    with location.mutation_lock(), reaching(location):
        if not icechunk.Repository.exists(storage):
            return _reading_tuned(icechunk.Repository.create(storage, config=config), location)
        repo = icechunk.Repository.open(storage, config=location.icechunk_config())
        if first_commit_made(repo):
            raise RepositoryExists(f"a repository exists already at {location.url}")
        if not force:
            log.warning("completing the creation of the repository at %s, which stopped before", location.url)
            return repo
        log.warning("removing the half-made repository at %s (--force)", location.url)
        location.remove_contents()
        return _reading_tuned(icechunk.Repository.create(storage, config=config), location)


def _reading_tuned(repo: icechunk.Repository, location: Location) -> icechunk.Repository:
    """``repo`` with floe's settings for reading ``location`` (:meth:`Location.icechunk_config`), which a new
    repository's saved configuration does not hold."""
    tuned = location.icechunk_config()
    return repo if tuned is None else repo.reopen(config=tuned)


class _InitialTable(TableChange):
    """The first commit's table change: version 0 of an empty items table (written once, whatever the attempt)."""

    def __init__(self, catalog: PointerCatalog, location: str) -> None:
        self._catalog = catalog
        self._location = location
        self._metadata_location: str | None = None

    def apply(self, base: Base) -> AppliedChange:
        if base.metadata_location is not None:
            # Another process completed the creation first: its table is the first version, not ours.
            raise RepositoryExists(f"a repository exists already at {self._location}")
        if self._metadata_location is None:
            self._metadata_location = self._catalog.create_initial(self._location).metadata_location
        return AppliedChange(self._metadata_location)


def commit_first_version(repository: Repository, attributes: Mapping[str, Any], table_location: str) -> str:
    """Step 2: the root group's ``attributes`` and an empty items table at ``table_location``, committed on
    ``main``. Returns the snapshot id.

    Raises:
        RepositoryExists: another process completed the same creation first.
    """
    session = repository.icechunk.writable_session("main")
    zarr.open_group(session.store, mode="a", attributes=dict(attributes))
    initial = _InitialTable(repository.catalog, table_location)
    try:
        return commit_change(repository, session, "main", FIRST_MESSAGE, initial).snapshot_id
    except CommitConflict:
        # Both wrote the root group's attributes: the other process's commit landed first.
        raise RepositoryExists(f"a repository exists already at {repository.location.url}") from None
