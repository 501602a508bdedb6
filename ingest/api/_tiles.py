"""Map tiles of an item's arrays at any ref: rio-tiler's ``XarrayReader`` over the item's lazy stacks.

``/collections/{c}/items/{id}/tiles/{tileMatrixSetId}/{z}/{x}/{y}[.{format}]``
and ``.../{tileMatrixSetId}/tilejson.json`` take titiler's parameters
(``assets``, ``bidx``, ``expression``, ``rescale``, ``colormap_name``,
``tilesize``) and read only the chunks the tile overlaps, at the snapshot
the request's ref resolved to. A tile at a tag or a snapshot never changes:
its ``ETag`` names the snapshot and it is ``immutable``. What a tile is and
how to ask for one: docs/pixels.md#map-tiles.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Query, Request, Response

from ingest.api._request import SearchRequest
from ingest.api._router import SCOPE_PINNED, SCOPE_REF, SCOPE_SNAPSHOT
from ingest.errors import InvalidTileRequest, ItemNotFound, TileOutsideBounds
from ingest.stac import read_arrays_asset

if TYPE_CHECKING:
    import xarray as xr
    from rio_tiler.models import ImageData

    from ingest.api._search import SearchEngine

#: Output formats, by the extension a tile's path ends with, and what each is sent as.
FORMATS = {
    "png": ("PNG", "image/png"),
    "webp": ("WEBP", "image/webp"),
    "jpg": ("JPEG", "image/jpeg"),
    "jpeg": ("JPEG", "image/jpeg"),
    "tif": ("GTiff", "image/tiff; application=geotiff"),
    "npy": ("NPY", "application/x-binary"),
}
#: A year: what a tile at a tag or a snapshot may be kept for (it never changes).
IMMUTABLE = "public, max-age=31536000, immutable"
WEB_MAP_LINKS = "https://stac-extensions.github.io/web-map-links/v1.2.0/schema.json"


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
    """morecantile's tile matrix set ``identifier`` (``WebMercatorQuad``, ``WorldCRS84Quad``, ...)."""
    import morecantile

    try:
        return morecantile.tms.get(identifier)
    except morecantile.errors.InvalidIdentifier:
        known = ", ".join(sorted(morecantile.tms.list()))
        raise InvalidTileRequest(f"tileMatrixSetId {identifier!r}: no such tile matrix set (known: {known})") from None


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


def render_tile(
    bands: list[tuple[str, xr.DataArray]], tms: Any, tile: tuple[int, int, int], rendering: Rendering
) -> ImageData:
    """The tile ``(z, x, y)`` of ``tms`` over ``bands``, one image with every band of every asset, expression applied.

    Raises:
        TileOutsideBounds: no asset reaches the tile.
        InvalidTileRequest: a band or expression the assets cannot give.
    """
    from rio_tiler.errors import TileOutsideBounds as OutsideBounds
    from rio_tiler.io import XarrayReader
    from rio_tiler.models import ImageData

    z, x, y = tile
    if (
        z < tms.minzoom
        or z > tms.maxzoom
        or not 0 <= x < tms.matrix(z).matrixWidth
        or not 0 <= y < tms.matrix(z).matrixHeight
    ):
        raise InvalidTileRequest(f"tile {z}/{x}/{y} is not a tile of {tms.id}")
    images = []
    names = []
    for key, array in bands:
        count = array.sizes["band"]
        if rendering.bidx is not None and max(rendering.bidx) > count:
            raise InvalidTileRequest(f"bidx {list(rendering.bidx)}: asset {key!r} has {count} band(s)")
        with XarrayReader(array, tms=tms) as reader:
            try:
                image = reader.tile(x, y, z, tilesize=rendering.tilesize, indexes=rendering.bidx)
            except OutsideBounds:
                continue
        images.append(image)
        taken = rendering.bidx or tuple(range(1, count + 1))
        names += [f"{key}_b{band}" for band in taken]
    if not images:
        raise TileOutsideBounds(f"tile {z}/{x}/{y} of {tms.id} is outside the item's arrays")
    image = images[0] if len(images) == 1 else ImageData.create_from_list(images)
    if rendering.expression:
        image = _with_expression(image, rendering.expression, names, bands)
    if rendering.rescale:
        image.rescale(in_range=list(rendering.rescale))
    return image


