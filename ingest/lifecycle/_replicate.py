"""Replicate a floe repository to another root (local or S3, either direction), incrementally.

:func:`replicate` runs a mirror's protocol (every ref's whole history), one :class:`_Replication` method a step,
with the table half in ``_replicate_tables.py``; ``history="none"`` is another protocol (``_replicate_heads.py``).
The steps, their order and why: docs/lifecycle.md#replication-floe-replicate.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ingest._faults import fault_point
from ingest.config import Settings, load_settings
from ingest.errors import InvalidInput, InvalidRoot, RepositoryNotFound
from ingest.lifecycle._live import history, history_pointers, reaches
from ingest.lifecycle._replica_refs import (
    HISTORY_FULL,
    HISTORY_NONE,
    REPLICA_KEY,
    REPO_OBJECT,
    ReplicateReport,
    capture_refs,
    check_refs,
    open_repo_object,
    read_refs,
)
from ingest.lifecycle._replicate_heads import replicate_heads
from ingest.lifecycle._replicate_tables import TableCopy, copy_files
from ingest.lifecycle._store import FileStat, RootFiles
from ingest.storage import ARRAYS_DIR, TABLES_DIR, Location, quiet_icechunk_logs

log = logging.getLogger(__name__)

NOT_COPIED = (f"{ARRAYS_DIR}/overwritten/",)


def replicate(
    source_root: str,
    target_root: str,
    settings: Settings | None = None,
    *,
    dry_run: bool = False,
    refs: list[str] | None = None,
    history: str = HISTORY_FULL,
    prune: bool = False,
    target_settings: Settings | None = None,
) -> ReplicateReport:
    """Copy the repository at ``source_root`` to ``target_root``: only what the target lacks, refs last.

    The source's refs are captured once, so a source being written is copied
    at one consistent version. With ``full`` history, Icechunk objects and data
    files are copied byte for byte, the table metadata is rewritten for the
    target, the target is verified, and only then do its refs move, in one
    write (a failure before leaves them as they were). With ``none``, each
    chosen ref's current version becomes one commit on the target, each ref
    moving as its commit lands.

    Args:
        source_root: the repository to copy: a local path or ``s3://bucket/prefix``.
        target_root: where the copy lives: a local path or ``s3://bucket/prefix``.
        settings: floe's settings, which reach the source (default: :func:`~ingest.config.load_settings`).
        dry_run: count what would be copied and rewritten; write nothing.
        refs: only these branches and tags (default: all).
        history: ``full`` (every ref's whole history) or ``none`` (each ref's current version only, as one more
            snapshot of the target's own history).
        prune: remove from the target the refs the source no longer has.
        target_settings: how to reach the target (its own S3 service; default: ``settings``).

    Returns:
        What was copied and rewritten (or would be), the refs replicated, and those moved, gone or removed.

    Raises:
        InvalidRoot: a root is neither a local path nor ``s3://bucket/prefix``; source and target are the same
            root; the target holds a replica without history (``full``) or a repository with history (``none``);
            or (``none``) a source snapshot carries no table pointer.
        InvalidSettings: the S3 settings of an ``s3://`` root contradict each other.
        InvalidInput: ``history`` is neither ``full`` nor ``none``.
        RepositoryNotFound: no repository is at ``source_root``.
        RefNotFound: a name of ``refs`` is no branch or tag at the source.
        ReplicationFailed: a file could not be read or copied, a table file the versions need could not be read
            (a gc of the source meanwhile?), or the target did not verify; no ref of the target was moved.
        UnreadableTableFile: a table file the versions need lies outside the source's ``tables/``; no ref of the
            target was moved.
        StoreUnreachable: (``none``) the target's store cannot be reached when its repository is opened or
            created.
        RepositoryMoved: (``none``) the table metadata of the replica at the target names another root.
        CommitConflict: (``none``) a commit to the target could not be reconciled with one made there meanwhile.
        ConflictRetriesExhausted: (``none``) a commit to the target lost ``commit.max_attempts`` races in a row.
    """
    settings = settings or load_settings()
    quiet_icechunk_logs()
    source_location = Location.parse(source_root, settings)
    target_location = Location.parse(target_root, target_settings or settings)
    if source_location.url == target_location.url and (target_settings is None or target_settings.s3 == settings.s3):
        raise InvalidRoot(f"source and target are the same root {source_location.url}")
    if history not in (HISTORY_FULL, HISTORY_NONE):
        raise InvalidInput(f"history must be {HISTORY_FULL!r} or {HISTORY_NONE!r}, not {history!r}")
    if history == HISTORY_NONE:
        return replicate_heads(
            source_location, target_location, target_settings or settings, refs=refs, prune=prune, dry_run=dry_run
        )
    run = _Replication(source_location, target_location, dry_run)
    run.capture_refs(refs, prune)  # 1
    run.plan_copies()  # 2, 3
    if dry_run:
        run.report.rewritten = run.tables.count_rewrites()
        return run.report
    run.copy()
    run.verify()  # 4
    run.move_refs()  # 5
    return run.report


class _Replication:
    """One run of a mirror's protocol; each method is a step of docs/lifecycle.md#replication-floe-replicate."""

    def __init__(self, source_location: Location, target_location: Location, dry_run: bool) -> None:
        self.source_location, self.target_location = source_location, target_location
        self.source, self.target = RootFiles(source_location), RootFiles(target_location)
        self.report = ReplicateReport(source_location.url, target_location.url, dry_run)
        self.repo_bytes = b""
        self.reached: set[str] = set()
        """Every snapshot the replicated refs reach (their ancestry)."""
        self.source_objects: dict[str, FileStat] = {}
        self.tables = TableCopy(self.source, self.target, set())

    def capture_refs(self, names: list[str] | None, prune: bool) -> None:
        """Step 1: the ref set, captured once (the bytes of ``arrays/repo``), cut to the chosen refs."""
        if self.source.stat(REPO_OBJECT) is None:
            raise RepositoryNotFound(f"no floe repository at {self.source_location.url}")
        source_bytes = self.source.read(REPO_OBJECT)
        captured = capture_refs(source_bytes)
        chosen = check_refs(names, captured)
        existing = read_refs(self.target)
        if existing is not None and existing.metadata.get(REPLICA_KEY):
            raise InvalidRoot(
                f"{self.target_location.url} is a replica without history (--history none); "
                "replicate to it with --history none, or to another root"
            )
        keep_branches = set(captured.branches) if chosen is None else set(chosen) & set(captured.branches)
        keep_tags = set(captured.tags) if chosen is None else set(chosen) & set(captured.tags)
        restore: dict[str, str] = {}
        if existing is not None:
            if chosen is not None:  # refs replicated by earlier runs stay, while the source has them
                keep_branches |= set(existing.branches) & set(captured.branches)
                keep_tags |= set(existing.tags) & set(captured.tags)
            with tempfile.TemporaryDirectory(prefix="floe-refs-") as directory:
                source_refs = open_repo_object(directory, source_bytes)
                self.report.moved = [
                    f"branch {name}"
                    for name, snapshot_id in sorted(existing.branches.items())
                    if name in captured.branches and not reaches(source_refs, captured.branches[name], snapshot_id)
                ]
            for name, snapshot_id in sorted(existing.branches.items()):
                if name in captured.branches:
                    continue
                if prune or snapshot_id not in captured.snapshot_ids:
                    self.report.removed.append(f"branch {name}")
                else:
                    restore[name] = snapshot_id
                    self.report.gone.append(f"branch {name}")
            self.report.removed += [f"tag {name}" for name in sorted(set(existing.tags) - set(captured.tags))]
        cut = _cut_refs(source_bytes, keep_branches | {"main"}, keep_tags, restore)
        self.repo_bytes, self.reached = cut.repo_bytes, cut.reached
        self.report.branches, self.report.tags = len(cut.branches), len(cut.tags)
        self.report.refs = [f"branch {n}" for n in cut.branches] + [f"tag {n}" for n in cut.tags]
        self.report.snapshots = len(cut.pointers)
        self.tables.metadata_files = {self.source_location.join(TABLES_DIR, p) for p in cut.pointers.values()}

    def plan_copies(self) -> None:
        """Steps 2 and 3: the Icechunk objects, and the table files the captured history needs, the target lacks."""
        self.source_objects = {
            path: stat
            for path, stat in self.source.list(ARRAYS_DIR).items()
            if path != REPO_OBJECT and not path.startswith(NOT_COPIED)
        }
        target_objects = self.target.list(ARRAYS_DIR)
        missing_objects = [
            (path, stat.size)
            for path, stat in sorted(self.source_objects.items())
            if (have := target_objects.get(path)) is None or have.size != stat.size
        ]
        self.tables.plan()
        self.report.copied = missing_objects + self.tables.to_copy

    def copy(self) -> None:
        """Steps 2 and 3: copy the objects and data files byte for byte, then rewrite the table metadata."""
        copy_files(self.source, self.target, [path for path, _ in self.report.copied])
        self.tables.rewrite("manifest")
        self.tables.rewrite("manifest list")

    def verify(self) -> None:
        """Step 4: verify before any ref moves, then write the metadata.json files and check they are there."""
        self.tables.verify_and_finish(lambda: self._object_problems() + self._expired_on_source())
        self.report.rewritten = self.tables.rewritten

    def _object_problems(self) -> list[str]:
        problems = []
        target_objects = self.target.list(ARRAYS_DIR)
        for path, stat in self.source_objects.items():
            have = target_objects.get(path)
            if have is None or have.size != stat.size:
                problems.append(f"{path}: {'missing' if have is None else f'{have.size} bytes, expected {stat.size}'}")
        return problems

    def _expired_on_source(self) -> list[str]:
        """Snapshots the replicated refs reach that the source expired while this run copied."""
        try:
            now = capture_refs(self.source.read(REPO_OBJECT)).snapshot_ids
        except OSError as error:
            return [f"the source's refs could not be read again: {error}"]
        gone = sorted(self.reached - now)
        return [
            f"snapshot {snapshot_id} was expired on the source during the run (its files may be gone); run again"
            for snapshot_id in gone
        ]

    def move_refs(self) -> None:
        """Step 5: the captured ref set, written to the target in one atomic write."""
        fault_point("replicate.before_refs")
        with self.target_location.mutation_lock():
            self.target.write(REPO_OBJECT, self.repo_bytes)
        self.report.refs_moved = True
        log.info(
            "replicated %s -> %s: %d file(s) copied, %d rewritten, %d bytes",
            self.source_location.url,
            self.target_location.url,
            len(self.report.copied),
            len(self.report.rewritten),
            self.report.bytes_written,
        )


@dataclass
class _Cut:
    """A ``repo`` object cut to some refs, and what its history holds."""

    repo_bytes: bytes
    branches: list[str]
    tags: list[str]
    reached: set[str]
    """Every snapshot the remaining refs reach."""
    pointers: dict[str, str]
    """Snapshot id -> table pointer, for those snapshots."""


def _cut_refs(repo_bytes: bytes, branches: set[str], tags: set[str], restore: dict[str, str]) -> _Cut:
    """The ``repo`` object with only these branches and tags (and ``restore``'s branches put back where they were)."""
    with tempfile.TemporaryDirectory(prefix="floe-refs-") as directory:
        repo = open_repo_object(directory, repo_bytes)
        for name in sorted(repo.list_branches() - branches):
            if name != "main":
                repo.delete_branch(name)
        for name in sorted(repo.list_tags() - tags):
            repo.delete_tag(name)
        for name, snapshot_id in restore.items():
            repo.create_branch(name, snapshot_id)
        return _Cut(
            (Path(directory) / "repo").read_bytes(),
            sorted(repo.list_branches()),
            sorted(repo.list_tags()),
            {info.id for info in history(repo)},
            history_pointers(repo),
        )
