"""The map tile routes of the STAC API, at every ref: one item's tiles, a search's mosaic, TileJSON.

``/collections/{c}/items/{id}/tiles/{tileMatrixSetId}/{z}/{x}/{y}[.{format}]``,
``/collections/{c}/items/{id}/{tileMatrixSetId}/tilejson.json``, and a
search's mosaic (``_mosaic_routes``), read at the snapshot the request's ref
resolved to (``_router``). A tile at a tag or a snapshot never changes: its ``ETag``
names the snapshot and it is ``immutable``. Drawing is ``_tiles``;
docs/pixels.md#map-tiles.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, Query, Request, Response
from stac_fastapi.types.requests import get_base_url

from ingest.api._request import SearchRequest
from ingest.api._router import SCOPE_PINNED, SCOPE_REF, SCOPE_SNAPSHOT
from ingest.api._tiles import (
    FORMATS,
    Rendering,
    empty_tile,
    encode,
    item_bands,
    load_tiling,
    render_tile,
    tile_matrix_set,
)
from ingest.errors import InvalidTileRequest, ItemNotFound, TileOutsideBounds
from ingest.stac import read_arrays_asset

if TYPE_CHECKING:
    from ingest.api._search import SearchEngine

#: A year: what a tile at a tag or a snapshot may be kept for (it never changes).
IMMUTABLE = "public, max-age=31536000, immutable"
WEB_MAP_LINKS = "https://stac-extensions.github.io/web-map-links/v1.2.0/schema.json"


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


def tiles_router(engine: SearchEngine, *more: Callable[[APIRouter, OpenedItems], None]) -> APIRouter:
    """The tile routes, for the STAC API app (the ref router has put the snapshot in each request's scope): an
    item's, and those ``more`` adds (the search mosaics', ``_mosaic_routes``), sharing one :class:`OpenedItems`."""
    router = APIRouter()
    opened = OpenedItems(engine)
    _item_tiles(router, opened)
    _item_tilejson(router, opened)
    for add in more:
        add(router, opened)
    return router


def _view(engine: SearchEngine, request: Request) -> Any:
    """The repository at the snapshot the request's ref resolved to."""
    from ingest.repository import View

    snapshot_id = request.scope[SCOPE_SNAPSHOT]
    return View(engine.repository, request.scope.get(SCOPE_REF) or snapshot_id, snapshot_id)


def _item_at(engine: SearchEngine, request: Request, collection_id: str, item_id: str) -> dict[str, Any]:
    """The item at the request's snapshot (``CollectionNotFound``, ``ItemNotFound``)."""
    snapshot_id = request.scope[SCOPE_SNAPSHOT]
    engine.collection(snapshot_id, collection_id)
    page = engine.search(SearchRequest(collections=[collection_id], ids=[item_id], limit=1), snapshot_id=snapshot_id)
    if not page.items:
        raise ItemNotFound(f"no item {item_id!r} in collection {collection_id!r} at this ref")
    return page.items[0]


