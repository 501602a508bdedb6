"""JSON is read exactly: integers beyond 64 bits stay integers, from the source file to the export (issue 14)."""

from __future__ import annotations

import json

import pytest

from ingest import Repository
from ingest.pipeline import ingest_items
from ingest.stac import arrow_to_items, items_to_arrow, loads_json
from tests.conftest import make_item

HUGE = [2**70 + 1, -(2**70) - 1, 2**64, 10**30]


@pytest.mark.parametrize("value", HUGE)
def test_integers_beyond_64_bits_parse_exactly(value):
    text = json.dumps({"scalar": value, "list": [value, 1.5], "nested": {"deep": [value]}})
    assert loads_json(text) == {"scalar": value, "list": [value, 1.5], "nested": {"deep": [value]}}
    assert loads_json(text.encode()) == loads_json(text)
    assert isinstance(loads_json(text)["scalar"], int)


def test_floats_and_nan_still_parse():
    parsed = loads_json('{"a": 0.12345678901234567890123, "b": 1e300, "c": NaN, "d": 12345678901234567890.5}')
    assert parsed["a"] == 0.12345678901234568 and parsed["b"] == 1e300 and parsed["c"] != parsed["c"]
    assert parsed["d"] == 12345678901234567890.5


@pytest.mark.parametrize("value", [*HUGE, [2**70 + 1], {"inner": 2**70 + 1}])
def test_rows_keep_huge_integers_exactly(value):
    item = make_item("a", big=value)
    assert next(arrow_to_items(items_to_arrow([item])))["properties"]["big"] == value


def test_an_ingested_huge_integer_comes_back_unaltered(tmp_path):
    source = tmp_path / "items.ndjson"
    source.write_text(json.dumps(make_item("a", big=2**70 + 1, ok=7)) + "\n" + json.dumps(make_item("b", big=5)) + "\n")
    repository = Repository.create(tmp_path / "repo")
    report = ingest_items(repository, [source])
    assert report.rejected == [] and report.rows_added == 2
    stored = {item["id"]: item["properties"]["big"] for item in repository.view().items()}
    assert stored == {"a": 2**70 + 1, "b": 5}
