"""The table half of a replication: copy the Iceberg files some metadata.json files need, rewritten for the target.

Both replication modes use :class:`TableCopy` (``_replicate.py`` with history, ``_replicate_heads.py`` without,
there with ``current_only``). What it copies, rewrites and verifies, in which order:
docs/lifecycle.md#replication-floe-replicate (step 3) and #replicas-without-history.
"""

from __future__ import annotations

from collections.abc import Callable

from ingest._faults import fault_point
from ingest._threads import DaemonPool
from ingest.errors import ReplicationFailed, UnreadableTableFile
from ingest.lifecycle._avro import field_position, read_avro
from ingest.lifecycle._live import DATA, ID_SKETCH, MANIFEST, MANIFEST_LIST, METADATA, LiveFiles, live_table_files
from ingest.lifecycle._rewrite import (
    current_only_metadata_json,
    rewrite_manifest,
    rewrite_manifest_list,
    rewrite_metadata_json,
)
from ingest.lifecycle._store import RootFiles
from ingest.storage import TABLES_DIR

COPY_THREADS = 8


def copy_files(source: RootFiles, target: RootFiles, paths: list[str]) -> None:
    """Copy files byte for byte, several at a time; a file that cannot be read or written stops the run."""

    def copy_one(path: str) -> None:
        try:
            target.write(path, source.read(path))
            fault_point("replicate.between_copies")
        except OSError as error:  # e.g. a gc of the source removed it meanwhile, or the target refused the write
            raise ReplicationFailed(f"copying {path} failed: {error}; refs were not moved") from error

    with DaemonPool(COPY_THREADS, name="floe-copy") as pool:  # Ctrl-C leaves a stalled copy (refs never moved)
        list(pool.map(copy_one, paths))


def fail_on(problems: list[str], target_url: str) -> None:
    """Stop the run, naming the first problems, when the target did not verify."""
    if problems:
        shown = "; ".join(problems[:10])
        raise ReplicationFailed(
            f"target {target_url} did not verify ({len(problems)} problem(s): {shown}); refs were not moved"
        )


