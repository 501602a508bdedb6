"""The STAC API: stac-fastapi's ``StacApi`` with floe's core client, the standard extensions, and ref routing.

``/`` serves the default branch and ``/refs/{ref}/`` every branch, tag and snapshot id, from one application (the
ref routing is ``_router``'s). Searching is the engine's (``_search``); how floe's errors answer is ``_errors``'s,
the request models ``_models``'s, and the fields extension's trimming of items ``_fields``'s. The design:
docs/design.md §6 (every ref is an API root); what clients see: docs/stac-api.md#refs-in-urls and #paging.
"""

import json
from typing import Any, cast
from urllib.parse import quote, urlencode

import orjson
from fastapi import FastAPI, Request
from stac_fastapi.api.app import StacApi
from stac_fastapi.api.errors import DEFAULT_STATUS_CODES
from stac_fastapi.api.models import (
    create_get_request_model,
    create_post_request_model,
    create_request_model,
)
from stac_fastapi.extensions import (
    FieldsExtension,
    QueryExtension,
    SortExtension,
    TokenPaginationExtension,
)
from stac_fastapi.extensions.fields.fields import FieldsConformanceClasses
from stac_fastapi.extensions.filter import FilterConformanceClasses
from stac_fastapi.extensions.filter.client import BaseFiltersClient
from stac_fastapi.extensions.query.query import QueryConformanceClasses
from stac_fastapi.extensions.sort import SortConformanceClasses
from stac_fastapi.types.config import ApiSettings
from stac_fastapi.types.core import BaseCoreClient
from stac_fastapi.types.extension import ApiExtension
from stac_fastapi.types.requests import get_base_url
from stac_fastapi.types.search import APIRequest
from stac_fastapi.types.stac import LandingPage
from starlette.responses import Response

from ingest.api._browser import BrowserMount, browser_home, installed_build
from ingest.api._errors import add_floe_exception_handlers
from ingest.api._fields import apply_fields, requested_fields
from ingest.api._iceberg import IcebergCatalog
from ingest.api._models import FloeFilterExtension, ItemsGetRequest, SearchGetRequest, SearchPostRequest
from ingest.api._mosaic_routes import mosaic_routes
from ingest.api._request import SearchPage, SearchRequest
from ingest.api._router import SCOPE_PINNED, SCOPE_REF, SCOPE_SNAPSHOT, RefRouter
from ingest.api._search import SearchEngine
from ingest.api._tile_routes import WEB_MAP_LINKS, tiles_router, web_map_link
from ingest.api._transactions import TransactionsExtension, item_etag
from ingest.errors import InvalidInput, ItemNotFound
from ingest.repository import Repository
from ingest.stac import served_collection

SNAPSHOT_HEADER = "Floe-Snapshot"
"""The response header naming the snapshot a page of items was read at (every page of a paged search names one)."""
GEOJSON = "application/geo+json"


