"""Objects named by URL: obstore stores for ``s3://`` and ``http(s)://`` with floe's credentials, timeouts and retries.

One home for reaching remote objects, whatever reads them (item files and
catalogs, remote rasters' HEADs and range reads, ``check --deep``; GDAL's
configuration for the rasters it reads, :mod:`ingest.remote._gdal`):

- ``s3://``: obstore's ``S3Store`` reads the ``AWS_*`` environment
  (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
  ``AWS_REGION``, ``AWS_ENDPOINT_URL``, ``AWS_SKIP_SIGNATURE``, ...); floe's
  own :class:`~ingest.config.S3Settings` (``FLOE_S3__*``), where set, win over
  it. obstore reads no ``~/.aws`` files, so a profile named by
  ``AWS_PROFILE`` is read through boto3 (when the environment holds no
  keys). obstore drops the environment's client options (``AWS_ALLOW_HTTP``,
  ``AWS_PROXY_URL``, timeouts) as soon as any client option is passed
  (pyo3-object_store ``aws/store.rs``: ``from_env()`` then
  ``with_client_options``), so floe reads those itself
  (``_credentials.environment_client_options``).
- ``http(s)://``: plain GETs (``HTTPStore``); there is no listing over HTTP.
  A URL with a query string (a presigned or SAS URL) is a store of its own,
  so the query goes with every request.
- One store per (scheme, bucket or host) for the life of a :class:`Stores`;
  a bucket read both signed and unsigned (a public prefix of it,
  ``remote.anonymous``) has one of each.
- Public buckets: ``s3://`` URLs under a prefix of ``remote.anonymous``
  (``FLOE_REMOTE__ANONYMOUS``; ``floe ingest --anonymous`` adds ``s3://``,
  every bucket) are read unsigned, by obstore and by GDAL
  (:class:`GdalOptions`), whatever credentials are set for the rest.
- Buckets (:mod:`ingest.remote._buckets`): each bucket is reached in its own
  region (``remote.regions``, else the one S3 names when asked once per
  process), not only the one set for everything; reads under a prefix of
  ``remote.requester_pays`` say their requester pays.
- Azure blobs (:mod:`ingest.remote._tokens`): with ``remote.sas_token_url``
  (``floe ingest --planetary-computer``), blob URLs are read signed with
  their container's SAS token, asked for per container and renewed before it
  expires; what floe records and reports keeps the unsigned URL.
- Headers (:mod:`ingest.remote._headers`): ``remote.headers`` (and ``floe
  ingest --header``) give http(s) requests under some URL prefixes an API key
  or a bearer token; no other request carries them.

Transient failures (connection errors, 5xx, timeouts of reads) are retried by
obstore with exponential backoff and jitter (:attr:`Transport.max_retries`
attempts more, waits from :attr:`Transport.initial_backoff` doubling up to
:attr:`Transport.max_backoff`, never past :attr:`Transport.retry_timeout`);
what still fails is a :class:`RemoteError` with a short reason
(:func:`describe`). Timeouts and retries come from ``remote.*`` settings
(:meth:`Transport.of`). Credentials are used, never written anywhere.
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
