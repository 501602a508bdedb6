"""The search engine: plan through Iceberg (partition and column-bound pruning), then filter exactly, file by file.

One :class:`SearchEngine` serves a repository. What a snapshot resolves to
(table metadata, its data files, collections and their extents) never changes,
so it is cached per snapshot id; only branch names are resolved per request.

Results stream: files are read one at a time (filter columns first, the full
rows only of files that match) and reading stops once ``limit`` items are
found. A next-page token records the snapshot, the file and the row to resume
from (or, for sorted searches, the offset into the sorted order), so paging a
branch while writers commit returns one consistent result.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import cql2
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import shapely
import shapely.geometry
from pyiceberg.conversions import from_bytes
from pyiceberg.expressions import (
    AlwaysTrue,
    And,
    BooleanExpression,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Or,
)
from pyiceberg.expressions.visitors import (
    bind,
    extract_field_ids,
)
from pyiceberg.io.pyarrow import expression_to_pyarrow, schema_to_pyarrow
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import PrimitiveType, StructType

from ingest._compat import may_match, must_match
from ingest.api._filter import (
    Translation,
    and_expressions,
    column_of,
    parse_filter,
    query_to_cql2,
    timestamp_micros,
    translate,
)
from ingest.errors import CollectionNotFound, InvalidSearch, RefNotFound
from ingest.repository import Repository
from ingest.stac import OVERFLOW, arrow_to_items, overflow_keys, parse_datetime, render_datetime, served_arrays_asset
from ingest.storage import ARRAYS_DIR

log = logging.getLogger(__name__)

DEFAULT_LIMIT = 10
MAX_LIMIT = 10_000
_SNAPSHOT_CACHE = 64
DEFAULT_CACHE_MB = 256
_RESIDUAL_CHUNK = 256
_ROW = "__floe_row"
_FILE = "__floe_file"


@dataclass(frozen=True)
class SortKey:
    """One sortby entry: a table column and its direction."""

    column: str
    descending: bool = False


@dataclass
class SearchRequest:
    """A STAC item search, as the API and ``floe search`` receive it (not yet validated)."""

    collections: list[str] | None = None
    ids: list[str] | None = None
    bbox: list[float] | None = None
    intersects: dict[str, Any] | str | None = None
    datetime: str | None = None
    filter: str | dict[str, Any] | None = None
    filter_lang: str | None = None
    query: dict[str, Any] | str | None = None
    sortby: list[SortKey] | list[str] | None = None
    limit: int = DEFAULT_LIMIT
    token: str | None = None


@dataclass
class SearchPage:
    """One page of results at one snapshot, and the token of the next page (None at the end)."""

    items: list[dict[str, Any]]
    snapshot_id: str
    next_token: str | None = None


@dataclass
class _Plan:
    """A validated search: what Iceberg prunes with, what decides rows, what is left for shapely and cql2."""

    prune: BooleanExpression
    exact: BooleanExpression
    geometries: list[Any]
    residual: cql2.Expr | None
    sortby: list[SortKey]
    collections: list[str] | None
    # For files where some row keeps a filtered property in floe:overflow (a type conflict at write time): the
    # typed column misses those values, so such files are pruned and filtered without the translated filter,
    # and every row is matched against the whole filter.
    base_prune: BooleanExpression = field(default_factory=AlwaysTrue)
    base_exact: BooleanExpression = field(default_factory=AlwaysTrue)
    full_filter: cql2.Expr | None = None
    property_columns: frozenset[str] = frozenset()


@dataclass
class _Mode:
    """How the rows of one file are tested: what prunes, what the Arrow filter is, what cql2 matches."""

    prune: BooleanExpression
    exact: BooleanExpression
    residual: cql2.Expr | None
    geometries: list[Any]
    evaluator: Any = None
    arrow_filter: pc.Expression | None = None
    filter_columns: dict[str, pa.DataType] = field(default_factory=dict)
    whole: Any = None

    @property
    def needs_rows_test(self) -> bool:
        return not isinstance(self.prune, AlwaysTrue) or bool(self.geometries) or self.residual is not None


@dataclass
class SnapshotState:
    """Everything a snapshot resolves to that searches need (immutable, so cached)."""

    snapshot_id: str
    table: Table
    schema: Schema
    arrow_schema: pa.Schema
    files: list[DataFile]
    """Every live data file, in path order (token positions index this list)."""
    collections: dict[str, dict[str, Any]] | None = None
    extents: dict[str, dict[str, Any]] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class _CachedFile:
    """Decoded columns of one data file (data files are immutable)."""

    names: list[str] | None = None
    num_rows: int = 0
    metadata: pq.FileMetaData | None = None
    columns: dict[str, pa.ChunkedArray] = field(default_factory=dict)
    nbytes: int = 0


def encode_token(payload: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(payload)).decode().rstrip("=")


def decode_token(token: str) -> dict[str, Any]:
    try:
        payload = orjson.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (binascii.Error, ValueError, orjson.JSONDecodeError) as error:
        raise InvalidSearch(f"token {token!r} is not a token this server issued") from error
    positions_ok = isinstance(payload, dict) and all(
        isinstance(payload.get(key, 0), int) and not isinstance(payload.get(key, 0), bool) and payload.get(key, 0) >= 0
        for key in ("f", "r", "o")
    )
    if not positions_ok or not isinstance(payload.get("s"), str):
        raise InvalidSearch(f"token {token!r} is not a token this server issued")
    return payload


def parse_bbox(bbox: Any) -> list[float] | None:
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
    xmin, ymin, xmax, ymax = (numbers[0], numbers[1], numbers[3], numbers[4]) if len(numbers) == 6 else numbers
    if ymin > ymax:
        raise InvalidSearch(f"bbox {bbox!r}: the southern edge {ymin} lies north of the northern edge {ymax}")
    if not (-90 <= ymin <= 90 and -90 <= ymax <= 90 and -180 <= xmin <= 180 and -180 <= xmax <= 180):
        raise InvalidSearch(f"bbox {bbox!r} lies outside longitude [-180, 180] and latitude [-90, 90]")
    return numbers


def _bbox_geometry(numbers: list[float]) -> Any:
    xmin, ymin, xmax, ymax = (numbers[0], numbers[1], numbers[3], numbers[4]) if len(numbers) == 6 else numbers
    if xmin > xmax:  # crosses the antimeridian
        return shapely.MultiPolygon([shapely.box(xmin, ymin, 180, ymax), shapely.box(-180, ymin, xmax, ymax)])
    return shapely.box(xmin, ymin, xmax, ymax)


def parse_intersects(value: dict[str, Any] | str | None) -> Any | None:
    if value is None or value == "":
        return None
    try:
        document = json.loads(value) if isinstance(value, str) else value
        if isinstance(document, dict) and document.get("type") == "Feature":
            document = document.get("geometry")
        geometry = shapely.geometry.shape(document)
    except (json.JSONDecodeError, ValueError, TypeError, KeyError, AttributeError, IndexError) as error:
        raise InvalidSearch(f"intersects {str(value)[:200]!r} is not a GeoJSON geometry: {error}") from error
    except shapely.errors.GEOSException as error:
        raise InvalidSearch(f"intersects is not a valid geometry: {error}") from error
    if geometry.is_empty:
        raise InvalidSearch("intersects is an empty geometry")
    return geometry


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


def parse_sortby(sortby: list[SortKey] | list[str] | list[dict[str, Any]] | str | None) -> list[SortKey]:
    """``-datetime,+id`` / ``["-datetime"]`` / ``[{"field": ..., "direction": ...}]`` -> sort keys."""
    if not sortby:
        return []
    entries = sortby.split(",") if isinstance(sortby, str) else sortby
    keys = []
    for entry in entries:
        if isinstance(entry, SortKey):
            keys.append(entry)
        elif isinstance(entry, dict) or hasattr(entry, "field"):
            name = entry["field"] if isinstance(entry, dict) else entry.field
            direction = entry.get("direction", "asc") if isinstance(entry, dict) else entry.direction
            direction = getattr(direction, "value", direction)
            if direction not in ("asc", "desc"):
                raise InvalidSearch(f"sortby direction {direction!r} must be asc or desc")
            keys.append(SortKey(column_of(str(name)), direction == "desc"))
        else:
            text = str(entry).strip()
            descending = text.startswith("-")
            name = text.lstrip("+-").strip()
            if not name:
                raise InvalidSearch(f"sortby {sortby!r} names no field")
            keys.append(SortKey(column_of(name), descending))
    return keys


def _combine(left: BooleanExpression, right: BooleanExpression) -> BooleanExpression:
    if isinstance(left, AlwaysTrue):
        return right
    if isinstance(right, AlwaysTrue):
        return left
    return And(left, right)


def _any_of(expressions: list[BooleanExpression]) -> BooleanExpression:
    combined = expressions[0]
    for expression in expressions[1:]:
        combined = Or(combined, expression)
    return combined


def _bounds_overlap(geometry: Any) -> BooleanExpression:
    """Rows whose bbox overlaps the geometry's bounds (per part for multi-part geometries across the antimeridian).

    An item crossing the antimeridian has a bbox with xmin > xmax (STAC, RFC 7946
    §5.2), i.e. it covers [xmin, 180] and [-180, xmax]. Iceberg cannot compare two
    columns, so such rows are recognised as xmin > 0 > xmax (the only way a
    crossing box of less than 360° can be written) and kept when either side
    reaches the query.
    """
    parts = list(geometry.geoms) if isinstance(geometry, shapely.MultiPolygon) else [geometry]
    overlaps = []
    for part in parts:
        xmin, ymin, xmax, ymax = (float(value) for value in part.bounds)
        plain = And(LessThanOrEqual("bbox.xmin", xmax), GreaterThanOrEqual("bbox.xmax", xmin))
        crossing = And(
            And(GreaterThan("bbox.xmin", 0.0), LessThan("bbox.xmax", 0.0)),
            Or(LessThanOrEqual("bbox.xmin", xmax), GreaterThanOrEqual("bbox.xmax", xmin)),
        )
        overlaps.append(
            And(Or(plain, crossing), And(LessThanOrEqual("bbox.ymin", ymax), GreaterThanOrEqual("bbox.ymax", ymin)))
        )
    return _any_of(overlaps)


class SearchEngine:
    """STAC search over a floe repository at any ref."""

    def __init__(
        self,
        repository: Repository,
        *,
        max_limit: int = MAX_LIMIT,
        refuse_over_limit: bool = False,
        cache_mb: int = DEFAULT_CACHE_MB,
    ) -> None:
        self.repository = repository
        self.max_limit = max_limit
        self.refuse_over_limit = refuse_over_limit
        self.arrays_url = repository.location.join(ARRAYS_DIR)
        self._states: OrderedDict[str, SnapshotState] = OrderedDict()
        self.cache_bytes = cache_mb * 1_000_000
        self._files: OrderedDict[str, _CachedFile] = OrderedDict()
        self._cached_bytes = 0
        self._tags: dict[str, str] = {}
        self._overflow: dict[str, frozenset[str]] = {}
        self._lock = threading.Lock()

    # -- refs and snapshots ------------------------------------------------------------------
    def resolve(self, ref: str | None = None) -> str:
        """The snapshot a ref names now (tags and snapshot ids are cached: they never change)."""
        ref = ref or self.repository.settings.branch
        cached = self._tags.get(ref)
        if cached is not None:
            return cached
        snapshot_id = self.repository.resolve(ref)
        name = ref.split(":", 1)[1] if ref.startswith(("tag:", "snapshot:", "branch:")) else ref
        if not ref.startswith("branch:") and name not in self.repository.icechunk.list_branches():
            self._tags[ref] = snapshot_id
        return snapshot_id

    def state(self, snapshot_id: str) -> SnapshotState:
        with self._lock:
            state = self._states.get(snapshot_id)
            if state is not None:
                self._states.move_to_end(snapshot_id)
                return state
        location = self.repository.metadata_location_of(snapshot_id)
        table = self.repository.catalog.load_at(location)
        schema = table.schema()
        files = sorted((task.file for task in table.scan().plan_files()), key=lambda data_file: data_file.file_path)
        state = SnapshotState(
            snapshot_id=snapshot_id,
            table=table,
            schema=schema,
            arrow_schema=schema_to_pyarrow(schema, include_field_ids=False),
            files=files,
        )
        with self._lock:
            self._states[snapshot_id] = state
            while len(self._states) > _SNAPSHOT_CACHE:
                self._states.popitem(last=False)
        return state

    # -- collections -------------------------------------------------------------------------
    def collections(self, snapshot_id: str) -> dict[str, dict[str, Any]]:
        """Collection JSON by id at a snapshot: the stored collections, and any collection with items in the table."""
        state = self.state(snapshot_id)
        with state.lock:
            if state.collections is None:
                stored = self.repository.collections(snapshot_id)
                extents = self._extents(state)
                found: dict[str, dict[str, Any]] = {}
                for collection_id in sorted(set(stored) | set(extents)):
                    collection = dict(
                        stored.get(collection_id)
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
                    if collection_id in extents:
                        collection["extent"] = extents[collection_id]
                    else:
                        collection.setdefault(
                            "extent",
                            {"spatial": {"bbox": [[-180, -90, 180, 90]]}, "temporal": {"interval": [[None, None]]}},
                        )
                    found[collection_id] = collection
                state.collections = found
            return state.collections

    def _extents(self, state: SnapshotState) -> dict[str, dict[str, Any]]:
        """Spatial and temporal extent of each collection, from the data files' column bounds (no row is read)."""
        schema = state.schema
        fields = {}
        for name in ("collection", "bbox.xmin", "bbox.ymin", "bbox.xmax", "bbox.ymax", *_TIME_COLUMNS):
            found = schema.find_field(name) if name in schema.column_names else None
            if found is not None:
                fields[name] = found
        bounds: dict[str, dict[str, list[Any]]] = {}

        def decode(data_file: DataFile, name: str, upper: bool) -> Any:
            column = fields.get(name)
            if column is None:
                return None
            mapping = data_file.upper_bounds if upper else data_file.lower_bounds
            raw = (mapping or {}).get(column.field_id)
            return None if raw is None else from_bytes(column.field_type, raw)

        for data_file in state.files:
            collection = decode(data_file, "collection", upper=False)
            if collection is None or collection != decode(data_file, "collection", upper=True):
                # No bounds (or a file mixing collections): read its few columns instead.
                for name, values in self._file_extents(state, data_file).items():
                    entry = bounds.setdefault(name, {})
                    for key, found in values.items():
                        entry.setdefault(key, []).extend(found)
                continue
            entry = bounds.setdefault(collection, {})
            for key, upper in (("bbox.xmin", False), ("bbox.ymin", False), ("bbox.xmax", True), ("bbox.ymax", True)):
                value = decode(data_file, key, upper)
                if value is not None:
                    entry.setdefault(key, []).append(value)
            for key in _TIME_COLUMNS:
                for upper in (False, True):
                    value = decode(data_file, key, upper)
                    if value is not None:
                        entry.setdefault("time", []).append(value)
        extents = {}
        for collection, entry in bounds.items():
            if all(entry.get(key) for key in ("bbox.xmin", "bbox.ymin", "bbox.xmax", "bbox.ymax")):
                bbox = [
                    min(entry["bbox.xmin"]),
                    min(entry["bbox.ymin"]),
                    max(entry["bbox.xmax"]),
                    max(entry["bbox.ymax"]),
                ]
            else:
                bbox = [-180.0, -90.0, 180.0, 90.0]
            times = entry.get("time") or []
            interval = [_render_micros(min(times)), _render_micros(max(times))] if times else [None, None]
            extents[collection] = {"spatial": {"bbox": [bbox]}, "temporal": {"interval": [interval]}}
        return extents

    def _file_extents(self, state: SnapshotState, data_file: DataFile) -> dict[str, dict[str, list[Any]]]:
        table = self._read(data_file.file_path, ["collection", "bbox", *_TIME_COLUMNS])
        found: dict[str, dict[str, list[Any]]] = {}
        for collection in pc.unique(table.column("collection")).to_pylist():
            if collection is None:
                continue
            rows = table.filter(pc.equal(table.column("collection"), collection))
            entry = found.setdefault(collection, {})
            bbox = rows.column("bbox")
            for key, upper in (("xmin", False), ("ymin", False), ("xmax", True), ("ymax", True)):
                value = (pc.max if upper else pc.min)(pc.struct_field(bbox, key)).as_py()
                if value is not None:
                    entry.setdefault(f"bbox.{key}", []).append(value)
            for key in _TIME_COLUMNS:
                if key in rows.column_names:
                    for reducer in (pc.min, pc.max):
                        value = reducer(rows.column(key)).as_py()
                        if value is not None:
                            entry.setdefault("time", []).append(int(value.timestamp() * 1_000_000))
        return found

    def collection(self, snapshot_id: str, collection_id: str) -> dict[str, Any]:
        found = self.collections(snapshot_id).get(collection_id)
        if found is None:
            raise CollectionNotFound(f"no collection {collection_id!r} at this ref (see /collections)")
        return found

    def queryables(self, snapshot_id: str, collection_id: str | None = None) -> dict[str, Any]:
        """JSON Schema of the properties a filter can use (the table's typed columns)."""
        if collection_id is not None:
            self.collection(snapshot_id, collection_id)
        state = self.state(snapshot_id)
        properties: dict[str, Any] = {
            "id": {"title": "Item ID", "type": "string"},
            "collection": {"title": "Collection ID", "type": "string"},
            "geometry": {"title": "Geometry", "$ref": "https://geojson.org/schema/Geometry.json"},
            "datetime": {"title": "Acquisition time", "type": "string", "format": "date-time"},
        }
        skip = {"type", "stac_version", "stac_extensions", "geometry", "bbox", "assets", "links", "floe:overflow"}
        for column in state.schema.fields:
            if column.name in skip or column.name in properties:
                continue
            schema = _json_type(column.field_type)
            if schema is not None:
                properties[column.name] = schema
        return {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://floe.invalid/queryables",
            "type": "object",
            "title": "Queryables",
            "properties": properties,
            "additionalProperties": True,
        }

    # -- planning ----------------------------------------------------------------------------
    def _plan(self, state: SnapshotState, request: SearchRequest) -> _Plan:
        limit = request.limit
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise InvalidSearch(f"limit {limit!r} must be a positive integer")
        if limit > self.max_limit:
            if not self.refuse_over_limit:
                # OGC API Features: a limit above the maximum is no error; the maximum applies.
                limit = request.limit = self.max_limit
            else:
                raise InvalidSearch(f"limit {limit} exceeds the maximum of {self.max_limit} items per page")
        if request.bbox is not None and request.intersects is not None:
            raise InvalidSearch("bbox and intersects are mutually exclusive: give one of them")
        exact: BooleanExpression = AlwaysTrue()
        geometries: list[Any] = []
        collections = list(dict.fromkeys(request.collections)) if request.collections else None
        if collections:
            known = self.collections(state.snapshot_id)
            unknown = [collection for collection in collections if collection not in known]
            if unknown:
                raise CollectionNotFound(
                    f"no collection {', '.join(map(repr, unknown))} at this ref (see /collections)"
                )
            exact = _combine(
                exact, EqualTo("collection", collections[0]) if len(collections) == 1 else In("collection", collections)
            )
        if request.ids:
            ids = list(dict.fromkeys(request.ids))
            exact = _combine(exact, EqualTo("id", ids[0]) if len(ids) == 1 else In("id", ids))
        interval = parse_interval(request.datetime)
        if interval is not None:
            exact = _combine(exact, self._datetime_expression(state.schema, *interval))
        bbox = parse_bbox(request.bbox)
        if bbox is not None:
            geometries.append(_bbox_geometry(bbox))
        intersects = parse_intersects(request.intersects)
        if intersects is not None:
            geometries.append(intersects)
        filters = [parse_filter(request.filter, request.filter_lang)]
        query = query_to_cql2(request.query, state.schema)
        if query is not None:
            filters.append(parse_filter(query, "cql2-json"))
        expression = and_expressions([part for part in filters if part is not None])
        translation: Translation = translate(expression, state.schema)
        base_exact = exact
        exact = _combine(exact, translation.expression)
        geometries.extend(translation.geometries)
        prune, base_prune = exact, base_exact
        for geometry in geometries:
            prune = _combine(prune, _bounds_overlap(geometry))
            base_prune = _combine(base_prune, _bounds_overlap(geometry))
        property_columns: set[str] = set()
        if not isinstance(translation.expression, AlwaysTrue):
            bound = bind(state.schema, translation.expression, case_sensitive=True)
            property_columns = {state.schema.find_column_name(i).split(".")[0] for i in extract_field_ids(bound)}
        sortby = parse_sortby(request.sortby)
        for key in sortby:
            found = state.schema.find_field(key.column) if key.column in state.schema.column_names else None
            if found is None or not isinstance(found.field_type, PrimitiveType) or "." in key.column:
                raise InvalidSearch(
                    f"cannot sort by {key.column!r}: sortable fields are id, collection, datetime and the "
                    "items' typed properties (see /queryables)"
                )
        try:
            bind(state.schema, prune, case_sensitive=True)
        except ValueError as error:  # pragma: no cover - translation only emits bindable expressions
            raise InvalidSearch(f"cannot apply this search to the table: {error}") from error
        return _Plan(
            prune=prune,
            exact=exact,
            geometries=geometries,
            residual=expression if translation.residual else None,
            sortby=sortby,
            collections=collections,
            base_prune=base_prune,
            base_exact=base_exact,
            full_filter=expression,
            property_columns=frozenset(property_columns - {"id", "collection"}),
        )

    @staticmethod
    def _datetime_expression(schema: Schema, start: int | None, end: int | None) -> BooleanExpression:
        """Items whose datetime lies in [start, end], or whose start/end_datetime range overlaps it."""
        instant: list[BooleanExpression] = []
        if start is not None:
            instant.append(GreaterThanOrEqual("datetime", start))
        if end is not None:
            instant.append(LessThanOrEqual("datetime", end))
        point = instant[0] if len(instant) == 1 else And(instant[0], instant[1])
        if "start_datetime" not in schema.column_names or "end_datetime" not in schema.column_names:
            return point
        ranged: list[BooleanExpression] = [IsNull("datetime")]
        if end is not None:
            ranged.append(LessThanOrEqual("start_datetime", end))
        if start is not None:
            ranged.append(GreaterThanOrEqual("end_datetime", start))
        overlap = ranged[0]
        for part in ranged[1:]:
            overlap = And(overlap, part)
        return Or(point, overlap)

    # -- reading -----------------------------------------------------------------------------
    def _read(self, path: str, names: list[str] | None = None) -> pa.Table:
        """Columns ``names`` (None: all) of one data file, through a byte-bounded cache of decoded columns.

        Data files never change, so a column once decoded serves every later
        request; only the columns a request needs are read, and the least
        recently used files are dropped once the cache exceeds its budget.
        """
        with self._lock:
            cached = self._files.get(path)
            if cached is not None:
                self._files.move_to_end(path)
        if cached is None:
            cached = _CachedFile()
        if cached.names is None:
            parquet = pq.ParquetFile(self.repository.io.new_input(path).open())
            cached.names = list(parquet.schema_arrow.names)
            cached.num_rows = parquet.metadata.num_rows
            cached.metadata = parquet.metadata
        else:
            parquet = None
        wanted = cached.names if names is None else [name for name in names if name in cached.names]
        missing = [name for name in wanted if name not in cached.columns]
        if missing:
            if parquet is None:
                parquet = pq.ParquetFile(self.repository.io.new_input(path).open(), metadata=cached.metadata)
            # One thread per request: the server runs requests side by side already.
            table = parquet.read(columns=missing, use_threads=False)
            with self._lock:
                for name in missing:
                    column = table.column(name)
                    if name not in cached.columns:
                        cached.columns[name] = column
                        cached.nbytes += column.nbytes
                self._files[path] = cached
                self._files.move_to_end(path)
                self._cached_bytes = sum(entry.nbytes for entry in self._files.values())
                while self._cached_bytes > self.cache_bytes and len(self._files) > 1:
                    _, dropped = self._files.popitem(last=False)
                    self._cached_bytes -= dropped.nbytes
        if not wanted:
            return pa.table({_ROW: pa.array(np.arange(cached.num_rows, dtype=np.int64))})
        return pa.table({name: cached.columns[name] for name in wanted})

    def _modes(self, state: SnapshotState, plan: _Plan) -> tuple[_Mode, _Mode]:
        """The usual mode (the translated filter prunes and decides rows) and the one for files with overflow."""
        modes = (
            _Mode(plan.prune, plan.exact, plan.residual, plan.geometries),
            _Mode(plan.base_prune, plan.base_exact, plan.full_filter, plan.geometries),
        )
        for mode in modes:
            if not isinstance(mode.prune, AlwaysTrue):
                mode.evaluator = may_match(state.schema, mode.prune)
            mode.arrow_filter, mode.filter_columns = self._arrow_filter(state, mode.prune)
            if mode.needs_rows_test and not mode.geometries and mode.residual is None:
                # Files whose column bounds prove every row matches need no row test (e.g. a collection's partition).
                mode.whole = must_match(state.schema, mode.exact)
        return modes

    def _overflow_keys(self, state: SnapshotState, data_file: DataFile) -> frozenset[str]:
        """The property and top-level keys any row of a file keeps in floe:overflow (cached: files never change)."""
        path = data_file.file_path
        with self._lock:
            known = self._overflow.get(path)
        if known is not None:
            return known
        overflow_field = state.schema.find_field(OVERFLOW) if OVERFLOW in state.schema.column_names else None
        null_counts = data_file.null_value_counts or {}
        if overflow_field is None or null_counts.get(overflow_field.field_id) == data_file.record_count:
            keys: frozenset[str] = frozenset()
        else:
            found: set[str] = set()
            table = self._read(path, [OVERFLOW])
            if OVERFLOW in table.column_names:
                for text in pc.unique(table.column(OVERFLOW)).to_pylist():
                    found.update(overflow_keys(text))
            keys = frozenset(found)
        with self._lock:
            self._overflow[path] = keys
        return keys

    def _candidates(
        self, state: SnapshotState, plan: _Plan, start: int = 0, modes: tuple[_Mode, _Mode] | None = None
    ) -> Iterator[tuple[int, DataFile, _Mode]]:
        usual, overflowing = modes or self._modes(state, plan)
        for index in range(start, len(state.files)):
            data_file = state.files[index]
            if data_file.record_count == 0:
                continue
            # The filter-free mode prunes a superset: files it rules out are out either way, unread.
            if overflowing.evaluator is not None and not overflowing.evaluator(data_file):
                continue
            mode = usual
            if plan.property_columns and plan.property_columns & self._overflow_keys(state, data_file):
                mode = overflowing
            if mode.evaluator is None or mode.evaluator(data_file):
                yield index, data_file, mode

    def _arrow_filter(
        self, state: SnapshotState, expression: BooleanExpression
    ) -> tuple[pc.Expression | None, dict[str, pa.DataType]]:
        if isinstance(expression, AlwaysTrue):
            return None, {}
        bound = bind(state.schema, expression, case_sensitive=True)
        columns = {}
        for field_id in extract_field_ids(bound):
            top = state.schema.find_column_name(field_id).split(".")[0]
            columns[top] = state.arrow_schema.field(top).type
        return expression_to_pyarrow(bound, state.schema), columns

    def _matching_rows(
        self, state: SnapshotState, mode: _Mode, path: str, extra_columns: list[str], first_row: int = 0
    ) -> pa.Table:
        """Row numbers (and ``extra_columns``) of the rows of one file that pass the Arrow filter and geometry test."""
        arrow_filter, filter_columns = mode.arrow_filter, mode.filter_columns
        wanted = sorted(set(filter_columns) | set(extra_columns) | ({"geometry"} if mode.geometries else set()))
        table = self._read(path, wanted)
        if _ROW not in table.column_names:
            table = table.append_column(_ROW, pa.array(np.arange(table.num_rows, dtype=np.int64)))
        if first_row:
            table = table.slice(first_row)
        for name, data_type in filter_columns.items():
            if name not in table.column_names:
                # Files written before a column existed lack it: it is null there, as Iceberg reads it.
                table = table.append_column(name, pa.nulls(table.num_rows, data_type))
        for name in extra_columns:
            if name not in table.column_names:
                table = table.append_column(name, pa.nulls(table.num_rows, state.arrow_schema.field(name).type))
        if arrow_filter is not None:
            table = table.filter(arrow_filter)
        if mode.geometries and table.num_rows:
            shapes = shapely.from_wkb(table.column("geometry").to_numpy(zero_copy_only=False))
            mask = np.ones(table.num_rows, dtype=bool)
            for geometry in mode.geometries:
                mask &= shapely.intersects(shapes, geometry)
            table = table.filter(pa.array(mask))
        return table

    def _rows(self, path: str, rows: np.ndarray) -> pa.Table:
        """The full rows at ``rows`` (sorted row numbers) of one file."""
        table = self._read(path)
        if len(rows) == table.num_rows:
            return table
        return table.take(pa.array(rows))

    def _items(self, snapshot_id: str, table: pa.Table) -> list[dict[str, Any]]:
        return [served_arrays_asset(item, self.arrays_url, snapshot_id) for item in arrow_to_items(table)]

    # -- searching ---------------------------------------------------------------------------
    def search(self, request: SearchRequest, ref: str | None = None, snapshot_id: str | None = None) -> SearchPage:
        """One page of ``request`` at ``ref`` (or at the snapshot its token pins)."""
        token = decode_token(request.token) if request.token else None
        if token is not None:
            snapshot_id = token["s"]
        elif snapshot_id is None:
            snapshot_id = self.resolve(ref)
        try:
            state = self.state(snapshot_id)
        except RefNotFound as error:
            raise InvalidSearch(
                f"the token's snapshot {snapshot_id} no longer exists: start the search again"
            ) from error
        plan = self._plan(state, request)
        if plan.sortby:
            offset = int(token.get("o", 0)) if token else 0
            return self._sorted_page(state, plan, request.limit, offset)
        position = (int(token.get("f", 0)), int(token.get("r", 0))) if token else (0, 0)
        return self._page(state, plan, request.limit, position)

    def _page(self, state: SnapshotState, plan: _Plan, limit: int, position: tuple[int, int]) -> SearchPage:
        modes = self._modes(state, plan)
        found: list[dict[str, Any]] = []
        start_file, start_row = position
        for index, data_file, mode in self._candidates(state, plan, start_file, modes):
            first_row = start_row if index == start_file else 0
            path = data_file.file_path
            if mode.needs_rows_test and not (mode.whole is not None and mode.whole(data_file)):
                matched = self._matching_rows(state, mode, path, [], first_row)
                rows = matched.column(_ROW).to_numpy()
            else:
                rows = np.arange(first_row, data_file.record_count, dtype=np.int64)
            if len(rows) == 0:
                continue
            if mode.residual is None:
                wanted = limit - len(found)
                taken = rows[:wanted]
                found.extend(self._items(state.snapshot_id, self._rows(path, taken)))
                if len(found) >= limit:
                    more = len(rows) > wanted
                    next_row = int(taken[-1]) + 1
                    return self._finish(state, plan, modes, found, index, next_row, more)
                continue
            # Items are built (and matched) a chunk at a time, so a page that fills early converts little.
            for start in range(0, len(rows), _RESIDUAL_CHUNK):
                chunk = rows[start : start + _RESIDUAL_CHUNK]
                items = self._items(state.snapshot_id, self._rows(path, chunk))
                for row, item in zip(chunk, items, strict=True):
                    if _matches(mode.residual, item):
                        found.append(item)
                        if len(found) >= limit:
                            return self._finish(state, plan, modes, found, index, int(row) + 1, None)
        return SearchPage(found, state.snapshot_id)

    def _finish(  # noqa: PLR0917
        self,
        state: SnapshotState,
        plan: _Plan,
        modes: tuple[_Mode, _Mode],
        found: list[dict[str, Any]],
        index: int,
        next_row: int,
        more: bool | None,
    ) -> SearchPage:
        """The page, with a next token unless nothing can follow (known in the common cases, else assumed)."""
        if more is False and not any(True for _ in self._candidates(state, plan, index + 1, modes)):
            return SearchPage(found, state.snapshot_id)
        return SearchPage(found, state.snapshot_id, encode_token({"s": state.snapshot_id, "f": index, "r": next_row}))

    def _sorted_page(self, state: SnapshotState, plan: _Plan, limit: int, offset: int) -> SearchPage:
        """Sort every matching row's keys (only the key columns are read), take one page, read just those rows."""
        columns = [key.column for key in plan.sortby]
        keys: list[pa.Table] = []
        for index, data_file, mode in self._candidates(state, plan):
            path = data_file.file_path
            matched = self._matching_rows(state, mode, path, columns)
            if mode.residual is not None and matched.num_rows:
                rows = matched.column(_ROW).to_numpy()
                items = self._items(state.snapshot_id, self._rows(path, rows))
                mask = [_matches(mode.residual, item) for item in items]
                matched = matched.filter(pa.array(mask, type=pa.bool_()))
            if matched.num_rows:
                keys.append(
                    pa.table(
                        {
                            **{f"k{n}": matched.column(column) for n, column in enumerate(columns)},
                            _FILE: pa.array(np.full(matched.num_rows, index, dtype=np.int64)),
                            _ROW: matched.column(_ROW),
                        }
                    )
                )
        if not keys:
            return SearchPage([], state.snapshot_id)
        everything = pa.concat_tables(keys, promote_options="permissive")
        order = [(f"k{n}", "descending" if key.descending else "ascending") for n, key in enumerate(plan.sortby)]
        ordered = everything.sort_by([*order, (_FILE, "ascending"), (_ROW, "ascending")])
        page = ordered.slice(offset, limit)
        files = page.column(_FILE).to_numpy()
        rows = page.column(_ROW).to_numpy()
        by_position: dict[tuple[int, int], dict[str, Any]] = {}
        for index in np.unique(files):
            selected = np.sort(rows[files == index])
            path = state.files[int(index)].file_path
            for row, item in zip(selected, self._items(state.snapshot_id, self._rows(path, selected)), strict=True):
                by_position[(int(index), int(row))] = item
        found = [by_position[(int(index), int(row))] for index, row in zip(files, rows, strict=True)]
        next_offset = offset + limit
        token = encode_token({"s": state.snapshot_id, "o": next_offset}) if next_offset < ordered.num_rows else None
        return SearchPage(found, state.snapshot_id, token)

    def iter_items(
        self, request: SearchRequest, ref: str | None = None, max_items: int | None = None
    ) -> Iterator[dict[str, Any]]:
        """Every item matching ``request`` (page after page at one snapshot), at most ``max_items``."""
        count = 0
        snapshot_id = self.resolve(ref)
        while True:
            page = self.search(request, snapshot_id=snapshot_id)
            for item in page.items:
                yield item
                count += 1
                if max_items is not None and count >= max_items:
                    return
            if page.next_token is None:
                return
            request = SearchRequest(**{**request.__dict__, "token": page.next_token})


_TIME_COLUMNS = ("datetime", "start_datetime", "end_datetime")


def _matches(expression: cql2.Expr, item: dict[str, Any]) -> bool:
    """Whether ``item`` matches; an expression that cannot be decided for it (a missing property) does not."""
    try:
        return bool(expression.matches(item))
    except Exception:  # noqa: BLE001 - cql2 raises bare Exception when a property is absent or types clash
        return False


def _render_micros(micros: int) -> str:
    from datetime import UTC, datetime, timedelta

    return render_datetime(datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=int(micros)))


def _json_type(field_type: Any) -> dict[str, Any] | None:
    from pyiceberg.types import BooleanType, DoubleType, FloatType, IntegerType, LongType, StringType, TimestamptzType

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
    if isinstance(field_type, StructType):
        return None
    return None
