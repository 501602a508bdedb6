"""A search request as the API and ``floe search`` receive it: its fields, their validation, and the page token.

This module turns what a client sent (bbox, intersects, datetime, sortby,
limit, token) into checked values or an :class:`~ingest.errors.InvalidSearch`
that names the input. It knows nothing of the table: what a request means for
a snapshot's files is the planner's job (``_plan``).

The page token is owned here (:class:`PageToken`): a next-page token pins the
snapshot the first page was read at, and where the next page starts in it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import orjson
import shapely

from ingest.api._filter import column_of, timestamp_micros
from ingest.api._geometry import checked_geometry
from ingest.errors import InvalidSearch
from ingest.stac import parse_datetime, shown

DEFAULT_LIMIT = 10
MAX_LIMIT = 10_000


@dataclass(frozen=True)
class SortKey:
    """One sortby entry: a table column and its direction."""

    column: str
    descending: bool = False


class PostedSortKey(Protocol):
    """A sortby entry as the sort extension posts it (stac-pydantic's ``SortExtension``: a field and a direction)."""

    field: str
    direction: Any  # an enum whose value is "asc" or "desc", or that text itself


SortEntry = SortKey | str | Mapping[str, Any] | PostedSortKey
"""One sortby entry in any form a caller sends: parsed, ``-datetime``, ``{"field": ..., "direction": ...}``."""


@dataclass
class SearchRequest:
    """A STAC item search, as the API and ``floe search`` receive it (not yet validated).

    ``bbox`` and ``sortby`` take the API's parsed lists as well as the command
    line's comma-separated text (``"0,0,10,10"``, ``"-datetime,id"``).
    """

    collections: list[str] | None = None
    ids: list[str] | None = None
    bbox: str | Sequence[float] | None = None
    intersects: dict[str, Any] | str | None = None
    datetime: str | None = None
    filter: str | dict[str, Any] | None = None
    filter_lang: str | None = None
    query: dict[str, Any] | str | None = None
    sortby: str | Sequence[SortEntry] | None = None
    limit: int = DEFAULT_LIMIT
    token: str | None = None


@dataclass
class SearchPage:
    """One page of results at one snapshot, and the token of the next page (None at the end)."""

    items: list[dict[str, Any]]
    snapshot_id: str
    next_token: str | None = None
    number_matched: int | None = None
    """How many items match in all, when the table's metadata says so without reading rows (else None)."""


# The token's wire keys: one letter each, to keep next links short. Tokens issued before keep working only while
# these letters and their meanings stay as they are, so they never change; PageToken is their only reader and writer.
_SNAPSHOT_KEY = "s"  # the snapshot id the search is pinned to
_FILE_KEY = "f"  # unsorted: the index of the data file to resume in (files in path order)
_ROW_KEY = "r"  # unsorted: the row of that file to resume at
_OFFSET_KEY = "o"  # sorted: how many of the sorted matches earlier pages returned
_SEARCH_KEY = "q"  # the fingerprint of the search the token continues (see search_fingerprint)
_CHECK_KEY = "c"  # a checksum of the other keys: an altered or truncated token is refused, not followed
_CHECK_SALT = b"floe page token v1"


def search_fingerprint(parts: Mapping[str, Any]) -> str:
    """A short digest of a search's normalized parts (collections, ids, bbox, intersects, datetime, filter, sortby).

    A page token carries it, so a token is only followed by the search that
    issued it: the same search sent by GET or POST, with any page size.
    """
    return hashlib.blake2b(orjson.dumps(parts, option=orjson.OPT_SORT_KEYS), digest_size=8).hexdigest()


def _checksum(payload: Mapping[str, Any]) -> str:
    canonical = orjson.dumps(
        {key: value for key, value in payload.items() if key != _CHECK_KEY}, option=orjson.OPT_SORT_KEYS
    )
    return hashlib.blake2b(canonical, key=_CHECK_SALT, digest_size=6).hexdigest()


@dataclass(frozen=True)
class PageToken:
    """Where the next page of a search starts, pinned to the snapshot the first page was read at.

    Unsorted searches resume at a position in the snapshot's data files
    (``file_index``, ``row``); sorted searches resume at ``offset`` into the
    sorted matches (``offset`` is None for a positional token). ``search`` is
    the fingerprint of the search that issued it (:func:`search_fingerprint`):
    a token is refused by any other search, sorted or not, with other filters
    or collections. Encoded as URL-safe base64 of a small JSON object without
    padding, with a checksum, so an altered token is refused rather than followed.
    """

    snapshot_id: str
    file_index: int = 0
    row: int = 0
    offset: int | None = None
    search: str | None = None
    """None for a token issued before tokens named their search (it is not checked against the search then)."""

    @property
    def sorted(self) -> bool:
        """Whether the token continues a sorted search."""
        return self.offset is not None

    def encode(self) -> str:
        """The token's text, as next links carry it."""
        payload: dict[str, Any] = {_SNAPSHOT_KEY: self.snapshot_id, _SEARCH_KEY: self.search or ""}
        if self.offset is None:
            payload[_FILE_KEY] = self.file_index
            payload[_ROW_KEY] = self.row
        else:
            payload[_OFFSET_KEY] = self.offset
        payload[_CHECK_KEY] = _checksum(payload)
        return base64.urlsafe_b64encode(orjson.dumps(payload)).decode().rstrip("=")

    @classmethod
    def decode(cls, token: str) -> PageToken:
        """The token ``token`` encodes; InvalidSearch unless this server (or an earlier version of it) issued it."""
        refused = InvalidSearch(
            f"token {shown(token)} is not a token this server issued, or it was altered: "
            "start the search again without a token"
        )
        try:
            payload = orjson.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        except (binascii.Error, ValueError, orjson.JSONDecodeError) as error:
            raise refused from error
        if not isinstance(payload, dict) or not isinstance(payload.get(_SNAPSHOT_KEY), str):
            raise refused
        # Tokens issued before tokens carried their search and a checksum have neither: they still page their
        # snapshot (sorted or not, as their keys say), unbound to their search. Any token with a checksum must match it.
        legacy = _CHECK_KEY not in payload and _SEARCH_KEY not in payload
        if not legacy and (
            not isinstance(payload.get(_SEARCH_KEY), str) or payload.get(_CHECK_KEY) != _checksum(payload)
        ):
            raise refused
        positions = [payload.get(key, 0) for key in (_FILE_KEY, _ROW_KEY, _OFFSET_KEY)]
        if not all(isinstance(value, int) and not isinstance(value, bool) and value >= 0 for value in positions):
            raise refused
        offset = payload.get(_OFFSET_KEY)
        return cls(
            payload[_SNAPSHOT_KEY],
            payload.get(_FILE_KEY, 0),
            payload.get(_ROW_KEY, 0),
            offset,
            payload.get(_SEARCH_KEY),
        )

    def check_continues(self, search: str, sort_keys: Sequence[SortKey]) -> None:
        """Refuse the token unless it continues the search whose fingerprint is ``search`` (sorted by ``sort_keys``)."""
        if self.sorted and not sort_keys:
            raise InvalidSearch(
                "this token continues a sorted search, and this search has no sortby: send the token with the "
                "search that issued it (the same sortby), or start again without a token"
            )
        if not self.sorted and sort_keys:
            raise InvalidSearch(
                "this token continues an unsorted search, and this search has a sortby: send the token with the "
                "search that issued it (no sortby), or start again without a token"
            )
        if self.search is not None and self.search != search:
            raise InvalidSearch(
                "this token continues a different search (its collections, ids, bbox, intersects, datetime, filter, "
                "query or sortby differ): send the token with the search that issued it, or start again without one"
            )


def checked_limit(limit: int, max_limit: int = MAX_LIMIT, refuse_over_limit: bool = False) -> int:
    """The page size to use for ``limit``: a positive integer, at most ``max_limit``.

    A limit above the maximum is refused only when ``refuse_over_limit`` is set;
    otherwise the maximum applies, as OGC API Features requires ("SHALL NOT
    result in an error").
    """
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise InvalidSearch(f"limit {limit!r} must be a positive integer")
    if limit <= max_limit:
        return limit
    if refuse_over_limit:
        raise InvalidSearch(f"limit {limit} exceeds the maximum of {max_limit} items per page")
    return max_limit


def _corners(numbers: list[float]) -> tuple[float, float, float, float]:
    """(xmin, ymin, xmax, ymax) of a 2D or 3D bbox."""
    if len(numbers) == 6:
        return numbers[0], numbers[1], numbers[3], numbers[4]
    return numbers[0], numbers[1], numbers[2], numbers[3]


def parse_bbox(bbox: str | Sequence[float] | None) -> list[float] | None:
    """Check a bbox (4 or 6 numbers, or their comma-separated text) and return it as floats."""
    if bbox is None or bbox in ("", []):
        return None
    values = bbox.split(",") if isinstance(bbox, str) else list(bbox)
    try:
        numbers = [float(value) for value in values]
    except (TypeError, ValueError) as error:
        raise InvalidSearch(f"bbox {bbox!r} must be 4 or 6 numbers (xmin,ymin,xmax,ymax)") from error
    if len(numbers) not in (4, 6) or not all(np.isfinite(numbers)):
        raise InvalidSearch(f"bbox {bbox!r} must be 4 or 6 finite numbers (xmin,ymin,xmax,ymax)")
    xmin, ymin, xmax, ymax = _corners(numbers)
    if ymin > ymax:
        raise InvalidSearch(f"bbox {bbox!r}: the southern edge {ymin} lies north of the northern edge {ymax}")
    if not (-90 <= ymin <= 90 and -90 <= ymax <= 90 and -180 <= xmin <= 180 and -180 <= xmax <= 180):
        raise InvalidSearch(f"bbox {bbox!r} lies outside longitude [-180, 180] and latitude [-90, 90]")
    return numbers


def bbox_geometry(numbers: list[float]) -> shapely.Geometry:
    """A checked bbox as a geometry: two boxes, one each side of 180°, when it crosses the antimeridian."""
    xmin, ymin, xmax, ymax = _corners(numbers)
    if xmin > xmax:
        return shapely.MultiPolygon([shapely.box(xmin, ymin, 180, ymax), shapely.box(-180, ymin, xmax, ymax)])
    return shapely.box(xmin, ymin, xmax, ymax)


def parse_intersects(value: dict[str, Any] | str | None) -> shapely.Geometry | None:
    """A GeoJSON geometry (or a Feature, or their JSON text) as a valid, non-empty shapely geometry."""
    if value is None or value == "":
        return None
    try:
        document = json.loads(value) if isinstance(value, str) else value
    except (json.JSONDecodeError, RecursionError) as error:
        raise InvalidSearch(f"intersects {str(value)[:200]!r} is not GeoJSON: {error}") from error
    if isinstance(document, dict) and document.get("type") == "Feature":
        document = document.get("geometry")
    return checked_geometry(document, "intersects")


def parse_interval(value: str | None) -> tuple[int | None, int | None] | None:
    """A STAC datetime (an instant, or an interval with open ends ``..``) as bounds in epoch microseconds."""
    if value is None or value.strip() == "":
        return None
    parts = value.split("/")
    if len(parts) > 2:
        raise InvalidSearch(f"datetime {value!r} must be one RFC 3339 date-time or an interval start/end")
    bounds: list[int | None] = []
    for raw in parts:
        part = raw.strip()
        if part in ("", "..") and len(parts) == 2:
            bounds.append(None)
            continue
        try:
            bounds.append(timestamp_micros(parse_datetime(part)))
        except ValueError as error:
            raise InvalidSearch(
                f"datetime {value!r}: {part!r} is not an RFC 3339 date-time (e.g. 2024-01-05T00:00:00Z)"
            ) from error
    if len(bounds) == 1:
        return bounds[0], bounds[0]
    start, end = bounds
    if start is None and end is None:
        raise InvalidSearch(f"datetime {value!r}: an interval needs at least one closed end")
    if start is not None and end is not None and start > end:
        raise InvalidSearch(f"datetime {value!r}: the interval starts after it ends")
    return start, end


def parse_sortby(sortby: str | Sequence[SortEntry] | None) -> list[SortKey]:
    """``-datetime,+id`` / ``["-datetime"]`` / ``[{"field": ..., "direction": ...}]`` -> sort keys."""
    if not sortby:
        return []
    entries = sortby.split(",") if isinstance(sortby, str) else sortby
    return [_sort_key(entry, sortby) for entry in entries]


def _sort_key(entry: SortEntry, sortby: object) -> SortKey:
    if isinstance(entry, SortKey):
        return entry
    if isinstance(entry, Mapping):
        return _directed_key(entry["field"], entry.get("direction", "asc"))
    if not isinstance(entry, str) and hasattr(entry, "field"):
        return _directed_key(entry.field, entry.direction)
    text = str(entry).strip()
    name = text.lstrip("+-").strip()
    if not name:
        raise InvalidSearch(f"sortby {sortby!r} names no field")
    return SortKey(column_of(name), text.startswith("-"))


def _directed_key(name: object, direction: Any) -> SortKey:
    """A sort key from a field and a direction ("asc"/"desc", or an enum with that value)."""
    direction = getattr(direction, "value", direction)
    if direction not in ("asc", "desc"):
        raise InvalidSearch(f"sortby direction {direction!r} must be asc or desc")
    return SortKey(column_of(str(name)), direction == "desc")
