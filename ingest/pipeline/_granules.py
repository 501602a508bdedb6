"""A granule: one STAC item, where it came from, and the rasters of it to copy into arrays.

Rasters are local files, or, with ``remote``, objects at ``s3://`` and
``http(s)://`` URLs (read through GDAL's virtual file systems, fingerprinted
by one HEAD request: size, ETag, last modification).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from ingest.remote import RemoteError, Stores, head, is_remote
from ingest.stac import ARRAYS_ASSET

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

RASTER_MEDIA_PREFIXES = ("image/tiff", "image/geotiff", "image/vnd.stac.geotiff")
RASTER_SUFFIXES = (".tif", ".tiff")


@dataclass(slots=True)
class Granule:
    """What a worker needs to ingest one item: the item, its source label, and asset key -> raster path or URL.

    Made for every item, so not frozen (as :class:`~ingest.pipeline.sources.SourcedItem`).
    """

    item: dict[str, Any]
    source: str
    rasters: dict[str, str] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class RowsGranule:
    """Many granules without rasters that travel as floe's rows (``SourcedRows``), each checked already: what a
    metadata-only ingest makes of a run of a stac-geoparquet file's rows. A batch counts each row (:func:`weight`)."""

    rows: pa.Table
    """floe's rows, not yet in the table's sort order."""
    prefix: str
    """What each row's label starts with (``file#row``)."""
    numbers: np.ndarray
    """Each row's number: its label is ``prefix`` and its number."""

    def __len__(self) -> int:
        return self.rows.num_rows

    @property
    def sources(self) -> list[str]:
        """Each row's label."""
        return [f"{self.prefix}{number}" for number in self.numbers.tolist()]

    def source(self, index: int) -> str:
        """The label of row ``index``."""
        return f"{self.prefix}{self.numbers[index]}"

    def taken(self, indices: list[int] | np.ndarray) -> RowsGranule:
        """Only the rows at ``indices``, in that order (none: an empty granule)."""
        import numpy as np

        positions = np.asarray(indices, dtype=np.int64)  # an empty list would be taken as nulls, not positions
        return RowsGranule(self.rows.take(positions), self.prefix, self.numbers[positions])

    def keys(self) -> list[tuple[str, str]]:
        """(collection, id) of each row."""
        return list(zip(self.rows.column("collection").to_pylist(), self.rows.column("id").to_pylist(), strict=True))

    def split(self, at: int) -> tuple[RowsGranule, RowsGranule]:
        """The first ``at`` rows, and the rest."""
        return (
            RowsGranule(self.rows.slice(0, at), self.prefix, self.numbers[:at]),
            RowsGranule(self.rows.slice(at), self.prefix, self.numbers[at:]),
        )


type AnyGranule = Granule | RowsGranule
"""What the granule stream yields: a granule, or many as rows."""


def weight(granule: AnyGranule) -> int:
    """How many items a granule stands for in a batch."""
    return len(granule) if isinstance(granule, RowsGranule) else 1


def collections_of(granules: list[AnyGranule]) -> set[str]:
    """The collections of a batch's granules."""
    found: set[str] = set()
    for granule in granules:
        if isinstance(granule, RowsGranule):
            found.update(granule.rows.column("collection").unique().to_pylist())
        else:
            found.add(granule.item["collection"])
    return found


def describe_source(path: str | Path, *, digest: bool = True, stores: Stores | None = None) -> dict[str, Any]:
    """Size, modification time and (with ``digest``) BLAKE2b digest of a raster, recorded with its arrays.

    A remote raster is described by a HEAD request instead (size, ETag, last
    modification): reading it whole for a digest would double what a copy moves.

    Raises:
        OSError: a local file cannot be read.
        RemoteError: a remote one cannot be reached.
    """
    if isinstance(path, str) and is_remote(path):
        return head(stores if stores is not None else Stores(), path)
    with open(path, "rb") as stream:
        status = os.fstat(stream.fileno())
        described: dict[str, Any] = {"size": status.st_size, "mtime_ns": status.st_mtime_ns}
        if digest:
            described["blake2b"] = hashlib.file_digest(stream, "blake2b").hexdigest()
    return described


