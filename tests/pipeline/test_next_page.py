"""A search's next page is requested while the page before it decodes (``_api_pages.read_pages``), read off the
page's text; the decoded page's own next link decides which answer is used.

Why it is kept (issue 50): switched off inside the page reader too, in one run behind 20 ms a request, the
search read as one ingested 9,798 items/s without it against 11,193 with it, 1.14x (5 rounds; read by the ingest
alone, without the reader, it gained 1.00x). docs/benchmarks-history.md.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from pystac_client.exceptions import APIError

from ingest.pipeline.sources import _api_io, _api_pages

WAIT = 30.0
"""How long the decoding of the first page waits for the second page's request (it comes at once when the
feature works; the test fails, late, when it does not)."""


def _api(folder: Path, url: str, name: str, *, links_first: bool = False, indent: int | None = None) -> str:
    """Three search pages of two items under ``folder/name``; the first page's next link is written after its
    features (pretty-printed with ``indent``), or, with ``links_first``, before them, its last item carrying a
    ``next`` link of its own to the third page."""
    base = f"{url}/{name}"
    for number in range(3):
        features = [
            {"type": "Feature", "id": f"item-{number}-{index}", "properties": {}, "links": []} for index in range(2)
        ]
        links = [{"rel": "next", "href": f"{base}/{number + 1}.json", "method": "GET"}] if number < 2 else []
        page = {"type": "FeatureCollection", "features": features, "links": links}
        if number == 0 and links_first:
            features[-1]["links"] = [{"rel": "next", "href": f"{base}/2.json", "method": "GET"}]
            page = {"type": "FeatureCollection", "links": links, "features": features}
        path = folder / name / f"{number}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(page, indent=indent if number == 0 else None))
    return base


def _ids(pages: list) -> list[list[str]]:
    return [[feature["id"] for feature in page["features"]] for page, _, _ in pages]


class _Requests:
    """pystac-client's reader (floe's settings) on the real server, noting each page asked for; ``failing`` hrefs
    fail once."""

    def __init__(self, failing: tuple[str, ...] = ()) -> None:
        self.io = _api_io.session_io()
        self.asked: list[str] = []
        self.failing = set(failing)
        self.second = threading.Event()

    def request(self, href: str, **kwargs):
        self.asked.append(href.rsplit("/", 1)[-1])
        if href.endswith("/1.json"):
            self.second.set()
        if href in self.failing:
            self.failing.discard(href)
            raise APIError(f"{href}: refused once")
        return self.io.request(href, **kwargs)


def test_the_next_page_is_requested_while_this_one_decodes(http_server, monkeypatch):
    base = _api(http_server.folder, http_server.url, "overlap", indent=2)
    requests = _Requests()
    decode = _api_pages.read_json_noting_parser
    waited: list[bool] = []

    def decoding(text: str):
        if '"item-0-0"' in text:  # the first page decodes only once the second has been asked for
            waited.append(requests.second.wait(WAIT))
        return decode(text)

    monkeypatch.setattr(_api_pages, "read_json_noting_parser", decoding)
    pages = list(_api_pages.read_pages(requests, _api_pages.PageRequest(f"{base}/0.json")))
    assert waited == [True]
    assert _ids(pages) == [["item-0-0", "item-0-1"], ["item-1-0", "item-1-1"], ["item-2-0", "item-2-1"]]
    assert requests.asked == ["0.json", "1.json", "2.json"]  # each page once


def test_a_wrong_guess_is_dropped_and_the_page_s_own_link_followed(http_server):
    # The page's links come first, so the last "links" in its text is an item's, whose next link names page 2.
    base = _api(http_server.folder, http_server.url, "links-first", links_first=True)
    text = (http_server.folder / "links-first" / "0.json").read_text()
    first = _api_pages.PageRequest(f"{base}/0.json")
    guess = _api_pages.guessed_following(text, first)
    assert guess is not None and guess.href == f"{base}/2.json"

    requests = _Requests()
    pages = list(_api_pages.read_pages(requests, first))
    assert _ids(pages) == [["item-0-0", "item-0-1"], ["item-1-0", "item-1-1"], ["item-2-0", "item-2-1"]]
    assert requests.asked.count("1.json") == 1


def test_an_early_request_that_failed_is_made_again(http_server):
    base = _api(http_server.folder, http_server.url, "fails-once")
    requests = _Requests(failing=(f"{base}/1.json",))
    pages = list(_api_pages.read_pages(requests, _api_pages.PageRequest(f"{base}/0.json")))
    assert _ids(pages)[1] == ["item-1-0", "item-1-1"]
    assert requests.asked.count("1.json") == 2  # the early one, refused; then in turn
