"""Rasters of STAC items, copied from GeoTIFF/COG granules into the Icechunk session's Zarr groups, or referenced."""

from ingest.rasters._copy import GranuleArrays, InvalidRaster, read_assets, read_granule, write_granule
from ingest.rasters._stack import (
    GranulePlan,
    Grid,
    Kind,
    Lattice,
    Stack,
    name_arrays,
    plan_granule,
    stage_nodes,
    write_slices,
)
from ingest.rasters._virtual import (
    NotVirtualizable,
    ReferencePlan,
    VirtualGranuleArrays,
    VirtualOutcome,
    plan_references,
    write_references,
    write_virtual_granule,
    write_virtual_or_copy,
)

__all__ = [
    "GranuleArrays",
    "GranulePlan",
    "Grid",
    "InvalidRaster",
    "Kind",
    "Lattice",
    "NotVirtualizable",
    "ReferencePlan",
    "Stack",
    "VirtualGranuleArrays",
    "VirtualOutcome",
    "name_arrays",
    "plan_granule",
    "plan_references",
    "read_assets",
    "read_granule",
    "stage_nodes",
    "write_granule",
    "write_references",
    "write_slices",
    "write_virtual_granule",
    "write_virtual_or_copy",
]
