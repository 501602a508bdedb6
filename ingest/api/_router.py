"""The ASGI layer in front of the STAC API: which ref a request names, and the apps beside the API.

``/refs/{ref}/...`` becomes the same STAC API with ``root_path``
``/refs/{ref}`` (so every link the framework and the client build points
under the prefix), and the ref is resolved to a snapshot once per request,
which the API's client reads from the request scope. Unknown refs answer 404
before any route runs. Beside the API: the Iceberg REST catalog at
``/iceberg/`` (``_iceberg``; it names refs in its own paths) and STAC Browser
at ``/browser/`` and ``/refs/{ref}/browser/`` (``_browser``).
"""

from __future__ import annotations

from urllib.parse import unquote

from starlette.types import ASGIApp, Receive, Scope, Send

from ingest.api._browser import SCOPE_SERVER_ROOT
from ingest.api._errors import send_error
from ingest.api._limits import bounded_receive, refuse_large_body
from ingest.api._search import SearchEngine
from ingest.errors import FloeError, RefNotFound

REFS_PREFIX = "/refs/"
ICEBERG_PREFIX = "/iceberg/"
BROWSER_PATH = "/browser"
SCOPE_REF = "floe.ref"
SCOPE_SNAPSHOT = "floe.snapshot"
SCOPE_PINNED = "floe.pinned"


class RefRouter:
    """ASGI layer: ``/refs/{ref}/...`` -> the same app with ``root_path`` ``/refs/{ref}``; resolves the ref once."""

    def __init__(
        self,
        app: ASGIApp,
        engine: SearchEngine,
        *,
        max_body_bytes: int,
        iceberg: ASGIApp | None = None,
        browser: ASGIApp | None = None,
    ) -> None:
        """``iceberg`` answers ``/iceberg/...`` and ``browser`` ``[/refs/{ref}]/browser/...``; without them those
        paths reach ``app`` (which has no such routes)."""
        self.app = app
        self.engine = engine
        self.max_body_bytes = max_body_bytes
        self.iceberg = iceberg
        self.browser = browser

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refused = await refuse_large_body(scope, receive, self.max_body_bytes)
        if refused is not None:
            await send_error(send, refused)
            return
        receive = bounded_receive(receive, self.max_body_bytes)
        scope = dict(scope)
        root = scope.get("root_path", "")
        path = scope["path"]
        relative = path[len(root) :] if root and path.startswith(root) else path
        if self.iceberg is not None and (relative.startswith(ICEBERG_PREFIX) or relative == ICEBERG_PREFIX.rstrip("/")):
            # The Iceberg REST catalog names its ref in each path itself (a warehouse's prefix).
            scope["root_path"] = root + ICEBERG_PREFIX.rstrip("/")
            await self.iceberg(scope, receive, send)
            return
        ref = None
        inner = relative
        if relative.startswith(REFS_PREFIX) or relative == REFS_PREFIX.rstrip("/"):
            name, slash, rest = relative[len(REFS_PREFIX) :].partition("/")
            ref = unquote(name)
            prefix = REFS_PREFIX + name
            scope["root_path"] = root + prefix
            inner = slash + rest
            if not slash:
                scope["path"] = path + "/"
                scope["raw_path"] = scope["path"].encode()
            if not ref:
                await send_error(send, RefNotFound("give a ref: /refs/{branch, tag or snapshot id}/"))
                return
        try:
            scope[SCOPE_SNAPSHOT] = self.engine.resolve(ref)
        except FloeError as error:
            await send_error(send, error)
            return
        scope[SCOPE_REF] = ref
        scope[SCOPE_PINNED] = self.engine.pins(ref)
        if self.browser is not None and (inner == BROWSER_PATH or inner.startswith(BROWSER_PATH + "/")):
            scope["root_path"] = scope["root_path"] + BROWSER_PATH
            scope[SCOPE_SERVER_ROOT] = root
            await self.browser(scope, receive, send)
            return
        await self.app(scope, receive, send)
