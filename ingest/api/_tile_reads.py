"""One tile's pixels from an item's lazy array: the source window the tile needs, read by chunks, warped by GDAL.

rio-tiler's ``XarrayReader`` draws the same tile through rioxarray's
``clip_box`` and ``reproject``, which recompute the grid from the
coordinates over and over (17 look-ups of the bounds a tile, each a few
xarray selections) and wrap every step in new DataArrays: 25-32 ms a tile
on ``bench_tiles``' granules, of which reading and decoding the chunks is
6.5. Here the grid is read once from the coordinates, the window the tile's
bounds need (with a pixel of margin) is read through the chunk reader
(``ingest.repository._series``), and ``rasterio.warp.reproject`` (GDAL's
warper, as rioxarray calls it) resamples it onto the tile's grid, nearest
neighbour, as rio-tiler's default: 5.5-15 ms (docs/pixels.md#map-tiles).
The result is rio-tiler's ``ImageData``, so expressions, rescaling, colormaps,
mosaics and encoding stay rio-tiler's.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import xarray as xr
    from rio_tiler.models import ImageData

DENSIFY = 21
"""Points per edge when the tile's bounds are carried into the source CRS (curved edges, as rio-tiler densifies)."""


def warped_tile(
    array: xr.DataArray,
    tms: Any,
    tile: tuple[int, int, int],
    size: tuple[int, int],
    indexes: tuple[int, ...] | None,
) -> ImageData | None:
    """Tile ``(z, x, y)`` of ``tms``, ``size`` (height, width) pixels, of ``array`` (``band, y, x``, lazy,
    georeferenced by its coordinates and its CRS), bands ``indexes`` (from 1; all by default); None when the
    tile does not reach the array.

    Pixels no source pixel lands on, and nodata pixels (the array's
    ``_FillValue``), are masked.
    """
    from morecantile import Tile
    from rasterio.transform import from_bounds
    from rasterio.warp import Resampling, reproject
    from rio_tiler.models import ImageData

    z, x, y = tile
    bounds = tuple(tms.xy_bounds(Tile(x=x, y=y, z=z)))
    source_crs, target_crs = array.rio.crs, tiling_crs(tms.id)
    window = _window(array, _source_bounds(bounds, target_crs, source_crs))
    if window is None:
        return None
    if indexes is not None:
        array = array.isel(band=[index - 1 for index in indexes])
    (row0, row1), (column0, column1), transform = window
    pixels = np.asarray(array[:, row0:row1, column0:column1].values)
    nodata = _nodata(array)
    height, width = size
    fill = nodata if nodata is not None else 0
    drawn = np.full((pixels.shape[0], height, width), fill, dtype=pixels.dtype)
    target = from_bounds(*bounds, width, height)
    warp = {"src_crs": source_crs, "dst_transform": target, "dst_crs": target_crs, "resampling": Resampling.nearest}
    reproject(pixels, drawn, src_transform=transform, src_nodata=nodata, dst_nodata=nodata, **warp)
    if nodata is None:
        covered = np.zeros((1, height, width), dtype="uint8")
        reproject(np.ones((1, *pixels.shape[1:]), "uint8"), covered, src_transform=transform, dst_nodata=0, **warp)
        valid = np.broadcast_to(covered.astype(bool), drawn.shape)
    elif isinstance(nodata, float) and math.isnan(nodata):
        valid = ~np.isnan(drawn)
    else:
        valid = drawn != nodata
    names = [f"b{index}" for index in (indexes or range(1, pixels.shape[0] + 1))]
    return ImageData(np.ma.MaskedArray(drawn, mask=~valid), bounds=bounds, crs=target_crs, band_names=names)


@functools.cache
def known_set(identifier: str) -> Any:
    """morecantile's tile matrix set ``identifier``, made once (``tms.get`` copies it on every call)."""
    import morecantile

    return morecantile.tms.get(identifier)


@functools.cache
def tiling_crs(identifier: str) -> Any:
    """The rasterio CRS of tile matrix set ``identifier``, made once (``rasterio_crs`` parses it on every read)."""
    return known_set(identifier).rasterio_crs


def _source_bounds(bounds: tuple[float, ...], target_crs: Any, source_crs: Any) -> tuple[float, ...] | None:
    """The tile's bounds in the source CRS (densified edges); None where they cannot be carried there."""
    from rasterio.errors import CRSError
    from rasterio.warp import transform_bounds

    try:
        carried = transform_bounds(target_crs, source_crs, *bounds, densify_pts=DENSIFY)
    except (CRSError, ValueError):  # e.g. a tile beyond the source projection's domain
        return None
    return carried if all(math.isfinite(value) for value in carried) else None


def _window(
    array: xr.DataArray, bounds: tuple[float, ...] | None
) -> tuple[tuple[int, int], tuple[int, int], Any] | None:
    """The rows and columns of ``array`` ``bounds`` covers, with a pixel of margin, and that window's transform;
    None when it covers none."""
    from affine import Affine

    if bounds is None:
        return None
    xs, ys = array["x"].values, array["y"].values
    if xs.size < 2 or ys.size < 2:
        return None
    x_step, y_step = float(xs[1] - xs[0]), float(ys[1] - ys[0])
    left, top = float(xs[0]) - x_step / 2, float(ys[0]) - y_step / 2  # coordinates are pixel centres
    west, south, east, north = bounds
    first_column, last_column = sorted(((west - left) / x_step, (east - left) / x_step))
    first_row, last_row = sorted(((north - top) / y_step, (south - top) / y_step))
    column0, column1 = max(math.floor(first_column) - 1, 0), min(math.ceil(last_column) + 1, xs.size)
    row0, row1 = max(math.floor(first_row) - 1, 0), min(math.ceil(last_row) + 1, ys.size)
    if column0 >= column1 or row0 >= row1:
        return None
    transform = Affine(x_step, 0.0, left + column0 * x_step, 0.0, y_step, top + row0 * y_step)
    return (row0, row1), (column0, column1), transform


def _nodata(array: xr.DataArray) -> Any:
    """The array's nodata value as its pixels' type holds it, or None."""
    value = array.attrs.get("_FillValue", array.encoding.get("_FillValue"))
    if value is None:
        return None
    return array.dtype.type(value).item()
