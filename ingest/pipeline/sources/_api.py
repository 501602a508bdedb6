"""Items from a STAC API search: paged with pystac-client, streamed, retried, and resumable with ``--since``.

:class:`StacApi` is the kind of source and :class:`ApiSearch` one search, read in lanes (``_api_lanes``) whose pages
come ahead on threads (``_api_pages``) or from a page reader process (``_api_reader``), each page walked the same
way (``_api_walk``). Paging, lanes, retries and cursors: docs/remote-sources.md#stac-api-searches.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse, urlunparse

from ingest._stages import moved
from ingest.errors import InvalidSearch, InvalidSource
from ingest.pipeline._ahead import prefetched
from ingest.pipeline.sources._api_io import failure_reason, session_io
from ingest.pipeline.sources._api_lanes import Lane, irregular, lanes_for, plan_lanes, rfc3339, timestamp
from ingest.pipeline.sources._api_pages import PAGES_AHEAD, Lanes, PageRequest
from ingest.pipeline.sources._api_reader import SENT_PAGES_AHEAD, SearchPages
from ingest.pipeline.sources._api_walk import UpdatedCount, WalkedPage, collection_url, lay_out_rows, walk_page
from ingest.pipeline.sources._types import (
    FILE_SUFFIXES,
    ItemDefaults,
    SearchParameters,
    SourcedItem,
    SourcedRows,
    SourceName,
    SourceOptions,
)
from ingest.remote import Headers
from ingest.stac import shown

log = logging.getLogger(__name__)

CLOCK_MARGIN = timedelta(minutes=5)
"""How far a server's clock may run behind this machine's without an update being missed by ``--since last``."""


class StacApi:
    """A STAC API, named by its landing page or by a ``/search?...`` URL: searched with the options' parameters."""

    name = "a STAC API"

    def recognises(self, source: SourceName) -> bool:
        return isinstance(source, SearchLane) or (isinstance(source, str) and is_api_url(source))

    def read(self, source: SourceName, options: SourceOptions) -> Iterator[SourcedItem]:
        if isinstance(source, SearchLane):
            search = replace(source.search)  # a copy: what this read counts is this lane's
            options.searches.append(search)
            yield from read_search(search, only=source.lane, rows=page_rows(options))
            return
        try:
            search = resolved_search(str(source), options)
        except InvalidSource as error:
            yield SourcedItem(str(source), error=error)
            return
        options.searches.append(search)
        yield from read_search(search, rows=page_rows(options))


def page_rows(options: SourceOptions) -> ItemDefaults | None:
    """Where the ingest takes rows (``options.rows``: a metadata-only ingest), what a search's items are given
    before a page reader lays out those it accepts as rows (docs/ingest.md#stac-api-pages-as-rows); None: the
    reader sends items."""
    return ItemDefaults(options.default_collection) if options.rows else None


def resolved_search(url: str, options: SourceOptions) -> ApiSearch:
    """The search ``url`` names, with the options' parameters, the time ``--since`` resumes from (``last``: the
    cursor ``options.recorded`` holds for it), headers and lanes. Raises InvalidSource for a bad search or time."""
    search = ApiSearch.parse(url, options.search)
    try:
        if options.since == "last":
            cursor = options.recorded.get(search.key)
            search.since = parse_since(cursor) if cursor else None
        elif isinstance(options.since, str):
            search.since = parse_since(options.since)
        else:
            search.since = options.since
    except ValueError as error:
        raise InvalidSource(str(error)) from None
    search.headers = Headers.of(options.remote)
    search.lanes = options.remote.search_lanes if options.remote is not None else None
    return search


@dataclass(frozen=True)
class SearchLane:
    """One lane of a STAC API search, read as a source of its own: a metadata backfill gives each of a search's
    time lanes to a reader (``ingest/pipeline/_backfill.py``; planned by
    :func:`~ingest.pipeline.sources._api_shares.search_lanes`).

    Its items are labelled as one reader of the whole search labels them (``.../search?datetime=I#N``). Its
    :class:`ApiSearch` vouches for no cursor: the lanes' counts are merged into the whole search's
    (:func:`~ingest.pipeline.sources._api_shares.merged_searches`), whose cursor the backfill's driver records.
    """

    search: ApiSearch
    """The whole search, resolved (``--since`` too) by the driver that planned the lanes."""
    lane: Lane

    def __str__(self) -> str:
        return self.lane.label(self.search.root)


