"""Collections at a snapshot: the stored ones and any with items, their extents from column bounds, and queryables.

A collection is served if the repository stores its document or if the items
table holds items of it (a document is then made up). Extents are computed,
not stored: the spatial and temporal bounds of each collection's items, from
the data files' column bounds (no row is read) except for files without
bounds or mixing collections, whose few columns are read instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow.compute as pc
from pyiceberg.conversions import from_bytes
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BooleanType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    NestedField,
    PrimitiveType,
    StringType,
    TimestamptzType,
)

from ingest.api._cache import ColumnCache, SnapshotState
from ingest.stac import HILBERT, OVERFLOW, render_datetime

_TIME_COLUMNS = ("datetime", "start_datetime", "end_datetime")
# The bbox bound columns, and whether a collection's extent takes their upper (else lower) bounds.
_BBOX_BOUNDS = (("bbox.xmin", False), ("bbox.ymin", False), ("bbox.xmax", True), ("bbox.ymax", True))
_WHOLE_WORLD = [-180.0, -90.0, 180.0, 90.0]
_TIME = "time"

Bounds = dict[str, list[Any]]
"""Bounds found for one collection: per bbox bound column its values, and under ``time`` epoch microseconds."""


def collection_documents(
    stored: Mapping[str, dict[str, Any]], extents: Mapping[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Collection JSON by id: the stored collections and those with items, each with its computed extent."""
    return {
        collection_id: _collection_document(collection_id, stored.get(collection_id), extents.get(collection_id))
        for collection_id in sorted(set(stored) | set(extents))
    }


def _collection_document(
    collection_id: str, stored: dict[str, Any] | None, extent: dict[str, Any] | None
) -> dict[str, Any]:
    collection = dict(
        stored
        or {
            "type": "Collection",
            "stac_version": "1.0.0",
            "id": collection_id,
            "description": f"Items of collection {collection_id} in this floe repository",
            "license": "other",
            "links": [],
        }
    )
    collection.setdefault("type", "Collection")
    collection.setdefault("stac_version", "1.0.0")
    collection.setdefault("description", collection_id)
    collection.setdefault("license", "other")
    if extent is not None:
        collection["extent"] = extent
    else:
        collection.setdefault(
            "extent", {"spatial": {"bbox": [list(_WHOLE_WORLD)]}, "temporal": {"interval": [[None, None]]}}
        )
    return collection


def extents(state: SnapshotState, columns: ColumnCache) -> dict[str, dict[str, Any]]:
    """Spatial and temporal extent of each collection with items, from the data files' column bounds."""
    fields = _bound_fields(state.schema)
    collection_field = fields.get("collection")
    bounds: dict[str, Bounds] = {}
    for data_file in state.files:
        collection = _bound(data_file, collection_field, upper=False)
        if collection is None or collection != _bound(data_file, collection_field, upper=True):
            # No bounds (or a file mixing collections): read its few columns instead.
            _merge(bounds, _file_bounds(columns, data_file))
        else:
            _merge(bounds, {collection: _metadata_bounds(data_file, fields)})
    return {collection: _extent(entry) for collection, entry in bounds.items()}


def _bound_fields(schema: Schema) -> dict[str, NestedField]:
    """The schema's fields whose column bounds extents use, by column name (absent columns left out)."""
    fields = {}
    for name in ("collection", *(key for key, _ in _BBOX_BOUNDS), *_TIME_COLUMNS):
        found = schema.find_field(name) if name in schema.column_names else None
        if found is not None and isinstance(found.field_type, PrimitiveType):
            fields[name] = found
    return fields


def _bound(data_file: DataFile, column: NestedField | None, upper: bool) -> Any:
    """A data file's lower (or upper) bound of a column, decoded; None when the column or its bound is missing."""
    if column is None or not isinstance(column.field_type, PrimitiveType):
        return None
    mapping = data_file.upper_bounds if upper else data_file.lower_bounds
    raw = (mapping or {}).get(column.field_id)
    return None if raw is None else from_bytes(column.field_type, raw)


def _metadata_bounds(data_file: DataFile, fields: dict[str, NestedField]) -> Bounds:
    """The bounds of a file holding one collection, from its column bounds."""
    entry: Bounds = {}
    for key, upper in _BBOX_BOUNDS:
        value = _bound(data_file, fields.get(key), upper)
        if value is not None:
            entry.setdefault(key, []).append(value)
    for key in _TIME_COLUMNS:
        for upper in (False, True):
            value = _bound(data_file, fields.get(key), upper)
            if value is not None:
                entry.setdefault(_TIME, []).append(value)
    return entry


