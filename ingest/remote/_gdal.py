"""GDAL's configuration for remote rasters (``/vsis3/``, ``/vsicurl/``): what production tilers set, floe's
timeouts and retries, credentials, and the prefixes read unsigned (see :mod:`ingest.remote`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from ingest.remote._buckets import Buckets, s3_endpoint
from ingest.remote._errors import RemoteError
from ingest.remote._headers import Headers
from ingest.remote._stores import Transport, unsigned, url_scheme
from ingest.remote._tokens import SasTokens, TokenError

if TYPE_CHECKING:
    from ingest.config import RemoteSettings, S3Settings


def gdal_path(url: str) -> str:
    """The GDAL virtual file system path of ``url`` (``/vsis3/bucket/key``, ``/vsicurl/https://...``)."""
    scheme = url_scheme(url)
    if scheme == "s3":
        return "/vsis3/" + url[len("s3://") :]
    if scheme in ("http", "https"):
        return "/vsicurl/" + url
    return url


GDAL_REMOTE_OPTIONS = {
    # What production tilers set: no directory listing on open (a COG is one object), consecutive ranges merged
    # into one request, HTTP/2 with many requests on one connection, blocks cached for the rest of the read.
    "GDAL_DISABLE_READDIR_ON_OPEN": "EMPTY_DIR",
    "GDAL_HTTP_MERGE_CONSECUTIVE_RANGES": "YES",
    "GDAL_HTTP_MULTIPLEX": "YES",
    "GDAL_HTTP_VERSION": "2TLS",  # HTTP/2 where TLS negotiates it; no h2c upgrade sent to plain http://
    "VSI_CACHE": "TRUE",
    "GDAL_HTTP_RETRY_DELAY": "0.5",
    "GDAL_HTTP_TIMEOUT": "600",  # a whole request; a stall is caught sooner (GDAL_HTTP_LOW_SPEED_TIME)
    "GDAL_HTTP_LOW_SPEED_LIMIT": "1",  # bytes a second, below which a transfer counts as stalled ...
}

GDAL_CREDENTIALS = frozenset(("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"))
"""The options of :func:`gdal_options` that are credentials (an unsigned read drops them; rasterio takes them
through a session)."""


class GdalOptions(dict[str, str]):
    """GDAL configuration for remote rasters (:func:`gdal_options`), which knows the ``s3://`` prefixes to
    read unsigned, what it knows of buckets (:class:`Buckets`), where SAS tokens come from
    (:class:`SasTokens`) and the headers some URLs take (:class:`Headers`): :meth:`for_url` gives the options
    for one raster, :meth:`path` what GDAL opens."""

    def __init__(
        self,
        options: dict[str, str],
        anonymous: Iterable[str] = (),
        buckets: Buckets | None = None,
        tokens: SasTokens | None = None,
        headers: Headers | None = None,
    ) -> None:
        super().__init__(options)
        self.anonymous = tuple(anonymous)
        self.buckets = buckets if buckets is not None else Buckets(find=False)
        self.tokens = tokens if tokens is not None else SasTokens()
        self.headers = headers if headers is not None else Headers()

    def path(self, url: str) -> str:
        """What GDAL opens to read ``url``: :func:`gdal_path` of it, signed with its container's SAS token where
        it takes one.

        Raises:
            RemoteError: no token could be had for it.
        """
        try:
            return gdal_path(self.tokens.sign(url))
        except TokenError as error:
            raise RemoteError(url, str(error)) from error

    def for_url(self, url: str) -> dict[str, str]:
        """The options to read ``url`` with: its headers; in its bucket's region; without credentials and unsigned
        under an anonymous prefix, else saying its requester pays under such a prefix."""
        options = dict(self)
        if (lines := self.headers.gdal_option(url)) is not None:
            options["GDAL_HTTP_HEADERS"] = lines
        if url_scheme(url) == "s3" and (region := self.buckets.region(urlparse(url).netloc)) is not None:
            options["AWS_REGION"] = region
        if not unsigned(url, self.anonymous):
            if self.buckets.pays(url):
                options["AWS_REQUEST_PAYER"] = "requester"
            return options
        options = {key: value for key, value in options.items() if key not in GDAL_CREDENTIALS}
        options["AWS_NO_SIGN_REQUEST"] = "YES"
        return options

    def __reduce__(self) -> tuple[Any, ...]:
        return (GdalOptions, (dict(self), self.anonymous, self.buckets, self.tokens, self.headers))


def gdal_options(
    s3: S3Settings | None = None, *, anonymous: bool = False, remote: RemoteSettings | None = None
) -> GdalOptions:
    """GDAL configuration for reading ``s3://`` and ``http(s)://`` rasters, credentials included (never stored).

    ``s3`` settings win where set; otherwise GDAL reads the ``AWS_*``
    environment itself, except ``AWS_ENDPOINT_URL``, which GDAL spells
    ``AWS_S3_ENDPOINT`` (a host and port) with ``AWS_HTTPS``: it is translated.
    ``remote`` gives the timeouts, retries and the prefixes read unsigned
    (``anonymous``: every bucket).
    """
    options = dict(GDAL_REMOTE_OPTIONS)
    transport = Transport.of(remote) if remote is not None else Transport()
    # ... for this long (a stalled server; then the read is retried, as obstore's are).
    options["GDAL_HTTP_LOW_SPEED_TIME"] = str(max(1, round(transport.read_timeout.total_seconds())))
    options["GDAL_HTTP_CONNECTTIMEOUT"] = str(max(1, round(transport.connect_timeout.total_seconds())))
    options["GDAL_HTTP_MAX_RETRY"] = str(transport.max_retries)
    endpoint = s3_endpoint(s3)
    if endpoint:
        parsed = urlparse(endpoint)
        options["AWS_S3_ENDPOINT"] = parsed.netloc or endpoint
        options["AWS_HTTPS"] = "NO" if parsed.scheme == "http" else "YES"
        options["AWS_VIRTUAL_HOSTING"] = "FALSE"  # S3-compatible servers answer path-style requests
    if s3 is not None:
        if s3.region:
            options["AWS_REGION"] = s3.region
        if s3.force_path_style:
            options["AWS_VIRTUAL_HOSTING"] = "FALSE"
        if s3.access_key_id and s3.secret_access_key:
            options["AWS_ACCESS_KEY_ID"] = s3.access_key_id
            options["AWS_SECRET_ACCESS_KEY"] = s3.secret_access_key
            if s3.session_token:
                options["AWS_SESSION_TOKEN"] = s3.session_token
    buckets, tokens, headers = Buckets.of(s3, remote), SasTokens.of(remote), Headers.of(remote)
    if anonymous or (s3 is not None and s3.anonymous):
        return GdalOptions(options, ("s3://",), buckets, tokens, headers)
    return GdalOptions(options, remote.anonymous if remote is not None else (), buckets, tokens, headers)
