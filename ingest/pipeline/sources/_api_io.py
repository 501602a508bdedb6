"""How floe talks to a STAC API: pystac-client's HTTP reader with retries and floe's JSON parser, the headers each
URL takes, and a failure said in one line.

Transient answers (429, 5xx, dropped connections) are retried with exponential backoff by urllib3 under
pystac-client's session (:data:`RETRIES`); what still fails reaches the caller, which names the URL.
"""

from __future__ import annotations

from typing import Any

from ingest.remote import Headers
from ingest.stac import loads_json

RETRIES = 6
"""Retries of one request after a transient failure (backoff 0.5 s, 1 s, 2 s, ... between them)."""

TIMEOUT = (10.0, 60.0)
"""Seconds to connect, and to wait for a page."""


def session_io(headers: Headers | None = None, *, retries: int | None = None) -> Any:
    """pystac-client's HTTP reader with retries, decoding with floe's parser (``loads_json``: orjson where exact,
    5 us an item of a page instead of the standard parser's 10, docs/benchmarks-history.md).

    Each request carries the ``headers`` its URL takes (an API key), and no other. Pages are asked for as
    requests asks (gzip, deflate, Brotli where installed), whatever the host: an API on a loopback address may
    be a tunnel to one far away (docs/benchmarks-history.md, twentieth run). ``retries``: other than
    :data:`RETRIES` (0: one attempt, for a look that has somewhere else to go when it fails).
    """
    from pystac_client.stac_api_io import StacApiIO
    from urllib3.util.retry import Retry

    class ExactFastIO(StacApiIO):
        def json_loads(self, txt: str, *_: Any, **__: Any) -> Any:
            return loads_json(txt)

    retry = Retry(
        total=RETRIES if retries is None else retries,
        backoff_factor=0.5,
        status_forcelist=(429, 500, 502, 503, 504),
        allowed_methods=None,  # a search is a POST, and safe to repeat
        respect_retry_after_header=True,
        raise_on_status=False,  # the last answer reaches pystac-client, which names its status
    )
    return with_headers(ExactFastIO(max_retries=retry, timeout=TIMEOUT), headers)


def with_headers(io: Any, headers: Headers | None) -> Any:
    """``io`` (:func:`session_io`'s), each of its requests carrying the ``headers`` its URL takes."""
    if headers:
        io.session.auth = headers.requests_auth()
    return io


def failure_reason(error: Exception) -> str:
    """What went wrong with a request, in one line: the HTTP status where there was one, and the first line of the
    error (at most 300 characters)."""
    status = getattr(error, "status_code", None)
    text = str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__
    return f"HTTP {status}: {text}" if status else text
