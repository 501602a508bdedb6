"""Items -> Arrow rows -> items is exact, for real heterogeneous items and for generated ones."""

from __future__ import annotations

import json
import string
from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest import Repository
from ingest.stac import OVERFLOW, arrow_to_items, items_to_arrow, validate_item
from tests.conftest import load_real_items

KEYS = st.sampled_from(["eo:cloud_cover", "gsd", "platform", "proj:epsg", "raster:bands", "title", "a", "b", "nested"])
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.text(string.ascii_lowercase, min_size=1, max_size=4), inner, max_size=3),
    ),
    max_leaves=8,
)
DATETIMES = st.sampled_from(
    [
        "2024-01-05T00:00:00Z",
        "2024-01-05T10:20:30.123456Z",
        "2024-01-05T10:20:30.5Z",
        "2024-01-05 10:20:30+00:00",
        "2023-12-31T23:59:59+02:00",
    ]
)


@st.composite
def items(draw, collection: str | None = None) -> dict:
    x = draw(st.floats(-180, 179))
    y = draw(st.floats(-90, 89))
    geometry = draw(
        st.sampled_from(
            [
                {"type": "Point", "coordinates": [x, y]},
                {"type": "Polygon", "coordinates": [[[x, y], [x + 1, y], [x + 1, y + 1], [x, y + 1], [x, y]]]},
                {"type": "Point", "coordinates": [x, y, 5.0]},
            ]
        )
    )
    properties = {"datetime": draw(DATETIMES)}
    properties.update(draw(st.dictionaries(KEYS, JSON, max_size=5)))
    item = {
        "type": "Feature",
        "stac_version": "1.0.0",
        "id": draw(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,11}", fullmatch=True)),
        "collection": collection or draw(st.sampled_from(["c1", "c2"])),
        "geometry": geometry,
        "properties": properties,
    }
    if draw(st.booleans()):
        item["bbox"] = [x, y, x + 1, y + 1]
    if draw(st.booleans()):
        item["stac_extensions"] = draw(st.lists(st.text(max_size=5), max_size=2))
    if draw(st.booleans()):
        item["assets"] = draw(
            st.dictionaries(
                st.sampled_from(["data", "thumb"]),
                st.dictionaries(st.sampled_from(["href", "type", "roles"]), JSON, max_size=3),
                max_size=2,
            )
        )
    if draw(st.booleans()):
        item["links"] = draw(
            st.lists(
                st.fixed_dictionaries({"rel": st.sampled_from(["self", "parent"]), "href": st.text(max_size=5)}),
                max_size=2,
            )
        )
    if draw(st.booleans()):
        item["foreign:member"] = draw(JSON)
    return item


def unique_by_id(batch: list[dict]) -> list[dict]:
    return list({(item["collection"], item["id"]): item for item in batch}.values())


def round_trip(batch: list[dict], **kwargs) -> dict:
    table = items_to_arrow(batch, **kwargs)
    return {(item["collection"], item["id"]): item for item in arrow_to_items(table)}


def test_real_items_round_trip_exactly():
    real = load_real_items()
    assert len({item["collection"] for item in real}) == 13
    for item in real:
        validate_item(item)
    back = round_trip(real)
    assert len(back) == len(real)
    for item in real:
        assert back[(item["collection"], item["id"])] == item


def test_typed_columns_are_used_where_lossless():
    batch = [
        {
            "type": "Feature",
            "id": f"i{n}",
            "collection": "c",
            "geometry": {"type": "Point", "coordinates": [1.0, 2.0]},
            "properties": {"datetime": "2024-01-01T00:00:00Z", "eo:cloud_cover": 1.5 * n, "platform": "sentinel-2a"},
        }
        for n in range(3)
    ]
    table = items_to_arrow(batch)
    assert table.schema.field("eo:cloud_cover").type == pa.float64()
    assert table.schema.field("platform").type == pa.string()
    assert table.schema.field("datetime").type == pa.timestamp("us", tz="UTC")
    # Only the absent bbox needs the overflow column here.
    assert [json.loads(text) for text in table.column(OVERFLOW).to_pylist()] == [{"absent": ["bbox"]}] * 3


def test_mixed_types_go_to_the_overflow_and_come_back():
    base = {"type": "Feature", "collection": "c", "geometry": {"type": "Point", "coordinates": [1.0, 2.0]}}
    batch = [
        {**base, "id": "a", "properties": {"datetime": "2024-01-01T00:00:00Z", "mixed": 1, "nulled": None}},
        {**base, "id": "b", "properties": {"datetime": "2024-01-01T00:00:00Z", "mixed": "one"}},
    ]
    table = items_to_arrow(batch)
    assert "mixed" not in table.column_names
    assert round_trip(batch) == {("c", "a"): batch[0], ("c", "b"): batch[1]}