def _with_expression(image: ImageData, expression: str, names: list[str], bands: list[tuple[str, Any]]) -> Any:
    """``expression`` over the image's bands, named ``b1``.., ``{asset}_b{n}``, or ``{asset}`` for its first band."""
    aliases = {name: f"b{index}" for index, name in enumerate(names, start=1)}
    for key, _ in bands:
        aliases.setdefault(key, aliases.get(f"{key}_b1", key))
    pattern = re.compile(r"\b(" + "|".join(re.escape(name) for name in sorted(aliases, key=len, reverse=True)) + r")\b")
    translated = pattern.sub(lambda match: aliases[match.group(1)], expression)
    from rio_tiler.errors import RioTilerError

    try:
        return image.apply_expression(translated)
    except (RioTilerError, ValueError, KeyError, SyntaxError, TypeError) as error:  # numexpr's, rio-tiler's
        raise InvalidTileRequest(f"expression {expression!r}: {error}") from None


def encode(image: ImageData, extension: str, colormap_name: str | None) -> bytes:
    """The image in format ``extension`` (a key of :data:`FORMATS`), colored by ``colormap_name`` if given."""
    from rasterio.errors import RasterioError
    from rio_tiler.colormap import cmap
    from rio_tiler.errors import RioTilerError

    driver, _ = FORMATS[extension]
    colormap = cmap.get(colormap_name) if colormap_name else None
    try:
        return image.render(img_format=driver, colormap=colormap)
    except (RioTilerError, RasterioError, ValueError) as error:  # e.g. uint16 in WEBP
        raise InvalidTileRequest(
            f"format {extension!r} cannot hold these pixels ({error}); rescale them (rescale=min,max) or ask for png"
        ) from None


def caching_headers(request: Request) -> dict[str, str]:
    """``ETag`` (the snapshot and the request) and ``Cache-Control`` (immutable at a tag or a snapshot)."""
    snapshot = request.scope[SCOPE_SNAPSHOT]
    digest = hashlib.blake2b(str(request.url).encode(), digest_size=6).hexdigest()
    pinned = bool(request.scope.get(SCOPE_PINNED)) or request.scope.get(SCOPE_REF) == snapshot
    return {"ETag": f'"{snapshot}-{digest}"', "Cache-Control": IMMUTABLE if pinned else "no-cache"}


def not_modified(request: Request, headers: dict[str, str]) -> bool:
    """Whether the client holds this very tile already (its ``If-None-Match`` names the ETag)."""
    asked = request.headers.get("if-none-match")
    if not asked:
        return False
    return asked.strip() == "*" or headers["ETag"] in (tag.strip().removeprefix("W/") for tag in asked.split(","))


