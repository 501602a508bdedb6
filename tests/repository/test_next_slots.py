"""A stack's next free slot is remembered from commit to commit, not listed again (``NextSlots``).

Listing every slot of a stack grows with the stack (issue 52, flat history): a process that commits granule
after granule into one stack lists it once, then knows each new snapshot's next slot from its own commit. A
commit that may have freed the last slot (a deletion) leaves the next writer to list again; one that cleared
slices below its own new ones (a re-stage) does not. What is remembered must always be what a listing finds.
"""

from __future__ import annotations

import numpy as np
import pytest

import ingest.repository._slots as slots_module
from ingest import Repository, Settings
from ingest.config import ArraysSettings
from ingest.repository._slots import next_free_slot
from ingest.stac import read_arrays_asset
from tests.conftest import make_item, stage_raster
from tests.repository._writers import replace_raster

ORIGIN = (500_480.0, 4_200_320.0)  # one 64-px tile: every granule goes to the same stack


@pytest.fixture
def listings(monkeypatch):
    """The stacks listed by ``next_free_slot`` from now on, in order."""
    listed: list[str] = []
    original = slots_module.next_free_slot

    def counting(session, stack):
        listed.append(stack)
        return original(session, stack)

    monkeypatch.setattr(slots_module, "next_free_slot", counting)
    return listed


def commit_granule(repository: Repository, item_id: str, value: int, *, restage: bool = False) -> int:
    """Commit item ``item_id`` with an 8 x 8 granule of ``value`` (to :func:`stack`); returns its slice's slot.
    With ``restage``, the item has arrays already: its old slices are cleared in the same commit."""
    writer = repository.writer()
    pixels = np.full((1, 8, 8), value, dtype=np.uint8)
    if restage:
        item = replace_raster(writer, make_item(item_id), pixels, origin=ORIGIN)
    else:
        item = stage_raster(writer, make_item(item_id), pixels, origin=ORIGIN)
    writer.add_item(item, replace=True)
    writer.commit(f"{item_id} = {value}")
    piece = read_arrays_asset(item).pixels["data"].pieces[0]
    assert piece.stack == stack(repository)
    return piece.slot


def stack(repository: Repository) -> str:
    """The one stack of the tests' granules (all at :data:`ORIGIN`)."""
    (found,) = repository.view().stacks("c")
    return found


def listed_at_tip(repository: Repository) -> int:
    tip = repository.icechunk.lookup_branch("main")
    return next_free_slot(repository.icechunk.readonly_session(snapshot_id=tip), stack(repository))


def test_granules_committed_one_after_another_list_their_stack_once(tmp_path, listings):
    repository = Repository.create(tmp_path / "repo", Settings(arrays=ArraysSettings(tile=64, chunk=16)))
    taken = [commit_granule(repository, f"g{number}", number) for number in range(6)]
    assert taken == [0, 1, 2, 3, 4, 5]
    # The first writer made the stack (a commit of its own) and listed it there, empty; no one listed it again.
    assert listings == [stack(repository)], listings
    assert (
        repository.next_slots.get(repository.icechunk.lookup_branch("main"), stack(repository))
        == 6
        == listed_at_tip(repository)
    )

    # Another process (a repository opened anew) knows nothing yet: it lists, and takes the same next slot.
    again = Repository.open(tmp_path / "repo")
    listings.clear()
    assert commit_granule(again, "g6", 6) == 6
    assert listings == [stack(repository)]


def test_a_restaged_granule_keeps_the_next_slot_known(tmp_path, listings):
    repository = Repository.create(tmp_path / "repo", Settings(arrays=ArraysSettings(tile=64, chunk=16)))
    for number in range(3):
        commit_granule(repository, f"g{number}", number)
    listings.clear()
    # g1's new pixels go to slot 3; its old slice at slot 1 is cleared, below the new one: still known. The same
    # for g2, whose old slice was the stack's last.
    assert commit_granule(repository, "g1", 10, restage=True) == 3
    assert commit_granule(repository, "g2", 20, restage=True) == 4
    assert commit_granule(repository, "g3", 3) == 5
    assert listings == []
    assert listed_at_tip(repository) == 6
    assert repository.view().slot_items(stack(repository)) == {0: "g0", 3: "g1", 4: "g2", 5: "g3"}


def test_a_deletion_of_the_last_slice_makes_the_next_writer_list_and_reuse_its_slot(tmp_path, listings):
    repository = Repository.create(tmp_path / "repo", Settings(arrays=ArraysSettings(tile=64, chunk=16)))
    for number in range(3):
        commit_granule(repository, f"g{number}", number)
    remover = repository.writer()
    remover.delete_item("c", "g2")
    remover.commit("delete g2, the stack's last slice")
    listings.clear()
    # Remembering slot 3 would leave slot 2 empty for good; a listing finds it free.
    assert commit_granule(repository, "g3", 3) == 2
    assert listings == [stack(repository)]
    assert listed_at_tip(repository) == 3


def test_a_writer_that_lost_a_race_leaves_a_next_slot_a_listing_agrees_with(tmp_path):
    repository = Repository.create(tmp_path / "repo", Settings(arrays=ArraysSettings(tile=64, chunk=16)))
    commit_granule(repository, "g0", 0)
    loser, winner = repository.writer(), repository.writer()
    for writer, item_id in ((loser, "late"), (winner, "early")):
        writer.add_item(stage_raster(writer, make_item(item_id), np.full((1, 8, 8), 7, dtype=np.uint8), origin=ORIGIN))
    winner.commit("early takes slot 1")
    landed = loser.commit("late moves past it")
    assert landed.attempts == 2
    known = repository.next_slots.known()
    assert known, "nothing remembered"
    for snapshot_id, stack, slot in known:
        assert slot == next_free_slot(repository.icechunk.readonly_session(snapshot_id=snapshot_id), stack)
    assert commit_granule(repository, "g3", 3) == 3 == listed_at_tip(repository) - 1
