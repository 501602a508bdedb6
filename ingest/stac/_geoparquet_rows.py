"""stac-geoparquet record batches turned into floe's rows on columns, without an item dict per row.

:func:`geoparquet_rows` gives, for the rows of a batch it can vouch for, the rows :func:`~ingest.stac.items_to_arrow`
would make of the items :func:`~ingest.stac.geoparquet_items` reads from them (once validated): they decode
(:func:`~ingest.stac.arrow_to_items`) to the same items. Which columns are typed and which values go to the overflow
may differ (each is lossless), as may the order of the properties. Every other row is left to the item path, which
validates it and names its problem as for any item; so is a whole batch whose layout is not the one handled here.

A row is vouched for only when every check :func:`~ingest.stac.validate_item` makes certainly passes:
``type`` "Feature"; an id of printable ASCII that :func:`~ingest.stac.check_name` accepts without decoding (no
``%``); a collection it accepts; a geometry GEOS reads, of a GeoJSON type, not empty, its coordinates finite and
within range, inside its bbox; a bbox that is four finite numbers in range, south of north and west of east; a
``datetime``, or a range of two, start before end, in the years 1000-9999; ``assets`` an object, ``links`` a list.

What the item path makes of such a row, and so what these rows hold:

- timestamps are text in the items (stac-geoparquet renders them, ``strftime("%Y-%m-%dT%H:%M:%SZ")``, six
  digits of fraction); where that text is not floe's canonical one the overflow keeps it, as for any item;
- a null cell is a property the item holds as ``null`` (stac-geoparquet's reader gives every field of the
  schema): the overflow keeps it;
- ``assets`` lacks the assets a row has none of.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import shapely

from ingest.stac._columns import nested_as_is
from ingest.stac._geometry import TOLERANCE
from ingest.stac._geoparquet import PROJ_GEOMETRY
from ingest.stac._rows import (
    BBOX_TYPE,
    EMPTY_LINKS_TYPE,
    OVERFLOW,
    TIME_COLUMNS,
    TIMESTAMP,
    Overflows,
    geometries_from_wkb,
    paused_collection,
    property_column_ok,
    typed_or_overflow,
)
from ingest.stac._validate import MAX_NAME_LENGTH, check_name

STAC_TIMESTAMPS = frozenset(
    ("datetime", "start_datetime", "end_datetime", "created", "updated", "expires", "published", "unpublished")
)
"""The timestamp columns stac-geoparquet's reader renders as text (``convert_timestamp_columns_to_string``)."""
_TEXT_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
_TOP_COLUMNS = ("type", "stac_version", "stac_extensions", "id", "collection", "geometry", "bbox", "assets", "links")
_SCALARS = (pa.types.is_string, pa.types.is_large_string, pa.types.is_boolean, pa.types.is_floating, pa.types.is_null)
_BBOX_SIDES = ("xmin", "ymin", "xmax", "ymax")
# GEOS type ids of the GeoJSON geometries a row may hold here (a collection is left to the item path).
_GEOJSON_TYPES = np.array([0, 1, 3, 4, 5, 6])
_LONGITUDE, _LATITUDE = 180.0 + TOLERANCE, 90.0 + TOLERANCE
# check_name accepts these ids as they are: printable ASCII without a separator or a percent sign, not starting
# with "." or "__", no space at either end (RE2 has no lookahead: the starts are tested apart).
_PLAIN_ID = r"^[!-$&-.0-\[\]-~]([ -$&-.0-\[\]-~]*[!-$&-.0-\[\]-~])?$"
_MAX_DEPTH = 64
"""Nested types deeper than this are left to the item path (its nesting check)."""


@dataclass
class MappedRows:
    """What :func:`geoparquet_rows` made of a batch."""

    table: pa.Table
    """floe's rows for the rows vouched for, in the batch's order (not yet in the table's sort order)."""
    rows: np.ndarray
    """The batch's row index of each of them."""
    others: np.ndarray
    """The rows left to the item path, in order."""
    checking: float = 0.0
    """Seconds spent checking the rows (what validation is to items)."""
    laying_out: float = 0.0
    """Seconds spent laying the rows vouched for out as floe's columns (what conversion to Arrow is to items)."""


