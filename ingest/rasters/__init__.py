"""Rasters of STAC items, copied from GeoTIFF/COG granules into the Icechunk session's Zarr groups, or referenced."""

from ingest.rasters._copy import GranuleArrays, InvalidRaster, read_assets, read_granule, write_granule
from ingest.rasters._virtual import (
    NotVirtualizable,
    VirtualGranuleArrays,
    VirtualOutcome,
    write_virtual_granule,
    write_virtual_or_copy,
)

__all__ = [
    "GranuleArrays",
    "InvalidRaster",
    "NotVirtualizable",
    "VirtualGranuleArrays",
    "VirtualOutcome",
    "read_assets",
    "read_granule",
    "write_granule",
    "write_virtual_granule",
    "write_virtual_or_copy",
]
