"""A search's mosaic at every ref, newest on top: the search in the query, or registered once and named by an id.

``/search/tiles/{tileMatrixSetId}/{z}/{x}/{y}[.{format}]`` takes the search
in its query (``collections``, ``datetime``, ``filter``). ``POST
/searches/register`` takes a search body (``collections``, ``ids``, ``bbox``,
``datetime``, ``filter``, ``filter-lang``), checks it at the ref and answers
its id with links to ``/searches/{id}``, its TileJSON
``/searches/{id}/{tileMatrixSetId}/tilejson.json`` and its tiles
``/searches/{id}/tiles/{tileMatrixSetId}/{z}/{x}/{y}[.{format}]``, as
titiler-pgstac's registered searches do.

A registered search is not stored anywhere: its id is the search itself
(canonical JSON, compressed, base64url), so every server process, every
restart and every replica reads it the same, and nothing is written on a
read path. An id names a search, not a ref: the same id draws any ref's
items. Drawing is ``_tiles.mosaic_tile``; docs/pixels.md#map-tiles.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Body, Depends, Query, Request, Response
from stac_fastapi.types.requests import get_base_url

from ingest.api._request import SearchRequest
from ingest.api._router import SCOPE_SNAPSHOT
from ingest.api._tile_routes import OpenedItems, TileAddress, rendering_query, tile_address, tile_response
from ingest.api._tiles import FORMATS, Rendering, check_tile, load_tiling, mosaic_tile, tile_matrix_set
from ingest.errors import InvalidSearch, InvalidTileRequest, SearchNotFound, TileOutsideBounds

MAX_ITEMS = 50
"""Items a mosaic tile reads at most, newest first (``max_items`` changes it, up to 500)."""


@dataclass(frozen=True)
class MosaicSearch:
    """The items a mosaic draws: a search without paging or order (newest on top, always)."""

    collections: tuple[str, ...] | None = None
    ids: tuple[str, ...] | None = None
    bbox: tuple[float, float, float, float] | None = None
    datetime: str | None = None
    filter: str | dict[str, Any] | None = None
    filter_lang: str | None = None

    @classmethod
    def from_body(cls, body: Any) -> MosaicSearch:
        """The search of a registration's JSON body (the STAC search's names); InvalidSearch naming what is wrong."""
        if not isinstance(body, dict):
            raise InvalidSearch("a search to register is a JSON object: collections, ids, bbox, datetime, filter")
        known = {"collections", "ids", "bbox", "datetime", "filter", "filter-lang"}
        unknown = sorted(set(body) - known)
        if unknown:
            raise InvalidSearch(f"a mosaic search takes {', '.join(sorted(known))}; not {', '.join(unknown)}")
        return cls(
            collections=_names(body, "collections"),
            ids=_names(body, "ids"),
            bbox=_bbox(body.get("bbox")),
            datetime=_text(body, "datetime"),
            filter=_filter(body.get("filter")),
            filter_lang=_text(body, "filter-lang"),
        )

    def body(self) -> dict[str, Any]:
        """The search as a STAC search body (its fields that are set)."""
        fields = {key.replace("_", "-"): value for key, value in asdict(self).items() if value is not None}
        return {key: list(value) if isinstance(value, tuple) else value for key, value in fields.items()}

    @property
    def id(self) -> str:
        """The search itself, as a path segment: canonical JSON, zlib, base64url without padding."""
        packed = zlib.compress(orjson.dumps(self.body(), option=orjson.OPT_SORT_KEYS), 9)
        return base64.urlsafe_b64encode(packed).rstrip(b"=").decode()

    @classmethod
    def from_id(cls, search_id: str) -> MosaicSearch:
        """The search an id is; SearchNotFound when it is none (an id is never looked up, only decoded)."""
        try:
            packed = base64.urlsafe_b64decode(search_id + "=" * (-len(search_id) % 4))
            return cls.from_body(orjson.loads(zlib.decompress(packed)))
        except (binascii.Error, ValueError, zlib.error) as error:
            raise SearchNotFound(
                f"no search has the id {search_id[:40]!r}: register one with POST /searches/register"
            ) from error

    def request(self, bounds: Sequence[float], limit: int) -> SearchRequest:
        """The search for one tile of ``bounds`` (west, south, east, north), newest first; TileOutsideBounds when
        the search's own bbox leaves nothing of the tile."""
        west, south, east, north = bounds
        if self.bbox is not None:
            west, south = max(west, self.bbox[0]), max(south, self.bbox[1])
            east, north = min(east, self.bbox[2]), min(north, self.bbox[3])
            if west >= east or south >= north:
                raise TileOutsideBounds("the tile lies outside the search's bbox")
        return SearchRequest(
            collections=list(self.collections) if self.collections else None,
            ids=list(self.ids) if self.ids else None,
            bbox=[west, south, east, north],
            datetime=self.datetime,
            filter=self.filter,
            filter_lang=self.filter_lang,
            sortby="-datetime",
            limit=limit,
        )


