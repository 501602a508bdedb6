"""obstore stores for ``s3://`` and ``http(s)://`` URLs, their timeouts and retries, and the errors of remote
reads (see :mod:`ingest.remote`)."""

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
from ingest.remote._buckets import Buckets, under_prefix
from ingest.remote._headers import Headers
from ingest.remote._tokens import SasTokens, TokenError, redacted

if TYPE_CHECKING:
    from obstore.store import ClientConfig, ObjectStore, RetryConfig, S3Config, S3Credential

    from ingest.config import RemoteSettings, S3Settings, Settings

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


class RemoteError(Exception):
    """A remote object that could not be read: the URL and a short reason."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"{url}: {reason}")


_UNREACHABLE = ("timed out", "access denied", "not authenticated", "no such object", "no such bucket", "cannot connect")


def unreachable(reason: str) -> bool:
    """Whether :func:`describe`'s ``reason`` says the object cannot be reached at all (a timeout after the
    retries, a 403 or 401, a 404, no connection): another read of it would wait for the same answer."""
    return reason.startswith(_UNREACHABLE)


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
        return (
            f"not authenticated (HTTP 401{code_note}): give credentials (S3 keys, or --anonymous for a public "
            "bucket; for http(s), a header: --header or remote.headers)"
        )
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
    if (known := _store_refusal(lowered, code.group(1) if code else None)) is not None:
        return known
    if "builder error" in lowered and "http://" in lowered:
        return "an http:// endpoint needs allow_http (FLOE_S3__ALLOW_HTTP=true or AWS_ALLOW_HTTP=true)"
    if status := _STATUS.search(text):
        return f"HTTP {status.group(1)}{code_note}{after}"
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return redacted(first)[:300]


def _store_refusal(lowered: str, code: str | None) -> str | None:
    """What to do about a store's refusal that settings answer, from its error text (lower case) and code."""
    if "redirect without location" in lowered or "permanentredirect" in lowered:
        # What AWS answers a request signed for another region than the bucket's (obstore follows no redirect).
        return (
            "the bucket is in another region than the one requests were signed for: name its region in "
            "remote.regions (FLOE_REMOTE__REGIONS)"
        )
    if code == "PublicAccessNotPermitted":
        # Azure's answer (409) to an unsigned read of a storage account that allows none (Planetary Computer's).
        return (
            "the storage account allows no anonymous reads (HTTP 409, PublicAccessNotPermitted): its blobs need a "
            "SAS token (floe ingest --planetary-computer, or remote.sas_token_url)"
        )
    return None


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
    """obstore stores, one per (scheme, bucket or host, signed or not), built on first use.

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
            raise RemoteError(url, f"unsupported URL scheme {scheme!r}: floe reads {SUPPORTED}")
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

    def _s3_store(self, bucket: str, *, anonymous: bool, paying: bool = False) -> ObjectStore:
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
            if settings.access_key_id and settings.secret_access_key and not anonymous:
                credentials = _StaticCredentials(
                    settings.access_key_id, settings.secret_access_key, settings.session_token
                )
        if (bucket_region := self.buckets.region(bucket)) is not None:
            config["region"] = bucket_region
        if paying:
            config["request_payer"] = True
        if anonymous:
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
