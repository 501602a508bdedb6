"""Copy a granule's rasters (GeoTIFF/COG assets of one STAC item) into the item's Zarr group.

The arrays of an item live in ``/<collection>/<item_id>`` of the writer's
Icechunk session. The layout is chosen so that a plain
``xarray.open_zarr(store, group=...)`` gives back a georeferenced Dataset
(CRS, transform, x/y coordinates) without knowing anything about floe:

* the item group is one Dataset holding one ``(band, y, x)`` variable per
  asset that shares the first asset's grid (CRS, transform and shape,
  including the band count, because a Dataset has a single ``band``
  dimension);
* an asset on any other grid gets its own subgroup ``<group>/<asset_key>``,
  a Dataset of the same structure.

Pixels are copied unchanged: same dtype, no masking, no scaling. The nodata
value and a non-trivial scale/offset travel as the CF attributes
``_FillValue``, ``scale_factor`` and ``add_offset``; xarray's default
decoding therefore masks and scales on read, and ``mask_and_scale=False``
gives back the raw values.

A granule is all or nothing: every asset is read (pixels included) before
anything is written, so an unreadable file never leaves half an item staged
in the session.
"""

from __future__ import annotations

import asyncio
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import rasterio.errors
import rioxarray
import xarray as xr
import zarr
import zarr.errors
from xarray.backends.zarr import FillValueCoder, encode_zarr_attr_value
from zarr.codecs import BytesCodec, ZstdCodec
from zarr.core.array import AsyncArray
from zarr.core.buffer import default_buffer_prototype
from zarr.core.chunk_key_encodings import DefaultChunkKeyEncoding
from zarr.core.common import ZARR_JSON
from zarr.core.group import GroupMetadata
from zarr.core.metadata.v3 import ArrayV3Metadata
from zarr.core.sync import sync
from zarr.dtype import parse_data_type
from zarr.storage import StorePath

from ingest.errors import InvalidRaster

if TYPE_CHECKING:
    from zarr.abc.store import Store

__all__ = ["GranuleArrays", "InvalidRaster", "read_assets", "read_granule", "write_granule"]

#: Name of the single data variable :func:`read_granule` returns; :func:`write_granule` renames it to the asset key.
GRANULE_VARIABLE = "data"

#: rioxarray's grid-mapping coordinate, holding ``crs_wkt`` and ``GeoTransform``.
GRID_MAPPING = "spatial_ref"

#: Names taken by the coordinates of every item Dataset; an asset named like one would clobber it.
_RESERVED_NAMES = frozenset({"band", "x", "y", GRID_MAPPING})

#: Encoding entries worth keeping from rioxarray; the rest (source path, GeoTIFF block shape) describe the input file.
_KEPT_ENCODING = ("grid_mapping",)


@dataclass(frozen=True)
class GranuleArrays:
    """What :func:`write_granule` staged for one item."""

    #: The item group, e.g. ``"c/item"``.
    group: str
    #: Asset key to the Zarr path of its array, e.g. ``{"data": "c/item/data"}``.
    variables: dict[str, str] = field(hash=False)
    #: Uncompressed pixel bytes of all assets (coordinates not counted).
    bytes_written: int
    #: The CRS of the item group's grid: ``"EPSG:<code>"`` when it has one, WKT otherwise.
    crs: str
    #: Shape ``(band, y, x)`` of the item group's grid, i.e. of the first asset.
    shape: tuple[int, ...]


