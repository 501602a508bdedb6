"""Deleting items (``Writer.delete_item``): rows and slices leave in one commit, and races end serializable.

Each race is forced: two writers open at the same base, one commits, then the
other, so the loser always meets the winner's version. Whatever the order,
the tip must be what one commit after the other gives: never two rows of an
item, never a row without its slices or a slice without its row, and never a
deleted item brought back with slices the deletion cleared.
"""

from __future__ import annotations

import multiprocessing
from collections import Counter

import pytest

from ingest import CommitConflict, InvalidItem, Repository, Settings
from ingest.lifecycle import check
from ingest.stac import ARRAYS_ASSET, with_arrays_asset
from tests import invariants
from tests.conftest import make_item
from tests.repository._racing_changes import change_worker, plan_round, seed_round, serial_outcome
from tests.repository._writers import STUCK_AFTER, Meeting, Race, pixels_of, replace_raster, staged_slots
from tests.repository.test_writer import HERE, ids_at, seed_stacks, stage


def _seed(repo: Repository, ids: list[str]) -> None:
    seed_stacks(repo, HERE)
    writer = repo.writer()
    stage(writer, "c", ids)
    writer.commit("the items")


def _assert_consistent(repo: Repository) -> None:
    tip = repo.view()
    invariants.assert_no_item_twice(tip)
    invariants.assert_rows_have_their_arrays(tip)
    invariants.assert_no_slice_without_row(tip)
    assert check(repo, deep=True) == []


def test_a_deletion_takes_rows_and_slices_in_one_commit_and_tags_keep_them(repo):
    _seed(repo, ["x", "y", "z"])
    repo.tag("before")
    stack = next(iter(staged_slots(repo.view().item("c", "x"))))
    writer = repo.writer()
    writer.delete_item("c", "x")
    writer.delete_item("c", "y")
    writer.delete_item("c", "never-was")
    result = writer.commit("withdraw x and y")

    assert (result.rows_deleted, result.slices_deleted, result.rows_added, result.rows_replaced) == (2, 2, 0, 0)
    assert result.not_found == (("c", "never-was"),)
    assert ids_at(repo) == Counter({"seed-0": 1, "z": 1})
    assert set(repo.view().slot_items(stack).values()) == {"seed-0", "z"}, "a deleted item's slice stayed"
    assert repo.log(limit=1)[0].rows_deleted == 2
    _assert_consistent(repo)
    # The tag still holds both items, rows and pixels.
    before = repo.view("before")
    assert ids_at(repo, "before") == Counter({"seed-0": 1, "x": 1, "y": 1, "z": 1})
    invariants.assert_item_arrays(before, "c", {key: pixels_of(key) for key in ("x", "y", "z")})


def test_a_batch_cannot_add_and_delete_one_item(repo):
    writer = repo.writer()
    writer.add_item(make_item("x", "c"))
    with pytest.raises(InvalidItem, match="adds the same item"):
        writer.delete_item("c", "x")
    writer = repo.writer()
    writer.delete_item("c", "y")
    with pytest.raises(InvalidItem, match="deletes the same item"):
        writer.add_item(make_item("y", "c"))


@pytest.mark.parametrize("deleter_first", [True, False], ids=["deleter-wins", "restager-wins"])
def test_a_deletion_racing_a_restage_of_the_same_item_ends_serializable(repo, deleter_first):
    """The re-stager writes new slices for x and clears the old ones; the deleter deletes x. Deleter first: the
    re-stager's change depends on slices the deletion cleared and is refused. Re-stager first: the deletion
    re-plans on its version and deletes that one, slices included."""
    _seed(repo, ["x", "y"])
    deleter, restager = repo.writer(), repo.writer()
    deleter.delete_item("c", "x")
    restager.add_item(replace_raster(restager, make_item("x", "c"), pixels_of("x-2")), replace=True)
    first, second = (deleter, restager) if deleter_first else (restager, deleter)
    first.commit("first")
    if deleter_first:
        with pytest.raises(CommitConflict):
            second.commit("second")
    else:
        result = second.commit("second")
        assert result.attempts == 2 and result.rows_deleted == 1 and result.not_found == ()
    assert ids_at(repo) == Counter({"seed-0": 1, "y": 1}), "x is back, or y went"
    invariants.assert_item_arrays(repo.view(), "c", {"y": pixels_of("y")})
    _assert_consistent(repo)


