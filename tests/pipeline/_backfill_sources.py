"""Sources a metadata backfill is tested with: awkward items in NDJSON (with bad lines), stac-geoparquet and a
FeatureCollection."""

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
