"""The lanes a STAC API search is read in: searches that together read what it reads, read several at once.

:func:`plan_lanes` cuts a search into :class:`Lane` searches (one per collection, each collection's time cut into
intervals), and :func:`owned` says which lane keeps an item two lanes find. How lanes are planned and read, and what
they gained: docs/remote-sources.md#lanes.
"""

from __future__ import annotations

import ipaddress
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode, urlparse

from ingest.stac import parse_datetime

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ingest.pipeline.sources._api import ApiSearch

Window = tuple[datetime | None, datetime | None]
"""A time lane's items: those whose instant is at or after the first bound and before the second (None: open)."""


@dataclass(frozen=True)
class Lane:
    """One lane of a search: what its search asks besides the whole search's parameters, and which of its items
    it keeps."""

    collections: list[str] | None = None
    """The collection it searches (None: the search's own)."""
    interval: str | None = None
    """The datetime interval it searches (None: the search's own)."""
    window: Window | None = None
    """The items it keeps, by their instant (:func:`owned`); None: every item."""

    def label(self, root: str) -> str:
        """How its items are named in the report: ``.../search?collections=C``, ``.../search?datetime=I`` (the
        search's one collection) or ``.../search?collections=C&datetime=I``."""
        asked = f"{urlencode({'collections': self.collections[0]})}" if self.collections else ""
        if self.interval:
            asked = f"{asked}&datetime={self.interval}" if asked else f"datetime={self.interval}"
        return f"{root}/search?{asked}" if asked else f"{root}/search"


SEARCH_LANES = 3
"""Lanes read at once where the settings do not say (``remote.search_lanes``), for an API on another machine."""


def lanes_for(search: ApiSearch) -> int:
    """How many lanes ``search`` is read in at once: as the settings say; else :data:`SEARCH_LANES`, or 1 for an
    API on this machine (a loopback host), which makes its pages on the cores the ingest uses: there lanes add
    work (threads, requests made at once), not speed (0.90-0.93x on 2 cores, docs/benchmarks-history.md,
    twenty-second run)."""
    if search.lanes is not None:
        return search.lanes
    return 1 if _loopback(urlparse(search.root).hostname or "") else SEARCH_LANES


def _loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: not resolved here


