"""Replicas without history (``floe replicate --history none``): each chosen ref's current version only.

:func:`replicate_heads` makes each chosen ref's new state one Icechunk commit (or a tag) of the target's own
history, its arrays copied key by key as stored (:class:`_Copier`) and its table through ``_replicate_tables`` with
``current_only``. How such a replica is made and what it holds: docs/lifecycle.md#replicas-without-history.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import icechunk
import zarr.core.buffer

from ingest.config import Settings
from ingest.errors import InvalidRoot, RepositoryNotFound
from ingest.lifecycle._live import history, reaches
from ingest.lifecycle._replica_refs import (
    REPLICA_KEY,
    REPO_OBJECT,
    CapturedRefs,
    ReplicateReport,
    capture_refs,
    check_refs,
    read_refs,
)
from ingest.lifecycle._replicate_tables import TableCopy
from ingest.lifecycle._store import RootFiles
from ingest.repository import AppliedChange, Base, CommitMetadata, Repository, TableChange, commit_change
from ingest.storage import TABLES_DIR, Location

log = logging.getLogger(__name__)

REPLICA_OF = "floe:replica-of"
"""Key of a target commit's metadata: the source snapshot this snapshot reproduces."""
READS_IN_FLIGHT = 16
_BUFFERS = zarr.core.buffer.default_buffer_prototype()


@dataclass
class _Action:
    """One ref's new state at the target: commit ``source_id`` on ``branch`` (from ``base``), and/or tag it."""

    kind: str
    name: str
    source_id: str
    base: str | None = None
    """Target snapshot a new branch starts at (None: the branch exists)."""
    reproduces: str | None = None
    """Source snapshot the branch's target tip reproduces (None: the empty initial version)."""
    forward: bool = False
    new: bool = False
    """A tag, or a branch the target lacks: it starts at the target version nearest to it, found when it is made."""
    """The branch exists and first moves forward to ``base`` (a later target snapshot that descends from it)."""


def replicate_heads(
    source_location: Location,
    target_location: Location,
    target_settings: Settings,
    *,
    refs: list[str] | None,
    prune: bool,
    dry_run: bool,
) -> ReplicateReport:
    run = _Heads(source_location, target_location, target_settings, dry_run)
    run.plan(refs, prune)
    if dry_run:
        run.report.rewritten = run.tables.count_rewrites()
        return run.report
    run.tables.write()
    run.tables.verify_and_finish()
    run.report.copied, run.report.rewritten = run.tables.to_copy, run.tables.rewritten
    run.commit()
    run.prune(prune)
    run.report.refs_moved = True
    return run.report


