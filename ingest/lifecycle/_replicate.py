"""Replicate a floe repository to another root (local or S3, either direction), incrementally.

What moves, and in which order:

1. **The ref set is captured first**: Icechunk 2 keeps every branch, tag and the
   snapshot history (with commit metadata, hence floe's pointers) in one object,
   ``arrays/repo``. Its bytes are read once; everything below is computed from
   that copy (opened as a throw-away local Icechunk repository), so a source
   being written meanwhile is copied at one consistent set of refs.
2. **Icechunk objects** (``chunks/``, ``manifests/``, ``snapshots/``,
   ``transactions/``, ...) are immutable and content-addressed: those the target
   lacks (by name and size) are copied byte for byte. They are listed *after*
   the ref set was captured, and Icechunk writes a commit's objects before it
   moves a ref, so the listing holds every object the captured refs need.
   ``arrays/overwritten/`` (Icechunk's backups of old ``repo`` objects) is not
   copied.
3. **Iceberg files** reachable from the captured history: data files are copied
   as they are; manifests, manifest lists and metadata.json files hold absolute
   locations and are rewritten for the target root (manifests first, so the
   manifest lists can record the rewritten manifests' lengths; metadata.json
   last, after step 4 verified what it needs). A metadata.json the target
   already has was written after everything it needs had verified, in an
   earlier run, so its files are not walked again: later runs cost what the
   new commits wrote. floe's pointers are relative to
   ``<root>/tables/``, so the Icechunk objects stay byte-identical.
4. **Verify** the target: every Icechunk object with the source's size, every
   table file the captured history needs present, data files with their
   recorded sizes, the manifest lists written in this run recording the target
   manifests' real lengths. Only then are the metadata.json files written (and
   checked). On any problem, stop: no ref moves.
5. **Refs move last**: the captured ``repo`` object is written to the target in
   one atomic write (an S3 PUT, or a rename locally, under the target's lock).
   A reader of the target sees the old version or the new one, never a half-copied one.

The target is a replica: commits made to it are overwritten by the next run.
Both roots are reached with the same S3 settings (``Settings.s3``); to copy
between two S3 services, replicate through a local root.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import icechunk

from ingest._faults import fault_point
from ingest.config import Settings, load_settings
from ingest.errors import InvalidRoot, ReplicationFailed, RepositoryNotFound, UnreadableTableFile
from ingest.lifecycle._avro import field_position, read_avro
from ingest.lifecycle._live import (
    DATA,
    MANIFEST,
    MANIFEST_LIST,
    METADATA,
    LiveFiles,
    history_pointers,
    live_table_files,
)
from ingest.lifecycle._rewrite import rewrite_manifest, rewrite_manifest_list, rewrite_metadata_json
from ingest.lifecycle._store import FileStat, RootFiles
from ingest.storage import ARRAYS_DIR, TABLES_DIR, Location, quiet_icechunk_logs

log = logging.getLogger(__name__)

REPO_OBJECT = f"{ARRAYS_DIR}/repo"
NOT_COPIED = (f"{ARRAYS_DIR}/overwritten/",)
COPY_THREADS = 8


@dataclass
class ReplicateReport:
    """What a replication copied (or, in a dry run, would copy)."""

    source: str
    target: str
    dry_run: bool
    branches: int = 0
    tags: int = 0
    snapshots: int = 0
    copied: list[tuple[str, int]] = field(default_factory=list)
    """(path relative to the root, bytes) of each file copied byte for byte (Icechunk objects, data files)."""
    rewritten: list[tuple[str, int]] = field(default_factory=list)
    """(path, bytes written) of each Iceberg metadata file rewritten for the target."""
    refs_moved: bool = False

    @property
    def files_written(self) -> list[str]:
        return [path for path, _ in self.copied + self.rewritten]

    @property
    def bytes_written(self) -> int:
        return sum(size for _, size in self.copied + self.rewritten)


def _capture_refs(repo_bytes: bytes) -> tuple[dict[str, str], int, int]:
    """Pointers of every snapshot in the captured history, and the branch and tag counts."""
    with tempfile.TemporaryDirectory(prefix="floe-refs-") as directory:
        (Path(directory) / "repo").write_bytes(repo_bytes)
        captured = icechunk.Repository.open(icechunk.local_filesystem_storage(directory))
        pointers = history_pointers(captured)
        return pointers, len(captured.list_branches()), len(captured.list_tags())


def replicate(
    source_root: str, target_root: str, settings: Settings | None = None, *, dry_run: bool = False
) -> ReplicateReport:
    """Copy the repository at ``source_root`` to ``target_root``: only what the target lacks, refs last."""
    settings = settings or load_settings()
    quiet_icechunk_logs()
    source_location = Location.parse(source_root, settings)
    target_location = Location.parse(target_root, settings)
    if source_location.url == target_location.url:
        raise InvalidRoot(f"source and target are the same root {source_location.url}")
    run = _Replication(source_location, target_location, dry_run)
    run.capture_refs()  # 1
    run.plan_copies()  # 2, 3
    if dry_run:
        run.count_rewrites()
        return run.report
    run.copy()
    run.rewrite(MANIFEST)
    run.rewrite(MANIFEST_LIST)
    run.verify()  # 4
    run.move_refs()  # 5
    return run.report


class _Replication:
    """One run of the protocol in this module's docstring; each method is one of its steps."""

    def __init__(self, source_location: Location, target_location: Location, dry_run: bool) -> None:
        self.source_location, self.target_location = source_location, target_location
        self.source, self.target = RootFiles(source_location), RootFiles(target_location)
        self.source_prefix, self.target_prefix = source_location.tables_url, target_location.tables_url
        self.report = ReplicateReport(source_location.url, target_location.url, dry_run)
        self.repo_bytes = b""
        self.metadata_files: set[str] = set()
        self.source_objects: dict[str, FileStat] = {}
        self.target_tables: dict[str, FileStat] = {}
        self.live = LiveFiles()
        self.by_kind: dict[str, list[str]] = {DATA: [], MANIFEST: [], MANIFEST_LIST: [], METADATA: []}
        self.written: dict[str, int] = {}
        """Target path -> bytes of each table file rewritten in this run."""

    def relative(self, location: str) -> str:
        """A source table file's path relative to the root (the same path at the target)."""
        path = self.source.relative(location)
        if path is None or not path.startswith(TABLES_DIR + "/"):
            raise UnreadableTableFile(f"table file {location} lies outside {self.source_prefix}; cannot replicate it")
        return path

    def capture_refs(self) -> None:
        """Step 1: the ref set, captured once (the bytes of ``arrays/repo``), and every pointer of its history."""
        if self.source.stat(REPO_OBJECT) is None:
            raise RepositoryNotFound(f"no floe repository at {self.source_location.url}")
        self.repo_bytes = self.source.read(REPO_OBJECT)
        pointers, self.report.branches, self.report.tags = _capture_refs(self.repo_bytes)
        self.report.snapshots = len(pointers)
        self.metadata_files = {self.source_location.join(TABLES_DIR, pointer) for pointer in pointers.values()}

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
        self.target_tables = self.target.list(TABLES_DIR)
        self.live, _ = live_table_files(
            self.source_location.file_io(),
            self.metadata_files,
            skip=lambda location: self.relative(location) in self.target_tables,
        )
        for location, kind in self.live.kinds.items():
            self.by_kind[kind].append(location)
        data_to_copy = []
        for location in sorted(self.by_kind[DATA]):
            path = self.relative(location)
            have = self.target_tables.get(path)
            if have is None or have.size != self.live.recorded_sizes[location]:
                data_to_copy.append((path, self.live.recorded_sizes[location]))
        self.report.copied = missing_objects + data_to_copy

    def count_rewrites(self) -> None:
        """A dry run's tally of the table metadata files the target lacks (sizes as at the source)."""
        for kind in (MANIFEST, MANIFEST_LIST, METADATA):
            for location in sorted(self.by_kind[kind]):
                path = self.relative(location)
                if path not in self.target_tables:
                    stat = self.source.stat(path)
                    self.report.rewritten.append((path, stat.size if stat else 0))

    def copy(self) -> None:
        """Steps 2 and 3: copy the objects and data files byte for byte, several at a time."""

        def copy_one(path: str) -> None:
            try:
                self.target.write(path, self.source.read(path))
                fault_point("replicate.between_copies")
            except OSError as error:  # e.g. a gc of the source removed it meanwhile, or the target refused the write
                raise ReplicationFailed(f"copying {path} failed: {error}; refs were not moved") from error

        with ThreadPoolExecutor(COPY_THREADS) as pool:
            list(pool.map(copy_one, [path for path, _ in self.report.copied]))

    def rewrite(self, kind: str) -> None:
        """Step 3: write the table files of ``kind`` the target lacks, with their locations rewritten for it."""
        for location in sorted(self.by_kind[kind]):
            path = self.relative(location)
            if path in self.target_tables or path in self.written:
                continue
            data = self.source.read(path)
            at_target = self.target_prefix + location[len(self.source_prefix) :]
            if kind == MANIFEST:
                new = rewrite_manifest(at_target, data, self.source_prefix, self.target_prefix)
            elif kind == MANIFEST_LIST:
                lengths = self._manifest_lengths(location)
                new = rewrite_manifest_list(at_target, data, self.source_prefix, self.target_prefix, lengths)
            else:
                new = rewrite_metadata_json(data, self.source_prefix, self.target_prefix)
            self.target.write(path, new)
            fault_point("replicate.between_rewrites")
            self.written[path] = len(new)
            self.report.rewritten.append((path, len(new)))

    def _manifest_lengths(self, manifest_list: str) -> dict[str, int]:
        """Target location -> length of each manifest a manifest list names (rewritten now, or earlier)."""
        lengths = {}
        for manifest in self.live.manifests_of[manifest_list]:
            manifest_path = self.relative(manifest)
            size = self.written.get(manifest_path)
            if size is None:
                size = self.target_tables[manifest_path].size
            lengths[self.target_prefix + manifest[len(self.source_prefix) :]] = size
        return lengths

    def verify(self) -> None:
        """Step 4: verify before any ref moves, then write the metadata.json files and check they are there.

        metadata.json files go last, once what they need has verified: a
        metadata.json at the target means its files are there, so later runs
        need not walk it again.
        """
        self._fail_on(
            _verify(
                self.source_objects,
                self.live,
                self.by_kind,
                self.written,
                self.relative,
                self.target,
                self.target_prefix,
            )
        )
        self.rewrite(METADATA)
        present = self.target.list(TABLES_DIR)
        self._fail_on(
            [
                f"{self.relative(location)}: missing"
                for location in self.metadata_files
                if self.relative(location) not in present
            ]
        )

    def _fail_on(self, problems: list[str]) -> None:
        if problems:
            shown = "; ".join(problems[:10])
            raise ReplicationFailed(
                f"target {self.target_location.url} did not verify ({len(problems)} problem(s): {shown}); "
                "refs were not moved"
            )

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


