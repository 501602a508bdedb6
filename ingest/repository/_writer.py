"""The writer and its rebase-and-reconcile commit loop (DESIGN §4).

A writer holds one Icechunk session on a branch and a plan: arrays staged in
the session, data files already written, table changes not yet applied. Each
attempt of ``commit`` applies the plan to the table version its base snapshot
points at, writes the next metadata.json, and commits arrays and pointer
together with a compare-and-swap on the branch tip. Losing the race means:
rebase the session (staged chunks carry forward), replay the plan on the
winner's table version, back off, try again.
"""

from __future__ import annotations

import logging
import random
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import icechunk
import zarr
import zarr.errors
from pyiceberg.table.update import AssertTableUUID, TableUpdate

from ingest.errors import CommitConflict, ConflictRetriesExhausted, InvalidItem, RefNotFound, WriterClosed
from ingest.repository._append import AddedManifest, ManifestCache, plan_commit, schema_union_updates
from ingest.repository._files import (
    StagedFile,
    file_fits,
    merge_types,
    month_of,
    table_column_types,
    to_data_file,
    union_schema,
    write_group,
)
from ingest.repository._replace import Located, ReplacementPlan, find, read_rows
from ingest.repository._repo import FLOE_KEY, ITEMS_TABLE
from ingest.stac._validate import check_name, validate_item

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from ingest.repository._repo import Repository

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommitResult:
    """What one commit did."""

    snapshot_id: str
    branch: str
    metadata_location: str
    rows_added: int
    attempts: int
    rows_replaced: int
    files_written: int
    files_rewritten: int


class _TipMoved(Exception):
    """The branch moved past this writer's base: the commit would lose its race."""


def group_exists(session: icechunk.Session, path: str) -> bool:
    try:
        zarr.open_group(session.store, path=path, mode="r")
    except (FileNotFoundError, zarr.errors.NodeNotFoundError, zarr.errors.ContainsArrayError):
        return False
    return True


def backoff_seconds(attempt: int, initial_ms: float, max_ms: float) -> float:
    """Jittered wait before retry ``attempt + 1``: long after a first loss, shorter after each further one.

    Exponential backoff starves: a writer that lost a few races waits longest
    and so keeps losing to fresh writers (streaks of 60+ lost races were
    measured with 8 writers). Shrinking the wait instead hands the branch to
    the writers that have waited most, while fresh losers still spread out.
    """
    ceiling = max(initial_ms, max_ms / attempt)
    return random.uniform(0, ceiling) / 1000.0


def _as_dict(item: Any) -> Any:
    to_dict = getattr(item, "to_dict", None)
    return to_dict(include_self_link=False) if callable(to_dict) else item


