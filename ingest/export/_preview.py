"""A quick-look PNG of one item's arrays at a ref (``floe preview``), read from the repository, not the sources.

Three bands (the first three of the assets asked for, in order) make an RGB picture, fewer a grey one; each is
stretched between its 2nd and 98th percentile of valid pixels, and pixels that are nodata (``_FillValue``) or
not finite are transparent. The picture is at most ``size`` pixels on its long side (every n-th pixel).
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ingest.errors import InvalidInput, ItemNotFound
from ingest.export._common import safe_name

if TYPE_CHECKING:
    import xarray as xr

    from ingest.repository import View

PREVIEW_SIZE = 1024
"""The long side of a preview, in pixels, unless asked otherwise."""
STRETCH = (2.0, 98.0)
"""The percentiles of valid pixels each band is stretched between."""


@dataclass(frozen=True)
class Preview:
    """A preview written: where, its size, and what it shows."""

    path: Path
    width: int
    height: int
    collection: str
    item_id: str
    bands: tuple[str, ...]
    """What each colour shows, as ``asset:band`` (three: red, green, blue; one: grey)."""
    snapshot_id: str


def write_preview(
    view: View,
    item_id: str,
    out: str | os.PathLike[str] | None = None,
    *,
    collection: str | None = None,
    assets: list[str] | None = None,
    size: int = PREVIEW_SIZE,
) -> Preview:
    """Write a PNG quick-look of item ``item_id``'s arrays at ``view``.

    Args:
        view: the snapshot to read (:meth:`~ingest.repository.Repository.view`).
        item_id: the item's id.
        out: the PNG to write (replaced only once complete; default: ``<id>.png`` in the working directory).
        collection: the item's collection (default: the one collection that holds ``item_id`` at ``view``).
        assets: the asset keys whose bands to show, in order (default: every asset with arrays, in the order
            the item lists them).
        size: the long side of the picture at most, in pixels.

    Returns:
        Where the preview was written, its size, and what its colours show.

    Raises:
        ItemNotFound: no collection holds ``item_id`` at ``view``, or the item has no arrays.
        InvalidInput: several collections hold ``item_id`` (name one), or ``size`` is below 1.
        ValueError: an asset the item has no arrays for, or assets on different grids.
    """
    if size < 1:
        raise InvalidInput(f"a preview's size is at least 1 pixel, not {size}")
    collection = collection or _collection_of(view, item_id)
    data = view.item_arrays(collection, item_id, assets)
    planes, names = _planes(data)
    height, width = planes[0].shape
    step = max(1, math.ceil(max(height, width) / size))
    pixels, valid = _stretched([plane[::step, ::step] for plane in planes])
    target = Path(out) if out is not None else Path(f"{safe_name(item_id)}.png")
    _write_png(target, pixels, valid)
    return Preview(target, pixels.shape[2], pixels.shape[1], collection, item_id, tuple(names), view.snapshot_id)


def _collection_of(view: View, item_id: str) -> str:
    from pyiceberg.expressions import EqualTo

    collections = sorted({row["collection"] for row in view.items(EqualTo("id", item_id))})
    if not collections:
        raise ItemNotFound(f"no item {item_id!r} at {view.ref} ({view.snapshot_id})")
    if len(collections) > 1:
        named = ", ".join(collections)
        raise InvalidInput(f"item {item_id!r} is in {len(collections)} collections ({named}): name one")
    return collections[0]


def _planes(data: xr.Dataset) -> tuple[list[np.ndarray], list[str]]:
    """The first three bands of the dataset's variables, in order, as float planes with nodata as NaN (one when
    there are fewer than three), and their names."""
    planes: list[np.ndarray] = []
    names: list[str] = []
    for name, variable in data.data_vars.items():
        if "band" not in variable.dims:
            continue
        fill = variable.attrs.get("_FillValue")
        for band in variable["band"].values:
            plane = variable.sel(band=band).values.astype("float64")
            if fill is not None and not (isinstance(fill, float) and math.isnan(fill)):
                plane[plane == fill] = np.nan
            planes.append(plane)
            names.append(f"{name}:{int(band)}")
            if len(planes) == 3:
                return planes, names
    if not planes:
        raise ItemNotFound("the item's arrays hold no bands to show")
    return planes[:1], names[:1]


def _stretched(planes: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``(bands, y, x)`` uint8 pixels (1-255 where valid) and the mask of pixels valid in every band."""
    stack = np.stack(planes)
    valid = np.all(np.isfinite(stack), axis=0)
    out = np.zeros(stack.shape, dtype=np.uint8)
    for index, plane in enumerate(stack):
        values = plane[valid]
        if values.size == 0:
            continue
        low, high = np.percentile(values, STRETCH)
        span = high - low if high > low else 1.0
        scaled = np.clip((plane - low) / span, 0.0, 1.0) * 254.0 + 1.0
        out[index] = np.where(valid, np.round(np.nan_to_num(scaled, nan=0.0)), 0).astype(np.uint8)
    return out, valid


def _write_png(target: Path, pixels: np.ndarray, valid: np.ndarray) -> None:
    """``pixels`` and an alpha band (opaque where valid) as a PNG at ``target``, which appears only once written."""
    import warnings

    import rasterio
    from rasterio.errors import NotGeoreferencedWarning

    bands = np.concatenate([pixels, np.where(valid, 255, 0).astype(np.uint8)[np.newaxis]])
    target.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".png")
    os.close(descriptor)
    try:
        # No .aux.xml beside it: the picture carries no georeferencing to keep.
        count, height, width = bands.shape
        with (
            warnings.catch_warnings(action="ignore", category=NotGeoreferencedWarning),
            rasterio.Env(GDAL_PAM_ENABLED="NO"),
            rasterio.open(temporary, "w", driver="PNG", width=width, height=height, count=count, dtype="uint8") as png,
        ):
            png.write(bands)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
