"""Virtual chunk containers: which files and objects a repository may reference instead of copying.

floe gives each place its own container (:func:`container_prefix`: a local top-level directory, an S3 bucket, an
HTTP host, an Azure container) and authorizes every container a repository's config records whenever it opens it
(:func:`container_access`); credentials are given at open, never written into the config. Which places and which
credentials: docs/remote-sources.md#rasters-that-live-elsewhere-remote-assets-and-virtual.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import icechunk
from icechunk.credentials import AnyCredential

from ingest.remote import Buckets, is_remote, unsigned
from ingest.remote._buckets import s3_endpoint
from ingest.remote._tokens import BlobAddress, SasTokens, blob_address
from ingest.storage import FILE_SCHEME, Location, local_url

if TYPE_CHECKING:
    from ingest.config import S3Settings, Settings

__all__ = [
    "allow_sources",
    "authorizing",
    "container_access",
    "container_prefix",
    "missing_prefixes",
    "with_containers",
    "with_stored_config",
]

_REMOTE = ("s3", "http", "https", "az")


def container_prefix(url: str) -> str:
    """The container covering ``url``: ``file:///data/``, ``s3://bucket/`` or ``https://host:port/``.

    Raises ValueError for a local file not below a top-level directory, a
    URL without bucket or host, or another scheme.
    """
    parsed = urlparse(url)
    if parsed.scheme in _REMOTE:
        if not parsed.netloc:
            raise ValueError(f"{url} names no {'bucket' if parsed.scheme == 's3' else 'host'}")
        return f"{parsed.scheme}://{parsed.netloc}/"
    if parsed.scheme != "file":
        raise ValueError(f"{url}: floe references file://, s3:// and http(s):// sources only")
    path = parsed.path
    top = path.strip("/").split("/", 1)[0]
    if not top or path.rstrip("/") == "/" + top:
        raise ValueError(f"{url} is not a file below a top-level directory")
    return f"{FILE_SCHEME}/{top}/"


def _prefixes(config: icechunk.RepositoryConfig | None) -> set[str]:
    containers = (config.virtual_chunk_containers if config is not None else None) or {}
    return set(containers)


def _s3_credentials(prefix: str, s3: S3Settings | None, anonymous: Sequence[str]) -> Any:
    if (s3 is not None and s3.anonymous) or unsigned(prefix, anonymous):
        return icechunk.s3_anonymous_credentials()
    if s3 is not None and s3.access_key_id and s3.secret_access_key:
        return icechunk.s3_static_credentials(
            access_key_id=s3.access_key_id, secret_access_key=s3.secret_access_key, session_token=s3.session_token
        )
    return icechunk.s3_from_env_credentials()


class ContainerTokens:
    """Icechunk's credentials for an Azure container: its SAS token from ``tokens``' service, asked for when
    Icechunk's runs out (:meth:`~ingest.remote.SasTokens.lasting`). Picklable, as Icechunk keeps it (a repository
    handed to a Ray actor asks from there); the token itself is never stored."""

    def __init__(self, tokens: SasTokens, account: str, container: str) -> None:
        self.tokens, self.account, self.container = tokens, account, container

    def __call__(self) -> icechunk.AzureRefreshableCredential.SasToken:
        token, until = self.tokens.lasting(self.account, self.container)
        return icechunk.AzureRefreshableCredential.SasToken(token, expires_after=until)


def _azure_credentials(prefix: str, tokens: SasTokens | None) -> Any:
    parsed = urlparse(prefix)
    if tokens is None or tokens.service is None or not parsed.username or not parsed.hostname:
        return icechunk.azure_anonymous_credentials()  # a public container (or the reads are refused, saying so)
    getter = ContainerTokens(tokens, parsed.username, parsed.hostname)
    # icechunk annotates the getter as returning the outer class, not its SasToken (icechunk issue 2137).
    return icechunk.azure_credentials(get_credentials=getter)  # type: ignore[arg-type]


def authorizing(settings: Settings) -> tuple[S3Settings | None, list[str], SasTokens]:
    """What the containers of a repository opened with ``settings`` are authorized with (:func:`container_access`):
    floe's S3 settings where any is set (else the ``AWS_*`` environment's), the prefixes read unsigned, the SAS
    tokens of Azure containers."""
    return (settings.s3 if settings.s3.given() else None), settings.remote.anonymous, SasTokens.of(settings.remote)


def container_access(
    config: icechunk.RepositoryConfig | None,
    s3: S3Settings | None = None,
    anonymous: Sequence[str] = (),
    tokens: SasTokens | None = None,
) -> dict[str, AnyCredential | None] | None:
    """Authorizations for every container in ``config`` (None when it has none); ``s3`` as in :class:`Stores`,
    ``anonymous`` the ``s3://`` prefixes read unsigned (``remote.anonymous``: a bucket's container is unsigned
    when one covers the whole bucket), ``tokens`` the SAS tokens of Azure containers (``remote.sas_token_url``)."""
    access: dict[str, Any] = {}
    for prefix in sorted(_prefixes(config)):
        scheme = urlparse(prefix).scheme
        if scheme == "file":
            access[prefix] = icechunk.credentials.LocalFileSystemAccess
        elif scheme in ("http", "https"):
            access[prefix] = icechunk.credentials.HttpAccess
        elif scheme == "s3":
            access[prefix] = _s3_credentials(prefix, s3, anonymous)
        elif scheme == "az":
            access[prefix] = _azure_credentials(prefix, tokens)
    return icechunk.containers_credentials(access) if access else None


def missing_prefixes(config: icechunk.RepositoryConfig | None, urls: Iterable[str]) -> list[str]:
    """The container prefixes ``urls`` need that ``config`` lacks."""
    known = _prefixes(config)
    needed = {container_prefix(url) for url in urls}
    return sorted(prefix for prefix in needed if not any(prefix.startswith(k) for k in known))


def _s3_store(
    s3: S3Settings | None, bucket: str, buckets: Buckets
) -> icechunk.ObjectStoreConfig.S3Compatible | icechunk.ObjectStoreConfig.S3:
    """Where ``bucket``'s objects are read from: floe's settings where set, else the ``AWS_*`` environment; in
    the bucket's own region where ``buckets`` knows it, saying its requester pays where they say so."""
    endpoint = s3_endpoint(s3)
    region = (
        buckets.region(bucket)
        or (s3.region if s3 is not None else None)
        or os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
    )
    allow_http = bool(s3 is not None and s3.allow_http) or os.environ.get("AWS_ALLOW_HTTP", "").lower() == "true"
    allow_http = allow_http or bool(endpoint and endpoint.startswith("http://"))
    return icechunk.s3_store(
        region=region,
        endpoint_url=endpoint,
        allow_http=allow_http,
        s3_compatible=bool(endpoint),
        force_path_style=bool(endpoint) or bool(s3 is not None and s3.force_path_style),
        requester_pays=buckets.pays(f"s3://{bucket}/"),
    )


