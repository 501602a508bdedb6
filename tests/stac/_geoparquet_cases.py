"""Items that test what a stac-geoparquet file becomes: regular ones beside every awkwardness the row path must
hand to the item path or keep exactly (nulls, sparse properties, uneven assets, 3D and antimeridian geometries,
huge and big-integer properties, ranges, timestamps with and without fractions, hostile ids)."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import stac_geoparquet.arrow as sga

INVALID = {"bad/id", "%2e%2e", " padded", "__zarr", "item-bbox-off", "item-range-reversed", "item-lat-95"}
"""The ids of the items the item path refuses."""
BAD_COLLECTION = "item-bad-collection"
"""The id of an item whose collection the item path refuses."""


def _base() -> dict[str, Any]:
    return {
        "type": "Feature",
        "stac_version": "1.0.0",
        "stac_extensions": ["https://stac-extensions.github.io/eo/v1.1.0/schema.json"],
        "collection": "c1",
        "geometry": {
            "type": "Polygon",
            "coordinates": [[[10.0, 10.0], [11.0, 10.0], [11.0, 11.0], [10.0, 11.0], [10.0, 10.0]]],
        },
        "bbox": [10.0, 10.0, 11.0, 11.0],
        "properties": {"datetime": "2024-01-01T10:00:00Z", "eo:cloud_cover": 5.5, "platform": "s2a", "gsd": 10},
        "assets": {"B04": {"href": "s3://a/B04.tif", "type": "image/tiff", "roles": ["data"]}},
        "links": [],
    }


def _antimeridian(item: dict[str, Any]) -> None:
    west = [[170.0, 10.0], [180.0, 10.0], [180.0, 11.0], [170.0, 11.0], [170.0, 10.0]]
    east = [[-180.0, 10.0], [-170.0, 10.0], [-170.0, 11.0], [-180.0, 11.0], [-180.0, 10.0]]
    item["bbox"] = [170.0, 10.0, -170.0, 11.0]
    item["geometry"] = {"type": "MultiPolygon", "coordinates": [[west], [east]]}


_CHANGES: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
    ("item-plain", lambda item: None),
    ("item-fraction", lambda item: item["properties"].update(datetime="2024-01-01T10:00:00.123456Z")),
    ("item-sparse", lambda item: item["properties"].update(extra="x", big=2**62, tags=[], nested={"a": [1, 2]})),
    ("item-titled-asset", lambda item: item["assets"]["B04"].update(title="red")),
    ("item-more-assets", lambda item: item["assets"].update(thumb={"href": "t.png"})),
    ("item-3d-point", lambda item: item.update(geometry={"type": "Point", "coordinates": [10.5, 10.5, 3.0]})),
    ("bad/id", lambda item: None),
    ("%2e%2e", lambda item: None),
    ("ünïcode-id", lambda item: None),
    ("item-antimeridian", _antimeridian),
    ("item-bbox-off", lambda item: item.update(bbox=[0.0, 0.0, 1.0, 1.0])),
    (
        "item-range",
        lambda item: item["properties"].update(
            datetime=None, start_datetime="2024-01-01T00:00:00Z", end_datetime="2024-02-01T00:00:00Z"
        ),
    ),
    (
        "item-range-reversed",
        lambda item: item["properties"].update(
            datetime=None, start_datetime="2024-03-01T00:00:00Z", end_datetime="2024-02-01T00:00:00Z"
        ),
    ),
    (
        "item-created",
        lambda item: item["properties"].update(created="2023-05-05T05:05:05Z", **{"eo:cloud_cover": None}),
    ),
    ("item-huge", lambda item: item["properties"].update(huge="x" * 100_000, nan=math.nan)),
    (
        "item-lat-95",
        lambda item: item.update(
            geometry={"type": "Polygon", "coordinates": [[[10.0, 10.0], [11.0, 10.0], [11.0, 95.0], [10.0, 10.0]]]}
        ),
    ),
    (
        "item-proj-geometry",
        lambda item: item["properties"].update(
            {"proj:geometry": {"type": "Polygon", "coordinates": [[[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 0.0]]]}}
        ),
    ),
    (BAD_COLLECTION, lambda item: item.update(collection="bad/collection")),
    (" padded", lambda item: None),
    ("__zarr", lambda item: None),
    (
        "item-bands",
        lambda item: item["properties"].update(
            {"eo:bands": [{"name": "B04", "center_wavelength": 0.66}, {"name": "B08"}]}
        ),
    ),
    ("item-links", lambda item: item.update(links=[{"href": "http://example.com/x", "rel": "self"}])),
    ("item-no-extensions", lambda item: item.update(stac_extensions=[])),
    ("item-1969", lambda item: item["properties"].update(datetime="1969-07-20T20:17:40Z")),
    ("item-float", lambda item: item["properties"].update(float_int=1.0)),
    ("item-other-collection", lambda item: item.update(collection="c2")),
]


def awkward_items() -> list[dict[str, Any]]:
    """One item per case above (its id the case's name), in order."""
    items = []
    for name, change in _CHANGES:
        item = copy.deepcopy(_base())
        item["id"] = name
        change(item)
        items.append(item)
    return items


def write_geoparquet(items: list[dict[str, Any]], path: Path, *, rows_per_group: int | None = None) -> Path:
    """``items`` as a stac-geoparquet file, as stac-geoparquet writes one."""
    table = pa.Table.from_batches(sga.parse_stac_items_to_arrow(items))
    if rows_per_group is not None:
        table = pa.Table.from_batches(table.to_batches(max_chunksize=rows_per_group))
    sga.to_parquet(table, path)
    return path
