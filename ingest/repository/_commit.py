"""The hybrid commit: how one change to arrays and table lands on a branch.

Every commit floe makes goes through :func:`commit_change`; nothing else calls
Icechunk's ``Session.commit``. A change is arrays staged in a session plus a
:class:`TableChange` that applies its part of the items table to whichever
version it lands on; :class:`CommitMetadata` is the only place floe's keys in
Icechunk commits are spelled. The phases (base and prepare, ``_tip_moved``,
``TableChange.apply``, ``_swap`` under the lock, the rebase of
:mod:`ingest.repository._rebase` and ``backoff_seconds``), numbered 1 to 6,
and why each is so: docs/design.md, "§4 The hybrid commit".
"""

from __future__ import annotations

import logging
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self

import icechunk

from ingest._faults import fault_point
from ingest.errors import ConflictRetriesExhausted, CorruptRepository
from ingest.repository._rebase import rebase_staged
from ingest.repository._slots import Moves, Slots, clear_pieces

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from ingest.repository._repo import Repository
    from ingest.stac import Piece

log = logging.getLogger(__name__)

FLOE_KEY = "floe"
"""The key of floe's record in an Icechunk commit's metadata (beside any metadata of the caller's)."""
SOURCE_CURSORS = "floe:source-cursors"
"""Commit metadata key beside floe's record: search -> cursor of each STAC API search an ingest read to its end.

Cursors ride in the metadata of a run's last commit: a branch's history says
how far each search was read on that branch (``floe ingest --since last``), and
a tag keeps what it was when tagged.
"""

_ITEMS = "items"
_ROWS_ADDED = "rows_added"
_ROWS_REPLACED = "rows_replaced"
_ROWS_DELETED = "rows_deleted"
_ATTEMPTS = "attempts"
_KNOWN = frozenset((_ITEMS, _ROWS_ADDED, _ROWS_REPLACED, _ROWS_DELETED, _ATTEMPTS))


@dataclass(frozen=True)
class CommitMetadata:
    """floe's record in each Icechunk commit: the items table's pointer and what the commit did."""

    items: str | None
    """The items table's metadata.json, relative to ``<root>/tables/`` (None only in Icechunk's root snapshot)."""
    rows_added: int = 0
    rows_replaced: int = 0
    rows_deleted: int = 0
    attempts: int = 1
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Keys this version of floe does not know (written by a newer one): kept, never interpreted."""

    def encode(self, caller_metadata: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The commit metadata to hand to Icechunk: the caller's keys, and floe's record under ``floe``."""
        record: dict[str, Any] = {
            **self.extra,
            _ROWS_ADDED: self.rows_added,
            _ROWS_REPLACED: self.rows_replaced,
            _ATTEMPTS: self.attempts,
        }
        if self.rows_deleted:
            record[_ROWS_DELETED] = self.rows_deleted
        if self.items is not None:
            record[_ITEMS] = self.items
        return {**(caller_metadata or {}), FLOE_KEY: record}

    @classmethod
    def decode(cls, metadata: Mapping[str, Any] | None) -> CommitMetadata | None:
        """floe's record in a commit's metadata; None for commits floe did not make (Icechunk's root snapshot)."""
        record = (metadata or {}).get(FLOE_KEY)
        if not isinstance(record, Mapping):
            return None
        pointer = record.get(_ITEMS)
        return cls(
            items=pointer if isinstance(pointer, str) else None,
            rows_added=_count(record.get(_ROWS_ADDED), 0),
            rows_replaced=_count(record.get(_ROWS_REPLACED), 0),
            rows_deleted=_count(record.get(_ROWS_DELETED), 0),
            attempts=_count(record.get(_ATTEMPTS), 1),
            extra={key: value for key, value in record.items() if key not in _KNOWN},
        )


