"""obstore stores for ``s3://`` and ``http(s)://`` URLs, their timeouts and retries (see :mod:`ingest.remote`;
their errors: :mod:`ingest.remote._errors`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urljoin, urlparse, uses_relative

from obstore.store import AzureStore, HTTPStore, S3Store

from ingest._threads import interruptible, on_daemon_thread
from ingest.errors import InvalidSource
from ingest.remote._buckets import Buckets, under_prefix
from ingest.remote._credentials import StaticCredentials, aws_profile, environment_client_options, profile_credentials
from ingest.remote._errors import RemoteError, describe
from ingest.remote._headers import Headers
from ingest.remote._tokens import BlobAddress, SasTokens, TokenError

if TYPE_CHECKING:
    from obstore.store import AzureConfig, ClientConfig, ObjectStore, RetryConfig, S3Config

    from ingest.config import RemoteSettings, S3Settings, Settings

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+)://")


def url_scheme(source: str) -> str | None:
    """The scheme of ``source`` if it is a URL (``scheme://...``, lower case), else None (a local path)."""
    match = _URL.match(source)
    return match.group(1).lower() if match else None


REMOTE_SCHEMES = ("s3", "http", "https")
"""URL schemes read through obstore (``file://`` URLs are read as local paths)."""

SUPPORTED = "s3://, http://, https:// and file:// URLs (or local paths)"


@dataclass(frozen=True)
class Transport:
    """Timeouts, retries and chunk sizes of remote reads, from the ``remote.*`` settings (:meth:`of`).

    obstore retries transient failures (connection errors, 5xx, timeouts of reads) with exponential backoff and
    jitter: ``max_retries`` attempts more, waits from ``initial_backoff`` doubling up to ``max_backoff``, never past
    ``retry_timeout``. What still fails is a :class:`~ingest.remote.RemoteError` with a short reason
    (:func:`~ingest.remote.describe`).
    """

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

    @classmethod
    def of(cls, remote: RemoteSettings) -> Transport:
        """The timeouts and retries ``remote`` (``FLOE_REMOTE__*``) sets."""
        return cls(
            connect_timeout=timedelta(seconds=remote.connect_timeout_s),
            read_timeout=timedelta(seconds=remote.read_timeout_s),
            max_retries=remote.retries,
            retry_timeout=timedelta(seconds=remote.retry_timeout_s),
        )

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


def unsigned(url: str, prefixes: Iterable[str]) -> bool:
    """Whether ``url`` is an ``s3://`` URL under one of the anonymous ``prefixes`` (read without signing)."""
    return under_prefix(url, prefixes)


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


class Stores:
    """obstore stores, one per (scheme, bucket or host, signed or not), built on first use and kept for the life of
    this object: a bucket read both signed and unsigned (a public prefix of it, ``remote.anonymous``) has one of each.
    ``http(s)://`` is plain GETs, with no listing; a URL with a query string (a presigned or SAS URL) is a store of
    its own, so the query goes with every request.

    ``s3`` settings override the ``AWS_*`` environment where set (None: the
    environment only). ``anonymous`` sends unsigned S3 requests (public
    buckets): True for every bucket, or the ``s3://`` prefixes to read so.
    """

    def __init__(
        self,
        *,
        s3: S3Settings | None = None,
        anonymous: bool | Iterable[str] = False,
        transport: Transport | None = None,
        buckets: Buckets | None = None,
        tokens: SasTokens | None = None,
        headers: Headers | None = None,
    ) -> None:
        self.s3 = s3
        every = anonymous is True or bool(s3 is not None and s3.anonymous)
        prefixes = () if isinstance(anonymous, bool) else tuple(anonymous)
        self.anonymous: tuple[str, ...] = ("s3://",) if every else prefixes
        """The ``s3://`` prefixes read unsigned (``("s3://",)``: every bucket)."""
        self.transport = transport if transport is not None else Transport()
        self.buckets = buckets if buckets is not None else Buckets.of(s3, None)
        """Each bucket's region, and whose requester pays (:mod:`ingest.remote._buckets`)."""
        self.tokens = tokens if tokens is not None else SasTokens()
        """The SAS tokens Azure blob URLs are read with (:mod:`ingest.remote._tokens`)."""
        self.headers = headers if headers is not None else Headers()
        """The headers http(s) requests carry, by URL prefix (:mod:`ingest.remote._headers`)."""
        self._stores: dict[tuple[str, str], ObjectStore] = {}
        self.heads: dict[str, dict[str, Any]] = {}
        """What :func:`head` found, by URL, kept for the life of these stores (one batch)."""
        self._once: Stores | None = None

    def asking_once(self) -> Stores:
        """These stores, each request made once (no retries): for a read that only explains a failure GDAL met
        after its own retries, which would wait as long again for the same answer."""
        if self._once is None:
            self._once = Stores(
                s3=self.s3,
                anonymous=self.anonymous,
                transport=replace(self.transport, max_retries=0),
                buckets=self.buckets,
                tokens=self.tokens,
                headers=self.headers,
            )
        return self._once

    @classmethod
    def of(cls, settings: Settings, *, anonymous: bool = False) -> Stores:
        """Stores as ``settings`` say: their S3 keys and endpoint where set (else the environment), the
        prefixes of ``remote.anonymous`` (every bucket with ``anonymous``), their timeouts and retries."""
        return cls.reaching(settings.s3 if settings.s3.given() else None, settings.remote, anonymous=anonymous)

    @classmethod
    def reaching(cls, s3: S3Settings | None, remote: RemoteSettings | None, *, anonymous: bool = False) -> Stores:
        """:meth:`of` from its parts (None: the environment's keys; the defaults of ``remote``)."""
        return cls(
            s3=s3,
            anonymous=True if anonymous else (remote.anonymous if remote is not None else ()),
            transport=Transport.of(remote) if remote is not None else None,
            buckets=Buckets.of(s3, remote),
            tokens=SasTokens.of(remote),
            headers=Headers.of(remote),
        )

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
            raise RemoteError(url, f"unsupported URL scheme {scheme!r}: floe reads {SUPPORTED}{_azure_hint(url)}")
        parsed = urlparse(url)
        if not parsed.netloc:
            what = "bucket" if scheme == "s3" else "host"
            raise RemoteError(url, f"names no {what}")
        if parsed.query and scheme == "s3":
            raise RemoteError(url, "an s3:// URL with a query string is not supported (objects are named by key)")
        signed = url
        if self.tokens.covers(url):
            try:
                signed = self.tokens.sign(url)
            except TokenError as error:
                raise RemoteError(url, str(error)) from error
        path = unquote(parsed.path.lstrip("/"))
        if scheme == "s3":
            return self.bucket_store(parsed.netloc, path, url=url), path
        headers = self.headers.for_url(url)
        # A signed URL (S3 presigned, Azure SAS, a token): the query goes with every request, so the URL is a
        # store of its own, its one object at the empty path. Else one store per host and set of headers.
        where, path = (signed, "") if signed != url or parsed.query else (parsed.netloc, path)
        key = (scheme, where + "#" + repr(sorted(headers.items())) if headers else where)
        store = self._stores.get(key)
        if store is None:
            try:
                store = self._http_store(scheme, where, headers)
            except Exception as error:
                raise RemoteError(url, f"cannot set up a client for it ({describe(error)})") from error
            self._stores[key] = store
        return store, path

    def bucket_store(self, bucket: str, key: str, *, url: str | None = None) -> ObjectStore:
        """The store that reads the object ``key`` of ``bucket``: unsigned under an anonymous prefix, else signed
        (and saying its requester pays under such a prefix); one of each kind per bucket. ``url`` names the
        object in errors (default: ``s3://bucket/key``).

        Raises:
            RemoteError: obstore refuses to build the store, or an AWS profile holds no usable credentials.
        """
        url = url if url is not None else f"s3://{bucket}/{key}"
        anonymous = unsigned(f"s3://{bucket}/{key}", self.anonymous)
        paying = not anonymous and self.buckets.pays(f"s3://{bucket}/{key}")
        cache_key = ("s3", bucket + ("#unsigned" if anonymous else "") + ("#paying" if paying else ""))
        store = self._stores.get(cache_key)
        if store is None:
            try:
                store = self._s3_store(bucket, anonymous=anonymous, paying=paying)
            except RemoteError as error:
                raise RemoteError(url, f"{error.url}: {error.reason}") from error
            except Exception as error:
                raise RemoteError(url, f"cannot set up a client for it ({describe(error)})") from error
            self._stores[cache_key] = store
        return store

    def blob_store(self, address: BlobAddress) -> ObjectStore:
        """The store of an Azure container (listing a folder of it, reading what is listed): signed with its SAS
        tokens (:class:`SasTokens`, renewed as they near expiry) where a token service is set, else unsigned (a
        public container). One per container.

        Raises:
            RemoteError: obstore refuses to build the store.
        """
        signed = self.tokens.service is not None
        key = ("azure", address.container_url + ("#signed" if signed else ""))
        store = self._stores.get(key)
        if store is None:
            options = self.transport.client_options()
            if address.endpoint.startswith("http://"):
                options["allow_http"] = True  # a path-style host the settings name with plain HTTP (Azurite)
            if headers := self.headers.for_url(address.container_url + "/"):
                options["default_headers"] = dict(headers)
            config: AzureConfig = {"account_name": address.account, "endpoint": address.endpoint}
            if not signed:
                config["skip_signature"] = True
            try:
                store = AzureStore(
                    address.container,
                    config=config,
                    client_options=options,
                    retry_config=self.transport.retry_config(),
                    credential_provider=(
                        self.tokens.provider(address.account, address.container) if signed else None  # type: ignore[arg-type]
                    ),
                )
            except Exception as error:
                raise RemoteError(
                    address.container_url, f"cannot set up a client for it ({describe(error)})"
                ) from error
            self._stores[key] = store
        return store

    def _s3_store(self, bucket: str, *, anonymous: bool, paying: bool = False) -> ObjectStore:
        settings = self.s3
        config: S3Config = {}
        credentials: StaticCredentials | None = None
        options: dict[str, Any] = {**self.transport.client_options(), **environment_client_options("AWS_")}
        if settings is not None:
            if settings.endpoint_url:
                config["endpoint"] = settings.endpoint_url
            if settings.region:
                config["region"] = settings.region
            if settings.force_path_style:
                config["virtual_hosted_style_request"] = False
            if settings.allow_http:
                options["allow_http"] = True
            if settings.access_key_id and settings.secret_access_key and not anonymous:
                credentials = StaticCredentials(
                    settings.access_key_id, settings.secret_access_key, settings.session_token
                )
        if (bucket_region := self.buckets.region(bucket)) is not None:
            config["region"] = bucket_region
        if paying:
            config["request_payer"] = True
        if anonymous:
            config["skip_signature"] = True
        elif credentials is None and (profile := aws_profile()) is not None:
            # obstore reads no ~/.aws files: a named profile's keys (and region) come through boto3.
            credentials, region = profile_credentials(profile)
            if region and "region" not in config and not os.environ.get("AWS_REGION"):
                config["region"] = region
        return S3Store(
            bucket,
            config=config,
            client_options=options,  # type: ignore[arg-type] # values from the environment are strings
            retry_config=self.transport.retry_config(),
            credential_provider=credentials,
        )

    def _http_store(self, scheme: str, where: str, headers: dict[str, str] | None = None) -> ObjectStore:
        """A store for a host (``where`` a host and port) or for one signed URL (``where`` the whole URL), whose
        requests carry ``headers``."""
        options = self.transport.client_options()
        if scheme == "http":
            options["allow_http"] = True  # the URL asks for plain HTTP itself
        if headers:
            options["default_headers"] = dict(headers)
        base = where if "://" in where else f"{scheme}://{where}/"
        return HTTPStore(base, client_options=options, retry_config=self.transport.retry_config())


AZURE_SCHEMES = ("az", "abfs", "abfss", "adl", "azure")
_DFS_HOST = re.compile(r"^([a-z0-9-]+)@([a-z0-9]{3,24})\.dfs\.core\.windows\.net$")


def _azure_hint(url: str) -> str:
    """What to name instead of an fsspec-style Azure URL (``abfs://container/path``, as Planetary Computer's
    collections give their stac-geoparquet items): the blob's https:// URL."""
    scheme = url_scheme(url)
    if scheme not in AZURE_SCHEMES:
        return ""
    parsed = urlparse(url)
    if match := _DFS_HOST.match(parsed.netloc.lower()):
        container, account = match.groups()
        return f"; name it https://{account}.blob.core.windows.net/{container}{parsed.path}"
    return (
        f"; name it https://ACCOUNT.blob.core.windows.net/{parsed.netloc}{parsed.path}, with the storage account"
        " the catalogue gives (Planetary Computer's: the collection's table:storage_options account_name, such as"
        " pcstacitems)"
    )


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


def first_bytes(stores: Stores, url: str, count: int) -> bytes:
    """The first ``count`` bytes of the object at ``url`` (one range request, retried as any).

    Raises:
        RemoteError: it cannot be reached, does not exist, or is empty.
    """
    import obstore

    store, path = stores.locate(url)
    try:
        return bytes(interruptible(lambda: obstore.get_range(store, path, start=0, length=count), name="floe-range"))
    except Exception as error:
        raise RemoteError(url, describe(error)) from error


def _described(meta: Any) -> dict[str, Any]:
    described: dict[str, Any] = {"size": int(meta["size"])}
    if meta.get("e_tag"):
        described["etag"] = str(meta["e_tag"])
    if meta.get("last_modified") is not None:
        described["last_modified"] = meta["last_modified"].isoformat()
    return described
