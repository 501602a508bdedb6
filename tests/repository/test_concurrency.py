"""Uncoordinated writers in separate OS processes, on local disk and on a real S3 server.

The writers start together (they wait at a start line until all are up), and
one race is forced: writer 0's middle commit has written its table version and
waits before its compare-and-swap until writer 1 has committed, so it must
lose, rebase and retry. While it waits the test tags the tip, so one tag is
taken mid-run for certain; more are taken while the writers run.

Every item has an 8x8 raster of its own at the same place, so all writers
append to one stack: whoever loses a race moves its slots past the winner's
(``ingest/repository/_slots.py``), and the forced loser's slots certainly move.

Invariants checked afterwards (:mod:`tests.invariants`): the branch history is
linear and holds every commit, each writer's in its order; at every snapshot
the table holds exactly the rows of that snapshot's ancestry (none lost, none
twice), the stack's slots hold exactly those items (none a lost attempt left,
none twice), every row's pieces are slots naming it and every occupied slot is
named by a row; the tip's arrays read back equal to what each writer staged, and
every committed row is readable there; every tag shows exactly the moment it was
taken.

The mixed workload (``test_mixed_writers_s3``; ``scripts/bench_many_writers.py``
runs it with 8 writers and hundreds of commits) adds what appends alone do not
reach: every commit also replaces items all writers share (some with arrays,
so two writers replacing one at once collide and the loser re-plans), and
brings properties that widen the schema (a new column per writer, a property
that is an integer in some items and a float in others). A forced race makes
two writers replace the same item, so the loser re-plans its replacement on
the winner's table version for certain. Afterwards: every item once, each
shared item at the version of the last commit in the history that replaced
it, every property as committed, every row's arrays holding its version,
``floe check --all --deep`` clean.
"""

from __future__ import annotations

import multiprocessing
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ingest import Repository, Settings
from ingest.repository import CommitMetadata
from tests import invariants
from tests.repository._writers import (
    GO,
    LOSER_WAITING,
    Meeting,
    Race,
    commit_worker,
    forced_loss,
    mixed_worker,
    pixels_of,
    seed_shared,
    snapshot_ids,
    verify_mixed,
    wait_while_writing,
)

WRITERS = 4
COMMITS = 25
ROWS = 10
TAGS = 8


