"""Batches close by item count or, for granules whose rasters are copied, by raster bytes; on object storage the
count grows while commits spend their time waiting on the store."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from ingest import Repository
from ingest.config import Settings
from ingest.pipeline import ingest_items
from ingest.pipeline._granules import Granule, RowsGranule
from ingest.pipeline._sizing import BatchSizer
from ingest.pipeline._stream import batched, routed_batches
from tests.conftest import make_item


def test_batches_close_by_count_or_by_raster_bytes(tmp_path: Path) -> None:
    rasters = []
    for index, size in enumerate([400, 400, 400, 900, 100, 100]):
        path = tmp_path / f"r{index}.tif"
        path.write_bytes(b"\0" * size)
        rasters.append(str(path))
    granules = [Granule(make_item(f"g{index}"), "src", {"data": path}) for index, path in enumerate(rasters)]
    metadata_only = [Granule(make_item(f"m{index}"), "src") for index in range(7)]

    sizes = [len(batch) for batch, _ in batched(granules, size=100, raster_bytes=1000)]
    assert sizes == [3, 2, 1]  # 1,200 bytes close the first; 900 alone does not, 900 + 100 reach 1,000
    assert [len(batch) for batch, _ in batched(granules, size=2, raster_bytes=10_000)] == [2, 2, 2]
    assert [len(batch) for batch, _ in batched(metadata_only, size=3, raster_bytes=1)] == [3, 3, 1]
    assert [granule.item["id"] for batch, _ in batched(granules, 4, 1000) for granule in batch] == [
        f"g{index}" for index in range(6)
    ]


def test_a_full_batch_goes_out_one_granule_later_and_only_the_last_says_so() -> None:
    # The last batch is known by reading one granule past a full one, not a whole batch: so each batch
    # commits as soon as it is full, and when the sources end only the last is left to commit.
    read: list[int] = []

    def granules(count: int) -> Iterator[Granule]:
        for index in range(count):
            read.append(index)
            yield Granule(make_item(f"m{index}"), "src")

    seen = []
    for batch, last in batched(granules(7), size=3):
        seen.append(([granule.item["id"] for granule in batch], last, len(read)))
    assert seen == [
        (["m0", "m1", "m2"], False, 4),
        (["m3", "m4", "m5"], False, 7),
        (["m6"], True, 7),
    ]
    assert [last for _, last in batched(granules(6), size=3)] == [False, True]  # a full last batch says so
    assert list(batched(granules(0), size=3)) == []

    read.clear()
    routed = [(route, len(batch), last, len(read)) for route, batch, last in routed_batches(granules(5), 2, size=2)]
    # Items alone fill the emptiest route: m0, m2 to route 0 (out when m3 is read), m1 to route 1, m3 and m4 to route 0.
    # When the granules end, the routes' batches follow one another, and the final one is the last.
    assert routed == [(0, 2, False, 4), (0, 2, False, 5), (1, 1, True, 5)]


def test_default_batches_hold_thousands_of_items() -> None:
    settings = Settings()
    assert settings.batch_size >= 5000 and settings.batch_raster_mb >= 256


def test_each_place_stays_with_one_route_and_new_places_go_to_the_least_given_route() -> None:
    from tests.conftest import with_square

    # Four tiles seen again and again (16 granules each), as an archive of a few tiles over time is.
    # (A hash of collection and cell sent all four of these to route 0.)
    tiles = [(-158.5, -48.5), (-155.5, -45.5), (-152.5, -42.5), (-149.5, -39.5)]
    granules = [
        Granule(with_square(make_item(f"t{n % 4}-{n // 4}"), *tiles[n % 4], 0.5), "src", {"data": f"s3://b/{n}.tif"})
        for n in range(64)
    ]
    metadata_only = [Granule(make_item(f"m{index}"), "src") for index in range(6)]
    routed = list(routed_batches(granules + metadata_only, routes=2, size=5))

    routes_of_tile: dict[str, set[int]] = {}
    given = [0, 0]
    for route, batch, _ in routed:
        assert 0 < len(batch) <= 5
        for granule in batch:
            if granule.rasters:
                given[route] += 1
                routes_of_tile.setdefault(granule.item["id"].split("-")[0], set()).add(route)
    assert all(len(routes) == 1 for routes in routes_of_tile.values())  # one actor writes a tile's slices
    assert given == [32, 32]  # two tiles each
    assert [last for _, _, last in routed] == [False] * (len(routed) - 1) + [True]
    assert sorted(granule.item["id"] for _, batch, _ in routed for granule in batch) == sorted(
        granule.item["id"] for granule in granules + metadata_only
    )


def test_rasters_referenced_in_place_count_their_references_not_their_size() -> None:
    from ingest.pipeline._stream import REMOTE_RASTER_BYTES, VIRTUAL_RASTER_BYTES, routed_batches

    granules = [Granule(make_item(f"g{n}"), "src", {"data": f"s3://bucket/scene-{n}.tif"}) for n in range(40)]
    limit = 8 * REMOTE_RASTER_BYTES  # the default batch_raster_mb holds 8 remote rasters to be copied
    copied = [len(batch) for _, batch, _ in routed_batches(granules, routes=1, size=5000, raster_bytes=limit)]
    referenced = [
        len(batch) for _, batch, _ in routed_batches(granules, routes=1, size=5000, raster_bytes=limit, virtual=True)
    ]
    assert copied == [8] * 5
    assert referenced == [40] and limit // VIRTUAL_RASTER_BYTES > 40


def test_a_batch_doubles_after_a_commit_that_mostly_waited_and_never_passes_the_most() -> None:
    sizer = BatchSizer(100, 350)
    sizer.observe(batch_seconds=1.0, waiting_seconds=0.2)  # a fifth of its time waiting: stays
    assert sizer() == 100
    sizer.observe(batch_seconds=1.0, waiting_seconds=0.3)
    assert sizer() == 200
    sizer.observe(batch_seconds=1.0, waiting_seconds=0.9)
    sizer.observe(batch_seconds=1.0, waiting_seconds=0.9)
    assert sizer() == 350
    assert sizer.sizes == [100, 100, 200, 350]
    assert BatchSizer(500, 100)() == 500  # a most below the first: the first stays


def test_batches_follow_a_size_that_changes_as_they_fill() -> None:
    sizes = iter([2, 4, 8])
    size = {"now": next(sizes)}
    granules = (Granule(make_item(f"i{number}"), "src") for number in range(14))
    lengths = []
    for batch, _ in batched(granules, lambda: size["now"]):
        lengths.append(len(batch))
        size["now"] = next(sizes, 8)
    assert lengths == [2, 4, 8]


def write_items(path: Path, count: int) -> Path:
    path.write_text("".join(json.dumps(make_item(f"item-{number}", "c")) + "\n" for number in range(count)))
    return path


@pytest.mark.s3
def test_on_object_storage_batches_grow_while_commits_wait_and_a_size_given_is_kept(tmp_path, moto_server) -> None:
    settings = Settings(s3=moto_server.s3_settings(), batch_size=50, batch_max_size=400)
    source = write_items(tmp_path / "items.ndjson", 1200)

    grown = Repository.create(f"s3://{moto_server.create_bucket()}/repo", settings)
    ingest_items(grown, [source])
    sizes = [entry.rows_added for entry in reversed(grown.log()) if entry.rows_added]
    # A commit on S3 waits on a dozen round trips, where its 50 items are a few milliseconds of work.
    full = sizes[:-1]  # the last batch holds what was left
    assert full[0] == 50 and max(sizes) == 400 and sum(sizes) == 1200, sizes
    assert all(later in (earlier, 2 * earlier, 400) for earlier, later in itertools.pairwise(full)), sizes

    fixed = Repository.create(f"s3://{moto_server.create_bucket()}/repo", settings)
    ingest_items(fixed, [source], batch_size=300)
    assert [entry.rows_added for entry in fixed.log() if entry.rows_added] == [300] * 4

    local = Repository.create(tmp_path / "local", settings)
    ingest_items(local, [source])
    assert [entry.rows_added for entry in local.log() if entry.rows_added] == [50] * 24


def _rows(count: int, first: int = 0) -> RowsGranule:
    ids = [f"r{index}" for index in range(first, first + count)]
    table = pa.table({"collection": ["c"] * count, "id": ids})
    return RowsGranule(table, "f.parquet#row", np.arange(first, first + count))


def test_rows_fill_a_batch_exactly_at_the_rows_size_and_mix_with_items_by_share() -> None:
    def shape(batches: Iterator[tuple[list, bool]]) -> list[list[str]]:
        return [
            [f"rows{len(granule)}" if isinstance(granule, RowsGranule) else "item" for granule in batch]
            for batch, _ in batches
        ]

    # 25 rows at 10 rows a batch: cut at the tenth and twentieth row, every row once and in order.
    batches = list(batched([_rows(7), _rows(18, first=7)], size=3, rows_size=10))
    assert shape(iter(batches)) == [["rows7", "rows3"], ["rows10"], ["rows5"]]
    labels = [source for batch, _ in batches for granule in batch for source in granule.sources]
    assert labels == [f"f.parquet#row{index}" for index in range(25)]
    assert [last for _, last in batches] == [False, False, True]
    # An item takes a third of a batch of 3 items or 10 rows: two items leave room for 3 rows (10 * 1/3, rounded
    # down), and the batch is full when the rest of the rows would pass it.
    items = [Granule(make_item(f"m{index}"), "src") for index in range(2)]
    assert shape(batched([*items, _rows(8)], size=3, rows_size=10)) == [["item", "item", "rows3"], ["rows5"]]
    # Without a rows size, a row counts as an item.
    assert shape(batched([_rows(5)], size=2)) == [["rows2"], ["rows2"], ["rows1"]]


def test_a_run_of_rows_seen_before_is_rejected_whole_and_leaves_no_granule() -> None:
    # A run of one row, or of rows that are all duplicates (a search's page whose only item was seen on a page
    # before), leaves nothing to take: no granule, each row rejected by its label.
    from ingest.pipeline._prune import SourceScope
    from ingest.pipeline._report import IngestReport
    from ingest.pipeline._stream import _row_granules
    from ingest.pipeline.sources import SourcedRows

    scope, report = SourceScope(), IngestReport()
    first = _rows(3)
    assert [
        len(granule)
        for granule in _row_granules(SourcedRows(first.rows, first.prefix, first.numbers), report, scope, 10)
    ] == [3]
    again = _rows(2, first=1)
    again_rows = SourcedRows(again.rows, "g.parquet#row", again.numbers)
    assert list(_row_granules(again_rows, report, scope, 10)) == []
    assert [(rejection.source, rejection.item_id) for rejection in report.rejected] == [
        ("g.parquet#row1", "r1"),
        ("g.parquet#row2", "r2"),
    ]
    assert len(first.taken([])) == 0
