"""Drawing map tiles of items' arrays: each tile's window of an item's lazy stacks warped by GDAL (``_tile_reads``),
then rio-tiler's ``ImageData`` for expressions, rescaling, mosaics and encoding.

A tile of one item (:func:`render_tile`) or of a search's items, newest on
top (:func:`mosaic_tile`), with titiler's parameters (:class:`Rendering`),
encoded as PNG, WEBP, JPEG, GeoTIFF or NPY. Only the chunks a tile overlaps
are read (``_series``, ``_chunks``). The routes are ``_tile_routes``; what a
tile is and how to ask for one: docs/pixels.md#map-tiles.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ingest.api._tile_reads import known_set
from ingest.errors import InvalidTileRequest, ItemNotFound, TileOutsideBounds
from ingest.stac import read_arrays_asset

if TYPE_CHECKING:
    import xarray as xr
    from rio_tiler.models import ImageData

_loading = threading.Lock()


def load_tiling() -> None:
    """Import rio-tiler, morecantile and rioxarray once, under a lock, before a tile is drawn.

    They load on the first tile, not when ``floe serve`` starts. Two threads
    importing rio-tiler's submodules at once can meet its import cycle
    half-initialised (``ImportError: cannot import name 'AsyncBaseReader'``,
    seen under 10 clients), so the first request imports them all and the
    others wait.
    """
    with _loading:
        import morecantile  # noqa: F401
        import rio_tiler.colormap
        import rio_tiler.io
        import rio_tiler.mosaic  # noqa: F401
        import rioxarray  # noqa: F401


#: zlib's level for PNG tiles: 1 encodes a 256 px tile in 2.6 ms where GDAL's default (6) takes 13.2, for 11%
#: more bytes (41 KiB against 37 on bench_tiles' tiles); a tile is drawn on every request, sent once.
PNG_ZLEVEL = 1
#: Output formats, by the extension a tile's path ends with, and what each is sent as.
FORMATS = {
    "png": ("PNG", "image/png"),
    "webp": ("WEBP", "image/webp"),
    "jpg": ("JPEG", "image/jpeg"),
    "jpeg": ("JPEG", "image/jpeg"),
    "tif": ("GTiff", "image/tiff; application=geotiff"),
    "npy": ("NPY", "application/x-binary"),
}


@dataclass(frozen=True)
class Rendering:
    """How a tile is drawn: titiler's query parameters, checked."""

    assets: tuple[str, ...] | None
    bidx: tuple[int, ...] | None
    expression: str | None
    rescale: tuple[tuple[float, float], ...]
    colormap_name: str | None
    tilesize: int | None

    @classmethod
    def of(
        cls,
        *,
        assets: list[str] | None,
        bidx: list[int] | None,
        expression: str | None,
        rescale: list[str] | None,
        colormap_name: str | None,
        tilesize: int | None,
    ) -> Rendering:
        ranges = []
        for text in rescale or []:
            try:
                low, high = (float(part) for part in text.split(","))
            except ValueError:
                raise InvalidTileRequest(f"rescale {text!r}: give it as min,max (e.g. 0,3000)") from None
            ranges.append((low, high))
        if bidx is not None and any(band < 1 for band in bidx):
            raise InvalidTileRequest(f"bidx {bidx}: bands are numbered from 1")
        if tilesize is not None and not 64 <= tilesize <= 1024:
            raise InvalidTileRequest(f"tilesize {tilesize}: give 64 to 1024 pixels")
        if colormap_name is not None:
            from rio_tiler.colormap import cmap

            if colormap_name not in cmap.list():
                raise InvalidTileRequest(f"colormap_name {colormap_name!r}: no such colormap (rio-tiler's names)")
        return cls(
            tuple(assets) if assets else None,
            tuple(bidx) if bidx else None,
            expression or None,
            tuple(ranges),
            colormap_name,
            tilesize,
        )


def tile_matrix_set(identifier: str) -> Any:
    """morecantile's tile matrix set ``identifier`` (``WebMercatorQuad``, ``WorldCRS84Quad``, ...), made once.

    ``morecantile.tms.get`` copies the set on every call (0.33 ms), and its
    ``rasterio_crs`` parses the CRS anew on every read (0.9 ms): a tile needs
    both, so both are kept (``_tile_reads.known_set`` and ``tiling_crs``).
    """
    import morecantile

    if identifier not in morecantile.tms.list():
        known = ", ".join(sorted(morecantile.tms.list()))
        raise InvalidTileRequest(f"tileMatrixSetId {identifier!r}: no such tile matrix set (known: {known})")
    return known_set(identifier)