def plan_lanes(search: ApiSearch, io: Any, formatted_datetime: str | None) -> list[Lane]:
    """The lanes ``search`` is read in: one a collection where it names several, each split into consecutive
    intervals of its datetime interval (where it gives no start or end, the collection's extent's; now for an open
    one) until there are about as many lanes as are read at once, the newest intervals first; a search of the
    whole API, intervals of its datetime interval where that has a start; otherwise the search as it is.
    ``formatted_datetime``: the search's datetime as pystac-client sends it (``2024`` expanded to the year)."""
    at_once = lanes_for(search)
    if at_once <= 1:
        return [Lane()]
    # None: the whole API, whose datetime interval is split where it has a start (there is no extent to ask).
    collections: list[str | None] = [*search.parameters.collections] or [None]
    pieces = -(-at_once // len(collections))  # intervals a collection is split into
    several = len(collections) > 1
    if pieces > 1:
        with ThreadPoolExecutor(min(at_once, len(collections)), thread_name_prefix="floe-extent") as pool:
            splits = list(pool.map(lambda c: _time_lanes(search.root, io, c, formatted_datetime, pieces), collections))
    else:
        splits = [None] * len(collections)
    # Newest first, the collections taking turns: an archive's later years hold most of its items, and the
    # longest lanes should start first, so that the lanes read at once end together.
    columns = [
        [replace(lane, collections=[collection] if several and collection else None) for lane in reversed(split)]
        if split
        else [Lane(collections=[collection] if several and collection else None)]
        for collection, split in zip(collections, splits, strict=True)
    ]
    return [column[rank] for rank in range(max(map(len, columns))) for column in columns if rank < len(column)]


def _time_lanes(root: str, io: Any, collection: str | None, formatted: str | None, pieces: int) -> list[Lane] | None:
    """``pieces`` consecutive intervals of ``formatted`` (where it gives no start or end, ``collection``'s extent's;
    now for an open one), the first and last open-ended; None where they cannot be made (a single instant, an
    interval floe does not read, no start)."""
    first, slash, last = (formatted or "").partition("/")
    if formatted and not slash:
        return None  # one instant
    given_start = None if first in ("", "..") else timestamp(first)
    given_end = None if last in ("", "..") else timestamp(last)
    if (first not in ("", "..") and given_start is None) or (last not in ("", "..") and given_end is None):
        return None  # an interval floe does not read: asked as it is
    extent = (None, None) if (given_start and given_end) or collection is None else _extent(io, root, collection)
    start = given_start or extent[0]
    end = given_end or extent[1] or datetime.now(UTC)
    if start is None or end - start < timedelta(seconds=pieces):
        return None
    step = (end - start) / pieces
    cuts = [(start + step * number).replace(microsecond=0) for number in range(1, pieces)]
    if len(set(cuts)) < len(cuts) or cuts[0] <= start:
        return None
    bounds: list[datetime | None] = [None, *cuts, None]
    texts = [first if given_start else "..", *(rfc3339(cut) for cut in cuts), last if given_end else ".."]
    return [
        Lane(interval=f"{texts[number]}/{texts[number + 1]}", window=(bounds[number], bounds[number + 1]))
        for number in range(pieces)
    ]


def _extent(io: Any, root: str, collection: str) -> tuple[datetime | None, datetime | None]:
    """The start and end of ``collection``'s temporal extent, as the API gives them; None where it says none (an
    open end), or cannot be read (then, without a start, the search is read as one; the collection's own fetch,
    with its items, says why)."""
    try:
        document = io.read_json(f"{root}/collections/{quote(collection, safe='')}")
        first, last = document["extent"]["temporal"]["interval"][0][:2]
    except Exception:  # noqa: BLE001 - any failure leaves the search as it is
        return None, None
    return (timestamp(first) if isinstance(first, str) else None, timestamp(last) if isinstance(last, str) else None)


def owned(item: Mapping[str, Any], window: Window) -> bool:
    """Whether a time lane keeps ``item``: its ``datetime`` (or, without one, its ``start_datetime``) is in the
    lane's window. Lanes' intervals share their bounds and an item whose time range spans one is found by both:
    the one its instant falls in keeps it (an API matching ranges finds it there too). An item whose ``datetime``
    lies outside its own range (:func:`irregular`) is kept by its start's lane too, where an API that matches
    ranges alone finds it (the ingest drops a second copy). An item without a readable instant is kept (its
    validation names what is wrong) by the first lane alone: an API that matches times finds it in no lane, one
    that ignores them in every lane."""
    when, start, _ = _instants(item)
    instant = when or start
    if instant is None:
        return window[0] is None
    if _within(instant, window):
        return True
    return start is not None and _within(start, window) and irregular(item)


def outside(item: Mapping[str, Any], window: Window) -> bool:
    """Whether ``item``'s time misses ``window`` altogether (its ``datetime`` and its range all before the window's
    start or all after its end; bounds included, as a ``datetime`` search matches them): an API that filtered by
    the lane's interval would not have returned it. False for an item without a readable time."""
    instants = [when for when in _instants(item) if when is not None]
    if not instants:
        return False
    low, high = window
    return (low is not None and max(instants) < low) or (high is not None and min(instants) > high)


def irregular(item: Mapping[str, Any]) -> bool:
    """Whether ``item``'s ``datetime`` lies outside its own ``start_datetime``..``end_datetime``: two time lanes
    may each keep it (:func:`owned`)."""
    properties = item.get("properties")
    if not isinstance(properties, dict) or "start_datetime" not in properties or "end_datetime" not in properties:
        return False  # most items: nothing to parse
    when, start, end = _instants(item)
    return when is not None and start is not None and end is not None and not start <= when <= end


def _instants(item: Mapping[str, Any]) -> tuple[datetime | None, datetime | None, datetime | None]:
    properties = item.get("properties")
    if not isinstance(properties, dict):
        return None, None, None
    return tuple(  # type: ignore[return-value]
        timestamp(value) if isinstance(value := properties.get(name), str) else None
        for name in ("datetime", "start_datetime", "end_datetime")
    )


def _within(when: datetime, window: Window) -> bool:
    low, high = window
    return (low is None or when >= low) and (high is None or when < high)


def timestamp(text: str) -> datetime | None:
    """``text`` as an RFC 3339 timestamp (aware, UTC); None where it is not one."""
    try:
        return parse_datetime(text)
    except ValueError:
        return None


def rfc3339(when: datetime) -> str:
    """``when`` in UTC, as RFC 3339 with a ``Z``."""
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")
