"""STAC items <-> Arrow rows in the stac-geoparquet layout, losslessly.

Columns follow stac-geoparquet: ``id``, ``collection``, ``geometry`` (WKB),
``bbox`` (struct of doubles), ``datetime``/``start_datetime``/``end_datetime``
(timestamps), properties hoisted to top-level columns, ``assets``, ``links``,
``stac_version``, ``stac_extensions``.

Real archives are heterogeneous, and Arrow's type inference is not lossless
(structs fill missing keys with nulls, a property may be a number in one item
and a string in another). So a column is typed only when its values decode back
to exactly what came in; everything else (type conflicts, explicit nulls, empty
objects, timestamps whose original text differs from the canonical rendering,
foreign members) goes, per row, into the JSON column ``floe:overflow``, which
is merged back on read. Nothing is dropped and nothing is coerced silently; the
one widening is integer -> double where a column mixes both (JSON numbers).
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pyarrow as pa
import shapely

from ingest.stac._columns import column_array, strip_nulls
from ingest.stac._json import loads_json
from ingest.stac._spatial import HILBERT, clustered
from ingest.stac._validate import parse_datetime
from ingest.stac._wkb import one_ring_polygons_wkb, simple_wkb

OVERFLOW = "floe:overflow"
TIMESTAMP = pa.timestamp("us", tz="UTC")
BBOX_TYPE = pa.struct([(name, pa.float64()) for name in ("xmin", "ymin", "xmax", "ymax")])
TIME_COLUMNS = ("datetime", "start_datetime", "end_datetime")
# Top-level item members with a column of their own; everything else in properties.
CORE_COLUMNS = ("type", "stac_version", "stac_extensions", "id", "collection", "geometry", "bbox")
NESTED_TOP = ("assets", "links")
RESERVED = frozenset((*CORE_COLUMNS, *TIME_COLUMNS, *NESTED_TOP, OVERFLOW, HILBERT, "properties"))
_TOP_MEMBERS = frozenset((*CORE_COLUMNS, *NESTED_TOP, "properties"))


@dataclass
class _Overflow:
    top: dict[str, Any]
    properties: dict[str, Any]
    absent: list[str]

    def to_json(self) -> str | None:
        payload: dict[str, Any] = {}
        if self.top:
            payload["top"] = self.top
        if self.properties:
            payload["properties"] = self.properties
        if self.absent:
            payload["absent"] = self.absent
        if not payload:
            return None
        try:
            text = orjson.dumps(payload)
        except (orjson.JSONEncodeError, TypeError):  # an integer beyond 64 bits: the standard library writes it
            text = b"null"
        if b"null" not in text:  # orjson writes NaN and infinities as null; the standard library keeps them
            return text.decode()
        return json.dumps(payload, separators=(",", ":"), allow_nan=True)


class Overflows(dict[int, _Overflow]):
    """Row -> its overflow, made when a row first needs one: most rows of most batches need none."""

    def __missing__(self, row: int) -> _Overflow:
        made = self[row] = _Overflow({}, {}, [])
        return made

    def column(self, count: int) -> pa.Array:
        texts: list[str | None] = [None] * count
        for row, overflow in self.items():
            texts[row] = overflow.to_json()
        return pa.array(texts, type=pa.string())


def normalize_type(data_type: pa.DataType) -> pa.DataType:
    """Arrow type with large/view variants and timestamp zones folded, for comparing schemas."""
    if pa.types.is_large_string(data_type) or pa.types.is_string_view(data_type):
        return pa.string()
    if pa.types.is_large_binary(data_type) or pa.types.is_binary_view(data_type):
        return pa.binary()
    if pa.types.is_timestamp(data_type) and data_type.tz is not None:
        return TIMESTAMP
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return pa.list_(normalize_type(data_type.value_type))
    if pa.types.is_struct(data_type):
        return pa.struct(
            [
                pa.field(data_type.field(i).name, normalize_type(data_type.field(i).type))
                for i in range(data_type.num_fields)
            ]
        )
    if pa.types.is_int32(data_type):
        return pa.int64()
    if pa.types.is_float32(data_type):
        return pa.float64()
    return data_type


_NO_OFFSET = timedelta(0)


def render_datetime(value: datetime) -> str:
    """The canonical RFC 3339 text floe writes for a timestamp."""
    if value.utcoffset() != _NO_OFFSET:  # UTC (pyarrow's ZoneInfo too) is written as it is
        value = value.astimezone(UTC)
    # isoformat writes what strftime("%Y-%m-%dT%H:%M:%S[.%f]") would (six digits of fraction, or none), three
    # times faster, and pads a year below 1000 to four digits as RFC 3339 wants; only "+00:00" becomes "Z".
    return value.isoformat()[:-6] + "Z"


def property_column_ok(name: str) -> bool:
    return bool(name) and "." not in name and name not in RESERVED


def _geometry_to_wkb(geometries: list[dict[str, Any]], overflows: Overflows) -> list[bytes]:
    """Each geometry as ISO WKB. Simple ones are written directly (exact by construction, see
    :mod:`ingest.stac._wkb`); GEOS converts the rest, and keeps in the overflow any that would not read back."""
    wkb: list[bytes] = []
    others: list[int] = []
    for row, geometry in enumerate(geometries):
        simple = simple_wkb(geometry)
        if simple is None:
            others.append(row)
            wkb.append(b"")
        else:
            wkb.append(simple[0])
    if others:
        converted = _geos_wkb([geometries[row] for row in others], [overflows[row] for row in others])
        for row, value in zip(others, converted, strict=True):
            wkb[row] = value
    return wkb


def _geos_wkb(geometries: list[dict[str, Any]], overflows: list[_Overflow]) -> list[bytes]:
    try:
        # GEOS parses GeoJSON text in one vectorized call, much faster than shapely.geometry.shape per item.
        shapes = shapely.from_geojson([orjson.dumps(geometry) for geometry in geometries])
    except (shapely.errors.GEOSException, TypeError, ValueError):
        shapes = [shapely.geometry.shape(geometry) for geometry in geometries]
    wkb = shapely.to_wkb(shapes, output_dimension=3, flavor="iso")
    decoded = shapely.to_geojson(shapely.from_wkb(wkb))
    for row, (text, geometry) in enumerate(zip(decoded, geometries, strict=True)):
        if orjson.loads(text) != geometry:
            overflows[row].top["geometry"] = geometry
    return list(wkb)


def _bbox_rows(items: list[dict[str, Any]], wkb: list[bytes], overflows: Overflows) -> pa.Array:
    unboxed = [row for row, item in enumerate(items) if item.get("bbox") is None]
    derived = dict(zip(unboxed, shapely.bounds(shapely.from_wkb([wkb[row] for row in unboxed])), strict=True))
    rows = []
    for row, item in enumerate(items):
        bbox = item.get("bbox")
        if bbox is None:
            overflows[row].absent.append("bbox")
            xmin, ymin, xmax, ymax = (float(v) for v in derived[row])
        elif len(bbox) == 6:
            overflows[row].top["bbox"] = bbox
            xmin, ymin, _, xmax, ymax, _ = (float(v) for v in bbox)
        else:
            xmin, ymin, xmax, ymax = (float(v) for v in bbox)
        rows.append({"xmin": xmin, "ymin": ymin, "xmax": xmax, "ymax": ymax})
    return pa.array(rows, type=BBOX_TYPE)


def _time_column(items: list[dict[str, Any]], key: str, overflows: Overflows) -> pa.Array:
    # A null datetime (an item with a range) is stored as null, with nothing in the overflow.
    values: list[datetime | None] = []
    for row, item in enumerate(items):
        properties = item["properties"]
        text = properties.get(key)
        if not isinstance(text, str):
            # A null datetime decodes as null anyway; anything else must come back as it was.
            if key in properties and not (key == "datetime" and text is None):
                overflows[row].properties[key] = text
            values.append(None)
            continue
        try:
            parsed = parse_datetime(text)
        except ValueError:
            overflows[row].properties[key] = text
            values.append(None)
            continue
        if render_datetime(parsed) != text:
            overflows[row].properties[key] = text
        values.append(parsed)
    return pa.array(values, type=TIMESTAMP)


@contextmanager
def paused_collection() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while converting a batch.

    A batch allocates hundreds of thousands of small, acyclic objects; each
    allocation burst triggers collections that walk every live object (the
    whole batch of items included), which cost a third of the conversion.
    Nothing here makes cycles, so nothing is lost by collecting afterwards.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def items_to_arrow(
    items: list[dict[str, Any]],
    *,
    untyped: Iterable[str] = (),
    in_order: bool = False,
) -> pa.Table:
    """Convert validated items (see :func:`validate_item`) into one Arrow table.

    ``untyped`` names columns that must not be typed (their values go to the
    overflow column): the writer passes columns whose type conflicts with the
    table's. Rows are returned in spatial order, or with ``in_order`` in the
    items' order, without the :data:`HILBERT` column (rows that travel before
    they are written: ``Writer.add_rows`` clusters them).
    """
    with paused_collection():
        return _items_to_arrow(items, set(untyped), in_order=in_order)


def _items_to_arrow(items: list[dict[str, Any]], untyped: set[str], *, in_order: bool) -> pa.Table:
    overflows = Overflows()
    columns: dict[str, pa.Array] = {}
    for key in ("type", "stac_version"):
        columns[key] = _string_column(items, key, untyped, overflows)
    columns["stac_extensions"] = _extensions_column(items, overflows)
    columns["id"] = pa.array([item["id"] for item in items], type=pa.string())
    columns["collection"] = pa.array([item["collection"] for item in items], type=pa.string())
    geometries = [item["geometry"] for item in items]
    polygons = one_ring_polygons_wkb(geometries)
    wkb = _geometry_to_wkb(geometries, overflows) if polygons is None else None
    columns["geometry"] = polygons if polygons is not None else pa.array(wkb, type=pa.binary())
    columns["bbox"] = _bbox_rows(items, wkb if wkb is not None else columns["geometry"].to_pylist(), overflows)
    for key in TIME_COLUMNS:
        columns[key] = _time_column(items, key, overflows)
    # Foreign top-level members go to the overflow as they are (even one named like a column: properties fill those).
    for row, item in enumerate(items):
        if not _TOP_MEMBERS.issuperset(item):
            for key, value in item.items():
                if key not in _TOP_MEMBERS:
                    overflows[row].top[key] = value
    # Nested members and properties: typed where lossless, else per-row overflow.
    for key, values in _candidate_columns(items, overflows).items():
        typed = typed_or_overflow(key, values, untyped, overflows)
        if typed is not None:
            columns[key] = typed
    columns[OVERFLOW] = overflows.column(len(items))
    return pa.table(columns) if in_order else clustered(pa.table(columns))


def _string_column(items: list[dict[str, Any]], key: str, untyped: set[str], overflows: Overflows) -> pa.Array:
    """A top-level string member (``type``, ``stac_version``); any other value goes to the overflow."""
    values = [item.get(key) for item in items]
    typed = column_array(values) if key not in untyped else None
    if typed is not None and pa.types.is_string(typed.type):
        return typed
    for row, value in enumerate(values):
        if key in items[row]:
            overflows[row].top[key] = value
    return pa.nulls(len(items), pa.string())


def _extensions_column(items: list[dict[str, Any]], overflows: Overflows) -> pa.Array:
    """``stac_extensions`` as a list of strings; anything else (and explicit nulls) goes to the overflow."""
    extensions = [item.get("stac_extensions") for item in items]
    lists_of_strings = all(
        value is None or (isinstance(value, list) and all(isinstance(v, str) for v in value)) for value in extensions
    )
    for row, item in enumerate(items):
        if "stac_extensions" in item and (not lists_of_strings or item["stac_extensions"] is None):
            overflows[row].top["stac_extensions"] = item["stac_extensions"]
    return pa.array(extensions if lists_of_strings else [None] * len(items), type=pa.list_(pa.string()))


def _candidate_columns(items: list[dict[str, Any]], overflows: Overflows) -> dict[str, list[Any]]:
    """Column name -> one value per row (None where absent) of every nested member and property to type.

    Values with no typed form (explicit nulls, empty objects) and properties whose name cannot be a column go to
    the overflow here, in the one pass over the rows.
    """
    candidates: dict[str, list[Any]] = {}
    count = len(items)

    def column(key: str) -> list[Any]:
        # Not setdefault(key, [None] * count): that builds a count-long list for every value, quadratic in rows.
        values = candidates.get(key)
        if values is None:
            values = candidates[key] = [None] * count
        return values

    for row, item in enumerate(items):
        for key in NESTED_TOP:
            if key in item:
                value = item[key]
                if value is None or (type(value) is dict and not value):
                    overflows[row].top[key] = value
                else:
                    column(key)[row] = value
        for key, value in item["properties"].items():
            if key in TIME_COLUMNS:
                continue
            if value is None or (type(value) is dict and not value) or not property_column_ok(key):
                overflows[row].properties[key] = value
                continue
            column(key)[row] = value
    return candidates


EMPTY_LINKS_TYPE = pa.list_(pa.struct([("href", pa.string()), ("rel", pa.string())]))
"""The type of a ``links`` column whose lists are all empty (items read from a STAC API, whose own links floe
drops): the two members every STAC link has, so the table's column fits any later links (more members are
added to it); empty lists decode back exactly whatever their element type."""


def typed_or_overflow(key: str, values: list[Any], untyped: set[str], overflows: Overflows) -> pa.Array | None:
    """The column of ``key`` if its values type losslessly, else None with every present value in the overflow."""
    if key == "links" and key not in untyped and all(value == [] for value in values if value is not None):
        # Arrow infers list<null> for empty lists alone, which no table can store: every row would carry its
        # empty links in the overflow.
        return pa.array(values, type=EMPTY_LINKS_TYPE)
    typed = None if key in untyped else column_array(values)
    if typed is None:
        nested = key in NESTED_TOP
        for row, value in enumerate(values):
            if value is not None:
                (overflows[row].top if nested else overflows[row].properties)[key] = value
    return typed


def geometries_from_wkb(values: list[bytes | None]) -> list[Any]:
    """GeoJSON geometries (dicts) of WKB values, in one pass through shapely; a null stays None."""
    shapes = shapely.from_wkb(values)
    texts = shapely.to_geojson(shapes)
    return [orjson.loads(text) if text is not None else None for text in texts]


_READ_CHUNK = 1024
"""Rows turned into items at once, with the cyclic collector paused (see :func:`arrow_to_items`)."""


def arrow_to_items(table: pa.Table) -> Iterator[dict[str, Any]]:
    """Turn rows written by :func:`items_to_arrow` (any schema version) back into STAC items.

    The columns and then each chunk of rows are turned into Python objects
    with the cyclic collector paused, as the conversion to rows is: the
    collections that bursts of acyclic objects trigger took more than half of
    the time (walking every live object, the items read so far included).
    Items are yielded a chunk at a time, with the collector running again.
    """
    if table.num_rows == 0:
        return
    with paused_collection():
        rows = _RowReader(table)
    for start in range(0, table.num_rows, _READ_CHUNK):
        with paused_collection():
            chunk = [rows.item(row) for row in range(start, min(start + _READ_CHUNK, table.num_rows))]
        yield from chunk


class _RowReader:
    """The columns of one Arrow table as Python lists, and the item each row holds."""

    def __init__(self, table: pa.Table) -> None:
        names = table.column_names
        absent: list[Any] = [None] * table.num_rows
        data = {name: table.column(name).to_pylist() for name in names if name != "geometry"}
        for key in (*CORE_COLUMNS, *TIME_COLUMNS, *NESTED_TOP, OVERFLOW):
            data.setdefault(key, absent)
        self.geometries = geometries_from_wkb(table.column("geometry").to_pylist()) if "geometry" in names else None
        self.head = [(key, data[key]) for key in ("type", "stac_version", "stac_extensions", "id")]
        self.bboxes, self.collections, self.overflows = data["bbox"], data["collection"], data[OVERFLOW]
        self.times = [(key, data[key]) for key in TIME_COLUMNS]
        self.nested = [(key, data[key]) for key in NESTED_TOP]
        self.properties = [(key, data[key]) for key in names if key not in RESERVED]

    def item(self, row: int) -> dict[str, Any]:
        item: dict[str, Any] = {key: values[row] for key, values in self.head if values[row] is not None}
        item["geometry"] = self.geometries[row] if self.geometries is not None else None
        bbox = self.bboxes[row]
        if bbox is not None:
            item["bbox"] = [bbox["xmin"], bbox["ymin"], bbox["xmax"], bbox["ymax"]]
        properties: dict[str, Any] = {}
        for key, values in self.times:
            value = values[row]
            if value is not None:
                properties[key] = render_datetime(value)
            elif key == "datetime":
                properties[key] = None
        for key, values in self.properties:
            value = values[row]
            if value is not None:
                properties[key] = strip_nulls(value)
        item["properties"] = properties
        for key, values in self.nested:
            value = values[row]
            if value is not None:
                item[key] = strip_nulls(value)
        collection = self.collections[row]
        if collection is not None:
            item["collection"] = collection
        overflow_text = self.overflows[row]
        if overflow_text:
            _apply_overflow(item, loads_json(overflow_text))
        return item


def overflow_keys(text: str | None) -> set[str]:
    """The property and top-level keys one row keeps in ``floe:overflow`` (its typed cells are null there)."""
    if not text:
        return set()
    document = loads_json(text)
    if not isinstance(document, dict):
        return set()
    return set(document.get("properties", {})) | set(document.get("top", {}))


def _apply_overflow(item: dict[str, Any], overflow: Mapping[str, Any]) -> None:
    for key in overflow.get("absent", ()):
        item.pop(key, None)
    item.update(overflow.get("top", {}))
    item["properties"].update(overflow.get("properties", {}))
