"""floe's STAC vocabulary: the ``floe:arrays`` asset that ties an item's row to its arrays.

An item whose rasters floe stored has one extra asset, ``floe:arrays``. Its
stored form (what the row keeps) names the item's Zarr group inside the
Icechunk repository, the variables in it, and which version of each source
raster the arrays were made from::

    {"href": "<collection>/<id>", "type": "application/vnd+zarr", "roles": ["data"],
     "floe:group": "<collection>/<id>", "floe:variables": [...],
     "floe:sources": {asset key: {"size", "mtime_ns", "blake2b"?}},   # optional
     "floe:virtual": true}                                               # referenced in place, not copied

Its served form (what the STAC API and ``floe search`` return) adds where the
repository is and which snapshot the response was read at, and points
``href`` at the repository, so a client can open the arrays of exactly that
version (``floe:repository``, ``floe:snapshot``, ``floe:group``). Neither form
is built or parsed anywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ARRAYS_ASSET = "floe:arrays"
ARRAYS_MEDIA_TYPE = "application/vnd+zarr"

_GROUP = "floe:group"
_VARIABLES = "floe:variables"
_SOURCES = "floe:sources"
_VIRTUAL = "floe:virtual"
_REPOSITORY = "floe:repository"
_SNAPSHOT = "floe:snapshot"


@dataclass(frozen=True)
class ArraysAsset:
    """The ``floe:arrays`` asset of a stored row, read."""

    group: str
    """The item's group in the Icechunk repository (``<collection>/<id>``)."""
    variables: list[str] = field(default_factory=list)
    sources: dict[str, dict[str, Any]] | None = None
    """Asset key -> size, mtime and (for copies) BLAKE2b of the raster the arrays were made from."""
    virtual: bool = False
    """The arrays reference the source files in place (reading them needs the files, unchanged)."""


def arrays_asset(
    group: str, variables: list[str], sources: dict[str, dict[str, Any]] | None = None, *, virtual: bool = False
) -> dict[str, Any]:
    """The stored ``floe:arrays`` asset of an item whose arrays are the group ``group``.

    The href is the group path inside the Icechunk repository; a server fills
    in the repository location and the snapshot id of the version it serves
    (:func:`served_arrays_asset`). ``sources`` records which version of each
    raster was copied (or, with ``virtual``, is referenced in place).
    """
    return {
        "href": group,
        "type": ARRAYS_MEDIA_TYPE,
        "roles": ["data"],
        "title": "Arrays of this item in the floe repository (Icechunk)",
        _GROUP: group,
        _VARIABLES: variables,
        **({_SOURCES: sources} if sources else {}),
        **({_VIRTUAL: True} if virtual else {}),
    }


def read_arrays_asset(item: dict[str, Any]) -> ArraysAsset | None:
    """The item's ``floe:arrays`` asset, or None when it has none (or one without a group)."""
    asset = (item.get("assets") or {}).get(ARRAYS_ASSET)
    if not isinstance(asset, dict):
        return None
    group = asset.get(_GROUP) or asset.get("href")
    if not isinstance(group, str):
        return None
    sources = asset.get(_SOURCES)
    variables = asset.get(_VARIABLES)
    return ArraysAsset(
        group=group.strip("/"),
        variables=list(variables) if isinstance(variables, list) else [],
        sources=sources if isinstance(sources, dict) else None,
        virtual=bool(asset.get(_VIRTUAL)),
    )


def has_arrays_asset(item: dict[str, Any]) -> bool:
    """Whether the item carries a ``floe:arrays`` asset at all (well-formed or not)."""
    assets = item.get("assets")
    return isinstance(assets, dict) and ARRAYS_ASSET in assets


def with_arrays_asset(item: dict[str, Any], asset: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``item`` whose ``floe:arrays`` asset is ``asset``."""
    return {**item, "assets": {**(item.get("assets") or {}), ARRAYS_ASSET: asset}}


def without_arrays_asset(item: dict[str, Any]) -> dict[str, Any]:
    """``item`` without its ``floe:arrays`` asset (the item as its source describes it)."""
    if not has_arrays_asset(item):
        return item
    return {**item, "assets": {key: value for key, value in item["assets"].items() if key != ARRAYS_ASSET}}


def served_arrays_asset(item: dict[str, Any], repository_url: str, snapshot_id: str) -> dict[str, Any]:
    """Turn the item's stored ``floe:arrays`` asset, in place, into the form a server returns; returns ``item``.

    ``href`` becomes the repository, and ``floe:repository``, ``floe:snapshot``
    and ``floe:group`` say where in it, at which version, the arrays are.
    """
    asset = (item.get("assets") or {}).get(ARRAYS_ASSET)
    if isinstance(asset, dict):
        asset[_SNAPSHOT] = snapshot_id
        asset[_REPOSITORY] = repository_url
        asset.setdefault(_GROUP, asset.get("href"))
        asset["href"] = repository_url
    return item
