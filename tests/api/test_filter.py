"""CQL2 and the query extension, without a repository: what becomes an exact Iceberg expression, what a residual."""

from __future__ import annotations

import cql2
import pytest
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.schema import Schema
from pyiceberg.types import DoubleType, ListType, NestedField, StringType

from ingest.api._filter import query_to_cql2, translate
from ingest.errors import InvalidSearch

SCHEMA = Schema(
    NestedField(1, "id", StringType(), required=False),
    NestedField(2, "eo:cloud_cover", DoubleType(), required=False),
    NestedField(3, "platform", StringType(), required=False),
    NestedField(4, "instruments", ListType(5, StringType(), element_required=False), required=False),
)


def test_query_operators_become_cql2() -> None:
    assert query_to_cql2({"eo:cloud_cover": {"lt": "20"}}, SCHEMA) == {
        "op": "<",
        "args": [{"property": "eo:cloud_cover"}, 20.0],  # a number sent as text compares as a number
    }
    assert query_to_cql2({"instruments": {"in": ["msi"]}}, SCHEMA) == {
        "op": "a_overlaps",
        "args": [{"property": "instruments"}, ["msi"]],
    }
    both = query_to_cql2({"platform": {"startsWith": "sat_1%", "neq": "x"}}, SCHEMA)
    assert both == {
        "op": "and",
        "args": [
            {"op": "like", "args": [{"property": "platform"}, "sat\\_1\\%%"]},
            {"op": "<>", "args": [{"property": "platform"}, "x"]},
        ],
    }
    assert query_to_cql2('{"platform": {"endsWith": "1"}}')["args"][1] == "%1"
    assert query_to_cql2(None) is None


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ({"platform": "sat-1"}, "object of operators"),
        ({"platform": {"in": "sat-1"}}, "list of values"),
        ({"platform": {"contains": 3}}, "needs a string"),
        ({"platform": {"near": 3}}, "not supported"),
        ("{not json", "not JSON"),
    ],
)
def test_bad_queries_are_refused(query: object, words: str) -> None:
    with pytest.raises(InvalidSearch, match=words):
        query_to_cql2(query, SCHEMA)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "residual"),
    [
        ("eo:cloud_cover BETWEEN 5 AND 7", False),
        ("platform IN ('a', 'b') OR eo:cloud_cover < 3", False),
        ("platform LIKE 'sat-%'", False),
        ("platform LIKE '%-1'", True),
        ("eo:cloud_cover = 'cloudy'", True),  # a literal of another type than the column's: only cql2 sees it
        ("NOT (eo:cloud_cover < 30)", True),
        ("eo:cloud_cover < 3 AND platform LIKE '%-1'", True),
    ],
)
def test_what_translates_exactly(text: str, residual: bool) -> None:
    translation = translate(cql2.parse_text(text), SCHEMA)
    assert translation.residual is residual
    if not residual:
        assert not isinstance(translation.expression, AlwaysTrue)


def test_a_partly_translated_conjunction_keeps_the_translated_part() -> None:
    translation = translate(cql2.parse_text("eo:cloud_cover < 3 AND platform LIKE '%-1'"), SCHEMA)
    assert translation.residual
    assert str(translation.expression) == str(translate(cql2.parse_text("eo:cloud_cover < 3"), SCHEMA).expression)


def test_filter_bounds_count_nesting_outside_quotes_and_stop_at_the_limit():
    from ingest.api._filter_checks import MAX_FILTER_NESTING, check_filter_bounds
    from ingest.errors import InvalidSearch

    at_limit = "(" * MAX_FILTER_NESTING + "id = 'x'" + ")" * MAX_FILTER_NESTING
    check_filter_bounds(at_limit)
    check_filter_bounds("id = '" + "(" * 500 + '\' AND title = "(((("')  # parentheses in literals do not nest
    check_filter_bounds({"op": "=", "args": [{"property": "id"}, "(" * 500]})
    for refused in (
        "(" + at_limit + ")",
        "NOT " * (MAX_FILTER_NESTING + 1) + "id = 'x'",
        '{"op":"not","args":[' * (MAX_FILTER_NESTING + 1)
        + '{"op":"=","args":[{"property":"id"},"x"]}'
        + "]}" * (MAX_FILTER_NESTING + 1),
        "id = 'x' OR " * 6000 + "id = 'y'",
    ):
        with pytest.raises(InvalidSearch):
            check_filter_bounds(refused)