def is_api_url(source: str) -> bool:
    """Whether ``source`` names a STAC API (its root, or its ``/search``) rather than a file at a URL.

    Only the form is looked at (nothing is requested): an ``http(s)://`` URL whose path does not end with a suffix
    floe reads as a file (:data:`~ingest.pipeline.sources.FILE_SUFFIXES`).

    Args:
        source: a source as ``floe ingest`` takes it (a path or a URL).

    Returns:
        True if ``source`` names a STAC API.

    Raises:
        InvalidSource: ``source`` is a URL whose host ``urlparse`` refuses (an unbalanced ``[`` or ``]``, or no IP
            address between them).
    """
    try:
        parsed = urlparse(source)
    except ValueError as error:
        raise InvalidSource(f"{shown(source)} is not a URL floe can read: {error}") from None
    if parsed.scheme not in ("http", "https"):
        return False
    return PurePosixPath(parsed.path).suffix.lower() not in FILE_SUFFIXES


@dataclass
class ApiSearch:
    """One STAC API search named as a source, and what reading it found."""

    root: str
    """The API's landing page."""
    parameters: SearchParameters
    since: datetime | None = None
    complete: bool = False
    """The search was read to its last page."""
    items: int = 0
    without_updated: int = 0
    """Items read that carry no ``updated`` (then ``--since last`` cannot trust a cursor of this run)."""
    newest_updated: datetime | None = None
    started: datetime = field(default_factory=lambda: datetime.now(UTC))
    note: str | None = None
    """What the operator should know of how it was read (logged, and printed by ``floe ingest``): why it was read
    whole although ``--since`` asked for changes only; that the API ignored the time lanes' ``datetime``."""
    headers: Headers = field(default_factory=Headers)
    """The headers its requests carry, by URL prefix (``remote.headers``, ``floe ingest --header``)."""
    lanes: int | None = None
    """How many lanes it is read in at once (``remote.search_lanes``; 1: the search is read as one); None: as
    :func:`~ingest.pipeline._lanes.lanes_for` decides."""
    lanes_read: list[str] = field(default_factory=list)
    """The searches it was read as (:meth:`Lane.label`), where it was read in lanes."""
    unfiltered: bool = False
    """A time lane's page held items outside its interval: the API does not filter by ``datetime``."""
    lane_of: str | None = None
    """Where only one lane of the search was read here (:class:`SearchLane`): that lane's label. Its counts are the
    lane's, so it vouches for no cursor."""

    @classmethod
    def parse(cls, url: str, parameters: SearchParameters) -> ApiSearch:
        """A search of the API at ``url``; a ``/search?...`` URL brings its own parameters (options override them)."""
        parsed = urlparse(url)
        path = parsed.path.rstrip("/")
        if not path.endswith("/search") and path != "search":
            return cls(root=url.rstrip("/"), parameters=parameters)
        query = parse_qs(parsed.query)

        def first(name: str) -> str | None:
            values = query.get(name)
            return values[0] if values else None

        collections = tuple(part for value in query.get("collections", []) for part in value.split(",") if part)
        bbox_text = first("bbox")
        try:
            bbox = tuple(float(part) for part in bbox_text.split(",")) if bbox_text else None
        except ValueError:
            raise InvalidSource(f"{url}: bbox {bbox_text!r} is not a list of numbers") from None
        root = urlunparse(parsed._replace(path=path[: -len("search")].rstrip("/") or "/", query="", fragment=""))
        return cls(
            root=root.rstrip("/"),
            parameters=SearchParameters(
                collections=parameters.collections or collections,
                bbox=parameters.bbox or bbox,
                datetime=parameters.datetime or first("datetime"),
                filter=parameters.filter or first("filter"),
                page_size=parameters.page_size,
            ),
        )

    @property
    def key(self) -> str:
        """The search as one string, the same for the same search whichever way it was named (cursors' key)."""
        query: dict[str, str] = {}
        if self.parameters.collections:
            query["collections"] = ",".join(sorted(self.parameters.collections))
        if self.parameters.bbox:
            query["bbox"] = ",".join(repr(float(value)) for value in self.parameters.bbox)
        if self.parameters.datetime:
            query["datetime"] = self.parameters.datetime
        if self.parameters.filter:
            query["filter"] = _filter_json_text(self.parameters.filter)
        return f"{self.root}/search" + (f"?{urlencode(query)}" if query else "")

    def cursor(self) -> str | None:
        """What a later ``--since last`` may resume from; None when this run cannot vouch for one."""
        if not self.complete or self.without_updated or self.lane_of is not None:
            return None
        cursor = self.started - CLOCK_MARGIN
        if self.newest_updated is not None:
            cursor = min(cursor, self.newest_updated)
        return cursor.isoformat().replace("+00:00", "Z")

    def note_page(self, updated: UpdatedCount) -> None:
        """What was counted of a page's items' ``updated`` (:func:`~._api_walk.walk_page`, in either process)."""
        self.items += updated.noted
        self.without_updated += updated.without
        newest = updated.newest
        if newest is not None and (self.newest_updated is None or newest > self.newest_updated):
            self.newest_updated = newest

    def note_unfiltered(self) -> None:
        """A time lane's page held items outside the lane's interval: said once (logged, and in :attr:`note`)."""
        if self.unfiltered:
            return
        self.unfiltered = True
        message = (
            f"{self.root} does not filter by datetime: each of the {len(self.lanes_read)} time lanes read its whole "
            "search and kept its own items (nothing is missed or doubled, but each item was read once a lane); "
            "remote.search_lanes = 1 (FLOE_REMOTE__SEARCH_LANES=1) reads this API as one search"
        )
        log.warning("%s", message)
        self.note = f"{self.note}; {message}" if self.note else message


