"""The search planner alone: the items table's schema and a request in, expressions and row tests out; no repository.

Plans are checked by what they do, not by how their expressions are spelled:
their Arrow row filters are applied to small tables, and their file tests to
data files described only by column bounds (what Iceberg's manifests hold).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.conversions import to_bytes
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.schema import Schema
from pyiceberg.typedef import Record
from pyiceberg.types import DoubleType, NestedField, StringType

from ingest.api import SearchRequest, SortKey
from ingest.api._plan import RowTest, SearchPlan, plan_search, row_tests
from ingest.errors import CollectionNotFound, InvalidSearch
from ingest.repository._catalog import load_table_definition

KNOWN = frozenset({"alpha", "beta"})


@pytest.fixture(scope="module")
def schema() -> Schema:
    """The items table as schemas/items.json defines it, grown by two typed properties (as ingest grows it)."""
    base, _, _ = load_table_definition()
    next_id = base.highest_field_id + 1
    return Schema(
        *base.fields,
        NestedField(next_id, "eo:cloud_cover", DoubleType(), required=False),
        NestedField(next_id + 1, "platform", StringType(), required=False),
    )


def plan(schema: Schema, **request: Any) -> SearchPlan:
    return plan_search(schema, SearchRequest(**request), KNOWN)


def row_tests_of(schema: Schema, search_plan: SearchPlan) -> tuple[RowTest, RowTest]:
    tests = row_tests(search_plan, schema, schema_to_pyarrow(schema, include_field_ids=False))
    return tests.translated, tests.without_filter


def kept(test: RowTest, rows: list[dict[str, Any]]) -> list[str]:
    """The ids of ``rows`` that a row test's Arrow filter keeps (only the columns it reads are given)."""
    columns = pa.schema([("id", pa.large_string()), *test.filter_columns.items()])
    table = pa.Table.from_pylist(rows, schema=columns)
    if test.arrow_filter is not None:
        table = table.filter(test.arrow_filter)
    return table.column("id").to_pylist()


def data_file(schema: Schema, lower: dict[str, Any], upper: dict[str, Any], record_count: int = 10) -> DataFile:
    """A data file known only by its column bounds, as a manifest describes it."""

    def encoded(bounds: dict[str, Any]) -> dict[int, bytes]:
        fields = {name: schema.find_field(name) for name in bounds}
        return {field.field_id: to_bytes(field.field_type, bounds[name]) for name, field in fields.items()}

    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path="data/file.parquet",
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=record_count,
        file_size_in_bytes=1000,
        lower_bounds=encoded(lower),
        upper_bounds=encoded(upper),
        value_counts={},
        null_value_counts={},
        nan_value_counts={},
    )


def bbox_file(schema: Schema, xmin: tuple[float, float], xmax: tuple[float, float]) -> DataFile:
    """A file of rows near the equator whose bbox.xmin and bbox.xmax lie in the given (lower, upper) ranges."""
    lower = {"bbox.xmin": xmin[0], "bbox.xmax": xmax[0], "bbox.ymin": 0.0, "bbox.ymax": 1.0}
    upper = {"bbox.xmin": xmin[1], "bbox.xmax": xmax[1], "bbox.ymin": 1.0, "bbox.ymax": 2.0}
    return data_file(schema, lower, upper)


def box(item_id: str, xmin: float, xmax: float) -> dict[str, Any]:
    return {"id": item_id, "bbox": {"xmin": xmin, "ymin": 0.0, "xmax": xmax, "ymax": 2.0}}


def test_a_bbox_crossing_the_antimeridian_prunes_by_both_sides(schema: Schema) -> None:
    crossing = plan(schema, bbox=[170.0, -10.0, -170.0, 10.0])
    (geometry,) = crossing.geometries
    assert len(geometry.geoms) == 2  # one box each side of 180°
    test, _ = row_tests_of(schema, crossing)
    assert test.may_match is not None
    assert test.may_match(bbox_file(schema, xmin=(175.0, 178.0), xmax=(176.0, 179.0)))  # east of 170
    assert test.may_match(bbox_file(schema, xmin=(-178.0, -176.0), xmax=(-177.0, -175.0)))  # west of -170
    assert not test.may_match(bbox_file(schema, xmin=(0.0, 10.0), xmax=(1.0, 12.0)))  # between the two sides
    rows = [box("east", 175.0, 178.0), box("west", -178.0, -175.0), box("middle", 10.0, 12.0)]
    rows.append(box("item-crossing-too", 179.0, -179.0))
    assert kept(test, rows) == ["east", "west", "item-crossing-too"]


def test_an_item_crossing_the_antimeridian_is_kept_by_a_query_on_either_side(schema: Schema) -> None:
    for bbox in ([178.5, 0.5, 179.5, 1.5], [-179.5, 0.5, -178.5, 1.5]):
        test, _ = row_tests_of(schema, plan(schema, bbox=bbox))
        assert kept(test, [box("crossing", 178.0, -178.0), box("elsewhere", 20.0, 21.0)]) == ["crossing"]


def test_an_unknown_collection_raises_collection_not_found(schema: Schema) -> None:
    with pytest.raises(CollectionNotFound, match="'nope'"):
        plan(schema, collections=["alpha", "nope"])
    known = plan(schema, collections=["alpha", "alpha"])
    assert known.collections == ("alpha",)
    test, _ = row_tests_of(schema, known)
    rows = [{"id": "a", "collection": "alpha"}, {"id": "b", "collection": "beta"}]
    assert kept(test, rows) == ["a"]


