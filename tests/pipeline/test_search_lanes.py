"""A STAC API search is read in lanes, several at once: one search per collection where it names several, one per
interval of its datetime interval where it names one collection.

The API is mostly a static one (tests/_http_server.py: a folder of JSON pages on
127.0.0.1, where a search naming one collection answers from that collection's
folder), so that its search link can sit behind the server's ``__together__``
gate: the first page of each collection is answered only once two such
requests wait at the same time. A client that read the collections one after
another would get a 409 there, never the items; nothing is timed. One test
reads a real ``floe serve``.

Why lanes are kept (issue 50): behind an API 20 ms a request away, 3 lanes at once
read 12,933 items/s against 11,385 for the search read as one, 1.14x, in one run
of ``scripts/bench_remote.py --skip-rasters --api-delay-ms 20`` at a119912.
Planning about 3 lanes a reader (``LANES_PER_READ``) against one gave 0.92x and
0.98x there, on items spread evenly in time, and 0.98x and 0.96x on items crowded
into the year's end (``--crowded``, three collections and one): under the 10%
a mechanism must gain, so it was taken out: a lane is planned for each read at
once (docs/benchmarks-history.md).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ingest import Repository
from ingest._faults import ENVIRONMENT_VARIABLE
from ingest.config import RemoteSettings
from ingest.pipeline import SearchParameters, SourceOptions, ingest_items
from ingest.pipeline.sources import _api, _api_io, _api_lanes, _api_pages, _api_reader
from tests.api._servers import FloeServer
from tests.conftest import make_item, with_square
from tests.pipeline._static_api import hand_over_at_the_second_page, lanes_api, static_collection

PAGE = 4


def _features(collection: str, count: int) -> list:
    """``count`` valid items of ``collection``, each updated at its own minute and with a structural link."""
    features = []
    for number in range(count):
        item = make_item(f"{collection}-{number:03d}", collection, updated=f"2024-02-01T{number:02d}:00:00Z")
        item = with_square(item, x=-10 + number % 20, y=number % 10, size=0.5)
        item["links"] = [{"rel": "self", "href": f"http://elsewhere/{collection}/{number}"}]
        features.append(item)
    return features


def _ingest(
    tmp_path: Path, name: str, url: str, collections: tuple[str, ...], lanes: int | None = 3, when: str | None = None
):
    """Ingest the search of ``collections`` at ``url`` in ``lanes`` (None: as floe decides; the servers here are
    on a loopback address, where it reads a search as one)."""
    repository = Repository.create(tmp_path / name)
    remote = RemoteSettings(search_lanes=lanes)
    search = SearchParameters(collections=collections, datetime=when, page_size=PAGE)
    options = SourceOptions(search=search, remote=remote)
    report = ingest_items(repository, [url], options=options)
    items = {(item["collection"], item["id"]): item for item in repository.view("main").items()}
    return report, items, options.searches[0], repository


def _outcome(report, items, search) -> tuple:
    rejected = sorted((rejection.source, rejection.item_id, rejection.reason) for rejection in report.rejected)
    return rejected, items, (search.complete, search.items, search.without_updated, search.newest_updated)


def _lane_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith("floe-lane-") and thread.is_alive()]


def _wait_for_no_lane_threads() -> None:
    for _ in range(100):  # lane threads notice within a tenth of a second; bounded, not timed
        if not _lane_threads():
            return
        threading.Event().wait(0.1)
    assert not _lane_threads()


def test_the_collections_of_a_search_are_read_at_once(http_server, tmp_path):
    a, b = _features("a", 9), _features("b", 6)
    b[2]["properties"].pop("datetime")  # invalid: its rejection names b's search and the item's place in it
    url = lanes_api(http_server, "together", {"a": a, "b": b}, together=2)

    report, items, search, repository = _ingest(tmp_path, "read", url, ("a", "b"))

    # Each collection's first page is answered only while the other's is asked for too.
    assert search.complete, report.rejected
    assert set(items) == {("a", item["id"]) for item in a} | {("b", item["id"]) for item in b if item is not b[2]}
    assert [(rejection.source, rejection.item_id) for rejection in report.rejected] == [
        (f"{url}/search?collections=b#3", "b-002")
    ]
    assert not any(link.get("rel") == "self" for item in items.values() for link in item.get("links", []))
    assert set(repository.collections()) == {"a", "b"}
    assert (search.items, search.without_updated) == (15, 0)
    # The newest `updated` of either collection.
    assert repository.source_cursors("main") == {search.key: "2024-02-01T08:00:00Z"}


def test_lanes_are_read_by_as_many_threads_as_read_at_once_the_longest_first(http_server, tmp_path):
    # a holds 9 items (3 pages), b 5 (2), c 6 (2); each page says how many its search holds (numberMatched).
    collections = {"a": _features("a", 9), "b": _features("b", 5), "c": _features("c", 6)}
    url = lanes_api(http_server, "longest", collections)
    io = _api_io.session_io()

    def requests() -> dict[int, _api_pages.PageRequest]:
        return {
            number: _api_pages.PageRequest(f"{url}/search", "GET", None, {"collections": name, "limit": PAGE})
            for number, name in enumerate(collections)
        }

    _wait_for_no_lane_threads()  # none left by an earlier test
    # One thread: each lane's first page (which says its length), then always the lane with the most items left.
    # a has 5 left, c 2 and b 1: a; then c 2, a 1, b 1: c; then b (read least of the two with 1 left), then a.
    read = [(lane, len(page["features"])) for lane, page, _, _ in _api_pages.read_lanes(io, requests(), 1)]
    assert read == [(0, 4), (1, 4), (2, 4), (0, 4), (2, 2), (1, 1), (0, 1)]

    _wait_for_no_lane_threads()  # the one thread ends once it has no lane left to read
    # Two at once: two threads read the three lanes, each one request at a time.
    pages = _api_pages.read_lanes(io, requests(), 2)
    ids = {0: [], 1: [], 2: []}
    for number, (lane, page, _, _) in enumerate(pages):
        if number == 0:
            assert len(_lane_threads()) == 2
        ids[lane] += [feature["id"] for feature in page["features"]]
    assert ids == {lane: [item["id"] for item in items] for lane, items in enumerate(collections.values())}


def test_a_lane_whose_length_the_api_does_not_say_is_not_left_for_last():
    # floe serve, for one, counts a search only where that is cheap: lanes 1 and 2 never said how long they are.
    # Taken to be as long as the longest that did (lane 0, 10 left), the one read least goes first.
    request = _api_pages.PageRequest("https://example.com/search")
    threads = _api_pages._LaneThreads(None, {0: request, 1: request, 2: request}, 1)
    threads.started, threads.left, threads.read = {0, 1, 2}, {0: 10}, {0: 5000, 1: 5000, 2: 1000}
    assert threads._next() == (2, request)
    # Lane 1 now says 2 left: the lane that does not say (read most) still goes before it.
    threads = _api_pages._LaneThreads(None, {0: request, 1: request, 2: request}, 3)
    threads.started, threads.left, threads.read = {0, 1, 2}, {0: 10, 1: 2}, {0: 5000, 1: 1000, 2: 9000}
    assert [threads._next()[0] for _ in range(3)] == [0, 2, 1]


def test_lanes_not_started_count_toward_handing_a_large_search_to_the_page_reader():
    # Nine lanes, three read at once: each started lane says it holds 7,000 items and has read 1,000. The 18,000
    # left in those three are not enough for a page reader of its own (HANDOFF_ITEMS, 20,000), the six lanes not
    # started yet, taken to hold as many, are.
    request = _api_pages.PageRequest("https://example.com/search")
    page = {"features": [{}] * 1000, "numberMatched": 7000}

    def noted(count: int) -> _api_pages.Lanes:
        lanes = _api_pages.Lanes([request] * count, at_once=3)
        for lane in range(3):
            lanes.note(lane, page, request)
        return lanes

    assert _api_reader.HANDOFF_ITEMS == 20_000
    assert not noted(3).large(_api_reader.HANDOFF_ITEMS)
    assert noted(9).large(_api_reader.HANDOFF_ITEMS)


@pytest.mark.slow
def test_a_search_in_lanes_ingests_what_one_search_ingests_from_floe_serve(tmp_path):
    source = Repository.create(tmp_path / "a")
    documents = [static_collection(name) for name in "cde"]
    items = [item for name, count in zip("cde", (23, 9, 14), strict=True) for item in _features(name, count)]
    (tmp_path / "a.ndjson").write_text("\n".join(json.dumps(document) for document in [*documents, *items]) + "\n")
    assert not ingest_items(source, [tmp_path / "a.ndjson"]).rejected
    server = FloeServer(tmp_path / "a", log_dir=tmp_path)
    try:
        in_lanes = _ingest(tmp_path, "lanes", server.url, ("c", "d", "e"))
        as_one = _ingest(tmp_path, "one", server.url, ("c", "d", "e"), lanes=1)
    finally:
        server.stop()
    expected = {
        (item["collection"], item["id"]): item | {"links": []}  # its API's links are the API's, not the item's
        for item in source.view("main").items()
    }
    assert in_lanes[1] == as_one[1] == expected
    assert _outcome(*in_lanes[:3]) == _outcome(*as_one[:3])
    assert in_lanes[2].cursor() == as_one[2].cursor() is not None


@pytest.fixture
def handed_over(monkeypatch):
    """Forces the page reader to take over at the second page; notes the lane of each page it sent."""
    sent: list[int] = []
    hand_over_at_the_second_page(monkeypatch, lambda lane, _: sent.append(lane))
    return sent


def _collections_of_three() -> dict[str, list]:
    collections = {"a": _features("a", 14), "b": _features("b", 11), "c": _features("c", 7)}
    collections["a"][5]["geometry"]["coordinates"][0][1][1] = 95.0  # a latitude out of range
    collections["c"][6] = 42  # not an item
    return collections


def _read_here(tmp_path: Path, name: str, url: str):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_api_reader, "HANDOFF_ITEMS", 10**9)
        return _outcome(*_ingest(tmp_path, name, url, ("a", "b", "c"))[:3])


@pytest.mark.slow
def test_the_page_reader_reads_lanes_with_the_outcome_of_this_process(http_server, tmp_path, handed_over):
    url = lanes_api(http_server, "handed", _collections_of_three())
    alone = _read_here(tmp_path, "alone", url)
    assert not handed_over
    read = _outcome(*_ingest(tmp_path, "read", url, ("a", "b", "c"))[:3])
    assert read == alone
    assert set(handed_over) == {0, 1, 2}  # the reader sent pages of every lane
    rejected, items, counts = read
    assert counts[0] is True and len(items) == 32 - 2
    assert {source for source, _, _ in rejected} == {
        f"{url}/search?collections=a#6",  # a-005, its latitude out of range
        f"{url}/search?collections=c#7",  # 42
    }


@pytest.mark.slow
def test_a_reader_that_dies_leaves_each_lane_to_this_process(http_server, tmp_path, handed_over, caplog):
    url = lanes_api(http_server, "dies", _collections_of_three())
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ENVIRONMENT_VARIABLE, "reader.after_page:2")  # the reader dies after its second page
        read = _outcome(*_ingest(tmp_path, "dies", url, ("a", "b", "c"))[:3])
    assert len(handed_over) == 2
    assert "the page reader stopped" in caplog.text
    assert read == _read_here(tmp_path, "alone", url)  # every lane went on here from where the reader left it


def test_the_page_reader_reads_its_lanes_at_once(http_server):
    url = lanes_api(http_server, "reader-together", {"a": _features("a", 6), "b": _features("b", 5)}, together=2)
    search = f"{http_server.url}/__together__/2/reader-together/search"
    lanes = _api_pages.Lanes(
        [_api_pages.PageRequest(search, "POST", None, {"collections": [name], "limit": PAGE}) for name in "ab"],
        at_once=2,
    )
    reader = _api_reader.PageReader.start()
    assert reader is not None
    try:
        assert reader.ready(wait=True)
        pages = [(lane, page.load()) for lane, page in reader.read_from(url, lanes)]
    finally:
        reader.close()
    ids = {lane: [item["id"] for number, page in pages if number == lane for item in page.items] for lane in (0, 1)}
    assert ids == {0: [f"a-{n:03d}" for n in range(6)], 1: [f"b-{n:03d}" for n in range(5)]}
    assert lanes.requests == [None, None]


def test_a_lane_that_fails_fails_the_search_and_no_lane_reads_on(http_server, tmp_path):
    collections = {"a": _features("a", 40), "b": _features("b", 9)}
    url = lanes_api(http_server, "failing", collections, broken="b")
    report, items, search, repository = _ingest(tmp_path, "failed", url, ("a", "b"))

    assert not search.complete
    failed = [rejection.reason for rejection in report.rejected if rejection.source == f"{url}/search"]
    assert len(failed) == 1 and failed[0].startswith("search failed after") and "404" in failed[0]
    assert {key for key in items if key[0] == "b"} == {("b", f"b-{n:03d}") for n in range(PAGE)}
    assert not repository.source_cursors("main")
    _wait_for_no_lane_threads()


# -- one collection, in intervals of time --------------------------------------------------------------------------

DAY = "2024-02-01T00:00:00Z/2024-02-02T00:00:00Z"
"""Read in 3 lanes: until 08:00, from 08:00 to 16:00, from 16:00 (each lane's interval shares its bounds)."""


def _timed(collection: str) -> list:
    """Items of one day: one every 90 minutes, one exactly at each bound of the lanes, and two whose time range
    spans a bound (one without a ``datetime``)."""
    times = [f"2024-02-01T{number * 3 // 2:02d}:{number % 2 * 30:02d}:00Z" for number in range(16)]
    items = [make_item(f"{collection}-{number:02d}", collection, when=when) for number, when in enumerate(times)]
    bounds = ["2024-02-01T08:00:00Z", "2024-02-01T16:00:00Z"]
    items += [make_item(f"{collection}-at-{when[11:13]}", collection, when=when) for when in bounds]
    spanning = make_item(f"{collection}-span", collection, when="2024-02-01T07:00:00Z")
    spanning["properties"].update(start_datetime="2024-02-01T06:00:00Z", end_datetime="2024-02-01T17:00:00Z")
    ranged = make_item(f"{collection}-range", collection)
    ranged["properties"].update(datetime=None, start_datetime="2024-02-01T15:00:00Z")
    ranged["properties"]["end_datetime"] = "2024-02-01T21:00:00Z"
    items += [spanning, ranged]
    return [with_square(item, x=number % 20, y=number % 10, size=0.5) for number, item in enumerate(items)]


@pytest.mark.slow
def test_one_collection_is_read_in_intervals_of_time_from_floe_serve(tmp_path):
    source = Repository.create(tmp_path / "a")
    items = _timed("t")
    (tmp_path / "a.ndjson").write_text("\n".join(json.dumps(item) for item in [static_collection("t"), *items]) + "\n")
    assert not ingest_items(source, [tmp_path / "a.ndjson"]).rejected
    server = FloeServer(tmp_path / "a", log_dir=tmp_path)
    try:
        in_lanes = _ingest(tmp_path, "lanes", server.url, ("t",), when=DAY)
        as_one = _ingest(tmp_path, "one", server.url, ("t",), when=DAY, lanes=1)
        whole = _ingest(tmp_path, "whole", server.url, ("t",))  # from the collection's first date to now
    finally:
        server.stop()
    expected = {(item["collection"], item["id"]): item | {"links": []} for item in source.view("main").items()}
    assert len(expected) == 20
    assert in_lanes[1] == as_one[1] == whole[1] == expected
    assert _outcome(*in_lanes[:3]) == _outcome(*as_one[:3])  # nothing twice: no duplicate among the rejections
    assert in_lanes[2].note is None and whole[2].note is None  # floe serve filters by datetime: nothing to say
    root = server.url.rstrip("/")
    # Three lanes at once, as many planned: the day in thirds, the newest first.
    cuts = ["08:00", "16:00"]
    bounds = ["2024-02-01T00:00:00Z", *(f"2024-02-01T{cut}:00Z" for cut in cuts), "2024-02-02T00:00:00Z"]
    thirds = [f"{root}/search?datetime={a}/{b}" for a, b in itertools.pairwise(bounds)]
    assert in_lanes[2].lanes_read == thirds[::-1]
    assert as_one[2].lanes_read == []
    # Without an interval, the collection's extent (the API's: 00:00 to 22:30, its items' times) in thirds, the
    # first and last lanes open-ended.
    cuts = ["07:30", "15:00"]
    bounds = ["..", *(f"2024-02-01T{cut}:00Z" for cut in cuts), ".."]
    thirds = [f"{root}/search?datetime={a}/{b}" for a, b in itertools.pairwise(bounds)]
    assert whole[2].lanes_read == thirds[::-1]


def test_time_lanes_keep_each_item_once_from_an_api_that_ignores_the_interval(http_server, tmp_path):
    # The static API answers every lane with the whole collection (it reads no datetime), behind a gate that opens
    # for three requests at once: the lanes read at once, and each keeps only the items whose time is its own.
    items = _timed("s")
    odd = items[0]  # its datetime (00:00) outside its own range (09:00-10:00): two lanes keep it, it lands once
    odd["properties"].update(start_datetime="2024-02-01T09:00:00Z", end_datetime="2024-02-01T10:00:00Z")
    url = lanes_api(http_server, "ignores", {"s": items}, together=3)
    report, stored, search, _ = _ingest(tmp_path, "kept", url, ("s",), when=DAY)
    assert search.complete and not report.rejected  # no duplicate id
    assert set(stored) == {("s", item["id"]) for item in items}
    assert search.items == len(items)  # the odd one counted once
    assert len(search.lanes_read) == 3
    # Said once, for the operator: the API reads no datetime, so each lane read the whole collection.
    assert search.note == (
        f"{url} does not filter by datetime: each of the 3 time lanes read its whole search and kept its own items "
        "(nothing is missed or doubled, but each item was read once a lane); remote.search_lanes = 1 "
        "(FLOE_REMOTE__SEARCH_LANES=1) reads this API as one search"
    )


def test_each_collection_is_read_in_intervals_of_time_so_more_lanes_read_at_once(http_server, tmp_path):
    # Two collections, four lanes at once: each collection is split into two intervals of the day (a lane planned
    # for each read at once). Behind a gate that answers first pages only four at a time, the two
    # collections are read by four lanes at once; one search per collection would get a 409. The static API
    # ignores the interval, so each lane keeps its own items.
    a, b = _timed("a"), _timed("b")
    b[5]["properties"].pop("datetime")  # no time at all: the first lane of b keeps it, and it is rejected once
    url = lanes_api(http_server, "split", {"a": a, "b": b}, together=4)
    report, stored, search, _ = _ingest(tmp_path, "split", url, ("a", "b"), lanes=4, when=DAY)

    assert search.complete, report.rejected
    assert set(stored) == {("a", item["id"]) for item in a} | {("b", item["id"]) for item in b if item is not b[5]}
    assert search.items == len(a) + len(b)
    bounds = ["2024-02-01T00:00:00Z", "2024-02-01T12:00:00Z"]
    bounds.append("2024-02-02T00:00:00Z")
    # The newest intervals first, the collections taking turns.
    assert search.lanes_read == [
        f"{url}/search?collections={collection}&datetime={start}/{end}"
        for start, end in reversed(list(itertools.pairwise(bounds)))
        for collection in "ab"
    ]
    # b's first lane (00:00-12:00) kept b-00 to b-04, then the timeless b-05: its sixth.
    assert [(rejection.source, rejection.item_id) for rejection in report.rejected] == [
        (f"{url}/search?collections=b&datetime=2024-02-01T00:00:00Z/2024-02-01T12:00:00Z#6", "b-05")
    ]


@pytest.mark.slow
def test_a_search_of_the_whole_api_is_read_in_intervals_of_its_datetime(http_server, tmp_path):
    # No collection named: the search's own interval in thirds, three at once (the gate answers first pages only
    # three at a time); the static API ignores the interval, and each lane keeps its own.
    a, b = _timed("a"), _timed("b")
    url = lanes_api(http_server, "whole", {"a": a, "b": b}, together=3)
    report, stored, search, _ = _ingest(tmp_path, "whole", url, (), when=DAY)
    assert search.complete and not report.rejected
    assert set(stored) == {(item["collection"], item["id"]) for item in a + b}
    assert search.items == len(a) + len(b)
    assert len(search.lanes_read) == 3
    assert search.lanes_read[0] == f"{url}/search?datetime=2024-02-01T16:00:00Z/2024-02-02T00:00:00Z"
    # Without a start there is nothing to split (no collection's extent to ask): one search.
    ungated = lanes_api(http_server, "whole-open", {"a": a, "b": b})
    _, stored, search, _ = _ingest(tmp_path, "open", ungated, (), when="../2024-02-02")
    assert search.lanes_read == [] and set(stored) == {(item["collection"], item["id"]) for item in a + b}


def test_a_search_is_planned_as_a_lane_for_each_read_at_once():
    asked: list[str] = []

    class Extents:
        """The collections' documents: ``none`` has no temporal extent, the others a day (open for ``open``)."""

        def read_json(self, url: str) -> dict:
            asked.append(url.rsplit("/", 1)[1])
            interval = {"none": [None, None], "open": ["2024-02-01T00:00:00Z", None]}
            day = ["2024-02-01T00:00:00Z", "2024-02-02T00:00:00Z"]
            return {"type": "Collection", "extent": {"temporal": {"interval": [interval.get(asked[-1], day)]}}}

    start, now = _api_lanes.parse_datetime("2024-02-01T00:00:00Z"), datetime.now(UTC)

    def plan(collections: tuple[str, ...], at_once: int = 3) -> list[_api_lanes.Lane]:
        search = _api.ApiSearch("https://example.com", SearchParameters(collections), lanes=at_once)
        return _api_lanes.plan_lanes(search, Extents(), None)

    one = plan(("c",))  # the newest first
    assert len(one) == 3 and all(lane.collections is None for lane in one)
    assert one[0].interval == "2024-02-01T16:00:00Z/.." and one[-1].interval == "../2024-02-01T08:00:00Z"
    assert [lane.window for lane in one] == sorted((lane.window for lane in one), key=lambda w: w[0] or start)[::-1]
    two = plan(("c", "d"))  # 3 lanes wanted, 2 intervals each, taking turns
    assert [lane.collections for lane in two] == [["c"], ["d"]] * 2
    assert two[2].interval == two[3].interval == "../2024-02-01T12:00:00Z"
    # A collection without an extent is read as one lane; the others are still split.
    mixed = plan(("none", "c"))
    assert [(lane.collections, lane.interval) for lane in mixed[:2]] == [
        (["none"], None),
        (["c"], "2024-02-01T12:00:00Z/.."),
    ]
    assert len(mixed) == 3
    open_ended = plan(("open",), at_once=2)  # its extent runs to now: two intervals of that
    first_cut = _api_lanes.parse_datetime(open_ended[-1].interval.removeprefix("../"))
    assert len(open_ended) == 2 and abs(first_cut - start - (now - start) / 2) < timedelta(minutes=1)
    asked.clear()
    many = plan(tuple("abcdefghi"))  # nine collections: a lane each, no extent asked for
    assert [lane.collections for lane in many] == [[name] for name in "abcdefghi"] and not asked
    assert plan(("c",), at_once=1) == [_api_lanes.Lane()]


@pytest.mark.slow
def test_the_page_reader_keeps_what_each_time_lane_keeps(http_server, tmp_path, handed_over, monkeypatch):
    url = lanes_api(http_server, "reader-time", {"s": _timed("s")})
    flagged: list[bool] = []  # each page the reader sent: whether it held items outside its lane's interval
    hand_over_at_the_second_page(monkeypatch, lambda _, page: flagged.append(page.load().outside))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_api_reader, "HANDOFF_ITEMS", 10**9)
        alone = _ingest(tmp_path, "alone", url, ("s",), when=DAY)
    read = _ingest(tmp_path, "read", url, ("s",), when=DAY)
    assert set(handed_over) == set(range(3))
    assert _outcome(*read[:3]) == _outcome(*alone[:3])
    assert not read[0].rejected and len(read[1]) == 20
    # The static API ignores datetime, which the pages the reader walked say as this process's do.
    assert any(flagged) and len(flagged) == len(handed_over)
    assert read[2].note == alone[2].note and "does not filter by datetime" in (read[2].note or "")


