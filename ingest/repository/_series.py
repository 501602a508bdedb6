"""Many items' arrays as lazy time series: one Dataset per grid, in one DataTree (``View.open_items``).

:func:`open_items` groups items by grid and array signature and stacks each group along ``time``; its variables are
lazy over :class:`PiecesArray`, which reads every piece a selection overlaps at once. What the tree holds:
docs/pixels.md#from-a-search-to-pixels.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import xarray as xr
import zarr.api.asynchronous as async_zarr
from xarray.backends import BackendArray
from xarray.core import indexing
from zarr.core.sync import sync

from ingest.errors import UnsupportedLayout
from ingest.repository._arrays import GRID_MAPPING, grid_coords, kept_attributes
from ingest.stac import ARRAYS_LAYOUT, AssetPixels, read_arrays_asset

if TYPE_CHECKING:
    from ingest.repository._view import View

Signature = tuple[tuple[str, str, int, str], ...]
"""Per asset of a grid: (key, dtype, bands, fill value as text), sorted by key."""


@dataclass(frozen=True)
class _Step:
    """One item on one grid: the time step it becomes."""

    collection: str
    item_id: str
    when: pd.Timestamp
    pixels: dict[str, AssetPixels]


class PiecesArray(BackendArray):
    """``(time, band, y, x)`` of one asset of many items on one grid, read from their pieces only when indexed.

    xarray's lazy indexing goes through it; a selection reads every piece it overlaps at once (Icechunk's store is
    asynchronous), and the fill value where no piece is. All reads are at the view's snapshot.
    """

    def __init__(
        self, store: Any, steps: list[AssetPixels], dtype: np.dtype, fill: Any, opened: dict[str, Any] | None = None
    ) -> None:
        bands, height, width = steps[0].shape
        self.store = store
        self.steps = steps
        self.shape = (len(steps), bands, height, width)
        self.dtype = dtype
        self.fill = fill
        self._opened: dict[str, Any] = {} if opened is None else opened
        """Stack arrays opened so far, by path (shared by the variables of one tree)."""

    def __getitem__(self, key: indexing.ExplicitIndexer) -> np.ndarray:
        return indexing.explicit_indexing_adapter(key, self.shape, indexing.IndexingSupport.BASIC, self._read)

    def _read(self, key: tuple[int | slice, ...]) -> np.ndarray:
        wanted = [
            np.arange(*part.indices(size)) if isinstance(part, slice) else np.array([part])
            for part, size in zip(key, self.shape, strict=True)
        ]
        out = np.full(tuple(len(axis) for axis in wanted), self.fill, dtype=self.dtype)
        if out.size:
            sync(self._fill(out, *wanted))
        # An integer in the key drops its axis, as numpy's indexing does.
        return out[tuple(0 if isinstance(part, int | np.integer) else slice(None) for part in key)]

    async def _fill(
        self, out: np.ndarray, times: np.ndarray, bands: np.ndarray, rows: np.ndarray, cols: np.ndarray
    ) -> None:
        """Read every piece the selection overlaps at once; each fills the part of ``out`` it covers."""
        first_band, last_band = int(bands.min()), int(bands.max()) + 1
        first_row, last_row = int(rows.min()), int(rows.max()) + 1
        first_col, last_col = int(cols.min()), int(cols.max()) + 1

        async def piece(position: int, piece: Any) -> None:
            row, col, height, width = piece.window
            at_row, at_col = piece.at
            # The part of the selection's bounding box the piece covers, in the granule's pixels.
            low_row, high_row = max(first_row, at_row), min(last_row, at_row + height)
            low_col, high_col = max(first_col, at_col), min(last_col, at_col + width)
            if low_row >= high_row or low_col >= high_col:
                return
            array = await _open(self.store, f"{piece.stack}/{piece.array}", self._opened)
            values = await array.getitem(
                (
                    piece.slot,
                    slice(first_band, last_band),
                    slice(row + low_row - at_row, row + high_row - at_row),
                    slice(col + low_col - at_col, col + high_col - at_col),
                )
            )
            # The selection's own rows and columns inside this piece (any step, any order).
            take_rows = np.flatnonzero((rows >= low_row) & (rows < high_row))
            take_cols = np.flatnonzero((cols >= low_col) & (cols < high_col))
            out[np.ix_([position], np.arange(len(bands)), take_rows, take_cols)] = values[
                np.ix_(bands - first_band, rows[take_rows] - low_row, cols[take_cols] - low_col)
            ][np.newaxis]

        await asyncio.gather(
            *(piece(position, each) for position, step in enumerate(times) for each in self.steps[int(step)].pieces)
        )


def open_items(view: View, items: Iterable[dict[str, Any]], assets: Iterable[str] | None = None) -> xr.DataTree:
    """The arrays of ``items`` (as stored or as a search serves them) at ``view``'s snapshot, lazily, by grid.

    ``assets`` picks asset keys (default: every asset with arrays). Items
    without arrays are left out; the tree's ``floe:without_arrays`` attribute
    counts them. Each child Dataset is named ``g`` + a digest of its grid and
    signature, and says its CRS, transform and assets in its attributes.

    Raises:
        UnsupportedLayout: an item's arrays were written by an earlier floe.
    """
    chosen = set(assets) if assets is not None else None
    groups: dict[tuple[Any, ...], list[_Step]] = {}
    without = 0
    store = view.session.store
    opened: dict[str, Any] = {}
    for item in items:
        arrays = read_arrays_asset(item)
        if arrays is None:
            without += 1
            continue
        if arrays.layout != ARRAYS_LAYOUT:
            raise UnsupportedLayout(
                f"item {item['id']!r} keeps its arrays in layout {arrays.layout}; this floe reads layout "
                f"{ARRAYS_LAYOUT}",
                layout=arrays.layout,
            )
        by_grid: dict[tuple[Any, ...], dict[str, AssetPixels]] = {}
        for key, where in arrays.pixels.items():
            if chosen is None or key in chosen:
                by_grid.setdefault((where.crs, where.transform, where.shape[1:]), {})[key] = where
        when = _datetime_of(item)
        for grid, pixels in by_grid.items():
            signature = sync(_signature(store, pixels, opened))
            step = _Step(str(item.get("collection")), str(item["id"]), when, pixels)
            groups.setdefault((grid, signature), []).append(step)
    tree = xr.DataTree(name="floe")
    tree.attrs = {"floe:snapshot": view.snapshot_id, "floe:ref": view.ref, "floe:without_arrays": without}
    for (grid, signature), steps in sorted(groups.items(), key=lambda entry: -len(entry[1])):
        steps.sort(key=lambda step: (step.when, step.collection, step.item_id))
        dataset = sync(_dataset(store, steps, signature, opened))
        dataset.attrs = {"crs": grid[0], "transform": list(grid[1]), "assets": [entry[0] for entry in signature]}
        tree[_name(grid, signature)] = xr.DataTree(dataset)
    return tree


async def _signature(store: Any, pixels: dict[str, AssetPixels], opened: dict[str, Any]) -> Signature:
    entries = []
    for key in sorted(pixels):
        first = pixels[key].pieces[0]
        array = await _open(store, f"{first.stack}/{first.array}", opened)
        entries.append((key, str(np.dtype(array.dtype)), pixels[key].shape[0], repr(array.metadata.fill_value)))
    return tuple(entries)


async def _open(store: Any, path: str, opened: dict[str, Any]) -> Any:
    array = opened.get(path)
    if array is None:
        array = opened[path] = await async_zarr.open_array(store=store, path=path, mode="r")
    return array


async def _dataset(store: Any, steps: list[_Step], signature: Signature, opened: dict[str, Any]) -> xr.Dataset:
    first = steps[0].pixels[signature[0][0]]
    coords = await grid_coords(store, first)
    same_bands = len({bands for _, _, bands, _ in signature}) == 1
    variables = {}
    for key, _dtype, bands, _fill in signature:
        piece = first if key == signature[0][0] else steps[0].pixels[key]
        array = await _open(store, f"{piece.pieces[0].stack}/{piece.pieces[0].array}", opened)
        lazy = PiecesArray(
            store, [step.pixels[key] for step in steps], np.dtype(array.dtype), array.metadata.fill_value, opened
        )
        band = "band" if same_bands else f"{key}_band"
        variable = xr.Variable(("time", band, "y", "x"), indexing.LazilyIndexedArray(lazy), kept_attributes(array))
        variable.encoding["grid_mapping"] = GRID_MAPPING
        variables[key] = variable
        coords[band] = np.arange(1, bands + 1)
    coords["time"] = pd.DatetimeIndex([step.when for step in steps])
    coords["item"] = ("time", [step.item_id for step in steps])
    coords["collection"] = ("time", [step.collection for step in steps])
    return xr.Dataset(variables, coords=coords)


def _datetime_of(item: dict[str, Any]) -> pd.Timestamp:
    """The item's datetime (its start when it has a range), naive UTC, as xarray's time axes are."""
    properties = item.get("properties") or {}
    value = properties.get("datetime") or properties.get("start_datetime")
    if value is None:
        return pd.NaT
    stamp = pd.Timestamp(value)
    return stamp.tz_convert("UTC").tz_localize(None) if stamp.tzinfo is not None else stamp


def _name(grid: tuple[Any, ...], signature: Signature) -> str:
    return "g" + hashlib.blake2b(repr((grid, signature)).encode(), digest_size=4).hexdigest()