class OpenedItems:
    """Items' lazy arrays (:func:`~ingest.api._tiles.item_bands`) by snapshot, collection, item and assets, the
    ``size`` most recently used kept.

    A map asks for a dozen tiles of one item at once, and a snapshot never
    changes: the item's row and its arrays' metadata are read once, not per
    tile (the pixels stay in the chunk cache, ``ingest.repository._chunks``).
    """

    def __init__(self, engine: SearchEngine, size: int = 256) -> None:
        self.engine = engine
        self.size = size
        self._entries: OrderedDict[tuple[Any, ...], list[tuple[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()

    def bands(
        self, request: Request, collection_id: str, item_id: str, assets: tuple[str, ...] | None, item: Any = None
    ) -> list[tuple[str, Any]]:
        """The item's bands at the request's snapshot; ``item`` (its JSON, when a search gave it) spares a look-up.

        Raises:
            CollectionNotFound, ItemNotFound: no such collection or item there; the item has no arrays.
            InvalidTileRequest: an asset the item has no arrays for.
        """
        key = (request.scope[SCOPE_SNAPSHOT], collection_id, item_id, assets)
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                return found
        if item is None:
            item = _item_at(self.engine, request, collection_id, item_id)
        bands = item_bands(_view(self.engine, request), item, assets)
        with self._lock:
            self._entries[key] = bands
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return bands


def rendering_query(  # noqa: PLR0917 - the query parameters, passed by keyword by FastAPI
    assets: Annotated[list[str] | None, Query(description="asset keys (default: every asset with arrays)")] = None,
    bidx: Annotated[list[int] | None, Query(description="band numbers, from 1, of each asset")] = None,
    expression: Annotated[str | None, Query(description="band math: b1.., {asset}_b{n} or {asset}")] = None,
    rescale: Annotated[list[str] | None, Query(description="min,max of each band, to 0-255")] = None,
    colormap_name: Annotated[str | None, Query(description="a rio-tiler colormap for one band")] = None,
    tilesize: Annotated[int | None, Query(description="pixels of a side (default: the tile matrix's)")] = None,
) -> Rendering:
    """How a tile route's query says to draw (titiler's parameters), checked: a FastAPI dependency."""
    load_tiling()
    return Rendering.of(
        assets=assets,
        bidx=bidx,
        expression=expression,
        rescale=rescale,
        colormap_name=colormap_name,
        tilesize=tilesize,
    )


@dataclass(frozen=True)
class TileAddress:
    """Which tile a route's path names: the tile matrix set, ``(z, x, y)`` and the format's extension."""

    tile_matrix_set_id: str
    tile: tuple[int, int, int]
    extension: str


def tile_address(
    tileMatrixSetId: str,  # titiler's and OGC's name
    z: int,
    x: int,
    y: int,
    extension: str = "png",
) -> TileAddress:
    """The tile a tile route's path names (a FastAPI dependency: path parameters read once for every route)."""
    return TileAddress(tileMatrixSetId, (z, x, y), extension)


def tile_response(
    request: Request, where: TileAddress, *, rendering: Rendering, draw: Callable[[Any], Any]
) -> Response:
    """The tile ``draw`` makes for the tile matrix set, encoded as the address's extension, with its caching
    headers: 304 when the client holds it already (nothing is drawn), an empty tile where there is no data (a map
    asks for every tile in view)."""
    if where.extension not in FORMATS:
        raise InvalidTileRequest(f"format {where.extension!r}: give one of {', '.join(FORMATS)}")
    tms = tile_matrix_set(where.tile_matrix_set_id)
    headers = caching_headers(request)
    if not_modified(request, headers):
        return Response(status_code=304, headers=headers)
    try:
        image = draw(tms)
    except TileOutsideBounds:
        image = empty_tile(tms, where.tile, rendering)
    content = encode(image, where.extension, rendering.colormap_name)
    return Response(content, media_type=FORMATS[where.extension][1], headers=headers)


def _item_tiles(router: APIRouter, opened: OpenedItems) -> None:
    # The route with an extension first: FastAPI tries routes in the order they were added (innermost first).
    @router.get("/collections/{collection_id}/items/{item_id}/tiles/{tileMatrixSetId}/{z}/{x}/{y}")
    @router.get("/collections/{collection_id}/items/{item_id}/tiles/{tileMatrixSetId}/{z}/{x}/{y}.{extension}")
    def tile(
        request: Request,
        collection_id: str,
        item_id: str,
        where: Annotated[TileAddress, Depends(tile_address)],
        rendering: Annotated[Rendering, Depends(rendering_query)],
    ) -> Response:
        def draw(tms: Any) -> Any:
            bands = opened.bands(request, collection_id, item_id, rendering.assets)
            return render_tile(bands, tms, where.tile, rendering)

        return tile_response(request, where, rendering=rendering, draw=draw)


def _item_tilejson(router: APIRouter, opened: OpenedItems) -> None:
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

        load_tiling()
        if tile_format not in FORMATS:
            raise InvalidTileRequest(f"tile_format {tile_format!r}: give one of {', '.join(FORMATS)}")
        tms = tile_matrix_set(tileMatrixSetId)
        bands = opened.bands(request, collection_id, item_id, tuple(assets) if assets else None)
        with XarrayReader(bands[0][1], tms=tms) as reader:
            low, high = reader.minzoom, reader.maxzoom
            west, south, east, north = reader.get_geographic_bounds(tms.rasterio_geographic_crs)
        low = minzoom if minzoom is not None else low
        high = maxzoom if maxzoom is not None else high
        query = request.url.query
        kept = "&".join(
            part for part in query.split("&") if part and not part.startswith(("tile_format=", "minzoom=", "maxzoom="))
        )
        base = get_base_url(request).rstrip("/")  # the ref's root, as the API's own links are built
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


def web_map_link(base: str, item: dict[str, Any]) -> dict[str, Any] | None:
    """The ``xyz`` link (web-map-links extension) that draws ``item``'s arrays on a web map, if it has any."""
    arrays = read_arrays_asset(item)
    if arrays is None or not item.get("collection"):
        return None
    keys = sorted(arrays.pixels)
    query = "&".join(f"assets={quote(key, safe='')}" for key in keys[:1])
    stretch = _statistics(item.get("assets", {}).get(keys[0]) or {})
    if stretch is not None:
        query += f"&rescale={stretch[0]:g},{stretch[1]:g}"
    collection, item_id = quote(str(item["collection"]), safe=""), quote(str(item["id"]), safe="")
    return {
        "rel": "xyz",
        "type": "image/png",
        "title": f"{keys[0]} of this release" if keys else "arrays",
        "href": f"{base}/collections/{collection}/items/{item_id}/tiles/WebMercatorQuad/{{z}}/{{x}}/{{y}}.png?{query}",
    }


def _statistics(asset: dict[str, Any]) -> tuple[float, float] | None:
    """The first band's minimum and maximum, as the asset states them (the raster extension's ``raster:bands``, or
    STAC 1.1's ``bands``): the stretch a web map needs for pixels that are not 8-bit."""
    for field in ("raster:bands", "bands"):
        bands = asset.get(field)
        if isinstance(bands, list) and bands and isinstance(bands[0], dict):
            statistics = bands[0].get("statistics") or {}
            low, high = statistics.get("minimum"), statistics.get("maximum")
            if isinstance(low, int | float) and isinstance(high, int | float) and high > low:
                return float(low), float(high)
    return None