class TableCopy:
    """The table files some metadata.json files need, copied or rewritten for the target: plan, copy, verify."""

    def __init__(
        self, source: RootFiles, target: RootFiles, metadata_files: set[str], *, current_only: bool = False
    ) -> None:
        self.source, self.target = source, target
        self.source_prefix = source.location.tables_url
        self.target_prefix = target.location.tables_url
        self.metadata_files = metadata_files
        self.current_only = current_only
        self.target_tables: dict = {}
        self.live = LiveFiles()
        self.by_kind: dict[str, list[str]] = {DATA: [], ID_SKETCH: [], MANIFEST: [], MANIFEST_LIST: [], METADATA: []}
        self.to_copy: list[tuple[str, int]] = []
        """(path, bytes) of each data file to copy."""
        self.written: dict[str, int] = {}
        """Target path -> bytes of each table file rewritten in this run."""
        self.rewritten: list[tuple[str, int]] = []

    def relative(self, location: str) -> str:
        """A source table file's path relative to the root (the same path at the target)."""
        path = self.source.relative(location)
        if path is None or not path.startswith(TABLES_DIR + "/"):
            raise UnreadableTableFile(f"table file {location} lies outside {self.source_prefix}; cannot replicate it")
        return path

    def plan(self) -> None:
        """The table files the versions need that the target lacks."""
        self.target_tables = self.target.list(TABLES_DIR)
        try:
            self.live, _ = live_table_files(
                self.source.location.file_io(),
                self.metadata_files,
                skip=lambda location: self.relative(location) in self.target_tables,
                current_only=self.current_only,
            )
        except UnreadableTableFile as error:  # e.g. a gc of the source collected it after the refs were captured
            raise ReplicationFailed(f"{error}; refs were not moved (was the source collected meanwhile?)") from error
        for location, kind in self.live.kinds.items():
            self.by_kind[kind].append(location)
        for location in sorted(self.by_kind[DATA]):
            path = self.relative(location)
            have = self.target_tables.get(path)
            if have is None or have.size != self.live.recorded_sizes[location]:
                self.to_copy.append((path, self.live.recorded_sizes[location]))
        for location in sorted(self.by_kind[ID_SKETCH]):  # copied as they are: they name files by relative path
            path = self.relative(location)
            if path not in self.target_tables:
                stat = self.source.stat(path)
                self.to_copy.append((path, stat.size if stat else 0))

    def count_rewrites(self) -> list[tuple[str, int]]:
        """A dry run's tally of the table metadata files the target lacks (sizes as at the source)."""
        found = []
        for kind in (MANIFEST, MANIFEST_LIST, METADATA):
            for location in sorted(self.by_kind[kind]):
                path = self.relative(location)
                if path not in self.target_tables:
                    stat = self.source.stat(path)
                    found.append((path, stat.size if stat else 0))
        return found

    def copy(self) -> None:
        copy_files(self.source, self.target, [path for path, _ in self.to_copy])

    def rewrite(self, kind: str) -> None:
        """Write the table files of ``kind`` the target lacks, with their locations rewritten for it."""
        for location in sorted(self.by_kind[kind]):
            path = self.relative(location)
            if path in self.target_tables or path in self.written:
                continue
            try:
                data = self.source.read(path)
            except OSError as error:
                raise ReplicationFailed(f"reading {path} failed: {error}; refs were not moved") from error
            at_target = self.target_prefix + location[len(self.source_prefix) :]
            if kind == MANIFEST:
                new = rewrite_manifest(at_target, data, self.source_prefix, self.target_prefix)
            elif kind == MANIFEST_LIST:
                lengths = self._manifest_lengths(location)
                new = rewrite_manifest_list(at_target, data, self.source_prefix, self.target_prefix, lengths)
            else:
                if self.current_only:
                    data = current_only_metadata_json(data)
                new = rewrite_metadata_json(data, self.source_prefix, self.target_prefix)
            self.target.write(path, new)
            fault_point("replicate.between_rewrites")
            self.written[path] = len(new)
            self.rewritten.append((path, len(new)))

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

    def write(self) -> None:
        """Copy the data files, then rewrite the manifests and manifest lists (metadata.json waits for verify)."""
        self.copy()
        self.rewrite(MANIFEST)
        self.rewrite(MANIFEST_LIST)

    def verify_and_finish(self, extra_problems: Callable[[], list[str]] | None = None) -> None:
        """Verify what the versions need, then write the metadata.json files and check they are there.

        metadata.json files go last, once what they need has verified: a
        metadata.json at the target means its files are there, so later runs
        need not walk it again.
        """
        problems = self._problems()
        if extra_problems is not None:
            problems += extra_problems()
        fail_on(problems, self.target.location.url)
        self.rewrite(METADATA)
        present = self.target.list(TABLES_DIR)
        fail_on(
            [
                f"{self.relative(location)}: missing"
                for location in self.metadata_files
                if self.relative(location) not in present
            ],
            self.target.location.url,
        )

    def _problems(self) -> list[str]:
        problems: list[str] = []
        target_tables = self.target.list(TABLES_DIR)
        for location, kind in self.live.kinds.items():
            if kind == METADATA:
                continue  # written after this verification
            path = self.relative(location)
            have = target_tables.get(path)
            if have is None:
                problems.append(f"{path}: missing")
            elif kind == DATA and have.size != self.live.recorded_sizes[location]:
                problems.append(f"{path}: {have.size} bytes, the table records {self.live.recorded_sizes[location]}")
        for location in self.by_kind[MANIFEST_LIST]:
            path = self.relative(location)
            if path not in self.written:
                continue
            schema, _, manifests = read_avro(self.target.read(path))
            path_at = field_position(schema.fields, "manifest_path")
            length_at = field_position(schema.fields, "manifest_length")
            for manifest in manifests:
                named, length = manifest[path_at], manifest[length_at]
                manifest_path = self.target.relative(named)
                have = target_tables.get(manifest_path or "")
                if manifest_path is None or not named.startswith(self.target_prefix + "/"):
                    problems.append(f"{path}: names {named}, outside the target")
                elif have is None or have.size != length:
                    problems.append(f"{manifest_path}: not the {length} bytes {path} records")
        return problems
