"""Rasters of STAC items, copied from GeoTIFF/COG granules into the Icechunk session's Zarr groups."""

from ingest.rasters._copy import GranuleArrays, InvalidRaster, read_granule, write_granule

__all__ = ["GranuleArrays", "InvalidRaster", "read_granule", "write_granule"]