class _Heads:
    def __init__(
        self, source_location: Location, target_location: Location, target_settings: Settings, dry_run: bool
    ) -> None:
        self.source_location, self.target_location = source_location, target_location
        self.target_settings = target_settings
        self.source, self.target = RootFiles(source_location), RootFiles(target_location)
        self.report = ReplicateReport(source_location.url, target_location.url, dry_run, history="none")
        self.tables = TableCopy(self.source, self.target, set(), current_only=True)
        self.actions: list[_Action] = []
        self.to_prune: list[tuple[str, str]] = []
        self.reproduced: dict[str, str] = {}
        """Source snapshot -> the target snapshot that reproduces it."""
        self.source_repo: icechunk.Repository | None = None
        self.target_repo: Repository | None = None

    # -- planning ------------------------------------------------------------------------------------

    def plan(self, names: list[str] | None, prune: bool) -> None:
        if self.source.stat(REPO_OBJECT) is None:
            raise RepositoryNotFound(f"no floe repository at {self.source_location.url}")
        captured = capture_refs(self.source.read(REPO_OBJECT))
        chosen = check_refs(names, captured) or sorted(set(captured.branches) | set(captured.tags))
        self.source_repo = icechunk.Repository.open(
            self.source_location.icechunk_storage(), config=self.source_location.icechunk_config()
        )
        existing = read_refs(self.target)
        if existing is not None and not existing.metadata.get(REPLICA_KEY):
            raise InvalidRoot(
                f"{self.target_location.url} holds a repository with history; replicate to it with "
                "--history full, or without history to another root"
            )
        tips: dict[str, str | None] = {}
        if existing is not None:
            self.target_repo = Repository.open(self.target_location.url, self.target_settings)
            self._map_target(existing, tips)
        pointers: set[str] = set()
        for name in chosen:
            kind, source_id = captured.named(name)
            self.report.refs.append(f"{kind} {name}")
            action = self._action(kind, name, source_id, existing, tips)
            if action is not None:
                self.actions.append(action)
                self.report.updated.append(f"{kind} {name}")
                if action.kind == "branch" or source_id not in self.reproduced:
                    pointers.add(self._pointer(source_id))
        if existing is not None:
            for name in sorted(set(existing.branches) - set(captured.branches)):
                (self.report.removed if prune and name != "main" else self.report.gone).append(f"branch {name}")
                if prune and name != "main":
                    self.to_prune.append(("branch", name))
            for name in sorted(set(existing.tags) - set(captured.tags)):
                (self.report.removed if prune else self.report.gone).append(f"tag {name}")
                if prune:
                    self.to_prune.append(("tag", name))
        self.report.branches = len(set(chosen) & set(captured.branches))
        self.report.tags = len(set(chosen) & set(captured.tags))
        self.report.snapshots = len({action.source_id for action in self.actions})
        self.tables.metadata_files = {self.source_location.join(TABLES_DIR, pointer) for pointer in pointers}
        self.tables.plan()

    def _map_target(self, existing: CapturedRefs, tips: dict[str, str | None]) -> None:
        """Fill ``reproduced``, and ``tips`` with the source snapshot each target branch's tip reproduces."""
        assert self.target_repo is not None
        target = self.target_repo.icechunk
        for info in history(target):  # newest first along each ref: the newest target version of a source one wins
            source_id = (info.metadata or {}).get(REPLICA_OF)
            if isinstance(source_id, str):
                self.reproduced.setdefault(source_id, info.id)
        for name, tip in existing.branches.items():
            source_id = (target.lookup_snapshot(tip).metadata or {}).get(REPLICA_OF)
            tips[name] = source_id if isinstance(source_id, str) else None

    def _action(
        self, kind: str, name: str, source_id: str, existing: CapturedRefs | None, tips: dict[str, str | None]
    ) -> _Action | None:
        if kind == "tag":
            if existing is not None and name in existing.tags:
                return None  # tags never move, at the source or here
            return _Action(kind, name, source_id, new=True)
        if existing is not None and name in existing.branches:
            reproduces = tips.get(name)
            if reproduces == source_id:
                return None
            if reproduces is not None and not self._descends(source_id, reproduces):
                self.report.moved.append(f"branch {name}")
            base, nearest = self._nearest(source_id)
            assert self.target_repo is not None
            tip = existing.branches[name]
            if base is not None and base != tip and reaches(self.target_repo.icechunk, base, tip):
                # A version the target made for another ref is newer and descends from this branch's: start there.
                return _Action(kind, name, source_id, base=base, reproduces=nearest, forward=True)
            return _Action(kind, name, source_id, reproduces=reproduces)
        return _Action(kind, name, source_id, new=True)  # its base is found when it is made

    def _nearest(self, source_id: str) -> tuple[str | None, str | None]:
        """The target snapshot reproducing the newest ancestor of ``source_id`` (and that ancestor)."""
        assert self.source_repo is not None
        if not self.reproduced:
            return None, None
        for info in self.source_repo.ancestry(snapshot_id=source_id):
            if info.id in self.reproduced:
                return self.reproduced[info.id], info.id
        return None, None

    def _descends(self, tip: str, ancestor: str) -> bool:
        assert self.source_repo is not None
        return reaches(self.source_repo, tip, ancestor)

    def _pointer(self, source_id: str, info: icechunk.SnapshotInfo | None = None) -> str:
        """The table pointer a source snapshot carries (``info``: the snapshot's, when at hand)."""
        assert self.source_repo is not None
        record = CommitMetadata.decode((info or self.source_repo.lookup_snapshot(source_id)).metadata)
        if record is None or record.items is None:
            raise InvalidRoot(f"source snapshot {source_id} carries no table pointer; it is not a floe version")
        return record.items

    # -- writing -------------------------------------------------------------------------------------

    def commit(self) -> None:
        """Each ref's new state, one Icechunk commit (or tag) each: branches first, so tags can reuse them."""
        if not self.actions:
            return
        target = self._target()
        for action in sorted(self.actions, key=lambda a: (a.kind != "branch", a.name)):
            if action.kind == "tag" and action.source_id in self.reproduced:
                with self.target_location.mutation_lock():
                    target.icechunk.create_tag(action.name, self.reproduced[action.source_id])
                continue
            branch = action.name if action.kind == "branch" else f"floe-replicate-{uuid.uuid4().hex[:12]}"
            if action.new:
                base, action.reproduces = self._nearest(action.source_id)
                if action.kind == "branch" and branch in target.icechunk.list_branches():
                    # main, made with the target at its empty version: every target version descends from it.
                    action.base, action.forward = base, base is not None
                else:
                    action.base = base or self._initial(target)
            if action.base is not None:
                with self.target_location.mutation_lock():
                    if action.forward:
                        target.icechunk.reset_branch(branch, action.base)
                    else:
                        target.icechunk.create_branch(branch, action.base)
                if action.kind == "branch" and action.reproduces == action.source_id:
                    continue  # a new branch at a version the target holds already
            snapshot_id = self._commit_version(target, branch, action)
            self.reproduced[action.source_id] = snapshot_id
            if action.kind == "tag":
                with self.target_location.mutation_lock():
                    target.icechunk.create_tag(action.name, snapshot_id)
                    target.icechunk.delete_branch(branch)

    def _target(self) -> Repository:
        """The target repository, created (empty, marked as a replica without history) by the first run."""
        if self.target_repo is not None:
            return self.target_repo
        target = Repository.create(self.target_location.url, self.target_settings)
        assert self.source_repo is not None
        containers = self.source_repo.config.virtual_chunk_containers or {}
        if containers:
            config = target.icechunk.config
            for container in containers.values():
                config.set_virtual_chunk_container(container)
            target.icechunk = target.icechunk.reopen(config=config)
            target.icechunk.save_config()
        target.icechunk.set_metadata({REPLICA_KEY: {"history": "none", "source": self.source_location.url}})
        self.target_repo = target
        return target

    def _initial(self, target: Repository) -> str:
        return [entry.snapshot_id for entry in target.log("main")][-1]

    def _commit_version(self, target: Repository, branch: str, action: _Action) -> str:
        assert self.source_repo is not None
        source_session = self.source_repo.readonly_session(snapshot_id=action.source_id)
        info = self.source_repo.lookup_snapshot(action.source_id)
        session = target.icechunk.writable_session(branch)
        changes = None
        if action.reproduces is not None and self._descends(action.source_id, action.reproduces):
            try:
                diff = self.source_repo.diff(from_snapshot_id=action.reproduces, to_snapshot_id=action.source_id)
                changes = None if diff.moved_nodes else diff
            except icechunk.IcechunkError as error:  # e.g. the old version was expired at the source
                log.info("no diff from %s (%s): comparing the whole version", action.reproduces, error)
        copier = _Copier(source_session.store, session.store, info.written_at)
        asyncio.run(copier.sync() if changes is None else copier.apply(changes))
        self.report.chunks_copied += copier.chunks
        self.report.chunk_bytes += copier.bytes
        location = self.target_location.join(TABLES_DIR, self._pointer(action.source_id, info))
        message = f"replica of {action.source_id}: {info.message}"
        landed = commit_change(
            target, session, branch, message, _ReplicaTable(location), caller_metadata={REPLICA_OF: action.source_id}
        )
        return landed.snapshot_id

    def prune(self, prune: bool) -> None:
        if not prune or not self.to_prune:
            return
        target = self._target()
        with self.target_location.mutation_lock():
            for kind, name in self.to_prune:
                if kind == "branch":
                    target.icechunk.delete_branch(name)
                else:
                    target.icechunk.delete_tag(name)


