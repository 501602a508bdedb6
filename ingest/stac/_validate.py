"""Checks a STAC item must pass before floe stages it.

The checks guard the table and the array layout: an item's ``id`` and
``collection`` become path segments (``/<collection>/<item_id>/``), so
anything that could escape a path or collide with a reserved name is refused.
They also refuse what the STAC and GeoJSON specifications call invalid
(geometry and bbox: :mod:`ingest.stac._geometry`; timestamps: RFC 3339 with a
time zone, ``start_datetime`` <= ``end_datetime``). Every message quotes the
offending value on one line, cut to 80 characters with its full length.
"""

from __future__ import annotations

import contextlib
import re
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from ingest.errors import InvalidInput, InvalidItem
from ingest.stac._geometry import bbox_problem, geometry_problem, refused_geometries
from ingest.stac._text import shorten, shown

MAX_NAME_LENGTH = 255
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_FRACTION = re.compile(r"(\.\d{6})\d+")
_PERCENT_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
_TIMESTAMP = pa.timestamp("us", tz="UTC")
# RFC 3339 section 5.6 date-time: a full date, T (or t, or the space its note allows), a time, and an offset.
_RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})"
)


def _segment_problem(value: str) -> str | None:
    """Why ``value`` is unsafe as one path segment, or None."""
    if "/" in value or "\\" in value:
        return "contains a path separator"
    if _CONTROL.search(value):
        return "contains control characters"
    if value.strip() != value:
        return "has leading or trailing whitespace"
    if value.startswith("."):
        return "starts with '.' (could name a parent or hidden path)"
    if value.startswith("__"):
        return "starts with '__', which Zarr reserves"
    return None


def check_name(value: Any, what: str) -> str:
    """Return ``value`` if it is safe as one path segment and one URL path segment, else raise ``ValueError``.

    Ids and collection ids name Zarr groups (``/<collection>/<id>/``), files of
    exported catalogs and URL path segments of the STAC API. floe itself
    percent-encodes them wherever they meet a URL or a file name, so
    ``%2e%2e`` would be a harmless literal there; but URL parsers decode
    percent-escapes of unreserved characters (RFC 3986 6.2.2.2, and the WHATWG
    URL standard treats ``%2e%2e`` as ``..``), and a client, proxy or static
    host that builds a link from the id without encoding it would reach the
    parent. So an id is refused when it, or what percent-decoding makes of it
    (once or repeatedly), is unsafe: ``%2e%2e``, ``%2F`` and ``%00`` are
    refused; ``100%`` and ``a%20b`` are kept as they are.
    """
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {type(value).__name__}")
    if not value:
        raise ValueError(f"{what} is empty")
    if len(value) > MAX_NAME_LENGTH:
        raise ValueError(f"{what} {shown(value)} is longer than {MAX_NAME_LENGTH} characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} {shown(value)} is not valid Unicode (it holds a lone surrogate)") from None
    problem = _segment_problem(value)
    if problem is not None:
        raise ValueError(f"{what} {shown(value)} {problem}")
    decoded = value
    while _PERCENT_ESCAPE.search(decoded):
        decoded = unquote(decoded)
        problem = _segment_problem(decoded) or ("is empty" if not decoded else None)
        if problem is not None:
            raise ValueError(f"{what} {shown(value)} percent-decodes to {shown(decoded)}, which {problem}")
    return value


def item_as_dict(item: Any) -> Any:
    """A pystac Item (anything with ``to_dict``) as its dict, without a self link; anything else as it is."""
    to_dict = getattr(item, "to_dict", None)
    return to_dict(include_self_link=False) if callable(to_dict) else item