def test_a_file_of_one_requested_collection_needs_no_row_test(schema: Schema) -> None:
    test, _ = row_tests_of(schema, plan(schema, collections=["alpha"]))
    assert test.all_rows_match is not None
    assert test.all_rows_match(data_file(schema, {"collection": "alpha"}, {"collection": "alpha"}))
    assert not test.all_rows_match(data_file(schema, {"collection": "alpha"}, {"collection": "beta"}))
    # Geometries are tested row by row: bounds never prove every row matches them.
    with_bbox, _ = row_tests_of(schema, plan(schema, collections=["alpha"], bbox=[0, 0, 1, 1]))
    assert with_bbox.all_rows_match is None


def test_a_limit_above_the_maximum_is_clamped_unless_refuse_is_configured(schema: Schema) -> None:
    assert plan_search(schema, SearchRequest(limit=50), KNOWN, max_limit=50).limit == 50
    assert plan_search(schema, SearchRequest(limit=51), KNOWN, max_limit=50).limit == 50
    with pytest.raises(InvalidSearch, match="exceeds the maximum of 50"):
        plan_search(schema, SearchRequest(limit=51), KNOWN, max_limit=50, refuse_over_limit=True)
    with pytest.raises(InvalidSearch, match="positive integer"):
        plan_search(schema, SearchRequest(limit=0), KNOWN)


def test_sortby_on_a_non_primitive_column_is_refused(schema: Schema) -> None:
    for field in ("bbox", "stac_extensions", "bbox.xmin", "no_such_property"):
        with pytest.raises(InvalidSearch, match="cannot sort by"):
            plan(schema, sortby=field)
    sorted_plan = plan(schema, sortby="-properties.eo:cloud_cover,id")
    assert sorted_plan.sortby == (SortKey("eo:cloud_cover", descending=True), SortKey("id"))


def test_a_filter_on_a_typed_property_becomes_an_iceberg_expression(schema: Schema) -> None:
    typed = plan(schema, filter="eo:cloud_cover < 20 AND platform = 'sat-1'")
    assert typed.residual is None
    assert typed.filtered_properties == {"eo:cloud_cover", "platform"}
    test, _ = row_tests_of(schema, typed)
    assert test.may_match is not None
    assert not test.may_match(data_file(schema, {"eo:cloud_cover": 30.0}, {"eo:cloud_cover": 90.0}))
    rows = [
        {"id": "clear", "eo:cloud_cover": 5.0, "platform": "sat-1"},
        {"id": "cloudy", "eo:cloud_cover": 50.0, "platform": "sat-1"},
        {"id": "other", "eo:cloud_cover": 5.0, "platform": "sat-2"},
    ]
    assert kept(test, rows) == ["clear"]


def test_like_with_a_leading_wildcard_leaves_a_residual(schema: Schema) -> None:
    suffix = plan(schema, filter="platform LIKE '%-1'")
    assert suffix.residual is not None
    assert isinstance(suffix.exact, AlwaysTrue)
    test, _ = row_tests_of(schema, suffix)
    assert test.residual is not None and test.needs_rows_test
    # A prefix pattern is exact (an Iceberg starts-with), so it leaves none.
    assert plan(schema, filter="platform LIKE 'sat-%'").residual is None


def test_files_keeping_a_filtered_property_in_overflow_are_tested_without_the_translated_filter(
    schema: Schema,
) -> None:
    search_plan = plan(schema, collections=["alpha"], filter="eo:cloud_cover < 20")
    translated, without_filter = row_tests_of(schema, search_plan)
    assert "eo:cloud_cover" in translated.filter_columns
    assert "eo:cloud_cover" not in without_filter.filter_columns
    assert without_filter.residual is not None  # rows are matched against the whole filter instead
    rows = [{"id": "typed", "collection": "alpha"}, {"id": "elsewhere", "collection": "beta"}]
    assert kept(without_filter, rows) == ["typed"]


def test_a_datetime_interval_keeps_items_whose_range_overlaps_it(schema: Schema) -> None:
    test, _ = row_tests_of(schema, plan(schema, datetime="2024-03-01T00:00:00Z/2024-03-31T23:59:59Z"))

    def at(day: int, month: int = 3) -> datetime:
        return datetime(2024, month, day, tzinfo=UTC)

    rows = [
        {"id": "inside", "datetime": at(10)},
        {"id": "before", "datetime": at(10, month=1)},
        {"id": "range-overlapping", "start_datetime": at(1, month=2), "end_datetime": at(2)},
        {"id": "range-before", "start_datetime": at(1, month=1), "end_datetime": at(1, month=2)},
    ]
    assert kept(test, rows) == ["inside", "range-overlapping"]


@pytest.mark.parametrize(
    ("request_fields", "words"),
    [
        ({"bbox": [0, 0, 1, 1], "intersects": {"type": "Point", "coordinates": [0, 0]}}, "mutually exclusive"),
        ({"bbox": "0,50,10,10"}, "south"),
        ({"datetime": "2024-05-01T00:00:00Z/2024-01-01T00:00:00Z"}, "starts after it ends"),
        ({"filter": "eo:cloud_cover <"}, "cql2-text"),
    ],
)
def test_a_bad_request_is_refused_naming_what_is_wrong(
    schema: Schema, request_fields: dict[str, Any], words: str
) -> None:
    with pytest.raises(InvalidSearch, match=words):
        plan(schema, **request_fields)
