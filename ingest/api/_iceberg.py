"""A read-only Iceberg REST catalog of the items table at every ref, under ``/iceberg/`` of ``floe serve``.

:class:`IcebergCatalog` answers the read half of the Iceberg REST catalog protocol (apache/iceberg
``open-api/rest-catalog-open-api.yaml``), reading each ref's table from the pointer its Icechunk commit carries
(docs/design.md §2). Its routes and answers: docs/sql.md#the-iceberg-rest-catalog-of-floe-serve.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import orjson
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ingest.errors import FloeError
from ingest.repository import Repository

NAMESPACE = "floe"
TABLE = "items"
ENDPOINTS = [
    "GET /v1/{prefix}/namespaces",
    "GET /v1/{prefix}/namespaces/{namespace}",
    "HEAD /v1/{prefix}/namespaces/{namespace}",
    "GET /v1/{prefix}/namespaces/{namespace}/tables",
    "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "HEAD /v1/{prefix}/namespaces/{namespace}/tables/{table}",
]
"""The routes this catalog answers, as the protocol's ``ConfigResponse.endpoints`` spells them."""
READS = frozenset({"GET", "HEAD"})
SHARED_IO_PROPERTIES = ("s3.endpoint", "s3.region", "s3.force-virtual-addressing")
"""FileIO settings a client needs to reach the repository's files (never credentials: clients bring their own)."""
_CACHED_METADATA = 32
"""metadata.json documents kept in memory (each is immutable: a location never changes content)."""


class CatalogError(Exception):
    """An answer in the protocol's error model (``{"error": {"message", "type", "code"}}``)."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


class IcebergCatalog:
    """The ASGI application of the catalog (mounted at ``/iceberg`` by the ref router)."""

    def __init__(self, repository: Repository, resolve: Any) -> None:
        self.repository = repository
        self.resolve = resolve
        """ref or None -> snapshot id (the search engine's, which caches tags and snapshot ids)."""
        self._metadata: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            # Resolving refs and reading metadata.json is blocking I/O (local disk or an object store).
            response = await run_in_threadpool(self._answer, request)
        except CatalogError as error:
            response = _error(error.status, error.kind, error.message)
        except FloeError as error:
            response = _error(500, "ServiceFailedException", str(error))
        if request.method == "HEAD":
            response = Response(status_code=response.status_code, headers=dict(response.headers))
        await response(scope, receive, send)

    # -- routing ------------------------------------------------------------------------------------
    def _answer(self, request: Request) -> Response:
        path, root = request.scope["path"], request.scope.get("root_path", "")
        relative = path[len(root) :] if root and path.startswith(root) else path
        parts = [part for part in relative.split("/") if part]
        if not parts or parts[0] != "v1":
            raise CatalogError(404, "NotFoundException", "this is an Iceberg REST catalog: its routes start at /v1/")
        parts = parts[1:]
        if request.method not in READS:
            raise CatalogError(
                405,
                "MethodNotAllowedException",
                f"{request.method} {relative}: floe's Iceberg catalog is read only; the items table changes only "
                "with floe's commits (floe ingest, floe delete, floe serve --transactions)",
            )
        if parts == ["config"]:
            return self._config(request)
        if len(parts) < 2 or parts[1] != "namespaces":
            raise CatalogError(404, "NotFoundException", f"no route {relative} (see GET /v1/config for endpoints)")
        # The prefix is the ref itself (floe's ref names and snapshot ids are one path segment each).
        snapshot_id = self._snapshot(parts[0])
        rest = parts[2:]
        if not rest:
            parent = request.query_params.get("parent")
            return _json({"namespaces": [] if parent else [[NAMESPACE]], "next-page-token": None})
        self._namespace(rest[0])
        if len(rest) == 1:
            return _json({"namespace": [NAMESPACE], "properties": {}})
        if rest[1:] == ["tables"]:
            return _json({"identifiers": [{"namespace": [NAMESPACE], "name": TABLE}], "next-page-token": None})
        if len(rest) == 3 and rest[1] == "tables":
            return self._load_table(request, rest[2], snapshot_id)
        raise CatalogError(404, "NotFoundException", f"no route {relative} (see GET /v1/config for endpoints)")

    def _snapshot(self, ref: str | None) -> str:
        try:
            snapshot_id: str = self.resolve(ref)
        except FloeError as error:
            raise CatalogError(404, "NoSuchWarehouseException", f"no warehouse {ref!r} here: {error}") from None
        return snapshot_id

    @staticmethod
    def _namespace(name: str) -> None:
        if name != NAMESPACE:
            raise CatalogError(404, "NoSuchNamespaceException", f"no namespace {name!r}: the one namespace is floe")

    # -- answers ------------------------------------------------------------------------------------
    def _config(self, request: Request) -> Response:
        ref = request.query_params.get("warehouse") or None
        try:
            self.resolve(ref)
        except FloeError as error:
            raise CatalogError(
                400, "BadRequestException", f"warehouse {ref!r} is no branch, tag or snapshot here: {error}"
            ) from None
        ref = ref or self.repository.settings.branch
        return _json({"defaults": {}, "overrides": {"prefix": ref}, "endpoints": ENDPOINTS})

    def _load_table(self, request: Request, name: str, snapshot_id: str) -> Response:
        if name != TABLE:
            raise CatalogError(404, "NoSuchTableException", f"no table {NAMESPACE}.{name}: the one table is items")
        etag = f'"{snapshot_id}"'
        if etag in {tag.strip().removeprefix("W/") for tag in request.headers.get("if-none-match", "").split(",")}:
            return Response(status_code=304, headers={"ETag": etag})
        location = self.repository.metadata_location_of(snapshot_id)
        properties = self.repository.io.properties
        config = {key: properties[key] for key in SHARED_IO_PROPERTIES if key in properties}
        body = b'{"metadata-location":%s,"metadata":%s,"config":%s}' % (
            orjson.dumps(location),
            self._metadata_json(location),
            orjson.dumps(config),
        )
        return Response(body, media_type="application/json", headers={"ETag": etag, "Floe-Snapshot": snapshot_id})

    def _metadata_json(self, location: str) -> bytes:
        with self._lock:
            cached = self._metadata.get(location)
        if cached is None:
            with self.repository.io.new_input(location).open() as stream:
                cached = orjson.dumps(orjson.loads(stream.read()))  # checked, and compact
        with self._lock:
            self._metadata[location] = cached
            self._metadata.move_to_end(location)
            while len(self._metadata) > _CACHED_METADATA:
                self._metadata.popitem(last=False)
        return cached


def _json(body: dict[str, Any], status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def _error(status: int, kind: str, message: str) -> Response:
    return _json({"error": {"message": message, "type": kind, "code": status}}, status)
