"""The served form of an item's arrays: ``floe:arrays`` naming the repository and snapshot, and standard assets.

A row keeps its ``floe:arrays`` asset without saying where the repository is
or which version is read: a server knows both, and fills them in
(:func:`served_arrays_asset`). It also adds, for each Icechunk stack the
item's pixels lie in, an asset any Zarr tool can open without floe
(docs/pixels.md#opening-a-stack-without-floe):

- ``type`` ``application/vnd.zarr+icechunk``, ``href`` the Icechunk
  repository, ``version`` the snapshot (the version extension);
- ``storage:refs`` naming the item's ``storage:schemes`` entry on object
  storage (the storage extension, v2);
- ``xarray:open_kwargs`` with the stack's ``group`` (the xarray-assets
  extension);
- ``cube:dimensions`` and ``cube:variables`` (the datacube extension), and
  ``floe:slot`` and ``floe:windows``: where this item is in the stack.

A collection gets one for the whole store (:func:`served_collection`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ingest.stac._assets import ARRAYS_ASSET, SLOT, STACKS, AssetPixels, Piece, read_arrays_asset

ICECHUNK_MEDIA_TYPE = "application/vnd.zarr+icechunk"
STACK_ASSET = "floe:stack"
"""The first stack's asset; an item lying across several stacks has ``floe:stack-2`` and on."""
STORE_ASSET = "floe:store"
"""A collection's asset for the whole Icechunk store at the version served."""
STORAGE_REF = "floe"
"""The key of the repository's entry in an item's ``storage:schemes``."""

STORAGE_EXTENSION = "https://stac-extensions.github.io/storage/v2.0.0/schema.json"
VERSION_EXTENSION = "https://stac-extensions.github.io/version/v1.2.0/schema.json"
DATACUBE_EXTENSION = "https://stac-extensions.github.io/datacube/v2.2.0/schema.json"
XARRAY_EXTENSION = "https://stac-extensions.github.io/xarray-assets/v1.0.0/schema.json"

_SERVED_EXTENSIONS = (STORAGE_EXTENSION, VERSION_EXTENSION, DATACUBE_EXTENSION, XARRAY_EXTENSION)
_REPOSITORY = "floe:repository"
_SNAPSHOT = "floe:snapshot"


@dataclass(frozen=True)
class ServedArrays:
    """Where a server's arrays are, as its items say it."""

    url: str
    """The Icechunk repository: a local path or ``s3://bucket/prefix``."""
    scheme: dict[str, Any] | None = None
    """The storage extension's scheme of ``url`` on object storage (:func:`s3_storage_scheme`); None on a disk."""
    tile: int | None = None
    """The width and height (pixels) of the repository's lattice stacks, when known: the stacks' extents."""


def s3_storage_scheme(
    bucket: str, region: str | None, endpoint_url: str | None, *, anonymous: bool = False
) -> dict[str, Any]:
    """The storage extension's scheme of a bucket: ``aws-s3`` on AWS, ``custom-s3`` at any other endpoint.

    ``bucket`` (and ``anonymous`` when set) are there too: a reader needs
    them to open the repository, and the extension allows more fields.
    """
    scheme: dict[str, Any]
    if endpoint_url:
        scheme = {"type": "custom-s3", "platform": endpoint_url.rstrip("/")}
    else:
        scheme = {"type": "aws-s3", "platform": "https://{bucket}.s3.{region}.amazonaws.com"}
    if region:
        scheme["region"] = region
    scheme["bucket"] = bucket
    if anonymous:
        scheme["anonymous"] = True
    return scheme