def tiles_router(engine: SearchEngine) -> APIRouter:
    """The tile routes, for the STAC API app (the ref router has put the snapshot in each request's scope)."""
    from ingest.repository import View

    router = APIRouter()

    def item_at(request: Request, collection_id: str, item_id: str) -> tuple[Any, dict[str, Any]]:
        snapshot_id = request.scope[SCOPE_SNAPSHOT]
        engine.collection(snapshot_id, collection_id)
        page = engine.search(
            SearchRequest(collections=[collection_id], ids=[item_id], limit=1), snapshot_id=snapshot_id
        )
        if not page.items:
            raise ItemNotFound(f"no item {item_id!r} in collection {collection_id!r} at this ref")
        view = View(engine.repository, request.scope.get(SCOPE_REF) or snapshot_id, snapshot_id)
        return view, page.items[0]

    # The route with an extension first: FastAPI tries routes in the order they were added (innermost first).
    @router.get("/collections/{collection_id}/items/{item_id}/tiles/{tileMatrixSetId}/{z}/{x}/{y}")
    @router.get("/collections/{collection_id}/items/{item_id}/tiles/{tileMatrixSetId}/{z}/{x}/{y}.{extension}")
    def tile(  # noqa: PLR0917 - the route's parameters, passed by keyword by FastAPI
        request: Request,
        collection_id: str,
        item_id: str,
        tileMatrixSetId: str,  # titiler's and OGC's name
        z: int,
        x: int,
        y: int,
        extension: str = "png",
        assets: Annotated[list[str] | None, Query(description="asset keys (default: every asset with arrays)")] = None,
        bidx: Annotated[list[int] | None, Query(description="band numbers, from 1, of each asset")] = None,
        expression: Annotated[str | None, Query(description="band math: b1.., {asset}_b{n} or {asset}")] = None,
        rescale: Annotated[list[str] | None, Query(description="min,max of each band, to 0-255")] = None,
        colormap_name: Annotated[str | None, Query(description="a rio-tiler colormap for one band")] = None,
        tilesize: Annotated[int | None, Query(description="pixels of a side (default: the tile matrix's)")] = None,
    ) -> Response:
        if extension not in FORMATS:
            raise InvalidTileRequest(f"format {extension!r}: give one of {', '.join(FORMATS)}")
        rendering = Rendering.of(
            assets=assets,
            bidx=bidx,
            expression=expression,
            rescale=rescale,
            colormap_name=colormap_name,
            tilesize=tilesize,
        )
        tms = tile_matrix_set(tileMatrixSetId)
        headers = caching_headers(request)
        if not_modified(request, headers):
            return Response(status_code=304, headers=headers)
        view, item = item_at(request, collection_id, item_id)
        image = render_tile(item_bands(view, item, rendering.assets), tms, (z, x, y), rendering)
        content = encode(image, extension, rendering.colormap_name)
        return Response(content, media_type=FORMATS[extension][1], headers=headers)

    @router.get("/collections/{collection_id}/items/{item_id}/{tileMatrixSetId}/tilejson.json")
    def tilejson(  # noqa: PLR0917 - the route's parameters, passed by keyword by FastAPI
        request: Request,
        collection_id: str,
        item_id: str,
        tileMatrixSetId: str,  # titiler's and OGC's name
        tile_format: Annotated[str, Query(description="the format of the tiles it points to")] = "png",
        assets: Annotated[list[str] | None, Query()] = None,
        minzoom: Annotated[int | None, Query()] = None,
        maxzoom: Annotated[int | None, Query()] = None,
    ) -> dict[str, Any]:
        from rio_tiler.io import XarrayReader

        if tile_format not in FORMATS:
            raise InvalidTileRequest(f"tile_format {tile_format!r}: give one of {', '.join(FORMATS)}")
        tms = tile_matrix_set(tileMatrixSetId)
        view, item = item_at(request, collection_id, item_id)
        bands = item_bands(view, item, tuple(assets) if assets else None)
        with XarrayReader(bands[0][1], tms=tms) as reader:
            low, high = reader.minzoom, reader.maxzoom
            west, south, east, north = reader.get_geographic_bounds(tms.rasterio_geographic_crs)
        low = minzoom if minzoom is not None else low
        high = maxzoom if maxzoom is not None else high
        query = request.url.query
        kept = "&".join(
            part for part in query.split("&") if part and not part.startswith(("tile_format=", "minzoom=", "maxzoom="))
        )
        base = str(request.base_url).rstrip("/") + request.scope.get("root_path", "")
        url = (
            f"{base}/collections/{quote(collection_id, safe='')}/items/{quote(item_id, safe='')}/tiles/"
            f"{tileMatrixSetId}/{{z}}/{{x}}/{{y}}.{tile_format}"
        )
        return {
            "tilejson": "3.0.0",
            "name": item_id,
            "version": "1.0.0",
            "scheme": "xyz",
            "tiles": [f"{url}?{kept}" if kept else url],
            "minzoom": low,
            "maxzoom": high,
            "bounds": [west, south, east, north],
            "center": [(west + east) / 2, (south + north) / 2, low],
        }

    return router


def web_map_link(base: str, item: dict[str, Any]) -> dict[str, Any] | None:
    """The ``xyz`` link (web-map-links extension) that draws ``item``'s arrays on a web map, if it has any."""
    arrays = read_arrays_asset(item)
    if arrays is None or not item.get("collection"):
        return None
    keys = sorted(arrays.pixels)
    query = "&".join(f"assets={quote(key, safe='')}" for key in keys[:1])
    collection, item_id = quote(str(item["collection"]), safe=""), quote(str(item["id"]), safe="")
    return {
        "rel": "xyz",
        "type": "image/png",
        "title": f"{keys[0]} of this release" if keys else "arrays",
        "href": f"{base}/collections/{collection}/items/{item_id}/tiles/WebMercatorQuad/{{z}}/{{x}}/{{y}}.png?{query}",
    }