def _names(body: dict[str, Any], key: str) -> tuple[str, ...] | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(name, str) and name for name in value):
        raise InvalidSearch(f"{key} is a list of names, not {orjson.dumps(value).decode()[:80]}")
    return tuple(value)


def _text(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise InvalidSearch(f"{key} is text, not {orjson.dumps(value).decode()[:80]}")
    return value


def _bbox(value: Any) -> tuple[float, float, float, float] | None:
    if value is None:
        return None
    if not (isinstance(value, list) and len(value) == 4 and all(isinstance(v, int | float) for v in value)):
        raise InvalidSearch(f"a mosaic's bbox is [west, south, east, north], not {orjson.dumps(value).decode()[:80]}")
    west, south, east, north = (float(v) for v in value)
    if west >= east or south >= north:
        raise InvalidSearch(f"bbox {value}: west must be below east and south below north")
    return west, south, east, north


def _filter(value: Any) -> str | dict[str, Any] | None:
    if value is not None and not isinstance(value, str | dict):
        raise InvalidSearch("filter is CQL2 text or CQL2 JSON")
    return value


def mosaic_routes(router: APIRouter, opened: OpenedItems) -> None:
    """Add the search mosaic's routes (encoded and registered) to ``router``."""
    _registration(router, opened)
    _encoded_tiles(router, opened)
    _registered_tiles(router, opened)


def _described(request: Request, search: MosaicSearch) -> dict[str, Any]:
    """A registered search as the API answers it: its id, its body and where its tiles are."""
    url = f"{get_base_url(request).rstrip('/')}/searches/{search.id}"
    return {
        "id": search.id,
        "search": search.body(),
        "links": [
            {"rel": "self", "type": "application/json", "href": url},
            {"rel": "tilejson", "type": "application/json", "href": f"{url}/WebMercatorQuad/tilejson.json"},
            {
                "rel": "xyz",
                "type": "image/png",
                "href": f"{url}/tiles/WebMercatorQuad/{{z}}/{{x}}/{{y}}.png",
                "templated": True,
            },
        ],
    }


def _registration(router: APIRouter, opened: OpenedItems) -> None:
    @router.post("/searches/register")
    def register(request: Request, body: Annotated[Any, Body()]) -> dict[str, Any]:
        search = MosaicSearch.from_body(body)
        # Checked as a search at this ref (collections known, filter valid): reads no file.
        engine = opened.engine
        engine.plan(engine.state(request.scope[SCOPE_SNAPSHOT]), search.request((-180, -90, 180, 90), 1))
        return _described(request, search)

    @router.get("/searches/{search_id}")
    def described(request: Request, search_id: str) -> dict[str, Any]:
        return _described(request, MosaicSearch.from_id(search_id))


def _mosaic_response(
    opened: OpenedItems,
    request: Request,
    search: MosaicSearch,
    *,
    rendering: Rendering,
    max_items: int,
    where: TileAddress,
) -> Response:
    """One tile of ``search``'s mosaic at the request's snapshot, as ``tile_response`` answers it."""

    def draw(tms: Any) -> Any:
        from morecantile import Tile

        check_tile(tms, where.tile)
        z, x, y = where.tile
        bounds = tms.bounds(Tile(x=x, y=y, z=z))
        found = opened.engine.search(search.request(bounds, max_items), snapshot_id=request.scope[SCOPE_SNAPSHOT])

        def bands_of(item: dict[str, Any]) -> list[tuple[str, Any]]:
            return opened.bands(request, str(item["collection"]), str(item["id"]), rendering.assets, item)

        return mosaic_tile(bands_of, found.items, tms, where.tile, rendering)

    return tile_response(request, where, rendering=rendering, draw=draw)


def _encoded_tiles(router: APIRouter, opened: OpenedItems) -> None:
    # The route with an extension first: FastAPI tries routes in the order they were added (innermost first).
    @router.get("/search/tiles/{tileMatrixSetId}/{z}/{x}/{y}")
    @router.get("/search/tiles/{tileMatrixSetId}/{z}/{x}/{y}.{extension}")
    def search_tile(  # noqa: PLR0917 - the route's parameters, passed by keyword by FastAPI
        request: Request,
        where: Annotated[TileAddress, Depends(tile_address)],
        rendering: Annotated[Rendering, Depends(rendering_query)],
        collections: Annotated[str | None, Query(description="comma-separated collection ids")] = None,
        datetime: Annotated[str | None, Query(description="an RFC 3339 date-time or interval")] = None,
        filter: Annotated[str | None, Query(description="a CQL2 filter")] = None,
        filter_lang: Annotated[str | None, Query(alias="filter-lang")] = None,
        max_items: Annotated[int, Query(ge=1, le=500, description="items read at most, newest first")] = MAX_ITEMS,
    ) -> Response:
        search = MosaicSearch(
            collections=tuple(collections.split(",")) if collections else None,
            datetime=datetime,
            filter=filter,
            filter_lang=filter_lang,
        )
        return _mosaic_response(
            opened,
            request,
            search,
            rendering=rendering,
            max_items=max_items,
            where=where,
        )


def _registered_tiles(router: APIRouter, opened: OpenedItems) -> None:
    @router.get("/searches/{search_id}/tiles/{tileMatrixSetId}/{z}/{x}/{y}")
    @router.get("/searches/{search_id}/tiles/{tileMatrixSetId}/{z}/{x}/{y}.{extension}")
    def registered_tile(
        request: Request,
        search_id: str,
        where: Annotated[TileAddress, Depends(tile_address)],
        rendering: Annotated[Rendering, Depends(rendering_query)],
        max_items: Annotated[int, Query(ge=1, le=500, description="items read at most, newest first")] = MAX_ITEMS,
    ) -> Response:
        search = MosaicSearch.from_id(search_id)
        return _mosaic_response(
            opened,
            request,
            search,
            rendering=rendering,
            max_items=max_items,
            where=where,
        )

    @router.get("/searches/{search_id}/{tileMatrixSetId}/tilejson.json")
    def registered_tilejson(  # noqa: PLR0917 - the route's parameters, passed by keyword by FastAPI
        request: Request,
        search_id: str,
        tileMatrixSetId: str,
        tile_format: Annotated[str, Query(description="the format of the tiles it points to")] = "png",
        minzoom: Annotated[int | None, Query()] = None,
        maxzoom: Annotated[int | None, Query()] = None,
    ) -> dict[str, Any]:
        load_tiling()
        search = MosaicSearch.from_id(search_id)
        if tile_format not in FORMATS:
            raise InvalidTileRequest(f"tile_format {tile_format!r}: give one of {', '.join(FORMATS)}")
        tms = tile_matrix_set(tileMatrixSetId)
        west, south, east, north = search.bbox or tms.bbox
        low = minzoom if minzoom is not None else tms.minzoom
        high = maxzoom if maxzoom is not None else tms.maxzoom
        kept = "&".join(
            part
            for part in request.url.query.split("&")
            if part and not part.startswith(("tile_format=", "minzoom=", "maxzoom="))
        )
        url = f"{get_base_url(request).rstrip('/')}/searches/{search_id}/tiles/{tileMatrixSetId}/{{z}}/{{x}}/{{y}}"
        url += f".{tile_format}"
        return {
            "tilejson": "3.0.0",
            "name": f"search {search_id[:16]}",
            "version": "1.0.0",
            "scheme": "xyz",
            "tiles": [f"{url}?{kept}" if kept else url],
            "minzoom": low,
            "maxzoom": high,
            "bounds": [west, south, east, north],
            "center": [(west + east) / 2, (south + north) / 2, low],
        }
