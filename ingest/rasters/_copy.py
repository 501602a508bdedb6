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
from ingest.remote import (
    GDAL_CREDENTIALS,
    GdalOptions,
    RemoteError,
    Stores,
    first_bytes,
    gdal_options,
    gdal_path,
    is_remote,
    redacted,
)
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
    with _remote_env(options, source):
        try:
            return _read(source, opened_as)
        except InvalidRaster as error:
            raise _why_unrecognized(source, stores, error) from error


_TIFF_MAGIC = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")  # classic and BigTIFF, either byte order


def _why_unrecognized(source: str, stores: Stores | None, error: InvalidRaster) -> InvalidRaster:
    """What GDAL's "not recognized as being in a supported file format" hides for a remote file: GDAL's range
    read failed (it says so only in debug messages) or the object is no TIFF. Its first bytes are asked for
    once through obstore, with ``stores``' timeouts but no retries (GDAL's were made), whose reason then names the
    failure; ``error``
    as it is when that read works and the bytes are a TIFF's, or without ``stores``."""
    if stores is None or "not recognized as being in a supported file format" not in error.reason:
        return error
    try:
        start = first_bytes(stores.asking_once(), source, 8)  # GDAL has retried already
    except RemoteError as failed:
        return InvalidRaster(f"granule {source} cannot be read: {failed.reason}", path=source)
    if start[:4] not in _TIFF_MAGIC:
        return InvalidRaster(f"granule {source} cannot be read: not a TIFF (it starts with {start!r})", path=source)
    return error


class _GivenCredentials(rasterio.session.Session):
    """Credentials handed to GDAL as they are: rasterio refuses them as plain options, and its own AWS session
    would look them up again through boto3."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self._options = dict(options)

    @classmethod
    def hascreds(cls, config: Mapping[str, Any]) -> bool:
        return True

    @property
    def credentials(self) -> dict[str, str]:
        return {}

    def get_credential_options(self) -> dict[str, str]:
        return dict(self._options)


def _remote_env(options: Mapping[str, str], url: str) -> rasterio.Env:
    """A rasterio environment with ``options`` for reading ``url`` (unsigned under an anonymous prefix of
    :class:`~ingest.remote.GdalOptions`); credentials among them go through a session."""
    if isinstance(options, GdalOptions):
        options = options.for_url(url)
    credentials = {key: value for key, value in options.items() if key in GDAL_CREDENTIALS}
    config = {key: value for key, value in options.items() if key not in GDAL_CREDENTIALS}
    if credentials:
        return rasterio.Env(session=_GivenCredentials(credentials), **config)
    return rasterio.Env(**config)


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
        raise InvalidRaster(_open_failure(source, exc), path=source) from exc

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
                f"granule {source} cannot be read: truncated or corrupt pixels ({_detail(exc)})", path=source
            ) from exc
    finally:
        opened.close()

    data = opened.copy(deep=False)
    data.name = None
    data.attrs = _clean_attrs(data.attrs)
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
        _check_asset_key(key)
    return {key: read_granule(path, gdal_env, stores) for key, path in assets.items()}


def _check_asset_key(key: object) -> None:
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


def _clean_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """Drop identity scale/offset: rioxarray always adds them, and xarray would decode integers to float64."""
    cleaned = dict(attrs)
    if cleaned.get("scale_factor") == 1.0:
        del cleaned["scale_factor"]
    if cleaned.get("add_offset") == 0.0:
        del cleaned["add_offset"]
    return cleaned


_STALLED = ("Operation too slow", "Timeout was reached", "timed out")


def _open_failure(source: str, exc: BaseException) -> str:
    if "://" not in source and not source.startswith("/vsi") and not Path(source).exists():
        return f"granule {source} cannot be read: no such file"
    if is_remote(source):
        detail = _detail(exc)
        for code, meaning in (("404", "no such object"), ("403", "access denied"), ("401", "not authenticated")):
            if f"response code: {code}" in detail or f"HTTP {code}" in detail or f" {code} " in f" {detail} ":
                return f"granule {source} cannot be read: {meaning} (HTTP {code})"
        if any(stalled in detail for stalled in _STALLED):  # curl's words for remote.read_timeout_s passing
            return f"granule {source} cannot be read: timed out, nothing received (GDAL: {detail})"
        return f"granule {source} cannot be read: {detail}"
    return f"granule {source} cannot be read: not a readable GeoTIFF ({_detail(exc)})"


def _detail(exc: BaseException) -> str:
    """GDAL's reason: rasterio's read errors say 'see previous exception' and chain the real one. URLs in it lose
    their query (GDAL names what it opened: a signed URL's query is a credential)."""
    parts = [str(exc)]
    if exc.__cause__ is not None:
        parts.append(str(exc.__cause__))
    return redacted("; ".join(part for part in parts if part))


def _close(obj: Any) -> None:
    items = obj if isinstance(obj, list) else [obj]
    for item in items:
        item.close()
