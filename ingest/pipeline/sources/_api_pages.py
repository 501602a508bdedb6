"""A STAC API search's pages: each page's request, and the lanes they come in, read several at once.

A search is paged as the STAC API item search says: each page's ``next`` link
(its ``href``, ``method``, ``headers`` and ``body``; a POST body merged into
the first request's where the link says ``merge``) makes the next request, and
a page without items, or without a next link, is the last. Paging is serial:
one page's answer names the next. A search is therefore read in lanes
(:class:`Lanes`; one search per collection, or per interval of time, as
:func:`~._api_lanes.plan_lanes` says), several at once
(:func:`read_lanes`): the API makes a page of each while the others travel
and decode. Pages are read on a thread ahead of the ingest
(:func:`~ingest.pipeline._ahead.prefetched`); a large search is handed to a page reader, a process of
its own (``_api_reader.py``), at the page each lane has reached.
"""

from __future__ import annotations

import functools
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ingest._threads import on_daemon_thread
from ingest.errors import InvalidSource
from ingest.stac import read_json_noting_parser

if TYPE_CHECKING:
    from concurrent.futures import Future

PAGES_AHEAD = 4
"""Pages fetched on a background thread while the ingest commits the ones before (network and commits overlap)."""

LANE_PAGES_AHEAD = 2
"""Pages each lane of a search read in lanes may hold ahead of the ingest (and one more in flight)."""


@dataclass(frozen=True)
class PageRequest:
    """One page's request: the search's first, or one its previous page's ``next`` link makes (STAC API item
    search: a link's ``method``, ``headers`` and ``body``; a POST body is merged into the first request's
    where the link says ``merge``)."""

    href: str
    method: str = "GET"
    headers: dict[str, str] | None = None
    parameters: dict[str, Any] | None = None
    first: dict[str, Any] | None = None
    """The first request's parameters (what a ``merge`` link's body is merged into); None: this is the first."""

    def following(self, page: Mapping[str, Any]) -> PageRequest | None:
        """The request for the page after ``page``; None when ``page`` is the last (no items, or no next link)."""
        if not page.get("features"):
            return None
        links = page.get("links")
        link = (
            next(
                (link for link in links if isinstance(link, dict) and link.get("rel") == "next"),
                None,
            )
            if isinstance(links, list)
            else None
        )
        if link is None or not isinstance(link.get("href"), str):
            return None
        first: dict[str, Any] = (self.parameters or {}) if self.first is None else self.first
        method = str(link.get("method") or "GET").upper()
        body: dict[str, Any] = link["body"] if isinstance(link.get("body"), dict) else {}
        parameters = ({**first, **body} if link.get("merge") else body) if method == "POST" else {}
        headers = link.get("headers") if isinstance(link.get("headers"), dict) else None
        return PageRequest(link["href"], method, headers, parameters, first)


@dataclass
class Lanes:
    """A search's lanes: the request of each one's next page (None once its last page is read), and how many are
    read at once. One lane is the search as it was asked; others together read what it would
    (:func:`~._api_lanes.plan_lanes`)."""

    requests: list[PageRequest | None]
    at_once: int = 1
    read: list[int] = field(default_factory=list)
    """Items read in each lane so far."""
    matched: dict[int, int] = field(default_factory=dict)
    """Each lane's ``numberMatched``, where its pages say it."""
    windows: dict[int, Any] = field(default_factory=dict)
    """The items each time lane keeps (:func:`~ingest.pipeline._lanes.owned`), by lane."""

    def __post_init__(self) -> None:
        self.read = self.read or [0] * len(self.requests)

    def open(self) -> dict[int, PageRequest]:
        """The lanes with pages still to read, by number, with the request of each one's next page."""
        return {lane: request for lane, request in enumerate(self.requests) if request is not None}

    def note(self, lane: int, page: Mapping[str, Any], following: PageRequest | None) -> None:
        """``page`` of ``lane`` was read, and ``following`` is the request after it."""
        self.read[lane] += len(page.get("features") or ())
        matched = page.get("numberMatched")
        if isinstance(matched, int) and not isinstance(matched, bool):
            self.matched[lane] = matched
        self.requests[lane] = following

    def large(self, items: int) -> bool:
        """Whether the search has ``items`` still to read, as its lanes' ``numberMatched`` say, a lane
        not started yet taken to hold as many as those that said on average (or, where none says, whether it has
        read that many already)."""
        if self.matched:
            remaining = sum(
                max(matched - self.read[lane], 0)
                for lane, matched in self.matched.items()
                if self.requests[lane] is not None
            )
            unstarted = sum(
                1
                for lane, request in enumerate(self.requests)
                if request is not None and lane not in self.matched and not self.read[lane]
            )
            remaining += unstarted * sum(self.matched.values()) // len(self.matched)
            return remaining >= items
        return sum(self.read) >= items


