"""Opening a granule's file through GDAL, and saying why it could not be opened.

Shared by every way floe reads a granule (copying its pixels, ``_copy.py``; planning references to it,
``_source.py``; copying its tiles, ``_tiles.py``; finding where it is, ``_place.py``), so each names a failure
alike: the file, and GDAL's reason in words (no such file, access denied, timed out, not a TIFF), with any
signed URL's query taken out.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import rasterio.session

from ingest.errors import InvalidRaster
from ingest.remote import GDAL_CREDENTIALS, GdalOptions, RemoteError, Stores, first_bytes, is_remote, redacted

_TIFF_MAGIC = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")  # classic and BigTIFF, either byte order


def why_unrecognized(source: str, stores: Stores | None, error: InvalidRaster) -> InvalidRaster:
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


def remote_env(options: Mapping[str, str], url: str) -> rasterio.Env:
    """A rasterio environment with ``options`` for reading ``url`` (unsigned under an anonymous prefix of
    :class:`~ingest.remote.GdalOptions`); credentials among them go through a session."""
    if isinstance(options, GdalOptions):
        options = options.for_url(url)
    credentials = {key: value for key, value in options.items() if key in GDAL_CREDENTIALS}
    config = {key: value for key, value in options.items() if key not in GDAL_CREDENTIALS}
    if credentials:
        return rasterio.Env(session=_GivenCredentials(credentials), **config)
    return rasterio.Env(**config)


_STALLED = ("Operation too slow", "Timeout was reached", "timed out")


def open_failure(source: str, exc: BaseException) -> str:
    """Why ``source`` could not be opened or read, in words, naming it (``exc``: what rasterio raised)."""
    if "://" not in source and not source.startswith("/vsi") and not Path(source).exists():
        return f"granule {source} cannot be read: no such file"
    if is_remote(source):
        reason = detail(exc)
        for code, meaning in (("404", "no such object"), ("403", "access denied"), ("401", "not authenticated")):
            if f"response code: {code}" in reason or f"HTTP {code}" in reason or f" {code} " in f" {reason} ":
                return f"granule {source} cannot be read: {meaning} (HTTP {code})"
        if any(stalled in reason for stalled in _STALLED):  # curl's words for remote.read_timeout_s passing
            return f"granule {source} cannot be read: timed out, nothing received (GDAL: {reason})"
        return f"granule {source} cannot be read: {reason}"
    return f"granule {source} cannot be read: not a readable GeoTIFF ({detail(exc)})"


def detail(exc: BaseException) -> str:
    """GDAL's reason: rasterio's read errors say 'see previous exception' and chain the real one. URLs in it lose
    their query (GDAL names what it opened: a signed URL's query is a credential)."""
    parts = [str(exc)]
    if exc.__cause__ is not None:
        parts.append(str(exc.__cause__))
    return redacted("; ".join(part for part in parts if part))
