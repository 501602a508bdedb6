"""A granule's rasters into stacks: plan where they go, make the shared nodes, take slots, write the slices.

The steps (array layout 2, see ``ingest/rasters/_stack.py``):

1. plan: each asset's pieces, the stacks and arrays they need;
2. the stacks and arrays that do not exist yet are created in a commit of
   their own (every writer of the grid shares them), and the writer carries
   on from it;
3. the writer takes one slot per stack for this granule;
4. the slices are written (staged in the writer's session), and the pieces
   of the item's previous arrays (a changed raster) are cleared in the same
   commit.

A failure while writing clears what was staged for the granule, so an
item's arrays are whole or absent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from zarr.core.sync import sync

from ingest.rasters import (
    GranulePlan,
    ReferencePlan,
    TileCopy,
    name_arrays,
    plan_granule,
    plan_references,
    stage_nodes,
    write_references,
    write_slices,
    write_tiles,
)
from ingest.stac import AssetPixels, Piece, parse_datetime

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Mapping

    import xarray as xr

    from ingest.config import ArraysSettings
    from ingest.remote import Stores
    from ingest.repository import Writer


def georeferenced(pixels: np.ndarray, crs: str, transform: tuple[float, ...]) -> xr.Dataset:
    """``pixels`` (``(band, y, x)`` or ``(y, x)``) as the Dataset :func:`stage_arrays` takes.

    Args:
        pixels: the pixels, ``(band, y, x)`` or ``(y, x)`` (one band).
        crs: the coordinate reference system, anything rasterio understands (``"EPSG:32633"``, WKT).
        transform: the affine transform in rasterio's order (a, b, c, d, e, f), axis-aligned (b = d = 0); values
            past the sixth are ignored.

    Returns:
        One ``(band, y, x)`` variable named ``data`` (bands numbered from 1, ``x`` and ``y`` at the pixels'
        centres), with ``crs`` and ``transform`` written by rioxarray.

    Raises:
        ValueError: ``transform`` is rotated (b or d is not 0).
    """
    import rioxarray  # noqa: F401 - registers the .rio accessor
    import xarray as xr
    from affine import Affine

    if pixels.ndim == 2:
        pixels = pixels[np.newaxis]
    bands, height, width = pixels.shape
    a, b, c, d, e, f = transform[:6]
    if b or d:
        raise ValueError(f"transform {transform} is rotated: only axis-aligned grids are stored")
    array = xr.DataArray(
        pixels,
        dims=("band", "y", "x"),
        coords={
            "band": np.arange(1, bands + 1),
            "x": c + a * (np.arange(width) + 0.5),
            "y": f + e * (np.arange(height) + 0.5),
        },
    )
    array = array.rio.write_crs(crs).rio.write_transform(Affine(a, b, c, d, e, f))
    return array.to_dataset(name="data")


def datetime_us(item: dict[str, Any]) -> int:
    """The item's datetime (or its start) in microseconds since 1970: a stack's time coordinate."""
    properties = item.get("properties") or {}
    value = properties.get("datetime") or properties.get("start_datetime")
    if not isinstance(value, str):
        return 0
    moment = parse_datetime(value)
    return int(moment.timestamp()) * 1_000_000 + moment.microsecond


def stage_arrays(
    writer: Writer, item: dict[str, Any], read: dict[str, xr.Dataset], settings: ArraysSettings | None = None
) -> tuple[dict[str, AssetPixels], int]:
    """Stage the pixels of ``read`` (asset key -> Dataset) as slices of the item's stacks.

    Stacks and arrays the granule needs that do not exist yet are created in a
    commit of their own, which the writer carries on from; the slices are
    staged in the writer's session (its commit stores them). A failure while
    writing clears what was staged for the granule.

    Args:
        writer: the writer to stage in.
        item: the STAC item the pixels belong to (its ``collection``, ``id`` and ``datetime`` name its slices).
        read: asset key -> what :func:`ingest.rasters.read_granule` returns for it (one ``(band, y, x)``
            variable named ``data``, georeferenced with rioxarray; :func:`georeferenced` makes one).
        settings: the array layout, tile, chunk and stack capacity (default: the repository's ``arrays``
            settings).

    Returns:
        Where each asset's pixels went (give it to :func:`ingest.stac.arrays_asset` for the item's ``floe:arrays``
        asset), and the uncompressed bytes of the pixels.

    Raises:
        InvalidRaster: an asset key cannot name an array of a stack (it is empty, has a ``/``, starts with ``.`` or
            ``__``, or is a coordinate's name such as ``x`` or ``item``), or a stack the granule goes in is full.
        UnsupportedLayout: an existing stack array's slices are another size than ``settings.tile`` cuts (the
            repository was written with another tile).
        ConflictRetriesExhausted: every attempt to commit the new stacks and arrays met a concurrent change.
        CommitConflict: the writer's staged changes collide with the tip that commit made; the writer is closed.
        WriterClosed: the writer has committed (or failed).
        ValueError: ``read`` is empty, the item's collection is not a safe path segment, or ``settings`` name an
            unknown layout or a tile or chunk that is not positive.
    """
    settings = settings or writer.repository.settings.arrays
    plan = plan_granule(item["collection"], read, layout=settings.layout, tile=settings.tile, chunk=settings.chunk)
    when = datetime_us(item)
    placed = _stage_slices(
        writer,
        item,
        plan,
        settings,
        lambda: write_slices(writer.store, plan, item_id=item["id"], datetime_us=when, chunk=settings.chunk),
    )
    return placed, sum(asset.pixels.nbytes for asset in plan.assets)


def stage_references(
    writer: Writer,
    item: dict[str, Any],
    rasters: dict[str, str],
    settings: ArraysSettings,
    *,
    stores: Stores | None = None,
    gdal_env: Mapping[str, str] | None = None,
    planned: ReferencePlan | None = None,
) -> tuple[dict[str, AssetPixels], int]:
    """Stage references to ``rasters`` (asset key -> COG, local or remote) as slices of the fixed stacks of
    their grids.

    Remote COGs are reached through ``stores`` and ``gdal_env`` (see
    :func:`ingest.rasters.plan_references`). Returns where each asset's
    pixels are and the bytes the references stand for; ``planned`` is the
    plan :func:`ingest.rasters.plan_references` made for them already (on
    another thread). Raises ``NotVirtualizable`` (nothing staged: copy the
    granule) or ``InvalidRaster``.
    """
    references = planned or plan_references(writer.store, item["collection"], rasters, stores=stores, gdal_env=gdal_env)
    placed = _stage_slices(
        writer,
        item,
        references.plan,
        settings,
        lambda: write_references(writer.store, references, item_id=item["id"], datetime_us=datetime_us(item)),
    )
    return placed, references.bytes_referenced


def stage_tiles(
    writer: Writer, item: dict[str, Any], tiles: TileCopy, settings: ArraysSettings
) -> tuple[dict[str, AssetPixels], int]:
    """Stage the compressed tiles ``tiles`` read (:func:`ingest.rasters.read_tiles`) as slices of the fixed stacks
    of their grids; returns where each asset's pixels went and their uncompressed bytes."""
    placed = _stage_slices(
        writer,
        item,
        tiles.references.plan,
        settings,
        lambda: write_tiles(writer.store, tiles, item_id=item["id"], datetime_us=datetime_us(item)),
    )
    return placed, tiles.pixel_bytes