class _JSON(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        try:
            return orjson.dumps(content)
        except TypeError:
            # An integer beyond 64 bits (floe keeps them exactly): orjson refuses it, and one such item made its
            # whole page an error 500. The standard library writes it (as floe's exports do).
            return json.dumps(content, separators=(",", ":"), ensure_ascii=False).encode()


class _GeoJSON(_JSON):
    media_type = GEOJSON


def _snapshot(request: Request) -> str:
    """The snapshot the ref router resolved this request's ref to (once per request), from the request's scope."""
    return request.scope[SCOPE_SNAPSHOT]


def _search(engine: SearchEngine, request: Request, search: SearchRequest) -> SearchPage:
    """One page of ``search`` at the request's snapshot (a token of another snapshot is refused at a tag)."""
    return engine.search(search, snapshot_id=_snapshot(request), pinned=request.scope.get(SCOPE_PINNED, False))


class FloeClient(BaseCoreClient):
    """floe's STAC core client: every call reads the snapshot its request resolved to."""

    def __init__(self, engine: SearchEngine, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.engine = engine

    # -- helpers -----------------------------------------------------------------------------
    @staticmethod
    def _base(request: Request) -> str:
        return get_base_url(request).rstrip("/")

    def _item_links(self, base: str, item: dict[str, Any]) -> dict[str, Any]:
        collection = item.get("collection")
        item_id = quote(str(item.get("id")), safe="")
        links = [
            link for link in item.get("links") or [] if link.get("rel") not in ("self", "parent", "collection", "root")
        ]
        if collection:
            collection_url = f"{base}/collections/{quote(collection, safe='')}"
            links = [
                {"rel": "self", "type": GEOJSON, "href": f"{collection_url}/items/{item_id}"},
                {"rel": "parent", "type": "application/json", "href": collection_url},
                {"rel": "collection", "type": "application/json", "href": collection_url},
                {"rel": "root", "type": "application/json", "href": f"{base}/"},
                *links,
            ]
        tiles = web_map_link(base, item)
        if tiles is not None:
            links.append(tiles)
            extensions = item.setdefault("stac_extensions", [])
            if WEB_MAP_LINKS not in extensions:
                extensions.append(WEB_MAP_LINKS)
        item["links"] = links
        return item

    def _collection_document(self, base: str, collection: dict[str, Any], snapshot_id: str) -> dict[str, Any]:
        document = dict(collection)
        if self.engine.has_stacks(snapshot_id, document["id"]):
            document = served_collection(document, self.engine.arrays, snapshot_id)
        url = f"{base}/collections/{quote(document['id'], safe='')}"
        own = [
            link
            for link in document.get("links") or []
            if link.get("rel") not in ("self", "parent", "root", "items", "queryables")
        ]
        document["links"] = [
            {"rel": "self", "type": "application/json", "href": url},
            {"rel": "parent", "type": "application/json", "href": f"{base}/"},
            {"rel": "root", "type": "application/json", "href": f"{base}/"},
            {"rel": "items", "type": GEOJSON, "href": f"{url}/items"},
            {
                "rel": "http://www.opengis.net/def/rel/ogc/1.0/queryables",
                "type": "application/schema+json",
                "href": f"{url}/queryables",
            },
            *own,
        ]
        return document

    def _item_collection(
        self,
        request: Request,
        page: SearchPage,
        fields: Any = None,
        next_link: dict[str, Any] | None = None,
    ) -> Response:
        base = self._base(request)
        include, exclude, include_given = requested_fields(fields)
        features = [apply_fields(self._item_links(base, item), include, exclude, include_given) for item in page.items]
        links: list[dict[str, Any]] = [
            {"rel": "root", "type": "application/json", "href": f"{base}/"},
            {"rel": "self", "type": GEOJSON, "href": str(request.url)},
        ]
        if next_link is not None:
            links.append(next_link)
        body = {
            "type": "FeatureCollection",
            "features": features,
            "links": links,
            "numberReturned": len(features),
        }
        if page.number_matched is not None:
            body["numberMatched"] = page.number_matched
        return _GeoJSON(body, headers={SNAPSHOT_HEADER: page.snapshot_id})

    @staticmethod
    def _get_next(request: Request, token: str) -> dict[str, Any]:
        params = [(key, value) for key, value in request.query_params.multi_items() if key != "token"]
        params.append(("token", token))
        url = str(request.url.replace(query=urlencode(params)))
        return {"rel": "next", "type": GEOJSON, "method": "GET", "href": url}

    # -- core endpoints ----------------------------------------------------------------------
    # stac-fastapi's base class declares these return its TypedDicts; floe answers with its own orjson Response (the
    # framework passes a Response through untouched), hence the narrow `override` ignores marked "a Response".
    def landing_page(self, **kwargs: Any) -> LandingPage:
        request: Request = kwargs["request"]
        page = super().landing_page(**kwargs)
        base = self._base(request)
        ref = request.scope.get(SCOPE_REF)
        page["id"] = f"floe-{ref}" if ref else "floe"
        page["title"] = f"floe at {ref}" if ref else "floe"
        page["description"] = f"A floe repository at snapshot {_snapshot(request)}" + (f" ({ref})" if ref else "")
        queryables = "http://www.opengis.net/def/rel/ogc/1.0/queryables"
        if not any(link.get("rel") == queryables for link in page["links"]):
            # The framework adds this link only for its own FilterExtension class, by name.
            page["links"].append({"rel": queryables, "type": "application/schema+json", "href": f"{base}/queryables"})
        if installed_build(browser_home(self.engine.repository.settings)) is not None:
            page["links"].append(
                {"rel": "alternate", "type": "text/html", "title": "STAC Browser", "href": f"{base}/browser/"}
            )
        for collection_id in self.engine.collections(_snapshot(request)):
            page["links"].append(
                {
                    "rel": "child",
                    "type": "application/json",
                    "href": f"{base}/collections/{quote(collection_id, safe='')}",
                }
            )
        return page

    def all_collections(self, **kwargs: Any) -> Response:  # type: ignore[override]  # a Response
        request: Request = kwargs["request"]
        base = self._base(request)
        snapshot_id = _snapshot(request)
        collections = [
            self._collection_document(base, collection, snapshot_id)
            for collection in self.engine.collections(snapshot_id).values()
        ]
        return _JSON(
            {
                "collections": collections,
                "links": [
                    {"rel": "root", "type": "application/json", "href": f"{base}/"},
                    {"rel": "parent", "type": "application/json", "href": f"{base}/"},
                    {"rel": "self", "type": "application/json", "href": f"{base}/collections"},
                ],
            }
        )

    def get_collection(self, collection_id: str, **kwargs: Any) -> Response:  # type: ignore[override]  # a Response
        request: Request = kwargs["request"]
        snapshot_id = _snapshot(request)
        collection = self.engine.collection(snapshot_id, collection_id)
        return _JSON(self._collection_document(self._base(request), collection, snapshot_id))

    def item_collection(  # type: ignore[override]  # a Response
        self,
        collection_id: str,
        bbox: Any = None,
        datetime: str | None = None,
        limit: int | None = 10,
        token: str | None = None,
        **kwargs: Any,
    ) -> Response:
        request: Request = kwargs["request"]
        self.engine.collection(_snapshot(request), collection_id)
        search = SearchRequest(
            collections=[collection_id],
            bbox=list(bbox) if bbox else None,
            datetime=datetime,
            limit=limit or 10,
            token=token,
        )
        page = _search(self.engine, request, search)
        next_link = self._get_next(request, page.next_token) if page.next_token else None
        return self._item_collection(request, page, next_link=next_link)

    def get_item(self, item_id: str, collection_id: str, **kwargs: Any) -> Response:  # type: ignore[override]  # a Response
        request: Request = kwargs["request"]
        snapshot_id = _snapshot(request)
        self.engine.collection(snapshot_id, collection_id)
        page = self.engine.search(
            SearchRequest(collections=[collection_id], ids=[item_id], limit=1), snapshot_id=snapshot_id
        )
        if not page.items:
            raise ItemNotFound(f"no item {item_id!r} in collection {collection_id!r} at this ref")
        # The ETag names the item's version: a write with If-Match holds only for it (_transactions.py).
        etag = item_etag(page.items[0])
        return _GeoJSON(self._item_links(self._base(request), page.items[0]), headers={"ETag": etag})

    def get_search(  # type: ignore[override]  # noqa: PLR0917 - a Response; the framework passes keywords
        self,
        collections: list[str] | None = None,
        ids: list[str] | None = None,
        bbox: Any = None,
        intersects: str | None = None,  # type: ignore[override]  # GET passes the geometry as JSON text, not a model
        datetime: str | None = None,
        limit: int | None = 10,
        **kwargs: Any,
    ) -> Response:
        request: Request = kwargs["request"]
        search = SearchRequest(
            collections=collections,
            ids=ids,
            bbox=list(bbox) if bbox else None,
            intersects=intersects,
            datetime=datetime,
            filter=kwargs.get("filter_expr"),
            filter_lang=kwargs.get("filter_lang") or "cql2-text",
            query=kwargs.get("query"),
            sortby=kwargs.get("sortby"),
            limit=limit or 10,
            token=kwargs.get("token"),
        )
        page = _search(self.engine, request, search)
        next_link = self._get_next(request, page.next_token) if page.next_token else None
        return self._item_collection(request, page, fields=kwargs.get("fields"), next_link=next_link)

    def post_search(self, search_request: Any, **kwargs: Any) -> Response:  # type: ignore[override]  # a Response
        request: Request = kwargs["request"]
        intersects = search_request.intersects
        search = SearchRequest(
            collections=search_request.collections,
            ids=search_request.ids,
            bbox=list(search_request.bbox) if search_request.bbox else None,
            intersects=intersects.model_dump(mode="json", exclude_none=True) if intersects is not None else None,
            datetime=search_request.datetime,
            filter=getattr(search_request, "filter_expr", None),
            filter_lang=getattr(search_request, "filter_lang", None),
            query=getattr(search_request, "query", None),
            sortby=getattr(search_request, "sortby", None),
            limit=search_request.limit or 10,
            token=getattr(search_request, "token", None),
        )
        page = _search(self.engine, request, search)
        next_link = None
        if page.next_token:
            body = search_request.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_unset=True)
            body["token"] = page.next_token
            next_link = {
                "rel": "next",
                "type": GEOJSON,
                "method": "POST",
                "href": f"{self._base(request)}/search",
                "body": body,
                "merge": False,
            }
        return self._item_collection(request, page, fields=getattr(search_request, "fields", None), next_link=next_link)


class FloeFiltersClient(BaseFiltersClient):
    """Queryables: the typed columns of the items table at the request's snapshot."""

    def __init__(self, engine: SearchEngine) -> None:
        self.engine = engine

    def get_queryables(self, collection_id: str | None = None, **kwargs: Any) -> dict[str, Any]:
        request: Request = kwargs["request"]
        document = self.engine.queryables(_snapshot(request), collection_id)
        base = FloeClient._base(request)
        document["$id"] = f"{base}/collections/{collection_id}/queryables" if collection_id else f"{base}/queryables"
        return document


def create_app(
    repository: Repository, *, max_limit: int | None = None, cache_mb: int | None = None, transactions: bool = False
) -> RefRouter:
    """The ASGI application serving ``repository``: the default branch at ``/``, every ref at ``/refs/{ref}/``.

    Also the Iceberg REST catalog at ``/iceberg/`` and STAC Browser at
    ``[/refs/{ref}]/browser/``. Nothing is read until a request comes: floe's
    errors then answer with their status (``_errors.py``).

    Args:
        repository: the repository to serve.
        max_limit: the most items a page holds (default: ``api.max_limit``).
        cache_mb: the budget, in MB, of the decoded columns the search engine keeps between requests (default:
            ``api.cache_mb``).
        transactions: accept writes of items, with ``api.write_token`` (``_transactions.py``).

    Returns:
        The application (an ASGI callable), for uvicorn or a test client.

    Raises:
        InvalidInput: ``transactions`` is asked without an ``api.write_token``.
    """
    api_settings = repository.settings.api
    if transactions and not api_settings.write_token:
        raise InvalidInput("the Transactions extension needs a write token: set FLOE_API__WRITE_TOKEN")
    engine = SearchEngine(
        repository,
        max_limit=max_limit if max_limit is not None else api_settings.max_limit,
        refuse_over_limit=api_settings.refuse_over_limit,
        refuse_unknown_properties=api_settings.refuse_unknown_properties,
        cache_mb=cache_mb if cache_mb is not None else api_settings.cache_mb,
        long_searches=api_settings.long_searches,
    )
    # Conformance: what floe implements on /search (the items endpoint pages, but neither filters nor sorts).
    filter_classes = [
        FilterConformanceClasses.FILTER,
        FilterConformanceClasses.SEARCH,
        FilterConformanceClasses.BASIC_CQL2,
        FilterConformanceClasses.CQL2_JSON,
        FilterConformanceClasses.CQL2_TEXT,
        FilterConformanceClasses.ADVANCED_COMPARISON_OPERATORS,
        FilterConformanceClasses.BASIC_SPATIAL_FUNCTIONS,
        FilterConformanceClasses.TEMPORAL_FUNCTIONS,
    ]
    search_extensions = [
        FloeFilterExtension(client=FloeFiltersClient(engine), conformance_classes=[str(c) for c in filter_classes]),
        SortExtension(
            conformance_classes=[
                str(SortConformanceClasses.ITEM_SEARCH_SORT),
                "https://api.stacspec.org/v1.0.0/item-search#sort",
            ]
        ),
        FieldsExtension(conformance_classes=[str(FieldsConformanceClasses.SEARCH)]),
        QueryExtension(conformance_classes=[str(QueryConformanceClasses.SEARCH)]),
        TokenPaginationExtension(),
    ]
    extensions: list[ApiExtension] = list(search_extensions)
    if transactions:
        extensions.append(
            TransactionsExtension(
                repository=repository,
                engine=engine,
                token=api_settings.write_token or "",
                ref_of=lambda request: (request.scope.get(SCOPE_REF), bool(request.scope.get(SCOPE_PINNED))),
            )
        )
    settings = ApiSettings(
        stac_fastapi_title="floe",
        stac_fastapi_description="STAC API over a floe repository (Icechunk arrays + Iceberg items), at any ref",
        stac_fastapi_landing_id="floe",
    )
    # A GET request model is an attrs APIRequest class; the framework's signature covers POST models too.
    items_model = cast(
        "type[APIRequest]",
        create_request_model(
            model_name="ItemCollectionUri",
            base_model=ItemsGetRequest,
            extensions=[TokenPaginationExtension()],
            request_type="GET",
        ),
    )
    api = StacApi(
        settings=settings,
        app=FastAPI(
            openapi_url=settings.openapi_url,
            docs_url=settings.docs_url,
            redoc_url=None,
            title=settings.stac_fastapi_title,
            version=settings.stac_fastapi_version,
            description=settings.stac_fastapi_description,
            root_path_in_servers=False,
        ),
        client=FloeClient(engine, extensions=extensions, title="floe", landing_page_id="floe"),
        extensions=extensions,
        exceptions=dict(DEFAULT_STATUS_CODES),
        search_get_request_model=create_get_request_model(search_extensions, base_model=SearchGetRequest),
        search_post_request_model=create_post_request_model(search_extensions, base_model=SearchPostRequest),
        items_get_request_model=items_model,
        response_class=_JSON,
    )
    api.app.include_router(tiles_router(engine, mosaic_routes), tags=["Map tiles"])
    add_floe_exception_handlers(api.app)
    return RefRouter(
        api.app,
        engine,
        max_body_bytes=api_settings.max_body_bytes,
        iceberg=IcebergCatalog(repository, engine.resolve),
        browser=BrowserMount(repository, lambda scope: scope.get(SCOPE_REF) or repository.settings.branch),
    )
