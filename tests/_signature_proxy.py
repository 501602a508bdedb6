"""A proxy on 127.0.0.1 in front of an S3 server (moto) that notes, for each request, whether it was signed, and
refuses a request signed for another region than its bucket's, as S3 does.

moto checks no signature unless told to, and with its checks on it refuses
unsigned requests even to a bucket whose policy makes it public; so whether a
client reads a public bucket unsigned cannot be told from moto's answers. This
proxy passes every request on as it came (the signature too: moto ignores it)
and keeps, per request, the method, the path, whether it carried a SigV4
signature (an ``Authorization`` header, or ``X-Amz-Signature`` in the query)
and the region of the signature's scope.

moto does not care which region a request was signed for either. S3 does:
a request for a bucket signed for another region than the bucket's gets a 301
``PermanentRedirect`` without a ``Location``, naming the bucket's region in
``x-amz-bucket-region``. So does this proxy, the bucket's region being the
one moto names for it (asked once, with a HEAD of the bucket).

Nor does moto know requester-pays buckets. ``PUT /__requester_pays__/BUCKET``
makes this proxy treat BUCKET as S3 treats one for a reader that is not its
owner: a request that does not say its requester pays
(``x-amz-request-payer: requester``, a header or in the query) gets a 403
``AccessDenied``. Each note says whether the request said so.

Nor do all S3-compatible servers do conditional writes. ``PUT
/__no_conditions__/BUCKET`` makes this proxy answer a PUT to BUCKET that
carries ``If-None-Match`` as such a server does: ``501 NotImplemented``.

``GET /__requests__`` answers those notes as JSON (``[[method, path, signed,
region, paying], ...]``) and is not passed on. Run as ``python -m
tests._signature_proxy PORT TARGET_PORT``; SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from tests._http_server import serve_until_terminated

_HOP_BY_HOP = frozenset(("connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"))
_SCOPE = re.compile(r"credential=[^/\s,&]+(?:/|%2f)\d{8}(?:/|%2f)([a-z0-9-]+)(?:/|%2f)s3", re.IGNORECASE)
"""The region in a SigV4 credential scope (``AKID/20261205/us-east-1/s3/aws4_request``), in a header or a
query (``X-Amz-Credential=AKID%2F...``)."""


class SignatureProxy(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    """socketserver's default listen backlog is 5: 16 connections opened at once (a search reading its files
    together) overflowed it, and a dropped SYN is sent again a second later: a 1 s stall that was not floe's."""

    def __init__(self, port: int, target: int) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.target = target
        self.notes: list[tuple[str, str, bool, str | None, bool]] = []
        self.lock = threading.Lock()
        self.regions: dict[str, str] = {}
        self.paying: set[str] = set()
        """Buckets whose requester pays."""
        self.unconditional: set[str] = set()
        """Buckets whose server does not do conditional writes."""

    def bucket_region(self, bucket: str) -> str | None:
        """The region the S3 server names for ``bucket`` (None: no such bucket yet, or none named)."""
        with self.lock:
            if bucket in self.regions:
                return self.regions[bucket]
        upstream = http.client.HTTPConnection("127.0.0.1", self.target, timeout=60)
        try:
            upstream.request("HEAD", f"/{bucket}")
            answer = upstream.getresponse()
            answer.read()
            region = answer.getheader("x-amz-bucket-region") if answer.status == 200 else None
        finally:
            upstream.close()
        if region:
            with self.lock:
                self.regions[bucket] = region
        return region


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
        if self.command == "PUT" and self.path.startswith("/__requester_pays__/"):
            with self.server.lock:
                self.server.paying.add(self.path.removeprefix("/__requester_pays__/"))
            self._answer(200, "OK", b"", {})
            return
        if self.command == "PUT" and self.path.startswith("/__no_conditions__/"):
            with self.server.lock:
                self.server.unconditional.add(self.path.removeprefix("/__no_conditions__/"))
            self._answer(200, "OK", b"", {})
            return
        parts = urlsplit(self.path)
        signed = "authorization" in {key.lower() for key in self.headers} or "x-amz-signature=" in parts.query.lower()
        scope = _SCOPE.search(f"{self.headers.get('Authorization') or ''} {parts.query}") if signed else None
        region = scope.group(1) if scope else None
        paying = (self.headers.get("x-amz-request-payer") or "").lower() == "requester" or (
            "x-amz-request-payer=requester" in parts.query.lower()
        )
        with self.server.lock:
            self.server.notes.append((self.command, parts.path, signed, region, paying))
        body = self._body()
        bucket = parts.path.lstrip("/").split("/", 1)[0]
        expected = self.server.bucket_region(bucket) if bucket and region else None
        if expected is not None and expected != region:
            self._wrong_region(bucket, region, expected)
            return
        with self.server.lock:
            refused = bucket in self.server.paying and not paying
        if refused:
            self._payment_required(bucket)
            return
        with self.server.lock:
            unconditional = bucket in self.server.unconditional
        if unconditional and self.command == "PUT" and self.headers.get("If-None-Match"):
            body = b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>NotImplemented</Code></Error>'
            self._answer(501, "Not Implemented", body, {"Content-Type": "application/xml"})
            return
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

    def _answer(self, status: int, reason: str, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status, reason)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _payment_required(self, bucket: str) -> None:
        """S3's answer to a reader of a requester-pays bucket who does not say it pays (a HEAD of the bucket
        still names its region)."""
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
            f"<Message>bucket {bucket}: its requester pays, and this request does not say so</Message></Error>"
        ).encode()
        headers = {"Content-Type": "application/xml"}
        if region := self.server.bucket_region(bucket):
            headers["x-amz-bucket-region"] = region
        self._answer(403, "Forbidden", body, headers)

    def _wrong_region(self, bucket: str, region: str | None, expected: str) -> None:
        """S3's answer to a request signed for another region than the bucket's: a redirect that names no place
        to go, only the bucket's region."""
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>PermanentRedirect</Code>'
            f"<Message>signed for {region}: bucket {bucket} is in {expected}</Message>"
            f"<Bucket>{bucket}</Bucket><Endpoint>s3.{expected}.amazonaws.com</Endpoint></Error>"
        ).encode()
        self._answer(
            301, "Moved Permanently", body, {"x-amz-bucket-region": expected, "Content-Type": "application/xml"}
        )

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
