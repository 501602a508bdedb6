"""Simple geometries become WKB without GEOS's text path, byte for byte what GEOS writes, and read back exactly.

End to end, floe's WKB makes a metadata ingest of 100,000 items 1.20x faster than GEOS's path
(``scripts/bench_fast_paths.py``, 7 rounds; docs/benchmarks.md).
"""

from __future__ import annotations

import math
import random
import struct

import orjson
import pytest
import shapely

from ingest.stac import arrow_to_items, items_to_arrow, refused_geometries, validate_item
from ingest.stac._wkb import simple_wkb
from tests.conftest import make_item


def _position(rng: random.Random, dimensions: int) -> list[float]:
    return [rng.uniform(-179.0, 179.0), rng.uniform(-89.0, 89.0), rng.uniform(-500.0, 9000.0)][:dimensions]


def _ring(rng: random.Random, dimensions: int, size: int = 5) -> list[list[float]]:
    positions = [_position(rng, dimensions) for _ in range(size - 1)]
    return [*positions, list(positions[0])]


def simple_geometries(dimensions: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [
        {"type": "Point", "coordinates": _position(rng, dimensions)},
        {"type": "LineString", "coordinates": [_position(rng, dimensions) for _ in range(3)]},
        {"type": "Polygon", "coordinates": [_ring(rng, dimensions)]},
        {"type": "Polygon", "coordinates": [_ring(rng, dimensions), _ring(rng, dimensions, 7)]},
        {"type": "MultiPoint", "coordinates": [_position(rng, dimensions) for _ in range(3)]},
        {
            "type": "MultiLineString",
            "coordinates": [[_position(rng, dimensions) for _ in range(2)], [_position(rng, dimensions)] * 4],
        },
        {
            "type": "MultiPolygon",
            "coordinates": [[_ring(rng, dimensions)], [_ring(rng, dimensions), _ring(rng, dimensions, 6)]],
        },
    ]


def geos_wkb(geometry: dict) -> bytes:
    return shapely.to_wkb(shapely.from_geojson(orjson.dumps(geometry)), output_dimension=3, flavor="iso")


@pytest.mark.parametrize("geometry", simple_geometries(2) + simple_geometries(3), ids=lambda g: g["type"])
def test_simple_geometries_are_written_as_geos_writes_them(geometry):
    found = simple_wkb(geometry)
    assert found is not None
    wkb, dimensions, flat = found
    assert wkb == geos_wkb(geometry)
    assert dimensions == (3 if shapely.has_z(shapely.from_wkb(wkb)) else 2)
    assert orjson.loads(shapely.to_geojson(shapely.from_wkb(wkb))) == geometry
    assert len(flat) % dimensions == 0


def test_every_finite_double_reads_back_bit_for_bit():
    """The simple path needs no round-trip check: GEOS writes each double in a form that parses to the same bits."""
    rng = random.Random(7)
    values = []
    while len(values) < 20_000:
        value = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
        if math.isfinite(value):
            values.append(value)
    values += [5e-324, -5e-324, 1.7976931348623157e308, -0.0, 0.0, 1.0, 0.1, 1 / 3, 2.0**52 + 0.5]
    line = {"type": "LineString", "coordinates": [values[index : index + 2] for index in range(0, len(values) - 1, 2)]}
    found = simple_wkb(line)
    assert found is not None
    back = orjson.loads(shapely.to_geojson(shapely.from_wkb(found[0])))["coordinates"]
    sent = [struct.pack("<d", value) for position in line["coordinates"] for value in position]
    assert [struct.pack("<d", value) for position in back for value in position] == sent


@pytest.mark.parametrize(
    "geometry",
    [
        {"type": "Point", "coordinates": [2**53 + 1, 2.5]},  # no double holds it: GEOS's path overflows it
        {"type": "Point", "coordinates": [True, 2.5]},
        {"type": "Polygon", "coordinates": [[[0.5, 0.5], [1.5, False], [1.5, 1.5], [0.5, 0.5]]]},
        {"type": "Point", "coordinates": ["1", 2.5]},
        {"type": "Point", "coordinates": [1.5, None]},
        {"type": "Point", "coordinates": [1.5]},
        {"type": "Point", "coordinates": [[1.5, 2.5]]},
        {"type": "Point", "coordinates": [1.5, 2.5], "bbox": [1.5, 2.5, 1.5, 2.5]},  # a member GEOS drops
        {"type": "Polygon", "coordinates": []},
        {"type": "Polygon", "coordinates": [[]]},
        {"type": "Polygon", "coordinates": [[[0.5, 0.5], [1.5, 0.5], [0.5, 1.5]]]},  # three positions
        {"type": "Polygon", "coordinates": [[[0.5, 0.5], [1.5, 0.5], [0.5, 1.5], [0.7, 0.5]]]},  # not closed
        {"type": "LineString", "coordinates": [[0.5, 0.5, 1.5], [1.5, 0.5]]},  # two dimensions in one
        {"type": "LineString", "coordinates": [[0.5, 0.5]]},
        {"type": "MultiPoint", "coordinates": [[0.5, 2.5], [1.5]]},
        {"type": "MultiPolygon", "coordinates": [[]]},
        {"type": "GeometryCollection", "geometries": [{"type": "Point", "coordinates": [0.5, 2.5]}]},
        {"type": "Circle", "coordinates": [0.5, 2.5]},
        [0.5, 2.5],
    ],
)
def test_other_geometries_are_left_to_geos(geometry):
    assert simple_wkb(geometry) is None


def test_integers_a_double_holds_are_taken_as_geos_takes_them():
    geometry = {"type": "Polygon", "coordinates": [[[10, 20], [11, 20], [11, 21], [10, 21], [10, 20]]]}
    found = simple_wkb(geometry)
    assert found is not None
    assert found[0] == geos_wkb(geometry)


def test_rows_of_simple_geometries_skip_geos_text_parsing_and_come_back(monkeypatch):
    items = [
        make_item(f"g{number}") | {"geometry": geometry}
        for number, geometry in enumerate(simple_geometries(2, 1) + simple_geometries(3, 2))
    ]
    for item in items:
        del item["bbox"]  # derived from the WKB
    checked = [validate_item(item) for item in items]

    def no_text_parse(*_args, **_kwargs):
        raise AssertionError("GEOS parsed GeoJSON text for a simple geometry")

    monkeypatch.setattr(shapely, "from_geojson", no_text_parse)
    assert refused_geometries(checked) == []
    table = items_to_arrow(checked)
    monkeypatch.undo()
    back = {item["id"]: item for item in arrow_to_items(table)}
    assert [back[item["id"]] for item in checked] == checked
    for item in checked:
        bounds = shapely.bounds(shapely.from_geojson(orjson.dumps(item["geometry"])))
        row = table.filter(table.column("id").to_numpy(zero_copy_only=False) == item["id"])
        assert list(row.column("bbox")[0].as_py().values()) == list(bounds)


def test_a_nan_coordinate_is_left_to_geos_which_refuses_it():
    geometry = {"type": "Point", "coordinates": [1.5, 2.5, float("nan")]}
    assert simple_wkb(geometry) is None
    item = make_item("nan") | {"geometry": geometry}
    del item["bbox"]
    assert refused_geometries([make_item("fine"), validate_item(item, check_geometry=False)]) == [1]


@pytest.mark.parametrize(
    ("geometry", "bbox"),
    [
        ({"type": "Point", "coordinates": [1.5, 2.5, float("inf")]}, None),
        ({"type": "LineString", "coordinates": [[1.5, 2.5], [181.5, 2.5]]}, None),
        ({"type": "MultiPoint", "coordinates": [[1.5, 2.5], [1.5, -92.5]]}, None),
        ({"type": "Polygon", "coordinates": [[[0.5, 0.5], [1.5, 0.5], [1.5, 1.5], [0.5, 0.5]]]}, [0.5, 0.5, 1.2, 1.5]),
        ({"type": "Point", "coordinates": [10.5, 20.5]}, [10.6, 20.0, 11.0, 21.0]),
    ],
)
def test_simple_geometries_outside_their_limits_are_suspects(geometry, bbox):
    assert simple_wkb(geometry) is not None  # the walk takes them: its own checks must flag them
    item = make_item("odd") | {"geometry": geometry}
    if bbox is None:
        del item["bbox"]
    else:
        item["bbox"] = bbox
    checked = validate_item(item, check_geometry=False)
    assert refused_geometries([make_item("fine"), checked, make_item("fine2")]) == [1]