def test_an_item_belongs_to_the_lane_its_instant_falls_in():
    def at(when: str | None, start: str | None = None) -> dict:
        return {"properties": {"datetime": when, **({"start_datetime": start} if start else {})}}

    bound = _api_lanes.parse_datetime("2024-02-01T08:00:00Z")
    before, after = (None, bound), (bound, None)
    assert _api_lanes.owned(at("2024-02-01T07:59:59.999999Z"), before)
    assert not _api_lanes.owned(at("2024-02-01T08:00:00Z"), before)  # a bound is the later lane's
    assert _api_lanes.owned(at("2024-02-01T08:00:00Z"), after)
    assert _api_lanes.owned(at("2024-02-01T10:00:00Z", start="2024-02-01T01:00:00Z"), after)  # datetime first
    assert _api_lanes.owned(at(None, start="2024-02-01T01:00:00Z"), before)  # else its start
    assert not _api_lanes.owned(at(None, start="2024-02-01T01:00:00Z"), after)
    # Refused later, once: the first lane keeps it (an API that ignores times gives it to every lane).
    assert _api_lanes.owned(at("not a time"), before) and not _api_lanes.owned(at("not a time"), after)
    assert _api_lanes.owned({"properties": {}}, before) and not _api_lanes.owned({"properties": {}}, after)
    # A datetime outside its own range: its start's lane keeps it too (an API matching ranges alone finds it there).
    odd = at("2024-02-01T10:00:00Z", start="2024-02-01T01:00:00Z")
    odd["properties"]["end_datetime"] = "2024-02-01T02:00:00Z"
    assert _api_lanes.irregular(odd) and _api_lanes.owned(odd, before) and _api_lanes.owned(odd, after)
    inside = at("2024-02-01T01:30:00Z", start="2024-02-01T01:00:00Z")
    inside["properties"]["end_datetime"] = "2024-02-01T09:00:00Z"
    assert not _api_lanes.irregular(inside) and not _api_lanes.owned(inside, after)