def geoparquet_rows(batch: pa.RecordBatch) -> MappedRows | None:
    """floe's rows for the rows of the stac-geoparquet ``batch`` it can vouch for (see the module); None when
    the batch's layout is not the one handled here (its every row is then left to the item path)."""
    if not _handled(batch.schema):
        return None
    with paused_collection():
        return _mapped(batch)


def _handled(schema: pa.Schema) -> bool:
    names = schema.names
    if len(set(names)) != len(names) or "properties" in names:
        return False  # stac-geoparquet before 0.6 nested the properties
    if not {"type", "id", "collection", "geometry", "bbox", "datetime", "assets"} <= set(names):
        return False
    return all(_field_handled(field.name, field.type) for field in schema)


def _field_handled(name: str, kind: pa.DataType) -> bool:
    """Whether a column of the batch is one this module reads (any other: the item path reads the batch)."""
    if name in ("type", "stac_version", "id", "collection"):
        return _text(kind)
    if name == "stac_extensions":  # list<null>: every row's list empty
        return _is_list(kind) and (_text(kind.value_type) or pa.types.is_null(kind.value_type))
    if name in ("geometry", PROJ_GEOMETRY):
        return pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
    if name == "bbox":
        sides = [kind.field(i) for i in range(kind.num_fields)] if pa.types.is_struct(kind) else []
        return [side.name for side in sides] == list(_BBOX_SIDES) and all(
            pa.types.is_floating(side.type) or pa.types.is_integer(side.type) for side in sides
        )
    if name in STAC_TIMESTAMPS:
        return pa.types.is_timestamp(kind) and kind.unit == "us" and kind.tz == "UTC"
    if name == "assets":
        return pa.types.is_struct(kind) and _depth(kind) <= _MAX_DEPTH and not _has_proj_geometry(kind)
    if name == "links":
        return _is_list(kind) and _depth(kind) <= _MAX_DEPTH
    return _scalar(kind) or ((pa.types.is_struct(kind) or _is_list(kind)) and _depth(kind) <= _MAX_DEPTH)


def _text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind)


def _scalar(kind: pa.DataType) -> bool:
    """A property type whose values the item path types as they are: text, booleans, floats, integers a signed
    64-bit column holds (and nulls alone: a property every row holds as null)."""
    if any(test(kind) for test in _SCALARS):
        return True
    return pa.types.is_signed_integer(kind) or (pa.types.is_unsigned_integer(kind) and kind.bit_width < 64)


def _depth(kind: pa.DataType) -> int:
    if pa.types.is_struct(kind):
        return 1 + max((_depth(kind.field(i).type) for i in range(kind.num_fields)), default=0)
    if _is_list(kind):
        return 1 + _depth(kind.value_type)
    return 0


def _has_proj_geometry(assets: pa.DataType) -> bool:
    """An asset with a ``proj:geometry`` (WKB, which the item path turns into GeoJSON): left to it."""
    return any(pa.types.is_struct(asset.type) and asset.type.get_field_index(PROJ_GEOMETRY) >= 0 for asset in assets)


def _mapped(batch: pa.RecordBatch) -> MappedRows:
    started = time.perf_counter()
    count = batch.num_rows
    ok = np.ones(count, dtype=bool)
    ok &= _true(pc.equal(batch.column("type"), "Feature"))
    for name in ("stac_version", "stac_extensions", "links"):
        if name in batch.schema.names:
            ok &= _true(pc.is_valid(batch.column(name)))
    if "stac_extensions" in batch.schema.names:
        ok &= _true(pc.equal(pc.list_value_length(batch.column("stac_extensions")), _list_valid_lengths(batch)))
    ok &= _plain_ids(batch.column("id"))
    ok &= _good_collections(batch.column("collection"))
    bbox = _bbox(batch.column("bbox"), ok)
    wkb = _geometries(batch.column("geometry"), bbox, ok)
    times = _times(batch, ok)
    ok &= _true(pc.is_valid(batch.column("assets")))
    rows = np.flatnonzero(ok)
    others = np.flatnonzero(~ok)
    indices = pa.array(rows, type=pa.int64())
    checked = time.perf_counter()
    table = _floe_columns(
        batch.take(indices), wkb.take(indices), {key: value.take(indices) for key, value in times.items()}
    )
    return MappedRows(table, rows, others, checked - started, time.perf_counter() - checked)


