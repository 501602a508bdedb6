"""The STAC Transactions extension (``floe serve --transactions``): items changed over HTTP, one commit each.

:class:`TransactionsExtension` adds ``POST``, ``PUT``, ``PATCH`` and ``DELETE`` of items at the root of every
branch, each request one writer's commit; :func:`item_etag` is the ``ETag`` an ``If-Match`` names. The requests,
answers and rules: docs/stac-api.md#writing-through-the-api-transactions.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import attr
import orjson
from fastapi import APIRouter, FastAPI, Request
from stac_fastapi.types.extension import ApiExtension
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from ingest.api._request import SearchRequest
from ingest.errors import (
    CommitConflict,
    InvalidItem,
    ItemExists,
    ItemNotFound,
    NotAuthorized,
    ReadOnlyRef,
    StaleVersion,
)
from ingest.stac import ARRAYS_ASSET, validate_item, with_arrays_asset, without_arrays_asset, without_served_assets

if TYPE_CHECKING:
    from ingest.api._search import SearchEngine
    from ingest.repository import CommitResult, Repository, Writer

TRANSACTIONS_CONFORMANCE = "https://api.stacspec.org/v1.0.0/ogcapi-features/extensions/transaction"
RETRIES = 3
"""How often a write without ``If-Match`` is read and made again after concurrent commits changed its item."""
_SERVED_ONLY = ("href", "floe:snapshot", "floe:repository")
"""Members of the ``floe:arrays`` asset a server fills in (they name the snapshot served, not the item)."""

Key = tuple[str, str]


def item_etag(item: dict[str, Any]) -> str:
    """The entity tag of an item: a digest of what it stores (not its links, nor what serving adds)."""
    body = {key: value for key, value in without_served_assets(item).items() if key != "links"}
    assets = body.get("assets")
    if isinstance(assets, dict) and isinstance(assets.get(ARRAYS_ASSET), dict):
        asset = {key: value for key, value in assets[ARRAYS_ASSET].items() if key not in _SERVED_ONLY}
        body["assets"] = {**assets, ARRAYS_ASSET: asset}
    digest = hashlib.blake2b(orjson.dumps(body, option=orjson.OPT_SORT_KEYS), digest_size=16).hexdigest()
    return f'"{digest}"'


def merge_patch(target: Any, patch: Any) -> Any:
    """``target`` with the JSON merge patch ``patch`` applied (RFC 7386): objects merge, null removes."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def _snapshot(result: CommitResult) -> dict[str, str]:
    return {"Floe-Snapshot": result.snapshot_id}


