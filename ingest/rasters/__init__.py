"""Rasters of STAC items as slices of shared arrays (stacks): GeoTIFF/COG granules copied, or referenced in place.

``read_granule``/``read_assets`` read a granule's files; ``plan_granule``
places its pixels in stacks (``_stack.py``), ``stage_nodes`` creates the
stacks and arrays that are missing and ``write_slices`` writes the slices
(``_slices.py``); ``plan_references``/``write_references`` do the same with
references to the files (``_virtual.py``), and ``read_tiles``/``write_tiles`` copy a file's compressed
tiles into the same fixed stacks without decoding them (``_tiles.py``).
``ingest.pipeline.stage_arrays``, ``stage_references`` and ``stage_tiles``
put these steps together through a writer.
"""

from ingest.rasters._copy import InvalidRaster, read_assets, read_granule
from ingest.rasters._slices import StoredArray, name_arrays, stage_nodes, write_slices
from ingest.rasters._stack import (
    GranulePlan,
    Grid,
    Kind,
    Lattice,
    Stack,
    array_name,
    plan_granule,
)
from ingest.rasters._tiles import TileCopy, read_tiles, write_tiles
from ingest.rasters._virtual import (
    NotVirtualizable,
    ReferencePlan,
    container_prefixes,
    plan_references,
    write_references,
)

__all__ = [
    "GranulePlan",
    "Grid",
    "InvalidRaster",
    "Kind",
    "Lattice",
    "NotVirtualizable",
    "ReferencePlan",
    "Stack",
    "StoredArray",
    "TileCopy",
    "array_name",
    "container_prefixes",
    "name_arrays",
    "plan_granule",
    "plan_references",
    "read_assets",
    "read_granule",
    "read_tiles",
    "stage_nodes",
    "write_references",
    "write_slices",
    "write_tiles",
]
