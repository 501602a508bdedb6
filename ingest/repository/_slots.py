"""Slots in stacks: where a writer's granules go on a stack's slot axis, and how they move when it loses a race.

:class:`Slots` takes them and moves them (``reindex_array``); :func:`clear_pieces` removes slices. The steps
(take, move, check then rebase, tell the rows) and why: docs/design.md, "§4 The hybrid commit" (slots follow the
winner); the rebase itself is in :mod:`ingest.repository._rebase`.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import icechunk
import zarr
import zarr.errors
from zarr.core.sync import sync

from ingest.errors import InvalidRaster
from ingest.stac import DATETIME, ITEM, SLOT, Piece

log = logging.getLogger(__name__)

Key = tuple[str, str]
Moves = dict[tuple[str, int], int]
"""(stack, old slot) -> new slot."""


def next_free_slot(session: icechunk.Session, stack: str) -> int:
    """The slot after the last one taken in ``stack`` (0 for an empty stack), in the session's view."""

    async def last() -> int:
        highest = -1
        async for coordinates in session.chunk_coordinates(f"/{stack}/{ITEM}"):
            highest = max(highest, coordinates[0])
        return highest

    return sync(last()) + 1


SNAPSHOTS_KEPT = 16
"""Snapshots whose stacks' next free slots :class:`NextSlots` keeps (a writer needs its base's, and a lost race the
tip's)."""


