"""Virtual chunk containers: which local files a repository may reference instead of copying.

Icechunk reads a virtual chunk only through a *virtual chunk container* of
the repository's config whose URL prefix covers the chunk's location, and
only when whoever opens the repository authorizes that container. floe
references local files (``file:///...``) and gives each top-level directory
its own container (``file:///data/``): Icechunk refuses a container for the
bare root ``file:///``, and one container per source folder would make the
config grow with every archive.

floe authorizes the local-file containers recorded in a repository's config
whenever it opens it: floe adds them itself (:meth:`Repository.allow_virtual_sources`),
and a reader needs them to read the arrays at all.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlparse

import icechunk
from icechunk.credentials import AnyCredential

from ingest.storage import FILE_SCHEME

__all__ = ["container_prefix", "local_access", "missing_prefixes", "with_containers"]


def container_prefix(url: str) -> str:
    """The container covering a ``file://`` URL: its top-level directory, e.g. ``file:///data/``."""
    path = urlparse(url).path
    top = path.strip("/").split("/", 1)[0]
    if not top or path.rstrip("/") == "/" + top:
        raise ValueError(f"{url} is not a file below a top-level directory")
    return f"{FILE_SCHEME}/{top}/"


def _prefixes(config: icechunk.RepositoryConfig | None) -> set[str]:
    containers = (config.virtual_chunk_containers if config is not None else None) or {}
    return set(containers)


def local_access(config: icechunk.RepositoryConfig | None) -> dict[str, AnyCredential | None] | None:
    """Authorizations for every local-file container in ``config`` (None when it has none)."""
    prefixes = sorted(prefix for prefix in _prefixes(config) if prefix.startswith(FILE_SCHEME))
    if not prefixes:
        return None
    return {prefix: icechunk.credentials.LocalFileSystemAccess for prefix in prefixes}


def missing_prefixes(config: icechunk.RepositoryConfig | None, urls: Iterable[str]) -> list[str]:
    """The container prefixes ``urls`` need that ``config`` lacks."""
    known = _prefixes(config)
    needed = {container_prefix(url) for url in urls}
    return sorted(prefix for prefix in needed if not any(prefix.startswith(k) for k in known))


def with_containers(config: icechunk.RepositoryConfig | None, prefixes: Iterable[str]) -> icechunk.RepositoryConfig:
    """``config`` (or the default one) with a local-file container for each of ``prefixes``."""
    updated = config if config is not None else icechunk.RepositoryConfig.default()
    for prefix in prefixes:
        root = urlparse(prefix).path
        container = icechunk.VirtualChunkContainer(prefix, icechunk.local_filesystem_store(root))
        updated.set_virtual_chunk_container(container)
    return updated
