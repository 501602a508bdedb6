"""Searches over a compacted table: the same answers as before `floe optimize`, from fewer files.

Every answer is compared with a brute-force evaluation over the exported items
(order included for sorted searches, page after page); files read are counted
at the engine's column cache, the only place a search reads data files.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import shapely
import shapely.geometry

from ingest import Repository, Settings
from ingest.api import SearchEngine
from ingest.api._request import SearchRequest
from ingest.repository import _files as files_module
from ingest.stac._validate import parse_datetime
from tests.conftest import make_item, with_square

COLLECTIONS = ("north", "south")


def _item(n: int) -> dict:
    """Item ``n``: a 1.5-degree square somewhere on the globe, a unique datetime in one of three months."""
    month = 1 + n % 3
    item = make_item(
        f"i-{n:04d}",
        COLLECTIONS[n % 2],
        when=f"2024-{month:02d}-{1 + (n * 7) % 28:02d}T{(n * 5) % 24:02d}:{n % 60:02d}:{(n // 60) % 60:02d}Z",
        **{"eo:cloud_cover": float((n * 37) % 100)},
    )
    return with_square(item, (n * 41.3) % 350 - 175, (n * 17.9) % 160 - 80, 1.5)


@pytest.fixture(scope="module")
def compacted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """720 items in 24 batches (each spanning the globe), tagged ``before``; compacted, tagged ``after``."""
    root = tmp_path_factory.mktemp("optimized") / "repo"
    repository = Repository.create(root, Settings(optimize={"target_file_rows": 20}))
    items = [_item(n) for n in range(720)]
    for start in range(0, len(items), 30):
        writer = repository.writer()
        writer.add_items(items[start : start + 30])
        writer.commit(f"batch {start // 30}")
    repository.tag("before")
    result = repository.optimize()
    assert result.summary is not None and result.summary.files_after < result.summary.files_before
    repository.tag("after")
    return {"repository": repository, "items": items}


class _Counting:
    """A search engine whose data file reads are counted (distinct files and row groups per search)."""

    def __init__(self, repository: Repository) -> None:
        self.engine = SearchEngine(repository, cache_mb=0)
        self.files: set[str] = set()
        self.groups: set[tuple[str, int]] = set()
        read = self.engine.columns.read

        def counted(path: str, names: list[str] | None = None, row_groups: Any = None) -> Any:
            self.files.add(path)
            every = range(self.engine.columns.layout(path).num_row_groups)
            self.groups.update((path, int(group)) for group in (every if row_groups is None else row_groups))
            return read(path, names, row_groups)

        self.engine.columns.read = counted  # type: ignore[method-assign]

    def all_pages(self, request: SearchRequest, ref: str) -> tuple[list[dict], int]:
        """Every item of ``request`` at ``ref``, page after page, and the distinct files read for them."""
        self.files = set()
        self.groups = set()
        found: list[dict] = []
        snapshot_id = self.engine.resolve(ref)
        while True:
            page = self.engine.search(request, snapshot_id=snapshot_id)
            found.extend(page.items)
            if page.next_token is None:
                return found, len(self.files)
            request = dataclasses.replace(request, token=page.next_token)


def _when(item: dict) -> datetime:
    return parse_datetime(item["properties"]["datetime"])


def _intersects(bounds: tuple[float, float, float, float]) -> Callable[[dict], bool]:
    box = shapely.box(*bounds)
    return lambda item: shapely.geometry.shape(item["geometry"]).intersects(box)


AOI = (10.0, 5.0, 40.0, 35.0)
QUERIES: list[tuple[str, SearchRequest, Callable[[dict], bool], Callable[[dict], Any] | None]] = [
    ("aoi", SearchRequest(bbox=list(AOI), limit=7), _intersects(AOI), None),
    (
        "aoi + one month",
        SearchRequest(bbox=list(AOI), datetime="2024-02-01T00:00:00Z/2024-02-29T23:59:59Z", limit=5),
        lambda item: _intersects(AOI)(item) and _when(item).month == 2,
        None,
    ),
    (
        "aoi newest first",
        SearchRequest(bbox=list(AOI), sortby="-datetime", limit=4),
        _intersects(AOI),
        lambda item: -_when(item).timestamp(),
    ),
    (
        "newest 10 anywhere",
        SearchRequest(sortby="-datetime", limit=10),
        lambda item: True,
        lambda item: -_when(item).timestamp(),
    ),
    (
        "collection + cql2, sorted by cloud cover then id",
        SearchRequest(
            collections=["south"],
            filter="eo:cloud_cover < 30 AND datetime >= TIMESTAMP('2024-02-10T00:00:00Z')",
            filter_lang="cql2-text",
            sortby="eo:cloud_cover,id",
            limit=11,
        ),
        lambda item: (
            item["collection"] == "south"
            and item["properties"]["eo:cloud_cover"] < 30
            and _when(item) >= parse_datetime("2024-02-10T00:00:00Z")
        ),
        lambda item: (item["properties"]["eo:cloud_cover"], item["id"]),
    ),
    (
        "intersects a triangle, oldest first",
        SearchRequest(
            intersects={"type": "Polygon", "coordinates": [[[-100, -40], [-20, -40], [-60, 30], [-100, -40]]]},
            sortby="datetime",
            limit=9,
        ),
        lambda item: shapely.geometry.shape(item["geometry"]).intersects(
            shapely.Polygon([(-100, -40), (-20, -40), (-60, 30)])
        ),
        lambda item: _when(item).timestamp(),
    ),
    (
        "ids",
        SearchRequest(ids=["i-0003", "i-0400", "i-0719", "nope"]),
        lambda item: item["id"] in {"i-0003", "i-0400", "i-0719"},
        None,
    ),
    (
        "ids, two a page",
        SearchRequest(ids=[f"i-{n:04d}" for n in range(0, 720, 37)], limit=2),
        lambda item: int(item["id"][2:]) % 37 == 0,
        None,
    ),
    (
        "ids in an aoi and a collection",
        SearchRequest(ids=[f"i-{n:04d}" for n in range(720)], bbox=list(AOI), collections=["north"], limit=3),
        lambda item: _intersects(AOI)(item) and item["collection"] == "north",
        None,
    ),
]


@pytest.mark.parametrize(("name", "request_", "matches", "order"), QUERIES, ids=[query[0] for query in QUERIES])
def test_answers_equal_brute_force_before_and_after_optimize(
    compacted: dict[str, Any],
    name: str,
    request_: SearchRequest,
    matches: Callable[[dict], bool],
    order: Callable[[dict], Any] | None,
) -> None:
    expected = [item for item in compacted["items"] if matches(item)]
    assert expected, f"{name}: the query must match something"
    counting = _Counting(compacted["repository"])
    for ref in ("before", "after"):
        found, _ = counting.all_pages(request_, ref)
        if order is None:
            assert sorted(item["id"] for item in found) == sorted(item["id"] for item in expected), (name, ref)
        else:
            assert [item["id"] for item in found] == [item["id"] for item in sorted(expected, key=order)], (name, ref)


def _files(repository: Repository, ref: str) -> int:
    return sum(1 for _ in repository.view(ref).table.scan().plan_files())


def test_an_aoi_search_reads_fewer_files_after_optimize(compacted: dict[str, Any]) -> None:
    repository = compacted["repository"]
    counting = _Counting(repository)
    request = SearchRequest(bbox=list(AOI), datetime="2024-02-01T00:00:00Z/2024-02-29T23:59:59Z", limit=100)
    found_before, read_before = counting.all_pages(request, "before")
    found_after, read_after = counting.all_pages(request, "after")
    assert sorted(item["id"] for item in found_before) == sorted(item["id"] for item in found_after)
    # Before: every batch wrote a file per month spanning the globe, so most February files are read.
    assert read_before > _files(repository, "before") // 3 // 2
    # After: the February files are stretches of the curve; only those over the AOI are read.
    february_after = _files(repository, "after") // 3
    assert read_after <= february_after // 2, (read_before, read_after, february_after)
    assert read_after < read_before / 3


def test_a_newest_first_search_stops_reading_once_no_file_can_beat_its_page(compacted: dict[str, Any]) -> None:
    repository = compacted["repository"]
    counting = _Counting(repository)
    counting.files = set()
    page = counting.engine.search(SearchRequest(sortby="-datetime", limit=10), ref="after")
    newest = sorted(compacted["items"], key=_when, reverse=True)[:10]
    assert [item["id"] for item in page.items] == [item["id"] for item in newest]
    assert page.next_token is not None
    # Only March files can hold the newest items: January and February files are never opened.
    assert 0 < len(counting.files) <= _files(repository, "after") // 3
    assert all("datetime_month=2024-03" in path for path in counting.files)


def test_sorted_paging_reads_further_only_as_pages_go_deeper(compacted: dict[str, Any]) -> None:
    counting = _Counting(compacted["repository"])
    request = SearchRequest(sortby="-datetime", limit=50)
    first = counting.engine.search(request, ref="after")
    first_files = set(counting.files)
    deep = first
    for _ in range(8):  # page 9 starts at row 400: the newest month has only 240 items
        deep = counting.engine.search(dataclasses.replace(request, token=deep.next_token), ref="after")
    assert len(counting.files) > len(first_files)
    expected = sorted(compacted["items"], key=_when, reverse=True)[400:450]
    assert [item["id"] for item in deep.items] == [item["id"] for item in expected]


def test_rows_tied_with_the_page_edge_in_unread_files_are_still_read(tmp_path: Path) -> None:
    """Equal datetimes across files: the tie-break (here by id) may pick rows from every one of them."""
    repository = Repository.create(tmp_path / "repo", Settings())
    for batch in range(4):
        writer = repository.writer()
        writer.add_items(
            [make_item(f"t-{i:02d}", when="2024-05-05T05:05:05Z") for i in range(40) if i % 4 == batch]
            + [make_item(f"old-{batch}-{i}", when="2024-05-01T00:00:00Z") for i in range(5)]
        )
        writer.commit(f"batch {batch}")
    page = SearchEngine(repository).search(SearchRequest(sortby="-datetime,id", limit=6))
    assert [item["id"] for item in page.items] == [f"t-{i:02d}" for i in range(6)]


@pytest.mark.parametrize(
    ("request_", "matches"),
    [
        (SearchRequest(limit=3), lambda item: True),
        (SearchRequest(collections=["north"], limit=3), lambda item: item["collection"] == "north"),
        (
            SearchRequest(datetime="2024-02-01T00:00:00Z/2024-03-31T23:59:59Z", sortby="-datetime", limit=3),
            lambda item: _when(item).month in {2, 3},
        ),
    ],
    ids=["everything", "one collection", "two whole months"],
)
def test_number_matched_comes_from_metadata_when_files_decide_it(
    compacted: dict[str, Any], request_: SearchRequest, matches: Callable[[dict], bool]
) -> None:
    counting = _Counting(compacted["repository"])
    for ref in ("before", "after"):
        counting.files = set()
        page = counting.engine.search(request_, ref=ref)
        assert page.number_matched == sum(1 for item in compacted["items"] if matches(item))
        assert len(page.items) == 3


@pytest.mark.parametrize(
    "request_",
    [
        SearchRequest(bbox=list(AOI)),
        SearchRequest(datetime="2024-02-10T00:00:00Z/2024-02-20T00:00:00Z"),
        SearchRequest(filter="eo:cloud_cover < 30", filter_lang="cql2-text"),
    ],
    ids=["bbox", "part of a month", "a property filter"],
)
def test_number_matched_is_left_out_when_rows_would_decide_it(
    compacted: dict[str, Any], request_: SearchRequest
) -> None:
    page = SearchEngine(compacted["repository"]).search(request_, ref="after")
    assert page.items and page.number_matched is None


def test_file_pruning_by_bbox_keeps_files_of_antimeridian_items(tmp_path: Path) -> None:
    """A file holding only an item across the antimeridian (xmin 170, xmax -170) reaches areas on either side."""
    repository = Repository.create(tmp_path / "repo", Settings())
    crossing = make_item("crossing")
    crossing["geometry"] = {
        "type": "MultiPolygon",
        "coordinates": [
            [[[170, 0], [180, 0], [180, 10], [170, 10], [170, 0]]],
            [[[-180, 0], [-170, 0], [-170, 10], [-180, 10], [-180, 0]]],
        ],
    }
    crossing["bbox"] = [170, 0, -170, 10]
    for batch in ([crossing], [make_item(f"plain-{i}") for i in range(5)]):
        writer = repository.writer()
        writer.add_items(batch)
        writer.commit("one file")
    engine = SearchEngine(repository)
    for bbox in ([175, 2, 179, 5], [-179, 2, -175, 5]):
        assert [item["id"] for item in engine.search(SearchRequest(bbox=bbox)).items] == ["crossing"]
    assert engine.search(SearchRequest(bbox=[100, 2, 120, 5])).items == []


@pytest.fixture(scope="module")
def small_groups(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """720 items compacted into files of up to 200 rows, written in row groups of 10 (2,048 in use)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(files_module, "ROW_GROUP_SIZE", 10)
        repository = Repository.create(
            tmp_path_factory.mktemp("groups") / "repo", Settings(optimize={"target_file_rows": 200})
        )
        items = [_item(n) for n in range(720)]
        for start in range(0, len(items), 90):
            writer = repository.writer()
            writer.add_items(items[start : start + 90])
            writer.commit(f"batch {start // 90}")
        repository.optimize()
    return {"repository": repository, "items": items}


