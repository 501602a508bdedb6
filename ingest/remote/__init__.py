"""Objects named by URL: obstore stores for ``s3://`` and ``http(s)://`` with floe's credentials, timeouts and retries.

One home for reaching remote objects, whatever reads them (item files and catalogs, remote rasters' HEADs and range
reads, ``check --deep``): stores (``_stores``), S3 credentials (``_credentials``), buckets' regions and requester
pays (``_buckets``), headers (``_headers``), SAS tokens (``_tokens``), GDAL's configuration (``_gdal``), the
table's FileIO on S3 (``_table_io``) and its object cache (``_object_cache``). How remote data is reached:
docs/remote-sources.md#reaching-remote-data and #timeouts-and-retries.
"""

from typing import TYPE_CHECKING, Any

from ingest.remote._buckets import Buckets
from ingest.remote._errors import RemoteError, describe, unreachable
from ingest.remote._gdal import GDAL_CREDENTIALS, GDAL_REMOTE_OPTIONS, GdalOptions, gdal_options, gdal_path
from ingest.remote._headers import Headers
from ingest.remote._object_cache import DiskCache, KeptBytes
from ingest.remote._stores import (
    REMOTE_SCHEMES,
    SUPPORTED,
    Stores,
    Transport,
    file_url_path,
    first_bytes,
    head,
    is_remote,
    join_url,
    unsigned,
    url_scheme,
)
from ingest.remote._tokens import PLANETARY_COMPUTER, SasTokens, planetary_computer_source, redacted

if TYPE_CHECKING:
    from ingest.remote._table_io import ObjectFileIO, writes_together


def __getattr__(name: str) -> Any:
    # The table's FileIO brings PyIceberg's PyArrow module (half a second): imported when first asked for.
    if name in ("ObjectFileIO", "writes_together"):
        from ingest.remote import _table_io

        return getattr(_table_io, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "GDAL_CREDENTIALS",
    "GDAL_REMOTE_OPTIONS",
    "PLANETARY_COMPUTER",
    "REMOTE_SCHEMES",
    "SUPPORTED",
    "Buckets",
    "DiskCache",
    "GdalOptions",
    "Headers",
    "KeptBytes",
    "ObjectFileIO",
    "RemoteError",
    "SasTokens",
    "Stores",
    "Transport",
    "describe",
    "file_url_path",
    "first_bytes",
    "gdal_options",
    "gdal_path",
    "head",
    "is_remote",
    "join_url",
    "planetary_computer_source",
    "redacted",
    "unreachable",
    "unsigned",
    "url_scheme",
    "writes_together",
]