class _ReplicaTable(TableChange):
    """The table version of a replicated snapshot: its metadata.json, written at the target before the commit."""

    def __init__(self, metadata_location: str) -> None:
        self.metadata_location = metadata_location

    def apply(self, base: Base) -> AppliedChange:
        return AppliedChange(self.metadata_location)


def _is_metadata(key: str) -> bool:
    return key == "zarr.json" or key.endswith("/zarr.json")


def _node(key: str) -> str:
    """The node path of a metadata key (``""`` for the root group)."""
    return key[: -len("zarr.json")].rstrip("/")


def _meta_key(path: str) -> str:
    node = path.strip("/")
    return f"{node}/zarr.json" if node else "zarr.json"


def _chunk_key(array: str, metadata: dict[str, Any], coords: Iterable[int]) -> str:
    """The store key of one chunk, as the array's chunk key encoding spells it."""
    encoding = metadata.get("chunk_key_encoding") or {"name": "default"}
    name = encoding.get("name", "default")
    separator = (encoding.get("configuration") or {}).get("separator", "/" if name == "default" else ".")
    parts = [str(int(c)) for c in coords]
    suffix = (
        ("c" + separator + separator.join(parts) if parts else "c")
        if name == "default"
        else (separator.join(parts) or "0")
    )
    return f"{array.strip('/')}/{suffix}"