def test_a_search_reads_only_the_row_groups_that_can_hold_its_rows(small_groups: dict[str, Any]) -> None:
    """An area search skips row groups whose bbox statistics miss it; a search by ids reads the ones named."""
    items = small_groups["items"]
    counting = _Counting(small_groups["repository"])

    found, _ = counting.all_pages(SearchRequest(bbox=list(AOI), limit=1000), "main")
    assert sorted(item["id"] for item in found) == sorted(item["id"] for item in items if _intersects(AOI)(item))
    in_files = sum(counting.engine.columns.layout(path).num_row_groups for path in counting.files)
    assert in_files >= 10 * len(counting.files)  # the files were written in row groups of 10
    assert len(counting.groups) < in_files / 2, (len(counting.groups), in_files)

    wanted = ["i-0003", "i-0400", "i-0719", "i-0500", "nope"]
    found, files_read = counting.all_pages(SearchRequest(ids=wanted), "main")
    assert sorted(item["id"] for item in found) == sorted(wanted[:4])
    assert len(counting.groups) <= 4 and files_read <= 4


def test_ids_in_row_groups_the_area_rules_out_are_not_mistaken_for_others(small_groups: dict[str, Any]) -> None:
    """Asked for a row in a group the area skips and for the first row of the next group: that row, once."""
    repository = small_groups["repository"]
    engine = SearchEngine(repository)
    view = repository.view()
    for task in view.table.scan().plan_files():
        path = task.file.file_path
        layout = engine.columns.layout(path)
        rows = engine.columns.read(path, ["id", "bbox"])
        for group in range(1, layout.num_row_groups):
            first = int(layout.starts[group])
            box = rows.column("bbox")[first].as_py()
            area = (box["xmin"], box["ymin"], box["xmax"], box["ymax"])
            reaching = layout.groups_reaching((shapely.box(*area),))
            if group - 1 in reaching:
                continue
            before, named = rows.column("id")[first - 1].as_py(), rows.column("id")[first].as_py()
            for request in (
                SearchRequest(ids=[before, named], bbox=list(area), limit=10),
                # Sorted and filtered searches test the named rows of the row groups they read.
                SearchRequest(ids=[before, named], bbox=list(area), sortby="-datetime", limit=10),
                SearchRequest(ids=[before, named], bbox=list(area), filter="eo:cloud_cover >= 0", limit=10),
            ):
                page = engine.search(request)
                assert [item["id"] for item in page.items] == [named], request
            return
    pytest.fail("no row group next to one the area rules out: the fixture no longer tests this")