def read_granule(path: str | Path) -> xr.Dataset:
    """Read a GeoTIFF/COG completely into memory as a georeferenced Dataset.

    The Dataset holds one ``(band, y, x)`` variable named ``"data"`` (the
    caller names it after the asset) with the native dtype, the nodata value
    as ``_FillValue`` and scale/offset only when they are not the identity.

    Pixels are loaded eagerly, on purpose: granules are small, and a
    truncated or corrupt file must fail here rather than halfway through a
    write. The file is closed before returning.

    Raises:
        InvalidRaster: the file is missing, not a GeoTIFF, truncated or
            corrupt, not georeferenced (no CRS), or has no axis-aligned
            geotransform.
    """
    source = str(path)
    try:
        opened = rioxarray.open_rasterio(
            source,
            masked=False,
            mask_and_scale=False,
            chunks=None,
            cache=True,
            # The default global lock would serialise reads across threads; each read here is
            # independent and the file is closed right after.
            lock=False,
            # COGs are GeoTIFFs to GDAL's reader; refusing other drivers keeps PNGs/JPEGs out.
            driver="GTiff",
        )
    except (rasterio.errors.RasterioError, OSError, ValueError) as exc:
        raise InvalidRaster(_open_failure(source, exc), path=source) from exc

    if not isinstance(opened, xr.DataArray):
        _close(opened)
        raise InvalidRaster(f"granule {source} cannot be read: it holds subdatasets, not a single raster", path=source)
    try:
        if opened.rio.crs is None:
            raise InvalidRaster(f"granule {source} has no CRS: floe stores georeferenced rasters only", path=source)
        if "x" not in opened.coords or "y" not in opened.coords:
            raise InvalidRaster(
                f"granule {source} has no axis-aligned geotransform (rotated, or georeferenced by GCPs/RPCs only)",
                path=source,
            )
        try:
            opened.load()
        except (rasterio.errors.RasterioError, OSError, ValueError) as exc:
            raise InvalidRaster(
                f"granule {source} cannot be read: truncated or corrupt pixels ({_detail(exc)})", path=source
            ) from exc
    finally:
        opened.close()

    data = opened.copy(deep=False)
    data.name = None
    data.attrs = _clean_attrs(data.attrs)
    data.encoding = {key: data.encoding[key] for key in _KEPT_ENCODING if key in data.encoding}
    return data.to_dataset(name=GRANULE_VARIABLE)


def read_assets(assets: Mapping[str, str | Path]) -> dict[str, xr.Dataset]:
    """Check a granule's asset keys and read every asset (see :func:`read_granule`); write nothing.

    This is the part of :func:`write_granule` that needs no session: a
    pipeline can run it ahead, on another thread, while the previous granule
    is being written, and pass the result to ``write_granule(read=...)``.

    Raises:
        InvalidRaster: an asset key is unusable as a Zarr name, or an asset cannot be read.
        ValueError: ``assets`` is empty.
    """
    if not assets:
        raise ValueError("a granule needs at least one asset to read")
    for key in assets:
        _check_asset_key(key)
    return {key: read_granule(path) for key, path in assets.items()}


def write_granule(
    store: Store,
    group: str,
    assets: Mapping[str, str | Path],
    *,
    chunk: int = 512,
    read: Mapping[str, xr.Dataset] | None = None,
) -> GranuleArrays:
    """Stage a granule's assets as the Zarr group ``group`` of ``store`` (an Icechunk session's store).

    ``assets`` maps asset key to raster path; the keys become array and group
    names. The first asset fixes the item group's grid; every asset on that
    grid becomes a variable of the item group's Dataset, every other asset
    its own Dataset in the subgroup ``<group>/<asset_key>``. Chunks are
    ``(1, chunk, chunk)`` clipped to the array.

    Everything is read before anything is written, so a bad asset leaves the
    session untouched. ``read``, the result of :func:`read_assets` for the
    same ``assets``, skips the reading. An existing group of that name is replaced whole
    (subgroups included), so re-ingesting an item cannot leave stale assets.
    Should the write itself fail (storage error), the item group is removed
    again rather than left half written; a previous version of it is gone by
    then, so the item is absent, never mixed.
    Only ``group`` and its children are created: the parent (the collection
    group) must exist already, since creating it here would make every
    writer of the collection conflict on it.

    Raises:
        InvalidRaster: an asset key is unusable as a Zarr name, or an asset
            cannot be read (see :func:`read_granule`).
        ValueError: ``group`` is not a relative Zarr path, its parent group
            does not exist, ``chunk`` is not positive, or ``assets`` is empty.
    """
    group = _check_group(group)
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be a positive integer, got {chunk!r}")
    if not assets:
        raise ValueError(f"granule {group} has no assets to write")
    for key in assets:
        _check_asset_key(key)
    if read is not None and set(read) != set(assets):
        raise ValueError(f"granule {group}: the rasters read ({sorted(read)}) are not its assets ({sorted(assets)})")
    _check_parent_exists(store, group)

    loaded = read if read is not None else {key: read_granule(path) for key, path in assets.items()}
    granules = {key: loaded[key] for key in assets}  # in the assets' order: the first one fixes the grid

    first_key = next(iter(granules))
    main = granules[first_key]
    on_grid = {key: ds for key, ds in granules.items() if key == first_key or _same_grid(main, ds)}
    off_grid = {key: ds for key, ds in granules.items() if key not in on_grid}

    layout: list[tuple[str, dict[str, xr.Dataset]]] = [(group, on_grid)]
    layout += [(f"{group}/{key}", {key: ds}) for key, ds in off_grid.items()]

    try:
        sync(_write_layout(store, layout, chunk=chunk))
    except BaseException:
        _discard(store, group)
        raise
    variables = {key: f"{path}/{key}" for path, members in layout for key in members}

    pixels = main[GRANULE_VARIABLE]
    return GranuleArrays(
        group=group,
        variables={key: variables[key] for key in assets},
        bytes_written=sum(ds[GRANULE_VARIABLE].nbytes for ds in granules.values()),
        crs=pixels.rio.crs.to_string(),
        shape=tuple(pixels.shape),
    )


