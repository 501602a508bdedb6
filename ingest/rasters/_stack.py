"""Granules as slices of shared arrays: the array layout whose node count grows with grids, not granules.

This module is the layout itself (array layout 2): grids, lattices, kinds, array names (:func:`array_name`) and
where a granule's pixels go (:func:`plan_granule`), computed without a store; ``_slices.py`` writes the zarr nodes
of stacks and the slices. Tiled and fixed stacks, and what a stack holds: docs/pixels.md#arrays-granules-stacked-by-grid
and docs/design.md §2 (rasters are stacked by grid).
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import xarray as xr
from rasterio.transform import Affine
from xarray.backends.zarr import FillValueCoder, encode_zarr_attr_value
from zarr.codecs import BytesCodec, ZstdCodec
from zarr.core.chunk_key_encodings import DefaultChunkKeyEncoding
from zarr.core.metadata.v3 import ArrayV3Metadata
from zarr.dtype import parse_data_type

from ingest.rasters._copy import GRANULE_VARIABLE, GRID_MAPPING, check_asset_key
from ingest.stac import DATETIME, ITEM, SLOT, STACKS, AssetPixels, Piece, check_name

Layout = Literal["tiled", "fixed"]

#: An alignment closer to a whole pixel than this (in pixels) is a whole pixel: float noise in origins.
_ALIGNMENT_TOLERANCE = 1e-6
#: The codecs of every copied array: zstd at level 1, not zarr's default (0, which zstd reads as 3). On a 3-band
#: 1024 x 1024 uint16 scene it compresses in 14 ms instead of 31 to 76.3% of the pixels instead of 76.1%: half of a
#: copy's writing time. Readers do not care which level wrote a chunk.
CODECS = (BytesCodec(endian="little"), ZstdCodec(level=1, checksum=False))


def stack_digest(*parts: object) -> str:
    """A short, stable name for a tuple of values (lattices, grids, kinds)."""
    return hashlib.blake2b(repr(parts).encode(), digest_size=6).hexdigest()


@dataclass(frozen=True)
class Grid:
    """A raster's pixel grid: CRS, affine transform (rasterio's order a, b, c, d, e, f) and size."""

    crs_wkt: str
    crs: str
    """``EPSG:<code>`` when the CRS has one, else the WKT: the name a client shows."""
    transform: tuple[float, float, float, float, float, float]
    height: int
    width: int

    @classmethod
    def of(cls, dataset: xr.Dataset) -> Grid:
        """The grid of a Dataset :func:`ingest.rasters.read_granule` returned."""
        pixels = dataset[GRANULE_VARIABLE]
        crs = pixels.rio.crs
        a, b, c, d, e, f = tuple(pixels.rio.transform())[:6]
        _bands, height, width = pixels.shape
        return cls(crs.to_wkt(), crs.to_string(), (a, b, c, d, e, f), int(height), int(width))

    @property
    def geotransform(self) -> str:
        """GDAL's GeoTransform attribute (c, a, b, f, d, e), as rioxarray writes it."""
        a, b, c, d, e, f = self.transform
        return " ".join(repr(float(value)) for value in (c, a, b, f, d, e))

    def coordinates(self) -> tuple[np.ndarray, np.ndarray]:
        """Pixel-centre ``x`` and ``y`` coordinates (axis-aligned grids), as rioxarray computes them.

        With rioxarray's own arithmetic (the half-pixel shift folded into the
        transform first), so the values are equal to the last bit.
        """
        centres = Affine(*self.transform) * Affine.translation(0.5, 0.5)
        x, _ = centres * (np.arange(self.width), np.zeros(self.width))
        _, y = centres * (np.zeros(self.height), np.arange(self.height))
        return np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)


@dataclass(frozen=True)
class Lattice:
    """The infinite pixel grid a raster lies on: CRS, pixel size, and the origin modulo the pixel size."""

    crs_wkt: str
    crs: str
    x_step: float
    y_step: float
    x_align: float
    y_align: float

    @property
    def name(self) -> str:
        return f"l{stack_digest(self.crs_wkt, self.x_step, self.y_step, self.x_align, self.y_align)}"

    @classmethod
    def of(cls, grid: Grid) -> Lattice:
        a, b, c, d, e, f = grid.transform
        if b or d:
            raise ValueError(f"grid {grid} is rotated: only axis-aligned grids stack")
        return cls(grid.crs_wkt, grid.crs, a, e, _alignment(c, a), _alignment(f, e))

    def index(self, grid: Grid) -> tuple[int, int]:
        """The lattice row and column of the grid's first pixel."""
        _a, _b, c, _d, _e, f = grid.transform
        column = (c - self.x_align) / self.x_step
        row = (f - self.y_align) / self.y_step
        return round(row), round(column)

    def tile_grid(self, tile_row: int, tile_column: int, tile: int) -> Grid:
        """The grid of tile (row, column) of ``tile`` x ``tile`` pixels."""
        c = self.x_align + tile_column * tile * self.x_step
        f = self.y_align + tile_row * tile * self.y_step
        return Grid(self.crs_wkt, self.crs, (self.x_step, 0.0, c, 0.0, self.y_step, f), tile, tile)