def test_integers_a_double_cannot_hold_are_not_widened_next_to_floats():
    # Found by hypothesis: 2**53 + 1 next to a float made the column float64, and Arrow refused the conversion.
    base = {"type": "Feature", "collection": "c", "geometry": {"type": "Point", "coordinates": [1.0, 2.0]}}
    batch = [
        {**base, "id": "a", "properties": {"datetime": "2024-01-01T00:00:00Z", "a": 0.5, "b": 0.5}},
        {**base, "id": "b", "properties": {"datetime": "2024-01-01T00:00:00Z", "a": 2**53 + 1, "b": 2**53}},
    ]
    table = items_to_arrow(batch)
    assert "a" not in table.column_names  # to the overflow, exactly
    assert table.schema.field("b").type == pa.float64()  # 2**53 is a double exactly: widened as before
    back = round_trip(batch)
    assert back[("c", "b")]["properties"]["a"] == 2**53 + 1
    assert back[("c", "a")] == batch[0]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(items(), min_size=1, max_size=8))
@pytest.mark.slow
def test_generated_items_round_trip_exactly(batch):
    batch = unique_by_id(batch)
    back = round_trip(batch)
    assert back == {(item["collection"], item["id"]): item for item in batch}


@settings(max_examples=40, deadline=None)
@given(st.lists(items(), min_size=1, max_size=5), st.sets(KEYS))
@pytest.mark.slow
def test_untyped_columns_still_round_trip(batch, untyped):
    batch = unique_by_id(batch)
    back = round_trip(batch, untyped=untyped | {"assets", "links"})
    assert back == {(item["collection"], item["id"]): item for item in batch}


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(st.lists(st.lists(items(), min_size=1, max_size=4), min_size=2, max_size=3))
@pytest.mark.slow
def test_batches_with_conflicting_types_round_trip_through_the_table(tmp_path_factory, batches):
    """Later batches meet columns typed by earlier ones; nothing is lost or coerced."""
    repo = Repository.create(tmp_path_factory.mktemp("repo") / "r")
    expected: dict = {}
    for number, generated in enumerate(batches):
        batch = [item for item in unique_by_id(generated) if (item["collection"], item["id"]) not in expected]
        if not batch:
            continue
        writer = repo.writer()
        assert writer.add_items(batch) == []
        writer.commit(f"batch {number}")
        expected.update({(item["collection"], item["id"]): item for item in batch})
    found = list(repo.view().items())
    assert Counter((item["collection"], item["id"]) for item in found) == Counter(expected.keys())
    assert {(item["collection"], item["id"]): item for item in found} == expected


def test_a_large_integer_after_a_float_column_comes_back_exactly(tmp_path):
    """A table column typed float64 by one commit; a later integer beyond 2**53 goes to the overflow, not cast."""
    base = {"type": "Feature", "collection": "c", "geometry": {"type": "Point", "coordinates": [1.0, 2.0]}}
    first = {**base, "id": "a", "properties": {"datetime": "2024-01-01T00:00:00Z", "n": 0.5}}
    second = {**base, "id": "b", "properties": {"datetime": "2024-01-01T00:00:00Z", "n": 2**53 + 1}}
    third = {**base, "id": "c", "properties": {"datetime": "2024-01-01T00:00:00Z", "n": 7}}
    repo = Repository.create(tmp_path / "r")
    for item in (first, second, third):
        writer = repo.writer()
        assert writer.add_items([item]) == []
        writer.commit(item["id"])
    back = {item["id"]: item["properties"]["n"] for item in repo.view().items()}
    assert back == {"a": 0.5, "b": 2**53 + 1, "c": 7.0}
    assert isinstance(back["b"], int)


def test_rows_become_items_without_cyclic_collections_while_a_chunk_is_built():
    """Reading rows pauses the cyclic collector per chunk, as writing them does: its collections walked every
    live object on each burst of allocations and took more than half of the time."""
    import gc

    from tests.conftest import make_item

    items = [make_item(f"i{number}") for number in range(1000)]
    for number, item in enumerate(items):
        item["assets"] = {"data": {"href": f"s3://b/{number}.tif", "roles": ["data"]}}
    table = items_to_arrow(items)
    collections = []

    def count(phase: str, _info: dict) -> None:
        if phase == "start":
            collections.append(phase)

    gc.callbacks.append(count)
    try:
        back = list(arrow_to_items(table))
    finally:
        gc.callbacks.remove(count)
    assert len(back) == 1000
    assert gc.isenabled()
    # 1,000 rows build tens of thousands of containers: unpaused, that is dozens of collections.
    assert len(collections) <= 2


