"""Sources a metadata backfill is tested with: awkward items in NDJSON (with bad lines), stac-geoparquet and a
FeatureCollection; a day of items for a STAC API search read in time lanes."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import stac_geoparquet.arrow as sga

from tests.conftest import make_item, with_square


def awkward_items(count: int) -> list[dict]:
    """Items as archives have them: huge properties, footprints across the antimeridian, nulls, big integers."""
    items = []
    for n in range(count):
        item = make_item(f"item-{n:04d}", ("optical", "radar")[n % 2], when=f"2024-{n % 12 + 1:02d}-07T10:00:00Z")
        if n % 50 == 0:
            item["properties"]["history"] = "processed; " * 2000
        if n % 7 == 0:
            ring = [[179.5, 10.0], [-179.5, 10.0], [-179.5, 11.0], [179.5, 11.0], [179.5, 10.0]]
            item["geometry"] = {"type": "Polygon", "coordinates": [ring]}
            item["bbox"] = [179.5, 10.0, -179.5, 11.0]
        if n % 5 == 0:
            item["properties"]["cloud_cover"] = None
        if n % 11 == 0:
            item["properties"]["checksum"] = 2**63 + n
        if n % 13 == 0:
            with_square(item, n % 90, -45.0, 0.5)
        items.append(item)
    return items


def write_sources(folder: Path) -> list[Path]:
    """A folder of NDJSON (with bad lines), stac-geoparquet (several row groups) and a FeatureCollection."""
    folder.mkdir(parents=True)
    items = awkward_items(900)
    lines = [json.dumps(item) for item in items[:600]]
    lines.insert(100, "{not json")
    lines.insert(333, json.dumps({"type": "Feature", "id": "no-geometry"}))
    lines.insert(400, "")
    lines.insert(500, json.dumps(items[10]))  # read twice in the same part: a duplicate
    (folder / "a.ndjson").write_text("\n".join(lines) + "\n")
    plain = [item for item in items[600:850] if "checksum" not in item["properties"]]  # Arrow has no uint64 here
    table = pa.Table.from_batches(sga.parse_stac_items_to_arrow(plain))
    sga.to_parquet(pa.Table.from_batches(table.to_batches(max_chunksize=40)), folder / "b.parquet")
    features = {"type": "FeatureCollection", "features": items[850:]}
    (folder / "c.json").write_text(json.dumps(features))
    return [folder]


DAY = "2024-02-01T00:00:00Z/2024-02-02T00:00:00Z"
"""A day, read in 4 lanes: 00:00-06:00, 06:00-12:00, 12:00-18:00, 18:00-24:00."""


def day_items(collection: str = "t") -> list[dict]:
    """One every 20 minutes of the day, one at each lane's bound, one whose range spans a bound, and one whose
    ``datetime`` (03:00) lies outside its own range (13:00-14:00): a lane keeps it where its ``datetime`` falls,
    and so does the lane of its start where the API answers it there too."""
    c = collection
    items = [
        make_item(f"{c}-{number:03d}", c, when=f"2024-02-01T{number // 3:02d}:{number % 3 * 20:02d}:00Z")
        for number in range(72)
    ]
    items += [make_item(f"{c}-at-{hour}", c, when=f"2024-02-01T{hour}:00:00Z") for hour in ("06", "12", "18")]
    spanning = make_item(f"{c}-span", c, when="2024-02-01T10:00:00Z")
    spanning["properties"].update(start_datetime="2024-02-01T09:00:00Z", end_datetime="2024-02-01T13:00:00Z")
    irregular = make_item(f"{c}-irregular", c, when="2024-02-01T03:00:00Z")
    irregular["properties"].update(start_datetime="2024-02-01T13:00:00Z", end_datetime="2024-02-01T14:00:00Z")
    items += [spanning, irregular]
    for number, item in enumerate(items):
        item["properties"]["updated"] = f"2024-03-01T{number // 60:02d}:{number % 60:02d}:00Z"
        with_square(item, x=number % 20, y=number % 10, size=0.5)
    return items


def day_collection() -> dict:
    return {
        "type": "Collection",
        "stac_version": "1.0.0",
        "id": "t",
        "description": "one day of items",
        "license": "CC-BY-4.0",
        "extent": {"spatial": {"bbox": [[-180, -90, 180, 90]]}, "temporal": {"interval": [[None, None]]}},
        "links": [],
    }


def write_day(path: Path, collection: str = "t") -> Path:
    """:func:`day_collection` and :func:`day_items` as one NDJSON file at ``path``."""
    documents = [day_collection(), *day_items(collection)]
    path.write_text("\n".join(json.dumps(document) for document in documents) + "\n")
    return path
