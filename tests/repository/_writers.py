"""Writer processes for the concurrency tests (importable by spawned children), and the places where they meet.

Spawned children share nothing with the test but the file system, so they
meet at marker files in a directory (:class:`Meeting`): a start line every
writer waits at until all are up, and a forced race (:class:`Race`) whose loser
cannot win its compare-and-swap. Waiting is for an event, never for a time:
the timeout only turns a stuck test into a failure that names what it waited for.

Two workloads: :func:`commit_worker` (each commit a few items, each with an
8x8 raster of its own, every writer appending to the same stack) and the
mixed one of :func:`mixed_worker` (fresh items, replaced shared items and
their rasters, properties that widen the schema), shared by
``test_mixed_writers_s3`` and ``scripts/bench_many_writers.py``. A mixed
commit's content is a pure function of (writer, sequence)
(:func:`plan_commit`), so each writer reports only which commit landed where,
and :func:`verify_mixed` computes what the tip must hold from ``floe log``.
"""

from __future__ import annotations

import os
import random
import time
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.pool import AsyncResult
from pathlib import Path
from typing import Any

import numpy as np

from ingest import CommitConflict, Repository, Settings, Writer
from ingest.repository import CommitMetadata
from ingest.repository import _commit as commit_module
from ingest.stac import read_arrays_asset
from tests import invariants
from tests.conftest import make_item, stage_raster

STUCK_AFTER = 300.0
"""Seconds after which a wait has failed: another process died or never came (no commit here takes this long)."""

LOSER_WAITING = "race-loser-waiting"
"""The loser has written its metadata.json and waits before its compare-and-swap."""
WINNER_LANDED = "race-winner-landed"
"""The winner's commit is on the branch."""
GO = "race-go"
"""The test lets a held winner commit."""


def pixels_of(item_id: str) -> np.ndarray:
    """The 8x8 int16 raster :func:`commit_worker` stages for ``item_id`` (seeded by the id: the verifier makes it
    again)."""
    return np.random.default_rng(zlib.crc32(item_id.encode())).integers(-(2**15), 2**15, size=(8, 8), dtype="int16")


def staged_slots(item: dict[str, Any]) -> dict[str, int]:
    """Stack -> the slot the item's arrays are at (as staged, or as stored)."""
    asset = read_arrays_asset(item)
    assert asset is not None, f"item {item['id']!r} has no arrays"
    return {piece.stack: piece.slot for piece in asset.pieces()}


def replace_raster(
    writer: Writer, item: dict[str, Any], pixels: np.ndarray, stored: dict[str, Any] | None = None, **where: Any
) -> dict[str, Any]:
    """Stage new arrays for an item the writer's base holds with arrays, as ``floe ingest`` does for a changed
    raster: the new slices, and the old ones cleared in the same commit. ``stored`` is the item as the base
    holds it (looked up when not given). Returns the item to add with ``replace=True``."""
    if stored is None:
        key = (item["collection"], item["id"])
        stored = writer.stored_items([key])[key]
    previous = read_arrays_asset(stored)
    assert previous is not None, f"{item['id']!r} has no arrays at the writer's base"
    staged = stage_raster(writer, item, pixels, **where)
    writer.clear_pieces(previous.pieces())
    return staged


@dataclass(frozen=True)
class Meeting:
    """A directory of marker files where processes wait for each other."""

    directory: str

    def arrive(self, name: str) -> None:
        Path(self.directory, name).touch()

    def arrived(self, name: str) -> bool:
        return Path(self.directory, name).exists()

    def count(self, prefix: str) -> int:
        """How many markers whose names start with ``prefix`` have arrived."""
        return sum(1 for name in os.listdir(self.directory) if name.startswith(prefix))

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