@pytest.mark.parametrize("deleter_first", [True, False], ids=["deleter-wins", "replacer-wins"])
def test_a_deletion_racing_a_metadata_replacement_ends_serializable(repo, deleter_first):
    """The replacer changes x's properties and keeps its stored slices. If the deletion landed first, those
    slices are gone: the replacement is refused, never landed as a row without arrays."""
    _seed(repo, ["x"])
    deleter, replacer = repo.writer(), repo.writer()
    stored = replacer.stored_items([("c", "x")])[("c", "x")]
    renamed = with_arrays_asset(make_item("x", "c", platform="renamed"), stored["assets"][ARRAYS_ASSET])
    replacer.add_item(renamed, replace=True)
    deleter.delete_item("c", "x")
    if deleter_first:
        deleter.commit("delete x")
        with pytest.raises(CommitConflict, match="was deleted by a commit made meanwhile"):
            replacer.commit("rename x")
    else:
        replacer.commit("rename x")
        assert deleter.commit("delete x").rows_deleted == 1
    assert ids_at(repo) == Counter({"seed-0": 1})
    _assert_consistent(repo)


def test_two_deletions_of_one_item_both_land_and_the_second_finds_nothing(repo):
    _seed(repo, ["x", "y"])
    one, two = repo.writer(), repo.writer()
    one.delete_item("c", "x")
    two.delete_item("c", "x")
    two.delete_item("c", "y")
    assert one.commit("one").rows_deleted == 1
    result = two.commit("two")
    assert (result.rows_deleted, result.not_found, result.attempts) == (1, (("c", "x"),), 2)
    assert ids_at(repo) == Counter({"seed-0": 1})
    _assert_consistent(repo)


def test_a_deletion_racing_appends_to_the_same_stack_both_land(repo):
    _seed(repo, ["x"])
    deleter, appender = repo.writer(), repo.writer()
    deleter.delete_item("c", "x")
    stage(appender, "c", ["a", "b"])
    for first, second in ((appender, deleter),):
        first.commit("first")
        second.commit("second")
    assert ids_at(repo) == Counter({"seed-0": 1, "a": 1, "b": 1})
    invariants.assert_item_arrays(repo.view(), "c", {key: pixels_of(key) for key in ("seed-0", "a", "b")})
    _assert_consistent(repo)


def test_a_conditional_deletion_holds_only_for_the_version_it_read(repo):
    """A deletion chosen by a filter (``if_unchanged``) deletes the row it read, even after a compaction moved
    it to another file; a row another writer changed meanwhile is refused, not deleted blindly."""
    _seed(repo, ["x", "y"])
    deleter = repo.writer()
    deleter.stored_items([("c", "x"), ("c", "y")])
    deleter.delete_item("c", "x", if_unchanged=True)
    deleter.delete_item("c", "y", if_unchanged=True)
    renamer = repo.writer()
    stored = renamer.stored_items([("c", "x")])[("c", "x")]
    renamer.add_item(
        with_arrays_asset(make_item("x", "c", platform="renamed"), stored["assets"][ARRAYS_ASSET]), replace=True
    )
    renamer.commit("rename x")
    with pytest.raises(CommitConflict, match="was changed by a commit made meanwhile, and this change was made for"):
        deleter.commit("delete x and y")
    assert ids_at(repo) == Counter({"seed-0": 1, "x": 1, "y": 1}), "the refused deletion deleted something"

    again = repo.writer()
    again.stored_items([("c", "y")])
    again.delete_item("c", "y", if_unchanged=True)
    repo.optimize()  # y's row moves to a compacted file, unchanged
    assert again.commit("delete y").rows_deleted == 1
    assert ids_at(repo) == Counter({"seed-0": 1, "x": 1})
    _assert_consistent(repo)