def test_non_finite_numbers_in_the_overflow_come_back():
    """orjson writes the overflow unless it would turn a NaN or an infinity into null."""
    import math

    from tests.conftest import make_item

    items = [
        make_item("nan", x=float("nan"), y=float("inf")),
        make_item("text", x="a", y="b"),  # the column mixes types: both values go to the overflow
    ]
    back = {item["id"]: item for item in arrow_to_items(items_to_arrow(items))}
    assert math.isnan(back["nan"]["properties"]["x"])
    assert back["nan"]["properties"]["y"] == float("inf")
    assert back["text"]["properties"] == items[1]["properties"]


def test_a_year_before_1000_is_typed_and_comes_back_as_written():
    from tests.conftest import make_item

    item = validate_item(make_item("old", when="0999-01-05T00:00:00Z"))
    table = items_to_arrow([item])
    # The canonical rendering is the text itself: nothing about the datetime is kept aside.
    assert "datetime" not in (table.column(OVERFLOW)[0].as_py() or "")
    assert next(arrow_to_items(table)) == item


def test_empty_links_are_typed_and_fit_the_links_of_later_items(tmp_path):
    """Items a STAC API served keep `links: []` (floe drops the API's own links): a typed column, no overflow, and
    the table's links column takes real links later (and the other way round), each read back as written."""
    base = {
        "type": "Feature",
        "collection": "c",
        "geometry": {"type": "Point", "coordinates": [1.0, 2.0]},
        "bbox": [1.0, 2.0, 1.0, 2.0],
    }
    when = {"datetime": "2024-01-01T00:00:00Z"}
    bare = [{**base, "id": f"bare-{n}", "properties": when, "links": []} for n in (1, 2)]
    absent = {**base, "id": "absent", "properties": {"datetime": "2024-01-01T00:00:00Z"}}
    linked = {
        **base,
        "id": "linked",
        "properties": {"datetime": "2024-01-01T00:00:00Z"},
        "links": [{"rel": "license", "href": "https://example.com/l", "type": "text/html", "title": "L"}],
    }
    table = items_to_arrow([*bare, absent])
    assert table.column(OVERFLOW).null_count == table.num_rows
    links = dict(zip(table.column("id").to_pylist(), table.column("links").to_pylist(), strict=True))
    assert links == {"bare-1": [], "bare-2": [], "absent": None}

    for order in ([[*bare, absent], [linked]], [[linked], [*bare, absent]]):
        repo = Repository.create(tmp_path / f"r-{order[0][0]['id']}")
        for number, batch in enumerate(order):
            writer = repo.writer()
            assert writer.add_items(batch) == []
            writer.commit(f"batch {number}")
        assert {item["id"]: item for item in repo.view().items()} == {
            item["id"]: item for item in [*bare, absent, linked]
        }


def test_lists_empty_in_every_row_are_typed_and_fit_later_values(tmp_path):
    """An asset's `roles: []` or a property's `tags: []` in every row of a batch (Arrow infers list<null>, which no
    table stores) become lists of strings: no overflow, and later rows' strings fit the same columns."""
    base = {
        "type": "Feature",
        "collection": "c",
        "geometry": {"type": "Point", "coordinates": [1.0, 2.0]},
        "bbox": [1.0, 2.0, 1.0, 2.0],
        "links": [],
    }

    def item(name: str, roles: list, tags: list) -> dict:
        properties = {"datetime": "2024-01-01T00:00:00Z", "tags": tags}
        return {**base, "id": name, "properties": properties, "assets": {"data": {"href": "a.tif", "roles": roles}}}

    empty = [item(f"empty-{n}", [], []) for n in (1, 2)]
    full = item("full", ["data", "overview"], ["x"])
    table = items_to_arrow(empty)
    assert table.column(OVERFLOW).null_count == table.num_rows
    assert table.schema.field("tags").type == pa.list_(pa.string())
    assert table.schema.field("assets").type.field("data").type.field("roles").type == pa.list_(pa.string())
    assert list(arrow_to_items(table)) == empty

    for order in ([empty, [full]], [[full], empty]):
        repo = Repository.create(tmp_path / f"r-{order[0][0]['id']}")
        for number, batch in enumerate(order):
            writer = repo.writer()
            assert writer.add_items(batch) == []
            writer.commit(f"batch {number}")
        assert {row["id"]: row for row in repo.view().items()} == {one["id"]: one for one in [*empty, full]}