#: The codecs xarray's zarr v3 writer gives every array by default (zarr's defaults): floe writes the same.
_CODECS = (BytesCodec(endian="little"), ZstdCodec(level=0, checksum=False))


async def replace_groups(store: Store, paths: list[str]) -> None:
    """Make ``paths`` (the item group, then its subgroups) empty groups; a previous item goes whole first.

    That is what ``to_zarr``'s mode "w" does on the item group: no array or
    subgroup of an older version of the item survives a rewrite.
    """
    if await store.exists(f"{paths[0]}/{ZARR_JSON}"):
        await store.delete_dir(paths[0])
    group_document = GroupMetadata(zarr_format=3).to_buffer_dict(default_buffer_prototype())[ZARR_JSON]
    for path in paths:
        await store.set(f"{path}/{ZARR_JSON}", group_document)


async def _write_layout(store: Store, layout: list[tuple[str, dict[str, xr.Dataset]]], *, chunk: int) -> None:
    """Write the item group (and its subgroups) as the Zarr v3 nodes ``xarray.Dataset.to_zarr`` would write.

    xarray's writer costs tens of milliseconds per granule in node creation
    and checks (every array is created through zarr's group API, then its
    attributes are written again); the documents are built here directly and
    every node and chunk is written in one gathered round, so Icechunk
    overlaps them. ``tests/rasters/test_copy.py`` holds the documents equal to
    xarray's own.
    """
    prototype = default_buffer_prototype()
    await replace_groups(store, [path for path, _members in layout])
    arrays: list[tuple[str, ArrayV3Metadata, np.ndarray]] = []
    for path, members in layout:
        coords = next(iter(members.values())).coords
        for name in coords:
            variable = coords[name].variable
            arrays.append((f"{path}/{name}", _array_metadata(variable, variable.shape), variable.values))
        for key, ds in members.items():
            pixels = ds[GRANULE_VARIABLE].variable
            # Names spatial_ref as the variable's coordinate, as floe's copies always have (rio.crs needs it).
            pixels = pixels.copy(deep=False)
            pixels.attrs = {**pixels.attrs, "coordinates": GRID_MAPPING}
            _bands, height, width = pixels.shape
            arrays.append(
                (f"{path}/{key}", _array_metadata(pixels, (1, min(chunk, height), min(chunk, width))), pixels.values)
            )
    await asyncio.gather(
        *(store.set(f"{path}/{ZARR_JSON}", meta.to_buffer_dict(prototype)[ZARR_JSON]) for path, meta, _ in arrays)
    )
    await asyncio.gather(
        *(
            AsyncArray(metadata=meta, store_path=StorePath(store, path)).setitem(..., values)
            for path, meta, values in arrays
        )
    )


