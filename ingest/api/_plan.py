"""Search planning: a request and a table schema in, the Iceberg expressions and row tests of the search out.

:func:`plan_search` makes a :class:`SearchPlan` without reading a file, and :func:`row_tests` compiles it into the
:class:`RowTests` a search applies file by file. What a plan holds, and why files that keep a filtered property in
``floe:overflow`` are tested apart: docs/design.md §6 (planning is pure).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import cql2
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import shapely
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
from pyiceberg.expressions.visitors import bind, extract_field_ids, rewrite_not
from pyiceberg.io.pyarrow import expression_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import PrimitiveType

from ingest._compat import FileTest, may_match, must_match
from ingest.api._filter import (
    TOP_LEVEL,
    and_expressions,
    column_of,
    filter_properties,
    parse_filter,
    query_to_cql2,
    translate,
)
from ingest.api._request import (
    MAX_LIMIT,
    SearchRequest,
    SortEntry,
    SortKey,
    bbox_geometry,
    checked_limit,
    parse_bbox,
    parse_intersects,
    parse_interval,
    parse_sortby,
    search_fingerprint,
)
from ingest.errors import CollectionNotFound, InvalidSearch
from ingest.repository import id_hashes


@dataclass(frozen=True)
class SearchPlan:
    """A validated search: what Iceberg prunes with, what decides rows, what is left for shapely and cql2."""

    limit: int
    """Items per page (the request's, or the maximum when it asked for more and that is allowed)."""
    prune: BooleanExpression
    """What rules data files out by their column bounds: ``exact`` and every geometry's bbox overlap."""
    exact: BooleanExpression
    """What decides rows on typed columns: collections, ids, datetime and the translated filter."""
    geometries: tuple[Any, ...]
    """Shapely geometries every matching row's geometry intersects (bbox, intersects, s_intersects conjuncts)."""
    residual: cql2.Expr | None
    """The whole filter, when some of it did not translate: matched item by item with cql2."""
    sortby: tuple[SortKey, ...]
    collections: tuple[str, ...] | None
    prune_without_filter: BooleanExpression
    """``prune`` without the translated filter: for files where a row keeps a filtered property in floe:overflow."""
    exact_without_filter: BooleanExpression
    """``exact`` without the translated filter, for the same files (their rows are matched against ``full_filter``)."""
    full_filter: cql2.Expr | None
    """The request's filter and query as one cql2 expression (None without either)."""
    filtered_properties: frozenset[str]
    """Property columns the translated filter reads: a file keeping one in floe:overflow is tested without it."""
    ids: tuple[str, ...] | None = None
    """The ids the search asks for (None: any): the key index finds the files and rows holding them."""
    id_hashes: np.ndarray | None = None
    """``ids`` as the key index hashes them (made once a search, probed for every file)."""
    fingerprint: str = ""
    """The search's :func:`search_fingerprint`: what a page token must carry to continue it."""


def plan_search(
    schema: Schema,
    request: SearchRequest,
    known_collections: Collection[str],
    *,
    max_limit: int = MAX_LIMIT,
    refuse_over_limit: bool = False,
    refuse_unknown_properties: bool = False,
    overflow_properties: Callable[[], Collection[str]] | None = None,
) -> SearchPlan:
    """Check ``request`` against ``schema`` and the collections at the snapshot, and plan it (reading no file).

    ``known_collections`` only needs to hold the collections the request
    names; an unknown one raises CollectionNotFound. With
    ``refuse_unknown_properties``, a filter naming a property that is
    neither a column nor one of ``overflow_properties()`` (properties some
    rows keep only in ``floe:overflow``; asked only when a name is not a
    column) raises InvalidSearch too; without, such a property is null in
    every row, as a filter reads it. Raises InvalidSearch for anything else
    wrong with the request, naming it.
    """
    limit = checked_limit(request.limit, max_limit, refuse_over_limit)
    if request.bbox is not None and request.intersects is not None:
        raise InvalidSearch("bbox and intersects are mutually exclusive: give one of them")
    collections = _checked_collections(request.collections, known_collections)
    exact = _combine(_one_of("collection", collections), _one_of("id", request.ids))
    interval = parse_interval(request.datetime)
    if interval is not None:
        exact = _combine(exact, datetime_expression(schema, *interval))
    bbox = parse_bbox(request.bbox)
    intersects = parse_intersects(request.intersects)
    geometries = [geometry for geometry in (bbox_geometry(bbox) if bbox else None, intersects) if geometry is not None]
    full_filter = request_filter(request, schema)
    if refuse_unknown_properties:
        unknown = unknown_properties(full_filter, schema, overflow_properties)
        if unknown:
            raise InvalidSearch(
                f"the filter names {', '.join(map(repr, unknown[:5]))}, which no item at this ref has: "
                "the queryables list the properties a filter can use (/queryables, `floe queryables`)"
            )
    translation = translate(full_filter, schema)
    geometries.extend(translation.geometries)
    exact_with_filter = _combine(exact, translation.expression)
    prune = _with_overlaps(exact_with_filter, geometries)
    sortby = _sort_keys(request.sortby, schema)
    try:
        bind(schema, prune, case_sensitive=True)
    except ValueError as error:  # pragma: no cover - translation only emits bindable expressions
        raise InvalidSearch(f"cannot apply this search to the table: {error}") from error
    return SearchPlan(
        limit=limit,
        prune=prune,
        exact=exact_with_filter,
        geometries=tuple(geometries),
        residual=full_filter if translation.residual else None,
        sortby=tuple(sortby),
        collections=tuple(collections) if collections else None,
        prune_without_filter=_with_overlaps(exact, geometries),
        exact_without_filter=exact,
        full_filter=full_filter,
        filtered_properties=frozenset(columns_of(translation.expression, schema) - set(TOP_LEVEL)),
        ids=tuple(sorted(set(request.ids))) if request.ids else None,
        id_hashes=id_hashes(request.ids) if request.ids else None,
        fingerprint=search_fingerprint(
            {
                "collections": sorted(collections) if collections else None,
                "ids": sorted(set(request.ids)) if request.ids else None,
                "bbox": bbox,
                "intersects": shapely.to_wkb(intersects, hex=True) if intersects is not None else None,
                "datetime": interval,
                "filter": full_filter.to_json() if full_filter is not None else None,
                "sortby": [[key.column, key.descending] for key in sortby],
            }
        ),
    )


def _checked_collections(requested: list[str] | None, known: Collection[str]) -> list[str] | None:
    """The requested collections without repeats, each checked to exist (None: any collection)."""
    if not requested:
        return None
    collections = list(dict.fromkeys(requested))
    unknown = [collection for collection in collections if collection not in known]
    if unknown:
        raise CollectionNotFound(f"no collection {', '.join(map(repr, unknown))} at this ref ({held(known)})")
    return collections


def held(collections: Collection[str], most: int = 10) -> str:
    """What a ref holds, for an error naming a collection it does not: "it holds 'a', 'b'" (the first ``most``)."""
    if not collections:
        return "it holds no collection"
    names = sorted(collections)
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return f"it holds {', '.join(map(repr, names[:most]))}{more}"


def _one_of(column: str, values: list[str] | None) -> BooleanExpression:
    """Rows whose ``column`` is one of ``values`` (every row when None or empty)."""
    if not values:
        return AlwaysTrue()
    distinct = list(dict.fromkeys(values))
    return EqualTo(column, distinct[0]) if len(distinct) == 1 else In(column, distinct)


def request_filter(request: SearchRequest, schema: Schema) -> cql2.Expr | None:
    """The request's CQL2 filter and query-extension conditions as one expression (None without either)."""
    filters = [parse_filter(request.filter, request.filter_lang)]
    query = query_to_cql2(request.query, schema)
    if query is not None:
        filters.append(parse_filter(query, "cql2-json"))
    return and_expressions([part for part in filters if part is not None])


ITEM_MEMBERS = frozenset((
    "id", "collection", "geometry", "bbox", "datetime", "start_datetime", "end_datetime",
    "type", "stac_version", "stac_extensions", "assets", "links",
))  # fmt: skip
"""What a filter may name on any item, whether or not the table has a column of that name yet."""


def unknown_properties(
    expression: cql2.Expr | None, schema: Schema, overflow_properties: Callable[[], Collection[str]] | None
) -> list[str]:
    """The properties ``expression`` names that no item at this snapshot has, sorted.

    A comparison on one matches nothing, which reads like an answer: a typo
    (``cloud_cover`` for ``eo:cloud_cover``) is worth a 400 that names it
    (``api.refuse_unknown_properties``) or a warning (``floe search``).
    ``overflow_properties()`` (which may read every file) is asked only when
    a name is not a column.
    """
    columns = {field.name for field in schema.fields} | ITEM_MEMBERS
    unknown = sorted(name for name in filter_properties(expression) if column_of(name).split(".")[0] not in columns)
    if unknown and overflow_properties is not None:
        stored = set(overflow_properties())
        unknown = [name for name in unknown if column_of(name).split(".")[0] not in stored]
    return unknown


def _sort_keys(sortby: str | Sequence[SortEntry] | None, schema: Schema) -> list[SortKey]:
    """The request's sort keys, each a top-level column of a primitive type."""
    keys = parse_sortby(sortby)
    for key in keys:
        found = schema.find_field(key.column) if key.column in schema.column_names else None
        if found is None or not isinstance(found.field_type, PrimitiveType) or "." in key.column:
            raise InvalidSearch(
                f"cannot sort by {key.column!r}: sortable fields are id, collection, datetime and the "
                "items' typed properties (the queryables: /queryables, `floe queryables`)"
            )
    return keys


def columns_of(expression: BooleanExpression, schema: Schema) -> set[str]:
    """The top-level columns an expression reads (``bbox`` for ``bbox.xmin``)."""
    if isinstance(expression, AlwaysTrue):
        return set()
    bound = bind(schema, expression, case_sensitive=True)
    names = (schema.find_column_name(field_id) for field_id in extract_field_ids(bound))
    return {name.split(".")[0] for name in names if name is not None}


# -- Iceberg expressions ---------------------------------------------------------------------------
def _combine(left: BooleanExpression, right: BooleanExpression) -> BooleanExpression:
    """``left AND right``, leaving out a side that is always true (pruning skips work on AlwaysTrue)."""
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


def _with_overlaps(expression: BooleanExpression, geometries: Sequence[Any]) -> BooleanExpression:
    """``expression`` and, for each geometry, rows whose bbox overlaps it."""
    for geometry in geometries:
        expression = _combine(expression, bounds_overlap(geometry))
    return expression


def bounds_overlap(geometry: Any) -> BooleanExpression:
    """Rows whose bbox overlaps the geometry's bounds (per part for multi-part geometries across the antimeridian).

    An item crossing the antimeridian has a bbox with xmin > xmax (STAC, RFC 7946
    §5.2), i.e. it covers [xmin, 180] and [-180, xmax]. Iceberg cannot compare two
    columns, so such rows are recognised as xmin > 0 > xmax (the only way a
    crossing box of less than 360° can be written) and kept when either side
    reaches the query.
    """
    parts = list(geometry.geoms) if isinstance(geometry, shapely.MultiPolygon) else [geometry]
    overlaps: list[BooleanExpression] = []
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


def datetime_expression(schema: Schema, start: int | None, end: int | None) -> BooleanExpression:
    """Items whose datetime lies in [start, end], or whose start/end_datetime range overlaps it (epoch µs)."""
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


# -- row tests -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RowTest:
    """How the rows of one data file are tested: what prunes it, the Arrow filter, the geometries, what cql2 matches."""

    prune: BooleanExpression
    exact: BooleanExpression
    residual: cql2.Expr | None
    geometries: tuple[Any, ...]
    may_match: FileTest | None
    """False for a file no row of which can match, from its column bounds (None: every file may)."""
    bound_prune: BooleanExpression | None
    """``prune`` bound to the schema (NOT rewritten away), for testing every file at once (None: every file may)."""
    arrow_filter: pc.Expression | None
    """``prune`` as an Arrow filter over ``filter_columns`` (None: column values rule no row out)."""
    filter_columns: dict[str, pa.DataType]
    all_rows_match: FileTest | None
    """True for a file every row of which matches, from its column bounds (None: never known without reading)."""

    @property
    def needs_rows_test(self) -> bool:
        """Whether rows must be read to know which match (else every row of a file that may match does)."""
        return _needs_rows_test(self.prune, self.residual, self.geometries)


def _needs_rows_test(prune: BooleanExpression, residual: cql2.Expr | None, geometries: tuple[Any, ...]) -> bool:
    return not isinstance(prune, AlwaysTrue) or bool(geometries) or residual is not None


@dataclass(frozen=True)
class RowTests:
    """The two ways a plan tests a file's rows: a filtered property may sit in ``floe:overflow`` in some rows (its
    value had a type conflicting with the column when it was written), where the typed column is null, so files
    holding such rows are tested ``without_filter``."""

    translated: RowTest
    """The usual test: the translated filter prunes files and decides rows."""
    without_filter: RowTest
    """For files where a row keeps a filtered property in floe:overflow: rows are matched against the whole filter.

    It prunes a superset of what ``translated`` prunes, so a file it rules out is out either way.
    """


def row_tests(plan: SearchPlan, schema: Schema, arrow_schema: pa.Schema) -> RowTests:
    """Compile a plan's expressions into the tests applied to each data file and its rows."""
    translated = _row_test(
        schema, arrow_schema, prune=plan.prune, exact=plan.exact, residual=plan.residual, geometries=plan.geometries
    )
    without_filter = _row_test(
        schema,
        arrow_schema,
        prune=plan.prune_without_filter,
        exact=plan.exact_without_filter,
        residual=plan.full_filter,
        geometries=plan.geometries,
    )
    return RowTests(translated, without_filter)


def _row_test(
    schema: Schema,
    arrow_schema: pa.Schema,
    *,
    prune: BooleanExpression,
    exact: BooleanExpression,
    residual: cql2.Expr | None,
    geometries: tuple[Any, ...],
) -> RowTest:
    arrow_filter, filter_columns = arrow_filter_of(prune, schema, arrow_schema)
    all_rows_match = None
    if _needs_rows_test(prune, residual, geometries) and not geometries and residual is None:
        # Files whose column bounds prove every row matches need no row test (e.g. a collection's partition).
        all_rows_match = must_match(schema, exact)
    return RowTest(
        prune=prune,
        exact=exact,
        residual=residual,
        geometries=geometries,
        may_match=None if isinstance(prune, AlwaysTrue) else may_match(schema, prune),
        bound_prune=None if isinstance(prune, AlwaysTrue) else bind(schema, rewrite_not(prune), case_sensitive=True),
        arrow_filter=arrow_filter,
        filter_columns=filter_columns,
        all_rows_match=all_rows_match,
    )


def arrow_filter_of(
    expression: BooleanExpression, schema: Schema, arrow_schema: pa.Schema
) -> tuple[pc.Expression | None, dict[str, pa.DataType]]:
    """``expression`` as an Arrow filter, and the top-level columns (with their Arrow types) it reads."""
    if isinstance(expression, AlwaysTrue):
        return None, {}
    bound = bind(schema, expression, case_sensitive=True)
    columns = {name: arrow_schema.field(name).type for name in columns_of(expression, schema)}
    return expression_to_pyarrow(bound, schema), columns


def residual_matches(expression: cql2.Expr, item: dict[str, Any]) -> bool:
    """Whether ``item`` matches a plan's residual; an expression that cannot be decided for it (a missing
    property) does not."""
    try:
        return bool(expression.matches(item))
    except Exception:  # noqa: BLE001 - cql2 raises bare Exception when a property is absent or types clash
        return False
