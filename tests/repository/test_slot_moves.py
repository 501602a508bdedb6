"""A slice a losing writer moves leaves its old slot: the case no other writer wrote that slot.

A writer moves its slots past the winner's when it loses a race
(``ingest/repository/_slots.py``). Usually the winner wrote the same slots,
and the rebase keeps the winner's chunks there. But a writer that opened
after a deletion freed a stack's last slot takes that slot again, while a
writer that opened before appends after it: when the first loses, nobody
else wrote its old slot. The move must clear it (found by the stateful test
with ``--hypothesis-seed=120740119197928800210400505068232876899``: the item
was in the stack twice).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ingest import Repository, Settings
from ingest.config import ArraysSettings
from ingest.stac import read_arrays_asset
from tests.conftest import make_item, stage_raster
from tests.invariants import assert_slices_exactly

ORIGIN = (500_480.0, 4_200_320.0)  # one 64-px tile


def test_a_slice_moved_off_a_slot_a_deletion_freed_leaves_it(tmp_path):
    repository = Repository.create(tmp_path / "repo", Settings(arrays=ArraysSettings(tile=64, chunk=16)))
    seed = repository.writer()
    seed.add_item(stage_raster(seed, make_item("a"), np.full((1, 8, 8), 1, dtype=np.uint8), origin=ORIGIN))
    seed.commit("a at slot 0")

    early = repository.writer()  # opens with slot 0 taken: its slice goes to slot 1
    early.add_item(stage_raster(early, make_item("x"), np.full((1, 8, 8), 2, dtype=np.uint8), origin=ORIGIN))
    remover = repository.writer()
    remover.delete_item("c", "a")
    remover.commit("delete a: slot 0, the stack's last, is free again")
    late = repository.writer()  # opens with the stack empty: its slice goes to slot 0
    y = stage_raster(late, make_item("y"), np.full((1, 8, 8), 3, dtype=np.uint8), origin=ORIGIN)
    late.add_item(y)
    assert read_arrays_asset(y).pixels["data"].pieces[0].slot == 0
    early.commit("x at slot 1")
    late.commit("y, moved past slot 1")  # loses the race: y moves to slot 2; nobody else wrote slot 0

    view = repository.view()
    assert_slices_exactly(view, "c", Counter({"x": 1, "y": 1}))
    np.testing.assert_array_equal(view.item_arrays("c", "y").data.values, np.full((1, 8, 8), 3, dtype=np.uint8))
    np.testing.assert_array_equal(view.item_arrays("c", "x").data.values, np.full((1, 8, 8), 2, dtype=np.uint8))