def served_arrays_asset(item: dict[str, Any], where: ServedArrays, snapshot_id: str) -> dict[str, Any]:
    """Turn the item's stored ``floe:arrays`` asset, in place, into the form a server returns; returns ``item``.

    ``href`` becomes the repository, ``floe:repository`` and ``floe:snapshot``
    say which repository, at which version, the pieces are in, and each stack
    the pieces are in gets its standard asset (:func:`stack_assets`).
    """
    assets = item.get("assets")
    if not isinstance(assets, dict):
        return item
    if STACK_ASSET in assets:  # (``floe:stack-2`` and on come only with it)
        # Another floe's served form, ingested as it was: its stacks are that repository's, at that version.
        item["assets"] = assets = {key: value for key, value in assets.items() if not _is_stack_asset(key)}
    asset = assets.get(ARRAYS_ASSET)
    if not isinstance(asset, dict):
        return item
    asset[_SNAPSHOT] = snapshot_id
    asset[_REPOSITORY] = where.url
    asset["href"] = where.url
    stacks = stack_assets(item, where, snapshot_id)
    if not stacks:
        return item
    item["assets"].update(stacks)
    extensions = item.get("stac_extensions")
    extensions = list(extensions) if isinstance(extensions, list) else []
    wanted = [VERSION_EXTENSION, XARRAY_EXTENSION, DATACUBE_EXTENSION]
    if where.scheme is not None:
        properties = item.get("properties")
        if isinstance(properties, dict):
            schemes = properties.get("storage:schemes")
            known = schemes if isinstance(schemes, dict) else {}
            properties["storage:schemes"] = {**known, STORAGE_REF: where.scheme}
            wanted.insert(0, STORAGE_EXTENSION)
    item["stac_extensions"] = extensions + [url for url in wanted if url not in extensions]
    return item


def served_collection(collection: dict[str, Any], where: ServedArrays, snapshot_id: str) -> dict[str, Any]:
    """A copy of ``collection`` with the asset of the whole Icechunk store at ``snapshot_id`` (``floe:store``).

    The collection's stacks are its groups ``<collection>/stacks/...`` there;
    on object storage the collection's ``storage:schemes`` names the bucket.
    """
    document = dict(collection)
    asset: dict[str, Any] = {
        "href": where.url,
        "type": ICECHUNK_MEDIA_TYPE,
        "title": f"The Icechunk store at snapshot {snapshot_id}: this collection's stacks are {collection.get('id')}/"
        f"{STACKS}/",
        "roles": ["data"],
        "version": snapshot_id,
    }
    wanted = [VERSION_EXTENSION, XARRAY_EXTENSION]
    if where.scheme is not None:
        asset["storage:refs"] = [STORAGE_REF]
        schemes = document.get("storage:schemes")
        document["storage:schemes"] = {**(schemes if isinstance(schemes, dict) else {}), STORAGE_REF: where.scheme}
        wanted.insert(0, STORAGE_EXTENSION)
    asset["xarray:open_kwargs"] = {"engine": "zarr", "zarr_format": 3, "consolidated": False}
    assets = document.get("assets")
    document["assets"] = {**(assets if isinstance(assets, dict) else {}), STORE_ASSET: asset}
    extensions = document.get("stac_extensions")
    extensions = list(extensions) if isinstance(extensions, list) else []
    document["stac_extensions"] = extensions + [url for url in wanted if url not in extensions]
    return document


def without_served_assets(document: dict[str, Any]) -> dict[str, Any]:
    """An item or collection without what serving added: the stacks' or the store's assets, the repository's
    storage scheme and the extensions they declare (``document`` itself when it has none of those assets).

    An item read from floe's API and written back, compared with what a row
    stores, or ingested into another repository, is the item as stored: the
    stacks are where it is now, not part of it. So is a collection.
    """
    assets = document.get("assets")
    if not isinstance(assets, dict) or (STACK_ASSET not in assets and STORE_ASSET not in assets):
        return document
    kept = {**document, "assets": {key: value for key, value in assets.items() if not _is_served_asset(key)}}
    if document.get("type") == "Collection":
        kept = _without_scheme(kept)
    elif isinstance(properties := document.get("properties"), dict):
        kept["properties"] = _without_scheme(properties)
    extensions = document.get("stac_extensions")
    if isinstance(extensions, list):
        kept["stac_extensions"] = [url for url in extensions if url not in _SERVED_EXTENSIONS]
    return kept


