"""STAC items <-> Arrow rows, validation, reading item sources."""

from ingest.stac._rows import OVERFLOW, arrow_to_items, items_to_arrow, render_datetime
from ingest.stac._validate import check_name, parse_datetime, validate_item

__all__ = [
    "OVERFLOW",
    "arrow_to_items",
    "check_name",
    "items_to_arrow",
    "parse_datetime",
    "render_datetime",
    "validate_item",
]
