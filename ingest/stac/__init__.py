"""floe's STAC: items <-> Arrow rows, validation, and floe's own vocabulary (the ``floe:arrays`` asset)."""

from typing import TYPE_CHECKING

from ingest._lazy import lazy_names

# Each name loads with its module when first used (``ingest._lazy``): a name or a piece of text does not
# bring PyArrow, which the rows' and validation's modules import.
if TYPE_CHECKING:
    from ingest.stac._assets import (
        ARRAYS_ASSET,
        ARRAYS_LAYOUT,
        ARRAYS_MEDIA_TYPE,
        DATETIME,
        ITEM,
        LAYOUT_ATTR,
        SLOT,
        STACKS,
        TILING_ATTR,
        ArraysAsset,
        AssetPixels,
        Piece,
        arrays_asset,
        has_arrays_asset,
        moved_slots,
        read_arrays_asset,
        with_arrays_asset,
        without_arrays_asset,
    )
    from ingest.stac._columns import strip_nulls
    from ingest.stac._geometry import GEOMETRY_TYPES, TOLERANCE, coordinates_problem, refused_geometries
    from ingest.stac._geoparquet import geoparquet_items, row_group_batches
    from ingest.stac._geoparquet_rows import MappedRows, geoparquet_rows
    from ingest.stac._json import loads_json, read_json_noting_parser
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
    )
    from ingest.stac._served import (
        ICECHUNK_MEDIA_TYPE,
        STACK_ASSET,
        STORE_ASSET,
        ServedArrays,
        s3_storage_scheme,
        served_arrays_asset,
        served_collection,
        stack_assets,
        without_served_assets,
    )
    from ingest.stac._spatial import HILBERT, clustered, hilbert_index, spatial_order
    from ingest.stac._text import one_line, shorten, shown
    from ingest.stac._validate import (
        accepted_items,
        certainly_valid,
        check_name,
        check_timestamp,
        item_as_dict,
        parse_datetime,
        plainly_valid,
        validate_item,
    )

_HOMES = {
    **dict.fromkeys(
        (
            "ARRAYS_ASSET",
            "ARRAYS_LAYOUT",
            "ARRAYS_MEDIA_TYPE",
            "DATETIME",
            "ITEM",
            "LAYOUT_ATTR",
            "SLOT",
            "STACKS",
            "TILING_ATTR",
            "ArraysAsset",
            "AssetPixels",
            "Piece",
            "arrays_asset",
            "has_arrays_asset",
            "moved_slots",
            "read_arrays_asset",
            "with_arrays_asset",
            "without_arrays_asset",
        ),
        "ingest.stac._assets",
    ),
    **dict.fromkeys(("strip_nulls",), "ingest.stac._columns"),
    **dict.fromkeys(
        ("GEOMETRY_TYPES", "TOLERANCE", "coordinates_problem", "refused_geometries"), "ingest.stac._geometry"
    ),
    **dict.fromkeys(("geoparquet_items", "row_group_batches"), "ingest.stac._geoparquet"),
    **dict.fromkeys(("MappedRows", "geoparquet_rows"), "ingest.stac._geoparquet_rows"),
    **dict.fromkeys(("loads_json", "read_json_noting_parser"), "ingest.stac._json"),
    **dict.fromkeys(
        (
            "OVERFLOW",
            "RESERVED",
            "TIMESTAMP",
            "arrow_to_items",
            "items_to_arrow",
            "normalize_type",
            "overflow_keys",
            "paused_collection",
            "render_datetime",
        ),
        "ingest.stac._rows",
    ),
    **dict.fromkeys(
        (
            "ICECHUNK_MEDIA_TYPE",
            "STACK_ASSET",
            "STORE_ASSET",
            "STORE_ASSET",
            "ServedArrays",
            "s3_storage_scheme",
            "served_arrays_asset",
            "served_collection",
            "stack_assets",
            "without_served_assets",
        ),
        "ingest.stac._served",
    ),
    **dict.fromkeys(("HILBERT", "clustered", "hilbert_index", "spatial_order"), "ingest.stac._spatial"),
    **dict.fromkeys(("one_line", "shorten", "shown"), "ingest.stac._text"),
    **dict.fromkeys(
        (
            "accepted_items",
            "certainly_valid",
            "check_name",
            "check_timestamp",
            "item_as_dict",
            "parse_datetime",
            "plainly_valid",
            "validate_item",
        ),
        "ingest.stac._validate",
    ),
}

__all__ = [
    "ARRAYS_ASSET",
    "ARRAYS_LAYOUT",
    "ARRAYS_MEDIA_TYPE",
    "DATETIME",
    "GEOMETRY_TYPES",
    "HILBERT",
    "ICECHUNK_MEDIA_TYPE",
    "ITEM",
    "LAYOUT_ATTR",
    "OVERFLOW",
    "RESERVED",
    "SLOT",
    "STACKS",
    "STACK_ASSET",
    "STORE_ASSET",
    "TILING_ATTR",
    "TIMESTAMP",
    "TOLERANCE",
    "ArraysAsset",
    "AssetPixels",
    "MappedRows",
    "Piece",
    "ServedArrays",
    "accepted_items",
    "arrays_asset",
    "arrow_to_items",
    "certainly_valid",
    "check_name",
    "check_timestamp",
    "clustered",
    "coordinates_problem",
    "geoparquet_items",
    "geoparquet_rows",
    "has_arrays_asset",
    "hilbert_index",
    "item_as_dict",
    "items_to_arrow",
    "loads_json",
    "moved_slots",
    "normalize_type",
    "one_line",
    "overflow_keys",
    "parse_datetime",
    "paused_collection",
    "plainly_valid",
    "read_arrays_asset",
    "read_json_noting_parser",
    "refused_geometries",
    "render_datetime",
    "row_group_batches",
    "s3_storage_scheme",
    "served_arrays_asset",
    "served_collection",
    "shorten",
    "shown",
    "spatial_order",
    "stack_assets",
    "strip_nulls",
    "validate_item",
    "with_arrays_asset",
    "without_arrays_asset",
    "without_served_assets",
]

__getattr__ = lazy_names(__name__, globals(), _HOMES)
