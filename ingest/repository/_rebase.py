"""Phase 6 of the commit protocol: carry a session that lost its race onto the branch's tip.

A session with no slots in stacks is rebased with Icechunk's
``ConflictDetector`` (:func:`rebase`). A writer's session whose granules took
slots first moves them past the winner's (:func:`rebase_following`, the steps
of :mod:`ingest.repository._slots`), and returns the moves: the commit loop
hands them to the table change, whose rows follow their slices.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from typing import TYPE_CHECKING

import icechunk

from ingest.errors import CommitConflict
from ingest.repository._slots import Moves, Slots

if TYPE_CHECKING:
    from ingest.repository._repo import Repository

log = logging.getLogger(__name__)


def rebase(session: icechunk.Session, branch: str, solver: icechunk.ConflictSolver | None = None) -> None:
    """Carry the staged changes onto the branch's new tip, or name the nodes that collide.

    Args:
        session: the session that lost its race (or whose branch moved while it staged).
        branch: the branch whose tip it goes onto.
        solver: replaces Icechunk's ``ConflictDetector`` (slots that moved keep the winner's chunks).

    Raises:
        CommitConflict: the staged changes and the tip's changed the same nodes.
    """
    try:
        session.rebase(solver or icechunk.ConflictDetector())
    except icechunk.RebaseFailedError as error:
        paths = sorted({conflict.path for conflict in error.conflicts})
        raise CommitConflict(
            f"changes staged on {branch!r} conflict with a commit made meanwhile at {', '.join(paths)}: "
            "another writer changed the same nodes; re-plan these items from the new tip",
            paths=paths,
        ) from error


def rebase_staged(repository: Repository, session: icechunk.Session, branch: str, slots: Slots | None) -> list[Moves]:
    """Rebase ``session`` onto ``branch``'s tip, moving the slots it took past the tip's first.

    On local storage a session that took slots holds the root's mutation lock
    from its look at the tip to the rebase (commits take it to swap), so no
    commit lands in between (see :func:`rebase_following`).

    Args:
        repository: the repository of the session.
        session: the session that lost its race (or whose branch moved while it staged).
        branch: the branch whose tip it goes onto.
        slots: the slots the session's writer took, or None for a session that stages no granules.

    Returns:
        The moves, one set per look at the tip (none without slots).

    Raises:
        CommitConflict: the staged changes collide with the tip's (anywhere but at slots this writer vacated).
    """
    if slots is None:
        rebase(session, branch)
        return []
    with repository.location.mutation_lock() if slots else nullcontext():
        return rebase_following(repository.icechunk, session, branch, slots)


#: How often a writer looks at the tip again when commits keep landing while it rebases.
FOLLOW_ROUNDS = 8


def rebase_following(
    repository_icechunk: icechunk.Repository,
    session: icechunk.Session,
    branch: str,
    slots: Slots | None,
) -> list[Moves]:
    """Steps 2 and 3: move this writer's slots past the tip's, then rebase onto the tip; returns the moves.

    Each set of moves is one look at the tip (the rows of the items whose
    slices moved follow them in that order). Icechunk rebases onto the
    branch's tip *when the rebase runs*, which may be newer than the tip the
    slots were moved past:

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
    followed: list[Moves] = []
    for _ in range(FOLLOW_ROUNDS):
        tip = repository_icechunk.lookup_branch(branch)
        base = session.snapshot_id
        changes = slots is not None and (bool(slots) or bool(slots.vacated))
        theirs = repository_icechunk.diff(from_snapshot_id=base, to_snapshot_id=tip).updated_chunks if changes else {}
        moves = slots.follow(repository_icechunk, session, tip, theirs) if slots else {}
        if moves:
            followed.append(moves)
        if not moves and not (slots is not None and slots.vacated):
            try:
                rebase(session, branch)
                return followed
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
        return followed
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
