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
    item_id = raw_id if isinstance(raw_id, str) else None

    def fail(reason: str) -> InvalidItem:
        return InvalidItem(reason, item_id=item_id if item_id is not None else repr(raw_id), source=source)

    if item.get("type") != "Feature":
        raise fail(f"type must be 'Feature', got {item.get('type')!r}")
    if "id" not in item:
        raise InvalidItem("item has no id", source=source)
    try:
        check_name(raw_id, "id")
    except ValueError as error:
        raise fail(str(error)) from None
    if item.get("collection") is None:
        if default_collection is None:
            raise fail("item has no collection (give one with --collection)")
        item = {**item, "collection": default_collection}
    try:
        check_name(item["collection"], "collection")
    except ValueError as error:
        raise fail(str(error)) from None

    geometry = item.get("geometry")
    if geometry is None:
        raise fail("item has no geometry")
    if not isinstance(geometry, dict) or not isinstance(geometry.get("type"), str):
        raise fail("geometry is not a GeoJSON geometry object")
    if check_geometry:
        try:
            shapely.from_geojson(orjson.dumps(geometry))
        except (shapely.errors.GEOSException, TypeError, ValueError) as error:
            raise fail(f"geometry is not valid GeoJSON ({error})") from None
    if "bbox" in item:
        try:
            _check_bbox(item["bbox"])
        except ValueError as error:
            raise fail(str(error)) from None

    properties = item.get("properties")
    if not isinstance(properties, dict):
        raise fail("item has no properties object")
    if "datetime" not in properties:
        raise fail("properties.datetime is required (null is allowed with start_datetime and end_datetime)")
    if properties["datetime"] is None and (
        properties.get("start_datetime") is None or properties.get("end_datetime") is None
    ):
        raise fail("item has no datetime (and no start_datetime/end_datetime range)")
    for key in ("datetime", "start_datetime", "end_datetime"):
        value = properties.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise fail(f"properties.{key} must be an RFC 3339 string, got {value!r}")
        try:
            parse_datetime(value)
        except ValueError:
            raise fail(f"properties.{key} {value!r} is not an RFC 3339 timestamp") from None
    if "assets" in item and not isinstance(item["assets"], dict):
        raise fail("assets must be an object")
    if "links" in item and not isinstance(item["links"], list):
        raise fail("links must be a list")
    return item


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