def parse_since(text: str) -> datetime:
    """``--since``'s timestamp (RFC 3339; a time without a zone is UTC).

    Args:
        text: the timestamp, e.g. ``2024-05-01T00:00:00Z`` (surrounding spaces are ignored).

    Returns:
        The moment, timezone-aware, in UTC.

    Raises:
        ValueError: ``text`` is not an RFC 3339 timestamp (the message names ``'last'`` as ``--since``'s other form).
    """
    when = timestamp(text.strip())
    if when is None:
        raise ValueError(f"--since {text!r} is neither 'last' nor an RFC 3339 timestamp (2024-05-01T00:00:00Z)")
    return when


def filter_json(text: str) -> dict[str, Any]:
    """CQL2 JSON of a filter given as CQL2 text or JSON (``--filter``).

    Args:
        text: CQL2 text, or a CQL2 JSON object.

    Returns:
        The filter as CQL2 JSON.

    Raises:
        InvalidSearch: ``text`` is neither (the message names it and says what is wrong).
    """
    stripped = text.strip()
    try:
        if stripped.startswith("{"):
            document = json.loads(stripped)
            if not isinstance(document, dict):
                raise ValueError("a CQL2 JSON filter is an object")
            return document
        import cql2

        converted = cql2.Expr(stripped).to_json()
        return converted if isinstance(converted, dict) else json.loads(converted)
    except Exception as error:  # noqa: BLE001 - cql2 raises a bare Exception for text it cannot parse
        reason = " ".join(str(error).split())[:300]
        raise InvalidSearch(f"--filter {shown(text)} is neither CQL2 text nor a CQL2 JSON object: {reason}") from None


def _filter_json_text(text: str) -> str:
    try:
        return json.dumps(filter_json(text), sort_keys=True, separators=(",", ":"))
    except InvalidSearch:
        return text


def cursor_metadata(searches: list[ApiSearch]) -> dict[str, Any] | None:
    """The commit metadata that records the cursors of ``searches`` (None when none can vouch for one)."""
    from ingest.repository import SOURCE_CURSORS  # here: the page reader's process imports this module alone

    cursors = {search.key: cursor for search in searches if (cursor := search.cursor()) is not None}
    return {SOURCE_CURSORS: cursors} if cursors else None


