"""Reading arrays back at one snapshot: an item's assets put together from their pieces, and whole stacks.

An item's ``floe:arrays`` asset says where each asset's pixels are: its grid
(CRS, transform, shape) and its pieces, windows of stack arrays at one slot
each (``ingest/stac/_assets.py``). :func:`item_arrays` reads them into the
Dataset the granule's GeoTIFFs would give (``rioxarray``'s layout: a
``(band, y, x)`` variable per asset, ``x``/``y`` pixel centres, a
``spatial_ref`` with the CRS and the GeoTransform). :func:`open_stack` opens
one stack lazily as a time series: its occupied slots, ordered by datetime.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import xarray as xr
import zarr
import zarr.api.asynchronous as async_zarr
from affine import Affine
from xarray.backends.zarr import FillValueCoder
from zarr.core.sync import sync

from ingest._compat import find_virtual_tiff_codecs_lazily
from ingest.errors import ItemNotFound, UnsupportedLayout
from ingest.repository._slots import next_free_slot
from ingest.stac import ARRAYS_LAYOUT, DATETIME, ITEM, SLOT, STACKS, AssetPixels, read_arrays_asset

if TYPE_CHECKING:
    from ingest.repository._view import View

# Arrays of COGs referenced or copied tile by tile may use virtual-tiff's predictor codec: zarr must find it in
# any process that reads them, not only in one that parsed a TIFF first.
find_virtual_tiff_codecs_lazily()

#: rioxarray's grid-mapping coordinate.
GRID_MAPPING = "spatial_ref"
_KEPT_ATTRIBUTES = ("_FillValue", "scale_factor", "add_offset", "AREA_OR_POINT")


def item_arrays(view: View, collection: str, item_id: str, assets: Sequence[str] | None = None) -> xr.Dataset:
    """The arrays of one item at ``view``'s snapshot: one ``(band, y, x)`` variable per asset, georeferenced.

    ``assets`` picks asset keys (default: all). The assets must share one
    grid (a Dataset has one ``x`` and one ``y``); assets on other grids are
    named in the error, to be opened on their own.

    Raises:
        ItemNotFound: no such item, or it has no arrays.
        UnsupportedLayout: its arrays were written by an earlier floe.
        ValueError: an asset key it does not have, or assets on different grids.
    """
    item = view.item(collection, item_id)
    arrays = read_arrays_asset(item)
    if arrays is None:
        raise ItemNotFound(f"item {item_id!r} of collection {collection!r} has no arrays in this repository")
    if arrays.layout != ARRAYS_LAYOUT:
        raise UnsupportedLayout(
            f"item {item_id!r} keeps its arrays in layout {arrays.layout}; this floe reads layout {ARRAYS_LAYOUT}",
            layout=arrays.layout,
        )
    keys = list(assets) if assets is not None else sorted(arrays.pixels)
    unknown = [key for key in keys if key not in arrays.pixels]
    if unknown:
        raise ValueError(f"item {item_id!r} has no arrays for asset(s) {unknown}; it has {sorted(arrays.pixels)}")
    first = arrays.pixels[keys[0]]
    other = [key for key in keys if not _same_grid(arrays.pixels[key], first)]
    if other:
        raise ValueError(
            f"assets {other} of item {item_id!r} are on another grid than {keys[0]!r}: "
            "open them on their own (assets=[...])"
        )
    bands = [key for key in keys if arrays.pixels[key].shape[0] != first.shape[0]]
    if bands:
        raise ValueError(
            f"assets {bands} of item {item_id!r} have another band count than {keys[0]!r} "
            f"({first.shape[0]}), and a Dataset has one band dimension: open them on their own (assets=[...])"
        )
    return sync(_read_item(view.session.store, {key: arrays.pixels[key] for key in keys}))


def _same_grid(one: AssetPixels, other: AssetPixels) -> bool:
    return one.crs == other.crs and one.transform == other.transform and one.shape[1:] == other.shape[1:]


async def _read_item(store: Any, pixels: dict[str, AssetPixels]) -> xr.Dataset:
    read = await asyncio.gather(*(_read_asset(store, where) for where in pixels.values()))
    variables = dict(zip(pixels, read, strict=True))
    first = next(iter(pixels.values()))
    coords = await grid_coords(store, first)
    bands = {variable.shape[0] for variable in variables.values()}
    if len(bands) == 1:
        coords["band"] = np.arange(1, bands.pop() + 1)
    dataset = xr.Dataset(variables, coords=coords)
    for key in variables:
        dataset[key].encoding["grid_mapping"] = GRID_MAPPING
    return dataset


async def grid_coords(store: Any, where: AssetPixels) -> dict[str, Any]:
    """``x``/``y`` (pixel centres) and ``spatial_ref`` (CRS and GeoTransform) of an asset's grid, as rioxarray
    gives them; the CRS's WKT is read from the first piece's stack."""
    reference = await async_zarr.open_array(store=store, path=f"{where.pieces[0].stack}/{GRID_MAPPING}", mode="r")
    crs_wkt = reference.attrs["crs_wkt"]
    a, b, c, d, e, f = where.transform
    _bands, height, width = where.shape
    # rioxarray's arithmetic (the half pixel folded into the transform first), so x/y equal its to the last bit.
    centres = Affine(a, b, c, d, e, f) * Affine.translation(0.5, 0.5)
    # Affine * (column, row) is a * column + b * row + c; with b = d = 0 that is the following, term for term.
    x = (centres.a * np.arange(width) + centres.b * 0.0 + centres.c).astype(np.float64)
    y = (centres.d * 0.0 + centres.e * np.arange(height) + centres.f).astype(np.float64)
    geotransform = " ".join(repr(float(value)) for value in (c, a, b, f, d, e))
    return {
        "x": x,
        "y": y,
        GRID_MAPPING: xr.Variable(
            (), np.int64(0), {"crs_wkt": crs_wkt, "spatial_ref": crs_wkt, "GeoTransform": geotransform}
        ),
    }


async def _read_asset(store: Any, where: AssetPixels) -> xr.Variable:
    """One asset's pixels from its pieces; what no piece covers (unwritten fill chunks) is the fill value."""
    opened: dict[str, Any] = {}
    for path in sorted({f"{piece.stack}/{piece.array}" for piece in where.pieces}):
        opened[path] = await async_zarr.open_array(store=store, path=path, mode="r")
    first = opened[f"{where.pieces[0].stack}/{where.pieces[0].array}"]
    dtype = np.dtype(first.dtype)
    pixels = np.full(where.shape, first.metadata.fill_value, dtype=dtype)

    async def fetch(piece: Any) -> None:
        row, column, height, width = piece.window
        values = await opened[f"{piece.stack}/{piece.array}"].getitem(
            (piece.slot, slice(None), slice(row, row + height), slice(column, column + width))
        )
        pixels[:, piece.at[0] : piece.at[0] + height, piece.at[1] : piece.at[1] + width] = values

    await asyncio.gather(*(fetch(piece) for piece in where.pieces))
    return xr.Variable(("band", "y", "x"), pixels, kept_attributes(first))