def _alignment(origin: float, step: float) -> float:
    """``origin`` modulo ``|step|``, snapped to 0 within float noise, rounded so equal lattices compare equal."""
    size = abs(step)
    fraction = (origin % size) / size
    if fraction > 1 - _ALIGNMENT_TOLERANCE or fraction < _ALIGNMENT_TOLERANCE:
        return 0.0
    return round(fraction, 6) * size


@dataclass(frozen=True)
class Stack:
    """A stack group: where it is, and the grid every slice of it is on."""

    path: str
    grid: Grid


@dataclass(frozen=True)
class Kind:
    """What fixes an array of a stack: everything about an asset's pixels but where they are."""

    key: str
    """The asset key (the array's name unless another kind took it)."""
    dtype: str
    bands: int
    attributes: tuple[tuple[str, Any], ...]
    """The pixels' attributes among :data:`KIND_ATTRIBUTES`, sorted."""

    @property
    def fill_value(self) -> Any:
        attrs = dict(self.attributes)
        if "_FillValue" in attrs:
            return attrs["_FillValue"]
        return np.nan if np.dtype(self.dtype).kind == "f" else 0

    @functools.cached_property
    def signature(self) -> str:
        return stack_digest(self.dtype, self.bands, self.attributes)

    def metadata(self, stack: Stack, *, capacity: int, chunk: int) -> ArrayV3Metadata:
        """The zarr v3 document of this kind's array in ``stack``."""
        dtype = np.dtype(self.dtype)
        attrs = dict(self.attributes)
        if "_FillValue" in attrs:
            attrs["_FillValue"] = FillValueCoder.encode(attrs["_FillValue"], dtype)
        attrs.update({"grid_mapping": GRID_MAPPING, "coordinates": f"{GRID_MAPPING} {ITEM} {DATETIME}"})
        attrs["floe:kind"] = self.signature
        height, width = stack.grid.height, stack.grid.width
        return ArrayV3Metadata(
            shape=(capacity, self.bands, height, width),
            data_type=parse_data_type(dtype, zarr_format=3),
            chunk_grid={
                "name": "regular",
                "configuration": {"chunk_shape": (1, 1, min(chunk, height), min(chunk, width))},
            },
            chunk_key_encoding=DefaultChunkKeyEncoding(separator="/"),
            fill_value=self.fill_value,
            codecs=CODECS,
            attributes={key: encode_zarr_attr_value(value) for key, value in attrs.items()},
            dimension_names=[SLOT, band_dimension(self.key), "y", "x"],
            storage_transformers=None,
        )


#: The attributes of an asset's pixels an array keeps (CF decoding, and how a pixel value is meant).
KIND_ATTRIBUTES = ("_FillValue", "scale_factor", "add_offset", "AREA_OR_POINT")


def band_dimension(name: str) -> str:
    """The band axis of array ``name``: one per array, since kinds of one stack differ in band count."""
    return f"{name}_band"


def kind_of(key: str, dataset: xr.Dataset) -> Kind:
    """The kind of asset ``key``'s pixels (a Dataset :func:`~ingest.rasters.read_granule` returned)."""
    pixels = dataset[GRANULE_VARIABLE]
    attrs = {name: pixels.attrs[name] for name in KIND_ATTRIBUTES if name in pixels.attrs}
    normalised = tuple(sorted((name, _plain(value)) for name, value in attrs.items()))
    return Kind(key, str(pixels.dtype), int(pixels.shape[0]), normalised)


def _plain(value: Any) -> Any:
    """numpy scalars as Python ones, so kinds hash and compare by value; NaN stays NaN."""
    return value.item() if isinstance(value, np.generic) else value


def array_name(kind: Kind, existing: Mapping[str, str]) -> str:
    """The name of ``kind``'s array in a stack whose arrays are ``existing`` (name -> kind signature).

    The asset key when that name is free or holds this kind; otherwise
    ``<key>.<signature>``, which only this kind can hold.
    """
    if existing.get(kind.key, kind.signature) == kind.signature:
        return kind.key
    return f"{kind.key}.{kind.signature}"


