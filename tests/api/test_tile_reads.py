"""A tile's window warped by GDAL (``ingest/api/_tile_reads.py``) against rio-tiler's ``XarrayReader`` on the same
array: every tile a granule touches at two zooms, edge tiles included, on three CRSs, with and without nodata,
a band subset and another tile size. Same mask, and the same pixels where both have data (nearest neighbour on
the same target grid: a pixel centre that falls on a source pixel's edge may go either way, so 1% may differ).
"""

from __future__ import annotations

import warnings

import morecantile
import numpy as np
import pytest
import rioxarray  # noqa: F401 - the .rio accessor
import xarray as xr
from rasterio.warp import transform_bounds
from rio_tiler.errors import TileOutsideBounds
from rio_tiler.io import XarrayReader

from ingest.api._tile_reads import warped_tile
from tests.api._granules import GRANULES

TMS = morecantile.tms.get("WebMercatorQuad")
SIZE = 300


def _granule(name: str, *, nodata: int | None, bands: int = 2) -> xr.DataArray:
    crs, (left, top), step, _zoom = GRANULES[name]
    rows, columns = np.mgrid[0:SIZE, 0:SIZE]
    pixels = np.stack([(100 + 3 * rows + 7 * columns + 1000 * band) % 60000 for band in range(bands)])
    pixels = pixels.astype("uint16")
    if nodata is not None:
        pixels[:, :50, :80] = nodata
    array = xr.DataArray(
        pixels,
        dims=("band", "y", "x"),
        coords={
            "band": np.arange(1, bands + 1),
            "y": top - step * (np.arange(SIZE) + 0.5),
            "x": left + step * (np.arange(SIZE) + 0.5),
        },
        attrs={} if nodata is None else {"_FillValue": nodata},
    )
    return array.rio.write_crs(crs)


def _theirs(array: xr.DataArray, tile: morecantile.Tile, size: int, indexes: tuple[int, ...] | None) -> object:
    with XarrayReader(array, tms=TMS) as reader, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return reader.tile(tile.x, tile.y, tile.z, tilesize=size, indexes=indexes)
        except TileOutsideBounds:
            return None


@pytest.mark.parametrize("name", sorted(GRANULES))
@pytest.mark.parametrize(
    ("nodata", "indexes", "size"), [(0, None, 256), (None, None, 256), (0, (2,), 512)], ids=["nodata", "none", "b2"]
)
def test_every_tile_of_a_granule_is_rio_tilers(name: str, nodata: int | None, indexes, size: int) -> None:
    array = _granule(name, nodata=nodata)
    west, south, east, north = transform_bounds(array.rio.crs, "EPSG:4326", *array.rio.bounds())
    zoom = GRANULES[name][3]
    compared = 0
    for tile in TMS.tiles(west, south, east, north, [zoom - 2, zoom - 1]):
        ours = warped_tile(array, TMS, (tile.z, tile.x, tile.y), (size, size), indexes)
        theirs = _theirs(array, tile, size, indexes)
        if theirs is None or not (~theirs.array.mask).any():
            assert ours is None or not (~ours.array.mask).any(), f"{tile}: data where rio-tiler has none"
            continue
        assert ours is not None, f"{tile}: rio-tiler has data here"
        assert ours.array.shape == theirs.array.shape
        mask_differs = (ours.array.mask != theirs.array.mask).mean()
        assert mask_differs <= 0.01, f"{tile}: masks differ in {mask_differs:.2%}"
        both = ~ours.array.mask & ~theirs.array.mask
        differs = (ours.array.data[both] != theirs.array.data[both]).mean()
        assert differs <= 0.01, f"{tile}: pixels differ in {differs:.2%}"
        compared += 1
    assert compared >= 4, "the granule should cover several tiles at these zooms"


def test_a_tile_away_from_the_granule_is_none() -> None:
    array = _granule("utm", nodata=0)
    assert warped_tile(array, TMS, (10, 0, 0), (256, 256), None) is None