def sources_unchanged(
    recorded: Any, rasters: dict[str, str], *, virtual: bool = False, stores: Stores | None = None
) -> bool:
    """Whether ``rasters`` (asset key -> path) are the files the arrays were made from.

    Size and modification time decide when they match (as rsync does: no
    read); a copied file touched but rewritten byte for byte is recognised by
    its digest, so regenerating an archive does not re-copy it. Arrays that
    reference their files in place (``virtual``) are stale after any
    modification, identical bytes or not: Icechunk refuses to read a file
    modified after the reference was written, so the granule must be
    referenced again. A remote raster is unchanged when its ETag is the one
    recorded (or, without one, its size and last modification).
    """
    if not isinstance(recorded, dict) or set(recorded) != set(rasters):
        return False
    for key, path in rasters.items():
        known = recorded[key]
        if not isinstance(known, dict):
            return False
        if is_remote(path):
            if not _remote_unchanged(known, path, stores):
                return False
            continue
        status = os.stat(path)
        if status.st_size != known.get("size"):
            return False
        if status.st_mtime_ns == known.get("mtime_ns"):
            continue
        if virtual or "blake2b" not in known or describe_source(path)["blake2b"] != known["blake2b"]:
            return False
    return True


def _remote_unchanged(known: dict[str, Any], url: str, stores: Stores | None) -> bool:
    try:
        now = head(stores if stores is not None else Stores(), url)
    except RemoteError:
        return False  # copied again: the read says why it cannot be
    if known.get("etag") and now.get("etag"):
        return bool(known["etag"] == now["etag"])
    return bool(known.get("size") == now["size"] and known.get("last_modified") == now.get("last_modified"))


def _is_raster(asset: dict[str, Any]) -> bool:
    media = str(asset.get("type") or "").lower()
    href = str(asset.get("href") or "").lower().split("?")[0]
    return media.startswith(RASTER_MEDIA_PREFIXES) or href.endswith(RASTER_SUFFIXES)


def _local_path(href: str, base: Path | None) -> Path | None:
    """The local file an href names, or None for remote hrefs (s3://, https://, ...)."""
    parsed = urlparse(href)
    if parsed.scheme in ("", "file") or (len(parsed.scheme) == 1 and href[1:3] in (":\\", ":/")):
        path = Path(unquote(parsed.path if parsed.scheme == "file" else href))
        if not path.is_absolute() and base is not None:
            path = base / path
        return path
    return None


def select_assets(selection: str) -> set[str] | None:
    """Parse ``--assets``: ``all`` -> None (every local raster), ``none`` -> empty, else the listed keys."""
    selection = selection.strip()
    if selection == "all":
        return None
    if selection == "none":
        return set()
    return {key.strip() for key in selection.split(",") if key.strip()}


def granule_from_item(
    item: dict[str, Any],
    source: str,
    item_file: Path | None,
    assets: set[str] | None = None,
    *,
    remote: bool = False,
) -> Granule:
    """Find the raster assets of ``item`` (local hrefs relative to the item's file).

    Remote rasters (``s3://``, ``http(s)://``) are taken only with ``remote``;
    without it they stay metadata. A selected asset whose local file does not
    exist is recorded in ``missing`` so the granule can be rejected with that
    reason (a remote one that does not exist is rejected when it is read). The
    item's own ``floe:arrays`` asset is never taken. No file is opened.

    Args:
        item: the STAC item, as a dict.
        source: where the item came from (its label in rejections).
        item_file: the file the item was read from; relative hrefs resolve against its folder (None: against the
            working directory).
        assets: the asset keys to copy (default: every raster asset, by its media type or a ``.tif``/``.tiff``
            href).
        remote: take rasters at ``s3://`` and ``http(s)://`` URLs too.

    Returns:
        The granule: the item, its source, ``rasters`` (asset key -> absolute local path or URL) and ``missing``
        (asset key -> the local path that does not exist).
    """
    rasters: dict[str, str] = {}
    missing: dict[str, str] = {}
    base = item_file.parent if item_file is not None else None
    entries = item.get("assets")
    for key, asset in (entries if isinstance(entries, dict) else {}).items():
        if not isinstance(asset, dict) or key == ARRAYS_ASSET:
            continue
        href = str(asset.get("href") or "")
        # A remote href without ``remote`` stays metadata whatever it is: asked first, since every asset of an
        # API's items is one (no media type read, no URL parsed: a tenth of a metadata-only driver's time).
        far = is_remote(href)
        if far and not remote:
            continue
        if assets is not None and key not in assets:
            continue
        if assets is None and not _is_raster(asset):
            continue
        if far:
            rasters[key] = href
            continue
        path = _local_path(href, base)
        if path is None:
            continue
        if path.is_file():
            rasters[key] = str(path.resolve())
        else:
            missing[key] = str(path)
    return Granule(item=item, source=source, rasters=rasters, missing=missing)
