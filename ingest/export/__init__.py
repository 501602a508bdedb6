"""Exports of a repository at any ref: NDJSON, one stac-geoparquet file, a static STAC catalog; a PNG
quick-look of one item's arrays.

Every export streams the items table batch by batch (never the whole table in
memory), in the table's order, so the same ref always gives the same output.
"""

from ingest.export._catalog import export_catalog
from ingest.export._common import ExportResult, safe_name
from ingest.export._geoparquet import export_geoparquet, export_schema, read_geoparquet_items
from ingest.export._ndjson import export_ndjson
from ingest.export._preview import PREVIEW_SIZE, Preview, write_preview

FORMATS = ("ndjson", "stac-geoparquet", "catalog")

__all__ = [
    "FORMATS",
    "PREVIEW_SIZE",
    "ExportResult",
    "Preview",
    "export_catalog",
    "export_geoparquet",
    "export_ndjson",
    "export_schema",
    "read_geoparquet_items",
    "safe_name",
    "write_preview",
]
