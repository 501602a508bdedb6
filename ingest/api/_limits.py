"""Request bodies the API reads: at most ``api.max_body_bytes``, refused with 413 beyond it, before parsing.

A Content-Length above the limit is answered at once (the body is read and
dropped up to a cap, so the client gets to read the answer); a body sent
without one (chunked) is cut off once it grows past the limit.
"""

from __future__ import annotations

from typing import Any

from starlette.types import Receive, Scope

from ingest.errors import RequestTooLarge

_DRAIN_AT_MOST = 64 * 1024 * 1024
"""A refused body is read and dropped up to this size, so the client reads the 413; beyond it the connection closes."""


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _too_large(size: int, limit: int) -> RequestTooLarge:
    return RequestTooLarge(f"the request body has {size:,} bytes; this server reads at most {limit:,}")


async def refuse_large_body(scope: Scope, receive: Receive, limit: int) -> RequestTooLarge | None:
    """The error answering a request whose Content-Length exceeds ``limit`` (its body read and dropped), or None."""
    declared = _content_length(scope)
    if declared is None or declared <= limit:
        return None
    await _drain(receive, limit=_DRAIN_AT_MOST)
    return _too_large(declared, limit)


async def _drain(receive: Receive, *, limit: int) -> None:
    received, more = 0, True
    while more and received <= limit:
        message = await receive()
        received += len(message.get("body", b""))
        more = message.get("more_body", False)


def bounded_receive(receive: Receive, limit: int) -> Receive:
    """``receive`` that fails once a body without a Content-Length (chunked) grows beyond ``limit``."""
    received = 0

    async def bounded() -> Any:
        nonlocal received
        message = await receive()
        received += len(message.get("body", b""))
        if received > limit:
            raise _too_large(received, limit)
        return message

    return bounded
