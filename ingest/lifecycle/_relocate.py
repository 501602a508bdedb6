"""Relocate a repository that was copied or moved: rewrite its table metadata for the root it is at now.

:func:`relocate` runs the steps of docs/lifecycle.md#copies-and-moves-floe-relocate, one :class:`_Relocation`
method each; only the copy is changed, never the root it came from. Why a copy needs it: docs/design.md §2
(relative pointers).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from pyiceberg.io import FileIO, InputFile, OutputFile

from ingest.errors import ReplicationFailed
from ingest.lifecycle._check import check
from ingest.lifecycle._live import MANIFEST, MANIFEST_LIST, METADATA, history_pointers, live_table_files
from ingest.lifecycle._rewrite import rebase_location, rewrite_manifest, rewrite_manifest_list, rewrite_metadata_json
from ingest.lifecycle._store import RootFiles
from ingest.repository import Repository, check_rooted, recorded_table_location, sentinel_branch
from ingest.storage import TABLES_DIR

log = logging.getLogger(__name__)


@dataclass
class RelocateReport:
    """What a relocation rewrote (or, in a dry run, would rewrite)."""

    root: str
    old_root: str | None
    """The root the metadata named (None: it names this root already, nothing to do)."""
    dry_run: bool
    rewritten: list[tuple[str, int]] = field(default_factory=list)
    """(path relative to the root, bytes) of each table metadata file rewritten."""


class _ReadHere(FileIO):
    """Reads each location the metadata names at the same path under this root instead of the old one."""

    def __init__(self, inner: FileIO, old_tables: str, new_tables: str) -> None:
        super().__init__(inner.properties)
        self._inner, self._old, self._new = inner, old_tables, new_tables

    def new_input(self, location: str) -> InputFile:
        return self._inner.new_input(rebase_location(location, self._old, self._new))

    def new_output(self, location: str) -> OutputFile:
        raise NotImplementedError("relocation reads through this FileIO; it writes with RootFiles")

    def delete(self, location: str | InputFile | OutputFile) -> None:
        raise NotImplementedError("relocation never deletes")


def relocate(repository: Repository, *, dry_run: bool = False) -> RelocateReport:
    """Rewrite the table metadata of a copied or moved repository for its root (docs/lifecycle.md, floe relocate).

    The manifests, manifest lists and metadata.json files of every version in
    any ref's history are rewritten in place, under this root, branch tips'
    metadata.json last; data files, Icechunk objects and the old root are not
    touched. Then every ref is checked. A repository whose metadata names this
    root already is left as it is.

    Args:
        repository: the repository, opened with ``moved_ok`` (:meth:`~ingest.repository.Repository.open` refuses
            a moved one otherwise).
        dry_run: list the files that would be rewritten; write nothing.

    Returns:
        This root, the root the metadata named (None: this one already, nothing done), and each file rewritten
        with its new size (in a dry run, each file that would be, with size 0).

    Raises:
        CorruptRepository: the tip of a branch carries no items-table pointer.
        UnreadableTableFile: a table file a version needs is missing here or cannot be parsed (nothing is
            rewritten yet).
        ReplicationFailed: a table file a version needs lies outside the recorded root's ``tables/`` (it cannot
            be relocated), or the repository does not check once rewritten (the message names the first problems).
        RepositoryMoved: once rewritten, the table metadata still names another root.
    """
    recorded = recorded_table_location(repository)
    if recorded == repository.table_location:
        return RelocateReport(repository.location.url, None, dry_run)
    run = _Relocation(repository, recorded.rsplit("/", 1)[0], dry_run)  # step 1: the recorded <old root>/tables
    run.find_live()
    if dry_run:
        run.list_only()
        return run.report
    run.rewrite_manifests()
    run.rewrite_manifest_lists()
    run.rewrite_metadata()
    run.verify()
    return run.report


class _Relocation:
    """One relocation; each method is a step of docs/lifecycle.md#copies-and-moves-floe-relocate."""

    def __init__(self, repository: Repository, old_tables: str, dry_run: bool) -> None:
        self.repository = repository
        self.old_tables, self.new_tables = old_tables, repository.location.tables_url
        self.files = RootFiles(repository.location)
        self.report = RelocateReport(repository.location.url, old_tables.rsplit("/", 1)[0], dry_run)
        self.by_kind: dict[str, list[str]] = {MANIFEST: [], MANIFEST_LIST: [], METADATA: []}
        self.manifests_of: dict[str, list[str]] = {}
        self.lengths: dict[str, int] = {}
        """Absolute location (under this root) -> bytes of each manifest rewritten."""

    def here(self, location: str) -> str:
        """The path under this root of a location the metadata names (under the old root or this one)."""
        path = self.files.relative(rebase_location(location, self.old_tables, self.new_tables))
        if path is None or not path.startswith(TABLES_DIR + "/"):
            raise ReplicationFailed(f"table file {location} lies outside {self.old_tables}; cannot relocate it")
        return path

    def find_live(self) -> None:
        """Step 2: the live set of every snapshot in any ref's history, read from this root's own files."""
        pointers = history_pointers(self.repository.icechunk)
        metadata_files = {self.repository.absolute_location(pointer) for pointer in pointers.values()}
        reader = _ReadHere(self.repository.io, self.old_tables, self.new_tables)
        live, _ = live_table_files(reader, metadata_files)
        for location, kind in live.kinds.items():
            if kind in self.by_kind:
                self.by_kind[kind].append(location)
        self.manifests_of = live.manifests_of

    def list_only(self) -> None:
        for kind in (MANIFEST, MANIFEST_LIST, METADATA):
            self.report.rewritten.extend((self.here(location), 0) for location in sorted(self.by_kind[kind]))

    def _write(self, path: str, data: bytes) -> None:
        self.files.write(path, data)
        self.report.rewritten.append((path, len(data)))

    def rewrite_manifests(self) -> None:
        """Step 3: each manifest's data-file locations, for this root."""
        for location in sorted(self.by_kind[MANIFEST]):
            path = self.here(location)
            at = self.files.absolute(path)
            data = rewrite_manifest(at, self.files.read(path), self.old_tables, self.new_tables)
            self._write(path, data)
            self.lengths[at] = len(data)

    def rewrite_manifest_lists(self) -> None:
        """Step 3: each manifest list's manifests, with the lengths they have now."""
        for location in sorted(self.by_kind[MANIFEST_LIST]):
            path = self.here(location)
            named = {rebase_location(m, self.old_tables, self.new_tables) for m in self.manifests_of[location]}
            lengths = {manifest: self.lengths[manifest] for manifest in named}
            data = self.files.read(path)
            self._write(
                path,
                rewrite_manifest_list(self.files.absolute(path), data, self.old_tables, self.new_tables, lengths),
            )

    def rewrite_metadata(self) -> None:
        """Step 4: every metadata.json, branch tips last and the one Repository.open checks last of all."""
        paths = [self.here(location) for location in self.by_kind[METADATA]]
        for path in _tips_last(self.repository, self.files, paths):
            self._write(path, rewrite_metadata_json(self.files.read(path), self.old_tables, self.new_tables))

    def verify(self) -> None:
        """Step 5: every ref's files read back, under this root."""
        self.repository.catalog.forget_metadata()  # what this process read before step 3 rewrote it in place
        problems = check(self.repository, all_refs=True)
        if problems:
            shown = "; ".join(str(problem) for problem in problems[:10])
            raise ReplicationFailed(f"relocated {self.repository.location.url}, but it does not check: {shown}")
        check_rooted(self.repository)
        log.info(
            "relocated %s from %s: %d files rewritten",
            self.report.root,
            self.report.old_root,
            len(self.report.rewritten),
        )


def _tips_last(repository: Repository, files: RootFiles, paths: list[str]) -> list[str]:
    """``paths`` with the branch tips' metadata.json at the end, the sentinel tip's (main, or the first) last."""
    sentinel = sentinel_branch(repository)
    order = [name for name in sorted(repository.icechunk.list_branches()) if name != sentinel] + [sentinel]
    tips = [files.relative(repository.metadata_location_of(repository.icechunk.lookup_branch(name))) for name in order]
    # Each tip once, at its last place in ``order`` (so the sentinel's stays last even if another branch shares it).
    last = list(reversed(dict.fromkeys(tip for tip in reversed(tips) if tip is not None)))
    return [path for path in sorted(set(paths)) if path not in last] + [tip for tip in last if tip in set(paths)]
