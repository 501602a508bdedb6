"""A metadata-only ingest of a large STAC API search has its page reader lay out the items it would accept as rows:
the same export, rejections (by the item's place in the search) and search counts as the reader sending items, and
as this process reading every page itself, awkward items included; in time lanes, an item two lanes may keep stays
an item (kept once); and a page's rows and items come in the page's order, collections before their items.

The API is a static one (tests/_http_server.py serving JSON pages on 127.0.0.1); the page reader's hand-over is
forced at the second page (``tests/pipeline/_static_api.py``), never left to timing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from ingest import Repository
from ingest.config import RemoteSettings
from ingest.pipeline import SearchParameters, SourceOptions, ingest_items
from ingest.pipeline.sources import _api, _api_reader
from ingest.pipeline.sources._api_walk import WalkedPage, lay_out_rows
from ingest.pipeline.sources._types import ItemDefaults
from ingest.stac import items_to_arrow
from tests.conftest import make_item, with_square
from tests.pipeline._compare import exported, rejections
from tests.pipeline._static_api import hand_over_at_the_second_page, lanes_api, static_collection, write_static_api
from tests.stac._geoparquet_cases import INVALID, awkward_items

PAGE = 7


def _features() -> list[Any]:
    """The awkward items twice over (unique ids), then what only a search holds among them: a feature that is not
    an object, an item naming no collection (``default_collection`` gives it one), an integer beyond 64 bits and
    an infinity (their pages travel pickled), a collection first seen half-way through a page, and a duplicate of
    an earlier item last."""
    features: list[Any] = []
    for copy in range(2):
        for item in awkward_items():
            item["id"] = f"{item['id']}-{copy}" if item["id"].startswith("item-") else item["id"]
            item["links"] = [{"rel": "self", "href": f"http://elsewhere/{item['id']}"}]
            features.append(item)
    plain = awkward_items()[0]
    features.append(42)
    features.append({key: value for key, value in {**plain, "id": "no-collection"}.items() if key != "collection"})
    features.append({**plain, "id": "huge-int", "properties": {**plain["properties"], "count": 2**70 + 1}})
    features.append({**plain, "id": "infinite", "properties": {**plain["properties"], "limit": math.inf}})
    for number in range(30):
        collection = "late" if number >= 10 else "c1"
        item = with_square(make_item(f"plain-{number}", collection), x=number % 20, y=number % 10, size=0.5)
        features.append(item)
    features.append({**features[-3], "properties": {"datetime": "2024-03-01T00:00:00Z"}})  # a duplicate id
    return features


def _static_api(server: Any, name: str, features: list[Any]) -> str:
    """A static STAC API of ``features``, PAGE a page, with a document for each collection they name."""
    base = f"{server.url}/{name}"
    write_static_api(server.folder / name, base, features, PAGE)
    return base


@pytest.fixture
def sent(monkeypatch) -> list[WalkedPage]:
    """The hand-over forced at the second page; every page the reader sent, loaded."""
    pages: list[WalkedPage] = []
    hand_over_at_the_second_page(monkeypatch, lambda _, page: pages.append(page.load()))
    return pages


def _ingested(root: Path, url: str, search: SearchParameters | None = None, lanes: int | None = None) -> tuple:
    repository = Repository.create(root)
    remote = RemoteSettings(search_lanes=lanes) if lanes is not None else None
    options = SourceOptions(search=search or SearchParameters(page_size=PAGE), remote=remote)
    report = ingest_items(repository, [url], options=options, default_collection="c-default")
    found = options.searches[0]
    counts = (found.complete, found.items, found.without_updated, found.newest_updated)
    collections = sorted(repository.collections("main"))
    return exported(repository), rejections(report), counts, report.rows_added, report.items_read, collections


@pytest.fixture
def laid_out_here(monkeypatch) -> list[int]:
    """Rows this process laid out itself, on pages the reader left to it, counted."""
    counted: list[int] = []
    lay_out_rows = _api.lay_out_rows

    def counting(page: WalkedPage, *args: Any, **kwargs: Any) -> None:
        lay_out_rows(page, *args, **kwargs)
        counted.append(len(page.row_at))

    monkeypatch.setattr(_api, "lay_out_rows", counting)
    return counted


def _row_ids(pages: list[WalkedPage]) -> list[str]:
    return [identifier for page in pages if page.rows is not None for identifier in page.rows.column("id").to_pylist()]


@pytest.mark.slow
def test_the_page_reader_sends_rows_the_ingest_takes_as_it_takes_items(http_server, tmp_path, sent, laid_out_here):
    url = _static_api(http_server, "awkward", _features())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_api_reader, "LAYOUT", "reader")  # the reader lays out every page
        as_rows = _ingested(tmp_path / "rows", url)
    row_ids = _row_ids(sent)
    left = [item for page in sent for item in page.items if item is not None]
    assert len(row_ids) > 40, "the reader sent no rows"
    assert "no-collection" in row_ids and "huge-int" in row_ids  # given the default collection; exactly
    assert 42 in left and {"bad/id", "item-lat-95-1"} <= {item["id"] for item in left if isinstance(item, dict)}
    assert not laid_out_here

    sent.clear()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_api_reader, "LAYOUT", "ingest")  # the reader leaves every page's layout to the ingest
        laid_out_by_ingest = _ingested(tmp_path / "ingest", url)
    assert sent and not _row_ids(sent) and not any(page.laid_out for page in sent)
    assert sum(laid_out_here) == len(row_ids)  # the same rows, laid out by this process

    sent.clear()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_api, "page_rows", lambda options: None)  # the reader sends every item as an item
        as_items = _ingested(tmp_path / "items", url)
    assert sent and all(page.rows is None for page in sent)
    sent.clear()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_api_reader, "HANDOFF_ITEMS", 10**9)  # no reader: every page read by this process
        alone = _ingested(tmp_path / "alone", url)
    assert not sent

    assert as_rows == laid_out_by_ingest
    assert as_rows == as_items == alone
    exports, rejected, counts, added, read, collections = as_rows
    rejected_ids = {item_id for _, item_id, _ in rejected}
    assert all(f"{name}-1" in rejected_ids if name.startswith("item-") else name in rejected_ids for name in INVALID)
    assert (f"{url}/search#{len(_features())}", "plain-27") in {(source, item_id) for source, item_id, _ in rejected}
    assert counts[0] and counts[1] == len(_features()) - 1  # every feature but the number counted
    assert "late" in collections and added == len(exports) and read == len(_features())
    by_id = {json.loads(text)["id"]: json.loads(text) for text in exports}
    assert by_id["huge-int"]["properties"]["count"] == 2**70 + 1
    assert by_id["infinite"]["properties"]["limit"] == math.inf
    assert by_id["no-collection"]["collection"] == "c-default"
    assert not any(link["rel"] == "self" for item in by_id.values() for link in item.get("links", []))


DAY = "2024-02-01T00:00:00Z/2024-02-02T00:00:00Z"


@pytest.mark.slow
def test_in_time_lanes_an_item_two_lanes_keep_stays_an_item_and_lands_once(http_server, tmp_path, sent):
    # The static API ignores each lane's interval: every lane reads the whole collection and keeps its own items.
    times = [f"2024-02-01T{hour:02d}:00:00Z" for hour in range(0, 24, 2)]
    items = [
        with_square(make_item(f"s-{n:02d}", "s", when=when), x=n, y=n % 5, size=0.5) for n, when in enumerate(times)
    ]
    odd = items[1]  # its datetime (02:00) outside its own range (09:00-10:00): two lanes keep it
    odd["properties"].update(start_datetime="2024-02-01T09:00:00Z", end_datetime="2024-02-01T10:00:00Z")
    url = lanes_api(http_server, "lanes", {"s": items})
    search = SearchParameters(collections=("s",), datetime=DAY, page_size=4)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_api_reader, "LAYOUT", "reader")
        as_rows = _ingested(tmp_path / "rows", url, search, lanes=3)
    assert any(page.rows is not None for page in sent)
    assert [item["id"] for page in sent for item in page.items if item is not None].count("s-01") >= 1
    assert not any("s-01" in page.rows.column("id").to_pylist() for page in sent if page.rows is not None)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_api, "page_rows", lambda options: None)
        as_items = _ingested(tmp_path / "items", url, search, lanes=3)
    assert as_rows == as_items
    exports, rejected, counts, *_ = as_rows
    assert not rejected and len(exports) == len(items) and counts[1] == len(items)  # the odd one once


def _page(ids: list[str], rows: list[int], collections: list[tuple[int, str]]) -> WalkedPage:
    items: list[Any] = [make_item(identifier, "c") for identifier in ids]
    table = items_to_arrow([items[index] for index in rows], in_order=True)
    for index in rows:
        items[index] = None
    marks = [(index, name, static_collection(name)) for index, name in collections]
    return WalkedPage(items, [False] * len(items), marks, rows=table, row_at=rows)


def test_a_pages_rows_and_items_come_in_its_order_collections_first(tmp_path):
    search = _api.ApiSearch("http://api", SearchParameters())
    page = _page(["a", "b", "c", "d", "e", "f"], rows=[0, 1, 3, 4], collections=[(0, "c"), (4, "late")])
    given = _api._page_items(page, search, set(), "http://api/search", 10, twice=None)
    out: list[tuple[str, Any]] = []
    try:
        while True:
            sourced = next(given)
            if sourced.rows is not None:
                out.append((sourced.source, (sourced.rows.table.column("id").to_pylist(), sourced.rows.sources)))
            else:
                out.append((sourced.source, sourced.collection["id"] if sourced.collection else sourced.item["id"]))
    except StopIteration as stop:
        last = stop.value
    assert last == 16
    assert out == [
        ("http://api/collections/c", "c"),
        ("http://api/search#11", (["a", "b"], ["http://api/search#11", "http://api/search#12"])),
        ("http://api/search#13", "c"),
        ("http://api/search#14", (["d"], ["http://api/search#14"])),
        ("http://api/collections/late", "late"),  # before its first item, so a run of rows ends there
        ("http://api/search#15", (["e"], ["http://api/search#15"])),
        ("http://api/search#16", "f"),
    ]


def test_a_page_whose_layout_fails_stays_items(monkeypatch):
    import ingest.stac

    items = [make_item(identifier, "c") for identifier in "abc"]
    page = WalkedPage(list(items), [True, True, True])

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("no layout")

    monkeypatch.setattr(ingest.stac, "items_to_arrow", failing)
    lay_out_rows(page, ItemDefaults(), windowed=False)
    assert page.rows is None and page.row_at == [] and page.items == items and page.laid_out
    monkeypatch.undo()
    lay_out_rows(page, ItemDefaults(), windowed=False)
    assert page.rows is not None and page.row_at == [0, 1, 2] and page.items == [None, None, None]


def test_the_reader_leaves_a_layout_to_the_ingest_only_while_the_ingest_waits_for_pages():
    import os

    read, write = os.pipe()
    with os.fdopen(write, "wb", buffering=0) as out, os.fdopen(read, "rb", buffering=0) as taken:
        assert _api_reader._ingest_waits(out)  # nothing sent is left in the pipe: the ingest took it all
        out.write(b"a page")
        assert not _api_reader._ingest_waits(out)  # a page not taken yet: the reader lays out the next itself
        assert taken.read(6) == b"a page"
        assert _api_reader._ingest_waits(out)