def read_search(
    search: ApiSearch, *, only: Lane | None = None, rows: ItemDefaults | None = None
) -> Iterator[SourcedItem]:
    """Each item, collection and failure of ``search``, labelled by URL (``.../search#N``: the Nth item; read in
    lanes, ``.../search?collections=C#N`` or ``.../search?datetime=I#N``: the Nth item its lane kept, in order
    within the lane).

    Collections are fetched the first time one of their items appears, so
    they are stored before it. ``search.complete`` is set once the last page
    is read. With ``only``, that lane of the search alone is read, labelled as
    it is when the search is read in lanes (``search.lane_of`` says which).
    With ``rows``, the pages a page reader reads come with the items this
    process would accept laid out as rows, given ``rows`` first
    (:class:`~._types.SourcedRows`, labelled as the items would be).
    """
    io = session_io(search.headers)
    try:
        opened = OpenedSearch.of(search, io)
    except InvalidSource as error:
        yield SourcedItem(search.root, error=error)
        return
    pages: SearchPages | None = None
    try:
        whole = opened.asked(Lane())
        if only is not None:
            lanes = [only]
            search.lane_of = only.label(search.root)
        else:
            lanes = plan_lanes(search, io, whole.get_parameters().get("datetime"))
            search.lanes_read = [lane.label(search.root) for lane in lanes] if len(lanes) > 1 else []
            if search.lanes_read:
                log.info("%s is read as %d searches: %s", search.key, len(lanes), ", ".join(search.lanes_read))
        firsts: list[PageRequest | None] = []
        for lane in lanes:
            item_search = whole if lane == Lane() else opened.asked(lane)
            firsts.append(PageRequest(item_search.url, item_search.method or "GET", None, item_search.get_parameters()))
        windows = {number: lane.window for number, lane in enumerate(lanes) if lane.window is not None}
        lane_requests = Lanes(firsts, at_once=lanes_for(search), windows=windows)
        pages = SearchPages(io, search.root, lane_requests, search.headers, rows)
        labels = [lane.label(search.root) for lane in lanes]
        twice: set[tuple[Any, Any]] | None = set() if windows else None
        numbers = [0] * len(labels)
        seen: set[str] = set()  # collections yielded
        fetched: set[str] = set()  # collections fetched by this process
        for number, page in prefetched(iter(pages), SENT_PAGES_AHEAD, _page_weight):
            # A dict was read here; the rest the page reader read, walked and checked (and laid out, or not).
            if isinstance(page, dict):
                walked = walk_page(page, io, search.root, fetched, windows.get(number))
            else:
                walked = page.load()
                if rows is not None and not walked.laid_out:
                    _lay_out_here(walked, rows, windowed=bool(windows))
            label, count = labels[number], numbers[number]
            numbers[number] = yield from _page_items(walked, search, seen, label, count, twice=twice)
    except Exception as error:  # noqa: BLE001 - a page that cannot be read ends the search, reported
        reason = f"search failed after {search.items} items ({failure_reason(error)})"
        yield SourcedItem(f"{search.root}/search", error=InvalidSource(reason))
        return
    finally:
        if pages is not None:
            pages.close()
    search.complete = True


@dataclass
class OpenedSearch:
    """A search whose API answered: its client, and the filter and method its requests carry."""

    search: ApiSearch
    client: Any
    query_filter: dict[str, Any] | None
    method: str

    @classmethod
    def of(cls, search: ApiSearch, io: Any) -> OpenedSearch:
        """Open ``search``'s API (its landing page). Raises InvalidSource where it is not a STAC API that searches."""
        from pystac_client import Client, ConformanceClasses

        try:
            client = Client.open(search.root, stac_io=io)
        except Exception as error:  # noqa: BLE001 - requests, pystac and pystac-client raise many kinds
            raise InvalidSource(f"not a readable STAC API ({failure_reason(error)})") from None
        if not client.conforms_to(ConformanceClasses.ITEM_SEARCH):
            raise InvalidSource("is a STAC catalog without item search: name a search, or a file")
        parameters = search.parameters
        query_filter: dict[str, Any] | None = filter_json(parameters.filter) if parameters.filter else None
        if search.since is not None:
            if client.conforms_to(ConformanceClasses.FILTER):
                since = {"op": ">=", "args": [{"property": "updated"}, {"timestamp": rfc3339(search.since)}]}
                query_filter = {"op": "and", "args": [query_filter, since]} if query_filter else since
            else:
                search.note = f"{search.root} cannot filter by updated (no CQL2 filter): the whole search is read again"
                log.warning(search.note)
        return cls(search, client, query_filter, _search_method(client))

    def asked(self, lane: Lane) -> Any:
        """pystac-client's search of ``lane`` (:class:`Lane`: the whole search)."""
        # Paging is serial: a search is read in lanes (_api_pages.py), several at once, which together read what it
        # reads (plan_lanes).
        parameters = self.search.parameters
        return self.client.search(
            collections=lane.collections or list(parameters.collections) or None,
            bbox=list(parameters.bbox) if parameters.bbox else None,
            datetime=lane.interval or parameters.datetime,
            filter=self.query_filter,
            filter_lang="cql2-json" if self.query_filter else None,
            limit=parameters.page_size,
            method=self.method,
        )


