"""A floe repository: open or create it, resolve refs, read any version, tag, branch, log, collections.

Every commit it makes (the first version, a collection's group) and every
writer it opens goes through the protocol of :mod:`ingest.repository._commit`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

import icechunk

from ingest._faults import fault_point
from ingest.config import Settings, load_settings
from ingest.errors import (
    CorruptRepository,
    RefNotFound,
    RepositoryExists,
    RepositoryNotFound,
)
from ingest.repository._collections import CollectionGroups, collection_groups, store_collection
from ingest.repository._commit import (
    decode_pointer,
    encode_pointer,
    newest_cursors,
)
from ingest.repository._containers import allow_sources, authorizing, container_access, with_stored_config
from ingest.repository._create import (
    commit_first_version,
    icechunk_repository,
    reaching,
    stack_config,
)
from ingest.repository._groups import ensure_groups
from ingest.repository._history import LogEntry, Ref, check_ref_name, create_ref, history, resolve_ref
from ingest.repository._layout import check_repository_layout, root_attributes
from ingest.repository._rooted import ITEMS_TABLE_DIR, check_rooted
from ingest.repository._slots import NextSlots
from ingest.repository._snapshots import KnownSnapshots
from ingest.storage import TABLES_DIR, Location, quiet_icechunk_logs

if TYPE_CHECKING:
    # PyIceberg, PyArrow and the writing and reading halves of the repository take about a second to import:
    # a process that lists refs or history (`floe refs`, `floe log`) never needs them, so they load when used.
    from pyiceberg.io.pyarrow import PyArrowFileIO
    from pyiceberg.table import Table

    from ingest.repository._append import ManifestCache
    from ingest.repository._catalog import PointerCatalog
    from ingest.repository._optimize import OptimizeResult, ProgressCallback
    from ingest.repository._view import View
    from ingest.repository._writer import Writer

log = logging.getLogger(__name__)


class Repository:
    """A floe repository: an Icechunk repository whose commits carry the items table's pointer.

    Use :meth:`create`, :meth:`open` or :meth:`open_or_create`.
    """

    def __init__(self, location: Location, settings: Settings, repo: icechunk.Repository) -> None:
        self.location = location
        self.settings = settings
        self.icechunk = repo
        self.known = KnownSnapshots(lambda: self.icechunk)
        """Pointers and read-only sessions of the snapshots read so far (they never change)."""
        self.next_slots = NextSlots()
        """The next free slot of stacks at the snapshots this process listed or committed (see
        :class:`~ingest.repository._slots.NextSlots`)."""

    # -- opening -----------------------------------------------------------------------------
    @classmethod
    def create(
        cls, root: str | os.PathLike[str] | None = None, settings: Settings | None = None, *, force: bool = False
    ) -> Repository:
        """Create an empty repository at ``root``: the Icechunk repository and version 0 of the items table.

        A root where an earlier creation stopped (Icechunk's repository is there, floe's first commit is not:
        a crash, a store that refused the table's first file) is completed, or with ``force`` removed and
        created anew.

        Args:
            root: a local path or ``s3://bucket/prefix`` (default: the configured root).
            settings: floe's settings (default: :func:`~ingest.config.load_settings`).
            force: replace a half-made repository instead of completing it (never a complete one).

        Returns:
            The repository, opened.

        Raises:
            RepositoryExists: a complete floe repository is at ``root`` (or another process completed it first).
            StoreUnreachable: the store cannot be reached, or its bucket does not exist; nothing was written.
            InvalidSettings: the S3 settings contradict each other; nothing was written.
        """
        settings = settings or load_settings()
        location = Location.parse(root if root is not None else settings.root, settings)
        quiet_icechunk_logs()
        repo = icechunk_repository(location, stack_config(settings.arrays.manifest_split), force=force)
        fault_point("create.before_first_commit")
        self = cls(location, settings, repo)
        snapshot_id = commit_first_version(self, root_attributes(settings), location.join(TABLES_DIR, ITEMS_TABLE_DIR))
        if settings.branch != "main":
            with location.mutation_lock():
                repo.create_branch(check_ref_name(settings.branch), snapshot_id)
        log.info("created floe repository at %s", location.url)
        return self

    @classmethod
    def open(
        cls, root: str | os.PathLike[str] | None = None, settings: Settings | None = None, *, moved_ok: bool = False
    ) -> Repository:
        """Open the repository at ``root`` (default: the configured root).

        Raises ``RepositoryMoved`` when the repository was copied or moved here
        and its table metadata still names the root it came from (``floe
        relocate`` fixes that; it opens with ``moved_ok``).

        Args:
            root: a local path or ``s3://bucket/prefix`` (default: the configured root).
            settings: floe's settings (default: :func:`~ingest.config.load_settings`).
            moved_ok: open a repository whose table metadata names another root, without checking it (and without
                keeping table objects in ``api.cache_dir``).

        Returns:
            The repository, opened.

        Raises:
            RepositoryNotFound: no repository is at ``root``, or only Icechunk's is, without floe's first commit
                (its creation is under way or stopped).
            RepositoryMoved: the table metadata names the root the repository was copied or moved from (unless
                ``moved_ok``).
            UnsupportedLayout: an earlier floe laid out the repository's arrays otherwise.
            CorruptRepository: the tip of the branch checked for the table's location carries no items-table
                pointer (unless ``moved_ok``).
            StoreUnreachable: the store cannot be reached, or its bucket does not exist.
            InvalidRoot: ``root`` is neither a local path nor ``s3://bucket/prefix``.
            InvalidSettings: the S3 settings contradict each other.
        """
        settings = settings or load_settings()
        location = Location.parse(root if root is not None else settings.root, settings)
        quiet_icechunk_logs()
        storage = location.icechunk_storage()
        with reaching(location):
            try:
                # No exists() first: a round trip more on object storage.
                repo = icechunk.Repository.open(storage, config=location.icechunk_config())
            except icechunk.RepositoryNotFoundError:
                location.probe()  # a missing bucket says so, rather than "no repository"
                raise RepositoryNotFound(
                    f"no floe repository at {location.url} (create one with `floe init`)"
                ) from None
        access = container_access(repo.config, *authorizing(settings))
        if access:
            # Virtual references read only through authorized containers.
            repo = repo.reopen(authorize_virtual_chunk_access=access)
        repository = cls(location, settings, repo)
        main_tip = check_repository_layout(repository)
        if not moved_ok:
            check_rooted(repository, main_tip)  # the tip the layout check read: no second look-up
            repository.keep_objects_on_disk()
        return repository

    def keep_objects_on_disk(self) -> None:
        """On object storage with ``api.cache_dir`` set, keep the table objects read and written in that directory
        (:class:`ingest.remote.DiskCache`).

        Only once :func:`~ingest.repository.check_rooted` passed: a copy not yet
        relocated holds metadata that ``floe relocate`` rewrites in place, which
        must never be kept.
        """
        api = self.settings.api
        if not api.cache_dir or self.location.is_local:
            return
        from ingest.remote import DiskCache, ObjectFileIO

        if isinstance(self.io, ObjectFileIO):
            self.io.keep_on_disk(DiskCache(api.cache_dir, api.cache_dir_mb << 20))

    @classmethod
    def open_or_create(cls, root: str | os.PathLike[str] | None = None, settings: Settings | None = None) -> Repository:
        """Open the repository at ``root``, or create it there if there is none (completing a half-made one).

        Args:
            root: a local path or ``s3://bucket/prefix`` (default: the configured root).
            settings: floe's settings (default: :func:`~ingest.config.load_settings`).

        Returns:
            The repository, opened.

        Raises:
            RepositoryMoved: the table metadata names the root the repository was copied or moved from.
            UnsupportedLayout: an earlier floe laid out the repository's arrays otherwise.
            StoreUnreachable: the store cannot be reached, or its bucket does not exist.
            InvalidRoot: ``root`` is neither a local path nor ``s3://bucket/prefix``.
            InvalidSettings: the S3 settings contradict each other.
        """
        try:
            return cls.open(root, settings)
        except RepositoryNotFound:
            try:
                return cls.create(root, settings)
            except RepositoryExists:
                return cls.open(root, settings)

    # -- where the table lives --------------------------------------------------------------------
    @cached_property
    def io(self) -> PyArrowFileIO:
        """The FileIO that reads and writes this root's table files (made when first used)."""
        return self.location.file_io()

    @cached_property
    def catalog(self) -> PointerCatalog:
        """The Iceberg catalog whose table lives at a pointer (made when first used)."""
        from ingest.repository._catalog import PointerCatalog

        return PointerCatalog(self.io, snapshot_log=self.settings.commit.snapshot_log)

    @cached_property
    def manifests(self) -> ManifestCache:
        """The table manifests read so far, shared by the writers of this object (manifests never change)."""
        from ingest.repository._append import ManifestCache

        return ManifestCache(self.io)

    @property
    def table_location(self) -> str:
        """Where this root's items table lives: what its metadata records as ``location``."""
        return self.location.join(TABLES_DIR, ITEMS_TABLE_DIR)

    # -- virtual references -------------------------------------------------------------------
    def allow_virtual_sources(self, paths: Sequence[str | os.PathLike[str]]) -> list[str]:
        """Let this repository hold virtual references to ``paths`` (local files, ``s3://`` or ``http(s)://``
        objects; idempotent).

        Adds a container for each top-level directory, bucket or host none
        covers yet (``_containers.py``), saves the config and reopens this
        repository with access to it. Sessions opened before (writers too)
        keep the old config: call it before opening the writers that
        reference them. Returns the container prefixes added.

        Args:
            paths: local paths, ``file://``, ``s3://`` or ``http(s)://`` URLs of the files to reference.

        Returns:
            The container prefixes added (empty when containers covered every path already).

        Raises:
            ValueError: a path no container can cover (a local file not below a top-level directory, a URL that
                names no bucket or host), or a local path with characters a ``file://`` URL would have to escape.
        """
        from ingest.remote import Buckets

        s3, anonymous, tokens = authorizing(self.settings)
        buckets = Buckets.of(s3, self.settings.remote)
        self.icechunk, added = allow_sources(
            self.icechunk, self.location, paths, s3, anonymous, buckets=buckets, tokens=tokens
        )
        if added:
            log.info("repository %s may now reference files under %s", self.location.url, ", ".join(added))
        return added

    def reload_config(self) -> None:
        """Read the stored config again (containers other processes added, e.g. a ``--virtual`` run's actors)
        and authorize its containers; sessions opened before keep the old config."""
        self.icechunk = with_stored_config(self.icechunk, self.location.icechunk_storage(), *authorizing(self.settings))

    # -- pointers ------------------------------------------------------------------------------
    def relative_location(self, metadata_location: str) -> str:
        """A metadata.json location relative to ``<root>/tables/`` (the pointer commits carry).

        Args:
            metadata_location: the absolute location of a metadata.json under ``<root>/tables/``.

        Returns:
            The pointer: that location relative to ``<root>/tables/``.

        Raises:
            CorruptRepository: ``metadata_location`` is not under ``<root>/tables/``.
        """
        return encode_pointer(self.location.tables_url, metadata_location)

    def absolute_location(self, relative: str) -> str:
        """The location of the metadata.json a pointer names.

        Args:
            relative: a pointer, relative to ``<root>/tables/``.

        Returns:
            The absolute location of the metadata.json.
        """
        return decode_pointer(self.location.tables_url, relative)

    def metadata_location_of(self, snapshot_id: str) -> str:
        """The items table's metadata.json location recorded by snapshot ``snapshot_id``.

        Args:
            snapshot_id: the snapshot to read the pointer of.

        Returns:
            The absolute location of the metadata.json.

        Raises:
            RefNotFound: no snapshot ``snapshot_id`` exists.
            CorruptRepository: the snapshot carries no items-table pointer.
        """
        try:
            pointer = self.known.pointer(snapshot_id)
        except icechunk.IcechunkError as error:
            raise RefNotFound(f"snapshot {snapshot_id} does not exist") from error
        if pointer is None:
            raise CorruptRepository(f"snapshot {snapshot_id} carries no items-table pointer")
        return self.absolute_location(pointer)

    def table_at(self, snapshot_id: str) -> Table:
        """The items table as snapshot ``snapshot_id`` records it.

        Args:
            snapshot_id: the snapshot whose table version to load.

        Returns:
            The Iceberg table at that version.

        Raises:
            RefNotFound: no snapshot ``snapshot_id`` exists.
            CorruptRepository: the snapshot carries no items-table pointer.
        """
        return self.catalog.load_at(self.metadata_location_of(snapshot_id))

    # -- refs, history, collections --------------------------------------------------------------
    def resolve(self, ref: str | None = None) -> str:
        """The snapshot id a ref names: a branch, a tag or a snapshot id (in that order).

        Prefix with ``branch:``, ``tag:`` or ``snapshot:`` to be explicit.

        Args:
            ref: a branch, a tag or a snapshot id, optionally prefixed ``branch:``, ``tag:`` or ``snapshot:``
                (default: the configured branch).

        Returns:
            The snapshot id.

        Raises:
            RefNotFound: no branch, tag or snapshot of that name exists.
        """
        return self.resolve_ref(ref)[1]

    def resolve_ref(self, ref: str | None = None) -> tuple[str, str]:
        """What a ref names: ``("branch" | "tag" | "snapshot", snapshot id)``, looked up in :meth:`resolve`'s order
        (one request for a branch: a caller can tell what never changes without listing the branches).

        Args:
            ref: a branch, a tag or a snapshot id, optionally prefixed ``branch:``, ``tag:`` or ``snapshot:``
                (default: the configured branch).

        Returns:
            What the ref names (``"branch"``, ``"tag"`` or ``"snapshot"``) and its snapshot id.

        Raises:
            RefNotFound: no branch, tag or snapshot of that name exists.
        """
        return resolve_ref(self, ref or self.settings.branch)

    def view(self, ref: str | None = None) -> View:
        """Read the repository at ``ref`` (default: the configured branch).

        Args:
            ref: a branch, a tag or a snapshot id, optionally prefixed ``branch:``, ``tag:`` or ``snapshot:``
                (default: the configured branch).

        Returns:
            The repository at the snapshot ``ref`` resolves to now.

        Raises:
            RefNotFound: no branch, tag or snapshot of that name exists.
            CorruptRepository: the snapshot carries no items-table pointer.
        """
        from ingest.repository._view import View

        return View(self, ref or self.settings.branch, self.resolve(ref))

    def refs(self) -> list[Ref]:
        """Every branch and tag with the snapshot it points at.

        Returns:
            The branches, then the tags, each sorted by name.
        """
        found = [
            Ref(name, "branch", self.icechunk.lookup_branch(name)) for name in sorted(self.icechunk.list_branches())
        ]
        found += [Ref(name, "tag", self.icechunk.lookup_tag(name)) for name in sorted(self.icechunk.list_tags())]
        return found

    def tag(self, name: str, ref: str | None = None) -> str:
        """Tag the snapshot ``ref`` resolves to; tags never move. Returns the snapshot id.

        Args:
            name: the tag's name: letters, digits, ``.``, ``_`` and ``-``, starting with a letter or digit.
            ref: a branch, a tag or a snapshot id, optionally prefixed ``branch:``, ``tag:`` or ``snapshot:``
                (default: the configured branch).

        Returns:
            The snapshot id tagged.

        Raises:
            InvalidRefName: ``name`` is not a valid tag name.
            RefNotFound: ``ref`` names no branch, tag or snapshot.
            CorruptRepository: the snapshot carries no items-table pointer.
            RefExists: a tag named ``name`` exists already.
        """
        return create_ref(self, "tag", name, ref)

    def branch(self, name: str, from_ref: str | None = None) -> str:
        """Create branch ``name`` at the snapshot ``from_ref`` resolves to. Returns the snapshot id.

        Args:
            name: the branch's name: letters, digits, ``.``, ``_`` and ``-``, starting with a letter or digit.
            from_ref: a branch, a tag or a snapshot id, optionally prefixed ``branch:``, ``tag:`` or ``snapshot:``
                (default: the configured branch).

        Returns:
            The snapshot id the new branch points at.

        Raises:
            InvalidRefName: ``name`` is not a valid branch name.
            RefNotFound: ``from_ref`` names no branch, tag or snapshot.
            CorruptRepository: the snapshot carries no items-table pointer.
            RefExists: a branch named ``name`` exists already.
        """
        return create_ref(self, "branch", name, from_ref)

    def log(self, ref: str | None = None, limit: int | None = None, *, housekeeping: bool = True) -> list[LogEntry]:
        """The history leading to ``ref``, newest first (floe commits only); without ``housekeeping``, floe's own
        commits (:attr:`LogEntry.housekeeping`) are left out, and ``limit`` counts the others.

        Args:
            ref: a branch, a tag or a snapshot id, optionally prefixed ``branch:``, ``tag:`` or ``snapshot:``
                (default: the configured branch).
            limit: at most this many entries (default: all).
            housekeeping: include floe's own commits, which change no rows.

        Returns:
            The commits, newest first.

        Raises:
            RefNotFound: no branch, tag or snapshot of that name exists.
        """
        return history(self.icechunk, self.resolve(ref), self.absolute_location, limit=limit, housekeeping=housekeeping)

    def source_cursors(self, ref: str | None = None) -> dict[str, str]:
        """The newest cursor each STAC API search recorded in the history of ``ref`` (``floe ingest --since last``).

        Args:
            ref: a branch, a tag or a snapshot id, optionally prefixed ``branch:``, ``tag:`` or ``snapshot:``
                (default: the configured branch).

        Returns:
            Search -> its newest cursor (empty if no commit recorded one).

        Raises:
            RefNotFound: no branch, tag or snapshot of that name exists.
        """
        return newest_cursors(info.metadata for info in self.icechunk.ancestry(snapshot_id=self.resolve(ref)))

    def store_collection(self, collection: dict[str, Any], *, branch: str | None = None) -> str | None:
        """Keep a STAC Collection with the repository (attributes of its group), so it versions with it.

        Args:
            collection: the STAC Collection as a dict; its ``id`` names the group.
            branch: the branch to commit on (default: the configured branch).

        Returns:
            The id of the snapshot committed, or None if the group held this collection already.

        Raises:
            InvalidCollection: the collection's ``id`` is missing, or unsafe as a group name.
            RefNotFound: no branch of that name exists.
            ConflictRetriesExhausted: every attempt met a concurrent change of the same group.
        """
        return store_collection(self, collection, branch)

    def collections(self, ref: str | None = None) -> dict[str, dict[str, Any]]:
        """The STAC Collections stored at ``ref``, by id.

        Args:
            ref: a branch, a tag or a snapshot id, optionally prefixed ``branch:``, ``tag:`` or ``snapshot:``
                (default: the configured branch).

        Returns:
            Collection id -> the STAC Collection stored with its group.

        Raises:
            RefNotFound: no branch, tag or snapshot of that name exists.
            CorruptRepository: the snapshot carries no items-table pointer.
        """
        return collection_groups(self, ref).documents

    def collection_groups(self, ref: str | None = None) -> CollectionGroups:
        """The collections stored at ``ref`` and those with stacks, from one listing (``_collections.py``);
        raises as :meth:`collections` does."""
        return collection_groups(self, ref)

    # -- writing -----------------------------------------------------------------------------
    def writer(self, branch: str | None = None) -> Writer:
        """A writer on ``branch``: stage arrays and items, then ``commit``.

        Args:
            branch: the branch to write to (default: the configured branch).

        Returns:
            A writer on a session at the branch's tip.

        Raises:
            RefNotFound: no branch of that name exists.
        """
        from ingest.repository._writer import Writer

        return Writer(self, branch or self.settings.branch)

    def optimize(
        self,
        branch: str | None = None,
        *,
        full: bool = True,
        collections: Sequence[str] | None = None,
        dry_run: bool = False,
        progress: ProgressCallback | None = None,
    ) -> OptimizeResult:
        """Compact the items table on ``branch`` in one commit, safe next to running writers.

        ``full`` makes each partition one clustered run (``floe optimize``);
        without it only partitions past the thresholds of ``settings.optimize``
        are compacted (what runs after an ingest). ``collections`` limits it to
        those; ``dry_run`` reports what is due and writes nothing.

        Args:
            branch: the branch to compact (default: the configured branch).
            full: compact every partition into one clustered run, not only those past the thresholds.
            collections: compact only the partitions of these collections (default: all).
            dry_run: select the partitions due and write nothing.
            progress: called with each partition's compaction once its files are written.

        Returns:
            The partitions selected and, unless nothing was due or ``dry_run``, what was rewritten and the
            snapshot committed.

        Raises:
            ConflictRetriesExhausted: the commit lost ``commit.max_attempts`` races in a row; nothing was committed.
        """
        from ingest.repository._optimize import CompactionPolicy, optimize

        options = self.settings.optimize
        policy = CompactionPolicy(
            target_file_rows=options.target_file_rows,
            small_files=max(1, options.small_files),
            fan_in=options.fan_in,
            full=full,
            collections=frozenset(collections) if collections else None,
        )
        return optimize(self, branch or self.settings.branch, policy, dry_run=dry_run, progress=progress)

    def ensure_groups(
        self,
        paths: list[str],
        *,
        branch: str | None = None,
        attributes: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> str | None:
        """Create the groups at ``paths`` on ``branch`` in a commit of their own, if any is missing.

        ``attributes`` (path -> attributes to merge in) also updates groups that
        exist. Idempotent and safe against concurrent callers: a group someone
        else created meanwhile counts as created. Returns the new snapshot id,
        or None if there was nothing to do.

        Args:
            paths: the groups' paths, e.g. collection ids.
            branch: the branch to commit on (default: the configured branch).
            attributes: path -> attributes to merge into that group's.

        Returns:
            The id of the snapshot committed, or None if there was nothing to do.

        Raises:
            RefNotFound: no branch of that name exists.
            ConflictRetriesExhausted: every attempt met a concurrent change.
        """
        return ensure_groups(self, paths, branch=branch or self.settings.branch, attributes=attributes)
