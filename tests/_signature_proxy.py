"""A proxy on 127.0.0.1 in front of an S3 server (moto) that notes, for each request, whether it was signed.

moto checks no signature unless told to, and with its checks on it refuses
unsigned requests even to a bucket whose policy makes it public; so whether a
client reads a public bucket unsigned cannot be told from moto's answers. This
proxy passes every request on as it came (the signature too: moto ignores it)
and keeps, per request, the method, the path and whether it carried a SigV4
signature (an ``Authorization`` header, or ``X-Amz-Signature`` in the query).

``GET /__requests__`` answers those notes as JSON (``[[method, path, signed],
...]``) and is not passed on. Run as ``python -m tests._signature_proxy PORT
TARGET_PORT``; SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from tests._http_server import serve_until_terminated

_HOP_BY_HOP = frozenset(("connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"))


class SignatureProxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, target: int) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.target = target
        self.notes: list[tuple[str, str, bool]] = []
        self.lock = threading.Lock()


class _Handler(BaseHTTPRequestHandler):
    server: SignatureProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: a test reads ``/__requests__``, not a log."""

    def _relay(self) -> None:
        if self.command == "GET" and self.path == "/__requests__":
            with self.server.lock:
                body = json.dumps(self.server.notes).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        parts = urlsplit(self.path)
        signed = "authorization" in {key.lower() for key in self.headers} or "x-amz-signature=" in parts.query.lower()
        with self.server.lock:
            self.server.notes.append((self.command, parts.path, signed))
        body = self._body()
        upstream = http.client.HTTPConnection("127.0.0.1", self.server.target, timeout=60)
        try:
            headers = {key: value for key, value in self.headers.items() if key.lower() not in _HOP_BY_HOP}
            upstream.request(self.command, self.path, body=body, headers=headers)
            answer = upstream.getresponse()
            data = answer.read()
        finally:
            upstream.close()
        self.send_response(answer.status, answer.reason)
        for key, value in answer.getheaders():
            if key.lower() not in _HOP_BY_HOP and key.lower() != "content-length":
                self.send_header(key, value)
        # A HEAD answer keeps the object's length (no body follows it).
        self.send_header("Content-Length", answer.getheader("Content-Length") or str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _body(self) -> bytes | None:
        """The request's body, sent with a length or in chunks (pyarrow's S3 writes chunked)."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else None

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _relay


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("port", type=int)
    parser.add_argument("target", type=int, help="the port of the S3 server on 127.0.0.1")
    arguments = parser.parse_args(argv)
    serve_until_terminated(SignatureProxy(arguments.port, arguments.target))


if __name__ == "__main__":
    main()