def _page_weight(read: tuple[int, Any]) -> int:
    """What a lane's page counts toward the pages held ahead: a decoded page (a dict, read here) weighs as much as
    this many of the page reader's (bytes)."""
    return SENT_PAGES_AHEAD // PAGES_AHEAD if isinstance(read[1], dict) else 1


def _search_method(client: Any) -> str:
    """POST where the API's landing page offers it (the parameters then go as JSON), else GET: a search link
    without a ``method`` is a GET (pystac-client would POST anyway, and warn)."""
    methods = {str(link.extra_fields.get("method") or "GET").upper() for link in client.get_links("search")}
    return "POST" if "POST" in methods or not methods else "GET"


def _page_items(
    page: WalkedPage, search: ApiSearch, seen: set[str], label: str, number: int, *, twice: set[tuple[Any, Any]] | None
) -> Generator[SourcedItem, None, int]:
    """The items of a page (walked by :func:`walk_page`, here or in the page reader), numbered on from
    ``number`` (returns the last number); each collection ``seen`` here for the first time is yielded before its
    first item (the reader fetches those it saw first: one this search has yielded already is not again). With
    ``twice`` (a search in time lanes), an item two lanes may keep (:func:`~ingest.pipeline._lanes.irregular`)
    is yielded once: ``twice`` holds those yielded. Items the reader laid out as rows come as runs of rows, in
    their places among the others (so what is seen first is what it would be as items)."""
    for warning in page.warnings:
        log.warning("%s", warning)
    if page.updated is not None:
        search.note_page(page.updated)
    if page.outside:
        search.note_unfiltered()
    marks = iter(page.collections)
    mark = next(marks, None)
    row_of = {index: position for position, index in enumerate(page.row_at)}
    run: int | None = None  # where the run of rows not yielded yet starts
    for index, (item, checked) in enumerate(zip(page.items, page.checked, strict=True)):
        if run is not None and (index not in row_of or (mark is not None and mark[0] == index)):
            yield _rows_of(page, run, index, first_row=row_of[run], label=label, number=number)
            run = None
        while mark is not None and mark[0] == index:
            yield from _first_seen(search, seen, mark[1], mark[2])
            mark = next(marks, None)
        if index in row_of:
            run = index if run is None else run
        elif _kept_once(item, search, twice):
            yield SourcedItem(f"{label}#{number + index + 1}", item=item, checked=checked)
    if run is not None:
        yield _rows_of(page, run, len(page.items), first_row=row_of[run], label=label, number=number)
    return number + len(page.items)


def _lay_out_here(page: WalkedPage, rows: ItemDefaults, *, windowed: bool) -> None:
    """A reader's page whose rows it left to this process, laid out here (its time counted as the ingest's "to
    Arrow", out of the wait for pages it happens in)."""
    started = time.perf_counter()
    lay_out_rows(page, rows, windowed=windowed)
    moved(time.perf_counter() - started, out_of="parse", into="to Arrow")


def _first_seen(
    search: ApiSearch, seen: set[str], collection_id: str, collection: dict[str, Any] | None
) -> Iterator[SourcedItem]:
    """The collection, the first time this search sees it (none when its document could not be read)."""
    if collection_id not in seen:
        seen.add(collection_id)
        if collection is not None:
            yield SourcedItem(collection_url(search.root, collection_id), collection=collection)


def _kept_once(item: Any, search: ApiSearch, twice: set[tuple[Any, Any]] | None) -> bool:
    """Whether ``item`` is yielded: in time lanes (``twice``), an item two lanes may keep is yielded by the first
    alone (and counted once)."""
    if twice is None or not isinstance(item, dict) or not irregular(item):
        return True
    key = (item.get("collection"), item.get("id"))
    if key in twice:
        search.items -= 1  # counted by the lane that kept it first
        return False
    twice.add(key)
    return True


def _rows_of(page: WalkedPage, start: int, stop: int, *, first_row: int, label: str, number: int) -> SourcedItem:
    """The page's items ``start`` to ``stop``, all rows (from row ``first_row`` on), labelled as those items would
    be."""
    import numpy as np

    assert page.rows is not None
    numbers = np.arange(number + start + 1, number + stop + 1, dtype=np.int64)
    rows = SourcedRows(page.rows.slice(first_row, stop - start), f"{label}#", numbers)
    return SourcedItem(f"{label}#{numbers[0]}", rows=rows)
