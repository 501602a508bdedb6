"""Read a granule's rasters (GeoTIFF/COG assets of one STAC item) into memory, ready to be stacked.

:func:`read_granule` gives one georeferenced ``(band, y, x)`` Dataset per
file (rioxarray's layout); :func:`ingest.pipeline.stage_arrays` then writes
its pixels as slices of the collection's stacks (``_stack.py``).

Pixels are kept unchanged: same dtype, no masking, no scaling. The nodata
value and a non-trivial scale/offset travel as the CF attributes
``_FillValue``, ``scale_factor`` and ``add_offset``; xarray's default
decoding therefore masks and scales on read, and ``mask_and_scale=False``
gives back the raw values.

A granule is all or nothing: every asset is read (pixels included) before
anything is written (:func:`read_assets`), so an unreadable file never
leaves half an item staged in the session.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import rasterio.errors
import rasterio.session
import rioxarray
import xarray as xr

from ingest.errors import InvalidRaster
from ingest.rasters._opening import detail, open_failure, remote_env, why_unrecognized
from ingest.remote import GdalOptions, RemoteError, Stores, gdal_options, gdal_path, is_remote
from ingest.stac import DATETIME, ITEM, SLOT

__all__ = ["InvalidRaster", "read_assets", "read_granule"]

#: Name of the single data variable :func:`read_granule` returns; stacks name their arrays after the asset key.
GRANULE_VARIABLE = "data"

#: rioxarray's grid-mapping coordinate, holding ``crs_wkt`` and ``GeoTransform``.
GRID_MAPPING = "spatial_ref"

#: Names taken by the coordinates of a stack group or of an item's Dataset (``View.item_arrays``), and the stack
#: axis: an array named like one would clobber it.
_RESERVED_NAMES = frozenset({"band", "x", "y", GRID_MAPPING, ITEM, DATETIME, SLOT})

#: Encoding entries worth keeping from rioxarray; the rest (source path, GeoTIFF block shape) describe the input file.
_KEPT_ENCODING = ("grid_mapping",)


def read_granule(
    path: str | Path, gdal_env: Mapping[str, str] | None = None, stores: Stores | None = None
) -> xr.Dataset:
    """Read a GeoTIFF/COG completely into memory as a georeferenced Dataset.

    ``path`` is a local file or an ``s3://`` / ``http(s)://`` URL, read
    through GDAL's virtual file systems with ``gdal_env`` (default:
    :func:`ingest.remote.gdal_options`, credentials from the environment).

    The Dataset holds one ``(band, y, x)`` variable named ``"data"`` (the
    caller names it after the asset) with the native dtype, the nodata value
    as ``_FillValue`` and scale/offset only when they are not the identity.

    Pixels are loaded eagerly, on purpose: granules are small, and a
    truncated or corrupt file must fail here rather than halfway through a
    write. The file is closed before returning.

    Raises:
        InvalidRaster: the file is missing, not a GeoTIFF, truncated or
            corrupt, not georeferenced (no CRS), or has no axis-aligned
            geotransform.
    """
    source = str(path)
    if not is_remote(source):
        return _read(source, source)
    options = gdal_env if gdal_env is not None else gdal_options()
    try:
        # Signed with its container's SAS token where it takes one (GdalOptions); errors name ``source``, unsigned.
        opened_as = options.path(source) if isinstance(options, GdalOptions) else gdal_path(source)
    except RemoteError as error:
        raise InvalidRaster(f"granule {source} cannot be read: {error.reason}", path=source) from error
    with remote_env(options, source):
        try:
            return _read(source, opened_as)
        except InvalidRaster as error:
            raise why_unrecognized(source, stores, error) from error


def _read(source: str, opened_as: str) -> xr.Dataset:
    """:func:`read_granule` of ``source``, opened by GDAL as ``opened_as``."""
    try:
        opened = rioxarray.open_rasterio(
            opened_as,
            masked=False,
            mask_and_scale=False,
            chunks=None,
            cache=True,
            # The default global lock would serialise reads across threads; each read here is
            # independent and the file is closed right after.
            lock=False,
            # COGs are GeoTIFFs to GDAL's reader; refusing other drivers keeps PNGs/JPEGs out.
            driver="GTiff",
        )
    except (rasterio.errors.RasterioError, OSError, ValueError) as exc:
        raise InvalidRaster(open_failure(source, exc), path=source) from exc

    if not isinstance(opened, xr.DataArray):
        _close(opened)
        raise InvalidRaster(f"granule {source} cannot be read: it holds subdatasets, not a single raster", path=source)
    try:
        if opened.rio.crs is None:
            raise InvalidRaster(f"granule {source} has no CRS: floe stores georeferenced rasters only", path=source)
        if "x" not in opened.coords or "y" not in opened.coords:
            raise InvalidRaster(
                f"granule {source} has no axis-aligned geotransform (rotated, or georeferenced by GCPs/RPCs only)",
                path=source,
            )
        try:
            opened.load()
        except (rasterio.errors.RasterioError, OSError, ValueError) as exc:
            raise InvalidRaster(
                f"granule {source} cannot be read: truncated or corrupt pixels ({detail(exc)})", path=source
            ) from exc
    finally:
        opened.close()

    data = opened.copy(deep=False)
    data.name = None
    data.attrs = clean_attrs(data.attrs)
    data.encoding = {key: data.encoding[key] for key in _KEPT_ENCODING if key in data.encoding}
    return data.to_dataset(name=GRANULE_VARIABLE)


def read_assets(
    assets: Mapping[str, str | Path], gdal_env: Mapping[str, str] | None = None, stores: Stores | None = None
) -> dict[str, xr.Dataset]:
    """Check a granule's asset keys and read every asset (see :func:`read_granule`); write nothing.

    ``stores`` (the batch's) explain a remote file GDAL does not recognize (:func:`read_granule`).
    It needs no session: a pipeline runs it ahead, on another thread, while
    the previous granule is being written, and passes the result to
    :func:`ingest.pipeline.stage_arrays`.

    Raises:
        InvalidRaster: an asset key is unusable as a Zarr name, or an asset cannot be read.
        ValueError: ``assets`` is empty.
    """
    if not assets:
        raise ValueError("a granule needs at least one asset to read")
    for key in assets:
        check_asset_key(key)
    return {key: read_granule(path, gdal_env, stores) for key, path in assets.items()}


def check_asset_key(key: object) -> None:
    """Asset keys become Zarr node names; refuse any that would land elsewhere or shadow metadata/coordinates."""
    if not isinstance(key, str) or not key:
        reason = "is empty" if key == "" else "is not a string"
    elif "/" in key:
        reason = "contains '/'"
    elif key.startswith("."):
        reason = "starts with '.'"
    elif key.startswith("__"):
        reason = "starts with '__'"
    elif key in _RESERVED_NAMES:
        reason = f"is reserved for a coordinate ({', '.join(sorted(_RESERVED_NAMES))})"
    else:
        return
    raise InvalidRaster(f"asset key {key!r} {reason}: it cannot name a Zarr array", asset=str(key))


def clean_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """Drop identity scale/offset: rioxarray always adds them, and xarray would decode integers to float64."""
    cleaned = dict(attrs)
    if cleaned.get("scale_factor") == 1.0:
        del cleaned["scale_factor"]
    if cleaned.get("add_offset") == 0.0:
        del cleaned["add_offset"]
    return cleaned


def _close(obj: Any) -> None:
    items = obj if isinstance(obj, list) else [obj]
    for item in items:
        item.close()
