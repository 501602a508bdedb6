"""Objects named by URL: obstore stores for ``s3://`` and ``http(s)://`` with floe's credentials, timeouts and retries.

One home for reaching remote objects, whatever reads them (item files and
catalogs now; rasters later):

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
  (:func:`_environment_client_options`).
- ``http(s)://``: plain GETs (``HTTPStore``); there is no listing over HTTP.
  A URL with a query string (a presigned or SAS URL) is a store of its own,
  so the query goes with every request.
- One store per (scheme, bucket or host) for the life of a :class:`Stores`.

Transient failures (connection errors, 5xx, timeouts of reads) are retried by
obstore with exponential backoff and jitter (:attr:`Transport.max_retries`
attempts more, waits from :attr:`Transport.initial_backoff` doubling up to
:attr:`Transport.max_backoff`, never past :attr:`Transport.retry_timeout`);
what still fails is a :class:`RemoteError` with a short reason
(:func:`describe`). Credentials are used, never written anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urljoin, urlparse, uses_relative

from obstore.exceptions import PermissionDeniedError, UnauthenticatedError
from obstore.store import HTTPStore, S3Store

from ingest._threads import interruptible, on_daemon_thread
from ingest.errors import InvalidSource

if TYPE_CHECKING:
    from obstore.store import ClientConfig, ObjectStore, RetryConfig, S3Config, S3Credential

    from ingest.config import S3Settings

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+)://")


def url_scheme(source: str) -> str | None:
    """The scheme of ``source`` if it is a URL (``scheme://...``, lower case), else None (a local path)."""
    match = _URL.match(source)
    return match.group(1).lower() if match else None


REMOTE_SCHEMES = ("s3", "http", "https")
"""URL schemes read through obstore (``file://`` URLs are read as local paths)."""

SUPPORTED = "s3://, http://, https:// and file:// URLs (or local paths)"

_S3_ERROR_CODE = re.compile(r"<Code>([A-Za-z]+)</Code>")
_STATUS = re.compile(r"status code: (\d{3})")

# ClientConfig keys (obstore/_store/_client.pyi) that object_store also reads from the environment as AWS_<KEY>.
_CLIENT_KEYS = (
    "allow_http",
    "allow_invalid_certificates",
    "connect_timeout",
    "default_content_type",
    "http1_only",
    "http2_keep_alive_interval",
    "http2_keep_alive_timeout",
    "http2_keep_alive_while_idle",
    "http2_only",
    "pool_idle_timeout",
    "pool_max_idle_per_host",
    "proxy_ca_certificate",
    "proxy_excludes",
    "proxy_url",
    "randomize_addresses",
    "read_timeout",
    "timeout",
    "user_agent",
)


@dataclass(frozen=True)
class Transport:
    """Timeouts, retries and chunk sizes of remote reads."""

    connect_timeout: timedelta = timedelta(seconds=30)
    read_timeout: timedelta = timedelta(seconds=30)
    """A read that receives nothing this long fails (and is retried): a stalled server."""
    request_timeout: timedelta = timedelta(hours=6)
    """The whole of one request, body included: streaming a large NDJSON file takes long, stalls are
    caught by ``read_timeout``."""
    max_retries: int = 4
    initial_backoff: timedelta = timedelta(milliseconds=200)
    max_backoff: timedelta = timedelta(seconds=10)
    retry_timeout: timedelta = timedelta(minutes=3)
    stream_chunk: int = 1 << 20
    """Bytes of an NDJSON object handled at a time."""
    reader_buffer: int = 1 << 20
    """Bytes a stac-geoparquet reader fetches at least per range request."""

    def client_options(self) -> ClientConfig:
        return {
            "connect_timeout": self.connect_timeout,
            "read_timeout": self.read_timeout,
            "timeout": self.request_timeout,
        }

    def retry_config(self) -> RetryConfig:
        return {
            "max_retries": self.max_retries,
            "backoff": {"init_backoff": self.initial_backoff, "max_backoff": self.max_backoff, "base": 2},
            "retry_timeout": self.retry_timeout,
        }


def file_url_path(url: str) -> Path:
    """The local path a ``file://`` URL names.

    Raises:
        InvalidSource: the URL names another host.
    """
    parsed = urlparse(url)
    if parsed.netloc not in ("", "localhost"):
        raise InvalidSource(f"a file:// URL names a file on this machine, not on {parsed.netloc!r}")
    return Path(unquote(parsed.path))


def join_url(base: str, href: str) -> str:
    """``href`` resolved against the URL ``base``, for any scheme (``urljoin`` alone leaves ``s3://`` bases out)."""
    scheme = urlparse(base).scheme
    if not scheme or scheme in uses_relative:
        return urljoin(base, href)
    # Join as if http (same rules for paths), then put the scheme back.
    joined = urljoin("http" + base[len(scheme) :], href)
    return scheme + joined[len("http") :] if joined.startswith("http://") else joined


class RemoteError(Exception):
    """A remote object that could not be read: the URL and a short reason."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"{url}: {reason}")


def describe(error: BaseException) -> str:
    """A short reason for an obstore failure, without obstore's debug dump (the URL goes with it elsewhere)."""
    text = str(error)
    code = _S3_ERROR_CODE.search(text)
    code_note = f", {code.group(1)}" if code else ""
    if isinstance(error, FileNotFoundError):
        if code and code.group(1) == "NoSuchBucket":
            return "no such bucket"
        return "no such object"
    if isinstance(error, PermissionDeniedError):
        return f"access denied (HTTP 403{code_note}): check the credentials and what they may read"
    if isinstance(error, UnauthenticatedError):
        return f"not authenticated (HTTP 401{code_note}): give credentials, or --anonymous for a public bucket"
    retried = re.search(r"after (\d+) retries", text)
    retries = int(retried.group(1)) if retried else 0
    after = f" after {retries} {'retry' if retries == 1 else 'retries'}" if retries else ""
    lowered = text.lower()
    if "connection refused" in lowered:
        return f"connection refused{after}: nothing listens at that address"
    if "timed out" in lowered or "timedout" in lowered:  # not "timeout": every retry error names retry_timeout
        return f"timed out{after}"
    if "dns error" in lowered or "failed to lookup address" in lowered:
        return "unknown host (DNS lookup failed)"
    if "tcp connect error" in lowered or "error sending request" in lowered:
        return f"cannot connect{after}"
    if "builder error" in lowered and "http://" in lowered:
        return "an http:// endpoint needs allow_http (FLOE_S3__ALLOW_HTTP=true or AWS_ALLOW_HTTP=true)"
    if status := _STATUS.search(text):
        return f"HTTP {status.group(1)}{code_note}{after}"
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return first[:300]


def _environment_client_options(prefix: str) -> dict[str, Any]:
    """Client options the environment sets for ``prefix`` (``AWS_ALLOW_HTTP`` -> ``allow_http``).

    obstore builds an S3 store from the environment but replaces all of its
    client options with the ones passed in, so floe passes these along itself.
    """
    return {key: os.environ[f"{prefix}{key.upper()}"] for key in _CLIENT_KEYS if f"{prefix}{key.upper()}" in os.environ}


@dataclass(frozen=True)
class _StaticCredentials:
    """Credentials from floe's settings, used instead of whatever the environment holds (a stray
    ``AWS_SESSION_TOKEN`` must not join keys it does not belong to)."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    token: str | None = field(default=None, repr=False)

    def __call__(self) -> S3Credential:
        return {
            "access_key_id": self.access_key_id,
            "secret_access_key": self.secret_access_key,
            "token": self.token,
            "expires_at": None,
        }


def _aws_profile() -> str | None:
    """The AWS profile to read keys from: ``AWS_PROFILE`` (or ``AWS_DEFAULT_PROFILE``), when the environment
    holds no keys of its own (they win, as in every AWS SDK); None otherwise."""
    if os.environ.get("AWS_ACCESS_KEY_ID"):
        return None
    return os.environ.get("AWS_PROFILE") or os.environ.get("AWS_DEFAULT_PROFILE") or None


def _profile_credentials(profile: str) -> tuple[Any, str | None]:
    """A refreshing credential provider for ``profile`` (``~/.aws/credentials``/``config``, or the files
    ``AWS_SHARED_CREDENTIALS_FILE``/``AWS_CONFIG_FILE`` name), and the profile's region.

    Raises:
        RemoteError: boto3 is missing, or the profile does not exist or holds no credentials.
    """
    url = f"aws profile {profile}"
    try:
        import boto3
        from botocore.exceptions import BotoCoreError
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError as error:
        raise RemoteError(url, f"reading AWS profiles needs boto3 ({error})") from error
    try:
        session = boto3.Session(profile_name=profile)
        return Boto3CredentialProvider(session), session.region_name
    except (BotoCoreError, ValueError) as error:
        raise RemoteError(url, f"no usable credentials in it ({error})") from error


class Stores:
    """obstore stores, one per (scheme, bucket or host), built on first use.

    ``s3`` settings override the ``AWS_*`` environment where set (None: the
    environment only); ``anonymous`` sends unsigned S3 requests (public buckets).
    """

    def __init__(
        self, *, s3: S3Settings | None = None, anonymous: bool = False, transport: Transport | None = None
    ) -> None:
        self.s3 = s3
        self.anonymous = anonymous or bool(s3 is not None and s3.anonymous)
        self.transport = transport if transport is not None else Transport()
        self._stores: dict[tuple[str, str], ObjectStore] = {}
        self.heads: dict[str, dict[str, Any]] = {}
        """What :func:`head` found, by URL, kept for the life of these stores (one batch)."""

    def prefetch_heads(self, urls: Iterable[str], concurrency: int = 16) -> None:
        """HEAD ``urls`` ``concurrency`` at a time (round trips overlap), so :func:`head` answers from memory.

        The requests are obstore's asynchronous ones, on a daemon thread of their own that this thread waits for:
        Ctrl-C ends the wait even while a store stalls, and nothing waits for them at the end of the process.
        An object that cannot be reached is left out (:func:`head` asks again, and says why).
        """
        todo = sorted(set(urls) - set(self.heads))
        if todo:
            on_daemon_thread(lambda: asyncio.run(self._heads(todo, concurrency)), name="floe-heads").result()

    async def _heads(self, urls: list[str], concurrency: int) -> None:
        import obstore

        limit = asyncio.Semaphore(concurrency)

        async def one(url: str) -> None:
            with contextlib.suppress(RemoteError):
                store, path = self.locate(url)
                async with limit:
                    try:
                        meta = await obstore.head_async(store, path)
                    except Exception:  # noqa: BLE001 - asked again, and reported, by whoever needs it
                        return
                self.heads[url] = _described(meta)

        await asyncio.gather(*(one(url) for url in urls))

    def locate(self, url: str) -> tuple[ObjectStore, str]:
        """The store of ``url`` and the object's path in it.

        Raises:
            RemoteError: an unsupported scheme, a URL without bucket or host, or a store obstore refuses to build.
        """
        scheme = url_scheme(url)
        if scheme not in REMOTE_SCHEMES:
            raise RemoteError(url, f"unsupported URL scheme {scheme!r}: floe reads {SUPPORTED}")
        parsed = urlparse(url)
        if not parsed.netloc:
            what = "bucket" if scheme == "s3" else "host"
            raise RemoteError(url, f"names no {what}")
        if parsed.query and scheme == "s3":
            raise RemoteError(url, "an s3:// URL with a query string is not supported (objects are named by key)")
        if parsed.query:
            # A signed URL (S3 presigned, Azure SAS, a token): the query goes with every request, so the URL is
            # a store of its own, its one object at the empty path.
            store = self._stores.get((scheme, url))
            if store is None:
                try:
                    store = self._http_store(scheme, url)
                except Exception as error:
                    raise RemoteError(url, f"cannot set up a client for it ({describe(error)})") from error
                self._stores[(scheme, url)] = store
            return store, ""
        key = (scheme, parsed.netloc)
        store = self._stores.get(key)
        if store is None:
            try:
                store = self._s3_store(parsed.netloc) if scheme == "s3" else self._http_store(scheme, parsed.netloc)
            except RemoteError as error:
                raise RemoteError(url, f"{error.url}: {error.reason}") from error
            except Exception as error:
                raise RemoteError(url, f"cannot set up a client for it ({describe(error)})") from error
            self._stores[key] = store
        return store, unquote(parsed.path.lstrip("/"))

    def _s3_store(self, bucket: str) -> ObjectStore:
        settings = self.s3
        config: S3Config = {}
        credentials: _StaticCredentials | None = None
        options: dict[str, Any] = {**self.transport.client_options(), **_environment_client_options("AWS_")}
        if settings is not None:
            if settings.endpoint_url:
                config["endpoint"] = settings.endpoint_url
            if settings.region:
                config["region"] = settings.region
            if settings.force_path_style:
                config["virtual_hosted_style_request"] = False
            if settings.allow_http:
                options["allow_http"] = True
            if settings.access_key_id and settings.secret_access_key and not self.anonymous:
                credentials = _StaticCredentials(
                    settings.access_key_id, settings.secret_access_key, settings.session_token
                )
        if self.anonymous:
            config["skip_signature"] = True
        elif credentials is None and (profile := _aws_profile()) is not None:
            # obstore reads no ~/.aws files: a named profile's keys (and region) come through boto3.
            credentials, region = _profile_credentials(profile)
            if region and "region" not in config and not os.environ.get("AWS_REGION"):
                config["region"] = region
        return S3Store(
            bucket,
            config=config,
            client_options=options,  # type: ignore[arg-type] # values from the environment are strings
            retry_config=self.transport.retry_config(),
            credential_provider=credentials,
        )

    def _http_store(self, scheme: str, where: str) -> ObjectStore:
        """A store for a host (``where`` a host and port) or for one signed URL (``where`` the whole URL)."""
        options = self.transport.client_options()
        if scheme == "http":
            options["allow_http"] = True  # the URL asks for plain HTTP itself
        base = where if "://" in where else f"{scheme}://{where}/"
        return HTTPStore(base, client_options=options, retry_config=self.transport.retry_config())


def is_remote(href: str) -> bool:
    """Whether ``href`` names an object floe reads over the network (``s3://``, ``http(s)://``)."""
    return url_scheme(href) in REMOTE_SCHEMES


def head(stores: Stores, url: str) -> dict[str, Any]:
    """What identifies the object at ``url`` now: its size, ETag and last modification (one HEAD request).

    Recorded with the arrays copied from it, so a re-run copies it again only when it changed.

    Raises:
        RemoteError: it cannot be reached or does not exist.
    """
    import obstore

    known = stores.heads.get(url)
    if known is not None:
        return known
    store, path = stores.locate(url)
    try:
        meta = interruptible(lambda: obstore.head(store, path), name="floe-head")
    except Exception as error:
        raise RemoteError(url, describe(error)) from error
    described = stores.heads[url] = _described(meta)
    return described


def _described(meta: Any) -> dict[str, Any]:
    described: dict[str, Any] = {"size": int(meta["size"])}
    if meta.get("e_tag"):
        described["etag"] = str(meta["e_tag"])
    if meta.get("last_modified") is not None:
        described["last_modified"] = meta["last_modified"].isoformat()
    return described


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
    "GDAL_HTTP_MAX_RETRY": "4",
    "GDAL_HTTP_RETRY_DELAY": "0.5",
    "GDAL_HTTP_TIMEOUT": "60",
}


def gdal_options(s3: S3Settings | None = None, *, anonymous: bool = False) -> dict[str, str]:
    """GDAL configuration for reading ``s3://`` and ``http(s)://`` rasters, credentials included (never stored).

    ``s3`` settings win where set; otherwise GDAL reads the ``AWS_*``
    environment itself, except ``AWS_ENDPOINT_URL``, which GDAL spells
    ``AWS_S3_ENDPOINT`` (a host and port) with ``AWS_HTTPS``: it is translated.
    """
    options = dict(GDAL_REMOTE_OPTIONS)
    endpoint = (s3.endpoint_url if s3 is not None else None) or os.environ.get("AWS_ENDPOINT_URL")
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
    if anonymous or (s3 is not None and s3.anonymous):
        options["AWS_NO_SIGN_REQUEST"] = "YES"
    return options
