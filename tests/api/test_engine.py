"""The search engine in-process: every translated filter returns exactly what cql2 matches over the original items."""

from __future__ import annotations

import cql2
import pytest

from ingest import Repository, Settings
from ingest.api import SearchEngine, SearchRequest
from tests.conftest import make_item


@pytest.fixture(scope="module")
def engine_and_items(tmp_path_factory: pytest.TempPathFactory):
    repository = Repository.create(tmp_path_factory.mktemp("engine") / "repo", Settings())
    # Batch 1 mixes numbers and a string under eo:cloud_cover, so that column cannot be typed there: every value
    # of it lands in floe:overflow. Batch 2 types it as a double. Filters must see both.
    first = [
        make_item(
            f"a-{i:03d}", "alpha", when=f"2024-0{1 + i % 9}-10T00:00:00Z", **{"eo:cloud_cover": i % 40, "gsd": 10}
        )
        for i in range(40)
    ]
    first.append(make_item("a-cloudy", "alpha", **{"eo:cloud_cover": "cloudy", "gsd": 10}))
    second = [
        make_item(
            f"b-{i:03d}",
            "beta",
            when=f"2024-0{1 + i % 9}-20T00:00:00Z",
            **{"eo:cloud_cover": float(i % 50), "gsd": 10 + i % 3, "platform": f"sat-{i % 3}"},
        )
        for i in range(60)
    ]
    for batch in (first, second):
        writer = repository.writer()
        writer.add_items(batch)
        writer.commit("batch")
    return SearchEngine(repository), first + second


FILTERS = [
    "eo:cloud_cover < 20",
    "eo:cloud_cover >= 10 AND eo:cloud_cover <= 12",
    "eo:cloud_cover BETWEEN 5 AND 7",
    "eo:cloud_cover IN (1, 2, 3, 45)",
    "eo:cloud_cover = 'cloudy'",
    "gsd = 11 OR eo:cloud_cover < 2",
    "platform LIKE 'sat-1%'",
    "platform = 'sat-2' AND collection = 'beta'",
    "NOT (eo:cloud_cover < 30)",
    "datetime >= TIMESTAMP('2024-05-01T00:00:00Z') AND eo:cloud_cover < 25",
    "id IN ('a-001', 'b-002', 'nope')",
    "platform IS NULL AND eo:cloud_cover < 3",
]


@pytest.mark.parametrize("text", FILTERS)
def test_filter_results_equal_cql2_over_the_original_items(engine_and_items, text: str) -> None:
    engine, items = engine_and_items
    expression = cql2.parse_text(text)

    def matches(item: dict) -> bool:
        try:
            return bool(expression.matches(item))
        except Exception:
            return False

    expected = {item["id"] for item in items if matches(item)}
    found = [item["id"] for item in engine.iter_items(SearchRequest(filter=text, limit=7))]
    assert len(found) == len(set(found))
    assert set(found) == expected
    assert {item["id"] for item in engine.iter_items(SearchRequest(filter=text, sortby=["-id"], limit=5))} == expected


def test_overflowed_values_are_found_by_translated_filters(engine_and_items) -> None:
    engine, _ = engine_and_items
    found = {item["id"] for item in engine.iter_items(SearchRequest(filter="eo:cloud_cover < 3", limit=100))}
    assert {"a-000", "a-001", "a-002", "b-000", "b-001", "b-002"} <= found


def test_items_crossing_the_antimeridian_are_found(tmp_path) -> None:
    """A bbox with xmin > xmax covers both sides of 180°: pruning by bounds must not drop it."""
    repository = Repository.create(tmp_path / "repo", Settings())
    crossing = make_item("crossing", "c")
    crossing["geometry"] = {
        "type": "MultiPolygon",
        "coordinates": [
            [[[178.0, 0.0], [180.0, 0.0], [180.0, 2.0], [178.0, 2.0], [178.0, 0.0]]],
            [[[-180.0, 0.0], [-178.0, 0.0], [-178.0, 2.0], [-180.0, 2.0], [-180.0, 0.0]]],
        ],
    }
    crossing["bbox"] = [178.0, 0.0, -178.0, 2.0]
    elsewhere = make_item("elsewhere", "c")
    elsewhere["geometry"] = {"type": "Point", "coordinates": [20.0, 1.0]}
    elsewhere["bbox"] = [20.0, 1.0, 20.0, 1.0]
    writer = repository.writer()
    writer.add_items([crossing, elsewhere])
    writer.commit("two items")
    engine = SearchEngine(repository)

    def ids(bbox: list[float]) -> set[str]:
        return {item["id"] for item in engine.iter_items(SearchRequest(bbox=bbox, limit=10))}

    assert ids([178.5, 0.5, 179.5, 1.5]) == {"crossing"}  # the eastern half
    assert ids([-179.5, 0.5, -178.5, 1.5]) == {"crossing"}  # the western half
    assert ids([179.0, 0.5, -179.0, 1.5]) == {"crossing"}  # a query crossing too
    assert ids([10.0, 0.0, 30.0, 2.0]) == {"elsewhere"}
