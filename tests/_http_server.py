"""A small HTTP file server for tests, on 127.0.0.1: ``python -m tests._http_server FOLDER PORT``.

It serves the files under FOLDER (no listings) the way object stores and
static web hosts do: ``GET`` and ``HEAD``, one ``Range: bytes=a-b`` (also
``a-`` and ``-n``) answered 206 with ``Content-Range`` (416 past the end),
a strong ``ETag`` and ``Last-Modified`` (``If-None-Match`` answers 304, a
stale ``If-Match`` or ``If-Unmodified-Since`` 412; entity tags compare with
their quotes, as RFC 9110 and nginx do). Range support is what remote rasters will need.

For tests that must see *how* a client reads, a few paths are special:

- ``/__stats__``: JSON, body bytes sent so far per file (relative path);
- ``/__requests__``: JSON, ``[path, Accept-Encoding, Authorization]`` of each request so far (the last 10,000);
- ``/__auth__/<file>``: the file, only for a request with ``Authorization: Bearer <TOKEN>`` (401 otherwise), as
  a private STAC API or archive answers;
- ``/__gated__/<file>``: the file, but only its first ``--gate-bytes`` bytes
  until ``/__release__`` is requested (``/__hold__`` closes the gate again),
  so a test can prove a client used data before the whole body was sent;
- ``/__stall__/<file>``: accepts the request and never answers (a timeout); ``/__stats__`` then holds
  ``__stall__/<file>`` (0 bytes), so a test knows the request arrived;
- ``/__stall_body__/<file>``: a HEAD is answered as for ``<file>``, a GET (or POST) stalls as above: a
  server whose objects are listed but whose transfers hang;
- ``/__status__/<code>/<file>``: answers ``<code>`` (403, 500, ...) with a short body;
- ``/__together__/<n>/<file>``: the file, once ``n`` such requests wait at the same time (after
  :data:`TOGETHER_SECONDS` without them, 409, which clients do not retry), so a test proves that a client's
  requests overlap without timing them;
- ``/__signed__/<file>?sig=<SIGNATURE>``: the file, only when the query carries the signature (403
  otherwise), as a presigned or SAS URL.

A folder with an ``index.json`` answers with it, and ``POST`` answers as ``GET``, so a folder of JSON documents is
a static STAC API: its landing page, its collections and its search's pages, whose ``next`` links name the files
of the pages after them. A request for a folder that names one collection (``?collections=X``, or a POST body's
``"collections": ["X"]``) answers with ``X/index.json`` in it where there is one: a search of that collection.
Under ``/__get_only__/`` the files are the same but ``POST`` is
refused (405), as by an API whose search takes GET alone.

The test fixture starts it as a subprocess, waits until ``/__stats__``
answers, and stops it with ``os.kill(pid, SIGTERM)``.
"""

from __future__ import annotations

import argparse
import email.utils
import json
import re
import signal
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

PIECE = 64 * 1024
"""Bytes written to the socket at a time (and counted in ``/__stats__`` as they go)."""

DEFAULT_GATE_BYTES = 2 * 1024 * 1024
STALL_SECONDS = 120.0
TOGETHER_SECONDS = 10.0
SIGNATURE = "floe-signed"
TOKEN = "floe-test-bearer"
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


