"""The items plan is a value: a rebase hands it the slot moves and gets a new plan; it calls nothing of the writer.

The commit loop (``ingest/repository/_commit.py``) applies a plan to each
attempt's base; when a lost race moved the writer's slices to other slots it
asks the plan for its successor (``ItemsPlan.rebased``) and commits that one.
What a forced race does to the committed rows is in ``test_slot_moves.py`` and
``test_writer.py``; these tests pin the plan's side of the hand-over.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ingest import Repository, Settings
from ingest.config import ArraysSettings
from ingest.repository._plan import ItemsPlan
from ingest.stac import read_arrays_asset
from tests.conftest import make_item, stage_raster

ORIGIN = (500_480.0, 4_200_320.0)


@pytest.fixture
def staged(tmp_path):
    """A writer with one granule staged (item "x", with arrays) and a metadata-only item "m"."""
    repository = Repository.create(tmp_path / "repo", Settings(arrays=ArraysSettings(tile=64, chunk=16)))
    writer = repository.writer()
    granule = stage_raster(writer, make_item("x"), np.full((1, 8, 8), 7, dtype=np.uint8), origin=ORIGIN)
    return repository, writer, granule, make_item("m")


def _plan(repository, items) -> ItemsPlan:
    """The plan a writer makes of ``items``, with the slices they name as the ones it staged."""
    staged = {
        (piece.stack, piece.slot) for item in items if (arrays := read_arrays_asset(item)) for piece in arrays.pieces()
    }
    return ItemsPlan.of(repository.io, repository.catalog, repository.manifests, items, message="batch", staged=staged)


def test_a_rebase_that_moved_slices_gives_a_new_plan_naming_the_new_slots(staged):
    repository, _, granule, plain = staged
    plan = _plan(repository, [granule, plain])
    (piece,) = read_arrays_asset(granule).pieces()
    assert plan.staged == {(piece.stack, piece.slot)}

    # Two looks at the tip, each moving the slice further (as rebase_following reports them).
    first, second = {(piece.stack, piece.slot): piece.slot + 3}, {(piece.stack, piece.slot + 3): piece.slot + 5}
    after = plan.rebased([first, second])

    assert after is not plan
    (moved,) = read_arrays_asset(after.items[0]).pieces()
    assert (moved.stack, moved.array, moved.slot) == (piece.stack, piece.array, piece.slot + 5)
    assert after.staged == {(piece.stack, piece.slot + 5)}
    assert after.moved == {("c", "x")}
    assert after.items[1] is plain, "an item without slices is carried over as it is"
    assert after.work is plan.work, "the successor re-uses what the plan wrote"
    # The plan handed in is a value: unchanged.
    assert read_arrays_asset(plan.items[0]).pieces()[0].slot == piece.slot
    assert plan.staged == {(piece.stack, piece.slot)} and plan.moved == frozenset()


def test_moves_of_other_slots_leave_the_plan_items_alone(staged):
    repository, _, granule, plain = staged
    plan = _plan(repository, [granule, plain])
    (piece,) = read_arrays_asset(granule).pieces()

    after = plan.rebased([{(piece.stack, piece.slot + 1): piece.slot + 9}])

    assert after.items == plan.items and after.items[0] is granule
    assert after.moved == frozenset()


def test_the_plan_holds_no_callback_into_the_writer(staged):
    repository, writer, granule, plain = staged
    plan = _plan(repository, [granule, plain])

    held = {field.name: getattr(plan, field.name) for field in dataclasses.fields(plan)}
    assert not [name for name, value in held.items() if callable(value)]
    assert not [name for name, value in held.items() if value is writer]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.items = ()  # type: ignore[misc]


def test_an_expectation_that_guards_no_change_is_refused_before_anything_is_written(staged):
    repository, _, _, plain = staged
    with pytest.raises(ValueError, match="guards no change"):
        ItemsPlan.of(
            repository.io, repository.catalog, repository.manifests, [plain], message="m", expected={("c", "m"): None}
        )