def test_an_item_whose_time_misses_its_lane_says_the_api_ignored_the_interval():
    def at(when: str | None, start: str | None = None, end: str | None = None) -> dict:
        properties = {"datetime": when, "start_datetime": start, "end_datetime": end}
        return {"properties": {key: value for key, value in properties.items() if value}}

    low, high = _api_lanes.parse_datetime("2024-02-01T08:00:00Z"), _api_lanes.parse_datetime("2024-02-01T16:00:00Z")
    window = (low, high)
    assert _api_lanes.outside(at("2024-02-01T07:59:59Z"), window)
    assert _api_lanes.outside(at("2024-02-01T16:00:01Z"), window)
    assert not _api_lanes.outside(at("2024-02-01T08:00:00Z"), window)  # bounds match (a later lane keeps it)
    assert not _api_lanes.outside(at("2024-02-01T16:00:00Z"), window)
    # A range that reaches into the window matches it, whichever lane keeps the item.
    assert not _api_lanes.outside(at("2024-02-01T01:00:00Z", "2024-02-01T01:00:00Z", "2024-02-01T09:00:00Z"), window)
    assert _api_lanes.outside(at(None, "2024-02-01T01:00:00Z", "2024-02-01T02:00:00Z"), window)
    assert not _api_lanes.outside(at("not a time"), window) and not _api_lanes.outside({"properties": {}}, window)
    assert _api_lanes.outside(at("2024-02-01T07:00:00Z"), (None, low)) is False
    assert _api_lanes.outside(at("2024-02-01T07:00:00Z"), (high, None))


