"""The replaced versions of Icechunk's ``repo`` object in ``arrays/overwritten/``: what they are, and which gc removes.

:func:`sweep_overwritten` deletes those last modified before the grace, except the newest :data:`KEEP_NEWEST`;
:func:`arrays_footprint` counts what ``arrays/`` holds. What Icechunk keeps there, who reads it and why removing it
is safe: docs/lifecycle.md#garbage-collection-floe-gc (Icechunk's history objects).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from ingest.lifecycle._store import FileStat, RootFiles
from ingest.storage import ARRAYS_DIR, Location

log = logging.getLogger(__name__)

OVERWRITTEN_DIR = f"{ARRAYS_DIR}/overwritten"
"""Where Icechunk 2 keeps the replaced versions of ``repo`` (and, in spec 1 repositories, of ``config.yaml``)."""

REPO_OBJECT = f"{ARRAYS_DIR}/repo"
"""Icechunk's refs and history: never deleted."""

KEEP_NEWEST = 10
"""Replaced versions of ``repo`` kept whatever their age: on a repository nobody wrote to for longer than the grace,
the only earlier states of the refs left (docs/lifecycle.md#garbage-collection-floe-gc)."""

# What `arrays_footprint` reports, in this order: Icechunk's object kinds by the folder they live in.
_KINDS = ("repo", "overwritten", "snapshots", "manifests", "transactions", "chunks")


@dataclass
class HistorySweep:
    """What gc did (or, in a dry run, would do) with ``arrays/overwritten/``."""

    deleted: list[tuple[str, int]] = field(default_factory=list)
    """(path relative to the root, bytes) of each replaced version removed."""
    kept_young: list[tuple[str, int]] = field(default_factory=list)
    """Versions younger than the grace period."""
    kept_newest: list[tuple[str, int]] = field(default_factory=list)
    """Versions older than the grace kept because they are among the newest ``keep_newest``."""

    @property
    def bytes_deleted(self) -> int:
        return sum(size for _, size in self.deleted)


def sweep_overwritten(
    files: RootFiles, cutoff: datetime, *, dry_run: bool = False, keep_newest: int = KEEP_NEWEST
) -> HistorySweep:
    """Delete the replaced versions of ``repo`` last modified before ``cutoff``, except the newest ``keep_newest``.

    On local storage Icechunk *moves* ``repo`` into ``overwritten/``, so a copy's modification time is when that
    version of ``repo`` was written, not when it was replaced; on S3 it is the time of the copy. Either way a copy
    is never younger than the version it preserves.
    """
    if keep_newest < 0:
        raise ValueError(f"keep_newest must be 0 or more, not {keep_newest}")
    listed = files.list(OVERWRITTEN_DIR)
    sweep = HistorySweep()
    # Newest first; a copy whose time the store does not report counts as the newest (never deleted). Equal times
    # keep name order: Icechunk names a copy by an inverted timestamp, so the smaller name is the newer copy.
    by_age = sorted(sorted(listed.items()), key=lambda entry: _newest_first(entry[1]), reverse=True)
    for rank, (path, stat) in enumerate(by_age):
        if stat.modified is None or stat.modified >= cutoff:
            sweep.kept_young.append((path, stat.size))
        elif rank < keep_newest:
            sweep.kept_newest.append((path, stat.size))
        else:
            sweep.deleted.append((path, stat.size))
    sweep.deleted.sort()
    if not dry_run:
        for path, _ in sweep.deleted:
            files.delete(path)
    log.info(
        "gc %s %d replaced version(s) of arrays/repo (%d bytes); kept %d younger than the grace and %d newest",
        "would delete" if dry_run else "deleted",
        len(sweep.deleted),
        sweep.bytes_deleted,
        len(sweep.kept_young),
        len(sweep.kept_newest),
    )
    return sweep


def _newest_first(stat: FileStat) -> tuple[int, float]:
    return (1, 0.0) if stat.modified is None else (0, stat.modified.timestamp())


@dataclass(frozen=True)
class ArraysFootprint:
    """Objects and bytes under ``arrays/``, by Icechunk's folders (``other``: anything else, e.g. ``config.yaml``)."""

    objects: Mapping[str, int]
    bytes: Mapping[str, int]

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())


def arrays_footprint(location: Location) -> ArraysFootprint:
    """Count what the Icechunk repository of a root holds, split into repo, overwritten, snapshots, manifests,
    transactions, chunks and other.

    Args:
        location: the root.

    Returns:
        Objects and bytes under ``arrays/``, by Icechunk's folder (``other``: anything else, e.g. ``config.yaml``);
        every kind is there, 0 when it holds nothing.
    """
    objects = dict.fromkeys((*_KINDS, "other"), 0)
    sizes = dict.fromkeys((*_KINDS, "other"), 0)
    for path, stat in RootFiles(location).list(ARRAYS_DIR).items():
        head = path[len(ARRAYS_DIR) + 1 :].split("/", 1)[0]
        kind = head if head in _KINDS else "other"
        objects[kind] += 1
        sizes[kind] += stat.size
    return ArraysFootprint(objects, sizes)