def _verify(  # noqa: PLR0917 - the pieces of one replication
    source_objects: dict[str, FileStat],
    live: LiveFiles,
    by_kind: dict[str, list[str]],
    written: dict[str, int],
    relative: Callable[[str], str],
    target: RootFiles,
    target_prefix: str,
) -> list[str]:
    problems: list[str] = []
    target_objects = target.list(ARRAYS_DIR)
    for path, stat in source_objects.items():
        have = target_objects.get(path)
        if have is None or have.size != stat.size:
            problems.append(f"{path}: {'missing' if have is None else f'{have.size} bytes, expected {stat.size}'}")
    target_tables = target.list(TABLES_DIR)
    for location, kind in live.kinds.items():
        if kind == METADATA:
            continue  # written after this verification
        path = relative(location)
        have = target_tables.get(path)
        if have is None:
            problems.append(f"{path}: missing")
        elif kind == DATA and have.size != live.recorded_sizes[location]:
            problems.append(f"{path}: {have.size} bytes, the table records {live.recorded_sizes[location]}")
    for location in by_kind[MANIFEST_LIST]:
        path = relative(location)
        if path not in written:
            continue
        schema, _, manifests = read_avro(target.read(path))
        path_at = field_position(schema.fields, "manifest_path")
        length_at = field_position(schema.fields, "manifest_length")
        for manifest in manifests:
            named, length = manifest[path_at], manifest[length_at]
            manifest_path = target.relative(named)
            have = target_tables.get(manifest_path or "")
            if manifest_path is None or not named.startswith(target_prefix + "/"):
                problems.append(f"{path}: names {named}, outside the target")
            elif have is None or have.size != length:
                problems.append(f"{manifest_path}: not the {length} bytes {path} records")
    return problems