def item_bands(view: Any, item: dict[str, Any], assets: tuple[str, ...] | None) -> list[tuple[str, xr.DataArray]]:
    """The ``(band, y, x)`` arrays of ``item``'s assets (the chosen ones, in that order), lazy and georeferenced.

    Raises:
        ItemNotFound: the item has no arrays.
        InvalidTileRequest: an asset it has no arrays for.
    """
    import rioxarray  # noqa: F401 - registers the .rio accessor rio-tiler reads the grid with

    arrays = read_arrays_asset(item)
    if arrays is None:
        raise ItemNotFound(f"item {item['id']!r} has no arrays to draw")
    keys = list(assets) if assets else sorted(arrays.pixels)
    unknown = [key for key in keys if key not in arrays.pixels]
    if unknown:
        raise InvalidTileRequest(f"assets {unknown}: item {item['id']!r} has arrays for {sorted(arrays.pixels)}")
    tree = view.open_items([item], keys)
    found: dict[str, xr.DataArray] = {}
    for node in tree.children.values():
        dataset = node.to_dataset()
        for key in dataset.attrs["assets"]:
            variable = dataset[key].isel(time=0, drop=True)
            band = next(dim for dim in variable.dims if dim not in ("y", "x"))
            variable = variable.rename({band: "band"}).drop_vars(["item", "collection"], errors="ignore")
            found[key] = variable.rio.write_crs(dataset.attrs["crs"])
    return [(key, found[key]) for key in keys]


def check_tile(tms: Any, tile: tuple[int, int, int]) -> None:
    """Refuse a ``(z, x, y)`` that is not a tile of ``tms``.

    Raises:
        InvalidTileRequest: the zoom is not one of the set's, or ``x``/``y`` is off its matrix.
    """
    z, x, y = tile
    if (
        z < tms.minzoom
        or z > tms.maxzoom
        or not 0 <= x < tms.matrix(z).matrixWidth
        or not 0 <= y < tms.matrix(z).matrixHeight
    ):
        raise InvalidTileRequest(f"tile {z}/{x}/{y} is not a tile of {tms.id}")


def read_tile(
    bands: list[tuple[str, xr.DataArray]], tms: Any, tile: tuple[int, int, int], rendering: Rendering
) -> tuple[ImageData, list[str]]:
    """The tile ``(z, x, y)`` of ``tms`` over ``bands``: one image with the chosen bands of every asset, as stored,
    and the bands' names (``{asset}_b{n}``).

    Raises:
        TileOutsideBounds: no asset reaches the tile.
        InvalidTileRequest: a band the assets do not have.
    """
    from rio_tiler.models import ImageData

    from ingest.api._tile_reads import warped_tile

    z, x, y = tile
    size = tile_size(tms, tile, rendering)
    images = []
    names = []
    for key, array in bands:
        count = array.sizes["band"]
        if rendering.bidx is not None and max(rendering.bidx) > count:
            raise InvalidTileRequest(f"bidx {list(rendering.bidx)}: asset {key!r} has {count} band(s)")
        image = warped_tile(array, tms, tile, size, rendering.bidx)
        if image is None:
            continue
        images.append(image)
        taken = rendering.bidx or tuple(range(1, count + 1))
        names += [f"{key}_b{band}" for band in taken]
    if not images:
        raise TileOutsideBounds(f"tile {z}/{x}/{y} of {tms.id} is outside the item's arrays")
    return (images[0] if len(images) == 1 else ImageData.create_from_list(images)), names


def finish(image: ImageData, names: list[str], keys: list[str], rendering: Rendering) -> ImageData:
    """``image`` with the rendering's expression and rescale applied (the colormap is the encoder's)."""
    if rendering.expression:
        image = _with_expression(image, rendering.expression, names, keys)
    if rendering.rescale:
        image.rescale(in_range=list(rendering.rescale))
    return image


def render_tile(
    bands: list[tuple[str, xr.DataArray]], tms: Any, tile: tuple[int, int, int], rendering: Rendering
) -> ImageData:
    """The tile ``(z, x, y)`` of ``tms`` over one item's ``bands``, drawn as ``rendering`` says.

    Raises:
        TileOutsideBounds: no asset reaches the tile.
        InvalidTileRequest: not a tile of ``tms``, or a band or expression the assets cannot give.
    """
    check_tile(tms, tile)
    image, names = read_tile(bands, tms, tile, rendering)
    return finish(image, names, [key for key, _ in bands], rendering)