class NextSlots:
    """The next free slot of stacks at snapshots this process listed or committed: what :func:`next_free_slot`
    would answer, without listing every slot of the stack again (that listing grows with the slots a stack holds,
    about 2.3 us a slot: docs/benchmarks-history.md, "What floe's own side adds as slots pile up").

    A snapshot never changes, so what was listed at it stays true. A commit's child is known from its parent's
    (:meth:`committed`): the child holds the parent's slices, less the ones the commit cleared, plus the ones it
    took. Where the commit cleared slices of a stack its child's value is left unknown (a cleared last slot is
    free again, and only a listing says how many below it are too), as it is where the parent's is unknown.
    """

    def __init__(self) -> None:
        self._at: OrderedDict[str, dict[str, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, snapshot_id: str, stack: str) -> int | None:
        """The next free slot of ``stack`` at ``snapshot_id``, if known."""
        with self._lock:
            return self._at.get(snapshot_id, {}).get(stack)

    def put(self, snapshot_id: str, stack: str, slot: int) -> None:
        """``stack``'s next free slot at ``snapshot_id`` is ``slot`` (as a listing of the snapshot found it)."""
        with self._lock:
            self._at.setdefault(snapshot_id, {})[stack] = slot
            self._keep_newest(snapshot_id)

    def committed(
        self, parent: str, child: str, taken: dict[str, list[int]], cleared: dict[str, int], unsure: set[str]
    ) -> None:
        """Snapshot ``child`` was committed on ``parent``: record what follows for ``child``.

        ``taken``: stack -> the slots the commit wrote slices to. ``cleared``: stack -> the highest slot it
        removed slices from (an item's old slices, when its arrays were written again). ``unsure``: stacks whose
        next free slot the commit may have changed otherwise (deletions, slots moved after a lost race): left
        unknown, for a listing to tell.
        """
        with self._lock:
            known = {stack: slot for stack, slot in self._at.get(parent, {}).items() if stack not in unsure}
            for stack, slots in taken.items():
                if stack in known and slots:
                    known[stack] = max(known[stack], max(slots) + 1)
            for stack, highest in cleared.items():
                # Slices cleared below the commit's own highest slice leave it the stack's last; otherwise the
                # cleared one may have been the last, and how far the free slots reach down only a listing says.
                top = max(taken.get(stack) or [-1])
                if stack in known and not (highest < top and known[stack] == top + 1):
                    del known[stack]
            if known:
                self._at[child] = known
                self._keep_newest(child)

    def known(self) -> list[tuple[str, str, int]]:
        """(snapshot, stack, next free slot) of everything known."""
        with self._lock:
            return [
                (snapshot_id, stack, slot) for snapshot_id, stacks in self._at.items() for stack, slot in stacks.items()
            ]

    def _keep_newest(self, snapshot_id: str) -> None:
        self._at.move_to_end(snapshot_id)
        while len(self._at) > SNAPSHOTS_KEPT:
            self._at.popitem(last=False)


def slot_arrays(session: icechunk.Session, stack: str) -> list[str]:
    """The arrays of stack ``stack`` that lie along the slot axis (its coordinates and its pixel arrays)."""
    group = zarr.open_group(session.store, path=stack, mode="r")
    return sorted(
        name
        for name, array in group.arrays()
        if (array.metadata.dimension_names or (None,))[0] == SLOT  # type: ignore[union-attr]
    )


class Slots:
    """The slots one writer took, stack by stack, and which item each belongs to.

    ``known``: the repository's next free slots at the snapshots this process saw (taken from it where it has
    them, told of what was listed and committed).
    """

    def __init__(self, known: NextSlots | None = None) -> None:
        self._known = known if known is not None else NextSlots()
        self._cleared: dict[str, int] = {}
        """Stack -> the highest slot this writer removed a slice from (re-staged items' old slices, deleted
        items')."""
        self._capacity: dict[str, int] = {}
        self.vacated: set[tuple[str, int]] = set()
        """(stack, slot) this writer moved slices away from, or cleared for an item it deletes: its changes
        there are no claim on them. Whatever the tip holds there belongs to the tip's rows."""
        self._next: dict[str, int] = {}
        self._taken: dict[str, list[int]] = {}
        self.owners: dict[tuple[str, int], Key] = {}
        """(stack, slot) -> the (collection, id) of the item whose slice it holds."""

    def __bool__(self) -> bool:
        return bool(self.owners)

    def cleared(self, pieces: Iterable[Piece]) -> None:
        """This writer clears the slices ``pieces`` name because it deletes their items (the rows leave with its
        commit). A re-staged item's old slices are not vacated: two writers re-staging one item conflict."""
        pieces = list(pieces)
        self.vacated |= {(piece.stack, piece.slot) for piece in pieces}
        self.vacated -= set(self.owners)
        self.clearing(pieces)

    def clearing(self, pieces: Iterable[Piece]) -> None:
        """This writer removes the slices ``pieces`` name (their stacks' next free slot may go down)."""
        for piece in pieces:
            self._cleared[piece.stack] = max(piece.slot, self._cleared.get(piece.stack, -1))

    def _next_free(self, session: icechunk.Session, stack: str) -> int:
        """:func:`next_free_slot` of ``stack`` in ``session``, from what the repository knows of its snapshot
        where it can. A session with staged changes has no snapshot's view, so what it lists is not kept."""
        known = self._known.get(session.snapshot_id, stack)
        if known is not None:
            return known
        found = next_free_slot(session, stack)
        if not session.has_uncommitted_changes:
            self._known.put(session.snapshot_id, stack, found)
        return found

    def committed(self, parent: str, child: str) -> None:
        """This writer's change was committed on ``parent`` as ``child``: the repository learns the child's next
        free slots (see :class:`NextSlots`)."""
        self._known.committed(parent, child, self._taken, self._cleared, {stack for stack, _ in self.vacated})

    def take(self, session: icechunk.Session, stack: str, owner: Key) -> int:
        """The next slot of ``stack`` for ``owner``'s slice."""
        if stack not in self._next:
            self._next[stack] = self._next_free(session, stack)
            self._capacity[stack] = zarr.open_array(session.store, path=f"{stack}/{ITEM}", mode="r").shape[0]
        slot = self._next[stack]
        if slot >= self._capacity[stack]:
            raise InvalidRaster(
                f"granule {owner[1]} cannot be stored: stack {stack} is full ({self._capacity[stack]:,} slots; "
                "arrays.stack_capacity sets the room of stacks created from now on)",
                path=stack,
            )
        self._next[stack] = slot + 1
        self._taken.setdefault(stack, []).append(slot)
        self.owners[(stack, slot)] = owner
        return slot

    def follow(
        self,
        repository_icechunk: icechunk.Repository,
        session: icechunk.Session,
        tip: str,
        theirs: dict[str, list[list[int]]],
    ) -> Moves:
        """Step 2: move this writer's slots past the slots snapshot ``tip`` took meanwhile; return the moves.

        ``theirs`` are the chunks the commits from this writer's base to ``tip`` changed. The slots move past
        every slot those commits touched, not only past the tip's last: a slot another writer appended and a
        later commit deleted again is free at the tip (a stack's last slot is reused), yet the rebase replays
        each of those commits and sees this writer's slice there as written over theirs."""
        if not self._taken:
            return {}
        at_tip = repository_icechunk.readonly_session(snapshot_id=tip)
        moves: Moves = {}
        for stack, slots in self._taken.items():
            try:
                tip_next = self._next_free(at_tip, stack)
            except icechunk.IcechunkError:
                continue  # the stack is not at the tip (it cannot have taken slots in it)
            touched = [index[0] for index in theirs.get(f"/{stack}/{ITEM}", [])]
            tip_next = max([tip_next, *(slot + 1 for slot in touched)])
            if min(slots) >= tip_next:
                continue
            new = {old: tip_next + index for index, old in enumerate(slots)}
            for array in slot_arrays(session, stack):
                session.reindex_array(f"/{stack}/{array}", _forward(new), _backward(new))
            moves.update({(stack, old): slot for old, slot in new.items()})
            self.vacated |= {(stack, old) for old in slots}
            self.vacated -= {(stack, slot) for slot in new.values()}
            self._taken[stack] = [new[old] for old in slots]
            self._next[stack] = tip_next + len(slots)
        if moves:
            self.owners = {(stack, moves.get((stack, slot), slot)): key for (stack, slot), key in self.owners.items()}
            log.info("moved %d slot(s) past a concurrent writer's", len(moves))
        return moves


def _forward(new: dict[int, int]) -> Any:
    def forward(coordinates: Iterable[int]) -> list[int] | None:
        index = list(coordinates)
        slot = new.get(index[0])
        return None if slot is None else [slot, *index[1:]]

    return forward


def _backward(new: dict[int, int]) -> Any:
    """The inverse of :func:`_forward`, so that Icechunk clears each slot a slice left: without it a moved chunk
    stays at its old slot too (``reindex_array`` keeps a position nothing moves into), and where no other writer
    wrote that slot (one a deletion had freed) the rebase kept the copy: the item held two slots."""
    old_of = {slot: old for old, slot in new.items()}

    def backward(coordinates: Iterable[int]) -> list[int] | None:
        index = list(coordinates)
        if index[0] in old_of:
            return [old_of[index[0]], *index[1:]]
        if index[0] in new:
            return None  # left, and nothing moves in: cleared
        return index

    return backward


def clear_pieces(session: icechunk.Session, pieces: Iterable[Piece]) -> int:
    """Remove the slices ``pieces`` name (their chunks and their slots' coordinates); returns chunks removed.

    Used when an item's arrays are written again (the old slices go in the
    same commit) or the item is withdrawn. Older snapshots keep them.
    """
    store = session.store
    keys: list[str] = []
    for piece in pieces:
        try:
            array = zarr.open_array(store, path=f"{piece.stack}/{piece.array}", mode="r")
        except (FileNotFoundError, zarr.errors.NodeNotFoundError):
            continue
        _slots, _bands, chunk_height, chunk_width = array.metadata.chunks
        row, column, height, width = piece.window
        for band in range(array.shape[1]):
            for chunk_row in range(row // chunk_height, (row + height - 1) // chunk_height + 1):
                for chunk_column in range(column // chunk_width, (column + width - 1) // chunk_width + 1):
                    keys.append(f"{piece.stack}/{piece.array}/c/{piece.slot}/{band}/{chunk_row}/{chunk_column}")
        keys.append(f"{piece.stack}/{ITEM}/c/{piece.slot}")
        keys.append(f"{piece.stack}/{DATETIME}/c/{piece.slot}")

    async def delete_all() -> int:
        count = 0
        for key in dict.fromkeys(keys):
            if await store.exists(key):
                await store.delete(key)
                count += 1
        return count

    return sync(delete_all())