def test_an_api_on_this_machine_is_read_as_one_search_unless_the_settings_say(http_server, tmp_path):
    url = lanes_api(http_server, "local", {"a": _features("a", 5), "b": _features("b", 3)})
    report, items, search, _ = _ingest(tmp_path, "auto", url, ("a", "b"), lanes=None)
    assert search.complete and not report.rejected and len(items) == 8
    assert search.lanes_read == []  # 127.0.0.1: its pages are made on this machine's cores

    def lanes(root: str, setting: int | None = None) -> int:
        search = _api.ApiSearch(root, SearchParameters(collections=("a", "b")), lanes=setting)
        return _api_lanes.lanes_for(search)

    assert lanes("http://localhost:8080/stac") == lanes("http://[::1]/stac") == lanes("http://127.0.0.2") == 1
    assert lanes("https://planetarycomputer.microsoft.com/api/stac/v1") == _api_lanes.SEARCH_LANES == 3
    assert lanes("http://10.0.0.5/stac") == 3  # another machine of the network
    assert lanes("http://127.0.0.1:9000", setting=3) == 3 and lanes("https://example.com", setting=1) == 1
    planned = _api_lanes.plan_lanes(_api.ApiSearch("https://example.com", SearchParameters(("a", "b"))), None, None)
    assert [lane.collections for lane in planned] == [["a"], ["b"]]