class FileServer(ThreadingHTTPServer):
    """Serves ``folder`` on 127.0.0.1:``port``; counts the body bytes it sends per file."""

    daemon_threads = True

    def __init__(self, folder: Path, port: int, gate_bytes: int = DEFAULT_GATE_BYTES) -> None:
        self.folder = folder.resolve()
        self.gate_bytes = gate_bytes
        self.sent: dict[str, int] = {}
        self.sent_lock = threading.Lock()
        self.released = threading.Event()
        self.barriers: dict[int, threading.Barrier] = {}
        self.barriers_lock = threading.Lock()
        self.requests: list[tuple[str, str | None, str | None]] = []
        super().__init__(("127.0.0.1", port), _Handler)

    def barrier(self, parties: int) -> threading.Barrier:
        with self.barriers_lock:
            found = self.barriers.get(parties)
            if found is None or found.broken:
                found = self.barriers[parties] = threading.Barrier(parties, timeout=TOGETHER_SECONDS)
            return found

    def count(self, name: str, size: int) -> None:
        with self.sent_lock:
            self.sent[name] = self.sent.get(name, 0) + size


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as object-store clients expect
    server: FileServer

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_GET(self) -> None:
        self._answer(head=False)

    def do_POST(self) -> None:
        self.body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer(head=False)

    def _one_collection(self) -> str | None:
        """The one collection a search names (its query's ``collections``, or its JSON body's), if one alone."""
        named = parse_qs(urlparse(self.path).query).get("collections", [""])[0].split(",")
        if self.command == "POST":
            try:
                named = json.loads(getattr(self, "body", b"") or b"{}").get("collections") or []
            except (ValueError, AttributeError):
                named = []
        return named[0] if len(named) == 1 and isinstance(named[0], str) and named[0] else None

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: a test reads ``/__stats__``, not a log."""

    def _answer(self, *, head: bool) -> None:
        path = unquote(urlparse(self.path).path)
        if not path.startswith("/__requests__"):
            noted = (path, self.headers.get("Accept-Encoding"), self.headers.get("Authorization"))
            with self.server.sent_lock:
                self.server.requests = [*self.server.requests[-9_999:], noted]
        try:
            if not self._control(path, head):
                self._object(path, head)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _control(self, path: str, head: bool) -> bool:
        """Answer the test-only requests that name no file; False for any other path."""
        if path == "/__stats__":
            with self.server.sent_lock:
                self._small(HTTPStatus.OK, json.dumps(self.server.sent).encode(), "application/json", head)
        elif path == "/__requests__":
            with self.server.sent_lock:
                self._small(HTTPStatus.OK, json.dumps(self.server.requests).encode(), "application/json", head)
        elif path == "/__release__":
            self.server.released.set()
            self._small(HTTPStatus.OK, b"released\n", "text/plain", head)
        elif path == "/__hold__":
            self.server.released.clear()
            self._small(HTTPStatus.OK, b"held\n", "text/plain", head)
        elif path.startswith("/__stall__/") or (path.startswith("/__stall_body__/") and not head):
            self.server.count(path.removeprefix("/"), 0)  # asked: /__stats__ says so
            threading.Event().wait(STALL_SECONDS)  # never set: the client gives up first
            self.close_connection = True
        elif match := re.match(r"^/__status__/(\d{3})/", path):
            self._small(HTTPStatus(int(match.group(1))), b"forced status\n", "text/plain", head)
        else:
            return False
        return True

    def _object(self, path: str, head: bool) -> None:
        """A file, as the path's prefix (if any) says to serve it."""
        if match := re.match(r"^/__together__/(\d+)(/.*)$", path):
            try:
                self.server.barrier(int(match.group(1))).wait()
            except threading.BrokenBarrierError:
                self._small(HTTPStatus.CONFLICT, b"not enough requests at once\n", "text/plain", head)
            else:
                self._file(match.group(2), head=head, gated=False)
        elif path.startswith("/__signed__/"):
            # A signed URL: the object is served only with the signature in the query, as S3 presigned
            # URLs and Azure SAS tokens are.
            if parse_qs(urlparse(self.path).query).get("sig") != [SIGNATURE]:
                self._small(HTTPStatus.FORBIDDEN, b"signature does not match\n", "text/plain", head)
            else:
                self._file(path.removeprefix("/__signed__"), head=head, gated=False)
        elif path.startswith("/__auth__/"):
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self.send_response(HTTPStatus.UNAUTHORIZED)
                self.send_header("WWW-Authenticate", 'Bearer realm="floe-test"')
                self.send_header("Content-Length", "0")
                self.end_headers()
            else:
                self._file(path.removeprefix("/__auth__"), head=head, gated=False)
        elif path.startswith("/__get_only__/"):
            if self.command == "POST":
                self._small(HTTPStatus.METHOD_NOT_ALLOWED, b"GET only\n", "text/plain", head)
            else:
                self._file(path.removeprefix("/__get_only__"), head=head, gated=False)
        elif path.startswith("/__stall_body__/"):  # a HEAD (a GET stalls, above)
            self._file(path.removeprefix("/__stall_body__"), head=head, gated=False)
        elif path.startswith("/__gated__/"):
            self._file(path.removeprefix("/__gated__"), head=head, gated=True)
        else:
            self._file(path, head=head, gated=False)

    def _small(self, status: HTTPStatus, body: bytes, media_type: str, head: bool) -> None:
        self.send_response(status)
        self.send_header("Content-Type", media_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _file(self, path: str, *, head: bool, gated: bool) -> None:
        target = (self.server.folder / path.lstrip("/")).resolve()
        if target.is_dir():
            collection = self._one_collection()
            searched = (target / collection / "index.json").resolve() if collection else None
            target = searched if searched is not None and searched.is_file() else target / "index.json"
        if not target.is_relative_to(self.server.folder) or not target.is_file():
            self._small(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain", head)
            return
        status = target.stat()
        size = status.st_size
        etag = f'"{size:x}-{status.st_mtime_ns:x}"'
        if_match = self.headers.get("If-Match")
        if if_match and if_match.strip() != "*" and etag not in (part.strip() for part in if_match.split(",")):
            self._small(HTTPStatus.PRECONDITION_FAILED, b"etag changed\n", "text/plain", head)
            return
        common = {
            "ETag": etag,
            "Last-Modified": email.utils.formatdate(status.st_mtime, usegmt=True),
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        unmodified_since = self.headers.get("If-Unmodified-Since")
        if unmodified_since and int(status.st_mtime) > email.utils.parsedate_to_datetime(unmodified_since).timestamp():
            self._small(HTTPStatus.PRECONDITION_FAILED, b"modified since\n", "text/plain", head)
            return
        if self.headers.get("If-None-Match") == etag:
            self.send_response(HTTPStatus.NOT_MODIFIED)
            for name, value in common.items():
                self.send_header(name, value)
            self.end_headers()
            return
        start, end = 0, size - 1
        wanted = _requested_range(self.headers.get("Range"), size)
        if wanted == "unsatisfiable":
            self.send_response(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if wanted is not None:
            start, end = wanted
            self.send_response(HTTPStatus.PARTIAL_CONTENT)
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        else:
            self.send_response(HTTPStatus.OK)
        for name, value in common.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        if head:
            return
        self._send_body(target, start, end, gated=gated)

    def _send_body(self, target: Path, start: int, end: int, *, gated: bool) -> None:
        """Bytes ``start``..``end`` of ``target``, counted as they go; a gated body waits at the gate for release."""
        name = target.relative_to(self.server.folder).as_posix()
        gate = self.server.gate_bytes if gated else None
        with target.open("rb") as stream:
            stream.seek(start)
            position, last = start, end
            while position <= last:
                if gate is not None and position >= gate:
                    self.server.released.wait()
                    gate = None
                piece = min(PIECE, last + 1 - position)
                if gate is not None:
                    piece = min(piece, gate - position)
                data = stream.read(piece)
                if not data:
                    break
                self.wfile.write(data)
                self.wfile.flush()
                self.server.count(name, len(data))
                position += len(data)


def _requested_range(header: str | None, size: int) -> tuple[int, int] | str | None:
    """The one byte range asked for (inclusive), "unsatisfiable", or None for the whole file.

    Several ranges, or a header this server does not understand, get the whole
    file (RFC 9110 lets a server ignore Range).
    """
    if not header:
        return None
    match = _RANGE.match(header.strip())
    if match is None or (not match.group(1) and not match.group(2)):
        return None
    first, last = match.group(1), match.group(2)
    if not first:  # the last n bytes
        length = int(last)
        if length == 0:
            return "unsatisfiable"
        return max(size - length, 0), size - 1
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    if start >= size:
        return "unsatisfiable"
    if end < start:
        return None
    return start, end


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("port", type=int)
    parser.add_argument("--gate-bytes", type=int, default=DEFAULT_GATE_BYTES)
    arguments = parser.parse_args(argv)
    serve_until_terminated(FileServer(arguments.folder, arguments.port, arguments.gate_bytes))


def serve_until_terminated(server: ThreadingHTTPServer) -> None:
    """Serve until SIGTERM (a fixture's os.kill), which ends serve_forever from another thread, so the socket is
    closed cleanly; then exit 0."""
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        server.server_close()
    sys.exit(0)


if __name__ == "__main__":
    main()
