"""Reference a granule's COGs from fixed stacks instead of copying their pixels (``floe ingest --virtual``).

:func:`plan_references` checks everything before anything is written (the layout, a container covering the file,
the first tile decoded through the references equal to GDAL's reading) and :func:`write_references` stores the
chunks as virtual references at the granule's slot; a COG that virtual-tiff cannot express raises
``NotVirtualizable`` and the caller copies it. The design: docs/pixels.md#virtual-references; what a reference
checks on read: docs/remote-sources.md#rasters-that-live-elsewhere-remote-assets-and-virtual.
"""

from __future__ import annotations

import functools
import json
import logging
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import rasterio
import rasterio.crs
import rasterio.errors
from zarr.core.metadata.v3 import ArrayV3Metadata

from ingest._compat import manifest_entries
from ingest.errors import NotVirtualizable
from ingest.rasters._copy import (
    GRANULE_VARIABLE,
    GRID_MAPPING,
    check_asset_key,
)
from ingest.rasters._slices import write_slot_coordinates
from ingest.rasters._source import CheckedAsset, plan_source
from ingest.rasters._stack import (
    AssetPlan,
    GranulePlan,
    Grid,
    Kind,
    Stack,
    fixed_stack_path,
    kind_of,
    stack_digest,
)
from ingest.rasters._tiff import metadata_document
from ingest.remote import Stores
from ingest.stac import Piece, check_name

if TYPE_CHECKING:
    from zarr.abc.store import Store

__all__ = [
    "NotVirtualizable",
    "ReferenceKind",
    "ReferencePlan",
    "container_prefixes",
    "plan_references",
    "write_references",
]

log = logging.getLogger(__name__)

# virtual-tiff warns each time it builds an imagecodecs codec (LZW, zstd, predictors) that other Zarr readers may
# lack it; floe's readers have it (a dependency), and the warning would repeat for every granule.
warnings.filterwarnings("ignore", message="Imagecodecs codecs are not in the Zarr version 3 specification")

# -- references into stacks (array layout 2) ------------------------------------------------------


@dataclass(frozen=True)
class ReferenceKind(Kind):
    """A kind whose chunks are a source file's own tiles: the tiling and the codecs are part of it.

    Two granules on one grid whose files are tiled or compressed differently
    are two kinds (two arrays of the stack): a reference is a whole tile of a
    file, decoded by the array's codecs.
    """

    document: str = ""
    """The JSON of virtual-tiff's array metadata for the file (its chunking and codec chain)."""

    @functools.cached_property
    def signature(self) -> str:
        decoding = {key: json.loads(self.document).get(key) for key in ("data_type", "chunk_grid", "codecs")}
        return stack_digest(self.dtype, self.bands, self.attributes, json.dumps(decoding, sort_keys=True))

    def metadata(self, stack: Stack, *, capacity: int, chunk: int) -> ArrayV3Metadata:
        copied = Kind.metadata(self, stack, capacity=capacity, chunk=chunk).to_dict()
        document = json.loads(self.document)
        _bands_chunk, tile_height, tile_width = document["chunk_grid"]["configuration"]["chunk_shape"]
        document.update(
            shape=copied["shape"],
            chunk_grid={"name": "regular", "configuration": {"chunk_shape": [1, 1, tile_height, tile_width]}},
            chunk_key_encoding=copied["chunk_key_encoding"],
            attributes=copied["attributes"],
            dimension_names=copied["dimension_names"],
        )
        return ArrayV3Metadata.from_dict(document)


@dataclass
class ReferencePlan:
    """A granule placed in fixed stacks, with the references to write for each asset."""

    plan: GranulePlan
    sources: dict[str, CheckedAsset]

    @property
    def bytes_referenced(self) -> int:
        return sum(int(source.manifest.size) * source.manifest.dtype.itemsize for source in self.sources.values())


def container_prefixes(store: Store) -> tuple[str, ...]:
    """The URL prefixes of the virtual chunk containers of the repository ``store`` (an Icechunk store) writes."""
    config = getattr(getattr(store, "session", None), "config", None)
    return tuple((getattr(config, "virtual_chunk_containers", None) or {}).keys())