@dataclass
class AssetPlan:
    """Where one asset of a granule goes: its kind, its own grid, and its pieces."""

    key: str
    kind: Kind
    grid: Grid
    pieces: list[Piece]
    pixels: np.ndarray = field(repr=False)

    def where(self) -> AssetPixels:
        """The asset's record in the item's ``floe:arrays`` asset (slots assigned)."""
        bands = self.kind.bands
        return AssetPixels(self.grid.crs, self.grid.transform, (bands, self.grid.height, self.grid.width), self.pieces)


@dataclass
class GranulePlan:
    """Where every asset of a granule goes, and the stacks (with the kinds in each) it needs."""

    assets: list[AssetPlan]
    stacks: dict[str, Stack]
    kinds: dict[str, list[Kind]]
    """Stack path -> the kinds this granule writes there."""
    chunks: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    """(stack path, array name) -> (height, width) of the chunks of an array that exists already, as its own
    metadata says (``name_arrays`` reads it): slices are written in those, whatever ``arrays.chunk`` says now."""

    def stack_paths(self) -> list[str]:
        return sorted(self.stacks)


def plan_granule(
    collection: str,
    datasets: Mapping[str, xr.Dataset],
    *,
    layout: Layout = "tiled",
    tile: int = 4096,
    chunk: int = 512,
) -> GranulePlan:
    """Place a granule's assets (asset key -> Dataset from :func:`~ingest.rasters.read_granule`) in stacks.

    Array names are left as the asset keys; the writer renames a kind whose
    name is taken in the stack (:func:`array_name`). Slots are assigned by
    the writer too.

    Raises:
        InvalidRaster: an asset key cannot name an array of a stack (it has a
            ``/``, or is a coordinate's name such as ``x`` or ``item``).
        ValueError: ``collection`` is not a safe path segment, no assets, an
            unknown ``layout``, or a ``tile``/``chunk`` that is not positive.
    """
    check_name(collection, "collection")
    if tile < 1 or chunk < 1:
        raise ValueError(f"tile and chunk must be positive, got {tile} and {chunk}")
    if layout not in ("tiled", "fixed"):
        raise ValueError(f"layout must be 'tiled' or 'fixed', got {layout!r}")
    if not datasets:
        raise ValueError(f"a granule of {collection} needs at least one asset to stack")
    for key in datasets:
        check_asset_key(key)
    assets: list[AssetPlan] = []
    stacks: dict[str, Stack] = {}
    kinds: dict[str, list[Kind]] = {}
    for key, dataset in datasets.items():
        grid = Grid.of(dataset)
        kind = kind_of(key, dataset)
        if layout == "fixed":
            placed = [(Stack(fixed_stack_path(collection, grid), grid), (0, 0, grid.height, grid.width), (0, 0))]
        else:
            placed = _tiles(collection, grid, tile)
        pieces = []
        for stack, window, at in placed:
            stacks.setdefault(stack.path, stack)
            if kind not in kinds.setdefault(stack.path, []):
                kinds[stack.path].append(kind)
            pieces.append(Piece(stack.path, key, window, at))
        assets.append(AssetPlan(key, kind, grid, pieces, np.asarray(dataset[GRANULE_VARIABLE].values)))
    return GranulePlan(assets, stacks, kinds)


def fixed_stack_path(collection: str, grid: Grid) -> str:
    """The fixed stack of ``grid`` in ``collection``: every granule on exactly this grid is a slice of it."""
    return f"{collection}/{STACKS}/g{stack_digest(grid)}"


def _tiles(collection: str, grid: Grid, tile: int) -> list[tuple[Stack, tuple[int, int, int, int], tuple[int, int]]]:
    """The tiles of its lattice a grid overlaps, with the window it covers in each and where that is in the grid."""
    lattice = Lattice.of(grid)
    row0, column0 = lattice.index(grid)
    placed = []
    for tile_row in range(math.floor(row0 / tile), math.floor((row0 + grid.height - 1) / tile) + 1):
        for tile_column in range(math.floor(column0 / tile), math.floor((column0 + grid.width - 1) / tile) + 1):
            top, left = tile_row * tile, tile_column * tile
            first_row, first_column = max(row0, top), max(column0, left)
            last_row = min(row0 + grid.height, top + tile)
            last_column = min(column0 + grid.width, left + tile)
            stack = Stack(
                f"{collection}/{STACKS}/{lattice.name}/{tile_row}_{tile_column}",
                lattice.tile_grid(tile_row, tile_column, tile),
            )
            window = (first_row - top, first_column - left, last_row - first_row, last_column - first_column)
            placed.append((stack, window, (first_row - row0, first_column - column0)))
    return placed