def _fetch(io: Any, request: PageRequest) -> str:
    text: str = io.request(request.href, method=request.method, headers=request.headers, parameters=request.parameters)
    return text


def _decoded(text: str, request: PageRequest) -> tuple[dict[str, Any], PageRequest | None, bool]:
    page, by_orjson = read_json_noting_parser(text)
    if not isinstance(page, dict):
        raise InvalidSource(f"{request.href}: a search page is not a JSON object")
    return page, request.following(page), by_orjson


def read_pages(
    io: Any, first: PageRequest, *, ahead: bool = True
) -> Generator[tuple[dict[str, Any], PageRequest | None, bool]]:
    """Each page from ``first`` to the search's last, decoded, with the request for the page after it and whether
    orjson decoded it (:func:`~ingest.stac.read_json_noting_parser`: then orjson writes it back exactly). With
    ``ahead``, each page's successor is requested while the page decodes, so the API makes one page while this
    process decodes the one before (lanes read at once need no such help).

    Paging is serial (a page's next link makes the next request), and decoding a large page takes a fifth to a
    third as long as the API takes to make it (5-9 ms against 33 for 1,000 items of ``floe serve``). So the
    next link is read off the page's text first (:func:`guessed_following`, a few hundred bytes), and that
    request goes out on a thread of its own. The decoded page's own next link decides: when it is another
    request (a page laid out otherwise), the early answer is dropped and the right request made; an early
    request that failed is made again, so its errors and retries are those of a request made in turn.
    """
    early: tuple[PageRequest, Future[str]] | None = None
    request: PageRequest | None = first
    while request is not None:
        text = None
        if early is not None and early[0] == request and early[1].exception() is None:
            text = early[1].result()
        early = None
        if text is None:
            text = _fetch(io, request)
        guess = guessed_following(text, request) if ahead else None
        if guess is not None:
            early = (guess, on_daemon_thread(functools.partial(_fetch, io, guess), name="floe-next-page"))
        page, following, by_orjson = _decoded(text, request)
        yield page, following, by_orjson
        request = following


def read_lanes(
    io: Any, requests: Mapping[int, PageRequest], at_once: int
) -> Generator[tuple[int, dict[str, Any], PageRequest | None, bool]]:
    """Each page of the lanes ``requests`` start (by lane number), as :func:`read_pages` gives them, with its lane.

    One lane is read as :func:`read_pages` reads it, here. Several are read by ``at_once`` threads, the longest
    lanes first once each has said how long it is (:class:`_LaneThreads`), each at most
    :data:`LANE_PAGES_AHEAD` pages ahead; pages come as they arrive, in order within a lane. A lane's failure is
    raised here; closing the generator stops the lanes (pages on their way are dropped: their requests are
    still each lane's next).
    """
    if len(requests) == 1:
        ((lane, request),) = requests.items()
        for page, following, exact in read_pages(io, request):
            yield lane, page, following, exact
        return
    threads = _LaneThreads(io, requests, at_once)
    try:
        yield from threads.pages()
    finally:
        threads.stop.set()


