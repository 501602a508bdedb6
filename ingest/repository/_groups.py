"""Groups of the Icechunk tree: whether one exists, and shared parents created in a commit of their own.

Two writers that both create the same group can never be rebased onto each
other (Icechunk's ``NewNodeConflictsWithExistingNode``), nor two that both
change one group's attributes (``ZarrMetadataDoubleUpdate``). So the groups
many writers share (a collection's ``/<collection>``, with the STAC Collection
in its attributes) are created or updated in a small commit of their own
before writers stage arrays under them. That commit goes through the same
protocol as every other (:func:`~ingest.repository._commit.commit_change`);
when it collides with someone else's creation of the same group, it looks
again from the new tip, where that group now exists: "created meanwhile"
counts as created.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import icechunk
import zarr
import zarr.errors

from ingest.errors import CommitConflict, ConflictRetriesExhausted
from ingest.repository._commit import KeepTable, commit_change
from ingest.repository._history import writable_session

if TYPE_CHECKING:
    from ingest.repository._repo import Repository


def group_exists(session: icechunk.Session, path: str) -> bool:
    """Whether a group exists at ``path`` in the session (its base snapshot or its staged changes)."""
    try:
        zarr.open_group(session.store, path=path, mode="r")
    except (FileNotFoundError, zarr.errors.NodeNotFoundError, zarr.errors.ContainsArrayError):
        return False
    return True


def _stale_attributes(session: icechunk.Session, path: str, wanted: Mapping[str, Any]) -> bool:
    attributes = zarr.open_group(session.store, path=path, mode="r").attrs
    return any(attributes.get(key) != value for key, value in wanted.items())


def ensure_groups(
    repository: Repository,
    paths: list[str],
    *,
    branch: str,
    attributes: Mapping[str, Mapping[str, Any]] | None = None,
) -> str | None:
    """Create the groups at ``paths`` on ``branch`` in a commit of their own, if any is missing.

    ``attributes`` (path -> attributes to merge in) also updates groups that
    exist. Idempotent and safe against concurrent callers. Returns the new
    snapshot id, or None if there was nothing to do.
    """
    attributes = attributes or {}
    wanted = sorted(set(paths) | set(attributes))
    for _ in range(repository.settings.commit.max_attempts):
        session = writable_session(repository, branch)
        missing = [path for path in wanted if not group_exists(session, path)]
        stale = [
            path
            for path, values in attributes.items()
            if path not in missing and _stale_attributes(session, path, values)
        ]
        if not missing and not stale:
            return None
        for path in missing:
            zarr.open_group(session.store, path=path, mode="a", attributes=dict(attributes.get(path) or {}))
        for path in stale:
            zarr.open_group(session.store, path=path, mode="a").attrs.update(dict(attributes[path]))
        changed = ", ".join("/" + path for path in [*missing, *stale])
        message = f"floe: {'create' if missing else 'update'} {changed}"
        try:
            return commit_change(repository, session, branch, message, KeepTable()).snapshot_id
        except CommitConflict:
            continue  # someone created (or updated) the same group meanwhile: look again from the new tip
    raise ConflictRetriesExhausted(f"could not create {wanted} on {branch!r}: every attempt met a concurrent change")


def commit_alone(repository: Repository, branch: str, stage: Callable[[icechunk.Session], str | None]) -> str | None:
    """Stage shared nodes with ``stage`` on the tip of ``branch`` and commit them in a commit of their own.

    ``stage`` changes a fresh session and returns the commit message, or None
    when there is nothing to do (the nodes exist already). A collision with
    someone else's creation of the same nodes is looked at again from the new
    tip, where ``stage`` finds them made. Returns the new snapshot id, or None.
    """
    for _ in range(repository.settings.commit.max_attempts):
        session = writable_session(repository, branch)
        message = stage(session)
        if message is None:
            return None
        try:
            return commit_change(repository, session, branch, message, KeepTable()).snapshot_id
        except CommitConflict:
            continue
    raise ConflictRetriesExhausted(
        f"could not commit shared nodes on {branch!r}: every attempt met a concurrent change"
    )