def parse_datetime(value: str) -> datetime:
    """Parse an RFC 3339 timestamp into an aware UTC datetime (microsecond precision)."""
    text = value.strip()
    if text.endswith(("z", "Z")):
        text = text[:-1] + "+00:00"
    if "." in text:  # more than six digits of fraction are cut to microseconds
        text = _FRACTION.sub(r"\1", text)
    parsed = datetime.fromisoformat(text)
    if parsed.tzinfo is UTC:  # "Z" and "+00:00": already as wanted
        return parsed
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def validate_item(
    item: Any, *, source: str | None = None, default_collection: str | None = None, check_geometry: bool = True
) -> dict[str, Any]:
    """Return the item (with ``collection`` filled from ``default_collection`` if absent) or raise InvalidItem.

    The item is not copied unless a default collection is filled in. Without
    ``check_geometry`` the geometry's GeoJSON is not parsed: the caller does it
    (and checks its positions and bbox) for many items at once with
    :func:`~ingest.stac._geometry.refused_geometries`.
    """
    if not isinstance(item, dict):
        raise InvalidItem(f"expected a STAC item object, got {type(item).__name__}", source=source)
    raw_id = item.get("id")
    # The id as messages and reports name it: a huge one cut short (with its length).
    named = shorten(raw_id) if isinstance(raw_id, str) else shown(raw_id)
    if item.get("type") != "Feature":
        raise InvalidItem(f"type must be 'Feature', got {shown(item.get('type'))}", item_id=named, source=source)
    if "id" not in item:
        raise InvalidItem("item has no id", source=source)
    try:
        item = _checked_names(item, default_collection)
        _check_geometry(item, parse=check_geometry)
        _check_times(item.get("properties"))
        _check_members(item)
    except ValueError as error:
        raise InvalidItem(str(error), item_id=named, source=source) from None
    return item


def _checked_names(item: dict[str, Any], default_collection: str | None) -> dict[str, Any]:
    """The item's id and collection (filled from ``default_collection``), checked as path segments."""
    check_name(item["id"], "id")
    if item.get("collection") is None:
        if default_collection is None:
            raise ValueError("item has no collection (give one with --collection)")
        item = {**item, "collection": default_collection}
    collection = item["collection"]
    if type(collection) is not str or collection not in _GOOD_COLLECTIONS:
        _remember_collection(check_name(collection, "collection"))
    return item


def _remember_collection(collection: str) -> None:
    """Keep a collection id check_name accepted (an archive has a few collections; every item names one)."""
    if type(collection) is str and len(_GOOD_COLLECTIONS) < 4096:
        _GOOD_COLLECTIONS.add(collection)


_GOOD_COLLECTIONS: set[str] = set()
"""Collection ids :func:`check_name` has accepted (a pure check of the string), so each is checked once."""


def _check_geometry(item: dict[str, Any], *, parse: bool) -> None:
    geometry = item.get("geometry")
    if geometry is None:
        raise ValueError("item has no geometry")
    if not isinstance(geometry, dict) or not isinstance(geometry.get("type"), str):
        raise ValueError("geometry is not a GeoJSON geometry object")
    if "bbox" in item:
        problem = bbox_problem(item["bbox"])
        if problem is not None:
            raise ValueError(problem)
    if parse:
        problem = geometry_problem(item)
        if problem is not None:
            raise ValueError(problem)


def check_timestamp(value: Any, key: str) -> datetime:
    """``value`` parsed if it is an RFC 3339 date-time with a time zone, else ``ValueError`` naming ``key``.

    ``2021-01-01`` (a date), ``2021-W01`` (an ISO 8601 week) and
    ``2021-01-01T00:00:00`` (no offset) are refused; ``Z``, ``+02:00`` and the
    space separator RFC 3339's note allows are accepted.
    """
    if not isinstance(value, str):
        raise ValueError(f"properties.{key} must be an RFC 3339 string, got {shown(value)}")
    problem = (
        f"properties.{key} {shown(value)} is not an RFC 3339 date-time with a time zone (e.g. 2021-01-01T00:00:00Z)"
    )
    if not _RFC3339.fullmatch(value):
        raise ValueError(problem)
    try:
        return parse_datetime(value)
    except ValueError:
        raise ValueError(problem) from None


