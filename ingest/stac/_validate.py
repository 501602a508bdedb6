"""Checks a STAC item must pass before floe stages it.

The checks guard the table and the array layout: an item's ``id`` and
``collection`` become path segments (``/<collection>/<item_id>/``), so
anything that could escape a path or collide with a reserved name is refused.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import Any

import orjson
import shapely

from ingest.errors import InvalidItem

MAX_NAME_LENGTH = 255
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_FRACTION = re.compile(r"(\.\d{6})\d+")


def check_name(value: Any, what: str) -> str:
    """Return ``value`` if it is safe as one path segment, else raise ``ValueError`` saying why."""
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {type(value).__name__}")
    if not value:
        raise ValueError(f"{what} is empty")
    if len(value) > MAX_NAME_LENGTH:
        raise ValueError(f"{what} is longer than {MAX_NAME_LENGTH} characters")
    if "/" in value or "\\" in value:
        raise ValueError(f"{what} {value!r} contains a path separator")
    if _CONTROL.search(value):
        raise ValueError(f"{what} {value!r} contains control characters")
    if value.strip() != value:
        raise ValueError(f"{what} {value!r} has leading or trailing whitespace")
    if value.startswith("."):
        raise ValueError(f"{what} {value!r} starts with '.' (could name a parent or hidden path)")
    if value.startswith("__"):
        raise ValueError(f"{what} {value!r} starts with '__', which Zarr reserves")
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
    text = _FRACTION.sub(r"\1", text)
    parsed = datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def _check_bbox(bbox: Any) -> None:
    if not isinstance(bbox, list) or len(bbox) not in (4, 6):
        raise ValueError("bbox must be a list of 4 or 6 numbers")
    for number in bbox:
        if isinstance(number, bool) or not isinstance(number, int | float) or not math.isfinite(number):
            raise ValueError(f"bbox holds a non-number {number!r}")


def validate_item(
    item: Any, *, source: str | None = None, default_collection: str | None = None, check_geometry: bool = True
) -> dict[str, Any]:
    """Return the item (with ``collection`` filled from ``default_collection`` if absent) or raise InvalidItem.

    The item is not copied unless a default collection is filled in. Without
    ``check_geometry`` the geometry's GeoJSON is not parsed: the caller does it
    for many items at once with :func:`unparseable_geometries`.
    """
    if not isinstance(item, dict):
        raise InvalidItem(f"expected a STAC item object, got {type(item).__name__}", source=source)
    raw_id = item.get("id")
    named = raw_id if isinstance(raw_id, str) else repr(raw_id)
    if item.get("type") != "Feature":
        raise InvalidItem(f"type must be 'Feature', got {item.get('type')!r}", item_id=named, source=source)
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
    check_name(item["collection"], "collection")
    return item


def _check_geometry(item: dict[str, Any], *, parse: bool) -> None:
    geometry = item.get("geometry")
    if geometry is None:
        raise ValueError("item has no geometry")
    if not isinstance(geometry, dict) or not isinstance(geometry.get("type"), str):
        raise ValueError("geometry is not a GeoJSON geometry object")
    if parse:
        try:
            shapely.from_geojson(orjson.dumps(geometry))
        except (shapely.errors.GEOSException, TypeError, ValueError) as error:
            raise ValueError(f"geometry is not valid GeoJSON ({error})") from None
    if "bbox" in item:
        _check_bbox(item["bbox"])


def _check_times(properties: Any) -> None:
    """``properties`` exists and holds an RFC 3339 ``datetime``, or null with a start/end range."""
    if not isinstance(properties, dict):
        raise ValueError("item has no properties object")
    if "datetime" not in properties:
        raise ValueError("properties.datetime is required (null is allowed with start_datetime and end_datetime)")
    if properties["datetime"] is None and (
        properties.get("start_datetime") is None or properties.get("end_datetime") is None
    ):
        raise ValueError("item has no datetime (and no start_datetime/end_datetime range)")
    for key in ("datetime", "start_datetime", "end_datetime"):
        value = properties.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise ValueError(f"properties.{key} must be an RFC 3339 string, got {value!r}")
        try:
            parse_datetime(value)
        except ValueError:
            raise ValueError(f"properties.{key} {value!r} is not an RFC 3339 timestamp") from None


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
    bits) is measured by walking it instead.
    """
    try:
        orjson.dumps(item)
        return
    except orjson.JSONEncodeError as error:
        if "ecursion" in str(error):
            raise ValueError(f"the item nests more than {MAX_NESTING} levels deep") from None
    deepest = 0
    pending: list[tuple[dict[str, Any] | list[Any], int]] = [(item, 1)]
    while pending:
        node, depth = pending.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_NESTING:
            raise ValueError(f"the item nests more than {MAX_NESTING} levels deep")
        children = node.values() if isinstance(node, dict) else node
        pending.extend((child, depth + 1) for child in children if isinstance(child, dict | list))


def unparseable_geometries(items: list[dict[str, Any]]) -> list[int]:
    """Indexes of the items whose geometry GEOS cannot parse, found in one vectorized call.

    Parsing item by item costs tens of microseconds each; a batch costs a
    fraction. The items must have passed ``validate_item(check_geometry=False)``.
    """
    if not items:
        return []
    try:
        texts = [orjson.dumps(item["geometry"]) for item in items]
    except TypeError:
        return list(range(len(items)))  # someone holds a non-JSON value: let the per-item check say who
    parsed = shapely.from_geojson(texts, on_invalid="ignore")
    return [index for index, shape in enumerate(parsed) if shape is None]
