"""What both kinds of replication start from: the source's refs, read once from its ``repo`` object, and the
report a run gives (see ``_replicate.py`` for the protocol with history, ``_replicate_heads.py`` without).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import icechunk

from ingest.errors import RefNotFound
from ingest.lifecycle._history import REPO_OBJECT
from ingest.lifecycle._store import RootFiles

HISTORY_FULL, HISTORY_NONE = "full", "none"
REPLICA_KEY = "floe:replica"
"""Key of the Icechunk repository metadata that marks a replica without history (and names its source)."""


@dataclass
class ReplicateReport:
    """What a replication copied (or, in a dry run, would copy)."""

    source: str
    target: str
    dry_run: bool
    history: str = HISTORY_FULL
    branches: int = 0
    tags: int = 0
    snapshots: int = 0
    copied: list[tuple[str, int]] = field(default_factory=list)
    """(path relative to the root, bytes) of each file copied byte for byte (Icechunk objects, data files)."""
    rewritten: list[tuple[str, int]] = field(default_factory=list)
    """(path, bytes written) of each Iceberg metadata file rewritten for the target."""
    chunks_copied: int = 0
    """Without history: array chunks written through Icechunk (native and inline; virtual references aside)."""
    chunk_bytes: int = 0
    refs: list[str] = field(default_factory=list)
    """The refs replicated, as ``branch NAME`` / ``tag NAME``."""
    updated: list[str] = field(default_factory=list)
    """Without history: the refs that got a new snapshot (or, for a tag, its first) in this run."""
    moved: list[str] = field(default_factory=list)
    """Branches whose new source tip does not descend from the version the target had."""
    gone: list[str] = field(default_factory=list)
    """Refs the target has that the source no longer has, kept."""
    removed: list[str] = field(default_factory=list)
    """Refs removed from the target (the source deleted them)."""
    refs_moved: bool = False

    @property
    def files_written(self) -> list[str]:
        return [path for path, _ in self.copied + self.rewritten]

    @property
    def bytes_written(self) -> int:
        return sum(size for _, size in self.copied + self.rewritten) + self.chunk_bytes


@dataclass
class CapturedRefs:
    """A ``repo`` object's refs and snapshots, read once."""

    branches: dict[str, str]
    tags: dict[str, str]
    snapshot_ids: set[str]
    metadata: dict[str, Any]

    def named(self, ref: str) -> tuple[str, str]:
        """(kind, snapshot id) of a ref by name (a branch before a tag of the same name)."""
        if ref in self.branches:
            return "branch", self.branches[ref]
        if ref in self.tags:
            return "tag", self.tags[ref]
        raise RefNotFound(f"no branch or tag {ref!r} at the source")


def open_repo_object(directory: str, repo_bytes: bytes) -> icechunk.Repository:
    """An Icechunk repository over a throw-away directory that holds only a copy of ``repo_bytes``."""
    (Path(directory) / "repo").write_bytes(repo_bytes)
    return icechunk.Repository.open(icechunk.local_filesystem_storage(directory))


def capture_refs(repo_bytes: bytes) -> CapturedRefs:
    """The branches, tags, snapshot ids and metadata of a ``repo`` object's bytes."""
    with tempfile.TemporaryDirectory(prefix="floe-refs-") as directory:
        repo = open_repo_object(directory, repo_bytes)
        info = repo.inspect_repo_info()
        return CapturedRefs(
            branches={name: repo.lookup_branch(name) for name in repo.list_branches()},
            tags={name: repo.lookup_tag(name) for name in repo.list_tags()},
            snapshot_ids={snapshot["id"] for snapshot in info.get("snapshots", [])},
            metadata=repo.get_metadata(),
        )


def read_refs(files: RootFiles) -> CapturedRefs | None:
    """The refs of the repository at a root, or None when there is none."""
    if files.stat(REPO_OBJECT) is None:
        return None
    return capture_refs(files.read(REPO_OBJECT))


def check_refs(names: list[str] | None, captured: CapturedRefs) -> list[str] | None:
    """The chosen ref names, each known at the source (None: all)."""
    if names is None:
        return None
    for name in names:
        captured.named(name)
    return sorted(set(names))
