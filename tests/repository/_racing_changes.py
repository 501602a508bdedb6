"""A deleter racing a replacer or an appender in two OS processes (importable by spawned children).

Each round is a fresh repository seeded with a few items that have rasters in
one stack. Two spawned writer processes make one commit each, and the race
between them is forced (:class:`tests.repository._writers.Race`): the loser
writes its table version, then waits before its compare-and-swap until the
winner has landed, so its first swap fails for certain and it rebases.

What each side stages is a pure function of the round (:func:`plan_round`),
so the test can compute what each serial order of the two commits leaves
(:func:`serial_outcome`) and compare the tip with the order ``floe log`` shows.
A loser refused with ``CommitConflict`` plans again from the new tip, as
``floe ingest`` does: a replacement of an item the winner deleted becomes
its creation.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from ingest import CommitConflict, Repository
from ingest.repository import _commit as commit_module
from tests.conftest import make_item, stage_raster
from tests.repository._writers import MAX_REPLANS, Meeting, Race, _start_worker, pixels_of, replace_raster

SEEDED = 6
"""Items each round starts with: ``s0`` .. ``s5``, each with its raster (:func:`pixels_of` its id)."""
APPENDED = 3
"""New items the appender adds: ``n0`` .. ``n2``."""


@dataclass(frozen=True)
class Round:
    """One round: which operation races the deleter, who loses, and the ids each side touches."""

    number: int
    rival: str
    """``replace`` (new rasters and properties for seeded items) or ``append`` (new items)."""
    deleter_loses: bool
    deleted: tuple[str, ...]
    changed: tuple[str, ...]
    """Ids the rival replaces or appends."""

    def message(self, operation: str) -> str:
        return f"round {self.number}: {operation}"


def plan_round(number: int) -> Round:
    """Round ``number``: the rival alternates between replace and append, the loser between the two sides, and the
    ids are drawn (seeded by the round) so that the deleter and the rival share some and not others."""
    draw = random.Random(number)
    seeded = [f"s{index}" for index in range(SEEDED)]
    rival = ("replace", "append")[number % 2]
    if rival == "replace":
        changed = sorted(draw.sample(seeded, 3))
        # At least one item both touch, and at least one only the deleter does.
        deleted = sorted({changed[0], *draw.sample([key for key in seeded if key not in changed], 2)})
    else:
        changed = [f"n{index}" for index in range(APPENDED)]
        # New items the appender brings (unknown at the deleter's base) and seeded ones.
        deleted = sorted({*draw.sample(changed, 2), *draw.sample(seeded, 2)})
    return Round(number, rival, deleter_loses=(number // 2) % 2 == 0, deleted=tuple(deleted), changed=tuple(changed))


def new_pixels_key(item_id: str) -> str:
    """The raster a replacement stages for ``item_id`` is :func:`pixels_of` this key."""
    return f"{item_id}-v2"


def serial_outcome(plan: Round, order: list[str]) -> dict[str, str]:
    """Item id -> the key of the pixels it holds, after the two commits land in ``order`` (``delete``, the rival)."""
    state = {f"s{index}": f"s{index}" for index in range(SEEDED)}
    for operation in order:
        if operation == "delete":
            for item_id in plan.deleted:
                state.pop(item_id, None)
        elif plan.rival == "replace":
            state.update((item_id, new_pixels_key(item_id)) for item_id in plan.changed)
        else:
            state.update((item_id, item_id) for item_id in plan.changed)
    return state


def seed_round(repository: Repository) -> None:
    writer = repository.writer()
    for index in range(SEEDED):
        item_id = f"s{index}"
        writer.add_item(stage_raster(writer, make_item(item_id, "c", version=1), pixels_of(item_id)))
    writer.commit("seed the round")


def _stage(repository: Repository, plan: Round, operation: str) -> Any:
    writer = repository.writer()
    if operation == "delete":
        for item_id in plan.deleted:
            writer.delete_item("c", item_id)
    elif operation == "replace":
        stored = writer.stored_items(("c", item_id) for item_id in plan.changed)
        for item_id in plan.changed:
            item, previous = make_item(item_id, "c", version=2), stored.get(("c", item_id))
            pixels = pixels_of(new_pixels_key(item_id))
            if previous is not None:
                item = replace_raster(writer, item, pixels, previous)
            else:  # deleted by the winner: planned again, the replacement creates it
                item = stage_raster(writer, item, pixels)
            writer.add_item(item, replace=True)
    else:
        for item_id in plan.changed:
            writer.add_item(stage_raster(writer, make_item(item_id, "c", version=1), pixels_of(item_id)))
    return writer


def change_worker(
    root: str, settings: dict[str, Any], worker: int, meeting: Meeting, race: Race, number: int
) -> dict[str, Any]:
    """Worker 0 deletes, worker 1 runs the round's rival; one commit each, racing as ``race`` forces.

    Reports the commit's snapshot, attempts, how often it was refused and planned again (``replans``), rows
    deleted, the keys it did not find, and whether its first swap was lost (``lost``).
    """
    plan = plan_round(number)
    operation = "delete" if worker == 0 else plan.rival
    repository, gate, lost, original = _start_worker(root, settings, worker, meeting, 2, race)
    try:
        gate.commit = 0
        for replans in range(MAX_REPLANS + 1):
            writer = _stage(repository, plan, operation)
            try:
                result = writer.commit(plan.message(operation))
                break
            except CommitConflict:
                if replans == MAX_REPLANS:
                    raise
        return {
            "operation": operation,
            "snapshot_id": result.snapshot_id,
            "attempts": result.attempts,
            "replans": replans,
            "rows_deleted": result.rows_deleted,
            "not_found": sorted(item_id for _, item_id in result.not_found),
            "lost": bool(lost),
        }
    finally:
        commit_module._swap = original  # a pool process runs the next round too