@pytest.mark.slow
def test_floe_ingest_reads_in_the_lanes_its_settings_say(http_server, tmp_path):
    # The CLI's default pipeline (its driver reads the search) takes remote.search_lanes from the environment, and
    # says how the search was read. The API's first pages are answered only to two requests at once.
    url = lanes_api(http_server, "cli", {"a": _features("a", 7), "b": _features("b", 5)}, together=2)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "FLOE_REMOTE__SEARCH_LANES": "3"}
    command = [sys.executable, "-m", "ingest.cli", "--root", str(tmp_path / "r"), "ingest", url, "--collections", "a,b"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "12 items in 2 lanes, read to its end" in " ".join(done.stderr.split())
    assert len(list(Repository.open(tmp_path / "r").view("main").items())) == 12


@pytest.mark.slow
def test_floe_ingest_says_when_an_api_ignores_the_time_lanes_interval(http_server, tmp_path):
    # The static API answers every time lane with the whole collection: the run ingests each item once and says,
    # after its summary line, why the search cost a read of the collection per lane and what to set.
    items = _timed("s")
    url = lanes_api(http_server, "cli-unfiltered", {"s": items})
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "FLOE_REMOTE__SEARCH_LANES": "3"}
    command = [sys.executable, "-m", "ingest.cli", "--root", str(tmp_path / "r"), "ingest", url, "--collections", "s"]
    command += ["--datetime", DAY]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False, timeout=300)
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stderr.split())
    assert f"{len(items)} items in 3 lanes, read to its end" in said
    assert f"note {url} does not filter by datetime: each of the 3 time lanes read its whole search" in said
    assert "FLOE_REMOTE__SEARCH_LANES=1" in said
    assert len(list(Repository.open(tmp_path / "r").view("main").items())) == len(items)
