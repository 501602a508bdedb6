"""Pixels of many items read by planned chunks (``ingest/repository/_chunks.py``), and the chunk cache.

The repository keeps 16-pixel chunks, so a 48 x 40 granule across the corner
of four stack tiles is four pieces of up to 12 chunks each. Any selection
xarray can make (steps, reversed axes, single positions, lists of dates)
must read what the staged pixels hold; a second read of the same chunks
must not touch the store; the cache must keep to its size and never serve
one snapshot's pixels for another's.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ingest
from ingest import Repository, Settings
from ingest.config import ArraysSettings
from ingest.repository import chunk_cache, clear_chunk_cache, set_chunk_cache_size
from ingest.repository._chunks import ChunkCache
from ingest.stac import read_arrays_asset
from tests.conftest import make_item, stage_raster

CORNER = (532180.0, 4178120.0)
"""30 pixels west and 20 north of a corner of 4,096-pixel tiles (10 m pixels): a 48x40 granule covers four tiles."""
SHAPE = (3, 40, 48)
ITEMS = ("a", "b", "c", "d")


def pixels(item_id: str) -> np.ndarray:
    return np.random.default_rng(zlib.crc32(item_id.encode())).integers(1, 60000, size=SHAPE, dtype="uint16")


@pytest.fixture(scope="module")
def small_chunks(tmp_path_factory: pytest.TempPathFactory) -> Repository:
    repo = Repository.create(tmp_path_factory.mktemp("chunks") / "repo", Settings(arrays=ArraysSettings(chunk=16)))
    writer = repo.writer()
    for day, item_id in enumerate(ITEMS, start=1):
        item = make_item(item_id, "s2", when=f"2024-01-0{day}T10:00:00Z", tile="corner")
        writer.add_item(stage_raster(writer, item, pixels(item_id), origin=CORNER))
    writer.commit("four granules across a tile corner")
    return repo


@pytest.fixture(autouse=True)
def empty_cache() -> Any:
    clear_chunk_cache()
    yield
    set_chunk_cache_size(256 * 2**20)
    clear_chunk_cache()


def _stacked(repo: Repository, ref: str = "main") -> Any:
    (node,) = ingest.open_search(repo, ref).children.values()
    return node.ds["data"]


def test_a_granule_spans_several_chunks_of_each_piece(small_chunks: Repository) -> None:
    where = read_arrays_asset(small_chunks.view().item("s2", "a")).pixels["data"]
    assert len(where.pieces) == 4
    assert max(piece.window[2] * piece.window[3] for piece in where.pieces) > 16 * 16
    np.testing.assert_array_equal(_stacked(small_chunks).values, np.stack([pixels(i) for i in ITEMS]))


def _axis(size: int) -> st.SearchStrategy[Any]:
    """A position or a slice with any step taking at least one position (xarray's lazy indexing mishandles some
    empty slices with negative steps before they reach floe: xarray/core/indexing.py ``_decompose_slice``)."""
    bounds = st.integers(-size - 2, size + 2) | st.none()
    steps = st.sampled_from([None, 1, 2, 3, 7, -1, -2, -5])
    slices = st.builds(slice, bounds, bounds, steps).filter(lambda part: len(range(*part.indices(size))) > 0)
    return slices | st.integers(-size, size - 1)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(time=_axis(4), band=_axis(3), y=_axis(40), x=_axis(48), twice=st.booleans())
def test_any_selection_reads_what_was_staged(small_chunks: Repository, time, band, y, x, twice) -> None:
    """Property: every basic selection (slices with any step, single positions) reads the staged pixels, cold or
    from the cache."""
    if not twice:
        clear_chunk_cache()
    stacked = _stacked(small_chunks)
    expected = np.stack([pixels(i) for i in ITEMS])[time, band, y, x]
    np.testing.assert_array_equal(stacked.isel(time=time, band=band, y=y, x=x).values, expected)


def test_lists_of_dates_and_repeated_dates(small_chunks: Repository) -> None:
    stacked = _stacked(small_chunks)
    expected = np.stack([pixels(i) for i in ITEMS])
    np.testing.assert_array_equal(stacked.isel(time=[3, 0, 3], y=slice(5, 30)).values, expected[[3, 0, 3], :, 5:30])


def _counting(stacked: Any) -> list[str]:
    """The keys of the chunk reads (not the arrays' documents) the lazy variable's store serves from now on."""
    store = stacked.variable._data.array.store
    gets: list[str] = []
    real = store.get

    async def get(key: str, *args: Any, **kwargs: Any) -> Any:
        if "/c/" in key:
            gets.append(key)
        return await real(key, *args, **kwargs)

    store.get = get
    return gets


def test_a_second_read_of_the_same_chunks_does_not_touch_the_store(small_chunks: Repository) -> None:
    stacked = _stacked(small_chunks)
    gets = _counting(stacked)
    first = stacked.isel(y=slice(10, 30), x=slice(20, 40)).values
    fetched = len(gets)
    assert fetched >= len(ITEMS) * 4, "a window across the tile corner needs chunks of four pieces per date"
    assert len(set(gets)) == fetched, "a chunk was fetched twice in one read"
    again = stacked.isel(y=slice(12, 28), x=slice(22, 38)).values  # inside the same chunks
    assert len(gets) == fetched
    np.testing.assert_array_equal(again, first[:, :, 2:18, 2:18])
    assert chunk_cache().hits > 0

    clear_chunk_cache()
    stacked.isel(y=slice(12, 28), x=slice(22, 38)).load()
    assert len(gets) > fetched


def test_the_cache_never_serves_one_snapshots_pixels_for_another(small_chunks: Repository) -> None:
    """The same chunk key, rewritten in place by a later commit: each snapshot reads its own pixels, cached or not."""
    repo = Repository.open(small_chunks.location.url, Settings(arrays=ArraysSettings(chunk=16)))
    repo.tag("before-change")
    before = _stacked(repo, "before-change").values  # every chunk of the tag is now cached
    piece = read_arrays_asset(repo.view().item("s2", "b")).pixels["data"].pieces[0]
    row, col, height, width = piece.window
    writer = repo.writer()
    stack_array = zarr.open_array(writer.session.store, path=f"{piece.stack}/{piece.array}", mode="r+")
    stack_array[piece.slot, :, row : row + height, col : col + width] = 7
    writer.add_item(make_item("e", "s2", when="2024-01-09T10:00:00Z", tile="corner"))
    writer.commit("b's first piece rewritten in place")

    now = _stacked(repo).values
    at_row, at_col = piece.at
    assert (now[1][:, at_row : at_row + height, at_col : at_col + width] == 7).all()
    np.testing.assert_array_equal(_stacked(repo, "before-change").values, before)
    np.testing.assert_array_equal(before[1], pixels("b"))


def test_the_cache_keeps_to_its_size_dropping_the_least_recently_used() -> None:
    cache = ChunkCache(limit=3 * 800)
    chunks = {name: np.full(100, index, dtype="int64") for index, name in enumerate("abcd")}  # 800 bytes each
    for name in "abc":
        cache.put(name, chunks[name])
    assert cache.get("a") == (True, chunks["a"])  # "a" is now the most recent
    cache.put("d", chunks["d"])
    assert cache.size <= cache.limit
    assert not cache.get("b")[0], "the least recently used chunk stays"
    assert all(cache.get(name)[0] for name in "acd")
    cache.put("missing", None)
    assert cache.get("missing") == (True, None), "a chunk the store lacks is remembered as the fill value"
    cache.resize(800)
    assert cache.size <= 800 and cache.get("d")[0]
    cache.put("big", np.zeros(200, dtype="int64"))
    assert not cache.get("big")[0], "a chunk over the whole limit is not kept"


def test_a_cache_of_size_zero_reads_from_the_store_each_time(small_chunks: Repository) -> None:
    set_chunk_cache_size(0)
    stacked = _stacked(small_chunks)
    gets = _counting(stacked)
    stacked.isel(x=slice(0, 10)).load()
    fetched = len(gets)
    stacked.isel(x=slice(0, 10)).load()
    assert len(gets) == 2 * fetched
    assert chunk_cache().size == 0
    with pytest.raises(ValueError, match="at least 0"):
        set_chunk_cache_size(-1)


def test_a_local_repository_reads_each_object_in_one_request(tmp_path) -> None:
    """Icechunk splits a local object over 4 KiB into ranged reads; floe opens local roots with one read per object
    up to 12 MiB, in the process only: the repository's saved configuration keeps Icechunk's own."""
    import icechunk

    from ingest.storage import Location

    created = Repository.create(tmp_path / "repo", Settings())
    opened = Repository.open(tmp_path / "repo", Settings())
    for repo in (created, opened):
        assert repo.icechunk.config.storage.concurrency.ideal_concurrent_request_size == 12 * 2**20
    saved = icechunk.Repository.fetch_config(created.location.icechunk_storage())
    assert saved.storage.concurrency.ideal_concurrent_request_size != 12 * 2**20
    assert Location.parse("s3://bucket/prefix", Settings()).icechunk_config() is None


def test_a_read_without_a_scope_passes_the_cache_by(small_chunks: Repository) -> None:
    """A ``PiecesArray`` given no scope (a store nobody named as immutable) neither fills nor reads the cache: two
    repositories' arrays at the same path would otherwise share entries."""
    from ingest.repository._series import PiecesArray

    view = small_chunks.view()
    where = read_arrays_asset(view.item("s2", "a")).pixels["data"]
    lazy = PiecesArray(view.session.store, [where], np.dtype("uint16"), 0)
    values = lazy._read((0, slice(None), slice(None), slice(None)))
    np.testing.assert_array_equal(values, pixels("a"))
    assert chunk_cache().size == 0 and chunk_cache().hits == 0
