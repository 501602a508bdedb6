"""Many items' arrays as lazy time series: one Dataset per grid, in one DataTree (``View.open_items``).

:func:`open_items` groups items by grid and array signature and stacks each group along ``time``; its variables are
lazy over :class:`PiecesArray`, which reads every piece a selection overlaps at once. What the tree holds:
docs/pixels.md#from-a-search-to-pixels.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Iterable
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
from ingest.repository._chunks import ChunkRead, read_chunks
from ingest.stac import ARRAYS_LAYOUT, AssetPixels, Piece, read_arrays_asset

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
        self,
        store: Any,
        steps: list[AssetPixels],
        dtype: np.dtype,
        fill: Any,
        *,
        opened: dict[str, Any] | None = None,
        scope: Hashable = None,
    ) -> None:
        bands, height, width = steps[0].shape
        self.store = store
        self.steps = steps
        self.shape = (len(steps), bands, height, width)
        self.dtype = dtype
        self.fill = fill
        self._opened: dict[str, Any] = {} if opened is None else opened
        """Stack arrays opened so far, by path (shared by the variables of one tree)."""
        self.scope = scope
        """What the store shows (repository and snapshot): the chunk cache's key; ``None`` leaves it unused."""

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
        """Plan the chunks the selection overlaps, from the pieces in hand, and read them all at once."""
        along_rows, along_cols = _Axis.of(rows), _Axis.of(cols)
        axes = (_Axis.of(bands), along_rows, along_cols)
        reads: list[ChunkRead] = []
        for position, step in enumerate(times):
            for piece in self.steps[int(step)].pieces:
                _, _, height, width = piece.window
                at_row, at_col = piece.at
                # Only pieces that cover part of the selection's bounding box (in the granule's pixels).
                if max(along_rows.low, at_row) >= min(along_rows.high, at_row + height):
                    continue
                if max(along_cols.low, at_col) >= min(along_cols.high, at_col + width):
                    continue
                path = f"{piece.stack}/{piece.array}"
                array = await _open(self.store, path, self._opened)
                reads.extend(_piece_reads(path, array.metadata.chunk_grid.chunk_shape, piece, position, axes))
        await read_chunks(self.store, self._opened, reads, out, self.scope)


@dataclass(frozen=True)
class _Axis:
    """The positions a selection takes along one axis (band, row or column of the granule), in output order."""

    positions: np.ndarray
    contiguous: bool
    """Whether they are one ascending run (a plain slice): then every part of them is a slice too."""
    low: int
    high: int
    """The first position taken and one past the last."""

    @classmethod
    def of(cls, positions: np.ndarray) -> _Axis:
        contiguous = bool(np.all(np.diff(positions) == 1))
        return cls(positions, contiguous, int(positions.min()), int(positions.max()) + 1)

    def chunks(self, start: int, stop: int, shift: int, depth: int) -> range:
        """The chunks (of ``depth``) that hold the positions taken inside ``[start, stop)``, once shifted by
        ``shift`` into the array."""
        low, high = max(self.low, start) + shift, min(self.high, stop) + shift
        return range(low // depth, (high - 1) // depth + 1) if low < high else range(0)

    def within(self, low: int, high: int, shift: int) -> tuple[Any, Any] | None:
        """Of the positions in ``[low, high)``: where they go in the output, and where they are once shifted by
        ``-shift`` (in the chunk); ``None`` if there are none."""
        if self.contiguous:
            start = int(self.positions[0])
            low, high = max(low, start), min(high, start + len(self.positions))
            if low >= high:
                return None
            return slice(low - start, high - start), slice(low - shift, high - shift)
        take = np.flatnonzero((self.positions >= low) & (self.positions < high))
        if not take.size:
            return None
        return take, self.positions[take] - shift


def _piece_reads(
    path: str, chunk_shape: tuple[int, ...], piece: Piece, position: int, axes: tuple[_Axis, _Axis, _Axis]
) -> list[ChunkRead]:
    """The chunks of ``piece``'s array the selection overlaps, and what each gives to time step ``position``."""
    bands, rows, cols = axes
    slot_depth, band_depth, chunk_height, chunk_width = chunk_shape
    row, col, height, width = piece.window
    at_row, at_col = piece.at
    # A granule's pixel (r, c) is the stack's (r + row - at_row, c + col - at_col).
    row_shift, col_shift = row - at_row, col - at_col
    reads = []
    for band_chunk in bands.chunks(0, bands.high, 0, band_depth):
        band_part = bands.within(band_chunk * band_depth, (band_chunk + 1) * band_depth, band_chunk * band_depth)
        if band_part is None:
            continue
        for row_chunk in rows.chunks(at_row, at_row + height, row_shift, chunk_height):
            top = max(row_chunk * chunk_height, row) - row_shift
            bottom = min((row_chunk + 1) * chunk_height, row + height) - row_shift
            row_part = rows.within(top, bottom, row_chunk * chunk_height - row_shift)
            if row_part is None:
                continue
            for col_chunk in cols.chunks(at_col, at_col + width, col_shift, chunk_width):
                left = max(col_chunk * chunk_width, col) - col_shift
                right = min((col_chunk + 1) * chunk_width, col + width) - col_shift
                col_part = cols.within(left, right, col_chunk * chunk_width - col_shift)
                if col_part is None:
                    continue
                reads.append(
                    ChunkRead(
                        path,
                        (piece.slot // slot_depth, band_chunk, row_chunk, col_chunk),
                        (piece.slot % slot_depth, band_part[1], row_part[1], col_part[1]),
                        (position, band_part[0], row_part[0], col_part[0]),
                    )
                )
    return reads


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
    signatures: dict[tuple[Any, ...], Signature] = {}
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
            # Items whose assets are on the same stack arrays share a signature: open them once.
            arrays_of = tuple(
                (key, where.pieces[0].stack, where.pieces[0].array, where.shape[0])
                for key, where in sorted(pixels.items())
            )
            signature = signatures.get(arrays_of)
            if signature is None:
                signature = signatures[arrays_of] = sync(_signature(store, pixels, opened))
            step = _Step(str(item.get("collection")), str(item["id"]), when, pixels)
            groups.setdefault((grid, signature), []).append(step)
    tree = xr.DataTree(name="floe")
    tree.attrs = {"floe:snapshot": view.snapshot_id, "floe:ref": view.ref, "floe:without_arrays": without}
    for (grid, signature), steps in sorted(groups.items(), key=lambda entry: -len(entry[1])):
        steps.sort(key=lambda step: (step.when, step.collection, step.item_id))
        dataset = sync(_dataset(store, steps, signature, opened, (view.repository.location.url, view.snapshot_id)))
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


async def _dataset(
    store: Any, steps: list[_Step], signature: Signature, opened: dict[str, Any], scope: Hashable
) -> xr.Dataset:
    first = steps[0].pixels[signature[0][0]]
    coords = await grid_coords(store, first)
    same_bands = len({bands for _, _, bands, _ in signature}) == 1
    variables = {}
    for key, _dtype, bands, _fill in signature:
        piece = first if key == signature[0][0] else steps[0].pixels[key]
        array = await _open(store, f"{piece.pieces[0].stack}/{piece.pieces[0].array}", opened)
        pixels = [step.pixels[key] for step in steps]
        lazy = PiecesArray(store, pixels, np.dtype(array.dtype), array.metadata.fill_value, opened=opened, scope=scope)
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