def _count(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def encode_pointer(tables_url: str, metadata_location: str) -> str:
    """The pointer a commit carries for ``metadata_location``: its path relative to ``<root>/tables/``."""
    prefix = tables_url.rstrip("/") + "/"
    if not metadata_location.startswith(prefix):
        raise CorruptRepository(f"{metadata_location} is outside {tables_url}")
    return metadata_location[len(prefix) :]


def decode_pointer(tables_url: str, pointer: str) -> str:
    """The absolute location of the metadata.json a pointer names."""
    return f"{tables_url.rstrip('/')}/{pointer.strip('/')}"


def pointer_of(repo: icechunk.Repository, snapshot_id: str) -> str | None:
    """The relative pointer snapshot ``snapshot_id`` carries (None if it carries none)."""
    record = CommitMetadata.decode(repo.lookup_snapshot(snapshot_id).metadata)
    return record.items if record is not None else None


@dataclass
class Base:
    """The snapshot an attempt builds on, and the table version its pointer names."""

    repository: Repository
    snapshot_id: str
    metadata_location: str | None
    """The absolute location of the base's metadata.json (None only for Icechunk's root snapshot)."""
    _table: Table | None = None

    @classmethod
    def at(cls, repository: Repository, snapshot_id: str) -> Base:
        pointer = repository.known.pointer(snapshot_id)
        tables_url = repository.location.tables_url
        return cls(repository, snapshot_id, decode_pointer(tables_url, pointer) if pointer is not None else None)

    def table(self) -> Table:
        """The items table at the base (read once)."""
        if self._table is None:
            if self.metadata_location is None:
                raise CorruptRepository(f"snapshot {self.snapshot_id} carries no items-table pointer")
            self._table = self.repository.catalog.load_at(self.metadata_location)
        return self._table


@dataclass(frozen=True)
class AppliedChange:
    """What applying a change to one base wrote: the next table version, and the rows it adds, replaces, deletes.

    ``clear`` and ``clear_deleted`` name the array slices of the rows it
    replaces and deletes (which no row of the new version names): the commit
    loop clears them in the session, so they leave in the same commit.
    """

    metadata_location: str
    rows_added: int = 0
    rows_replaced: int = 0
    rows_deleted: int = 0
    clear: tuple[Piece, ...] = ()
    """Slices of the rows this change replaces that the new rows do not keep."""
    clear_deleted: tuple[Piece, ...] = ()
    """Slices of the rows this change deletes (a concurrent commit that clears or re-stages them is no conflict)."""


class TableChange(ABC):
    """A commit's change to the items table, replayable on whichever base the commit lands on."""

    def prepare(self, base: Base) -> None:  # noqa: B027 - most changes have nothing to prepare
        """Phase 1: write what every attempt re-uses (data files), against the session's first base."""

    @abstractmethod
    def apply(self, base: Base) -> AppliedChange:
        """Phase 3: apply the change to the table at ``base`` and write the next metadata.json (never publish it).

        Called once per attempt, on the attempt's base; raises ``CommitConflict``
        when the change depends on rows the base changed in a way it cannot
        follow (the caller then re-plans).
        """

    def rebased(self, moves: Sequence[Moves]) -> Self:
        """Phase 6: the change to apply next, after a rebase moved the session's slices to other slots.

        Args:
            moves: (stack, old slot) -> new slot, one set per look at the tip, in order (never empty sets).

        Returns:
            The change whose rows name the new slots (this one when none of its rows has slices).
        """
        return self


class KeepTable(TableChange):
    """No table change: the commit carries its base's pointer forward (arrays or groups only)."""

    def apply(self, base: Base) -> AppliedChange:
        if base.metadata_location is None:
            raise CorruptRepository(f"snapshot {base.snapshot_id} carries no items-table pointer")
        return AppliedChange(base.metadata_location)


@dataclass(frozen=True)
class Landed[Change: TableChange]:
    """A change that landed: the new snapshot, what the table change wrote, and how many attempts it took."""

    snapshot_id: str
    applied: AppliedChange
    attempts: int
    change: Change
    """The change as it landed (after the rebases of the attempts it lost)."""


class _TipMoved(Exception):
    """The branch moved past this attempt's base: the commit would lose its race."""


def backoff_seconds(attempt: int, initial_ms: float, max_ms: float) -> float:
    """Jittered wait before retry ``attempt + 1``: long after a first loss, shorter after each further one.

    Exponential backoff starves: a writer that lost a few races waits longest
    and so keeps losing to fresh writers (streaks of 60+ lost races were
    measured with 8 writers). Shrinking the wait instead hands the branch to
    the writers that have waited most, while fresh losers still spread out.
    """
    ceiling = max(initial_ms, max_ms / attempt)
    return random.uniform(0, ceiling) / 1000.0


def commit_change[Change: TableChange](
    repository: Repository,
    session: icechunk.Session,
    branch: str,
    message: str,
    change: Change,
    *,
    caller_metadata: Mapping[str, Any] | None = None,
    slots: Slots | None = None,
) -> Landed[Change]:
    """Commit the arrays staged in ``session`` and ``change`` to the table, together, on ``branch``.

    Runs the protocol of this module's docstring.

    Args:
        repository: the repository.
        session: the writable session the arrays are staged in, on ``branch``.
        branch: the branch to commit to.
        message: the commit message.
        change: the change to the items table.
        caller_metadata: keys to add to the Icechunk commit's metadata beside floe's record.
        slots: the slots in stacks the session's granules took (None when it stages none): a lost race moves
            them past the winner's, and the change hears the moves.

    Returns:
        The new snapshot, what the table change wrote, the attempts, and the change as it landed.

    Raises:
        CommitConflict: the staged arrays collide with a concurrent commit, or the change depends on rows it
            changed (re-plan from the new tip).
        ConflictRetriesExhausted: ``commit.max_attempts`` lost races in a row; nothing was committed.
    """
    settings = repository.settings.commit
    base = Base.at(repository, session.snapshot_id)
    change.prepare(base)
    attempt = 0
    while True:
        attempt += 1
        try:
            # Writing the next table version is wasted if the branch moved on meanwhile: look first.
            if _tip_moved(repository, session, branch):
                raise _TipMoved
            if base.snapshot_id != session.snapshot_id:
                base = Base.at(repository, session.snapshot_id)
            applied = change.apply(base)
            _clear_slices(session, slots, applied)
            fault_point("commit.after_metadata")
            record = CommitMetadata(
                items=encode_pointer(repository.location.tables_url, applied.metadata_location),
                rows_added=applied.rows_added,
                rows_replaced=applied.rows_replaced,
                rows_deleted=applied.rows_deleted,
                attempts=attempt,
            )
            parent = session.snapshot_id
            snapshot_id = _swap(repository, session, branch, message, record.encode(caller_metadata))
            repository.known.remember(snapshot_id, record.items)
            if slots is not None:
                slots.committed(parent, snapshot_id)
        except (icechunk.ConflictError, _TipMoved) as error:
            if attempt >= settings.max_attempts:
                raise ConflictRetriesExhausted(
                    f"commit {message!r} to {branch!r} lost {attempt} races in a row; nothing was "
                    "committed. Retry later, or raise commit.max_attempts (FLOE_COMMIT__MAX_ATTEMPTS)"
                ) from error
            log.debug("commit attempt %d on %s lost the race; rebasing", attempt, branch)
            moves = rebase_staged(repository, session, branch, slots)
            if moves:
                change = change.rebased(moves)
            time.sleep(backoff_seconds(attempt, settings.backoff_initial_ms, settings.backoff_max_ms))
            continue
        return Landed(snapshot_id, applied, attempt, change)


def _clear_slices(session: icechunk.Session, slots: Slots | None, applied: AppliedChange) -> None:
    """Stage the removal of the slices the applied change's replaced and deleted rows leave behind."""
    if applied.clear:
        clear_pieces(session, applied.clear)
    if applied.clear_deleted:
        if slots is not None:
            slots.cleared(applied.clear_deleted)
        clear_pieces(session, applied.clear_deleted)


def _tip_moved(repository: Repository, session: icechunk.Session, branch: str) -> bool:
    return repository.icechunk.lookup_branch(branch) != session.snapshot_id


def _swap(
    repository: Repository, session: icechunk.Session, branch: str, message: str, metadata: dict[str, Any]
) -> str:
    """Phases 4 and 5: under the local lock, look at the tip again, then commit if it is still the base."""
    with repository.location.mutation_lock():
        # Icechunk writes the whole snapshot before it tries to move the ref; when the tip has moved already that
        # work is doomed, and on local disks it holds the lock. On object storage no lock is held and the look at
        # the tip before the table version was written is a round trip ago: Icechunk's conditional write of the
        # ref refuses a commit on a moved tip (a ConflictError, handled as a lost race).
        if repository.location.is_local and _tip_moved(repository, session, branch):
            raise _TipMoved
        fault_point("commit.before_swap")
        snapshot_id = session.commit(message, metadata=metadata, allow_empty=True)
    fault_point("commit.after_swap")
    return snapshot_id


def newest_cursors(history: Iterable[Mapping[str, Any] | None]) -> dict[str, str]:
    """Search -> cursor, the newest of each, from the metadata of commits newest first (``SOURCE_CURSORS``)."""
    found: dict[str, str] = {}
    for metadata in history:
        cursors = (metadata or {}).get(SOURCE_CURSORS)
        if isinstance(cursors, Mapping):
            for search, cursor in cursors.items():
                if isinstance(search, str) and isinstance(cursor, str):
                    found.setdefault(search, cursor)
    return found