def kept_attributes(array: Any) -> dict[str, Any]:
    """The attributes of a stack array a variable keeps: fill value (decoded), scale, offset, pixel type."""
    attrs = {name: array.attrs[name] for name in _KEPT_ATTRIBUTES if name in array.attrs}
    if "_FillValue" in attrs:
        attrs["_FillValue"] = FillValueCoder.decode(attrs["_FillValue"], np.dtype(array.dtype))
    return attrs


def stack_paths(view: View, collection: str) -> list[str]:
    """The stacks of ``collection`` at ``view``'s snapshot (paths inside the repository)."""
    root = f"{collection}/{STACKS}"
    try:
        group = zarr.open_group(view.session.store, path=root, mode="r")
    except (FileNotFoundError, zarr.errors.NodeNotFoundError):
        return []
    found = []
    for name, child in group.groups():
        path = f"{root}/{name}"
        if ITEM in child:
            found.append(path)
        else:
            found.extend(f"{path}/{tile}" for tile, _ in child.groups())
    return sorted(found)


def slot_items(view: View, stack: str) -> dict[int, str]:
    """Slot -> item id of the occupied slots of ``stack``."""
    used = next_free_slot(view.session, stack)
    if used == 0:
        return {}
    values = np.asarray(zarr.open_array(view.session.store, path=f"{stack}/{ITEM}", mode="r")[:used])
    return {int(slot): str(values[slot]) for slot in np.flatnonzero(values != "")}


def open_stack(view: View, stack: str) -> xr.Dataset:
    """One stack at ``view``'s snapshot as a lazy Dataset over ``time``: its occupied slots, oldest first.

    Nothing but the slot coordinates is read: the pixel variables stay lazy
    (``.chunk()`` them for dask). ``item`` names the granule of each step.
    """
    session = view.session
    used = next_free_slot(session, stack)
    dataset = xr.open_zarr(session.store, group=stack, chunks=None, consolidated=False, zarr_format=3)
    dataset = dataset.isel({SLOT: slice(0, used)})
    items = dataset[ITEM].values
    dataset = dataset.isel({SLOT: np.flatnonzero(items != "")})
    dataset = dataset.sortby(DATETIME).rename({SLOT: "time"})
    return dataset.set_coords([ITEM, DATETIME])
