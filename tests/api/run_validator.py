"""Run stac-api-validator offline: the JSON schemas it fetches come from tests/data/stac-schemas.

The validator (and stac-validator, stac-check and pystac under it) fetch
schemas with urllib, urllib3 (pystac's own validation) and requests from schemas.stacspec.org,
stac-extensions.github.io and geojson.org. This script serves the vendored
copies from a local HTTP server on 127.0.0.1 and rewrites those URLs to it
before running the validator in-process; any other URL is left alone (and
fails offline, which shows up as an error in the output).

Usage: python tests/api/run_validator.py --root-url http://127.0.0.1:PORT/ [validator options]
"""

from __future__ import annotations

import functools
import http.server
import sys
import threading
import urllib.request
from pathlib import Path

SCHEMAS = Path(__file__).resolve().parents[1] / "data" / "stac-schemas"
HOSTS = tuple(path.name for path in SCHEMAS.iterdir() if path.is_dir())


def serve_schemas() -> str:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(SCHEMAS))
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


def local(url: str, base: str) -> str:
    for scheme in ("https://", "http://"):
        for host in HOSTS:
            if url.startswith(f"{scheme}{host}/"):
                return f"{base}/{host}/{url[len(scheme) + len(host) + 1 :]}"
    return url


def patch(base: str) -> None:
    import requests

    original_urlopen = urllib.request.urlopen

    def urlopen(request, *args, **kwargs):  # type: ignore[no-untyped-def]
        kwargs.pop("context", None)
        if isinstance(request, urllib.request.Request):
            rewritten = local(request.full_url, base)
            if rewritten != request.full_url:
                request = urllib.request.Request(rewritten, headers=dict(request.header_items()))
        else:
            request = local(str(request), base)
        return original_urlopen(request, *args, **kwargs)

    urllib.request.urlopen = urlopen
    original_request = requests.Session.request

    def session_request(self, method, url, *args, **kwargs):  # type: ignore[no-untyped-def]
        return original_request(self, method, local(str(url), base), *args, **kwargs)

    requests.Session.request = session_request  # type: ignore[method-assign]
    import urllib3

    original_pool_request = urllib3.PoolManager.request

    def pool_request(self, method, url, *args, **kwargs):  # type: ignore[no-untyped-def]
        return original_pool_request(self, method, local(str(url), base), *args, **kwargs)

    urllib3.PoolManager.request = pool_request  # type: ignore[method-assign]
    import stac_validator.utilities

    stac_validator.utilities.urlopen = urlopen  # imported by name


def main() -> None:
    patch(serve_schemas())
    from stac_api_validator.__main__ import main as validator

    validator(args=sys.argv[1:], prog_name="stac-api-validator")


if __name__ == "__main__":
    main()