def _start_worker(
    root: str, settings: dict[str, Any], worker: int, meeting: Meeting, writers: int, race: Race | None
) -> tuple[Repository, _Gate, list[str], Any]:
    """Open the repository, wait until all ``writers`` are up, and gate this process's swaps.

    Returns the repository, the gate, the list the gate fills with lost table
    versions, and the original swap to restore (``_commit._swap``).
    """
    repository = Repository.open(root, Settings.model_validate(settings))
    lost: list[str] = []
    gate = _Gate(race, worker)
    meeting.arrive(f"writer-{worker}-up")
    meeting.wait_for(*(f"writer-{number}-up" for number in range(writers)))
    return repository, gate, lost, _gate_swaps(gate, lost)


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
    """Make ``commits`` commits, each of ``rows`` items with a raster each; report what each commit holds.

    Every item's raster is :func:`pixels_of` its id at the same place, so
    all writers append to one stack of collection ``c`` and the loser of a
    race must move its slots past the winner's. Waits at ``meeting`` until
    all ``writers`` are up, so they start together. Each commit's report
    says at which slot each item was staged (``staged``: id -> stack ->
    slot), which table versions its lost compare-and-swaps wrote (``lost``:
    their pointers, relative to ``<root>/tables/``) and whether it was the
    loser's side of ``race`` (``forced``).
    """
    repository, gate, lost, original = _start_worker(root, settings, worker, meeting, writers, race)
    try:
        done = []
        for number in range(commits):
            gate.commit = number
            lost.clear()
            ids = [f"w{worker}-{number}-{row}" for row in range(rows)]
            for replans in range(MAX_REPLANS + 1):
                writer = repository.writer()
                staged = {}
                for item_id in ids:
                    item = stage_raster(writer, make_item(item_id, "c", **{f"w{worker}": number}), pixels_of(item_id))
                    staged[item_id] = staged_slots(item)
                    writer.add_item(item)
                try:
                    result = writer.commit(f"worker {worker} commit {number}")
                    break
                except CommitConflict:
                    # On object stores a commit can land between a loser's look at the tip and its rebase, on the
                    # slots it moved to; its slices are gone and it is refused: stage again, as ingest does.
                    if replans == MAX_REPLANS:
                        raise
            done.append(
                {
                    "snapshot_id": result.snapshot_id,
                    "ids": ids,
                    "staged": staged,
                    "attempts": result.attempts,
                    "replans": replans,
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
    """The report of the commit that was the loser's side of the race; asserts it lost its first swap and then
    landed: by trying again on the winner's tip, or (on object stores, when a third writer's commit took the slots
    it had moved to) by staging anew, which a replan counts."""
    (forced,) = [commit for worker in results for commit in worker if commit["forced"]]
    recovered = forced["attempts"] > 1 or forced.get("replans", 0) > 0
    assert forced["lost"] and recovered, f"the forced race was not lost: {forced}"
    return forced


def _gate_swaps(gate: _Gate, lost: list[str]) -> Any:
    """Route this process's compare-and-swaps through ``gate``, recording the pointers of lost ones in ``lost``.

    Returns the original swap, which the caller puts back when done (a pool process may run another task).
    """
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

    commit_module._swap = swap  # type: ignore[assignment]
    return original


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


# -- the mixed workload: appends, shared replacements, schema widening, arrays ----------------------------------------
SHARED = 50
"""Items every writer replaces: ``shared-00`` to ``shared-49``, seeded at version 0 before the writers start."""
SHARED_ARRAYS_EVERY = 5
"""Every fifth shared item has arrays: two writers replacing them at once both clear its slices, and one re-plans."""
APPENDS = 3
"""Fresh items per commit (the first with arrays of its own, in the stack every writer appends to)."""
REPLACES = 2
"""Shared items replaced per commit."""
NEW_PROPERTY_EVERY = 10
"""Every tenth commit of a writer brings a property no item had (the schema grows all run long)."""
MAX_REPLANS = 100
"""A commit refused this many times in a row (``CommitConflict``) fails the writer: re-planning would not converge."""
COMMIT_MARKER = "commit-"


def shared_id(number: int) -> str:
    return f"shared-{number:02d}"


def version_of(worker: int, sequence: int) -> int:
    """The version one commit gives its items and arrays: writer and sequence in one number (0 for the seed)."""
    return (worker + 1) * 100_000 + sequence


@dataclass(frozen=True)
class Planned:
    """What one commit stages, a pure function of (writer, sequence): the verifier computes it again."""

    version: int
    items: list[dict[str, Any]]
    replacing: frozenset[str]
    """Ids staged as replacements (the shared items)."""
    arrays: frozenset[str]
    """Ids whose raster (8x8 int32 pixels, all ``version``) is staged: fresh ones, or replacing the stored one."""

    def pixels(self) -> np.ndarray:
        return np.full((8, 8), self.version, dtype="int32")


def _planned(version: int, appended: list[str], replacing: list[str], properties: dict[str, Any]) -> Planned:
    arrays = {*appended[:1], *(item_id for item_id in replacing if int(item_id[-2:]) % SHARED_ARRAYS_EVERY == 0)}
    items = []
    for index, item_id in enumerate(appended + replacing):
        # An integer in some items and a float in others, within one commit and across commits.
        mixed = version + index if index % 2 == 0 else version + index + 0.5
        items.append(make_item(item_id, "c", **properties, mixed=mixed))
    return Planned(version, items, frozenset(replacing), frozenset(arrays))


def seed_plan() -> Planned:
    """The first version of every shared item (version 0), committed before the writers start."""
    return _planned(0, [], [shared_id(number) for number in range(SHARED)], {"version": 0})


def plan_commit(worker: int, sequence: int, *, raced: bool = False) -> Planned:
    """Commit ``sequence`` of writer ``worker``: fresh items, replaced shared items, properties that widen the schema.

    A ``raced`` commit (either side of a forced race) replaces ``shared-01`` only, which has no arrays, so the
    loser re-plans its replacement on the winner's table version instead of being refused.
    """
    version = version_of(worker, sequence)
    properties: dict[str, Any] = {
        "version": version,
        "writer": worker,
        "sequence": sequence,
        f"note_w{worker}": f"writer {worker}, commit {sequence}",
    }
    if sequence % NEW_PROPERTY_EVERY == 0:
        properties[f"extra_w{worker}_{sequence}"] = sequence * 1.5
    if raced:
        replacing = [shared_id(1)]
    else:
        replacing = sorted(random.Random(version).sample([shared_id(number) for number in range(SHARED)], REPLACES))
    return _planned(version, [f"w{worker}-{sequence}-{index}" for index in range(APPENDS)], replacing, properties)


def stage(writer: Writer, planned: Planned) -> None:
    """Stage ``planned`` in ``writer``: each item, and the rasters of those that have them (a shared item's
    replace its stored ones, cleared in the same commit)."""
    restaged = planned.arrays & planned.replacing
    stored = writer.stored_items(("c", item_id) for item_id in sorted(restaged)) if restaged else {}
    for planned_item in planned.items:
        item, key = planned_item, ("c", planned_item["id"])
        if item["id"] in planned.arrays:
            if key in stored:
                item = replace_raster(writer, item, planned.pixels(), stored[key])
            else:
                item = stage_raster(writer, item, planned.pixels())
        writer.add_item(item, replace=item["id"] in planned.replacing)


def seed_shared(repository: Repository) -> str:
    """Create the collection's group and commit the shared items at version 0 (and its stack, with the first
    rasters); returns the snapshot id."""
    repository.ensure_groups(["c"])
    writer = repository.writer()
    stage(writer, seed_plan())
    return writer.commit("seed the shared items").snapshot_id


def mixed_worker(
    root: str,
    settings: dict[str, Any],
    worker: int,
    meeting: Meeting,
    writers: int,
    *,
    total: int | None = None,
    each: int | None = None,
    race: Race | None = None,
) -> list[dict[str, Any]]:
    """Commit :func:`plan_commit` after plan until ``total`` commits are made by all writers together, or ``each``.

    A commit refused with ``CommitConflict`` (another writer replaced the same
    item with arrays meanwhile) is planned again from the new tip with the same
    content. Each commit's report: ``attempts`` (of the commit that landed),
    ``replans``, ``wait`` (seconds from its first attempt to success), what the
    race did (``raced``, ``forced``, ``lost`` as in :func:`commit_worker`).
    """
    repository, gate, lost, original = _start_worker(root, settings, worker, meeting, writers, race)
    try:
        done: list[dict[str, Any]] = []
        while (each is None or len(done) < each) and (total is None or meeting.count(COMMIT_MARKER) < total):
            sequence = gate.commit = len(done)
            lost.clear()
            raced = gate.racing()
            planned = plan_commit(worker, sequence, raced=raced)
            started = time.monotonic()
            for replans in range(MAX_REPLANS + 1):
                writer = repository.writer()
                stage(writer, planned)
                try:
                    result = writer.commit(f"writer {worker} commit {sequence}")
                    break
                except CommitConflict:
                    if replans == MAX_REPLANS:
                        raise
            meeting.arrive(f"{COMMIT_MARKER}{worker}-{sequence}")
            done.append(
                {
                    "worker": worker,
                    "sequence": sequence,
                    "snapshot_id": result.snapshot_id,
                    "attempts": result.attempts,
                    "replans": replans,
                    "wait": time.monotonic() - started,
                    "rows_replaced": result.rows_replaced,
                    "raced": raced,
                    "forced": raced and gate.role == "loser",
                    "lost": list(lost),
                }
            )
        return done
    finally:
        commit_module._swap = original


def expected_items(repository: Repository, seed: str, results: list[list[dict[str, Any]]]) -> dict[str, dict]:
    """Item id -> the properties the tip must show: the commit that wrote it last, in the order of ``floe log``."""
    by_snapshot = {commit["snapshot_id"]: commit for worker in results for commit in worker}
    expected: dict[str, dict] = {}
    for entry in reversed(repository.log("main")):
        if entry.snapshot_id == seed:
            planned = seed_plan()
        elif (commit := by_snapshot.get(entry.snapshot_id)) is not None:
            planned = plan_commit(commit["worker"], commit["sequence"], raced=commit["raced"])
        else:
            continue
        expected.update((item["id"], item["properties"]) for item in planned.items)
    return expected


def assert_no_writer_starves(results: list[list[dict[str, Any]]], fraction: float = 1 / 3) -> None:
    """Every writer made at least ``fraction`` of its fair share of the commits."""
    counts = [len(worker) for worker in results]
    fair = sum(counts) / len(counts)
    starved = [number for number, count in enumerate(counts) if count < fair * fraction]
    assert not starved, f"writer(s) {starved} made fewer than {fraction:.0%} of the fair share {fair:.1f}: {counts}"


def verify_mixed(repository: Repository, seed: str, results: list[list[dict[str, Any]]]) -> dict[str, str]:
    """Check what the mixed workload must leave; check -> ``ok`` or the first line of what failed."""
    outcomes: dict[str, str] = {}

    def run(name: str, check_it: Callable[[], object]) -> None:
        try:
            check_it()
        except AssertionError as failure:
            outcomes[name] = f"FAILED: {str(failure).splitlines()[0]}"
        else:
            outcomes[name] = "ok"

    expected = expected_items(repository, seed, results)
    tip = repository.view("main")
    rows = invariants.Rows()
    versions = {item_id: properties["version"] for item_id, properties in expected.items()}
    run(
        "history holds every commit, in order",
        lambda: invariants.assert_history_holds(repository, "main", *snapshot_ids(results)),
    )
    run("every item exactly once", lambda: invariants.assert_items_exactly(tip, Counter(expected.keys()), rows))
    run("replaced items at their last version", lambda: invariants.assert_newest_versions(tip, versions))
    # floe widens integer -> double where a column mixes both (ingest/stac/_rows.py): equal numbers, counted apart.
    run("items read back as committed", lambda: invariants.assert_properties(tip, expected, same_json_type=False))
    retyped = invariants.changed_properties(tip, expected)[1]
    outcomes["integers read back as floats"] = f"{len(retyped)} (e.g. {retyped[0]})" if retyped else "0"
    run("arrays match their rows", lambda: invariants.assert_arrays_match_rows(tip, "version"))
    run("no row without its arrays", lambda: invariants.assert_rows_have_their_arrays(tip, rows))
    run("no arrays without their row", lambda: invariants.assert_no_slice_without_row(tip, rows))
    run("floe check --all --deep", lambda: invariants.assert_check_passes(repository))
    run("no writer starves", lambda: assert_no_writer_starves(results))
    return outcomes
