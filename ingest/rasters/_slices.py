"""Writing stacks: the zarr nodes of a stack group and its arrays, and a granule's slices in them.

Nodes and chunks are written as raw zarr v3 documents, gathered so Icechunk overlaps them (zarr's group and array
API costs milliseconds a node, and an array's document is known without reading it). :func:`stage_nodes` creates
what a granule needs, committed alone; :func:`write_slices` writes its pixels at its slots, staged with its row.
The layout is ``_stack.py``'s; why two commits: docs/design.md §4 (shared parents) and §5 (rasters into stacks).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr
from numcodecs import VLenUTF8, Zstd
from zarr.codecs import BytesCodec, ZstdCodec
from zarr.core.array import AsyncArray
from zarr.core.buffer import Buffer, default_buffer_prototype
from zarr.core.chunk_key_encodings import DefaultChunkKeyEncoding
from zarr.core.common import ZARR_JSON
from zarr.core.group import GroupMetadata
from zarr.core.metadata.v3 import ArrayV3Metadata
from zarr.core.sync import sync
from zarr.dtype import parse_data_type
from zarr.storage import StorePath

from ingest.errors import UnsupportedLayout
from ingest.rasters._copy import GRID_MAPPING
from ingest.rasters._stack import CODECS, AssetPlan, GranulePlan, Grid, Kind, Stack, array_name
from ingest.stac import DATETIME, ITEM, SLOT, Piece

if TYPE_CHECKING:
    from zarr.abc.store import Store

_DATETIME_UNITS = "microseconds since 1970-01-01T00:00:00Z"


# -- creating stacks ---------------------------------------------------------------------------------


def stack_documents(stack: Stack, *, capacity: int) -> tuple[dict[str, bytes], dict[str, tuple[Any, np.ndarray]]]:
    """The zarr documents of a new stack group (group and coordinates) and the coordinate values to write.

    Returns ``(documents, values)``: store key -> zarr.json bytes, and array
    path -> (metadata, values) for the coordinates that hold data (``x``,
    ``y``). The ``item`` and ``datetime`` coordinates start empty.
    """
    prototype = default_buffer_prototype()
    group = GroupMetadata(zarr_format=3, attributes={"floe:stack": {"crs": stack.grid.crs}})
    documents = {f"{stack.path}/{ZARR_JSON}": group.to_buffer_dict(prototype)[ZARR_JSON].to_bytes()}
    x, y = stack.grid.coordinates()
    arrays: dict[str, tuple[ArrayV3Metadata, np.ndarray]] = {
        "x": (_coordinate_metadata(x, "x", {"axis": "X"}), x),
        "y": (_coordinate_metadata(y, "y", {"axis": "Y"}), y),
    }
    spatial_ref = {
        "crs_wkt": stack.grid.crs_wkt,
        "spatial_ref": stack.grid.crs_wkt,
        "GeoTransform": stack.grid.geotransform,
    }
    arrays[GRID_MAPPING] = (_scalar_metadata(spatial_ref), np.array(0, dtype="int64"))
    item = _ITEM_META.update_shape((capacity,)).update_attributes(
        {"long_name": "STAC item id of the slot ('' for a free slot)"}
    )
    when = _DATETIME_META.update_shape((capacity,)).update_attributes(
        {"units": _DATETIME_UNITS, "calendar": "proleptic_gregorian", "standard_name": "time"}
    )
    for path, meta in ((ITEM, item), (DATETIME, when)):
        documents[f"{stack.path}/{path}/{ZARR_JSON}"] = meta.to_buffer_dict(prototype)[ZARR_JSON].to_bytes()
    values = {}
    for name, (meta, data) in arrays.items():
        documents[f"{stack.path}/{name}/{ZARR_JSON}"] = meta.to_buffer_dict(prototype)[ZARR_JSON].to_bytes()
        values[f"{stack.path}/{name}"] = (meta, data)
    return documents, values


def _coordinate_metadata(values: np.ndarray, name: str, attrs: dict[str, Any]) -> ArrayV3Metadata:
    return ArrayV3Metadata(
        shape=values.shape,
        data_type=parse_data_type(values.dtype, zarr_format=3),
        chunk_grid={"name": "regular", "configuration": {"chunk_shape": values.shape}},
        chunk_key_encoding=DefaultChunkKeyEncoding(separator="/"),
        fill_value=np.nan,
        codecs=CODECS,
        attributes=attrs,
        dimension_names=[name],
        storage_transformers=None,
    )


def _scalar_metadata(attrs: dict[str, Any]) -> ArrayV3Metadata:
    return ArrayV3Metadata(
        shape=(),
        data_type=parse_data_type(np.dtype("int64"), zarr_format=3),
        chunk_grid={"name": "regular", "configuration": {"chunk_shape": ()}},
        chunk_key_encoding=DefaultChunkKeyEncoding(separator="/"),
        fill_value=0,
        codecs=CODECS,
        attributes=attrs,
        dimension_names=None,
        storage_transformers=None,
    )


async def create_stack(store: Store, stack: Stack, *, capacity: int) -> None:
    """Write a new stack group with its coordinates (no pixel array yet) into ``store``."""
    documents, values = stack_documents(stack, capacity=capacity)
    prototype = default_buffer_prototype()
    await asyncio.gather(*(store.set(key, prototype.buffer.from_bytes(body)) for key, body in documents.items()))
    await asyncio.gather(
        *(
            AsyncArray(metadata=meta, store_path=StorePath(store, path)).setitem(..., data)
            for path, (meta, data) in values.items()
        )
    )


async def create_array(store: Store, stack: Stack, name: str, kind: Kind, *, capacity: int, chunk: int) -> None:
    """Write the (empty) array ``name`` of ``kind`` into an existing stack group."""
    prototype = default_buffer_prototype()
    document = kind.metadata(stack, capacity=capacity, chunk=chunk).to_buffer_dict(prototype)[ZARR_JSON]
    await store.set(f"{stack.path}/{name}/{ZARR_JSON}", document)


# -- writing slices ------------------------------------------------------------------------------


async def write_slices(store: Store, plan: GranulePlan, *, item_id: str, datetime_us: int, chunk: int) -> int:
    """Write every piece of ``plan`` (slots and array names assigned) and its slots' coordinates.

    Only the chunks a piece overlaps are written, and of those only the ones
    holding something besides the fill value; each is written whole, encoded
    here as the array's codecs would and stored directly. (zarr's ``setitem``
    compared every chunk with a chunk of the fill value it allocated, again,
    and handed each encode to a thread: a local tiled copy took 0.76x the
    time without it, docs/benchmarks-history.md.) Returns the number of pixel chunks written.
    """
    writes: list[Any] = [write_slot_coordinates(store, plan, item_id=item_id, datetime_us=datetime_us)]
    prototype = default_buffer_prototype()
    chunks = 0
    for asset in plan.assets:
        for piece in asset.pieces:
            stack = plan.stacks[piece.stack]
            metadata = asset.kind.metadata(stack, capacity=piece.slot + 1, chunk=chunk)
            codec = _zstd(metadata, "bytes")
            little = asset.pixels.dtype.newbyteorder("<")
            # An array made before `arrays.chunk` changed keeps its chunks: a block of another size under its
            # keys would be read back as other pixels.
            new = (min(chunk, stack.grid.height), min(chunk, stack.grid.width))
            shape = plan.chunks.get((piece.stack, piece.array), new)
            for (band, row, column), block in _piece_chunks(asset, piece, stack.grid, shape):
                key = metadata.encode_chunk_key((piece.slot, band, row, column))
                body = codec.encode(np.ascontiguousarray(block, dtype=little))
                writes.append(store.set(f"{piece.stack}/{piece.array}/{key}", prototype.buffer.from_bytes(body)))
                chunks += 1
    await asyncio.gather(*writes)
    return chunks


async def write_slot_coordinates(store: Store, plan: GranulePlan, *, item_id: str, datetime_us: int) -> None:
    """Write the ``item`` and ``datetime`` coordinates of every slot ``plan`` took.

    Each is a one-value chunk, encoded here and stored directly: zarr's
    ``setitem`` took about 4 ms a granule for the two (its codec pipeline
    hands each encode to a thread), more than the rest of a virtual granule.
    """
    item, when = slot_coordinate_chunks(item_id, datetime_us)
    writes = []
    slots = sorted({(piece.stack, piece.slot) for asset in plan.assets for piece in asset.pieces})
    for stack_path, slot in slots:
        if slot < 0:
            raise ValueError(f"granule {item_id}: no slot assigned in stack {stack_path}")
        key = _ITEM_META.encode_chunk_key((slot,))
        writes.append(store.set(f"{stack_path}/{ITEM}/{key}", item))
        writes.append(store.set(f"{stack_path}/{DATETIME}/{key}", when))
    await asyncio.gather(*writes)


def slot_coordinate_chunks(item_id: str, datetime_us: int) -> tuple[Buffer, Buffer]:
    """The stored chunks of one slot's ``item`` and ``datetime``, encoded as their arrays' codecs do: the
    id by numcodecs' VLenUTF8 (zarr's ``vlen-utf8``) then zstd, the time as little-endian int64 then zstd."""
    prototype = default_buffer_prototype()
    item = _ITEM_ZSTD.encode(_VLEN_UTF8.encode(np.array([item_id], dtype=object)))
    when = _DATETIME_ZSTD.encode(np.array([datetime_us], dtype="<i8").tobytes())
    return prototype.buffer.from_bytes(bytes(item)), prototype.buffer.from_bytes(bytes(when))


def _piece_chunks(
    asset: AssetPlan, piece: Piece, grid: Grid, shape: tuple[int, int]
) -> list[tuple[tuple[int, int, int], np.ndarray]]:
    """Each chunk (``shape``: height, width) a piece overlaps, as its (band, row, column) in the chunk grid and
    the whole chunk's pixels.

    A chunk is the fill value where the piece does not cover it (past the
    grid's edge too, as zarr pads an edge chunk); a chunk that is the fill
    value everywhere is left out.
    """
    row, column, height, width = piece.window
    at_row, at_column = piece.at
    fill = asset.kind.fill_value
    chunk_height, chunk_width = shape
    out = []
    for chunk_row in range(row // chunk_height, (row + height - 1) // chunk_height + 1):
        for chunk_column in range(column // chunk_width, (column + width - 1) // chunk_width + 1):
            top, left = chunk_row * chunk_height, chunk_column * chunk_width
            bottom, right = min(top + chunk_height, grid.height), min(left + chunk_width, grid.width)
            r0, c0 = max(row, top), max(column, left)
            r1, c1 = min(row + height, bottom), min(column + width, right)
            source = asset.pixels[
                :, at_row + r0 - row : at_row + r1 - row, at_column + c0 - column : at_column + c1 - column
            ]
            for band in range(asset.kind.bands):
                block = np.full((chunk_height, chunk_width), fill, dtype=asset.pixels.dtype)
                block[r0 - top : r1 - top, c0 - left : c1 - left] = source[band]
                if _all_fill(block, fill):
                    continue
                out.append(((band, chunk_row, chunk_column), block))
    return out


def _all_fill(block: np.ndarray, fill: Any) -> bool:
    if isinstance(fill, float) and math.isnan(fill):
        return bool(np.isnan(block).all())
    return bool((block == fill).all())


_ITEM_META = ArrayV3Metadata(
    shape=(1 << 62,),
    data_type=parse_data_type(str, zarr_format=3),
    chunk_grid={"name": "regular", "configuration": {"chunk_shape": (1,)}},
    chunk_key_encoding=DefaultChunkKeyEncoding(separator="/"),
    fill_value="",
    codecs=({"name": "vlen-utf8"}, ZstdCodec(level=0, checksum=False)),
    attributes={},
    dimension_names=[SLOT],
    storage_transformers=None,
)
_DATETIME_META = ArrayV3Metadata(
    shape=(1 << 62,),
    data_type=parse_data_type(np.dtype("int64"), zarr_format=3),
    chunk_grid={"name": "regular", "configuration": {"chunk_shape": (1,)}},
    chunk_key_encoding=DefaultChunkKeyEncoding(separator="/"),
    fill_value=0,
    codecs=CODECS,
    attributes={},
    dimension_names=[SLOT],
    storage_transformers=None,
)


def _zstd(metadata: ArrayV3Metadata, first: str) -> Zstd:
    """numcodecs' Zstd as the last codec of ``metadata`` configures it, after a codec named ``first``."""
    names = [codec.to_dict()["name"] for codec in metadata.codecs]
    codec = metadata.codecs[-1]
    head = metadata.codecs[0]
    endian = str(head.endian) if isinstance(head, BytesCodec) and head.endian is not None else "little"
    if names != [first, "zstd"] or not isinstance(codec, ZstdCodec) or endian != "little":
        raise AssertionError(f"slot coordinates are encoded by hand for [{first}, zstd], not {names}")
    return Zstd(level=codec.level, checksum=codec.checksum)


_VLEN_UTF8 = VLenUTF8()
_ITEM_ZSTD = _zstd(_ITEM_META, "vlen-utf8")
_DATETIME_ZSTD = _zstd(_DATETIME_META, "bytes")


# -- the nodes a plan needs ------------------------------------------------------------------------


def _exists(store: Store, path: str) -> bool:
    return bool(sync(store.exists(f"{path}/{ZARR_JSON}")))


@dataclass(frozen=True)
class StoredArray:
    """What a writer needs to know of a pixel array that exists in a stack."""

    signature: str
    """Its kind's signature (``floe:kind``)."""
    size: tuple[int, int]
    """(height, width) of each slice: the stack's grid."""
    chunk: tuple[int, int]
    """(height, width) of its chunks."""


def _kinds_in(store: Store, stack: str) -> dict[str, StoredArray]:
    """Array name -> what is known of it, for the pixel arrays of an existing stack."""
    group = zarr.open_group(store, path=stack, mode="r")
    return {
        name: StoredArray(
            str(array.attrs["floe:kind"]),
            (int(array.shape[-2]), int(array.shape[-1])),
            (int(array.chunks[-2]), int(array.chunks[-1])),
        )
        for name, array in group.arrays()
        if "floe:kind" in array.attrs
    }


def name_arrays(
    store: Store, plan: GranulePlan, known: dict[str, dict[str, StoredArray]] | None = None
) -> list[tuple[Stack, str, Kind]]:
    """Give each piece of ``plan`` its array's name in its stack; return the arrays that do not exist yet.

    A missing stack counts as holding no array (every kind is then missing).
    ``known`` (stack path -> array name -> what is known of it) keeps what was
    read for the next plans of one writer: a stack's arrays are only ever
    added, so a stack whose every wanted name is known is not read again
    (listing a stack's arrays was a third of a remote copy's writing time);
    one with a name not known is. An array that exists lends ``plan`` its
    chunk shape (``plan.chunks``).

    Raises:
        UnsupportedLayout: an existing array's slices are not the size of the
            stack's grid as the plan sees it: the repository's stacks were cut
            with another ``arrays.tile`` (writing would misplace every pixel).
    """
    missing: list[tuple[Stack, str, Kind]] = []
    # By asset key and signature: two assets of one kind (same dtype, bands, attributes) are two arrays.
    names: dict[tuple[str, str, str], str] = {}
    for path, kinds in plan.kinds.items():
        cached = known.get(path) if known is not None else None
        existing = _signatures(cached) if cached is not None else {}
        if cached is None or any(array_name(kind, existing) not in cached for kind in kinds):
            cached = _kinds_in(store, path) if _exists(store, path) else {}
            existing = _signatures(cached)
            if known is not None:
                known[path] = cached
        for kind in kinds:
            name = array_name(kind, existing)
            names[(path, kind.key, kind.signature)] = name
            stored = cached.get(name)
            if stored is not None:
                _check_size(plan.stacks[path], name, stored)
                plan.chunks[(path, name)] = stored.chunk
            if name not in existing:
                existing[name] = kind.signature
                missing.append((plan.stacks[path], name, kind))
    for asset in plan.assets:
        for piece in asset.pieces:
            piece.array = names[(piece.stack, asset.kind.key, asset.kind.signature)]
    return missing


def _signatures(stored: dict[str, StoredArray]) -> dict[str, str]:
    return {name: array.signature for name, array in stored.items()}


def _check_size(stack: Stack, name: str, stored: StoredArray) -> None:
    grid = stack.grid
    if stored.size != (grid.height, grid.width):
        height, width = stored.size
        raise UnsupportedLayout(
            f"array {stack.path}/{name} holds slices of {height} x {width} pixels where this floe's settings cut "
            f"its stack {grid.height} x {grid.width}: the repository was written with another `arrays.tile` "
            f"(set FLOE_ARRAYS__TILE={height} to add granules to it)"
        )


def stage_nodes(store: Store, plan: GranulePlan, *, capacity: int, chunk: int) -> str | None:
    """Create in ``store`` the stacks (and their parent groups) and arrays ``plan`` needs and that are missing.

    Returns a commit message naming what was created, or None when everything
    exists. Shared by every writer of these grids, so the caller commits this
    alone (``Writer.commit_alone``) before staging slices in them.
    """
    missing_arrays = name_arrays(store, plan)
    if not missing_arrays:
        return None
    created: list[str] = []
    group_document = GroupMetadata(zarr_format=3).to_buffer_dict(default_buffer_prototype())[ZARR_JSON]
    for path in plan.stack_paths():
        if _exists(store, path):
            continue
        parents = path.split("/")
        for depth in range(1, len(parents)):
            parent = "/".join(parents[:depth])
            if not _exists(store, parent):
                sync(store.set(f"{parent}/{ZARR_JSON}", group_document))
        sync(create_stack(store, plan.stacks[path], capacity=capacity))
        created.append(path)
    for stack, name, kind in missing_arrays:
        sync(create_array(store, stack, name, kind, capacity=capacity, chunk=chunk))
    arrays = ", ".join(f"{stack.path}/{name}" for stack, name, _ in missing_arrays)
    return f"floe: create {len(created)} stack(s), array(s) {arrays}"[:500]
