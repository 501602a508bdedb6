"""Slots in stacks: where a writer's granules go on a stack's slot axis, and how they move when it loses a race.

Granules that share a pixel grid are slices of one stack (array layout 2,
``ingest/rasters/_stack.py``); each granule takes a *slot*, one position on
the stack axis, in every stack it writes to. Writers never coordinate, so:

1. **Take.** A writer takes the slots after the last one its base holds
   (the highest chunk of the stack's ``item`` coordinate, plus one), one
   after another. Another writer on the same base takes the same ones.
2. **Lose a race.** The commit protocol (:mod:`ingest.repository._commit`)
   rebases the loser's session onto the winner's tip. Two writers that wrote
   the same slot wrote the same chunks, which Icechunk cannot merge
   (``ChunkDoubleUpdate``). So first (:meth:`Slots.follow`) every slot the
   loser took in a stack the winner appended to moves past the winner's last
   slot, with Icechunk's ``reindex_array``: the chunk references move, no
   pixel is read or written again.
3. **Check, then rebase.** Moving a chunk leaves its old position cleared in
   the loser's changes, and where the winner wrote there that is a conflict
   with no meaning (the loser never wanted that slot). The slots of items the
   loser deletes are vacated too: the tip's content there is the tip's rows'
   business, and the deletion, re-planned on the tip, takes whatever version
   of the item it holds. Every chunk both
   sides changed is compared against those vacated slots: any other (both
   replaced the same item's slices, say) is a real conflict and the caller
   re-plans (``CommitConflict``). Otherwise the rebase keeps the winner's
   chunks at the vacated slots (``BasicConflictSolver`` with ``UseTheirs``).
4. **Tell the rows.** The items whose pieces moved get their new slots in
   their ``floe:arrays`` asset (:func:`~ingest.stac.moved_slots`); the table
   change rewrites just the data files that hold them
   (:meth:`ItemsPlan.moved <ingest.repository._plan.ItemsPlan.moved>`).

Slots a commit cleared (an item replaced or withdrawn) are not reused unless
they were the stack's last; a free slot reads as ``item == ""``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import icechunk
import zarr
import zarr.errors
from zarr.core.sync import sync

from ingest.errors import CommitConflict, InvalidRaster
from ingest.repository._commit import rebase
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


def slot_arrays(session: icechunk.Session, stack: str) -> list[str]:
    """The arrays of stack ``stack`` that lie along the slot axis (its coordinates and its pixel arrays)."""
    group = zarr.open_group(session.store, path=stack, mode="r")
    return sorted(
        name
        for name, array in group.arrays()
        if (array.metadata.dimension_names or (None,))[0] == SLOT  # type: ignore[union-attr]
    )


class Slots:
    """The slots one writer took, stack by stack, and which item each belongs to."""

    def __init__(self) -> None:
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
        self.vacated |= {(piece.stack, piece.slot) for piece in pieces}
        self.vacated -= set(self.owners)

    def take(self, session: icechunk.Session, stack: str, owner: Key) -> int:
        """The next slot of ``stack`` for ``owner``'s slice."""
        if stack not in self._next:
            self._next[stack] = next_free_slot(session, stack)
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
                tip_next = next_free_slot(at_tip, stack)
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


#: How often a writer looks at the tip again when commits keep landing while it rebases.
FOLLOW_ROUNDS = 8


def rebase_following(
    repository_icechunk: icechunk.Repository,
    session: icechunk.Session,
    branch: str,
    slots: Slots | None,
    on_moves: Callable[[Moves], None] | None = None,
) -> None:
    """Steps 2 and 3: move this writer's slots past the tip's, then rebase onto the tip.

    ``on_moves`` hears each set of moves as it happens (the writer's rows
    follow their slots). Icechunk rebases onto the branch's tip *when the
    rebase runs*, which may be newer than the tip the slots were moved past:

    * without moves, a rebase that fails because the tip moved meanwhile
      looks again (the newer commit may have appended to this writer's stacks);
    * with moves, the rebase keeps the other side's chunks at vacated slots,
      so the tip is looked at once more right before it; should a commit
      still land in between and write one of this writer's new slots, its
      staged slices are gone: that is a ``CommitConflict`` (the batch is
      planned again), never a silent loss. On local storage the writer holds
      the root's mutation lock through all this (commits take it to swap),
      so that cannot happen there; object stores have no such lock.

    Raises ``CommitConflict`` when the staged changes collide with the tip's
    anywhere but at the slots this writer vacated.
    """
    for _ in range(FOLLOW_ROUNDS):
        tip = repository_icechunk.lookup_branch(branch)
        base = session.snapshot_id
        changes = slots is not None and (bool(slots) or bool(slots.vacated))
        theirs = repository_icechunk.diff(from_snapshot_id=base, to_snapshot_id=tip).updated_chunks if changes else {}
        moves = slots.follow(repository_icechunk, session, tip, theirs) if slots else {}
        if moves and on_moves is not None:
            on_moves(moves)
        if not moves and not (slots is not None and slots.vacated):
            try:
                rebase(session, branch)
                return
            except CommitConflict:
                if repository_icechunk.lookup_branch(branch) != tip:
                    continue  # a commit landed since the look: it may have taken slots this writer holds
                raise
        assert slots is not None
        ours = {path: {tuple(index) for index in chunks} for path, chunks in session.status().updated_chunks.items()}
        _refuse_real_conflicts(branch, ours, theirs, slots)
        if repository_icechunk.lookup_branch(branch) != tip:
            continue  # a commit landed while the moves were checked: look again before the rebase keeps theirs
        solver = icechunk.BasicConflictSolver(
            on_chunk_conflict=icechunk.VersionSelection.UseTheirs,
            fail_on_delete_of_updated_array=True,
            fail_on_delete_of_updated_group=True,
        )
        rebase(session, branch, solver)
        if session.snapshot_id != tip:
            # Commits landed between the look and the rebase; where they wrote a chunk this writer staged, the
            # solver kept theirs and this writer's slice is gone.
            newer = repository_icechunk.diff(from_snapshot_id=tip, to_snapshot_id=session.snapshot_id).updated_chunks
            lost = sorted(
                path
                for path, chunks in ours.items()
                if any(
                    tuple(index) in chunks and (_stack_of(path), index[0]) not in slots.vacated
                    for index in newer.get(path, [])
                )
            )
            if lost:
                raise CommitConflict(
                    f"a commit landed on {branch!r} while this writer rebased and wrote the slots it had just "
                    f"moved to ({', '.join(lost[:3])}): its staged slices are gone; re-plan these items",
                    paths=lost,
                )
        return
    raise CommitConflict(f"commits kept landing on {branch!r} while this writer rebased; re-plan these items")


def _stack_of(path: str) -> str:
    return path.strip("/").rsplit("/", 1)[0]


def _refuse_real_conflicts(
    branch: str, ours: dict[str, set[tuple[int, ...]]], theirs: dict[str, list[list[int]]], slots: Slots
) -> None:
    """Chunks both sides changed are fine only at slots this writer moved away from (it never wanted them)."""
    for path, chunks in ours.items():
        stack = _stack_of(path)
        both = chunks & {tuple(index) for index in theirs.get(path, [])}
        real = sorted(index for index in both if (stack, index[0]) not in slots.vacated)
        if real:
            raise CommitConflict(
                f"changes staged on {branch!r} conflict with a commit made meanwhile at {path} (chunks {real[:5]}): "
                "another writer changed the same slices; re-plan these items from the new tip",
                paths=[path],
            )


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