class _LaneThreads:
    """:func:`read_lanes`' threads: ``at_once`` of them, each reading the next page of a lane no other is reading,
    handing the pages over a queue (in order within a lane: a lane's next request is free once its page is queued).

    Which lane a thread reads next: one not started yet (its first page says how many items it holds), else the
    one with the most items left, as its ``numberMatched`` says; a lane whose pages do not say counts as long as
    the longest that does, and among equals the lane read least goes first (so, where the API counts nothing,
    the lanes take turns). So the longest lanes are read all along, and the lanes end together instead of one
    reading on alone. A lane holds at
    most :data:`LANE_PAGES_AHEAD` pages the ingest has not taken (and one more on its way), and all lanes together
    ``at_once`` times that."""

    def __init__(self, io: Any, requests: Mapping[int, PageRequest], at_once: int) -> None:
        import queue
        import threading

        self.io, self.at_once = io, max(at_once, 1)
        self.arrived: queue.SimpleQueue[tuple[int, Any, BaseException | None]] = queue.SimpleQueue()
        self.stop = threading.Event()
        self.free: dict[int, PageRequest] = dict(requests)
        """Each lane's next request, while no thread reads that lane."""
        self.order = {lane: rank for rank, lane in enumerate(requests)}
        self.left: dict[int, int] = {}
        """Items each started lane has left, where its pages say how many it holds."""
        self.read = dict.fromkeys(requests, 0)
        """Items read in each lane."""
        self.started: set[int] = set()
        self.held = dict.fromkeys(requests, 0)
        """Pages of each lane on their way or not taken yet."""
        self.reading = 0
        self.unread = len(requests)
        """Lanes whose last page has not been taken."""
        self.changed = threading.Condition()

    def pages(self) -> Generator[tuple[int, dict[str, Any], PageRequest | None, bool]]:
        import threading

        for number in range(min(self.at_once, len(self.free))):
            threading.Thread(target=self._run, name=f"floe-lane-{number}", daemon=True).start()
        while self.unread:
            lane, read, error = self.arrived.get()
            if error is not None:
                raise error
            with self.changed:
                self.held[lane] -= 1
                self.changed.notify_all()
            page, following, exact = read
            if following is None:  # the lane's last page
                self.unread -= 1
            yield lane, page, following, exact

    def _next(self) -> tuple[int, PageRequest] | None:
        """The lane to read next and its request (taken), None when no lane may be read now (called with
        :attr:`changed` held)."""
        if sum(self.held.values()) >= self.at_once * (LANE_PAGES_AHEAD + 1):
            return None
        ready = [lane for lane in self.free if self.held[lane] <= LANE_PAGES_AHEAD]
        if not ready:
            return None
        # A lane whose pages do not say how long it is counts as long as the longest that says (an API may count
        # only some searches); among equals, the lane read least.
        longest = max(self.left.values(), default=0)
        lane = min(
            ready,
            key=lambda lane: (lane in self.started, -self.left.get(lane, longest), self.read[lane], self.order[lane]),
        )
        self.started.add(lane)
        self.held[lane] += 1
        self.reading += 1
        return lane, self.free.pop(lane)

    def _run(self) -> None:
        while True:
            with self.changed:
                while (taken := self._next()) is None:
                    if self.stop.is_set() or (not self.free and not self.reading):
                        return  # every lane read to its end (none free, none on its way)
                    self.changed.wait(0.1)
            lane, request = taken
            try:
                text = _fetch(self.io, request)
                page, following, exact = _decoded(text, request)
            except BaseException as error:  # noqa: BLE001 - raised by the reader of the lanes
                self.arrived.put((lane, None, error))
                return
            with self.changed:
                self.reading -= 1
                if self.stop.is_set():
                    return
                self.read[lane] += len(page.get("features") or ())
                matched = page.get("numberMatched")
                if isinstance(matched, int) and not isinstance(matched, bool):
                    self.left[lane] = matched - self.read[lane]
                elif lane in self.left:
                    self.left[lane] = self.left[lane] - len(page.get("features") or ())
                self.arrived.put((lane, (page, following, exact), None))
                if following is not None:
                    self.free[lane] = following
                self.changed.notify_all()


_LINKS_KEY = '"links"'
_BLANK = " \t\r\n"


def guessed_following(text: str, request: PageRequest) -> PageRequest | None:
    """The next page's request as the page's text seems to say, from its last ``"links"`` member alone (where
    STAC APIs write a page's own links, after its features); None when that says nothing. A guess: the decoded
    page decides."""
    import json

    at = text.rfind(_LINKS_KEY)
    if at < 0:
        return None
    position = at + len(_LINKS_KEY)
    while position < len(text) and text[position] in _BLANK:
        position += 1
    if not text.startswith(":", position):
        return None
    position += 1
    while position < len(text) and text[position] in _BLANK:
        position += 1
    try:
        links, _ = json.JSONDecoder().raw_decode(text, position)
    except ValueError:
        return None
    if not isinstance(links, list):
        return None
    return request.following({"features": True, "links": links})