def _check_times(properties: Any) -> None:
    """``properties`` holds an RFC 3339 ``datetime``, or null with a start/end range, and start <= end."""
    if not isinstance(properties, dict):
        raise ValueError("item has no properties object")
    if "datetime" not in properties:
        raise ValueError("properties.datetime is required (null is allowed with start_datetime and end_datetime)")
    if properties["datetime"] is None and (
        properties.get("start_datetime") is None or properties.get("end_datetime") is None
    ):
        raise ValueError("item has no datetime (and no start_datetime/end_datetime range)")
    parsed = {
        key: check_timestamp(properties[key], key)
        for key in ("datetime", "start_datetime", "end_datetime")
        if properties.get(key) is not None
    }
    start, end = parsed.get("start_datetime"), parsed.get("end_datetime")
    if start is not None and end is not None and start > end:
        raise ValueError(
            f"properties.start_datetime {shown(properties['start_datetime'])} is after "
            f"end_datetime {shown(properties['end_datetime'])}"
        )


def _check_members(item: dict[str, Any]) -> None:
    if "assets" in item and not isinstance(item["assets"], dict):
        raise ValueError("assets must be an object")
    if "links" in item and not isinstance(item["links"], list):
        raise ValueError("links must be a list")
    _check_nesting(item)


MAX_NESTING = 255
"""The deepest an item may nest (orjson's own limit; real items nest under ten levels)."""


def _check_nesting(item: dict[str, Any]) -> None:
    """Refuse an item nested so deep that converting or reading it would exhaust Python's stack.

    orjson serializes at C speed and stops at 255 levels, which is the check;
    an item orjson cannot serialize for another reason (an integer beyond 64
    bits, a lone surrogate) is walked instead, which also finds text that
    is not valid Unicode (no UTF-8 file can hold it, and Parquet cannot).
    """
    try:
        orjson.dumps(item)
        return
    except orjson.JSONEncodeError as error:
        if "ecursion" in str(error):
            raise ValueError(f"the item nests more than {MAX_NESTING} levels deep") from None
    pending: list[tuple[Any, int]] = [(item, 1)]
    while pending:
        node, depth = pending.pop()
        if isinstance(node, str):
            _check_unicode(node)
            continue
        if depth > MAX_NESTING:
            raise ValueError(f"the item nests more than {MAX_NESTING} levels deep")
        if isinstance(node, dict):
            pending.extend((key, depth) for key in node)
            children = node.values()
        else:
            children = node
        pending.extend((child, depth + 1) for child in children if isinstance(child, dict | list | str))


def _check_unicode(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"the item holds text that is not valid Unicode (a lone surrogate) in {shown(text)}") from None


# A name check_name accepts with no more to look at: no control character, path separator, percent sign or lone
# surrogate anywhere, no whitespace at either end, and not starting with "." or "__" (its length is checked apart).
_NAME_CHARACTER = r"[^\x00-\x1f\x7f/\\%\ud800-\udfff]"
_NAME_END = r"[^\x00-\x1f\x7f/\\%\ud800-\udfff\s]"
_PLAIN_NAME = re.compile(rf"(?!\.|__)(?:{_NAME_END}|{_NAME_END}{_NAME_CHARACTER}*{_NAME_END})")
_MEMBER_TYPES = {"assets": dict, "links": list}


def plainly_valid(items: list[Any], *, serialized: bool = False) -> list[bool]:
    """For each item, True when :func:`validate_item` (``check_geometry=False``) certainly accepts it as it is:
    the shape of the items of most batches, checked for the batch at once where that is cheaper (timestamps
    already in floe's canonical form, one serialization for the nesting check). False says nothing: the caller
    validates that item alone, which names its problem. ``serialized`` says the caller has written ``items``
    with orjson already (the nesting check is then done)."""

    for collection in {item.get("collection") for item in items if type(item) is dict} - _GOOD_COLLECTIONS:
        if type(collection) is str:
            with contextlib.suppress(ValueError):  # a bad one is refused by name when its items are checked alone
                _remember_collection(check_name(collection, "collection"))
    plain = [_plain_shape(item) for item in items]
    shaped = [item for item, ok in zip(items, plain, strict=True) if ok]
    if not shaped:
        return plain
    good = [True] * len(shaped)
    times = {key: _times_of(shaped, key, good) for key in ("datetime", "start_datetime", "end_datetime")}
    starts, ends = times["start_datetime"], times["end_datetime"]
    if starts is not None and ends is not None:
        for index in np.flatnonzero(pc.fill_null(pc.greater(starts, ends), False).to_numpy(zero_copy_only=False)):
            good[index] = False
    if not serialized:
        try:
            orjson.dumps(shaped)  # orjson stops at its depth limit (the nesting check), and at what is not JSON
        except (orjson.JSONEncodeError, TypeError):
            return [False] * len(items)
    verdicts = iter(good)
    return [ok and next(verdicts) for ok in plain]


