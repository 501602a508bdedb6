"""The stack layout itself (array layout 2): lattices, tiles, fill chunks, array names, fixed stacks, node counts.

Planning is tested on its own (``plan_granule`` needs no store); everything
else goes through a real Writer and commit (``tests.conftest.stage_raster``
stages as ingest does) and is read back through ``View``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import MemoryStore

from ingest import Repository, Settings
from ingest.config import ArraysSettings
from ingest.pipeline import stage_arrays
from ingest.rasters import Grid, Kind, Lattice, array_name, plan_granule, write_slices
from ingest.rasters._slices import _DATETIME_META, _ITEM_META, slot_coordinate_chunks
from ingest.stac import DATETIME, ITEM, STACKS, arrays_asset, read_arrays_asset, with_arrays_asset
from tests.conftest import make_item, raster_dataset, stage_raster

ORIGIN = (500_000.0, 4_200_000.0)


def grid_at(origin: tuple[float, float], *, res: float = 10.0, size: int = 8, crs: str = "EPSG:32633") -> Grid:
    return Grid.of(raster_dataset(np.zeros((1, size, size), dtype=np.uint8), crs=crs, origin=origin, res=res))


def small_repo(tmp_path: Path, name: str = "repo", **arrays) -> Repository:
    return Repository.create(tmp_path / name, Settings(arrays=ArraysSettings(**{"tile": 64, "chunk": 16, **arrays})))


def commit_granules(repository: Repository, granules: list[tuple[str, np.ndarray, dict]], **item) -> list[dict]:
    """Stage (item id, pixels, where) granules in one writer and commit them; returns the items as staged."""
    writer = repository.writer()
    staged = []
    for item_id, pixels, where in granules:
        staged.append(stage_raster(writer, make_item(item_id, **item.get(item_id, {})), pixels, **where))
        writer.add_item(staged[-1])
    writer.commit(f"{len(granules)} granules")
    return staged


def chunk_count(session, path: str) -> int:
    async def count() -> int:
        return len([coordinates async for coordinates in session.chunk_coordinates(f"/{path}")])

    return sync(count())


# -- lattices -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("noise", [1e-9, -1e-9, 3e-7, -3e-7])
def test_origins_off_by_float_noise_are_on_one_lattice(noise):
    exact = grid_at(ORIGIN)
    noisy = grid_at((ORIGIN[0] + noise, ORIGIN[1] - noise))
    assert exact.transform != noisy.transform
    assert Lattice.of(noisy) == Lattice.of(exact) and Lattice.of(noisy).name == Lattice.of(exact).name
    assert Lattice.of(noisy).index(noisy) == Lattice.of(exact).index(exact)
    # Whole pixels away is the same lattice too, one pixel further along.
    shifted = grid_at((ORIGIN[0] + 30.0 + noise, ORIGIN[1] - 20.0))
    row, column = Lattice.of(exact).index(exact)
    assert Lattice.of(shifted) == Lattice.of(exact)
    assert Lattice.of(shifted).index(shifted) == (row + 2, column + 3)


@pytest.mark.parametrize(
    "other",
    [
        {"origin": (ORIGIN[0] + 5.0, ORIGIN[1]), "res": 10.0},  # half a pixel off: another alignment
        {"origin": (ORIGIN[0], ORIGIN[1] - 2.5), "res": 10.0},
        {"origin": ORIGIN, "res": 20.0},  # another pixel size
        {"origin": ORIGIN, "res": 10.0, "crs": "EPSG:32634"},  # another CRS
    ],
)
def test_other_pixel_sizes_alignments_or_crs_are_other_lattices(other):
    assert Lattice.of(grid_at(**other)) != Lattice.of(grid_at(ORIGIN))
    assert Lattice.of(grid_at(**other)).name != Lattice.of(grid_at(ORIGIN)).name


def test_granules_off_by_float_noise_share_one_stack_through_the_writer(tmp_path):
    repository = small_repo(tmp_path)
    rng = np.random.default_rng(1)
    first, second = (rng.integers(1, 200, (1, 10, 10), dtype=np.uint8) for _ in range(2))
    staged = commit_granules(
        repository,
        [("exact", first, {"origin": ORIGIN}), ("noisy", second, {"origin": (ORIGIN[0] + 1e-9, ORIGIN[1] + 1e-9)})],
    )
    view = repository.view()
    (stack,) = view.stacks("c")
    assert sorted(view.slot_items(stack).values()) == ["exact", "noisy"]
    windows = [read_arrays_asset(item).pixels["data"].pieces[0].window for item in staged]
    assert windows[0] == windows[1]
    np.testing.assert_array_equal(view.item_arrays("c", "exact").data.values, first)
    np.testing.assert_array_equal(view.item_arrays("c", "noisy").data.values, second)


# -- tiles ------------------------------------------------------------------------------------------------


def test_a_granule_across_a_tile_corner_is_four_pieces_that_tile_it_exactly(tmp_path):
    tile = 16
    # Lattice row/column of the origin: 4_200_000 / -10 = -420000 and 500_000 / 10 = 50000, both multiples of 16
    # less 0 (mod 16); start 6 pixels before a corner so a 12 x 12 granule straddles it.
    origin = (ORIGIN[0] + 10 * 10.0, ORIGIN[1] - 10 * 10.0)
    pixels = np.arange(2 * 12 * 12, dtype=np.int16).reshape(2, 12, 12) + 1
    plan = plan_granule("c", {"data": raster_dataset(pixels, origin=origin)}, tile=tile, chunk=16)
    (asset,) = plan.assets
    assert len(asset.pieces) == 4 and len({piece.stack for piece in asset.pieces}) == 4
    covered = np.zeros((12, 12), dtype=int)
    for piece in asset.pieces:
        row, column, height, width = piece.window
        assert row >= 0 and row + height <= tile and column >= 0 and column + width <= tile
        covered[piece.at[0] : piece.at[0] + height, piece.at[1] : piece.at[1] + width] += 1
    assert (covered == 1).all()

    repository = small_repo(tmp_path, tile=tile)
    commit_granules(repository, [("corner", pixels, {"origin": origin})])
    view = repository.view()
    assert len(view.stacks("c")) == 4
    np.testing.assert_array_equal(view.item_arrays("c", "corner").data.values, pixels)


def test_chunks_holding_only_the_fill_value_are_not_written(tmp_path):
    repository = small_repo(tmp_path, tile=64, chunk=16)
    # Lattice row -420032 and column 50048 are multiples of 64: both granules lie in one tile, on chunk boundaries.
    corner = (500_480.0, 4_200_320.0)
    nodata = raster_dataset(np.full((2, 32, 32), 7, dtype=np.int16), origin=corner)
    nodata["data"].attrs["_FillValue"] = 7
    nodata["data"].values[0, :16, :16] = 1  # one chunk of band 0 holds data; band 1 is all nodata
    floats = raster_dataset(np.full((1, 32, 32), np.nan, dtype=np.float32), origin=(corner[0] + 320.0, corner[1]))
    floats["data"].values[0, 20, 20] = 1.5  # no _FillValue: NaN is the fill; one chunk of four holds data

    writer = repository.writer()
    writer.ensure_collection("c")
    items = []
    for item_id, dataset in (("nodata", nodata), ("floats", floats)):
        item = make_item(item_id)
        placed, _ = stage_arrays(writer, item, {"data": dataset})
        items.append(with_arrays_asset(item, arrays_asset(placed)))
        writer.add_item(items[-1])
    writer.commit("sparse granules")
    view = repository.view()

    for item, written in zip(items, (1, 1), strict=True):
        (piece,) = read_arrays_asset(item).pixels["data"].pieces
        assert chunk_count(view.session, f"{piece.stack}/{piece.array}") == written
    np.testing.assert_array_equal(view.item_arrays("c", "nodata").data.values, nodata["data"].values)
    np.testing.assert_array_equal(view.item_arrays("c", "floats").data.values, floats["data"].values)


# -- array names ----------------------------------------------------------------------------------------


def test_array_name_is_the_key_unless_another_kind_holds_it():
    uint8 = Kind("data", "uint8", 1, ())
    int16 = Kind("data", "int16", 1, ())
    assert array_name(uint8, {}) == "data"
    assert array_name(uint8, {"data": uint8.signature}) == "data"
    assert array_name(int16, {"data": uint8.signature}) == f"data.{int16.signature}"
    assert int16.signature != uint8.signature


def test_a_second_kind_under_one_key_gets_an_array_of_its_own(tmp_path):
    repository = small_repo(tmp_path)
    as_bytes = np.arange(100, dtype=np.uint8).reshape(1, 10, 10)
    as_floats = np.linspace(0, 1, 100, dtype=np.float32).reshape(1, 10, 10)
    commit_granules(repository, [("bytes", as_bytes, {})])
    commit_granules(repository, [("floats", as_floats, {})])
    view = repository.view()

    (stack,) = view.stacks("c")
    names = {piece.array for item in ("bytes", "floats") for piece in read_arrays_asset(view.item("c", item)).pieces()}
    int_kind = Kind("data", "uint8", 1, ())
    float_kind = Kind("data", "float32", 1, ())
    assert names == {"data", array_name(float_kind, {"data": int_kind.signature})}
    assert view.has_array(f"{stack}/data") and view.has_array(f"{stack}/{array_name(float_kind, {'data': 'x'})}")
    np.testing.assert_array_equal(view.item_arrays("c", "bytes").data.values, as_bytes)
    np.testing.assert_array_equal(view.item_arrays("c", "floats").data.values, as_floats)
    assert view.item_arrays("c", "floats").data.dtype == np.float32


def test_a_writer_lists_a_stacks_arrays_once_and_again_when_it_needs_a_name_it_has_not_seen(tmp_path, monkeypatch):
    from ingest.rasters import _slices

    listed: list[str] = []
    kinds_in = _slices._kinds_in
    monkeypatch.setattr(_slices, "_kinds_in", lambda store, stack: listed.append(stack) or kinds_in(store, stack))
    repository = small_repo(tmp_path)
    as_bytes = np.arange(100, dtype=np.uint8).reshape(1, 10, 10)
    as_floats = np.linspace(0, 1, 100, dtype=np.float32).reshape(1, 10, 10)
    first = repository.writer()
    for n in range(4):  # staged and added one by one, as a batch does
        first.add_item(stage_raster(first, make_item(f"bytes-{n}"), as_bytes + n))
    # Once to find the new stack's array made, then never again for the same kind.
    assert len(listed) == 1
    # Meanwhile another writer adds a second kind under the same key; the first writer's list is stale.
    commit_granules(repository, [("floats-other", as_floats, {})])
    listed.clear()
    first.add_item(stage_raster(first, make_item("floats"), as_floats * 2))
    assert listed  # the name it wanted was not in its list: read again
    first.commit("bytes and floats")
    view = repository.view()
    for n in range(4):
        np.testing.assert_array_equal(view.item_arrays("c", f"bytes-{n}").data.values, as_bytes + n)
    np.testing.assert_array_equal(view.item_arrays("c", "floats").data.values, as_floats * 2)
    np.testing.assert_array_equal(view.item_arrays("c", "floats-other").data.values, as_floats)
    pieces = [
        piece for item in ("floats", "floats-other") for piece in read_arrays_asset(view.item("c", item)).pieces()
    ]
    assert len({piece.array for piece in pieces}) == 1 and pieces[0].array != "data"


def test_granules_staged_before_a_catch_up_and_added_after_it_name_the_slots_they_moved_to(tmp_path):
    """Staging several granules first and adding their items later is allowed: when another writer's commit
    moves the slices meanwhile (a catch-up, here from a new kind's stack commit), the items added afterwards
    name the slots the slices moved to, not the ones first given."""
    repository = small_repo(tmp_path)
    as_bytes = np.arange(100, dtype=np.uint8).reshape(1, 10, 10)
    as_floats = np.linspace(0, 1, 100, dtype=np.float32).reshape(1, 10, 10)
    first = repository.writer()
    staged = [stage_raster(first, make_item(f"bytes-{n}"), as_bytes + n) for n in range(4)]
    commit_granules(repository, [("other", as_bytes + 100, {}), ("floats-other", as_floats, {})])
    staged.append(stage_raster(first, make_item("floats"), as_floats * 2))  # catches up: its slices move
    given = {item["id"]: {piece.slot for piece in read_arrays_asset(item).pieces()} for item in staged}
    for item in staged:
        first.add_item(item)
    first.commit("staged first, added later")
    view = repository.view()
    for n in range(4):
        np.testing.assert_array_equal(view.item_arrays("c", f"bytes-{n}").data.values, as_bytes + n)
    np.testing.assert_array_equal(view.item_arrays("c", "floats").data.values, as_floats * 2)
    np.testing.assert_array_equal(view.item_arrays("c", "other").data.values, as_bytes + 100)
    stored = {n: {piece.slot for piece in read_arrays_asset(view.item("c", f"bytes-{n}")).pieces()} for n in range(4)}
    assert any(stored[n] != given[f"bytes-{n}"] for n in range(4))  # the slices did move


# -- fixed stacks ---------------------------------------------------------------------------------------


def test_fixed_layout_gives_one_stack_per_exact_grid(tmp_path):
    rng = np.random.default_rng(3)
    granules = [
        ("a1", rng.integers(1, 9, (1, 10, 10), dtype=np.uint8), {"origin": ORIGIN}),
        ("a2", rng.integers(1, 9, (1, 10, 10), dtype=np.uint8), {"origin": ORIGIN}),
        ("a3", rng.integers(1, 9, (1, 10, 10), dtype=np.uint8), {"origin": ORIGIN}),
        # One pixel along: the same lattice (one tiled stack) but another exact grid.
        ("b1", rng.integers(1, 9, (1, 10, 10), dtype=np.uint8), {"origin": (ORIGIN[0] + 10.0, ORIGIN[1])}),
    ]
    fixed = small_repo(tmp_path, "fixed", layout="fixed")
    tiled = small_repo(tmp_path, "tiled", layout="tiled")
    commit_granules(fixed, granules)
    commit_granules(tiled, granules)

    assert len(tiled.view().stacks("c")) == 1
    view = fixed.view()
    stacks = view.stacks("c")
    assert len(stacks) == 2 and all(stack.startswith(f"c/{STACKS}/g") for stack in stacks)
    by_items = {frozenset(view.slot_items(stack).values()): stack for stack in stacks}
    assert set(by_items) == {frozenset({"a1", "a2", "a3"}), frozenset({"b1"})}
    # A fixed stack is the granule's own grid: whole slices, windows covering the stack.
    for item_id, pixels, _where in granules:
        (piece,) = read_arrays_asset(view.item("c", item_id)).pieces()
        assert piece.window == (0, 0, 10, 10) and piece.at == (0, 0)
        np.testing.assert_array_equal(view.item_arrays("c", item_id).data.values, pixels)
    assert zarr.open_array(view.session.store, path=f"{by_items[frozenset({'b1'})]}/data", mode="r").shape[2:] == (
        10,
        10,
    )


# -- node counts ------------------------------------------------------------------------------------------


def node_count(repository: Repository) -> int:
    """Every group and array in the repository's tip, by walking zarr groups."""
    root = zarr.open_group(repository.view().session.store, mode="r")
    return 1 + sum(1 for _ in root.members(max_depth=None))


@pytest.mark.slow
def test_nodes_grow_with_grids_not_granules(tmp_path):
    """Icechunk writes every node into every snapshot: 60 granules on 3 grids must not make 60 groups."""
    repository = small_repo(tmp_path)
    grids = [
        {"origin": ORIGIN},
        {"origin": (ORIGIN[0] + 5.0, ORIGIN[1])},  # another alignment: another lattice
        {"origin": ORIGIN, "crs": "EPSG:32634"},
    ]
    rng = np.random.default_rng(4)
    counts = []
    for batch in range(6):
        granules = [
            (f"g{batch:02d}-{index:02d}", rng.integers(1, 9, (1, 8, 8), dtype=np.uint8), grids[index % 3])
            for index in range(10)
        ]
        commit_granules(repository, granules)
        counts.append(node_count(repository))
    view = repository.view()
    assert view.count() == 60
    assert len(view.stacks("c")) == 3
    assert sum(len(view.slot_items(stack)) for stack in view.stacks("c")) == 60
    # Root, collection, stacks group, 3 lattice groups, 3 stack groups of 6 arrays (x, y, spatial_ref, item,
    # datetime, data) each: the same after the first 10 granules as after all 60.
    assert counts == [counts[0]] * 6
    assert counts[0] == 1 + 1 + 1 + 3 + 3 * (1 + 6)


# -- the time series --------------------------------------------------------------------------------------


def test_view_stack_is_the_time_series_ordered_by_datetime_with_item_ids(tmp_path):
    repository = small_repo(tmp_path)
    when = {
        "march": "2024-03-01T00:00:00Z",
        "january": "2024-01-01T00:00:00Z",
        "february": "2024-02-01T12:30:00.250000Z",
    }
    pixels = {name: np.full((1, 10, 10), number + 1, dtype=np.uint8) for number, name in enumerate(when)}
    # Staged (and so slotted) out of order, in two commits.
    commit_granules(repository, [("march", pixels["march"], {})], march={"when": when["march"]})
    staged = commit_granules(
        repository,
        [("january", pixels["january"], {}), ("february", pixels["february"], {})],
        january={"when": when["january"]},
        february={"when": when["february"]},
    )
    view = repository.view()
    (stack,) = view.stacks("c")
    series = view.stack(stack)

    assert list(series.item.values) == ["january", "february", "march"]
    assert series.sizes["time"] == 3
    expected_times = np.array(
        ["2024-01-01T00:00:00", "2024-02-01T12:30:00.250000", "2024-03-01T00:00:00"], dtype="datetime64[ns]"
    )
    np.testing.assert_array_equal(series.datetime.values, expected_times)
    assert view.slot_items(stack) == {0: "march", 1: "january", 2: "february"}
    row, column, height, width = read_arrays_asset(staged[0]).pixels["data"].pieces[0].window
    for step, name in enumerate(["january", "february", "march"]):
        window = series.data.isel(time=step, y=slice(row, row + height), x=slice(column, column + width))
        np.testing.assert_array_equal(window.values, pixels[name])


@pytest.mark.parametrize("item_id", ["S2A_MSIL2A_20240101T000000_T33UUP", "ünïcødé-✓", ""])
def test_slot_coordinates_encoded_by_hand_read_back_through_zarr(item_id):
    """The chunks floe writes for a slot's ``item`` and ``datetime`` are what zarr reads for those arrays."""
    prototype = default_buffer_prototype()
    store = MemoryStore()
    for name, metadata in ((ITEM, _ITEM_META), (DATETIME, _DATETIME_META)):
        document = metadata.to_buffer_dict(prototype)["zarr.json"]
        sync(store.set(f"{name}/zarr.json", document))
    item, when = slot_coordinate_chunks(item_id, -1_234_567_890_123)
    sync(store.set(f"{ITEM}/{_ITEM_META.encode_chunk_key((5,))}", item))
    sync(store.set(f"{DATETIME}/{_DATETIME_META.encode_chunk_key((5,))}", when))
    assert zarr.open_array(store, path=ITEM, mode="r")[5] == item_id
    assert zarr.open_array(store, path=DATETIME, mode="r")[5] == -1_234_567_890_123
    assert zarr.open_array(store, path=DATETIME, mode="r")[4] == 0


def _pixel_chunks(store: MemoryStore) -> dict[str, bytes]:
    """Stored pixel chunks (``.../c/...`` keys of the ``data`` arrays), as bytes."""

    async def collect() -> dict[str, bytes]:
        found = {}
        async for key in store.list():
            if "/data/c/" in key:
                found[key] = (await store.get(key, default_buffer_prototype())).to_bytes()
        return found

    return sync(collect())


@pytest.mark.parametrize(
    ("dtype", "fill", "layout"),
    [("uint8", None, "tiled"), (">u2", 0, "fixed"), ("int16", -9999, "tiled"), ("float32", None, "fixed")],
)
def test_pixel_chunks_encoded_by_hand_are_what_zarr_writes(dtype, fill, layout):
    """A copy encodes its chunks itself instead of through zarr's setitem: every chunk, the edge chunks a fixed
    grid pads and the ones a tiled piece shares with the fill value, byte for byte as zarr writes the same pixels
    (big-endian pixels and a NaN fill included), and no chunk zarr would leave out."""
    rng = np.random.default_rng(7)
    pixels = rng.integers(0, 200, size=(2, 37, 41)).astype(dtype)
    if dtype == "float32":
        pixels[:, :, 20:] = np.nan  # the fill (no _FillValue): chunks right of column 20 hold nothing else
    elif fill is not None:
        pixels[1] = fill  # band 1 holds nothing but the fill value
    dataset = raster_dataset(pixels, origin=(500_080.0, 4_200_000.0))
    if fill is not None:
        dataset["data"].attrs["_FillValue"] = np.dtype(dtype).type(fill)
    plan = plan_granule("c", {"data": dataset}, layout=layout, tile=64, chunk=16)
    for piece in plan.assets[0].pieces:
        piece.slot, piece.array = 3, "data"

    ours = MemoryStore()
    sync(write_slices(ours, plan, item_id="g", datetime_us=0, chunk=16))
    theirs = MemoryStore()
    asset = plan.assets[0]
    for piece in asset.pieces:
        metadata = asset.kind.metadata(plan.stacks[piece.stack], capacity=4, chunk=16)
        sync(
            theirs.set(
                f"{piece.stack}/data/zarr.json", metadata.to_buffer_dict(default_buffer_prototype())["zarr.json"]
            )
        )
        row, column, height, width = piece.window
        at_row, at_column = piece.at
        array = zarr.open_array(theirs, path=f"{piece.stack}/data", mode="r+")
        array[3, :, row : row + height, column : column + width] = pixels[
            :, at_row : at_row + height, at_column : at_column + width
        ]

    expected = _pixel_chunks(theirs)
    assert expected and _pixel_chunks(ours) == expected