def _with_expression(image: ImageData, expression: str, names: list[str], keys: list[str]) -> Any:
    """``expression`` over the image's bands, named ``b1``.., ``{asset}_b{n}``, or ``{asset}`` for its first band."""
    from rio_tiler.errors import RioTilerError

    aliases = {name: f"b{index}" for index, name in enumerate(names, start=1)}
    for key in keys:
        aliases.setdefault(key, aliases.get(f"{key}_b1", key))
    pattern = re.compile(r"\b(" + "|".join(re.escape(name) for name in sorted(aliases, key=len, reverse=True)) + r")\b")
    translated = pattern.sub(lambda match: aliases[match.group(1)], expression)
    try:
        return image.apply_expression(translated)
    except (RioTilerError, ValueError, KeyError, SyntaxError, TypeError) as error:  # numexpr's, rio-tiler's
        raise InvalidTileRequest(f"expression {expression!r}: {error}") from None


def tile_size(tms: Any, tile: tuple[int, int, int], rendering: Rendering) -> tuple[int, int]:
    """Height and width of a tile: the rendering's ``tilesize``, else the tile matrix's."""
    if rendering.tilesize:
        return rendering.tilesize, rendering.tilesize
    matrix = tms.matrix(tile[0])
    return matrix.tileHeight, matrix.tileWidth


def empty_tile(tms: Any, tile: tuple[int, int, int], rendering: Rendering) -> ImageData:
    """A tile with no data (every pixel masked: a transparent PNG), of the size :func:`read_tile` would give."""
    import numpy as np
    from rio_tiler.models import ImageData

    height, width = tile_size(tms, tile, rendering)
    return ImageData(np.ma.MaskedArray(np.zeros((1, height, width), dtype="uint8"), mask=True))


def encode(image: ImageData, extension: str, colormap_name: str | None) -> bytes:
    """The image in format ``extension`` (a key of :data:`FORMATS`), colored by ``colormap_name`` if given."""
    from rasterio.errors import RasterioError
    from rio_tiler.colormap import cmap
    from rio_tiler.errors import RioTilerError

    driver, _ = FORMATS[extension]
    colormap = cmap.get(colormap_name) if colormap_name else None
    options: dict[str, Any] = {"ZLEVEL": PNG_ZLEVEL} if driver == "PNG" else {}
    try:
        return image.render(img_format=driver, colormap=colormap, **options)
    except (RioTilerError, RasterioError, ValueError) as error:  # e.g. uint16 in WEBP
        raise InvalidTileRequest(
            f"format {extension!r} cannot hold these pixels ({error}); rescale them (rescale=min,max) or ask for png"
        ) from None


def mosaic_tile(
    bands_of: Callable[[dict[str, Any]], list[tuple[str, xr.DataArray]]],
    items: list[dict[str, Any]],
    tms: Any,
    tile: tuple[int, int, int],
    rendering: Rendering,
) -> ImageData:
    """The tile ``(z, x, y)`` of ``tms`` over ``items`` (newest first): each pixel from the first item that has it.

    ``bands_of`` gives an item's bands (:func:`item_bands` with the rendering's assets, or a cache of them).

    Items without the rendering's assets are passed over; items are read
    only until the tile is full (rio-tiler's ``mosaic_reader``).

    Raises:
        TileOutsideBounds: no item has arrays in the tile.
        InvalidTileRequest: not a tile of ``tms``, no ``assets`` chosen, or a band or expression they cannot give.
    """
    from rio_tiler.errors import EmptyMosaicError
    from rio_tiler.errors import TileOutsideBounds as OutsideBounds
    from rio_tiler.mosaic import mosaic_reader
    from rio_tiler.mosaic.methods import FirstMethod

    check_tile(tms, tile)
    if not rendering.assets:
        raise InvalidTileRequest("assets: a search's tiles need the asset keys to draw (assets=B04&assets=B03...)")
    names: list[str] = []

    def one(item: dict[str, Any], *_: Any, **__: Any) -> ImageData:
        try:
            bands = bands_of(item)
        except (ItemNotFound, InvalidTileRequest):  # no arrays, or not these assets: another item may have them
            raise OutsideBounds(f"item {item['id']!r} has no arrays for {list(rendering.assets or ())}") from None
        image, item_names = read_tile(bands, tms, tile, rendering)
        names[:] = item_names
        return image

    try:
        image, _ = mosaic_reader(
            items, one, pixel_selection=FirstMethod(), allowed_exceptions=(OutsideBounds, TileOutsideBounds)
        )
    except EmptyMosaicError:
        z, x, y = tile
        raise TileOutsideBounds(f"tile {z}/{x}/{y} of {tms.id}: no item of the search has arrays there") from None
    return finish(image, names, list(rendering.assets), rendering)