def _stage_slices(
    writer: Writer,
    item: dict[str, Any],
    plan: GranulePlan,
    settings: ArraysSettings,
    write: Callable[[], Coroutine[Any, Any, int]],
) -> dict[str, AssetPixels]:
    """Take the slots ``plan`` needs, then run ``write`` (it uses them); a failure clears what it staged, so an
    item's arrays are whole or absent. Returns where each asset's pixels went."""
    _take_slots(writer, item, plan, settings)
    try:
        sync(write())
    except BaseException:
        writer.clear_pieces(_pieces(plan))
        raise
    return {asset.key: asset.where() for asset in plan.assets}


def _take_slots(writer: Writer, item: dict[str, Any], plan: GranulePlan, settings: ArraysSettings) -> None:
    """Make the stacks and arrays ``plan`` needs (a commit of their own), name its arrays, take its slots."""
    if name_arrays(writer.store, plan, writer.stack_arrays):
        writer.commit_alone(
            lambda session: stage_nodes(session.store, plan, capacity=settings.stack_capacity, chunk=settings.chunk)
        )
        name_arrays(writer.store, plan, writer.stack_arrays)
    for stack in plan.stack_paths():
        slot = writer.take_slot(stack, item["collection"], item["id"])
        for piece in _pieces(plan):
            if piece.stack == stack:
                piece.slot = slot


def _pieces(plan: GranulePlan) -> list[Piece]:
    return [piece for asset in plan.assets for piece in asset.pieces]