class _Copier:
    """Writes one source version into a target session, key by key, as stored (no decoding)."""

    def __init__(self, source: Any, target: Any, written_at: datetime) -> None:
        self.source, self.target = source, target
        # Icechunk keeps whole seconds: rounded up, a source written in the same second as the version still reads.
        self.written_at = (written_at + timedelta(seconds=1)).replace(microsecond=0)
        self.chunks = 0
        self.bytes = 0
        self.limit = asyncio.Semaphore(READS_IN_FLIGHT)
        self.metadata: dict[str, dict[str, Any]] = {}

    async def _get(self, store: Any, key: str) -> bytes | None:
        async with self.limit:
            buffer = await store.get(key, _BUFFERS)
        return None if buffer is None else buffer.to_bytes()

    async def _keys(self, store: Any) -> set[str]:
        return {key async for key in store.list_prefix("")}

    async def _copy_metadata(self, keys: Iterable[str], target_keys: set[str] | None) -> None:
        for key in sorted(keys, key=lambda k: k.count("/")):  # parents before children
            data = await self._get(self.source, key)
            if data is None:
                continue
            document = json.loads(data)
            if document.get("node_type") == "array":
                self.metadata[_node(key)] = document
            if target_keys is not None and key in target_keys and await self._get(self.target, key) == data:
                continue
            await self.target.set(key, _BUFFERS.buffer.from_bytes(data))

    async def _copy_chunks(self, array: str, only: set[tuple[int, ...]] | None) -> None:
        metadata = self.metadata.get(array) or json.loads((await self._get(self.source, _meta_key(array))) or b"{}")
        seen: set[tuple[int, ...]] = set()
        writes = []
        async for coords, kinds, paths, offsets, lengths, _ in self.source.array_chunk_iterator(array, 10_000):
            for row, listed in enumerate(coords.tolist()):
                position = tuple(listed)
                if only is not None and position not in only:
                    continue
                seen.add(position)
                key = _chunk_key(array, metadata, position)
                if int(kinds[row]) == 2:  # virtual: the same reference
                    self.target.set_virtual_ref(
                        key,
                        paths[row],
                        offset=int(offsets[row]),
                        length=int(lengths[row]),
                        checksum=self.written_at,
                    )
                else:
                    writes.append(self._copy_chunk(key))
        await asyncio.gather(*writes)
        for position in (only or set()) - seen:  # deleted at the source
            await self.target.delete(_chunk_key(array, metadata, position))

    async def _copy_chunk(self, key: str) -> None:
        data = await self._get(self.source, key)
        if data is None:
            return
        await self.target.set(key, _BUFFERS.buffer.from_bytes(data))
        self.chunks += 1
        self.bytes += len(data)

    async def sync(self) -> None:
        """Make the target session hold exactly the source version (a first copy, or no diff to follow)."""
        source_keys, target_keys = await self._keys(self.source), await self._keys(self.target)
        source_meta = {key for key in source_keys if _is_metadata(key)}
        # Chunks first, then nodes, the deepest first.
        for key in sorted(target_keys - source_keys, key=lambda k: (_is_metadata(k), -k.count("/"))):
            await self.target.delete(key)
        await self._copy_metadata(source_meta, target_keys)
        for array in sorted(self.metadata):
            await self._copy_chunks(array, None)

    async def apply(self, diff: icechunk.Diff) -> None:
        """Apply a diff between the version the target holds and the new source version."""
        for path in sorted(diff.deleted_arrays | diff.deleted_groups, key=lambda p: -p.count("/")):
            await self.target.delete_dir(path.strip("/"))
        changed = diff.new_groups | diff.new_arrays | diff.updated_groups | diff.updated_arrays
        await self._copy_metadata({_meta_key(path) for path in changed}, None)
        for path in sorted(diff.new_arrays):
            await self._copy_chunks(path.strip("/"), None)
        for path, positions in sorted(diff.updated_chunks.items()):
            if path in diff.new_arrays:
                continue
            await self._copy_chunks(path.strip("/"), {tuple(p) for p in positions})