def _true(mask: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean column as numpy, null counted false."""
    return np.asarray(pc.fill_null(mask, False).to_numpy(zero_copy_only=False), dtype=bool)


def _list_valid_lengths(batch: pa.RecordBatch) -> pa.Array:
    """For each row's ``stac_extensions``, how many of its strings are not null (a null one: the item path)."""
    lists = batch.column("stac_extensions")
    valid = pc.is_valid(pc.list_flatten(lists)).cast(pa.int64())
    parents = pc.list_parent_indices(lists)
    counts = np.zeros(len(lists), dtype=np.int64)
    np.add.at(counts, parents.to_numpy(), valid.to_numpy())
    return pa.array(counts)


def _plain_ids(ids: pa.Array) -> np.ndarray:
    ok = _true(pc.match_substring_regex(ids, _PLAIN_ID))
    ok &= _true(pc.less_equal(pc.utf8_length(ids), MAX_NAME_LENGTH))
    ok &= ~_true(pc.starts_with(ids, "."))
    ok &= ~_true(pc.starts_with(ids, "__"))
    return ok


def _good_collections(collections: pa.Array) -> np.ndarray:
    """Rows whose collection check_name accepts (each distinct one checked once)."""
    good = []
    for value in pc.unique(collections.drop_null()).to_pylist():
        try:
            good.append(check_name(value, "collection"))
        except ValueError:
            continue
    return _true(pc.is_in(collections, value_set=pa.array(good, type=collections.type)))


def _bbox(column: pa.StructArray, ok: np.ndarray) -> np.ndarray:
    """The bboxes as an (n, 4) array; rows whose bbox the item path would refuse or read as crossing the
    antimeridian (checked there) are no longer ``ok``."""
    ok &= _true(pc.is_valid(column))
    sides = np.column_stack(
        [
            pc.fill_null(pc.struct_field(column, name).cast(pa.float64()), np.nan).to_numpy(zero_copy_only=False)
            for name in _BBOX_SIDES
        ]
    ).astype(np.float64)
    west, south, east, north = sides.T
    with np.errstate(invalid="ignore"):
        ok &= np.isfinite(sides).all(axis=1) & (south <= north) & (west <= east)
        ok &= (np.abs(west) <= _LONGITUDE) & (np.abs(east) <= _LONGITUDE)
        ok &= (np.abs(south) <= _LATITUDE) & (np.abs(north) <= _LATITUDE)
    return sides


def _geometries(column: pa.Array, bbox: np.ndarray, ok: np.ndarray) -> pa.Array:
    """Each geometry as ISO WKB (as the item path writes it); rows whose geometry GEOS cannot read, or that the
    item path would refuse or might read otherwise, are no longer ``ok``."""
    shapes = shapely.from_wkb(np.asarray(column.to_numpy(zero_copy_only=False), dtype=object), on_invalid="ignore")
    ok &= ~shapely.is_missing(shapes)
    ok &= np.isin(shapely.get_type_id(shapes), _GEOJSON_TYPES)
    ok &= ~shapely.is_empty(shapes)
    ok &= ~shapely.has_m(shapes) if hasattr(shapely, "has_m") else True
    coordinates, owner = shapely.get_coordinates(shapes, include_z=True, return_index=True)
    with np.errstate(invalid="ignore"):
        # A 2D geometry's z is NaN here: only a 3D one's must be finite.
        stray = ~np.isfinite(coordinates[:, :2]).all(axis=1)
        stray |= shapely.has_z(shapes)[owner] & ~np.isfinite(coordinates[:, 2])
        stray |= (np.abs(coordinates[:, 0]) > _LONGITUDE) | (np.abs(coordinates[:, 1]) > _LATITUDE)
    ok[owner[stray]] = False
    bounds = shapely.bounds(shapes)
    west, south, east, north = bbox.T
    with np.errstate(invalid="ignore"):
        inside = (bounds[:, 0] >= west - TOLERANCE) & (bounds[:, 2] <= east + TOLERANCE)
        inside &= (bounds[:, 1] >= south - TOLERANCE) & (bounds[:, 3] <= north + TOLERANCE)
    ok &= inside
    kept = np.where(ok, shapes, None)
    return pa.array(shapely.to_wkb(kept, output_dimension=3, flavor="iso"), type=pa.binary())


def _times(batch: pa.RecordBatch, ok: np.ndarray) -> dict[str, pa.Array]:
    """The three STAC timestamps (null columns where the batch has none); rows without a datetime or a range,
    with a range that ends before it starts, or in a year RFC 3339 cannot write in four digits, are no longer
    ``ok``."""
    count = batch.num_rows
    times = {
        key: batch.column(key) if key in batch.schema.names else pa.nulls(count, TIMESTAMP) for key in TIME_COLUMNS
    }
    present = {key: _true(pc.is_valid(column)) for key, column in times.items()}
    ok &= present["datetime"] | (present["start_datetime"] & present["end_datetime"])
    ok &= ~_true(pc.greater(times["start_datetime"], times["end_datetime"]))
    for column in times.values():
        years = pc.year(column)
        ok &= ~_true(pc.or_(pc.less(years, 1000), pc.greater(years, 9999)))
    return times


def _floe_columns(batch: pa.RecordBatch, wkb: pa.Array, times: dict[str, pa.Array]) -> pa.Table:
    """The rows (each vouched for) as :func:`~ingest.stac.items_to_arrow` lays them out, unsorted."""
    count = batch.num_rows
    names = batch.schema.names
    overflows = Overflows()
    columns: dict[str, pa.Array] = {}
    for key in ("type", "stac_version"):
        columns[key] = batch.column(key).cast(pa.string()) if key in names else pa.nulls(count, pa.string())
    extensions = pa.list_(pa.string())
    columns["stac_extensions"] = (
        batch.column("stac_extensions").cast(extensions) if "stac_extensions" in names else pa.nulls(count, extensions)
    )
    columns["id"] = batch.column("id").cast(pa.string())
    columns["collection"] = batch.column("collection").cast(pa.string())
    columns["geometry"] = wkb
    columns["bbox"] = batch.column("bbox").cast(BBOX_TYPE)
    time_members = []
    for key in TIME_COLUMNS:
        columns[key] = times[key].cast(TIMESTAMP)
        if key in names:
            time_members.append(_time_texts(key, times[key], overflows))
    for key in ("assets", "links"):
        if key in names:
            typed = _nested(key, batch.column(key), overflows, top=True)
            if typed is not None:
                columns[key] = typed
    for key in names:
        if key in _TOP_COLUMNS or key in TIME_COLUMNS:
            continue
        typed = _property(key, batch.column(key), overflows)
        if typed is not None:
            columns[key] = typed
    columns[OVERFLOW] = _overflow_column(count, overflows, time_members)
    return pa.table(columns)


def _time_texts(key: str, column: pa.Array, overflows: Overflows) -> pa.Array:
    """What the overflow keeps of a STAC timestamp: its text where that is not floe's canonical one (a whole
    second, which stac-geoparquet writes with six zeros), as the JSON member ``"key":"text"`` (null where none);
    a null range end is kept as null in ``overflows``."""
    present = _true(pc.is_valid(column))
    if key != "datetime":
        for row in np.flatnonzero(~present):
            overflows[int(row)].properties[key] = None
    micros = pc.fill_null(column.cast(pa.int64()), 0).to_numpy(zero_copy_only=False)
    kept = pa.array(present & (np.mod(micros, 1_000_000) == 0))
    texts = pc.strftime(column, format=_TEXT_FORMAT)
    member = pc.binary_join_element_wise(f'"{key}":"', texts, '"', "")
    return pc.if_else(kept, member, pa.nulls(len(column), pa.string()))


def _overflow_column(count: int, overflows: Overflows, time_members: list[pa.Array]) -> pa.Array:
    """The ``floe:overflow`` column: rows with nothing but timestamp texts to keep written on columns (most rows
    of most batches), the others through the item path's overflow object, their texts added to it."""
    if not time_members:
        return overflows.column(count)
    # Each member with a comma before it, joined, the first comma dropped ("skip" of pyarrow 21's join drops a
    # row whose every member is null, so none is null here).
    members = pc.binary_join_element_wise(
        *(pc.fill_null(pc.binary_join_element_wise(",", member, ""), "") for member in time_members), ""
    )
    texts = pc.if_else(
        pc.equal(members, ""),
        pa.nulls(count, pa.string()),
        pc.binary_join_element_wise('{"properties":{', pc.utf8_slice_codeunits(members, 1), "}}", ""),
    )
    if not overflows:
        return texts
    for row in list(overflows):
        for member in time_members:
            text = member[row].as_py()
            if text is not None:  # '"key":"text"': neither holds a quote or a colon-quote
                key, _, value = text.partition('":"')
                overflows[row].properties[key[1:]] = value[:-1]
    others = np.zeros(count, dtype=bool)
    others[list(overflows)] = True
    return pc.if_else(pa.array(others), overflows.column(count), texts)


def _nested(key: str, column: pa.Array, overflows: Overflows, *, top: bool) -> pa.Array | None:
    """A nested member (``assets``, ``links``, or a property) as the item path types it: the column as it is where
    it decodes to the same values (no null below its rows), else the item path's own function on its values."""
    typed = nested_as_is(column, absent_members=key == "assets")
    if typed is not None:
        if key == "links" and pa.types.is_null(typed.type.value_type):
            typed = column.cast(EMPTY_LINKS_TYPE)  # lists all empty, typed as the item path types them
        for null in np.flatnonzero(~_true(pc.is_valid(column))).tolist():
            (overflows[null].top if top else overflows[null].properties)[key] = None
        return typed if column.null_count < len(column) else None
    values = column.to_pylist()
    if key == "assets":
        values = [
            {name: asset for name, asset in value.items() if asset is not None} if value else value for value in values
        ]
    candidates: list[Any] = [None] * len(values)
    for row, value in enumerate(values):
        if value is None or (type(value) is dict and not value):
            (overflows[row].top if top else overflows[row].properties)[key] = value
        else:
            candidates[row] = value
    return typed_or_overflow(key, candidates, set(), overflows)


def _property(key: str, column: pa.Array, overflows: Overflows) -> pa.Array | None:
    """A property's column: scalars typed as they are, a null kept in the overflow as the item's null."""
    if key in STAC_TIMESTAMPS:
        column = pc.strftime(column, format=_TEXT_FORMAT)
    elif key == PROJ_GEOMETRY:
        return _generic(key, geometries_from_wkb(column.to_pylist()), overflows)
    if property_column_ok(key) and (pa.types.is_struct(column.type) or _is_list(column.type)):
        return _nested(key, column, overflows, top=False)
    if not property_column_ok(key) or not _scalar(column.type):
        return _generic(key, column.to_pylist(), overflows)
    for row in np.flatnonzero(~_true(pc.is_valid(column))):
        overflows[int(row)].properties[key] = None
    if column.null_count == len(column):
        return None
    kind = column.type
    if pa.types.is_integer(kind):
        return column.cast(pa.int64())
    if pa.types.is_floating(kind):
        return column.cast(pa.float64())
    if pa.types.is_large_string(kind):
        return column.cast(pa.string())
    return column


def _generic(key: str, values: list[Any], overflows: Overflows) -> pa.Array | None:
    """A property the item path types from its values (nested ones, and names that cannot be a column)."""
    candidates: list[Any] = [None] * len(values)
    ok = property_column_ok(key)
    for row, value in enumerate(values):
        if value is None or (type(value) is dict and not value) or not ok:
            overflows[row].properties[key] = value
        else:
            candidates[row] = value
    if not ok:
        return None
    return typed_or_overflow(key, candidates, set(), overflows)