def test_a_creation_expecting_no_item_is_refused_when_another_writer_creates_it_first(repo):
    """``expect(..., None)`` (a POST): two writers creating one item never leave two rows or a silent overwrite."""
    first, second = repo.writer(), repo.writer()
    for writer, platform in ((first, "first"), (second, "second")):
        writer.add_item(make_item("new", "c", platform=platform), replace=True)
        writer.expect("c", "new", None)
    first.commit("first creates it")
    with pytest.raises(CommitConflict, match="was created by a commit made meanwhile"):
        second.commit("second creates it too")
    assert [item["properties"]["platform"] for item in repo.view().items()] == ["first"]


PROCESS_ROUNDS = 8
"""Rounds of :func:`test_a_deleter_racing_in_another_process_ends_as_one_serial_order`: each pairing (replace,
append) with each side losing, twice, on ids drawn anew each round."""


@pytest.mark.slow
def test_a_deleter_racing_in_another_process_ends_as_one_serial_order(tmp_path, settings: Settings):
    """A deleter and a replacer (or an appender) of the same items, in two spawned processes, many times over.

    Each race is forced (the loser's first compare-and-swap fails for certain), and after each round the tip is
    exactly what the two commits give one after the other in the order ``floe log`` shows: the rows, each once,
    their properties and pixels, no row without slices or slice without a row, and ``floe check --deep`` clean.
    """
    context = multiprocessing.get_context("spawn")
    with context.Pool(2) as pool:
        for number in range(PROCESS_ROUNDS):
            plan = plan_round(number)
            root = str(tmp_path / f"round-{number}")
            repository = Repository.create(root, settings)
            seed_round(repository)
            (tmp_path / f"meeting-{number}").mkdir()
            loser, winner = (0, 1) if plan.deleter_loses else (1, 0)
            race = Race(Meeting(str(tmp_path / f"meeting-{number}")), loser=loser, winner=winner)
            pending = [
                pool.apply_async(change_worker, (root, settings.model_dump(), worker, race.meeting, race, number))
                for worker in (0, 1)
            ]
            deleter, rival = (result.get(timeout=STUCK_AFTER) for result in pending)
            context_line = f"round {number} ({plan})"

            # The race happened as forced, and the log shows the winner first.
            reports = {0: deleter, 1: rival}
            # The loser either rebased (a second attempt) or was refused and planned again on the winner's tip.
            retried = reports[loser]["attempts"] > 1 or reports[loser]["replans"] > 0
            assert reports[loser]["lost"] and retried, f"{context_line}: no race was lost"
            assert reports[winner]["attempts"] == 1 and not reports[winner]["lost"], context_line
            order = [reports[winner]["operation"], reports[loser]["operation"]]
            logged = [entry.message for entry in reversed(repository.log("main", limit=2))]
            assert logged == [plan.message(operation) for operation in order], context_line

            # The deleter found what the serial order had before it, and only that.
            before = serial_outcome(plan, order[: order.index("delete")])
            missing = sorted(item_id for item_id in plan.deleted if item_id not in before)
            assert deleter["not_found"] == missing, context_line
            assert deleter["rows_deleted"] == len(plan.deleted) - len(missing), context_line
            # A re-stage of slices the winning deletion cleared is refused once, then planned again.
            refused = plan.rival == "replace" and not plan.deleter_loses
            assert rival["replans"] == int(refused), context_line

            expected = serial_outcome(plan, order)
            tip = repository.view()
            assert ids_at(repository) == Counter(expected.keys()), context_line
            versions = {item["id"]: item["properties"]["version"] for item in tip.items()}
            assert versions == {key: 2 if pixels.endswith("-v2") else 1 for key, pixels in expected.items()}
            invariants.assert_item_arrays(tip, "c", {key: pixels_of(pixels) for key, pixels in expected.items()})
            _assert_consistent(repository)