def _array_metadata(variable: xr.Variable, chunks: tuple[int, ...]) -> ArrayV3Metadata:
    """The zarr v3 metadata xarray writes for ``variable`` (no CF encoding: values are stored as they are)."""
    dtype = variable.dtype
    attrs = dict(variable.attrs)
    if "_FillValue" in attrs:
        # xarray keeps the CF _FillValue as an attribute (base64 for floats) and zarr's own fill value apart.
        attrs["_FillValue"] = FillValueCoder.encode(attrs["_FillValue"], dtype)
    return ArrayV3Metadata(
        shape=variable.shape,
        data_type=parse_data_type(dtype, zarr_format=3),
        chunk_grid={"name": "regular", "configuration": {"chunk_shape": chunks}},
        chunk_key_encoding=DefaultChunkKeyEncoding(separator="/"),
        fill_value=np.nan if dtype.kind == "f" else 0,
        codecs=_CODECS,
        attributes={key: encode_zarr_attr_value(value) for key, value in attrs.items()},
        dimension_names=[str(dim) for dim in variable.dims] or None,
        storage_transformers=None,
    )


def _same_grid(reference: xr.Dataset, candidate: xr.Dataset) -> bool:
    """Whether ``candidate`` can share ``reference``'s Dataset without any alignment.

    The comparison is exact: xarray would outer-join coordinates that differ
    in the last bit, padding both variables with fill values.
    """
    ref, cand = reference[GRANULE_VARIABLE], candidate[GRANULE_VARIABLE]
    return (
        ref.shape == cand.shape
        and ref.rio.crs == cand.rio.crs
        and ref.rio.transform() == cand.rio.transform()
        and all(np.array_equal(ref[dim].values, cand[dim].values) for dim in ref.dims)
    )


def _check_group(group: str) -> str:
    """Refuse group paths that zarr would normalise into somewhere else."""
    if not isinstance(group, str) or not group or group != group.strip("/"):
        raise ValueError(f"group must be a relative Zarr path like 'collection/item', got {group!r}")
    if any(part in ("", ".", "..") for part in group.split("/")):
        raise ValueError(f"group {group!r} has an empty, '.' or '..' segment")
    return group


def _check_asset_key(key: object) -> None:
    """Asset keys become Zarr node names; refuse any that would land elsewhere or shadow metadata/coordinates."""
    if not isinstance(key, str) or not key:
        reason = "is empty" if key == "" else "is not a string"
    elif "/" in key:
        reason = "contains '/'"
    elif key.startswith("."):
        reason = "starts with '.'"
    elif key.startswith("__"):
        reason = "starts with '__'"
    elif key in _RESERVED_NAMES:
        reason = f"is reserved for a coordinate ({', '.join(sorted(_RESERVED_NAMES))})"
    else:
        return
    raise InvalidRaster(f"asset key {key!r} {reason}: it cannot name a Zarr array", asset=str(key))


def _check_parent_exists(store: Store, group: str) -> None:
    """to_zarr silently creates missing parents; that must not happen to the collection group."""
    parent = posixpath.dirname(group)
    try:
        zarr.open_group(store, path=parent, mode="r")
    except (FileNotFoundError, zarr.errors.NodeNotFoundError, zarr.errors.ContainsArrayError) as exc:
        where = f"group {parent!r}" if parent else "the root group"
        raise ValueError(f"{where} does not exist: create it before writing granule {group}") from exc


def _discard(store: Store, group: str) -> None:
    """Best-effort removal of a half-written item group after a failed write."""
    parent, name = posixpath.split(group)
    try:
        parent_group = zarr.open_group(store, path=parent, mode="r+")
        if name in parent_group:
            del parent_group[name]
    except Exception:  # noqa: BLE001 - cleanup must not mask the error being propagated
        return


def _clean_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """Drop identity scale/offset: rioxarray always adds them, and xarray would decode integers to float64."""
    cleaned = dict(attrs)
    if cleaned.get("scale_factor") == 1.0:
        del cleaned["scale_factor"]
    if cleaned.get("add_offset") == 0.0:
        del cleaned["add_offset"]
    return cleaned


def _open_failure(source: str, exc: BaseException) -> str:
    if "://" not in source and not source.startswith("/vsi") and not Path(source).exists():
        return f"granule {source} cannot be read: no such file"
    return f"granule {source} cannot be read: not a readable GeoTIFF ({_detail(exc)})"


def _detail(exc: BaseException) -> str:
    """GDAL's reason: rasterio's read errors say 'see previous exception' and chain the real one."""
    parts = [str(exc)]
    if exc.__cause__ is not None:
        parts.append(str(exc.__cause__))
    return "; ".join(part for part in parts if part)


def _close(obj: Any) -> None:
    items = obj if isinstance(obj, list) else [obj]
    for item in items:
        item.close()