def _json_body(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise InvalidItem(f"the request body is not JSON: {error}") from None


@attr.s(kw_only=True)
class TransactionsExtension(ApiExtension):
    """Registers the write routes on the application and advertises the extension's conformance class."""

    repository: Repository = attr.ib()
    engine: SearchEngine = attr.ib()
    token: str = attr.ib()
    ref_of: Callable[[Request], tuple[str | None, bool]] = attr.ib()
    """The ref a request names and whether it is pinned (a tag or a snapshot), as the ref router resolved it."""
    conformance_classes: list[str] = attr.ib(factory=lambda: [TRANSACTIONS_CONFORMANCE])
    _lock: threading.Lock = attr.ib(factory=threading.Lock)

    def register(self, app: FastAPI) -> None:
        router = APIRouter()
        items = "/collections/{collection_id}/items"
        router.add_api_route(items, self._route(self.create), methods=["POST"], name="Create Item")
        router.add_api_route(f"{items}/{{item_id}}", self._route(self.replace), methods=["PUT"], name="Update Item")
        router.add_api_route(f"{items}/{{item_id}}", self._route(self.patch), methods=["PATCH"], name="Patch Item")
        router.add_api_route(f"{items}/{{item_id}}", self._route(self.delete), methods=["DELETE"], name="Delete Item")
        app.include_router(router, tags=["Transaction Extension"])

    def _route(self, handler: Callable[..., Response]) -> Callable[..., Awaitable[Response]]:
        async def endpoint(request: Request, collection_id: str, item_id: str | None = None) -> Response:
            self._authorize(request)
            branch = self._branch(request)
            body = await request.body()
            # One write at a time per server: writers of other processes race through the commit protocol.
            return await run_in_threadpool(self._locked, handler, request, branch, collection_id, item_id, body)

        endpoint.__name__ = handler.__name__
        return endpoint

    def _locked(self, handler: Callable[..., Response], *args: Any) -> Response:
        with self._lock:
            return handler(*args)

    # -- checks ---------------------------------------------------------------------------------------
    def _authorize(self, request: Request) -> None:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self.token.encode()):
            raise NotAuthorized("writes need the write token: send Authorization: Bearer <token>")

    def _branch(self, request: Request) -> str:
        ref, pinned = self.ref_of(request)
        if pinned:
            raise ReadOnlyRef(f"{ref!r} is a tag or a snapshot, which never change: write to a branch's root")
        if ref is None:
            return self.repository.settings.branch
        return ref.split(":", 1)[1] if ref.startswith("branch:") else ref

    def _item(self, body: Any, collection_id: str, source: str, item_id: str | None = None) -> dict[str, Any]:
        """A body's item, validated, in ``collection_id`` (and named ``item_id``); its ``floe:arrays`` and the stacks'
        assets a server adds dropped."""
        if not isinstance(body, dict) or body.get("type") != "Feature":
            raise InvalidItem("expected a STAC Item (a GeoJSON Feature)", source=source)
        if body.get("collection", collection_id) != collection_id:
            raise InvalidItem(
                f"the item's collection {body.get('collection')!r} is not the path's {collection_id!r}",
                item_id=str(body.get("id")),
                source=source,
            )
        if item_id is not None and body.get("id") != item_id:
            raise InvalidItem(f"the item's id {body.get('id')!r} is not the path's {item_id!r}", source=source)
        stored = without_arrays_asset(without_served_assets(body))
        item = validate_item(stored, source=source, default_collection=collection_id)
        return item

    def _stored(self, writer: Writer, key: Key) -> dict[str, Any] | None:
        """The item as the writer's base stores it (what its ETag digests), or None; CollectionNotFound if the
        collection is not there either.

        Read through the writer's key index (kept across versions), not the
        search engine, whose state is made anew for every snapshot: a write
        lands a new one each time.
        """
        stored = writer.stored_items([key]).get(key)
        if stored is None:
            self.engine.collection(writer.session.snapshot_id, key[0])
        return stored

    def _current(self, snapshot_id: str, collection_id: str, item_id: str) -> dict[str, Any]:
        self.engine.collection(snapshot_id, collection_id)
        search = SearchRequest(collections=[collection_id], ids=[item_id], limit=1)
        page = self.engine.search(search, snapshot_id=snapshot_id)
        if not page.items:
            raise ItemNotFound(f"no item {item_id!r} in collection {collection_id!r} on this branch")
        return page.items[0]

    def _answer(self, result: CommitResult, key: Key, status: int = 200, *, body: bool = True) -> Response:
        """The item as written (``body``), or 204 with its ETag only."""
        item = self._current(result.snapshot_id, *key)
        headers = {"ETag": item_etag(item), "Floe-Snapshot": result.snapshot_id}
        if not body:
            return Response(status_code=204, headers=headers)
        return Response(orjson.dumps(item), status_code=status, media_type="application/geo+json", headers=headers)

    # -- the four writes ---------------------------------------------------------------------------------
    def create(self, request: Request, branch: str, collection_id: str, _: str | None, raw: bytes) -> Response:
        body = _json_body(raw)
        source = f"POST {request.url.path}"
        features = body.get("features") if isinstance(body, dict) and body.get("type") == "FeatureCollection" else None
        if features is not None and not isinstance(features, list):
            raise InvalidItem("a FeatureCollection's features must be a list", source=source)
        items = [
            self._item(feature, collection_id, source) for feature in (features if features is not None else [body])
        ]
        writer = self.repository.writer(branch)
        self.engine.collection(writer.session.snapshot_id, collection_id)
        for item in items:
            writer.add_item(item, replace=True, validated=True, source=source)
        keys = [(collection_id, item["id"]) for item in items]
        existing = writer.stored_items(keys)
        if existing:
            shown = ", ".join(sorted(item_id for _, item_id in existing)[:5])
            raise ItemExists(f"{len(existing)} item(s) exist already in {collection_id!r} ({shown}): PUT replaces one")
        for collection, item_id in keys:
            writer.expect(collection, item_id, None)
        try:
            result = writer.commit(f"POST /collections/{collection_id}/items ({len(items)} item(s))")
        except CommitConflict as error:
            raise ItemExists(f"an item of this request was created meanwhile by another commit: {error}") from None
        if features is None:
            answer = self._answer(result, keys[0], status=201)
            answer.headers["Location"] = f"{str(request.url).rstrip('/')}/{quote(keys[0][1], safe='')}"
            return answer
        summary = {"type": "FeatureCollection", "features": [], "numberCreated": len(items)}
        headers = {"Floe-Snapshot": result.snapshot_id}
        return Response(orjson.dumps(summary), status_code=201, media_type="application/geo+json", headers=headers)

    def replace(self, request: Request, branch: str, collection_id: str, item_id: str | None, raw: bytes) -> Response:
        assert item_id is not None
        item = self._item(_json_body(raw), collection_id, f"PUT {request.url.path}", item_id)
        return self._rewrite(request, branch, (collection_id, item_id), lambda stored: item)

    def patch(self, request: Request, branch: str, collection_id: str, item_id: str | None, raw: bytes) -> Response:
        assert item_id is not None
        patch = _json_body(raw)
        source = f"PATCH {request.url.path}"
        if not isinstance(patch, dict):
            raise InvalidItem(
                "PATCH takes a JSON merge patch (an object; RFC 7386), not a JSON Patch list", source=source
            )

        def patched(stored: dict[str, Any]) -> dict[str, Any]:
            return self._item(merge_patch(without_arrays_asset(stored), patch), collection_id, source, item_id)

        return self._rewrite(request, branch, (collection_id, item_id), patched)

    def delete(self, request: Request, branch: str, collection_id: str, item_id: str | None, raw: bytes) -> Response:
        assert item_id is not None
        key = (collection_id, item_id)

        def stage(writer: Writer, condition: str | None) -> Response | None:
            stored = self._stored(writer, key)
            if stored is None:
                if condition is not None and condition.strip() != "*":
                    raise StaleVersion(f"item {item_id!r} does not exist: If-Match names no version of it")
                # Deleting what is not there leaves the branch as asked (idempotent): no commit.
                return Response(status_code=204, headers={"Floe-Snapshot": writer.session.snapshot_id})
            self._check_match(condition, stored)
            writer.delete_item(*key)
            if condition is not None:
                writer.expect(*key, stored)
            return None

        return self._write(
            request, branch, key, stage, lambda result: Response(status_code=204, headers=_snapshot(result))
        )

    def _rewrite(
        self, request: Request, branch: str, key: Key, make: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> Response:
        """Replace an existing item with ``make(stored)``, keeping its arrays; conditional on ``If-Match``."""

        def stage(writer: Writer, condition: str | None) -> None:
            stored = self._stored(writer, key)
            if stored is None:
                raise ItemNotFound(f"no item {key[1]!r} in collection {key[0]!r} on this branch")
            self._check_match(condition, stored)
            item = make(stored)
            arrays = (stored.get("assets") or {}).get(ARRAYS_ASSET)
            if isinstance(arrays, dict):
                item = with_arrays_asset(item, arrays)  # the arrays stay as they are: only floe changes them
            writer.add_item(item, replace=True, validated=True)
            if condition is not None:
                writer.expect(*key, stored)

        # 204 with the new ETag, or the item itself when asked for (RFC 7240 Prefer: return=representation).
        representation = "return=representation" in request.headers.get("prefer", "")
        return self._write(request, branch, key, stage, lambda result: self._answer(result, key, body=representation))

    def _write(
        self,
        request: Request,
        branch: str,
        key: Key,
        stage: Callable[[Writer, str | None], Response | None],
        answer: Callable[[CommitResult], Response],
    ) -> Response:
        """Stage a change on a fresh writer and commit it. Refused with ``If-Match``: 412, nothing committed;
        without it the change is read and staged again on the new tip (:data:`RETRIES` times at most)."""
        condition = request.headers.get("if-match")
        for attempt in range(1, RETRIES + 2):
            writer = self.repository.writer(branch)
            early = stage(writer, condition)
            if early is not None:
                return early
            try:
                result = writer.commit(f"{request.method} /collections/{key[0]}/items/{key[1]}")
            except CommitConflict:
                if condition is not None:
                    raise StaleVersion(f"item {key[1]!r} changed while it was written; nothing was") from None
                if attempt > RETRIES:
                    raise
                continue
            return answer(result)
        raise AssertionError("unreachable")

    @staticmethod
    def _check_match(condition: str | None, current: dict[str, Any]) -> None:
        if condition is None or condition.strip() == "*":
            return
        tags = {tag.strip().removeprefix("W/") for tag in condition.split(",")}
        if item_etag(current) not in tags:
            raise StaleVersion(
                f"item {current['id']!r} is not the version If-Match names any more; read it again (its ETag)"
            )
