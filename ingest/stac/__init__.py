"""floe's STAC: items <-> Arrow rows, validation, and floe's own vocabulary (the ``floe:arrays`` asset)."""

from ingest.stac._assets import (
    ARRAYS_ASSET,
    ARRAYS_MEDIA_TYPE,
    ArraysAsset,
    arrays_asset,
    has_arrays_asset,
    read_arrays_asset,
    served_arrays_asset,
    with_arrays_asset,
    without_arrays_asset,
)
from ingest.stac._geometry import GEOMETRY_TYPES, TOLERANCE, coordinates_problem, refused_geometries
from ingest.stac._json import loads_json
from ingest.stac._rows import (
    OVERFLOW,
    RESERVED,
    TIMESTAMP,
    arrow_to_items,
    items_to_arrow,
    normalize_type,
    overflow_keys,
    paused_collection,
    render_datetime,
    strip_nulls,
)
from ingest.stac._spatial import hilbert_index, spatial_order
from ingest.stac._text import one_line, shorten, shown
from ingest.stac._validate import check_name, check_timestamp, item_as_dict, parse_datetime, validate_item

__all__ = [
    "ARRAYS_ASSET",
    "ARRAYS_MEDIA_TYPE",
    "GEOMETRY_TYPES",
    "OVERFLOW",
    "RESERVED",
    "TIMESTAMP",
    "TOLERANCE",
    "ArraysAsset",
    "arrays_asset",
    "arrow_to_items",
    "check_name",
    "check_timestamp",
    "coordinates_problem",
    "has_arrays_asset",
    "hilbert_index",
    "item_as_dict",
    "items_to_arrow",
    "loads_json",
    "normalize_type",
    "one_line",
    "overflow_keys",
    "parse_datetime",
    "paused_collection",
    "read_arrays_asset",
    "refused_geometries",
    "render_datetime",
    "served_arrays_asset",
    "shorten",
    "shown",
    "spatial_order",
    "strip_nulls",
    "validate_item",
    "with_arrays_asset",
    "without_arrays_asset",
]