class Writer:
    """Stages arrays and STAC items on a branch and commits them atomically.

    Writers never coordinate: any number of them (threads, processes, machines)
    may commit to the same branch; losers of a race reconcile and retry.
    A writer commits once; open a new one for the next batch.
    """

    def __init__(self, repository: Repository, branch: str) -> None:
        self.repository = repository
        self.branch = branch
        try:
            self._session = repository.icechunk.writable_session(branch)
        except icechunk.IcechunkError as error:
            raise RefNotFound(f"branch {branch!r} does not exist (create it with `floe branch {branch}`)") from error
        self._items: dict[tuple[str, str], dict[str, Any]] = {}
        self._sources: dict[tuple[str, str], str | None] = {}
        self._closed = False
        self._added_manifest: AddedManifest | None = None
        self._replace: set[tuple[str, str]] = set()
        self._manifests = ManifestCache(repository.io)
        self._located: Located | None = None

    # -- staging ----------------------------------------------------------------------------
    @property
    def session(self) -> icechunk.Session:
        """The Icechunk session arrays are staged in."""
        return self._session

    @property
    def store(self) -> icechunk.IcechunkStore:
        """The Zarr store of the session: stage arrays with the zarr API on it."""
        return self._session.store

    @property
    def pending_items(self) -> int:
        return len(self._items)

    def _check_open(self) -> None:
        if self._closed:
            raise WriterClosed("this writer has committed (or failed); open a new one with repository.writer()")

    def ensure_collection(self, collection: str) -> None:
        """Make sure ``/<collection>`` exists at this writer's base.

        Two writers creating the same group can never be rebased onto each
        other, so shared parents are created in a small commit of their own
        (idempotently) before arrays are staged under them.
        """
        self._check_open()
        check_name(collection, "collection")
        if group_exists(self._session, collection):
            return
        self.repository.ensure_groups([collection], branch=self.branch)
        if self._session.has_uncommitted_changes:
            self._rebase()
        else:
            self._session = self.repository.icechunk.writable_session(self.branch)

    def group_exists(self, path: str) -> bool:
        """Whether the group at ``path`` exists in this writer's session (base or staged)."""
        return group_exists(self._session, path)

    def item_group(self, collection: str, item_id: str) -> zarr.Group:
        """The group ``/<collection>/<item_id>`` in this writer's session, created if needed."""
        check_name(item_id, "id")
        self.ensure_collection(collection)
        return zarr.open_group(self.store, path=f"{collection}/{item_id}", mode="a")

    def add_item(
        self,
        item: Any,
        *,
        source: str | None = None,
        default_collection: str | None = None,
        replace: bool = False,
        validated: bool = False,
    ) -> None:
        """Validate and stage one STAC item (a dict or a pystac Item). Raises InvalidItem.

        With ``replace``, the row of an item with the same collection and id
        that the branch holds when the commit lands is replaced by this one,
        so the table ends with exactly one version of it, even when other
        writers replace or add the same item concurrently (the loser re-plans
        on the winner's version). Without it, the item is appended as it is.
        ``validated`` says ``item`` is what ``validate_item`` returned already
        (the pipeline validates once, early, to reject bad input by name).
        """
        self._check_open()
        if not validated:
            item = validate_item(_as_dict(item), source=source, default_collection=default_collection)
        key = (item["collection"], item["id"])
        if key in self._items:
            first = self._sources.get(key)
            raise InvalidItem(
                f"duplicate id in this batch (first seen in {first or 'the same input'})",
                item_id=item["id"],
                source=source,
            )
        self._items[key] = item
        self._sources[key] = source
        if replace:
            self._replace.add(key)

    def discard_item(self, collection: str, item_id: str) -> None:
        """Unstage an item added earlier."""
        self._check_open()
        self._items.pop((collection, item_id), None)
        self._sources.pop((collection, item_id), None)
        self._replace.discard((collection, item_id))

    def add_items(
        self,
        items: Iterable[Any],
        *,
        source: str | None = None,
        default_collection: str | None = None,
        replace: bool = False,
    ) -> list[InvalidItem]:
        """Stage many items; returns the rejected ones (the rest are staged)."""
        rejected = []
        for item in items:
            try:
                self.add_item(item, source=source, default_collection=default_collection, replace=replace)
            except InvalidItem as error:
                rejected.append(error)
        return rejected

    def base_table(self) -> Table:
        """The items table at this writer's base snapshot."""
        return self.repository.catalog.load_at(self.repository.metadata_location_of(self._session.snapshot_id))

    def stored_items(self, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], dict[str, Any]]:
        """The items with these (collection, id) keys at this writer's base, as stored.

        Reads only the id columns of the files Iceberg cannot prune, then the
        full rows of the files that hold a key; a commit replacing these keys
        from the same base re-uses what was found.
        """
        from ingest.stac._rows import arrow_to_items

        located = find(self._manifests, self.base_table(), keys)
        self._located = located
        stored: dict[tuple[str, str], dict[str, Any]] = {}
        for data_file, hits in located.found.values():
            for item in arrow_to_items(read_rows(self.repository.io, data_file, hits)):
                stored[(item["collection"], item["id"])] = item
        return stored

    # -- committing -------------------------------------------------------------------------
    def _write_files(self, table: Table) -> list[StagedFile]:
        groups: dict[tuple[str, int | None], list[dict[str, Any]]] = defaultdict(list)
        for item in self._items.values():
            groups[(item["collection"], month_of(item))].append(item)
        column_types = table_column_types(table.schema())
        return [
            write_group(self.repository.io, table.location(), items, column_types)
            for _, items in sorted(groups.items(), key=lambda pair: (pair[0][0], pair[0][1] or 0))
        ]

    def _reconcile_files(self, files: list[StagedFile], table: Table) -> tuple[list[StagedFile], int]:
        """Keep files that fit the base's schema; rewrite (with the conflicting columns untyped) those that do not."""
        column_types = table_column_types(table.schema())
        reconciled, rewritten = [], 0
        for staged in files:
            if file_fits(staged, column_types):
                reconciled.append(staged)
                for column in staged.schema:
                    column_types[column.name] = merge_types(column_types.get(column.name), column.type)
                continue
            log.info("re-planning %s: a concurrent commit typed one of its columns differently", staged.path)
            reconciled.append(
                write_group(self.repository.io, table.location(), staged.items, column_types, untyped=staged.untyped)
            )
            rewritten += 1
        return reconciled, rewritten

    def _apply(self, table: Table, files: list[StagedFile], replacement: ReplacementPlan, message: str) -> str:
        """Apply the plan to ``table`` and write the next metadata.json; returns its location."""
        if not files and not replacement.rewrites:
            return table.metadata_location
        updates: tuple[TableUpdate, ...] = ()
        metadata = table.metadata
        schema = union_schema(files, table_column_types(table.schema()))
        if schema is not None:
            updates, metadata = schema_union_updates(table, schema)
        rows = sum(staged.rows for staged in files)
        properties = {"floe.rows-added": str(rows), "floe.message": message[:200]}
        if replacement.rows_removed:
            properties["floe.rows-replaced"] = str(replacement.rows_removed)
        data_files = [to_data_file(staged, metadata) for staged in [*files, *replacement.rewritten_files]]
        append_updates, head, self._added_manifest = plan_commit(
            metadata,
            data_files,
            self._manifests,
            properties,
            previous=self._added_manifest,
            removed=replacement.removed_paths,
        )
        requirements = (AssertTableUUID(uuid=table.metadata.table_uuid), head)
        return self.repository.catalog.commit_table(table, requirements, updates + append_updates).metadata_location

    def _tip_moved(self) -> bool:
        return self.repository.icechunk.lookup_branch(self.branch) != self._session.snapshot_id

    def _rebase(self) -> None:
        try:
            self._session.rebase(icechunk.ConflictDetector())
        except icechunk.RebaseFailedError as error:
            self._closed = True
            paths = sorted({conflict.path for conflict in error.conflicts})
            raise CommitConflict(
                f"changes staged on {self.branch!r} conflict with a commit made meanwhile at {', '.join(paths)}: "
                "another writer changed the same nodes; re-plan these items from the new tip",
                paths=paths,
            ) from error

    def commit(self, message: str, *, metadata: dict[str, Any] | None = None) -> CommitResult:
        """Commit the staged arrays and items in one Icechunk commit, reconciling with concurrent writers.

        Raises ``CommitConflict`` if staged arrays collide with another writer's
        (never merged blindly) and ``ConflictRetriesExhausted`` after the
        configured number of lost races.
        """
        self._check_open()
        settings = self.repository.settings.commit
        base = self.base_table()
        files = self._write_files(base)
        files_written = len(files)
        rows = sum(staged.rows for staged in files)
        files_rewritten = 0
        replacement = ReplacementPlan(self._replace & set(self._items), primed=self._located)
        attempt = 0
        while True:
            attempt += 1
            if attempt > 1:
                base = self.repository.catalog.load_at(self.repository.metadata_location_of(self._session.snapshot_id))
                files, rewritten = self._reconcile_files(files, base)
                files_rewritten += rewritten
            try:
                # Writing the next table version is wasted if the branch moved on meanwhile: look first.
                if self._tip_moved():
                    raise _TipMoved
                if replacement.keys:
                    files_written += replacement.plan(self._manifests, base)
                metadata_location = self._apply(base, files, replacement, message)
                commit_metadata = {
                    **(metadata or {}),
                    FLOE_KEY: {
                        ITEMS_TABLE: self.repository.relative_location(metadata_location),
                        "rows_added": rows,
                        "rows_replaced": replacement.rows_removed,
                        "attempts": attempt,
                    },
                }
                with self.repository.location.mutation_lock():
                    # Icechunk writes the whole snapshot before it tries to move the ref; when the
                    # tip has moved already that work is doomed, and on local disks it holds the lock.
                    if self._tip_moved():
                        raise _TipMoved
                    snapshot_id = self._session.commit(message, metadata=commit_metadata, allow_empty=True)
            except (icechunk.ConflictError, _TipMoved) as error:
                if attempt >= settings.max_attempts:
                    self._closed = True
                    raise ConflictRetriesExhausted(
                        f"commit {message!r} to {self.branch!r} lost {attempt} races in a row; nothing was "
                        "committed. Retry later, or raise commit.max_attempts (FLOE_COMMIT__MAX_ATTEMPTS)"
                    ) from error
                log.debug("commit attempt %d on %s lost the race; rebasing", attempt, self.branch)
                self._rebase()
                time.sleep(backoff_seconds(attempt, settings.backoff_initial_ms, settings.backoff_max_ms))
                continue
            self._closed = True
            return CommitResult(
                snapshot_id=snapshot_id,
                branch=self.branch,
                metadata_location=metadata_location,
                rows_added=rows,
                attempts=attempt,
                rows_replaced=replacement.rows_removed,
                files_written=files_written + files_rewritten,
                files_rewritten=files_rewritten,
            )
