"""floe's STAC vocabulary: the ``floe:arrays`` asset that ties an item's row to its arrays.

:func:`arrays_asset` builds its stored form and :func:`read_arrays_asset` reads it (``ingest.stac._served`` makes
its served form); neither form is built or parsed anywhere else, and the names of the stack layout's nodes are
defined here too, since the asset refers to them. The asset's fields: docs/pixels.md#reading-without-floe.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ARRAYS_ASSET = "floe:arrays"
ARRAYS_MEDIA_TYPE = "application/vnd+zarr"

ARRAYS_LAYOUT = 2
"""The array layout this version of floe writes and reads (1: one group per item, before stacks)."""
LAYOUT_ATTR = "floe:arrays-layout"
"""The root group's attribute recording the array layout of a repository."""
TILING_ATTR = "floe:arrays-tiling"
"""The root group's attribute recording the ``tile`` and ``chunk`` (pixels) a repository's stacks were cut with
when it was created: they hold for its whole life, whatever the settings of a later run say."""
STACKS = "stacks"
"""A collection's stacks live under ``<collection>/stacks/``."""
SLOT = "slot"
"""The stack axis: one slot per granule."""
ITEM = "item"
"""A stack's coordinate on the slot axis: the item id of each slot (``""`` when free)."""
DATETIME = "datetime"
"""A stack's coordinate on the slot axis: the item's datetime (microseconds since 1970, CF-encoded)."""

_LAYOUT = "floe:layout"
_GROUP = "floe:group"
_VARIABLES = "floe:variables"
_PIECES = "floe:pieces"
_SOURCES = "floe:sources"
_VIRTUAL = "floe:virtual"


@dataclass
class Piece:
    """One window of one asset's pixels, in one slot of one stack array."""

    stack: str
    array: str
    window: tuple[int, int, int, int]
    """Row, column, height and width of the window in the stack's grid."""
    at: tuple[int, int]
    """Row and column of the window's first pixel in the granule."""
    slot: int = -1
    """The slot on the stack axis (-1 until the writer assigns one)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "stack": self.stack,
            "array": self.array,
            "slot": self.slot,
            "window": list(self.window),
            "at": list(self.at),
        }

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> Piece:
        row, column, height, width = (int(value) for value in document["window"])
        at_row, at_column = (int(value) for value in document["at"])
        return cls(
            str(document["stack"]),
            str(document["array"]),
            (row, column, height, width),
            (at_row, at_column),
            int(document["slot"]),
        )


@dataclass
class AssetPixels:
    """Where one asset's pixels are: its own grid, and the pieces that hold them."""

    crs: str
    transform: tuple[float, float, float, float, float, float]
    shape: tuple[int, int, int]
    """Bands, height and width of the asset."""
    pieces: list[Piece]

    def to_json(self) -> dict[str, Any]:
        return {
            "crs": self.crs,
            "transform": list(self.transform),
            "shape": list(self.shape),
            "pieces": [piece.to_json() for piece in self.pieces],
        }

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> AssetPixels:
        a, b, c, d, e, f = (float(value) for value in document["transform"])
        bands, height, width = (int(value) for value in document["shape"])
        return cls(
            str(document["crs"]),
            (a, b, c, d, e, f),
            (bands, height, width),
            [Piece.from_json(piece) for piece in document["pieces"]],
        )


@dataclass(frozen=True)
class ArraysAsset:
    """The ``floe:arrays`` asset of a stored row, read."""

    layout: int
    """The array layout it was written with (1: a group per item, which this floe no longer reads)."""
    variables: list[str] = field(default_factory=list)
    pixels: dict[str, AssetPixels] = field(default_factory=dict)
    """Asset key -> where its pixels are (layout 2)."""
    sources: dict[str, dict[str, Any]] | None = None
    """Asset key -> size, mtime and (for copies) BLAKE2b of the raster the arrays were made from."""
    virtual: bool = False
    """The arrays reference the source files in place (reading them needs the files, unchanged)."""
    group: str | None = None
    """Layout 1 only: the item's own group."""

    def pieces(self) -> list[Piece]:
        """Every piece of every asset."""
        return [piece for pixels in self.pixels.values() for piece in pixels.pieces]


def arrays_asset(
    pixels: Mapping[str, AssetPixels],
    sources: dict[str, dict[str, Any]] | None = None,
    *,
    virtual: bool = False,
) -> dict[str, Any]:
    """The stored ``floe:arrays`` asset of an item whose assets' pixels are ``pixels`` (asset key -> where).

    A server fills in the repository location and the snapshot id of the
    version it serves (:func:`served_arrays_asset`). ``sources`` records which
    version of each raster was copied (or, with ``virtual``, is referenced in
    place).
    """
    if not pixels:
        raise ValueError("an arrays asset needs at least one asset's pixels")
    first = next(iter(pixels.values()))
    return {
        "href": first.pieces[0].stack if first.pieces else "",
        "type": ARRAYS_MEDIA_TYPE,
        "roles": ["data"],
        "title": "Arrays of this item in the floe repository (Icechunk)",
        _LAYOUT: ARRAYS_LAYOUT,
        _VARIABLES: sorted(pixels),
        _PIECES: {key: where.to_json() for key, where in pixels.items()},
        **({_SOURCES: sources} if sources else {}),
        **({_VIRTUAL: True} if virtual else {}),
    }


def read_arrays_asset(item: dict[str, Any]) -> ArraysAsset | None:
    """The item's ``floe:arrays`` asset, or None when it has none (or one floe cannot read)."""
    asset = (item.get("assets") or {}).get(ARRAYS_ASSET)
    if not isinstance(asset, dict):
        return None
    sources = asset.get(_SOURCES)
    variables = asset.get(_VARIABLES)
    common: dict[str, Any] = {
        "variables": list(variables) if isinstance(variables, list) else [],
        "sources": sources if isinstance(sources, dict) else None,
        "virtual": bool(asset.get(_VIRTUAL)),
    }
    if asset.get(_LAYOUT) is None:
        group = asset.get(_GROUP) or asset.get("href")
        return ArraysAsset(layout=1, group=group.strip("/"), **common) if isinstance(group, str) else None
    pieces = asset.get(_PIECES)
    if asset.get(_LAYOUT) != ARRAYS_LAYOUT or not isinstance(pieces, dict):
        return None
    try:
        pixels = {str(key): AssetPixels.from_json(where) for key, where in pieces.items()}
    except (KeyError, TypeError, ValueError):
        return None
    return ArraysAsset(layout=ARRAYS_LAYOUT, pixels=pixels, **common)


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


def moved_slots(item: dict[str, Any], moves: Mapping[tuple[str, int], int]) -> dict[str, Any]:
    """A copy of ``item`` whose pieces at (stack, slot) keys of ``moves`` are at the new slots."""
    asset = (item.get("assets") or {}).get(ARRAYS_ASSET)
    if not isinstance(asset, dict) or not isinstance(asset.get(_PIECES), dict):
        return item
    pieces = {
        key: {
            **where,
            "pieces": [
                {**piece, "slot": moves.get((piece["stack"], piece["slot"]), piece["slot"])}
                for piece in where["pieces"]
            ],
        }
        for key, where in asset[_PIECES].items()
    }
    return with_arrays_asset(item, {**asset, _PIECES: pieces})