def run_writers(root: str, settings: Settings, meeting: Meeting) -> tuple[list[list[dict[str, Any]]], dict[str, str]]:
    """Run the writer processes; meanwhile take tags of the tip. Returns each writer's commits and {tag: snapshot}."""
    repository = Repository.open(root, settings)
    repository.ensure_groups(["c"])
    race = Race(meeting, loser=0, winner=1, at=COMMITS // 2, held=True)
    context = multiprocessing.get_context("spawn")
    tags: dict[str, str] = {}
    with context.Pool(WRITERS) as pool:
        arguments = [
            (root, settings.model_dump(), worker, COMMITS, ROWS, meeting, WRITERS, race) for worker in range(WRITERS)
        ]
        pending = pool.starmap_async(commit_worker, arguments)

        # Writer 0 waits with a commit in flight and writer 1 is held: the tip is mid-run now, for certain.
        wait_while_writing(meeting, LOSER_WAITING, pending)
        tags["t0"] = repository.tag("t0", "main")
        meeting.arrive(GO)
        while not pending.ready() and len(tags) < TAGS:
            time.sleep(0.5)
            name = f"t{len(tags)}"
            tags[name] = repository.tag(name, "main")
        results = pending.get(timeout=600)
    return results, tags


def verify(root: str, settings: Settings, results: list[list[dict[str, Any]]], tags: dict[str, str]) -> None:
    repository = Repository.open(root, settings)
    commits = [commit for worker in results for commit in worker]
    history = invariants.assert_history_holds(repository, "main", *snapshot_ids(results))
    forced = forced_loss(results)

    by_snapshot = {commit["snapshot_id"]: commit for commit in commits}
    expected_ids: Counter[str] = Counter()
    expected_at: dict[str, Counter[str]] = {}
    for info in reversed(history):
        commit = by_snapshot.get(info.id)
        if commit is not None:
            expected_ids.update(commit["ids"])
        expected_at[info.id] = Counter(expected_ids)

    rows = invariants.Rows()  # nothing is deleted here: each data file is read once
    for info in history:
        if CommitMetadata.decode(info.metadata) is None:
            continue  # Icechunk's root snapshot predates the table
        ids = expected_at[info.id]
        view = repository.view(info.id)
        invariants.assert_items_exactly(view, ids, rows)
        invariants.assert_slices_exactly(view, "c", ids)
        invariants.assert_rows_have_their_arrays(view, rows)
        invariants.assert_no_slice_without_row(view, rows)

    tip = repository.view("main")
    # One stack held every writer's granules: they appended to it concurrently.
    (stack,) = tip.stacks("c")
    assert len(tip.slot_items(stack)) == sum(expected_ids.values())
    # The forced loser had taken slots the winner took too: every one of them moved past the winner's.
    landed = {row.id: {piece_stack: slot for piece_stack, _, slot in row.pieces or ()} for row in rows.at(tip)}
    unmoved = [item_id for item_id in forced["ids"] if landed[item_id] == forced["staged"][item_id]]
    assert not unmoved, f"the forced loser's slots did not move: {unmoved}"
    # Pixels read back equal to what was staged: the forced commit's items, and the first item of every commit.
    sampled = {*forced["ids"], *(commit["ids"][0] for commit in commits)}
    invariants.assert_item_arrays(tip, "c", {item_id: pixels_of(item_id) for item_id in sorted(sampled)})
    invariants.assert_committed_rows_readable(
        repository, {commit["snapshot_id"]: commit["ids"] for commit in commits}, "main", rows
    )

    assert "t0" in tags, "no tag was taken while the writers ran"
    for name, snapshot_id in tags.items():
        invariants.assert_tag_unchanged(repository, name, snapshot_id, expected_at[snapshot_id], rows)
    mid_run = expected_at[tags["t0"]]
    assert 0 < sum(mid_run.values()) < sum(expected_ids.values()), "tag t0 was not taken mid-run"


@pytest.mark.slow
def test_uncoordinated_writers_local(tmp_path):
    settings = Settings()
    root = str(tmp_path / "repo")
    Repository.create(root, settings)
    results, tags = run_writers(root, settings, meeting_in(tmp_path))
    verify(root, settings, results, tags)


@pytest.mark.slow
@pytest.mark.s3
def test_uncoordinated_writers_s3(s3_root, s3_settings, tmp_path):
    Repository.create(s3_root, s3_settings)
    results, tags = run_writers(s3_root, s3_settings, meeting_in(tmp_path))
    verify(s3_root, s3_settings, results, tags)


def meeting_in(directory: Path) -> Meeting:
    (directory / "meeting").mkdir()
    return Meeting(str(directory / "meeting"))


MIXED_WRITERS = 4
MIXED_COMMITS = 5


@pytest.mark.slow
@pytest.mark.s3
def test_mixed_writers_s3(s3_root, s3_settings, tmp_path):
    repository = Repository.create(s3_root, s3_settings)
    seed = seed_shared(repository)
    meeting = meeting_in(tmp_path)
    race = Race(meeting, loser=0, winner=1, at=2)
    context = multiprocessing.get_context("spawn")
    with context.Pool(MIXED_WRITERS) as pool:
        arguments = [
            (s3_root, s3_settings.model_dump(), worker, meeting, MIXED_WRITERS) for worker in range(MIXED_WRITERS)
        ]
        pending = [
            pool.apply_async(mixed_worker, argument, {"each": MIXED_COMMITS, "race": race}) for argument in arguments
        ]
        results = [result.get(timeout=600) for result in pending]

    forced = forced_loss(results)
    assert forced["rows_replaced"] == 1, f"the loser did not replace the winner's version of shared-01: {forced}"
    assert [len(worker) for worker in results] == [MIXED_COMMITS] * MIXED_WRITERS
    outcomes = verify_mixed(Repository.open(s3_root, s3_settings), seed, results)
    failed = {check: outcome for check, outcome in outcomes.items() if outcome.startswith("FAILED")}
    assert not failed, failed
