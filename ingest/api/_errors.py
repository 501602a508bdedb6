"""floe's errors as HTTP answers: the status of each group of the error tree, and the error's kind as the code.

Like stac-fastapi's ``stac_fastapi/api/errors.py`` (``DEFAULT_STATUS_CODES``
and ``add_exception_handlers``), statuses are mapped by parent class: an
error answers the status of its nearest listed ancestor in
:data:`FLOE_STATUS_CODES`, so a new error class needs no entry. The body is
``{"code": <kind>, "description": <message>}``, with the stable ``kind``
callers can branch on. The route handlers and the ref router (which answers
before any route runs) use the same mapping.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.responses import Response
from starlette.types import Send

from ingest.errors import (
    AlreadyExists,
    Conflict,
    Corrupt,
    FloeError,
    InvalidInput,
    NotAuthorized,
    NotFound,
    ReadOnlyRef,
    Refused,
    RequestTooLarge,
    StaleVersion,
    Unavailable,
)

log = logging.getLogger(__name__)


# What a request did wrong answers 4xx; a broken store, a bug or an unreachable service is the server's (5xx).
FLOE_STATUS_CODES: dict[type[FloeError], int] = {
    NotFound: 404,
    AlreadyExists: 409,
    InvalidInput: 400,
    RequestTooLarge: 413,
    Conflict: 409,
    StaleVersion: 412,
    NotAuthorized: 401,
    ReadOnlyRef: 405,
    Refused: 403,
    Corrupt: 500,
    Unavailable: 503,
    FloeError: 500,
}


def status_of(error: FloeError) -> int:
    """The HTTP status that answers ``error``: its nearest ancestor's in :data:`FLOE_STATUS_CODES`."""
    for error_class in type(error).__mro__:
        if error_class in FLOE_STATUS_CODES:
            return FLOE_STATUS_CODES[error_class]
    return 500  # pragma: no cover - FloeError itself is listed


def error_body(error: FloeError) -> dict[str, str]:
    """The JSON body of an error answer: the error's stable ``kind`` as the code, and its message."""
    return {"code": error.kind, "description": str(error)}


INVALID_REQUEST = "invalid-request"
"""The code of a request the framework's models refuse (a parameter of the wrong type or form)."""


def add_floe_exception_handlers(app: FastAPI) -> None:
    """Answer floe's errors with their group's status and their kind (as stac-fastapi's add_exception_handlers).

    A request the models refuse answers 400 in the same form, its description
    naming each parameter and what is wrong with it; unlike stac-fastapi's own
    handler, it does not echo the request body back (up to the body limit).
    """
    for error_class in FLOE_STATUS_CODES:
        app.add_exception_handler(error_class, _floe_error_response)
    app.add_exception_handler(RequestValidationError, _validation_error_response)


def validation_reasons(errors: Sequence[Any]) -> str:
    """One line per refused parameter (``limit: Input should be greater than 0``), at most five."""
    reasons: dict[str, str] = {}
    for error in errors:
        location = [str(part) for part in error.get("loc", ()) if part not in ("body", "query", "path")]
        name = location[0] if location else "the request"
        # A union (intersects: Point or Polygon or ...) fails once per form: the first failure speaks for it.
        reasons.setdefault(name, f"{'.'.join(location) or name}: {error.get('msg', 'invalid')}")
    lines = list(reasons.values())
    return "; ".join(lines[:5]) + ("; ..." if len(lines) > 5 else "")


def _validation_error_response(request: Request, error: Exception) -> Response:
    errors = error.errors() if isinstance(error, RequestValidationError) else []
    description = f"invalid request: {validation_reasons(errors)}"
    _log_error(400, f"{request.method} {request.url.path}: {description}")
    detail = [{key: entry.get(key) for key in ("type", "loc", "msg")} for entry in errors[:20]]
    body = {"code": INVALID_REQUEST, "description": description, "detail": detail}
    return Response(orjson.dumps(body, default=str), status_code=400, media_type="application/json")


def _floe_error_response(request: Request, error: Exception) -> Response:
    # Registered for FloeError classes only; Starlette types handlers for any exception.
    floe_error = error if isinstance(error, FloeError) else FloeError(str(error))
    status = status_of(floe_error)
    _log_error(status, f"{request.method} {request.url.path}: {floe_error}")
    return Response(orjson.dumps(error_body(floe_error)), status_code=status, media_type="application/json")


def _log_error(status: int, message: str) -> None:
    # A client's mistake is routine (info); a server-side failure is worth an operator's attention (error).
    (log.error if status >= 500 else log.info)("%s", message)


async def send_error(send: Send, error: FloeError) -> None:
    """Answer ``error`` as the exception handlers do, from the ASGI layer (before any route runs)."""
    status = status_of(error)
    _log_error(status, f"ref {error}")
    body = orjson.dumps(error_body(error))
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
