"""Copy a COG's compressed tiles into a fixed stack as they are: no decode and re-encode of the pixels.

A tile copy is planned as a reference is (:func:`ingest.rasters.plan_references` with ``copy=True``);
:func:`read_tiles` reads the tiles (obstore range reads, merged) and decodes each once in memory, and
:func:`write_tiles` stores them as the chunks of the granule's slot. A file virtual-tiff cannot express is copied
the decoded way by the caller. What a tile copy stores, and why: docs/pixels.md#fixed-stacks-and-tile-copies.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import obstore
import zarr
from zarr.core.buffer import default_buffer_prototype
from zarr.storage import MemoryStore

from ingest._compat import manifest_entries
from ingest.errors import InvalidRaster
from ingest.rasters._opening import detail
from ingest.rasters._slices import write_slot_coordinates
from ingest.rasters._source import CheckedAsset
from ingest.rasters._virtual import ReferencePlan

if TYPE_CHECKING:
    from zarr.abc.store import Store

Tile = tuple[tuple[int, int, int], Any]
"""((band, row, column) of the tile in the file's tile grid, its bytes as stored in the file)."""


@dataclass
class TileCopy:
    """A granule placed in fixed stacks with each asset's tiles read: what :func:`write_tiles` stores."""

    references: ReferencePlan
    tiles: dict[str, list[Tile]]

    @property
    def pixel_bytes(self) -> int:
        """The uncompressed bytes of the pixels copied."""
        return self.references.bytes_referenced

    @property
    def stored_bytes(self) -> int:
        """The bytes of the tiles as stored (compressed)."""
        return sum(len(body) for tiles in self.tiles.values() for _index, body in tiles)


def read_tiles(references: ReferencePlan) -> TileCopy:
    """Read every tile of each asset of ``references`` and check that each decodes.

    Raises ``InvalidRaster`` naming the file when its bytes cannot be read
    or a tile does not decode (a corrupt file).
    """
    return TileCopy(references, {key: _read_source(source) for key, source in references.sources.items()})


def _read_source(source: CheckedAsset) -> list[Tile]:
    paths, offsets, lengths = manifest_entries(source.manifest.manifest)
    present = np.argwhere(lengths > 0)
    if not len(present):
        return []  # every tile sparse: the slice reads as the fill value, as GDAL reads the file
    assert source.registry is not None, "plan_references(copy=True) keeps the registry"
    store, path = source.registry.resolve(str(paths[tuple(present[0])]))
    starts = offsets[lengths > 0].astype(np.uint64)
    ends = starts + lengths[lengths > 0].astype(np.uint64)
    try:
        bodies = obstore.get_ranges(store, path, starts=starts.tolist(), ends=ends.tolist())
    except Exception as exc:
        raise InvalidRaster(
            f"granule {source.path} cannot be read: {type(exc).__name__}: {detail(exc)}", path=source.path
        ) from exc
    tiles: list[Tile] = [
        ((int(band), int(row), int(column)), body) for (band, row, column), body in zip(present, bodies, strict=True)
    ]
    _decode_all(source, tiles)
    return tiles


def _decode_all(source: CheckedAsset, tiles: list[Tile]) -> None:
    """Decode every tile through the array's codecs in memory: a corrupt one fails here, not when read later."""
    metadata = source.manifest.metadata
    prototype = default_buffer_prototype()
    contents = dict(metadata.to_buffer_dict(prototype))
    for (band, row, column), body in tiles:
        contents[metadata.encode_chunk_key((band, row, column))] = prototype.buffer.from_bytes(body)
    try:
        zarr.open_array(MemoryStore(contents), mode="r")[...]
    except Exception as exc:
        raise InvalidRaster(
            f"granule {source.path} cannot be read: a tile does not decode ({type(exc).__name__}: {detail(exc)})",
            path=source.path,
        ) from exc


async def write_tiles(store: Store, copy: TileCopy, *, item_id: str, datetime_us: int) -> int:
    """Store each asset's tiles as the chunks of its slot (slots and names assigned) and the slot coordinates.

    Returns the number of chunks written.
    """
    plan = copy.references.plan
    prototype = default_buffer_prototype()
    writes: list[Any] = [write_slot_coordinates(store, plan, item_id=item_id, datetime_us=datetime_us)]
    for asset in plan.assets:
        (piece,) = asset.pieces
        prefix = f"{piece.stack}/{piece.array}/c/{piece.slot}"
        for (band, row, column), body in copy.tiles[asset.key]:
            writes.append(store.set(f"{prefix}/{band}/{row}/{column}", prototype.buffer.from_bytes(body)))
    await asyncio.gather(*writes)
    return len(writes) - 1
