"""A granule: one STAC item, where it came from, and the local rasters of it to copy into arrays."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from ingest.stac import ARRAYS_ASSET

RASTER_MEDIA_PREFIXES = ("image/tiff", "image/geotiff", "image/vnd.stac.geotiff")
RASTER_SUFFIXES = (".tif", ".tiff")


@dataclass(frozen=True)
class Granule:
    """What a worker needs to ingest one item: the item, its source label, and asset key -> local raster path."""

    item: dict[str, Any]
    source: str
    rasters: dict[str, str] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)


def describe_source(path: str | Path, *, digest: bool = True) -> dict[str, Any]:
    """Size, modification time and (with ``digest``) BLAKE2b digest of a raster, recorded with its arrays."""
    with open(path, "rb") as stream:
        status = os.fstat(stream.fileno())
        described: dict[str, Any] = {"size": status.st_size, "mtime_ns": status.st_mtime_ns}
        if digest:
            described["blake2b"] = hashlib.file_digest(stream, "blake2b").hexdigest()
    return described


def sources_unchanged(recorded: Any, rasters: dict[str, str], *, virtual: bool = False) -> bool:
    """Whether ``rasters`` (asset key -> path) are the files the arrays were made from.

    Size and modification time decide when they match (as rsync does: no
    read); a copied file touched but rewritten byte for byte is recognised by
    its digest, so regenerating an archive does not re-copy it. Arrays that
    reference their files in place (``virtual``) are stale after any
    modification, identical bytes or not: Icechunk refuses to read a file
    modified after the reference was written, so the granule must be
    referenced again.
    """
    if not isinstance(recorded, dict) or set(recorded) != set(rasters):
        return False
    for key, path in rasters.items():
        known = recorded[key]
        if not isinstance(known, dict):
            return False
        status = os.stat(path)
        if status.st_size != known.get("size"):
            return False
        if status.st_mtime_ns == known.get("mtime_ns"):
            continue
        if virtual or "blake2b" not in known or describe_source(path)["blake2b"] != known["blake2b"]:
            return False
    return True


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
    item: dict[str, Any], source: str, item_file: Path | None, assets: set[str] | None = None
) -> Granule:
    """Find the local raster assets of ``item`` (hrefs relative to the item's file); remote ones stay metadata.

    ``assets`` limits which keys are copied (None: every local raster). A
    selected asset whose local file does not exist is recorded in ``missing``
    so the granule can be rejected with that reason.
    """
    rasters: dict[str, str] = {}
    missing: dict[str, str] = {}
    base = item_file.parent if item_file is not None else None
    entries = item.get("assets")
    for key, asset in (entries if isinstance(entries, dict) else {}).items():
        if not isinstance(asset, dict) or key == ARRAYS_ASSET:
            continue
        if assets is not None and key not in assets:
            continue
        if assets is None and not _is_raster(asset):
            continue
        path = _local_path(str(asset.get("href") or ""), base)
        if path is None:
            continue
        if path.is_file():
            rasters[key] = str(path.resolve())
        else:
            missing[key] = str(path)
    return Granule(item=item, source=source, rasters=rasters, missing=missing)