def certainly_valid(items: list[Any], *, serialized: bool = False) -> list[bool]:
    """For each item, whether :func:`validate_item` accepts it as it is, its geometry included: :func:`plainly_valid`
    and :func:`refused_geometries` for the batch at once. False says nothing: that item is to be validated alone
    (which names its problem). ``serialized``: as for :func:`plainly_valid`."""
    flags = plainly_valid(items, serialized=serialized)
    plain = [index for index, flag in enumerate(flags) if flag]
    for position in refused_geometries([items[index] for index in plain]):
        flags[plain[position]] = False
    return flags


def accepted_items(
    items: list[Any], *, default_collection: str | None = None, flags: list[bool] | None = None
) -> list[dict[str, Any] | None]:
    """For each item, what :func:`validate_item` returns for it (its geometry checked), or None where it refuses
    it: the verdicts of a batch, at :func:`certainly_valid`'s pace where the items are plain. A caller that must
    name a refused item's problem validates that item alone. ``flags``: :func:`certainly_valid`'s verdicts on
    ``items``, where the caller has them already."""
    flags = flags if flags is not None else certainly_valid(items)
    accepted: list[dict[str, Any] | None] = []
    for item, flag in zip(items, flags, strict=True):
        if flag:
            accepted.append(item)
            continue
        try:
            accepted.append(validate_item(item, default_collection=default_collection))
        except InvalidInput:
            accepted.append(None)
    return accepted


def _times_of(items: list[dict[str, Any]], key: str, good: list[bool]) -> pa.Array | None:
    """Each item's ``key`` as a timestamp column (null where it has none; None when no item has one); an item
    whose text is not an RFC 3339 time is marked not good (each checked as validate_item checks it)."""
    texts = [item["properties"].get(key) for item in items]
    if all(text is None for text in texts):
        return None
    values: list[datetime | None] = []
    for index, text in enumerate(texts):
        value = None
        if text is not None:
            try:
                value = check_timestamp(text, key)
            except ValueError:
                good[index] = False
        values.append(value)
    return pa.array(values, _TIMESTAMP)


def _plain_shape(item: Any) -> bool:
    """The checks of :func:`validate_item` but the timestamps' and the nesting's, for an item of the usual shape
    (a collection already accepted; a datetime, or a range of two); False for anything else."""
    if type(item) is not dict or item.get("type") != "Feature":
        return False
    item_id = item.get("id")
    if type(item_id) is not str or len(item_id) > MAX_NAME_LENGTH or not _PLAIN_NAME.fullmatch(item_id):
        return False
    collection = item.get("collection")
    if type(collection) is not str or collection not in _GOOD_COLLECTIONS:
        return False
    geometry = item.get("geometry")
    if type(geometry) is not dict or type(geometry.get("type")) is not str:
        return False
    properties = item.get("properties")
    if type(properties) is not dict or "datetime" not in properties:
        return False
    when, start, end = properties["datetime"], properties.get("start_datetime"), properties.get("end_datetime")
    if not (type(when) is str or (when is None and type(start) is str and type(end) is str)):
        return False
    if not (start is None or type(start) is str) or not (end is None or type(end) is str):
        return False
    for member, kind in _MEMBER_TYPES.items():
        if member in item and type(item[member]) is not kind:
            return False
    return "bbox" not in item or bbox_problem(item["bbox"]) is None