def with_containers(
    config: icechunk.RepositoryConfig | None,
    prefixes: Iterable[str],
    s3: S3Settings | None = None,
    buckets: Buckets | None = None,
    blobs: Mapping[str, BlobAddress] | None = None,
) -> icechunk.RepositoryConfig:
    """``config`` (or the default one) with a container for each of ``prefixes`` (see :func:`container_prefix`),
    a bucket's as ``buckets`` know it (its region, whether its requester pays; default: the region set for
    everything), an Azure container's at the endpoint of its blob in ``blobs`` (by prefix)."""
    updated = config if config is not None else icechunk.RepositoryConfig.default()
    buckets = buckets if buckets is not None else Buckets(find=False)
    for prefix in prefixes:
        parsed = urlparse(prefix)
        store: object
        if parsed.scheme == "s3":
            store = _s3_store(s3, parsed.netloc, buckets)
        elif parsed.scheme == "az":
            address = (blobs or {}).get(prefix)
            if address is None:
                raise ValueError(f"{prefix}: no blob URL says where its container's endpoint is")
            store = icechunk.storage.azure_store(account=address.account, config=address.store_config())
        elif parsed.scheme in ("http", "https"):
            store = icechunk.http_store({"allow_http": "true"} if parsed.scheme == "http" else None)
        else:
            store = icechunk.local_filesystem_store(parsed.path)
        updated.set_virtual_chunk_container(icechunk.VirtualChunkContainer(prefix, store))
    return updated


def with_stored_config(
    repo: icechunk.Repository,
    storage: icechunk.Storage,
    s3: S3Settings | None,
    anonymous: Sequence[str] = (),
    tokens: SasTokens | None = None,
) -> icechunk.Repository:
    """``repo`` reopened with the config stored now (containers other processes added), every container
    authorized."""
    stored = icechunk.Repository.fetch_config(storage)
    if stored is None:
        return repo
    access = container_access(stored, s3, anonymous, tokens)
    return repo.reopen(config=stored, authorize_virtual_chunk_access=access)


def allow_sources(
    repo: icechunk.Repository,
    location: Location,
    paths: Iterable[str | os.PathLike[str]],
    s3: S3Settings | None,
    anonymous: Sequence[str] = (),
    *,
    buckets: Buckets | None = None,
    tokens: SasTokens | None = None,
) -> tuple[icechunk.Repository, list[str]]:
    """``repo`` with containers covering ``paths`` (saved in its config, authorized; a bucket's as ``buckets``
    know it; a blob ``tokens`` sign, the Azure container of its account and name), and the prefixes added."""
    blobs: dict[str, BlobAddress] = {}
    urls = []
    for path in paths:
        url = str(path) if is_remote(str(path)) else local_url(path)
        address = blob_address(url, tokens.path_style) if tokens is not None and tokens.covers(url) else None
        if address is not None:
            blobs[address.virtual_prefix] = address
            url = address.virtual_url
        urls.append(url)
    if not missing_prefixes(repo.config, urls):
        return repo, []
    with location.mutation_lock():
        # Another process may have added containers meanwhile: merge into the stored config.
        stored = icechunk.Repository.fetch_config(location.icechunk_storage())
        added = missing_prefixes(stored, urls)
        config = with_containers(stored, added, s3, buckets, blobs)
        access = container_access(config, s3, anonymous, tokens)
        repo = repo.reopen(config=config, authorize_virtual_chunk_access=access)
        if added:
            repo.save_config()
    return repo, added