def plan_references(
    store: Store | None,
    collection: str,
    assets: Mapping[str, str | Path],
    *,
    stores: Stores | None = None,
    gdal_env: Mapping[str, str] | None = None,
    prefixes: tuple[str, ...] | None = None,
    copy: bool = False,
) -> ReferencePlan:
    """Check that every asset can be referenced from ``store`` and place each in its grid's fixed stack.

    Assets are local COGs or ``s3://`` / ``http(s)://`` ones, reached through
    ``stores`` (obstore: HEAD and tile index) and ``gdal_env`` (GDAL: the
    header and the probe tile). ``prefixes`` are the repository's container
    prefixes (default: those of ``store``'s session); given, ``store`` is not
    used, so plans can be made on other threads. With ``copy`` the file's
    tiles are to be copied (``ingest.rasters.read_tiles``), so no container
    is needed. Writes nothing. Raises ``NotVirtualizable`` (copy the granule
    by decoding it instead), ``InvalidRaster`` (copying would fail too) or
    ``ValueError`` (no assets, or a ``collection`` that is not a safe path
    segment).
    """
    check_name(collection, "collection")
    if not assets:
        raise ValueError(f"a granule of {collection} has no assets to reference")
    for key in assets:
        check_asset_key(key)
    if copy:
        prefixes = None
    elif prefixes is None:
        prefixes = container_prefixes(store) if store is not None else ()
    sources = {key: plan_source(key, path, prefixes, stores, gdal_env or {}) for key, path in assets.items()}
    stacks: dict[str, Stack] = {}
    kinds: dict[str, list[Kind]] = {}
    planned = []
    for key, source in sources.items():
        grid = _grid_of(source)
        pixels = source.dataset[GRANULE_VARIABLE]
        kind = ReferenceKind(
            key,
            str(pixels.dtype),
            int(pixels.shape[0]),
            kind_of(key, source.dataset).attributes,
            document=metadata_document(source.manifest.metadata),
        )
        stack = Stack(fixed_stack_path(collection, grid), grid)
        stacks.setdefault(stack.path, stack)
        if kind not in kinds.setdefault(stack.path, []):
            kinds[stack.path].append(kind)
        piece = Piece(stack.path, key, (0, 0, grid.height, grid.width), (0, 0))
        planned.append(AssetPlan(key, kind, grid, [piece], np.empty((0, 0, 0), dtype=pixels.dtype)))
    return ReferencePlan(GranulePlan(planned, stacks, kinds), sources)


def _grid_of(source: CheckedAsset) -> Grid:
    """The grid of a referenced asset, from the georeferencing computed for it (no pixel is read)."""
    reference = source.dataset.coords[GRID_MAPPING].attrs
    c, a, b, f, d, e = (float(value) for value in str(reference["GeoTransform"]).split())
    _bands, height, width = source.manifest.shape
    crs = rasterio.crs.CRS.from_wkt(reference["crs_wkt"])
    return Grid(crs.to_wkt(), crs.to_string(), (a, b, c, d, e, f), int(height), int(width))


async def write_references(store: Store, references: ReferencePlan, *, item_id: str, datetime_us: int) -> int:
    """Write the references of every asset at its slot (slots and names assigned) and the slot coordinates.

    Returns the number of references written. Raises ``NotVirtualizable``
    when Icechunk refuses them (no virtual chunk container covers a file).
    A failure while writing is cleared by the caller
    (``ingest.pipeline._arrays.stage_references``), so a granule is
    referenced whole or not at all.
    """
    plan = references.plan
    await write_slot_coordinates(store, plan, item_id=item_id, datetime_us=datetime_us)
    # Icechunk refuses to read a referenced local file modified after this moment (it keeps whole seconds: a
    # margin); a remote object's references carry its ETag instead.
    last_updated_at = datetime.now(UTC) + timedelta(seconds=1)
    count = 0
    for asset in plan.assets:
        (piece,) = asset.pieces
        source = references.sources[asset.key]
        entries = source.manifest.manifest
        paths, offsets, lengths = manifest_entries(entries)
        failed = await store.set_virtual_refs_arr_async(  # type: ignore[attr-defined]
            array_path=f"/{piece.stack}/{piece.array}",
            chunk_grid_shape=(1, *entries.shape_chunk_grid),
            locations=paths.flatten().tolist(),
            offsets=offsets.flatten(),
            lengths=lengths.flatten(),
            arr_offset=(piece.slot, 0, 0, 0),
            validate_containers=True,
            checksum=source.checksum if source.checksum is not None else last_updated_at,
        )
        if failed:
            raise NotVirtualizable(
                f"granule {source.path}: Icechunk refused {len(failed)} virtual references to {source.url} "
                "(no virtual chunk container covers it)",
                path=source.path,
            )
        count += int(np.count_nonzero(lengths))
    return count
