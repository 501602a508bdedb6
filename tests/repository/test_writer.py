"""The writer's commit loop, driven deterministically: two writers from one base, replays, slots that move, refusals.

Rasters are 8x8 int16 granules staged as ``floe ingest`` stages them
(``tests.conftest.stage_raster``): granules of one collection at one origin
are slices of one tile stack, granules far apart are in different stacks.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import shapely
import zarr

from ingest import CommitConflict, ConflictRetriesExhausted, Repository, Settings, WriterClosed
from ingest.config import CommitSettings
from ingest.lifecycle import check
from ingest.stac import ARRAYS_ASSET, with_arrays_asset
from tests import invariants
from tests.conftest import make_item, stage_raster
from tests.repository._writers import pixels_of, replace_raster, staged_slots

HERE = (500000.0, 4200000.0)
FAR = (900000.0, 4200000.0)
"""Origins 400 km apart (a tile is 4096 pixels of 10 m): their granules are in different stacks of a collection."""


def data_files(repo: Repository) -> list[Path]:
    return sorted(Path(repo.location.url, "tables", "items", "data").rglob("*.parquet"))


def ids_at(repo: Repository, ref: str = "main") -> Counter[str]:
    return Counter(item["id"] for item in repo.view(ref).items())


def stage(writer, collection: str, ids: list[str], origin: tuple[float, float] = HERE, **properties) -> dict:
    """Stage each of ``ids`` with a raster of its own (:func:`pixels_of` its id) at ``origin``; returns the staged
    items by id."""
    staged = {}
    for item_id in ids:
        item = stage_raster(writer, make_item(item_id, collection, **properties), pixels_of(item_id), origin=origin)
        writer.add_item(item)
        staged[item_id] = item
    return staged


def seed_stacks(repo: Repository, *origins: tuple[float, float], collection: str = "c") -> None:
    """Commit one granule at each of ``origins`` (``seed-0``, ...), so their stacks exist before writers open."""
    writer = repo.writer()
    for number, origin in enumerate(origins):
        stage(writer, collection, [f"seed-{number}"], origin)
    writer.commit("seed the stacks")


def stack_of(item: dict) -> str:
    (stack,) = staged_slots(item)
    return stack


def test_second_writer_from_same_base_reconciles(repo):
    """Two writers appending to different stacks: the loser replays its table change, its data file as written."""
    seed_stacks(repo, HERE, FAR)
    first, second = repo.writer(), repo.writer()
    firsts = stage(first, "c", ["a1", "a2"], HERE)
    seconds = stage(second, "c", ["b1", "b2", "b3"], FAR)
    assert {stack_of(item) for item in firsts.values()}.isdisjoint(stack_of(item) for item in seconds.values())
    one = first.commit("first")
    two = second.commit("second")

    assert one.attempts == 1 and two.attempts == 2
    expected = Counter({"seed-0": 1, "seed-1": 1, "a1": 1, "a2": 1, "b1": 1, "b2": 1, "b3": 1})
    assert ids_at(repo) == expected
    tip = repo.view()
    invariants.assert_item_arrays(tip, "c", {item_id: pixels_of(item_id) for item_id in expected})
    # No slot moved (the stacks differ): the replay re-registered the files the second writer had already written.
    assert {item_id: staged_slots(item) for item_id, item in {**firsts, **seconds}.items()} == {
        item_id: staged_slots(tip.item("c", item_id)) for item_id in [*firsts, *seconds]
    }
    assert two.files_rewritten == 0 and two.files_written == 1
    assert len(data_files(repo)) == 3  # the seed's, and one per writer: the retry wrote none
    # The snapshot of the first commit still shows only its own rows.
    assert ids_at(repo, one.snapshot_id) == Counter({"seed-0": 1, "seed-1": 1, "a1": 1, "a2": 1})
    log = repo.log()
    assert [entry.message for entry in log[:2]] == ["second", "first"]
    assert log[0].attempts == 2 and log[0].rows_added == 3


@pytest.mark.parametrize("stack_exists", [True, False], ids=["seeded-stack", "new-stack"])
def test_two_writers_appending_to_one_stack_move_the_losers_slots(repo, stack_exists):
    """A and B, on one base, each stage a granule into the same stack, so both take the same slot. A commits;
    B loses, moves its slot past A's (the chunk references move, no pixel is rewritten), rewrites its row to
    name the new slot and lands. Without a seed, staging makes the stack in a commit of its own first."""
    if stack_exists:
        seed_stacks(repo, HERE)
    else:
        repo.ensure_groups(["c"])
    base = repo.resolve("main")
    a, b = repo.writer(), repo.writer()
    assert a.session.snapshot_id == b.session.snapshot_id == base
    staged_a = stage(a, "c", ["a"])["a"]
    staged_b = stage(b, "c", ["b"])["b"]
    stack = stack_of(staged_a)
    assert stack_of(staged_b) == stack
    assert staged_slots(staged_a) == staged_slots(staged_b), "the writers did not take the same slot"

    one = a.commit("A")
    two = b.commit("B")

    assert one.attempts == 1
    assert two.attempts == 2, "B did not lose its race to A"
    tip = repo.view()
    slot_a, slot_b = staged_slots(tip.item("c", "a"))[stack], staged_slots(tip.item("c", "b"))[stack]
    assert slot_a == staged_slots(staged_a)[stack]
    assert slot_b != slot_a and slot_b > slot_a, "B's slot did not move past A's"
    assert two.files_written == 2, "B's row did not follow its slot (its data file was not written again)"
    seeds = {0: "seed-0"} if stack_exists else {}
    assert tip.slot_items(stack) == {**seeds, slot_a: "a", slot_b: "b"}
    invariants.assert_item_arrays(tip, "c", {"a": pixels_of("a"), "b": pixels_of("b")})
    # A's own snapshot holds A's slice alone.
    assert repo.view(one.snapshot_id).slot_items(stack) == {**seeds, slot_a: "a"}
    assert check(repo, deep=True) == []


@pytest.mark.parametrize("loser_deletes", [False, True], ids=["appends", "appends-and-deletes"])
def test_a_slot_appended_and_deleted_again_meanwhile_is_no_conflict(repo, loser_deletes):
    """A and C take the same slot of one stack. A commits; a third commit deletes A's item, which frees that slot
    (the stack's last, so the tip's next free slot is it again). C must still land: its slot moves past every
    slot those commits touched (Icechunk's rebase replays both, and sees C's slice written over A's), never
    refused for a conflict no item has. With ``loser_deletes`` C also deletes the seed (the path that checks
    chunks both sides changed)."""
    seed_stacks(repo, HERE)
    a, c = repo.writer(), repo.writer()
    staged_a = stage(a, "c", ["a"])["a"]
    staged_c = stage(c, "c", ["c1"])["c1"]
    stack = stack_of(staged_a)
    assert staged_slots(staged_a) == staged_slots(staged_c), "the writers did not take the same slot"
    if loser_deletes:
        c.delete_item("c", "seed-0")
    a.commit("A")
    remover = repo.writer()
    remover.delete_item("c", "a")
    remover.commit("delete a")
    assert repo.view().slot_items(stack) == {0: "seed-0"}, "A's slot is not free at the tip"

    landed = c.commit("C")

    assert landed.attempts == 2
    tip = repo.view()
    expected = {"c1": pixels_of("c1")} if loser_deletes else {"seed-0": pixels_of("seed-0"), "c1": pixels_of("c1")}
    assert ids_at(repo) == Counter(list(expected))
    invariants.assert_item_arrays(tip, "c", expected)
    slot_c = staged_slots(tip.item("c", "c1"))[stack]
    assert slot_c > staged_slots(staged_a)[stack], "C's slice stayed on the slot A's commit wrote"
    assert tip.slot_items(stack) == ({} if loser_deletes else {0: "seed-0"}) | {slot_c: "c1"}
    assert check(repo, deep=True) == []


def test_concurrent_schema_unions_both_land(repo):
    first, second = repo.writer(), repo.writer()
    first.add_items([make_item(f"a{i}", "c", alpha=i) for i in range(3)])
    second.add_items([make_item(f"b{i}", "c", beta=f"value {i}") for i in range(3)])
    first.commit("adds alpha")
    result = second.commit("adds beta")
    assert result.attempts == 2

    view = repo.view()
    names = view.table.schema().column_names
    assert "alpha" in names and "beta" in names
    rows = {item["id"]: item["properties"] for item in view.items()}
    assert [rows[f"a{i}"]["alpha"] for i in range(3)] == [0, 1, 2]
    assert [rows[f"b{i}"]["beta"] for i in range(3)] == ["value 0", "value 1", "value 2"]
    assert "beta" not in rows["a0"] and "alpha" not in rows["b0"]


def test_concurrent_conflicting_types_are_kept_losslessly(repo):
    first, second = repo.writer(), repo.writer()
    first.add_items([make_item(f"a{i}", "c", gamma=i) for i in range(3)])
    second.add_items([make_item(f"b{i}", "c", gamma=f"text {i}") for i in range(3)])
    first.commit("gamma as integers")
    result = second.commit("gamma as text")

    assert result.attempts == 2
    assert result.files_rewritten == 1  # the one real conflict re-plans its file
    field = repo.view().table.schema().find_field("gamma")
    assert str(field.field_type) == "long"
    rows = {item["id"]: item["properties"]["gamma"] for item in repo.view().items()}
    assert rows == {"a0": 0, "a1": 1, "a2": 2, "b0": "text 0", "b1": "text 1", "b2": "text 2"}


def test_retries_exhausted_commits_nothing(tmp_path):
    settings = Settings(commit=CommitSettings(max_attempts=1))
    repo = Repository.create(tmp_path / "repo", settings)
    first, second = repo.writer(), repo.writer()
    first.add_item(make_item("a", "c"))
    second.add_item(make_item("b", "c"))
    first.commit("wins")
    with pytest.raises(ConflictRetriesExhausted, match="lost 1 races"):
        second.commit("loses")
    assert ids_at(repo) == Counter({"a": 1})
    with pytest.raises(WriterClosed):
        second.add_item(make_item("c", "c"))


@pytest.mark.parametrize("a_appends", [True, False], ids=["slots-moved", "nothing-moved"])
def test_a_commit_landing_while_a_loser_rebases_does_not_take_its_slots(s3_root, s3_settings, a_appends):
    """A, B and C on one base; B and C each stage a granule into the same stack (the same slot), A one too or a row
    alone. A commits. B loses, looks at the tip (A's) and moves its slot past A's if A took it; before B's rebase, C
    (which lost to A the same way) lands at that very slot. Icechunk rebases B onto C's tip, not A's.

    When nothing moved, B looks again and lands with its own slice. When B had moved its slot to the one C took,
    its staged slice is gone (the rebase kept C's): B is refused (its batch is planned again), never landed with
    C's pixels under its row.

    On S3: on local storage B holds the root's lock from its look to its rebase, so no commit can land there."""
    repo = Repository.create(s3_root, s3_settings)
    seed_stacks(repo, HERE)
    a, b, c = repo.writer(), repo.writer(), repo.writer()
    if a_appends:
        stage(a, "c", ["a"])
    else:
        a.add_item(make_item("a", "c"))
    stage(b, "c", ["b"])
    stage(c, "c", ["c"])
    a.commit("A")
    session = b.session
    rebase = session.rebase

    def c_lands_first(*args, **kwargs):
        session.rebase = rebase
        c.commit("C")
        return rebase(*args, **kwargs)

    session.rebase = c_lands_first  # the moment between B's look at the tip and its rebase
    if a_appends:
        with pytest.raises(CommitConflict, match="while this writer rebased"):
            b.commit("B")
    else:
        b.commit("B")
    assert session.rebase == rebase, "the race was not forced"
    tip = repo.view()
    landed = ["c", *(["a"] if a_appends else ["a", "b"])]
    assert ids_at(repo) == Counter({"seed-0": 1, **dict.fromkeys(landed, 1)})
    invariants.assert_rows_have_their_arrays(tip)
    invariants.assert_no_slice_without_row(tip)
    appended = ["c", *(["a"] if a_appends else ["b"])]
    invariants.assert_item_arrays(tip, "c", {item_id: pixels_of(item_id) for item_id in appended})
    assert check(repo, deep=True) == []


def test_two_writers_replacing_one_items_arrays_are_refused(repo):
    """Both writers replace the arrays of the same stored item (new slices, the old ones cleared): they changed
    the same slices, which is no race to follow but a real conflict. The loser is refused, never merged."""
    seed_stacks(repo, HERE)
    first = repo.writer()
    stored = stage(first, "c", ["x"])["x"]
    first.commit("x")
    (old,) = staged_slots(stored).items()
    first, second = repo.writer(), repo.writer()
    one_pixels, two_pixels = pixels_of("x-1"), pixels_of("x-2")
    first.add_item(replace_raster(first, make_item("x", "c"), one_pixels), replace=True)
    second.add_item(replace_raster(second, make_item("x", "c"), two_pixels), replace=True)
    landed = first.commit("first")
    with pytest.raises(CommitConflict) as refused:
        second.commit("second")
    stack, _slot = old
    assert any(path.strip("/").startswith(stack + "/") for path in refused.value.paths), refused.value.paths
    assert repo.resolve("main") == landed.snapshot_id, "a refused writer moved the branch"
    with pytest.raises(WriterClosed):
        second.add_item(make_item("y", "c"))

    tip = repo.view()
    assert ids_at(repo) == Counter({"seed-0": 1, "x": 1})
    invariants.assert_item_arrays(tip, "c", {"x": one_pixels, "seed-0": pixels_of("seed-0")})
    (new,) = staged_slots(tip.item("c", "x")).items()
    assert new != old
    assert tip.slot_items(stack) == {0: "seed-0", new[1]: "x"}, "the old slice was not cleared, or B's stayed"
    assert check(repo, deep=True) == []


def test_a_replacement_keeping_its_arrays_does_not_undo_a_concurrent_restage(repo):
    """B re-stages x's raster (new slice, the old one cleared) and commits; A, from the same base, replaced x's row
    keeping the stored arrays (only its metadata changed). A must not land a row naming the slice B cleared."""
    seed_stacks(repo, HERE)
    first = repo.writer()
    stage(first, "c", ["x"])
    first.commit("x")
    a, b = repo.writer(), repo.writer()
    stored = a.stored_items([("c", "x")])[("c", "x")]
    a.add_item(with_arrays_asset(make_item("x", "c", platform="renamed"), stored["assets"][ARRAYS_ASSET]), replace=True)
    b.add_item(replace_raster(b, make_item("x", "c"), pixels_of("x-2")), replace=True)
    b.commit("B")
    with pytest.raises(CommitConflict, match="keeps the arrays of the version that commit replaced"):
        a.commit("A")
    tip = repo.view()
    invariants.assert_rows_have_their_arrays(tip)
    invariants.assert_no_slice_without_row(tip)
    invariants.assert_item_arrays(tip, "c", {"x": pixels_of("x-2")})


def test_arrays_only_commit_keeps_the_table_version(repo):
    before = repo.view().metadata_location
    writer = repo.writer()
    writer.ensure_collection("c")
    zarr.create_array(writer.store, name="c/only-arrays", shape=(2,), dtype="uint8")[:] = 7
    result = writer.commit("arrays only")
    assert result.rows_added == 0
    assert repo.view().metadata_location == before
    assert (zarr.open_array(repo.view().session.store, path="c/only-arrays", mode="r")[:] == 7).all()


def test_collection_and_stack_are_created_once_for_concurrent_writers(repo):
    """Two writers stage into a collection and a stack neither exists yet: the first makes each in a commit of
    its own, the second finds them at the tip and carries on from there; both granules land in the one stack."""
    first, second = repo.writer(), repo.writer()
    firsts = stage(first, "new", ["a"])
    seconds = stage(second, "new", ["b"])  # finds /new and its stack created by the first writer's own commits
    first.commit("first")
    second.commit("second")
    tip = repo.view()
    (stack,) = tip.stacks("new")
    assert stack_of(firsts["a"]) == stack_of(seconds["b"]) == stack
    assert sorted(tip.slot_items(stack).values()) == ["a", "b"]
    invariants.assert_item_arrays(tip, "new", {"a": pixels_of("a"), "b": pixels_of("b")})
    creations = [entry.message for entry in repo.log() if entry.message.startswith("floe: create")]
    assert len(creations) == 2, creations  # the collection's group, then the stack and its array
    assert creations[-1] == "floe: create /new"
    assert check(repo, deep=True) == []


def test_table_metadata_stays_small_and_manifests_bounded(tmp_path):
    repo = Repository.create(tmp_path / "repo", Settings())
    locations = []
    for number in range(40):
        writer = repo.writer()
        writer.add_item(make_item(f"i{number}", "c"))
        locations.append(writer.commit(f"commit {number}").metadata_location)
    table = repo.view().table
    assert len(table.metadata.snapshots) <= repo.settings.commit.snapshot_log
    assert len(table.current_snapshot().manifests(repo.io)) <= 16
    assert sum(ids_at(repo).values()) == 40
    # Iceberg's own cleanup is off: every older table version is still there for older snapshots.
    assert table.metadata.properties["gc.enabled"] == "false"
    assert table.metadata.properties["write.metadata.delete-after-commit.enabled"] == "false"
    assert all(Path(location).exists() for location in locations)
    assert Counter(item["id"] for item in repo.view(repo.log()[-1 - 5].snapshot_id).items()) == Counter(
        f"i{n}" for n in range(5)
    )


def test_data_files_are_geoparquet(repo):
    writer = repo.writer()
    writer.add_items([make_item(f"i{n}", "c") for n in range(5)])
    writer.commit("geoparquet")
    (path,) = data_files(repo)
    metadata = pq.read_metadata(path).metadata
    geo = json.loads(metadata[b"geo"])
    assert geo["primary_column"] == "geometry" and geo["columns"]["geometry"]["encoding"] == "WKB"
    assert b"stac-geoparquet" in metadata
    assert "collection=c" in str(path) and "datetime_month=2024-01" in str(path)
    table = pq.read_table(path)
    points = shapely.from_wkb(table.column("geometry").to_pylist())
    assert np.all(shapely.get_type_id(points) == 0)


def test_only_repeating_strings_get_a_parquet_dictionary(repo):
    writer = repo.writer()
    writer.add_items([make_item(f"i{n}", "c", platform="sentinel-2a", note=f"unique {n}") for n in range(64)])
    writer.commit("encodings")
    (path,) = data_files(repo)
    group = pq.read_metadata(path).row_group(0)
    columns = [group.column(index) for index in range(group.num_columns)]
    encodings = {column.path_in_schema: column.encodings for column in columns}
    repeating = ["collection", "platform", "type", "assets.data.type"]
    unique = ["id", "note", "assets.data.href", "geometry"]
    assert all("RLE_DICTIONARY" in encodings[path] for path in repeating), encodings
    assert not any("RLE_DICTIONARY" in encodings[path] for path in unique), encodings
    notes = sorted(item["properties"]["note"] for item in repo.view().items())
    assert notes == sorted(f"unique {n}" for n in range(64))


def test_partition_pruning_uses_collection_and_month(repo):
    writer = repo.writer()
    writer.add_items([make_item(f"a{n}", "c1", when="2024-01-05T00:00:00Z") for n in range(3)])
    writer.add_items([make_item(f"b{n}", "c2", when="2024-03-05T00:00:00Z") for n in range(3)])
    writer.commit("two partitions")
    table = repo.view().table
    assert len(list(table.scan().plan_files())) == 2
    planned = list(table.scan(row_filter="collection == 'c2'").plan_files())
    assert len(planned) == 1 and "collection=c2" in planned[0].file.file_path
    by_time = list(table.scan(row_filter="datetime >= '2024-02-01T00:00:00+00:00'").plan_files())
    assert len(by_time) == 1 and "datetime_month=2024-03" in by_time[0].file.file_path


def test_schema_history_is_trimmed_with_the_snapshot_log(repo):
    for number in range(12):
        writer = repo.writer()
        writer.add_item(make_item(f"i{number}", "c", **{f"prop{number}": number}))
        writer.commit(f"adds prop{number}")
    table = repo.view().table
    assert len(table.metadata.schemas) <= repo.settings.commit.snapshot_log + 1
    assert all(f"prop{n}" in table.schema().column_names for n in range(12))
    rows = {item["id"]: item["properties"] for item in repo.view().items()}
    assert all(rows[f"i{n}"][f"prop{n}"] == n for n in range(12))


def test_pystac_items_are_accepted(repo):
    import pystac

    item = pystac.Item.from_dict(make_item("from-pystac", "c", platform="sentinel-2a"))
    writer = repo.writer()
    writer.add_item(item)
    writer.commit("pystac")
    (stored,) = list(repo.view().items())
    assert stored["id"] == "from-pystac" and stored["collection"] == "c"
    assert stored["properties"]["platform"] == "sentinel-2a"
    assert stored["geometry"] == item.geometry


@pytest.mark.slow
def test_manifest_merging_is_tiered_so_history_metadata_grows_near_linearly(tmp_path):
    """Merging every small manifest into one growing manifest rewrites the whole file list every few commits."""
    repo = Repository.create(tmp_path / "repo", Settings())
    commits = 160
    for number in range(commits):
        writer = repo.writer()
        writer.add_item(make_item(f"i{number}", "c"))
        writer.commit(f"commit {number}")
    manifests: dict[str, int] = {}
    for entry in repo.log():
        snapshot = repo.catalog.load_at(entry.metadata_location).current_snapshot()
        for manifest in snapshot.manifests(repo.io) if snapshot else []:
            manifests[manifest.manifest_path] = (manifest.added_files_count or 0) + (manifest.existing_files_count or 0)
    # Tiers of 16: each file is written once per tier it passes through (2 here); one growing manifest would
    # have written about commits**2 / 32 = 800 entries on top of the 160.
    assert sum(manifests.values()) <= 3 * commits
    tip = repo.view().table.current_snapshot().manifests(repo.io)
    assert len(tip) <= 2 * 15 + 1
    assert sum(ids_at(repo).values()) == commits


def test_a_committed_writer_is_freed_without_the_cyclic_collector(repo):
    """An ingest pauses Python's cyclic collector; a batch's writer (and its items) must go as soon as it is dropped."""
    import gc
    import weakref

    for replace in (False, True):  # a first commit, and one that plans replacements and slices
        writer = repo.writer()
        item = make_item("freed", when="2024-03-01T00:00:00Z")
        writer.add_item(item, replace=replace)
        stage_raster(writer, item, np.ones((1, 8, 8), dtype=np.uint8))
        writer.commit("freed")
        gone = weakref.ref(writer)
        gc.disable()
        try:
            del writer
            assert gone() is None, [type(holder).__name__ for holder in gc.get_referrers(gone())]
        finally:
            gc.enable()
