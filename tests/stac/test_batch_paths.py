"""The batch-at-once conversions (one-ring footprints to WKB in numpy, ``ingest/stac/_wkb.py``, and the nested
columns' check without a read-back) give exactly the table the row-by-row path gives, and values keep their JSON
type through the Arrow rows.

End to end the WKB batch path makes a metadata ingest 1.09x faster, the nested columns' check
1.15x (``scripts/bench_fast_paths.py``, 9 rounds; docs/benchmarks.md). Timestamps and bboxes converted a batch at a
time in Arrow gained nothing measurable end to end (0.99x over 7 rounds) and were taken out: the row-by-row
path is the one path for them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.stac import _columns, _rows, arrow_to_items, items_to_arrow
from ingest.stac._wkb import simple_wkb
from tests.stac.test_rows import items

BATCH_PATHS = ("one_ring_polygons_wkb",)


@contextmanager
def row_by_row() -> Iterator[None]:
    """items_to_arrow with every batch path declining, and the nested columns always read back."""
    saved = {name: getattr(_rows, name) for name in BATCH_PATHS}
    plain = _columns._plain
    for name in BATCH_PATHS:
        setattr(_rows, name, lambda *_, **__: None)
    _columns._plain = lambda values: (False, True)
    try:
        yield
    finally:
        for name, function in saved.items():
            setattr(_rows, name, function)
        _columns._plain = plain


def converted(batch: list[dict[str, Any]]) -> pa.Table | str:
    try:
        return items_to_arrow(batch)
    except Exception as error:
        return type(error).__name__


def assert_both_paths_agree(batch: list[dict[str, Any]]) -> None:
    """items_to_arrow gives the same table (or fails alike) with the batch paths and row by row."""
    fast = converted(batch)
    with row_by_row():
        slow = converted(batch)
    if isinstance(slow, str) or isinstance(fast, str):
        assert fast == slow
    else:
        assert fast.schema == slow.schema
        for name in slow.column_names:  # (NaN equal to NaN, which Arrow's equals does not allow)
            assert same_json(slow.column(name).to_pylist(), fast.column(name).to_pylist()), name


def same_json(original: Any, back: Any) -> bool:
    """Equal as JSON: booleans apart from numbers (Python's True == 1.0), integers equal to their doubles
    (the one widening floe allows), NaN equal to NaN."""
    if isinstance(original, bool) or isinstance(back, bool):
        return type(original) is type(back) and original == back
    if isinstance(original, float) and isinstance(back, float) and math.isnan(original):
        return math.isnan(back)
    if isinstance(original, dict):
        return (
            isinstance(back, dict)
            and original.keys() == back.keys()
            and all(same_json(value, back[key]) for key, value in original.items())
        )
    if isinstance(original, list):
        return (
            isinstance(back, list)
            and len(original) == len(back)
            and all(same_json(a, b) for a, b in zip(original, back, strict=True))
        )
    return bool(original == back)


def test_booleans_beside_doubles_in_an_asset_come_back_as_booleans():
    """Arrow types a field holding 1.5 and true as a double, so true read back as 1.0; and 1.0 == True in
    Python, so the read-back check let it through."""
    from tests.conftest import make_item

    first, second = make_item("a"), make_item("b")
    first["assets"] = {"data": {"href": "a.tif", "scale": 1.5}}
    second["assets"] = {"data": {"href": "b.tif", "scale": True}}
    table = items_to_arrow([first, second])
    back = {item["id"]: item for item in arrow_to_items(table)}
    assert back["b"]["assets"]["data"]["scale"] is True
    assert back["a"]["assets"]["data"]["scale"] == 1.5
    assert same_json(second, back["b"]) and same_json(first, back["a"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(items(), min_size=1, max_size=8))
@pytest.mark.slow
def test_generated_items_keep_their_json_types(batch):
    batch = list({(item["collection"], item["id"]): item for item in batch}.values())
    back = {(item["collection"], item["id"]): item for item in arrow_to_items(items_to_arrow(batch))}
    for item in batch:
        assert same_json(item, back[(item["collection"], item["id"])])


CANONICAL = ["2024-01-05T10:20:30Z", "2024-01-05T10:20:30.123456Z", "0999-01-05T00:00:00Z", "9999-12-31T23:59:59Z"]
OTHER_TIMES = [
    "2024-01-05T10:20:30.5Z",
    "2024-01-05T10:20:30.000000Z",
    "2024-01-05T10:20:30.1234567Z",
    "2024-01-05 10:20:30Z",
    "2024-01-05T10:20:30z",
    "2024-01-05T10:20:30+02:00",
    "2024-01-05T10:20:30+00:00",
    "0000-01-01T00:00:00Z",
    "2024-02-30T00:00:00Z",
    "2024-01-05T24:00:00Z",
    "yesterday",
    "",
    "2024-01-05",
    "2024-01-05T10:20:30",
]
ODD_NUMBERS = st.sampled_from([2**53, 2**53 + 1, True, False, float("nan"), float("inf"), -0.0, "1", None, 7])


@st.composite
def rings(draw) -> list[Any]:
    """A closed ring of floats, sometimes with one thing wrong with it: an odd number, or left open."""
    x, y = draw(st.floats(-170, 170)), draw(st.floats(-80, 80))
    ring: list[Any] = [[x, y], [x + 1, y], [x + 1, y + 1], [x, y]]
    change = draw(st.integers(0, 3))
    if change == 1:
        ring[draw(st.integers(0, 3))][draw(st.integers(0, 1))] = draw(ODD_NUMBERS)
    elif change == 2:
        ring[-1] = [x, y + 0.5]  # open
    elif change == 3:
        ring = ring[1:]  # too short
    return ring


@st.composite
def uniform_items(draw) -> dict[str, Any]:
    """Items like a real batch's: mostly one-ring polygons, canonical times and four-number bboxes, each
    sometimes not (one such item is enough to send the whole batch down the row-by-row path)."""
    item = draw(items())
    geometry = draw(st.integers(0, 9))
    if geometry < 6:
        item["geometry"] = {"type": "Polygon", "coordinates": [draw(rings())]}
    elif geometry < 9:
        item["geometry"] = draw(
            st.sampled_from(
                [
                    {"type": "Polygon", "coordinates": [draw(rings()), draw(rings())]},
                    {"type": "Polygon", "coordinates": [draw(rings())], "bbox": [0, 0, 1, 1]},
                    {"type": "Polygon", "coordinates": [[[0, 0, 1], [1, 0, 1], [1, 1, 1], [0, 0, 1]]]},
                    {"type": "Point", "coordinates": [1.0, 2.0]},
                ]
            )
        )
    if draw(st.integers(0, 4)):
        ring = item["geometry"]["coordinates"][0] if item["geometry"]["type"] == "Polygon" else [[0, 0]]
        item["bbox"] = [ring[0][0], ring[0][1], 180, 90]
    else:
        odd = st.lists(st.one_of(st.floats(-180, 180), ODD_NUMBERS), min_size=4, max_size=4)
        bbox = draw(st.one_of(st.none(), odd, st.lists(st.floats(-180, 180), min_size=6, max_size=6)))
        if bbox is None:
            item.pop("bbox", None)
        else:
            item["bbox"] = bbox
    times = st.sampled_from(CANONICAL) if draw(st.integers(0, 4)) else st.sampled_from(OTHER_TIMES)
    item["properties"]["datetime"] = draw(st.one_of(times, st.none()) if draw(st.integers(0, 9)) == 0 else times)
    for key in ("start_datetime", "end_datetime"):
        if draw(st.integers(0, 3)) == 0:
            item["properties"][key] = draw(st.one_of(st.sampled_from(CANONICAL + OTHER_TIMES), st.none()))
    return item


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(uniform_items(), min_size=1, max_size=8))
@pytest.mark.slow
def test_batch_paths_give_the_row_by_row_table(batch):
    batch = list({(item["collection"], item["id"]): item for item in batch}.values())
    assert_both_paths_agree(batch)


def test_a_uniform_batch_takes_the_batch_paths():
    """Each batch path answers for a batch of plain items, with what the row-by-row path writes."""
    from tests.conftest import make_item

    batch = [make_item(f"i{n}", when=CANONICAL[n % 2]) for n in range(6)]
    for n, item in enumerate(batch):
        x = -10.5 + n
        item["geometry"] = {"type": "Polygon", "coordinates": [[[x, 1], [x + 1, 1], [x + 1, 2.25], [x, 1]]]}
        item["bbox"] = [x, 1, x + 1, 2.25]
    polygons = _rows.one_ring_polygons_wkb([item["geometry"] for item in batch])
    assert polygons is not None
    assert polygons.to_pylist() == [simple_wkb(item["geometry"])[0] for item in batch]  # type: ignore[index]
    assert _columns._plain([{"data": {"href": "a.tif", "roles": ["data"]}}]) == (True, False)
    # One item off the common form and the batch goes row by row.
    assert _rows.one_ring_polygons_wkb([batch[0]["geometry"], {"type": "Point", "coordinates": [0, 0]}]) is None
    assert _columns._plain([{"data": {"href": None}}]) == (False, False)


def plain_batch() -> list[dict[str, Any]]:
    from tests.conftest import make_item

    batch = [make_item(f"p{n}", when=CANONICAL[n % 2]) for n in range(3)]
    for n, item in enumerate(batch):
        ring = [[n, 0.5], [n + 1, 0.5], [n + 1, 1.5], [n, 0.5]]
        item["geometry"] = {"type": "Polygon", "coordinates": [ring]}
        item["bbox"] = [n, 0.5, n + 1, 1.5]
    return batch


def _ring_with(value: Any) -> list[Any]:
    return [[0, 0], [1, value], [1, 1], [0, 0]]


ODD_ONES: dict[str, tuple[str, Any]] = {
    **{f"coordinate {value!r}": ("ring", _ring_with(value)) for value in ODD_NUMBERS.elements},
    "open ring": ("ring", [[0, 0], [1, 0], [1, 1], [0, 1]]),
    "ring of three": ("ring", [[0, 0], [1, 1], [0, 0]]),
    "3D ring": ("ring", [[0, 0, 1], [1, 0, 1], [1, 1, 1], [0, 0, 1]]),
    "2D and 3D positions": ("ring", [[0, 0, 0], [0, 0], [0, 0], [0, 0]]),
    "tuple positions": ("ring", [(0, 0), (1, 0), (1, 1), (0, 0)]),
    **{f"bbox with {value!r}": ("bbox", [0, value, 1, 1]) for value in ODD_NUMBERS.elements},
    "bbox of six": ("bbox", [0, 0, 0, 1, 1, 1]),
    "no bbox": ("bbox", None),
    **{f"datetime {text}": ("datetime", text) for text in OTHER_TIMES},
    "null datetime": ("datetime", None),
    "null start": ("start_datetime", None),
}


@pytest.mark.parametrize("odd", list(ODD_ONES), ids=list(ODD_ONES))
def test_one_odd_item_in_a_plain_batch_converts_as_row_by_row(odd):
    """Each case a batch path must decline (or handle exactly as the row-by-row path does), alone in a batch
    otherwise plain: the two tables are the same."""
    where, value = ODD_ONES[odd]
    batch = plain_batch()
    item = batch[1]
    if where == "ring":
        item["geometry"]["coordinates"] = [value]
    elif where == "bbox":
        if value is None:
            del item["bbox"]
        else:
            item["bbox"] = value
    else:
        item["properties"][where] = value
    assert_both_paths_agree(batch)


def test_footprints_checked_a_batch_at_once_find_the_same_suspects(monkeypatch):
    """refused_geometries takes a batch of plain footprints in numpy: the items it suspects are those the
    walk of each geometry suspects (a coordinate out of range, a footprint outside its bbox)."""
    from ingest.stac import _geometry
    from ingest.stac._geometry import geometry_problem, refused_geometries

    batch = plain_batch() * 2
    batch = [{**item, "geometry": {**item["geometry"]}} for item in batch]
    batch[1]["geometry"]["coordinates"] = [[[0, 0], [200, 0], [1, 1], [0, 0]]]  # beyond 180
    batch[2]["bbox"] = [50, 50, 51, 51]  # holds none of the footprint
    batch[3]["geometry"]["coordinates"] = [[[0, 0], [1, 0], [1, 90.5], [0, 0]]]  # beyond the tolerance
    batch[3]["bbox"] = [0, 0, 1, 90.5]
    batch[4]["bbox"] = [170, 0.5, -170, 1.5]  # west > east: an antimeridian bbox, checked alone
    suspects = refused_geometries(batch)
    assert suspects == [1, 2, 3, 4]
    assert all(geometry_problem(batch[index]) for index in (1, 2, 3))
    monkeypatch.setattr(_geometry, "one_ring_positions", lambda geometries: None)
    assert refused_geometries(batch) == suspects


NAMES = st.one_of(
    st.text(max_size=12),
    st.text(alphabet=st.sampled_from(list("ab._-% /\\\t\u00a0\u2003\x00\x7f")), max_size=6),
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True),
)


def _deep(levels: int) -> Any:
    nested: Any = "deep"
    for _ in range(levels):
        nested = [nested]
    return nested


WRONG: list[tuple[str, Any]] = [
    ("type", st.just("feature")),
    ("collection", st.sampled_from([None, "", "../up", 7, " c1"])),
    ("geometry", st.sampled_from([None, {}, {"type": 1}, []])),
    ("properties", st.sampled_from([None, {}, {"datetime": None}, []])),
    ("assets", st.just([])),
    ("links", st.just({})),
    ("bbox", st.sampled_from([[0, 0, 1], [0, 1, 1, 0], "box", [0, 0, 200, 1]])),
    ("properties.deep", st.just(_deep(300))),
    ("properties.text", st.just("\ud800")),
    ("properties.datetime", st.sampled_from(OTHER_TIMES)),
    ("properties.start_datetime", st.just(CANONICAL[1])),  # after the end below
    ("properties.end_datetime", st.sampled_from([None, 7, *OTHER_TIMES])),  # sometimes with a null datetime
]


@st.composite
def items_to_check(draw) -> dict[str, Any]:
    """Items mostly valid, each sometimes wrong in one of the ways validate_item looks for."""
    item = draw(uniform_items())
    item["id"] = draw(NAMES) if draw(st.integers(0, 3)) == 0 else item["id"]
    change = draw(st.integers(0, 2 * len(WRONG)))
    if change < len(WRONG):
        where, values = WRONG[change]
        if where.startswith("properties."):
            key = where.split(".", 1)[1]
            item["properties"][key] = draw(values)
            if key == "start_datetime":
                item["properties"]["end_datetime"] = CANONICAL[0]
            if key == "end_datetime":
                item["properties"]["start_datetime"] = CANONICAL[0]
                if draw(st.booleans()):
                    item["properties"]["datetime"] = None
        else:
            item[where] = draw(values)
    return item


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(items_to_check(), min_size=1, max_size=6))
@pytest.mark.slow
def test_items_passed_a_batch_at_once_are_those_validate_item_accepts_as_they_are(batch):
    from ingest.stac import plainly_valid, validate_item

    verdicts = plainly_valid(batch)
    assert len(verdicts) == len(batch)
    for item, plain in zip(batch, verdicts, strict=True):
        if plain:  # (an item not passed is validated alone: its verdict is validate_item's own)
            assert validate_item(item, check_geometry=False) is item  # accepted, and not copied


def test_a_plain_batch_is_passed_at_once():
    from ingest.stac import plainly_valid

    batch = plain_batch()
    assert plainly_valid(batch) == [True] * len(batch)
    batch[1]["properties"]["datetime"] = "2024-01-05T10:20:30.5Z"  # valid, not canonical: checked alone, and passes
    batch[2]["id"] = "100%"  # valid, with a percent sign: checked alone
    assert plainly_valid(batch) == [True, True, False]
    batch[1]["properties"]["datetime"] = "2024-02-30T00:00:00Z"
    assert plainly_valid(batch) == [True, False, False]
    # A range with a null datetime passes at once; one that ends before it starts, or on a number, does not.
    batch = plain_batch()
    for item, end in zip(batch, (CANONICAL[1], CANONICAL[0], 7), strict=True):
        item["properties"].update(datetime=None, start_datetime=CANONICAL[0], end_datetime=end)
    batch[1]["properties"]["start_datetime"] = CANONICAL[1]
    batch[2]["properties"]["datetime"] = CANONICAL[0]
    assert plainly_valid(batch) == [True, False, False]


@given(NAMES)
def test_a_plain_name_is_one_check_name_accepts(name):
    from ingest.stac._validate import _PLAIN_NAME, check_name

    if len(name) <= 255 and _PLAIN_NAME.fullmatch(name):
        assert check_name(name, "id") == name
