"""CQL2 filters and the query extension: parse, and translate what maps exactly to Iceberg expressions.

A filter is evaluated in two parts. The conjuncts that map *exactly* onto typed
columns (comparisons, ``in``, ``between`` of a column with a literal of the
column's own type) become one pyiceberg expression: Iceberg prunes files with
it, and the same expression, turned into an Arrow filter, decides rows. Spatial
``s_intersects(geometry, <literal>)`` conjuncts become geometries tested with
shapely. Anything else (``like``, ``not``, temporal functions, property
comparisons, ...) leaves a *residual*: the whole expression is then matched
against each candidate item with the ``cql2`` package, so results are exact
whatever the translation covered.

A literal whose type differs from its column's is never translated: rows whose
value conflicted with the column's type keep it in ``floe:overflow`` (their
typed cell is null), and only the residual match sees those values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import cql2
import shapely
import shapely.geometry
from pyiceberg.expressions import (
    AlwaysFalse,
    AlwaysTrue,
    And,
    BooleanExpression,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
    Or,
    StartsWith,
)
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BooleanType,
    DoubleType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    PrimitiveType,
    StringType,
    TimestampType,
    TimestamptzType,
)

from ingest.api._filter_checks import check_expression, check_filter_bounds, short
from ingest.errors import InvalidSearch
from ingest.stac import parse_datetime

FILTER_LANGS = ("cql2-text", "cql2-json")
PROPERTIES_PREFIX = "properties."
# Top-level item members with a column of their own; everything else is a property.
TOP_LEVEL = ("id", "collection")
_COMPARISONS = {"=": EqualTo, "<": LessThan, "<=": LessThanOrEqual, ">": GreaterThan, ">=": GreaterThanOrEqual}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_QUERY_OPS = {"eq": "=", "neq": "<>", "lt": "<", "lte": "<=", "gt": ">", "gte": ">="}
# The query extension's string operators as LIKE patterns around the (escaped) value.
_LIKE_PATTERNS = {"startsWith": "{}%", "endsWith": "%{}", "contains": "%{}%"}


def parse_filter(value: str | dict[str, Any] | None, lang: str | None = None) -> cql2.Expr | None:
    """Parse a CQL2 filter (text or JSON; ``lang`` defaults from the value's form) into a validated expression."""
    if value is None or value in ("", {}):
        return None
    if lang is not None and lang not in FILTER_LANGS:
        raise InvalidSearch(f"filter-lang {lang!r} is not supported: use cql2-text or cql2-json")
    if lang is None:
        lang = "cql2-json" if isinstance(value, dict) else "cql2-text"
    check_filter_bounds(value)
    try:
        if lang == "cql2-json":
            document = json.loads(value) if isinstance(value, str) else value
            if not isinstance(document, dict):
                raise InvalidSearch(f"invalid cql2-json filter {value!r}: expected a JSON object")
            expression = cql2.Expr(document)
        else:
            if not isinstance(value, str):
                raise InvalidSearch(
                    "a cql2-text filter must be a string (send JSON filters with filter-lang=cql2-json)"
                )
            expression = cql2.parse_text(value)
        check_expression(expression.to_json())
    except InvalidSearch:
        raise
    except (ValueError, Exception) as error:
        text = " ".join(str(error).split())
        raise InvalidSearch(f"invalid {lang} filter {short(value)}: {text}") from error
    return expression


def filter_properties(expression: cql2.Expr | None) -> set[str]:
    """Every property name ``expression`` reads (``{"property": name}`` anywhere in it)."""
    names: set[str] = set()
    pending: list[Any] = [expression.to_json()] if expression is not None else []
    while pending:
        node = pending.pop()
        if isinstance(node, list):
            pending.extend(node)
        elif isinstance(node, dict):
            name = node.get("property")
            if isinstance(name, str) and len(node) == 1:
                names.add(name)
            pending.extend(node.values())
    return names


def query_to_cql2(query: dict[str, Any] | str | None, schema: Schema | None = None) -> dict[str, Any] | None:
    """The query extension (``{"prop": {"op": value}}``) as an equivalent cql2-json expression.

    Like other STAC APIs, numbers given as strings compare as numbers on numeric
    columns, and ``in`` on a list-valued column means "shares a value with".
    """
    if query is None or query in ({}, ""):
        return None
    if isinstance(query, str):
        try:
            query = json.loads(query)
        except json.JSONDecodeError as error:
            raise InvalidSearch(f"query {query!r} is not JSON: {error}") from error
    if not isinstance(query, dict):
        raise InvalidSearch("query must be a JSON object of {property: {operator: value}}")
    parts = [part for name, conditions in query.items() for part in _query_conditions(name, conditions, schema)]
    return parts[0] if len(parts) == 1 else {"op": "and", "args": parts}


def _query_conditions(name: str, conditions: Any, schema: Schema | None) -> list[dict[str, Any]]:
    """The cql2-json conditions of one property's ``{operator: value}`` object."""
    if not isinstance(conditions, dict) or not conditions:
        raise InvalidSearch(f"query on {name!r} must be an object of operators, e.g. {{'lt': 20}}")
    column = (
        schema.find_field(column_of(name)) if schema is not None and column_of(name) in schema.column_names else None
    )
    numeric = column is not None and isinstance(column.field_type, DoubleType | FloatType | LongType | IntegerType)
    is_list = column is not None and isinstance(column.field_type, ListType)
    return [_query_condition(name, op, _number(raw) if numeric else raw, is_list) for op, raw in conditions.items()]


def _query_condition(name: str, op: str, value: Any, is_list: bool) -> dict[str, Any]:
    """One query-extension condition as cql2-json (``in`` on a list-valued column: shares a value with)."""
    prop = {"property": name}
    if op == "in" and is_list and isinstance(value, list):
        return {"op": "a_overlaps", "args": [prop, value]}
    if op in _QUERY_OPS:
        return {"op": _QUERY_OPS[op], "args": [prop, value]}
    if op == "in":
        if not isinstance(value, list):
            raise InvalidSearch(f"query {name!r} 'in' needs a list of values")
        return {"op": "in", "args": [prop, value]}
    if op in _LIKE_PATTERNS:
        if not isinstance(value, str):
            raise InvalidSearch(f"query {name!r} {op!r} needs a string")
        escaped = value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        return {"op": "like", "args": [prop, _LIKE_PATTERNS[op].format(escaped)]}
    raise InvalidSearch(
        f"query operator {op!r} on {name!r} is not supported: use eq, neq, lt, lte, gt, gte, in, "
        "startsWith, endsWith, contains"
    )


def _number(value: Any) -> Any:
    if isinstance(value, list):
        return [_number(element) for element in value]
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def and_expressions(expressions: list[cql2.Expr]) -> cql2.Expr | None:
    if not expressions:
        return None
    if len(expressions) == 1:
        return expressions[0]
    return cql2.Expr({"op": "and", "args": [expression.to_json() for expression in expressions]})


def timestamp_micros(value: datetime) -> int:
    """Microseconds since the epoch: what pyiceberg binds to timestamp columns without parsing text."""
    return (value - _EPOCH) // timedelta(microseconds=1)


def column_of(name: str) -> str:
    """The table column a STAC property path names (``properties.x`` and ``x`` are the same)."""
    return name[len(PROPERTIES_PREFIX) :] if name.startswith(PROPERTIES_PREFIX) else name


@dataclass
class Translation:
    """What a filter became: an exact Iceberg expression, geometries to intersect, and whether a residual remains."""

    expression: BooleanExpression = field(default_factory=AlwaysTrue)
    geometries: list[Any] = field(default_factory=list)
    residual: bool = False


def translate(expression: cql2.Expr | None, schema: Schema) -> Translation:
    """Split ``expression`` into exactly translated conjuncts and a residual (see the module docstring)."""
    result = Translation()
    if expression is None:
        return result
    translated: list[BooleanExpression] = []
    for conjunct in _conjuncts(expression.to_json()):
        geometry = _spatial(conjunct)
        if geometry is not None:
            result.geometries.append(geometry)
            continue
        exact = _exact(conjunct, schema)
        if exact is None:
            result.residual = True
        else:
            translated.append(exact)
    if translated:
        result.expression = balanced(And, translated)
    return result


def _conjuncts(node: Any) -> list[Any]:
    if isinstance(node, dict) and node.get("op") == "and":
        return [part for argument in node.get("args", []) for part in _conjuncts(argument)]
    return [node]


def _spatial(node: Any) -> Any | None:
    """``s_intersects(geometry, <GeoJSON or bbox literal>)`` -> the literal as a shapely geometry."""
    if not isinstance(node, dict) or node.get("op") != "s_intersects":
        return None
    args = node.get("args") or []
    if len(args) != 2:
        return None
    prop, literal = args
    if isinstance(literal, dict) and "property" in literal:
        prop, literal = literal, prop
    if not (isinstance(prop, dict) and prop.get("property") == "geometry" and isinstance(literal, dict)):
        return None
    try:
        if "bbox" in literal:
            box = literal["bbox"]
            return shapely.box(box[0], box[1], box[-2], box[-1]) if len(box) in (4, 6) else None
        if ("type" in literal and "coordinates" in literal) or literal.get("type") == "GeometryCollection":
            return shapely.geometry.shape(literal)
    except (ValueError, TypeError, KeyError, IndexError, shapely.errors.GEOSException):
        return None
    return None


def _column_type(name: str, schema: Schema) -> tuple[str, PrimitiveType] | None:
    column = column_of(name)
    if column in ("geometry", "bbox", "floe:overflow", "assets", "links", "stac_extensions"):
        return None
    found = schema.find_field(column) if column in schema.column_names else None
    if found is None or not isinstance(found.field_type, PrimitiveType):
        return None
    return column, found.field_type


def _literal(value: Any, column_type: PrimitiveType) -> tuple[bool, Any]:
    """(ok, value for pyiceberg) if ``value`` has exactly the column's JSON type."""
    if isinstance(column_type, StringType):
        return isinstance(value, str), value
    if isinstance(column_type, DoubleType | FloatType):
        is_number = isinstance(value, int | float) and not isinstance(value, bool)
        return is_number, float(value) if is_number else None
    if isinstance(column_type, LongType | IntegerType):
        if isinstance(value, float) and value.is_integer():
            return True, int(value)
        return isinstance(value, int) and not isinstance(value, bool), value
    if isinstance(column_type, BooleanType):
        return isinstance(value, bool), value
    if isinstance(column_type, TimestamptzType | TimestampType):
        if isinstance(value, dict) and isinstance(value.get("timestamp"), str):
            try:
                return True, timestamp_micros(parse_datetime(value["timestamp"]))
            except ValueError:
                return False, None
        return False, None
    return False, None


def _like_prefix(pattern: str) -> str | None:
    """The prefix of a LIKE pattern of the form ``prefix%`` (no other wildcard), else None."""
    if not pattern.endswith("%") or pattern.endswith("\\%"):
        return None
    prefix, escaped = [], False
    for character in pattern[:-1]:
        if escaped:
            prefix.append(character)
            escaped = False
        elif character == "\\":
            escaped = True
        elif character in "%_":
            return None
        else:
            prefix.append(character)
    return None if escaped or not prefix else "".join(prefix)


def _exact(node: Any, schema: Schema) -> BooleanExpression | None:
    """The pyiceberg expression equal to ``node`` on typed rows, or None if it has none."""
    if node is True:
        return AlwaysTrue()
    if node is False:
        return AlwaysFalse()
    if not isinstance(node, dict):
        return None
    op = node.get("op")
    args = node.get("args") or []
    if op in ("and", "or"):
        return _exact_junction(And if op == "and" else Or, args, schema)
    if not args or not isinstance(args[0], dict) or "property" not in args[0]:
        return None
    typed = _column_type(str(args[0]["property"]), schema)
    if typed is None:
        return None
    return _exact_predicate(op, typed[0], typed[1], args[1:])


def _exact_junction(junction: type[And] | type[Or], args: list[Any], schema: Schema) -> BooleanExpression | None:
    """``and``/``or`` of exactly translated arguments (None if any argument has no exact translation)."""
    parts = [_exact(argument, schema) for argument in args]
    if not parts or any(part is None for part in parts):
        return None
    exact = [part for part in parts if part is not None]
    if junction is Or and len(exact) > 1 and all(isinstance(part, EqualTo) for part in exact):
        terms = {str(part.term) for part in exact}
        if len(terms) == 1:  # x = a OR x = b OR ...: one In, which prunes by bounds like each equality would
            return In(exact[0].term, [part.literal for part in exact])
    return balanced(junction, exact)


def balanced(junction: type[And] | type[Or], parts: list[BooleanExpression]) -> BooleanExpression:
    """``parts`` joined by ``junction`` as a balanced tree.

    A filter of thousands of ORed (or ANDed) terms would otherwise become a
    chain thousands deep, which pyiceberg's recursive visitors (bind, pruning,
    the Arrow translation) cannot walk; balanced, it is a dozen levels deep.
    """
    if len(parts) == 1:
        return parts[0]
    middle = len(parts) // 2
    return junction(balanced(junction, parts[:middle]), balanced(junction, parts[middle:]))


def _exact_predicate(op: Any, column: str, column_type: PrimitiveType, operands: list[Any]) -> BooleanExpression | None:
    """A comparison, ``between``, prefix ``like`` or ``in`` of a typed column with literals of its own type."""
    if op in _COMPARISONS and len(operands) == 1:
        ok, value = _literal(operands[0], column_type)
        return _COMPARISONS[op](column, value) if ok else None
    if op == "between" and len(operands) == 2:
        low_ok, low = _literal(operands[0], column_type)
        high_ok, high = _literal(operands[1], column_type)
        return And(GreaterThanOrEqual(column, low), LessThanOrEqual(column, high)) if low_ok and high_ok else None
    if op == "like" and len(operands) == 1 and isinstance(column_type, StringType) and isinstance(operands[0], str):
        prefix = _like_prefix(operands[0])
        return StartsWith(column, prefix) if prefix is not None else None
    if op == "in" and len(operands) == 1 and isinstance(operands[0], list) and operands[0]:
        values = [_literal(value, column_type) for value in operands[0]]
        return In(column, [value for _, value in values]) if all(ok for ok, _ in values) else None
    return None
