"""The writer: stages arrays and STAC items on a branch, then commits them together.

A writer holds one Icechunk session on a branch (arrays are staged in it with
the zarr API) and the items to add. ``commit`` turns the items into an
:class:`~ingest.repository._plan.ItemsPlan` and hands session and plan to the
commit protocol (:mod:`ingest.repository._commit`), which lands both in one
Icechunk commit whatever other writers do meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import icechunk

from ingest.errors import CommitConflict, InvalidItem, WriterClosed
from ingest.repository._commit import commit_change
from ingest.repository._groups import commit_alone, group_exists
from ingest.repository._history import writable_session
from ingest.repository._plan import ItemsPlan
from ingest.repository._rebase import rebase_staged
from ingest.repository._replace import Located, find, read_rows
from ingest.repository._slots import Moves, Slots, clear_pieces
from ingest.stac import Piece, arrow_to_items, check_name, item_as_dict, moved_slots, validate_item

if TYPE_CHECKING:
    import pyarrow as pa
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
    rows_deleted: int = 0
    slices_deleted: int = 0
    """Array slices of the deleted rows, cleared in the same commit."""
    not_found: tuple[tuple[str, str], ...] = ()
    """(collection, id) of the items asked to be deleted that the branch did not hold when the commit landed."""


class Writer:
    """Stages arrays and STAC items on a branch and commits them atomically.

    Writers never coordinate: any number of them (threads, processes, machines)
    may commit to the same branch; losers of a race reconcile and retry.
    A writer commits once; open a new one for the next batch.
    """

    def __init__(self, repository: Repository, branch: str) -> None:
        self.repository = repository
        self.branch = branch
        self._session = writable_session(repository, branch)
        self._store_of: icechunk.Session | None = None
        self._store: icechunk.IcechunkStore | None = None
        self._items: dict[tuple[str, str], dict[str, Any]] = {}
        self._sources: dict[tuple[str, str], str | None] = {}
        self._rows: list[pa.Table] = []
        self._row_keys: dict[tuple[str, str], str | None] = {}
        """Key -> source of each item staged as a row (:meth:`add_rows`)."""
        self._closed = False
        self._replace: set[tuple[str, str]] = set()
        self._delete: set[tuple[str, str]] = set()
        self._expected: dict[tuple[str, str], dict[str, Any] | None] = {}
        self._manifests = repository.manifests
        self._located: Located | None = None
        self._slots = Slots(repository.next_slots)
        self._stored: dict[tuple[str, str], dict[str, Any]] = {}
        self.stack_arrays: dict[str, dict[str, Any]] = {}
        """Stack path -> array name -> what is known of it (``ingest.rasters.StoredArray``), as this writer's plans
        last read them (their cache)."""
        self._early_moves: dict[tuple[str, str], Moves] = {}
        """Key -> (stack, slot first given) -> slot now, for items whose slices moved before they were added
        (staged, then a catch-up, then added: their assets name the slots first given)."""

    # -- staging ----------------------------------------------------------------------------
    @property
    def session(self) -> icechunk.Session:
        """The Icechunk session arrays are staged in."""
        return self._session

    @property
    def store(self) -> icechunk.IcechunkStore:
        """The Zarr store of the session: stage arrays with the zarr API on it."""
        # Icechunk makes a new store object on each ``Session.store`` (a sixth of a virtual granule's staging when
        # asked per call); one per session is enough, since it shares the session's state.
        if self._store is None or self._store_of is not self._session:
            self._store, self._store_of = self._session.store, self._session
        return self._store

    @property
    def pending_items(self) -> int:
        """Items staged and not yet committed."""
        return len(self._items) + len(self._row_keys)

    def _check_open(self) -> None:
        if self._closed:
            raise WriterClosed("this writer has committed (or failed); open a new one with repository.writer()")

    def ensure_collection(self, collection: str) -> None:
        """Make sure ``/<collection>`` exists at this writer's base.

        Two writers creating the same group can never be rebased onto each
        other, so shared parents are created in a small commit of their own
        (idempotently) before arrays are staged under them.

        Args:
            collection: the collection id, which names the group.

        Raises:
            WriterClosed: the writer has committed (or failed).
            ValueError: ``collection`` is not usable as a group name (see :func:`~ingest.stac.check_name`).
            ConflictRetriesExhausted: every attempt to commit the group met a concurrent change.
            CommitConflict: this writer's staged changes collide with the new tip's; the writer is closed.
        """
        self._check_open()
        check_name(collection, "collection")
        if group_exists(self._session, collection):
            return
        self.repository.ensure_groups([collection], branch=self.branch)
        self._catch_up()

    def commit_alone(self, stage: Callable[[icechunk.Session], str | None]) -> None:
        """Commit shared nodes (stacks, their arrays) in a commit of their own, then carry on from it.

        ``stage`` gets a fresh session on the branch's tip and returns the
        commit message, or None when the nodes exist already (see
        :func:`~ingest.repository._groups.commit_alone`). This writer's staged
        changes are rebased onto the new tip.

        Args:
            stage: stages the shared nodes in the session it gets and returns the commit message, or None when
                they exist already.

        Raises:
            WriterClosed: the writer has committed (or failed).
            ConflictRetriesExhausted: every attempt to commit the nodes met a concurrent change.
            CommitConflict: this writer's staged changes collide with the new tip's; the writer is closed.
        """
        self._check_open()
        commit_alone(self.repository, self.branch, stage)
        # Even when nothing was committed (another writer made the nodes first), they are at the tip.
        if self.repository.icechunk.lookup_branch(self.branch) != self._session.snapshot_id:
            self._catch_up()

    def _catch_up(self) -> None:
        """Bring the session to the branch's tip: staged arrays carry forward (their slots follow the tip's)."""
        if self._session.has_uncommitted_changes:
            # A collision is a CommitConflict, as at commit time.
            try:
                self._rebase()
            except CommitConflict:
                self._closed = True
                raise
        else:
            self._session = self.repository.icechunk.writable_session(self.branch)

    def take_slot(self, stack: str, collection: str, item_id: str) -> int:
        """A slot of ``stack`` (which must exist in this writer's session) for the slice of item ``item_id``.

        Args:
            stack: the stack's path.
            collection: the item's collection.
            item_id: the item's id.

        Returns:
            The slot, the next free one of ``stack`` in this writer.

        Raises:
            WriterClosed: the writer has committed (or failed).
            InvalidRaster: the stack is full.
        """
        self._check_open()
        return self._slots.take(self._session, stack, (collection, item_id))

    def clear_pieces(self, pieces: Iterable[Piece]) -> int:
        """Remove the slices ``pieces`` name from the arrays (staged: the commit removes them); returns chunks.

        Args:
            pieces: the slices to remove; those of arrays that do not exist are skipped.

        Returns:
            The number of chunks removed.

        Raises:
            WriterClosed: the writer has committed (or failed).
        """
        self._check_open()
        pieces = list(pieces)
        self._slots.clearing(pieces)
        return clear_pieces(self._session, pieces)

    def _base_on_branch(self, snapshot_id: str) -> bool:
        """Whether ``snapshot_id`` still exists and is in the history of this writer's branch (expiry takes a
        snapshot out of the history even where a tag keeps it)."""
        try:
            self.repository.icechunk.lookup_snapshot(snapshot_id)
            return any(info.id == snapshot_id for info in self.repository.icechunk.ancestry(branch=self.branch))
        except icechunk.SnapshotNotFoundError:
            return False

    def _rebase(self) -> None:
        """Rebase the session onto the branch's tip: slots follow the tip's, and the staged items follow their
        slots (see :func:`~ingest.repository._rebase.rebase_staged`)."""
        for moves in rebase_staged(self.repository, self._session, self.branch, self._slots):
            self._follow_moves(moves)

    def _follow_moves(self, moves: Moves) -> None:
        added: set[tuple[str, str]] = set()
        for (stack, old), slot in moves.items():
            key = self._slots.owners.get((stack, slot))
            if key is None:
                continue
            if key in self._items:
                added.add(key)
                continue
            # Not added yet: its asset, made before the move, names the slot first given; add_item corrects it.
            early = self._early_moves.setdefault(key, {})
            given = next((start for start, now in early.items() if start[0] == stack and now == old), (stack, old))
            early[given] = slot
        self._items.update({key: moved_slots(self._items[key], moves) for key in added})

    def group_exists(self, path: str) -> bool:
        """Whether the group at ``path`` exists in this writer's session (base or staged).

        Args:
            path: the group's path.

        Returns:
            True if a group (not an array) is there.
        """
        return group_exists(self._session, path)

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

        Args:
            item: a STAC item, as a dict or a pystac Item.
            source: where the item was read from, for error messages.
            default_collection: the collection of an item that names none.
            replace: replace the branch's row of the same item when the commit lands.
            validated: ``item`` was returned by ``validate_item`` already: do not validate it again.

        Raises:
            WriterClosed: the writer has committed (or failed).
            InvalidItem: the item is not a valid STAC item, this batch has an item of the same collection and
                id already, or this batch deletes that item.
        """
        self._check_open()
        if not validated:
            item = validate_item(item_as_dict(item), source=source, default_collection=default_collection)
        key = (item["collection"], item["id"])
        if key in self._delete:
            raise InvalidItem("this batch deletes the same item: add it with replace=True instead", item_id=item["id"])
        if key in self._items or key in self._row_keys:
            first = self._sources.get(key) or self._row_keys.get(key)
            raise InvalidItem(
                f"duplicate id in this batch (first seen in {first or 'the same input'})",
                item_id=item["id"],
                source=source,
            )
        if key in self._early_moves:
            item = moved_slots(item, self._early_moves.pop(key))
        self._items[key] = item
        self._sources[key] = source
        if replace:
            self._replace.add(key)

    def add_rows(self, rows: pa.Table, *, sources: Sequence[str | None] | None = None) -> None:
        """Stage items already checked and laid out as floe's rows (:func:`~ingest.stac.geoparquet_rows`), each
        replacing the branch's row of the same item when the commit lands (as :meth:`add_item` with
        ``replace=True``). Items with arrays are added as items: rows carry none.

        Raises:
            WriterClosed: the writer has committed (or failed).
            InvalidItem: this batch has one of these items already (or deletes it), naming the first; nothing of
                ``rows`` is staged then.
        """
        self._check_open()
        keys = list(zip(rows.column("collection").to_pylist(), rows.column("id").to_pylist(), strict=True))
        labels = list(sources) if sources is not None else [None] * len(keys)
        clash = next(
            (
                index
                for index, key in enumerate(keys)
                if key in self._items or key in self._row_keys or key in self._delete
            ),
            None,
        )
        if clash is None and len(set(keys)) < len(keys):
            first: dict[tuple[str, str], int] = {}
            clash = next(index for index, key in enumerate(keys) if first.setdefault(key, index) != index)
        if clash is not None:
            key = keys[clash]
            raise InvalidItem("this batch has this item already (or deletes it)", item_id=key[1], source=labels[clash])
        self._rows.append(rows)
        self._row_keys.update(zip(keys, labels, strict=True))
        self._replace.update(keys)

    def add_items(
        self,
        items: Iterable[Any],
        *,
        source: str | None = None,
        default_collection: str | None = None,
        replace: bool = False,
    ) -> list[InvalidItem]:
        """Stage many items; returns the rejected ones (the rest are staged).

        Args:
            items: STAC items, as dicts or pystac Items.
            source: where the items were read from, for error messages.
            default_collection: the collection of an item that names none.
            replace: replace the branch's rows of the same items when the commit lands (see :meth:`add_item`).

        Returns:
            The error of each item rejected, in the order of ``items``.

        Raises:
            WriterClosed: the writer has committed (or failed), and ``items`` is not empty.
        """
        rejected = []
        for item in items:
            try:
                self.add_item(item, source=source, default_collection=default_collection, replace=replace)
            except InvalidItem as error:
                rejected.append(error)
        return rejected

    def delete_item(self, collection: str, item_id: str, *, if_unchanged: bool = False) -> None:
        """Stage the deletion of item ``item_id`` of ``collection``: its row and its slices leave with the commit.

        Whatever version of the item the branch holds when the commit lands
        goes (a concurrent replacement of it included), so the outcome is
        always one of the two commits after the other. With ``if_unchanged``
        the deletion holds only for the version :meth:`stored_items` read
        (the one a filter chose; see :meth:`expect`). Deleting an
        item the branch does not hold deletes nothing; the commit result lists
        it in ``not_found``. Older snapshots and tags keep the item.

        Args:
            collection: the item's collection.
            item_id: the item's id.
            if_unchanged: delete the item only if the branch still holds the version :meth:`stored_items` read.

        Raises:
            WriterClosed: the writer has committed (or failed).
            InvalidItem: this batch adds the same item.
            ValueError: ``if_unchanged`` is set and :meth:`stored_items` has not read the item.
        """
        self._check_open()
        key = (collection, item_id)
        if key in self._items:
            raise InvalidItem("this batch adds the same item: add it with replace=True instead", item_id=item_id)
        if if_unchanged:
            if key not in self._stored:
                raise ValueError(f"{item_id!r} ({collection}): read it with stored_items() before deleting it")
            self.expect(collection, item_id, self._stored[key])
        self._delete.add(key)

    def expect(self, collection: str, item_id: str, version: dict[str, Any] | None) -> None:
        """Make this commit conditional on the branch holding ``version`` of the item when it lands.

        ``version`` is the item as :meth:`stored_items` read it (a change made
        for that version: a replacement after an ``If-Match``, a deletion a
        filter chose), or None for an item that must not exist (a creation).
        If a concurrent commit changed, deleted or created the item first, the
        commit raises ``CommitConflict`` and nothing is committed. It guards a
        change of the item: add it with ``replace=True``, or delete it.

        Args:
            collection: the item's collection.
            item_id: the item's id.
            version: the item as :meth:`stored_items` read it, or None if the item must not exist.

        Raises:
            WriterClosed: the writer has committed (or failed).
        """
        self._check_open()
        self._expected[(collection, item_id)] = version

    @property
    def pending_deletions(self) -> int:
        """Items staged for deletion and not yet committed."""
        return len(self._delete)

    def base_table(self) -> Table:
        """The items table at this writer's base snapshot.

        Returns:
            The Iceberg table at the version the base snapshot records.
        """
        return self.repository.table_at(self._session.snapshot_id)

    def stored_items(self, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], dict[str, Any]]:
        """The items with these (collection, id) keys at this writer's base, as stored.

        Reads only the id columns of the files Iceberg cannot prune, then the
        full rows of the files that hold a key; a commit replacing these keys
        from the same base re-uses what was found.

        Args:
            keys: the (collection, id) of each item to read.

        Returns:
            (collection, id) -> the item, for the keys found; keys the base does not hold are left out.
        """
        located = find(self._manifests, self.base_table(), keys)
        self._located = located
        stored: dict[tuple[str, str], dict[str, Any]] = {}
        for data_file, hits in located.found.values():
            for item in arrow_to_items(read_rows(self.repository.io, data_file, hits)):
                stored[(item["collection"], item["id"])] = item
        self._stored.update(stored)
        return stored

    # -- committing -------------------------------------------------------------------------
    def commit(self, message: str, *, metadata: Mapping[str, Any] | None = None) -> CommitResult:
        """Commit the staged arrays and items in one Icechunk commit, reconciling with concurrent writers.

        ``metadata`` is added to the Icechunk commit's metadata beside floe's
        own record. Raises ``CommitConflict`` if staged arrays collide with
        another writer's (never merged blindly) and ``ConflictRetriesExhausted``
        after the configured number of lost races. The writer is closed
        afterwards, whatever happened.

        Args:
            message: the commit message.
            metadata: keys to add to the Icechunk commit's metadata.

        Returns:
            What the commit did: the new snapshot, the rows added, replaced and deleted, and the attempts it took.

        Raises:
            WriterClosed: the writer has committed (or failed).
            CommitConflict: the change cannot be reconciled with a commit made meanwhile (staged arrays collide
                with another writer's; an item :meth:`expect` guards was changed, deleted or created; a row this
                commit replaces was changed or deleted while this change keeps that row's arrays), or ``floe gc``
                expired the snapshot this writer opened at. Nothing was committed.
            ConflictRetriesExhausted: the commit lost ``commit.max_attempts`` races in a row; nothing was committed.
            ValueError: :meth:`expect` guards an item that is neither added with ``replace=True`` nor deleted
                (raised before anything is written; the writer stays open).
        """
        self._check_open()
        plan = ItemsPlan.of(
            self.repository.io,
            self.repository.catalog,
            self._manifests,
            self._items.values(),
            message=message,
            replace=self._replace & (self._items.keys() | self._row_keys.keys()),
            row_tables=self._rows,
            delete=self._delete,
            expected=self._expected,
            located=self._located,
            known_rows=self._stored,
            staged=self._slots.owners,
        )
        base = self._session.snapshot_id
        try:
            landed = commit_change(
                self.repository,
                self._session,
                self.branch,
                message,
                plan,
                caller_metadata=metadata,
                slots=self._slots,
            )
        except icechunk.IcechunkError as error:
            # `floe gc --expire-older-than` removed the snapshot this writer opened at from the branch's history
            # (and deleted it, unless a tag holds it): the staged changes have no base to rebase from. Nothing was
            # committed. (Its pointer may be known already, so the first to notice can be the rebase.)
            expired = isinstance(error, icechunk.SnapshotNotFoundError) or not self._base_on_branch(base)
            if not expired:
                raise
            raise CommitConflict(
                f"the snapshot this writer on {self.branch!r} opened at ({base}) was expired by `floe gc` "
                "meanwhile; nothing was committed: open a new writer and stage these items again"
            ) from error
        finally:
            self._closed = True
        plan = landed.change
        return CommitResult(
            snapshot_id=landed.snapshot_id,
            branch=self.branch,
            metadata_location=landed.applied.metadata_location,
            rows_added=landed.applied.rows_added,
            attempts=landed.attempts,
            rows_replaced=landed.applied.rows_replaced,
            files_written=plan.files_written,
            files_rewritten=plan.files_rewritten,
            rows_deleted=landed.applied.rows_deleted,
            slices_deleted=plan.slices_deleted,
            not_found=tuple(sorted(plan.not_found)),
        )
