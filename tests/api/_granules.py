"""Granules for the map tile tests: one COG per CRS, copied into a repository as an ingest copies it."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import rasterio
from rasterio.transform import from_origin

from ingest import Repository
from ingest.pipeline import stage_arrays
from ingest.rasters import read_granule
from ingest.stac import arrays_asset, read_arrays_asset, with_arrays_asset
from tests.conftest import make_item

#: Per CRS: the granule's top-left corner and pixel size, and a zoom where it covers several web tiles.
GRANULES = {
    "utm": ("EPSG:32633", (500_000.0, 4_200_000.0), 10.0, 15),
    "geographic": ("EPSG:4326", (11.0, 45.0), 0.0001, 15),
    "polar": ("EPSG:3413", (0.0, -2_000_000.0), 10.0, 14),
}
SIZE = 384


def granule_pixels(name: str, version: int = 0) -> np.ndarray:
    rows, cols = np.mgrid[0:SIZE, 0:SIZE]
    rng = np.random.default_rng(zlib.crc32(name.encode()) + version)
    field = 1000 + 20 * rows + 7 * cols + 3000 * version + rng.integers(0, 50, size=(SIZE, SIZE))
    field[:40, :60] = 0  # nodata in a corner
    return field.astype("uint16")[np.newaxis]


def write_cog(path: Path, name: str, version: int = 0, *, width: int = SIZE) -> Path:
    crs, origin, resolution, _ = GRANULES[name]
    profile = {
        "driver": "COG",
        "width": width,
        "height": SIZE,
        "count": 1,
        "dtype": "uint16",
        "nodata": 0,
        "crs": crs,
        "transform": from_origin(*origin, resolution, resolution),
        "compress": "deflate",
        "blocksize": 128,
        "overviews": "NONE",
    }
    with rasterio.open(path, "w", **profile) as target:
        target.write(granule_pixels(name, version)[:, :, :width])
    return path


def stage_cog(
    repo: Repository, cog: Path, name: str, *, replace: bool = False, when: str = "2024-03-01T10:00:00Z"
) -> None:
    from rasterio.warp import transform_bounds

    writer = repo.writer()
    item = make_item(name, "tiles", when=when)
    with rasterio.open(cog) as source:  # the footprint a search by bbox finds it by
        west, south, east, north = transform_bounds(source.crs, "EPSG:4326", *source.bounds)
        valid = source.read(1, masked=True)
    ring = [[west, south], [east, south], [east, north], [west, north], [west, south]]
    item.update(geometry={"type": "Polygon", "coordinates": [ring]}, bbox=[west, south, east, north])
    # The source asset, with the statistics rio-stac would give it (the stretch of the item's web-map link).
    statistics = {"minimum": int(valid.min()), "maximum": int(valid.max())}
    item["assets"] = {
        "B04": {
            "href": str(cog),
            "type": "image/tiff; application=geotiff",
            "raster:bands": [{"statistics": statistics}],
        }
    }
    writer.ensure_collection("tiles")
    if replace:
        stored = writer.stored_items([("tiles", name)])[("tiles", name)]
        writer.clear_pieces(read_arrays_asset(stored).pixels["B04"].pieces)
    placed, _ = stage_arrays(writer, item, {"B04": read_granule(cog)})
    writer.add_item(with_arrays_asset(item, arrays_asset(placed)), replace=replace)
    writer.commit(f"{name} {'replaced' if replace else 'added'}")
