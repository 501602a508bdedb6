"""Azure Blob Storage with a SAS token service, as Planetary Computer has them, for tests, on 127.0.0.1:
``python -m tests._blob_server FOLDER PORT``.

- Blobs are addressed path-style, as Azurite addresses them: ``/<account>/<container>/<blob>`` is the file
  ``FOLDER/<account>/<container>/<blob>``, served as tests/_http_server.py serves files (ranges, ETags, ...).
  A read without a query is answered as Planetary Computer's storage accounts answer one: 409
  ``PublicAccessNotPermitted``; one whose ``sig`` is not that of a token this server issued for the container,
  or whose expiry (``se``) has passed, 403 ``AuthenticationFailed``.
- ``/__sas__/token/<account>/<container>``: the token service. A container that is a folder gets
  ``{"msft:expiry": ..., "token": "se=...&sp=rl&sr=c&sig=..."}``, valid ``/__sas__/ttl/<seconds>`` (default
  3,600); another 404. ``/__sas__/mode/garbage`` makes it answer something else than a token, ``.../ok`` not.
- List Blobs (``GET /<account>/<container>?restype=container&comp=list&prefix=...&marker=...``), as a
  token allows and refuses reads: the blobs under ``prefix`` in name order, ``/__sas__/list-page/<n>`` at most
  a page (default 5,000), with a ``NextMarker`` while more remain.
- ``/__sas__/stats``: tokens issued per container, the subscription keys (``Ocp-Apim-Subscription-Key``) they
  were asked with, the blob reads: ``signed`` (a valid token), ``unsigned`` and ``refused``, and the listings
  answered.

The test fixture starts it as a subprocess and stops it with ``os.kill(pid, SIGTERM)``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import threading
from datetime import UTC, datetime, timedelta
from email.utils import formatdate
from http import HTTPStatus
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlparse
from xml.sax.saxutils import escape

from tests._http_server import FileServer, _Handler, serve_until_terminated

SECRET = b"floe-test-account-key"
_TOKEN_PATH = re.compile(r"^/__sas__/token/([^/]+)/([^/]+)$")


def signature(account: str, container: str, expiry: str) -> str:
    return hashlib.sha256(SECRET + f"{account}/{container}/{expiry}".encode()).hexdigest()[:32]


class BlobServer(FileServer):
    def __init__(self, folder: Path, port: int) -> None:
        super().__init__(folder, port)
        self.RequestHandlerClass = _BlobHandler
        self.ttl = 3600.0
        self.mode = "ok"
        self.issued: dict[str, int] = {}
        self.keys: list[str] = []
        self.reads = {"signed": 0, "unsigned": 0, "refused": 0}
        self.list_page = 5000
        self.listings = 0
        self.url = f"http://127.0.0.1:{port}"
        self.lock = threading.Lock()


class _BlobHandler(_Handler):
    server: BlobServer

    def _answer(self, *, head: bool) -> None:
        parsed = urlparse(self.path)
        path = unquote(parsed.path)
        try:
            if path.startswith("/__sas__/"):
                self._service(path, head)
            else:
                self._blob(path, parse_qs(parsed.query), head)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _service(self, path: str, head: bool) -> None:
        server = self.server
        if path == "/__sas__/stats":
            with server.lock:
                body = {
                    "issued": server.issued,
                    "keys": server.keys,
                    "reads": server.reads,
                    "listings": server.listings,
                }
            self._json(HTTPStatus.OK, body, head)
        elif path.startswith("/__sas__/ttl/"):
            server.ttl = float(path.rsplit("/", 1)[1])
            self._json(HTTPStatus.OK, {"ttl": server.ttl}, head)
        elif path.startswith("/__sas__/list-page/"):
            server.list_page = int(path.rsplit("/", 1)[1])
            self._json(HTTPStatus.OK, {"list_page": server.list_page}, head)
        elif path.startswith("/__sas__/mode/"):
            server.mode = path.rsplit("/", 1)[1]
            self._json(HTTPStatus.OK, {"mode": server.mode}, head)
        elif match := _TOKEN_PATH.match(path):
            account, container = match.groups()
            if not (server.folder / account / container).is_dir():
                self._json(HTTPStatus.NOT_FOUND, {"detail": f"no dataset in {account}/{container}"}, head)
                return
            expiry = (datetime.now(UTC) + timedelta(seconds=server.ttl)).strftime("%Y-%m-%dT%H:%M:%SZ")
            with server.lock:
                server.issued[f"{account}/{container}"] = server.issued.get(f"{account}/{container}", 0) + 1
                if key := self.headers.get("Ocp-Apim-Subscription-Key"):
                    server.keys.append(key)
            if server.mode == "garbage":
                self._json(HTTPStatus.OK, {"message": "tokens are elsewhere"}, head)
                return
            token = f"se={quote(expiry)}&sp=rl&sr=c&sig={signature(account, container, expiry)}"
            self._json(HTTPStatus.OK, {"msft:expiry": expiry, "token": token}, head)
        else:
            self._json(HTTPStatus.NOT_FOUND, {"detail": "no such path"}, head)

    def _blob(self, path: str, query: dict[str, list[str]], head: bool) -> None:
        parts = path.lstrip("/").split("/")
        listing = query.get("comp") == ["list"] and query.get("restype") == ["container"]
        if len(parts) < (2 if listing else 3):
            self._error(HTTPStatus.BAD_REQUEST, "InvalidUri", head)
            return
        account, container = parts[0], parts[1]
        expiry = (query.get("se") or [""])[0]
        if "sig" not in query:
            outcome, status, code = "unsigned", HTTPStatus.CONFLICT, "PublicAccessNotPermitted"
        elif (query.get("sig") or [""])[0] != signature(account, container, expiry) or (
            datetime.fromisoformat(expiry) <= datetime.now(UTC)
        ):
            outcome, status, code = "refused", HTTPStatus.FORBIDDEN, "AuthenticationFailed"
        else:
            outcome, status, code = "signed", HTTPStatus.OK, ""
        with self.server.lock:
            self.server.reads[outcome] += 1
        if code:
            self._error(status, code, head)
        elif listing:
            self._list(account, container, query, head)
        else:
            self._file(path, head=head, gated=False)

    def _list(self, account: str, container: str, query: dict[str, list[str]], head: bool) -> None:
        """List Blobs: the container's blobs whose names start with ``prefix``, after ``marker``, at most
        ``maxresults`` (and the server's ``/__sas__/list-page``) a page, with a ``NextMarker`` while more remain."""
        root = self.server.folder / account / container
        if not root.is_dir():
            self._error(HTTPStatus.NOT_FOUND, "ContainerNotFound", head)
            return
        prefix, marker = (query.get("prefix") or [""])[0], (query.get("marker") or [""])[0]
        size = min(int((query.get("maxresults") or ["5000"])[0]), self.server.list_page)
        names = sorted(file.relative_to(root).as_posix() for file in root.rglob("*") if file.is_file())
        names = [name for name in names if name.startswith(prefix) and name > marker]
        page, more = names[:size], len(names) > size
        with self.server.lock:
            self.server.listings += 1
        blobs = "".join(
            f"<Blob><Name>{escape(name)}</Name><Properties>"
            f"<Last-Modified>{formatdate((root / name).stat().st_mtime, usegmt=True)}</Last-Modified>"
            f"<Etag>0x{(root / name).stat().st_mtime_ns:X}</Etag>"
            f"<Content-Length>{(root / name).stat().st_size}</Content-Length>"
            "<Content-Type>application/octet-stream</Content-Type><BlobType>BlockBlob</BlobType>"
            "</Properties></Blob>"
            for name in page
        )
        next_marker = escape(page[-1]) if more else ""
        body = (
            '<?xml version="1.0" encoding="utf-8"?>'
            f'<EnumerationResults ServiceEndpoint="{escape(self.server.url)}/{account}" ContainerName="{container}">'
            f"<Prefix>{escape(prefix)}</Prefix><MaxResults>{size}</MaxResults><Blobs>{blobs}</Blobs>"
            f"<NextMarker>{next_marker}</NextMarker></EnumerationResults>"
        )
        self._small(HTTPStatus.OK, body.encode(), "application/xml", head)

    def _error(self, status: HTTPStatus, code: str, head: bool) -> None:
        body = f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code><Message>{code}</Message></Error>'
        self._small(status, body.encode(), "application/xml", head)

    def _json(self, status: HTTPStatus, body: object, head: bool) -> None:
        self._small(status, json.dumps(body).encode(), "application/json", head)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("port", type=int)
    arguments = parser.parse_args(argv)
    serve_until_terminated(BlobServer(arguments.folder, arguments.port))


if __name__ == "__main__":
    main()