def _without_scheme(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` without the repository's ``storage:schemes`` entry (and without the field once it is empty)."""
    schemes = fields.get("storage:schemes")
    if not isinstance(schemes, dict) or STORAGE_REF not in schemes:
        return fields
    others = {key: value for key, value in schemes.items() if key != STORAGE_REF}
    kept = {key: value for key, value in fields.items() if key != "storage:schemes"}
    if others:
        kept["storage:schemes"] = others
    return kept


def _is_served_asset(key: str) -> bool:
    return key == STORE_ASSET or _is_stack_asset(key)


def _is_stack_asset(key: str) -> bool:
    return key == STACK_ASSET or (key.startswith(f"{STACK_ASSET}-") and key[len(STACK_ASSET) + 1 :].isdigit())


def stack_assets(item: dict[str, Any], where: ServedArrays, snapshot_id: str) -> dict[str, dict[str, Any]]:
    """The standard asset of each stack ``item``'s pixels are in (asset key -> asset), in the pieces' order.

    Each says how to open the stack (repository, version, group) and where the
    item is in it: its slot, and for each of its assets the array, the window
    in the stack and where that window goes in the asset's own grid.
    """
    arrays = read_arrays_asset(item)
    if arrays is None or not arrays.pixels:
        return {}
    by_stack: dict[str, list[tuple[str, AssetPixels, Piece]]] = {}
    for key, pixels in arrays.pixels.items():
        for piece in pixels.pieces:
            by_stack.setdefault(piece.stack, []).append((key, pixels, piece))
    assets: dict[str, dict[str, Any]] = {}
    for number, (stack, pieces) in enumerate(by_stack.items(), start=1):
        name = STACK_ASSET if number == 1 else f"{STACK_ASSET}-{number}"
        assets[name] = _stack_asset(stack, pieces, where, snapshot_id)
    return assets


def _stack_asset(
    stack: str, pieces: list[tuple[str, AssetPixels, Piece]], where: ServedArrays, snapshot_id: str
) -> dict[str, Any]:
    slots = sorted({piece.slot for _key, _pixels, piece in pieces})
    windows = {
        key: {"array": piece.array, "window": list(piece.window), "at": list(piece.at)}
        for key, _pixels, piece in pieces
    }
    _key, first_pixels, first_piece = pieces[0]
    dimensions: dict[str, Any] = {
        SLOT: {"type": "other", "description": "One slot per granule; this item's is floe:slot."},
    }
    variables: dict[str, Any] = {}
    for key, pixels, piece in pieces:
        band = f"{key}_band"
        dimensions[band] = {"type": "bands", "values": list(range(1, pixels.shape[0] + 1))}
        variables[piece.array] = {"type": "data", "dimensions": [SLOT, band, "y", "x"]}
    dimensions.update(_spatial_dimensions(stack, first_pixels, first_piece, where.tile))
    asset: dict[str, Any] = {
        "href": where.url,
        "type": ICECHUNK_MEDIA_TYPE,
        "title": f"Icechunk stack {stack} at snapshot {snapshot_id}",
        "roles": ["data"],
        "version": snapshot_id,
    }
    if where.scheme is not None:
        asset["storage:refs"] = [STORAGE_REF]
    asset.update(
        {
            "xarray:open_kwargs": {"engine": "zarr", "group": stack, "zarr_format": 3, "consolidated": False},
            "cube:dimensions": dimensions,
            "cube:variables": variables,
            "floe:slot": slots[0] if len(slots) == 1 else slots,
            "floe:windows": windows,
        }
    )
    return asset


def _spatial_dimensions(stack: str, pixels: AssetPixels, piece: Piece, tile: int | None) -> dict[str, Any]:
    """The stack's ``x`` and ``y`` dimensions, from where ``piece`` of an asset of grid ``pixels`` lies in it.

    A stack on a lattice (``<collection>/stacks/<lattice>/<row>_<column>``,
    ``ingest.rasters._stack``) is ``tile`` pixels square; any other stack
    holds one grid, the asset's. Without a known size, only the steps and
    the reference system are given.
    """
    a, _b, c, _d, e, f = pixels.transform
    row, column, _height, _width = piece.window
    at_row, at_column = piece.at
    x0 = c + (at_column - column) * a
    y0 = f + (at_row - row) * e
    on_lattice = stack.split(f"/{STACKS}/", 1)[-1].count("/") == 1
    size = (tile, tile) if on_lattice else (pixels.shape[1], pixels.shape[2])
    system: Any = pixels.crs
    if system.upper().startswith("EPSG:") and system[5:].isdigit():
        system = int(system[5:])
    x: dict[str, Any] = {"type": "spatial", "axis": "x", "step": a, "reference_system": system}
    y: dict[str, Any] = {"type": "spatial", "axis": "y", "step": e, "reference_system": system}
    if size[0] is not None and size[1] is not None:
        x["extent"] = sorted([x0, x0 + size[1] * a])
        y["extent"] = sorted([y0, y0 + size[0] * e])
    return {"y": y, "x": x}
