"""SeenKeys: the keys an ingest run has read, outside Python's heap (de-duplication and --prune)."""

from __future__ import annotations

import gc

import numpy as np

from ingest.pipeline import _seen
from ingest.pipeline._seen import SeenKeys


def _chunk(start: int, count: int, collection: str = "c") -> tuple[list[tuple[str, str]], list[str]]:
    keys = [(collection, f"item-{index}") for index in range(start, start + count)]
    return keys, [f"items.ndjson:{index + 1}" for index in range(start, start + count)]


def test_repeats_name_where_the_key_was_first_read_across_and_within_chunks():
    seen = SeenKeys()
    for start in range(0, 5_000, 250):  # twenty chunks: runs are merged many times over
        assert seen.add_new(*_chunk(start, 250)) == [None] * 250
    assert len(seen) == 5_000

    keys = [("c", "item-17"), ("c", "new-a"), ("other", "item-17"), ("c", "new-a"), ("c", "item-4999")]
    sources = ["b.json", "b.json#2", "b.json#3", "b.json#4", "https://h/x.ndjson:9"]
    assert seen.add_new(keys, sources) == ["items.ndjson:18", None, None, "b.json#2", "items.ndjson:5000"]
    assert len(seen) == 5_002
    assert seen.collections == {"c", "other"}
    assert seen.contains(
        [("c", "item-0"), ("c", "item-5000"), ("other", "item-17"), ("other", "item-18")]
    ).tolist() == [
        True,
        False,
        True,
        False,
    ]
    assert ("c", "new-a") in seen and ("c", "new-b") not in seen
    # Labels without a line number come back whole.
    assert seen.add_new([("c", "solo")], ["s3://bucket/items/solo.json"]) == [None]
    assert seen.add_new([("c", "solo")], ["elsewhere"]) == ["s3://bucket/items/solo.json"]


def test_keys_sharing_a_first_hash_stay_apart(monkeypatch):
    real = _seen._digests

    def colliding(keys):
        first, second = real(keys)
        return np.zeros_like(first), second  # every key's first hash is the same

    monkeypatch.setattr(_seen, "_digests", colliding)
    seen = SeenKeys()
    assert seen.add_new(*_chunk(0, 40)) == [None] * 40
    assert seen.add_new(*_chunk(40, 40)) == [None] * 40
    assert seen.add_new([("c", "item-3"), ("c", "x"), ("c", "x")], ["a", "b", "c"]) == ["items.ndjson:4", None, "b"]
    assert seen.contains([("c", "item-79"), ("c", "item-80")]).tolist() == [True, False]


def test_the_keys_are_not_objects_the_cyclic_collector_walks():
    seen = SeenKeys()
    before = len(gc.get_objects())
    for start in range(0, 100_000, 5_000):
        seen.add_new(*_chunk(start, 5_000))
    # A dict of (collection, id) tuples would add a tracked object per key; the numpy runs add a handful.
    assert len(gc.get_objects()) - before < 1_000
    assert len(seen) == 100_000


def test_a_files_rows_share_one_label_prefix_whether_numbered_or_named():
    seen = SeenKeys()
    keys = [("c", f"row-{index}") for index in range(6)]
    numbers = np.arange(10, 16)
    assert seen.add_new_numbered(keys[:3], "a.parquet#row", numbers[:3]) == [None] * 3
    # Rows made into items are labelled file#rowN: the same prefix, not one string per row.
    assert seen.add_new(keys[3:], [f"a.parquet#row{number}" for number in numbers[3:]]) == [None] * 3
    assert seen._prefixes == ["a.parquet#row"]
    assert seen.add_new_numbered([("c", "row-4"), ("c", "new"), ("c", "new")], "b.parquet#row", np.arange(3)) == [
        "a.parquet#row14",
        None,
        "b.parquet#row1",
    ]
