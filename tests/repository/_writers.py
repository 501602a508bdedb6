"""Writer processes for the concurrency tests (importable by spawned children), and the places where they meet.

Spawned children share nothing with the test but the file system, so they
meet at marker files in a directory (:class:`Meeting`): a start line every
writer waits at until all are up, and a forced race (:class:`Race`) whose loser
cannot win its compare-and-swap. Waiting is for an event, never for a time:
the timeout only turns a stuck test into a failure that names what it waited for.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.pool import AsyncResult
from pathlib import Path
from typing import Any

from ingest import Repository, Settings
from ingest.repository import CommitMetadata
from ingest.repository import _commit as commit_module
from ingest.stac import arrays_asset
from tests.conftest import make_item

STUCK_AFTER = 300.0
"""Seconds after which a wait has failed: another process died or never came (no commit here takes this long)."""

LOSER_WAITING = "race-loser-waiting"
"""The loser has written its metadata.json and waits before its compare-and-swap."""
WINNER_LANDED = "race-winner-landed"
"""The winner's commit is on the branch."""
GO = "race-go"
"""The test lets a held winner commit."""


@dataclass(frozen=True)
class Meeting:
    """A directory of marker files where processes wait for each other."""

    directory: str

    def arrive(self, name: str) -> None:
        Path(self.directory, name).touch()

    def arrived(self, name: str) -> bool:
        return Path(self.directory, name).exists()

    def wait_for(self, *names: str, check: Callable[[], object] | None = None) -> None:
        """Wait until every one of ``names`` has arrived; ``check`` is called meanwhile (it may raise to give up)."""
        stuck_at = time.monotonic() + STUCK_AFTER
        while not all(self.arrived(name) for name in names):
            if check is not None:
                check()
            if time.monotonic() > stuck_at:
                missing = [name for name in names if not self.arrived(name)]
                raise TimeoutError(f"waited {STUCK_AFTER:.0f}s for {missing} in {self.directory}")
            time.sleep(0.01)


def wait_while_writing(meeting: Meeting, name: str, pending: AsyncResult[Any]) -> None:
    """In the test: wait for ``name`` while the writers of ``pending`` run; a writer's error ends the wait."""

    def give_up_if_finished() -> None:
        if pending.ready():
            pending.get()  # raises the writer's error
            raise AssertionError(f"the writers finished before {name!r} arrived")

    meeting.wait_for(name, check=give_up_if_finished)


@dataclass(frozen=True)
class Race:
    """A race two writer processes run for certain, not by luck.

    At its commit number ``at``, the *loser* applies its table change (its
    metadata.json is written), then waits before its compare-and-swap until the
    *winner*'s commit number ``at`` has landed. The winner makes that commit's
    compare-and-swap only once the loser waits (and, if ``held``, once the test
    has said ``GO``), so it lands after the loser's base: the loser's first
    swap finds the branch moved, and the loser rebases and retries. Its first
    metadata.json stays an orphan.
    """

    meeting: Meeting
    loser: int
    winner: int
    at: int = 0
    held: bool = False


def commit_worker(
    root: str,
    settings: dict[str, Any],
    worker: int,
    commits: int,
    rows: int,
    meeting: Meeting,
    writers: int,
    race: Race | None = None,
) -> list[dict[str, Any]]:
    """Make ``commits`` commits, each of one array and ``rows`` items naming it; report what each commit holds.

    Waits at ``meeting`` until all ``writers`` are up, so they start together.
    Each commit's report says which table versions its lost compare-and-swaps
    wrote (``lost``: their pointers, relative to ``<root>/tables/``) and
    whether it was the loser's side of ``race`` (``forced``).
    """
    repository = Repository.open(root, Settings.model_validate(settings))
    lost: list[str] = []
    gate = _Gate(race, worker)
    original = commit_module._swap

    def swap(*args: Any, **kwargs: Any) -> str:
        gate.before_swap()
        try:
            snapshot_id = original(*args, **kwargs)
        except BaseException:
            record = CommitMetadata.decode(kwargs.get("metadata", args[-1]))
            lost.append(record.items if record is not None and record.items is not None else "")
            raise
        gate.landed()
        return snapshot_id

    meeting.arrive(f"writer-{worker}-up")
    meeting.wait_for(*(f"writer-{number}-up" for number in range(writers)))
    commit_module._swap = swap  # type: ignore[assignment]
    try:
        done = []
        for number in range(commits):
            gate.commit = number
            lost.clear()
            writer = repository.writer()
            group_name = f"w{worker}-{number}"
            group = writer.item_group("c", group_name)
            array = group.create_array("band", shape=(4,), dtype="int32")
            array[:] = worker * 1000 + number
            ids = [f"{group_name}-{row}" for row in range(rows)]
            for item_id in ids:
                item = make_item(item_id, "c", **{f"w{worker}": number})
                item["assets"]["floe:arrays"] = arrays_asset(f"c/{group_name}", ["band"])
                writer.add_item(item)
            result = writer.commit(f"worker {worker} commit {number}")
            done.append(
                {
                    "snapshot_id": result.snapshot_id,
                    "ids": ids,
                    "group": group_name,
                    "value": worker * 1000 + number,
                    "attempts": result.attempts,
                    "files_written": result.files_written,
                    "lost": list(lost),
                    "forced": gate.role == "loser" and gate.racing(),
                }
            )
        return done
    finally:
        commit_module._swap = original  # a pool process may run another task


def snapshot_ids(results: list[list[dict[str, Any]]]) -> list[list[str]]:
    """Each writer's snapshot ids (from the reports of ``commit_worker``), in the order it made its commits."""
    return [[commit["snapshot_id"] for commit in worker] for worker in results]


def forced_loss(results: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """The report of the commit that was the loser's side of the race; asserts it lost its first swap."""
    (forced,) = [commit for worker in results for commit in worker if commit["forced"]]
    assert forced["attempts"] > 1 and forced["lost"], f"the forced race was not lost: {forced}"
    return forced


class _Gate:
    """One writer's side of a :class:`Race`: where its commit ``at`` waits, and what it tells the other side."""

    def __init__(self, race: Race | None, worker: int) -> None:
        self.race = race
        self.role = None if race is None else {race.loser: "loser", race.winner: "winner"}.get(worker)
        self.commit = -1
        """The number of the commit under way."""
        self._waited = False
        self._landed = False

    def racing(self) -> bool:
        """Whether the commit under way is this writer's side of the race."""
        return self.race is not None and self.role is not None and self.commit == self.race.at

    def before_swap(self) -> None:
        if self.race is None or not self.racing() or self._waited:
            return
        self._waited = True
        if self.role == "loser":
            self.race.meeting.arrive(LOSER_WAITING)
            self.race.meeting.wait_for(WINNER_LANDED)
        else:
            self.race.meeting.wait_for(LOSER_WAITING, *([GO] if self.race.held else []))

    def landed(self) -> None:
        if self.race is None or not self.racing() or self.role != "winner" or self._landed:
            return
        self._landed = True
        self.race.meeting.arrive(WINNER_LANDED)