def _file_bounds(columns: ColumnCache, data_file: DataFile) -> dict[str, Bounds]:
    """The bounds of each collection in a file, from its rows (for files without usable column bounds)."""
    table = columns.read(data_file.file_path, ["collection", "bbox", *_TIME_COLUMNS])
    found: dict[str, Bounds] = {}
    for collection in pc.unique(table.column("collection")).to_pylist():
        if collection is None:
            continue
        rows = table.filter(pc.equal(table.column("collection"), collection))
        entry = found.setdefault(collection, {})
        bbox = rows.column("bbox")
        for key, upper in _BBOX_BOUNDS:
            reduce = pc.max if upper else pc.min
            value = reduce(pc.struct_field(bbox, key.removeprefix("bbox."))).as_py()
            if value is not None:
                entry.setdefault(key, []).append(value)
        for key in _TIME_COLUMNS:
            if key in rows.column_names:
                for reducer in (pc.min, pc.max):
                    when = reducer(rows.column(key)).as_py()
                    if when is not None:
                        entry.setdefault(_TIME, []).append(int(when.timestamp() * 1_000_000))
    return found


def _merge(bounds: dict[str, Bounds], found: dict[str, Bounds]) -> None:
    for collection, values in found.items():
        entry = bounds.setdefault(collection, {})
        for key, more in values.items():
            entry.setdefault(key, []).extend(more)


def _extent(entry: Bounds) -> dict[str, Any]:
    """A STAC collection extent covering every bound found for one collection."""
    if all(entry.get(key) for key, _ in _BBOX_BOUNDS):
        bbox = [
            min(entry["bbox.xmin"]),
            min(entry["bbox.ymin"]),
            max(entry["bbox.xmax"]),
            max(entry["bbox.ymax"]),
        ]
    else:
        bbox = list(_WHOLE_WORLD)
    times = entry.get(_TIME) or []
    interval = [_render_micros(min(times)), _render_micros(max(times))] if times else [None, None]
    return {"spatial": {"bbox": [bbox]}, "temporal": {"interval": [interval]}}


def _render_micros(micros: int) -> str:
    return render_datetime(datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=int(micros)))


# Columns a filter cannot usefully name: item structure, not properties.
_NOT_QUERYABLE = frozenset(
    ("type", "stac_version", "stac_extensions", "geometry", "bbox", "assets", "links", OVERFLOW, HILBERT)
)


GEOMETRY_SCHEMA: dict[str, Any] = {
    "title": "Geometry",
    "description": "A GeoJSON geometry (RFC 7946), as S_INTERSECTS and the other spatial operators take",
    "type": "object",
    "required": ["type"],
    "properties": {
        "type": {
            "enum": [
                "Point",
                "MultiPoint",
                "LineString",
                "MultiLineString",
                "Polygon",
                "MultiPolygon",
                "GeometryCollection",
            ]
        }
    },
}
"""The ``geometry`` queryable, written out rather than a ``$ref`` to geojson.org: a client resolving references
(STAC Browser's search form) would fetch it from the internet, which a served archive may not reach."""


def queryables(schema: Schema, *, closed: bool = False) -> dict[str, Any]:
    """JSON Schema of the properties a filter can use (the table's typed columns).

    With ``closed`` (``api.refuse_unknown_properties``),
    ``additionalProperties`` is false: a filter naming a property no item at
    the snapshot has is refused with a 400 that names it. Otherwise it is
    true: such a filter is answered, its property null in every item.
    """
    properties: dict[str, Any] = {
        "id": {"title": "Item ID", "type": "string"},
        "collection": {"title": "Collection ID", "type": "string"},
        "geometry": GEOMETRY_SCHEMA,
        "datetime": {"title": "Acquisition time", "type": "string", "format": "date-time"},
    }
    for column in schema.fields:
        if column.name in _NOT_QUERYABLE or column.name in properties:
            continue
        column_schema = json_type(column.field_type)
        if column_schema is not None:
            properties[column.name] = column_schema
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://floe.invalid/queryables",
        "type": "object",
        "title": "Queryables",
        "properties": properties,
        "additionalProperties": not closed,
    }


def json_type(field_type: IcebergType) -> dict[str, Any] | None:
    """The JSON Schema of a column's values, for the primitive types a filter compares (else None)."""
    if isinstance(field_type, StringType):
        return {"type": "string"}
    if isinstance(field_type, DoubleType | FloatType):
        return {"type": "number"}
    if isinstance(field_type, LongType | IntegerType):
        return {"type": "integer"}
    if isinstance(field_type, BooleanType):
        return {"type": "boolean"}
    if isinstance(field_type, TimestamptzType):
        return {"type": "string", "format": "date-time"}
    return None
