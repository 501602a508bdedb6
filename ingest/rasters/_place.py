"""Where a referenced COG's bytes are, and how to read them: a local file, or an ``s3://``/``http(s)://`` object.

``--virtual`` reads a granule's header with GDAL and its tile index with
obstore (virtual-tiff), then writes references Icechunk reads later. This
module finds the granule once for all of that (one ``stat``, or one HEAD)
and says what its references carry so that Icechunk refuses a changed source
(see ``_virtual.py``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from urllib.parse import quote, urlparse

from obspec_utils.registry import ObjectStoreRegistry
from obstore.store import LocalStore

from ingest.errors import InvalidRaster, NotVirtualizable
from ingest.rasters._opening import open_failure
from ingest.remote import RemoteError, Stores, gdal_path, head, is_remote
from ingest.remote._tokens import TokenError, blob_address
from ingest.storage import FILE_SCHEME, local_url

LOCAL_REGISTRY = ObjectStoreRegistry({FILE_SCHEME: LocalStore()})


@dataclass(frozen=True)
class Place:
    """Where an asset's bytes are, and how to read them: its URL, what GDAL opens, its size, the checksum
    its references carry (None: the moment they are written)."""

    url: str
    gdal_path: str
    size: int
    registry: ObjectStoreRegistry
    checksum: str | datetime | None = None


def locate(source: str, stores: Stores | None) -> Place:
    """Find the asset: a local file (stat) or a remote object (one HEAD, shared with the batch's fingerprints)."""
    if is_remote(source):
        if urlparse(source).query:
            raise NotVirtualizable(
                f"granule {source} cannot be referenced: a signed URL (query string) is not a stable location; "
                "it is copied",
                path=source,
            )
        stores = stores if stores is not None else Stores()
        if stores.tokens.covers(source):
            return _blob_place(source, stores)
        if stores.headers.for_url(source):
            raise NotVirtualizable(
                f"granule {source} cannot be referenced: its requests carry headers (remote.headers), which "
                "Icechunk's reads of virtual chunks cannot send; it is copied",
                path=source,
            )
        if stores.buckets.pays(source):
            # Icechunk's S3 virtual chunk reads send no x-amz-request-payer (icechunk 2.3,
            # icechunk/src/virtual_chunks.rs S3Fetcher::fetch_part), so such a bucket refuses them.
            raise NotVirtualizable(
                f"granule {source} cannot be referenced: its bucket's requester pays, and Icechunk's reads of "
                "virtual chunks cannot say so; it is copied",
                path=source,
            )
        try:
            described = head(stores, source)
            store, _path = stores.locate(source)
        except RemoteError as error:
            raise InvalidRaster(f"granule {source} cannot be read: {error.reason}", path=source) from error
        parsed = urlparse(source)
        # Icechunk refuses the chunks once the object changes: S3 gets the ETag (If-Match on every read). Icechunk
        # sends the ETag without its quotes, which HTTP servers that follow RFC 9110 (nginx, this test's) never
        # match, so an HTTP object gets its last modification instead (If-Unmodified-Since, whole seconds).
        checksum: str | datetime | None = described.get("etag") if parsed.scheme == "s3" else None
        if checksum is None and described.get("last_modified"):
            checksum = datetime.fromisoformat(described["last_modified"])
        registry = ObjectStoreRegistry({f"{parsed.scheme}://{parsed.netloc}": store})
        return Place(source, gdal_path(source), int(described["size"]), registry, checksum)
    if "://" in source and not source.startswith(FILE_SCHEME):
        raise NotVirtualizable(
            f"granule {source} cannot be referenced: floe references local files, s3:// and http(s):// objects",
            path=source,
        )
    try:
        url = local_url(source)
    except ValueError as exc:
        raise NotVirtualizable(f"granule {source} cannot be referenced: {exc}", path=source) from exc
    local_path = url[len(FILE_SCHEME) :]
    if not Path(local_path).is_file():
        raise InvalidRaster(open_failure(local_path, FileNotFoundError(local_path)), path=source)
    return Place(url, local_path, os.path.getsize(local_path), LOCAL_REGISTRY)


def _blob_place(source: str, stores: Stores) -> Place:
    """An Azure blob read with SAS tokens: referenced at ``az://{account}@{container}/{name}`` (Icechunk's Azure
    container, authorized with fresh tokens whenever the repository opens, :mod:`ingest.repository._containers`),
    read here through the container's store (signed as it goes) and by GDAL at the signed URL
    (:meth:`ingest.remote.GdalOptions.path`). The reference carries the blob's last modification: Icechunk's
    ``If-Unmodified-Since`` refuses a changed blob."""
    address = blob_address(source, stores.tokens.path_style)
    if address is None or not address.name or address.name.endswith("/"):
        raise NotVirtualizable(f"granule {source} cannot be referenced: it names no blob", path=source)
    if quote(address.name) != address.name:
        # Icechunk and obstore would each take the escaped name differently (untested either way): copied.
        raise NotVirtualizable(
            f"granule {source} cannot be referenced: its blob name has characters a reference must escape; "
            "it is copied",
            path=source,
        )
    try:
        described = head(stores, source)
        store = stores.blob_store(address)
    except RemoteError as error:
        raise InvalidRaster(f"granule {source} cannot be read: {error.reason}", path=source) from error
    modified = described.get("last_modified")
    checksum = datetime.fromisoformat(modified) if modified else None
    registry = ObjectStoreRegistry({address.virtual_prefix.rstrip("/"): store})
    try:
        signed = gdal_path(stores.tokens.sign(source))  # what GDAL opens now (its errors lose the query)
    except TokenError as error:
        raise InvalidRaster(f"granule {source} cannot be read: {error}", path=source) from error
    return Place(address.virtual_url, signed, int(described["size"]), registry, checksum)
