"""What floe knows of each S3 bucket it reads: the region it is reached in, and whether its requester pays
(see :mod:`ingest.remote`).

:class:`Buckets` gives each bucket's region (``remote.regions``, else the one S3 names when asked, else the region
set for everything) and whether reads under a prefix say their requester pays (``remote.requester_pays``). Why and
how: docs/remote-sources.md#buckets-in-other-regions and #requester-pays-buckets.
"""

from __future__ import annotations

import http.client
import logging
import math
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import quote

from ingest.config import REGION_NAME

if TYPE_CHECKING:
    from ingest.config import RemoteSettings, S3Settings

log = logging.getLogger(__name__)

AWS_ENDPOINT = "https://s3.amazonaws.com"
"""Where a bucket's region is asked without an endpoint: AWS's global endpoint answers for buckets of any region."""

REGION_HEADER = "x-amz-bucket-region"

PROBE_TIMEOUT_S = 10.0
"""The longest the question may take (connect and answer), whatever ``remote.connect_timeout_s`` says: the
answer is only an improvement on the region set for everything."""

ASK_AGAIN_AFTER_S = 60.0
"""A question that got no answer (no connection, a timeout, a 5xx) is asked again after this long; meanwhile the
region set applies. An answer, with a region or without one (MinIO, moto), is kept for the process."""

_FOUND: dict[tuple[str, str], tuple[str | None, float]] = {}
"""The region found per (endpoint, bucket), and until when (``time.monotonic()``) it holds."""
_ASKING: dict[tuple[str, str], threading.Event] = {}
_FOUND_LOCK = threading.Lock()
_OPENER: list[urllib.request.OpenerDirector] = []


def under_prefix(url: str, prefixes: Iterable[str]) -> bool:
    """Whether ``url`` is an ``s3://`` URL under one of ``prefixes`` (``s3://`` itself: every bucket)."""
    return url.startswith("s3://") and any(url.startswith(prefix) for prefix in prefixes)


def s3_endpoint(s3: S3Settings | None) -> str | None:
    """The S3 endpoint requests go to: floe's setting, else ``AWS_ENDPOINT_URL``; None: AWS itself."""
    return (s3.endpoint_url if s3 is not None else None) or os.environ.get("AWS_ENDPOINT_URL") or None


@dataclass(frozen=True)
class Buckets:
    """Each bucket's region (docs/remote-sources.md#buckets-in-other-regions): ``named`` ones, else asked of
    ``endpoint`` when ``find``; and the
    ``s3://`` prefixes whose requester pays."""

    named: Mapping[str, str] = field(default_factory=dict)
    find: bool = True
    endpoint: str | None = None
    """The S3 endpoint asked (None: AWS's)."""
    timeout_s: float = PROBE_TIMEOUT_S
    paying: tuple[str, ...] = ()
    """``s3://`` prefixes read as their requester paying (``("s3://",)``: every bucket)."""

    @classmethod
    def of(cls, s3: S3Settings | None, remote: RemoteSettings | None) -> Buckets:
        """What ``remote`` says of buckets (regions named or to find, requester pays), at the endpoint ``s3`` (or
        the environment) sets."""
        if remote is None:
            return cls(endpoint=s3_endpoint(s3))
        return cls(
            dict(remote.regions),
            remote.find_regions,
            s3_endpoint(s3),
            min(PROBE_TIMEOUT_S, remote.connect_timeout_s + remote.read_timeout_s),
            tuple(remote.requester_pays),
        )

    def pays(self, url: str) -> bool:
        """Whether reading the ``s3://`` URL ``url`` (an object, or a bucket's prefix) says its requester pays."""
        return under_prefix(url, self.paying)

    def region(self, bucket: str) -> str | None:
        """``bucket``'s region; None: the region set for everything applies."""
        if bucket in self.named:
            return self.named[bucket]
        if not self.find:
            return None
        key = (self.endpoint or AWS_ENDPOINT, bucket)
        with _FOUND_LOCK:
            found = _FOUND.get(key)
            if found is not None and time.monotonic() < found[1]:
                return found[0]
            # One thread asks; the others (a worker's granules start together) wait for its answer.
            asking = _ASKING.get(key)
            if asking is None:
                asking = _ASKING[key] = threading.Event()
                mine = True
            else:
                mine = False
        if not mine:
            asking.wait(self.timeout_s + 1)
            with _FOUND_LOCK:
                return _FOUND.get(key, (None, 0.0))[0]
        try:
            try:
                region, until = asked_region(key[0], bucket, self.timeout_s), math.inf
            except _NoAnswer as error:
                log.info(
                    "the region of bucket %s could not be asked at %s (%s): the region set applies; asked again"
                    " in %.0f s",
                    bucket,
                    key[0],
                    error,
                    ASK_AGAIN_AFTER_S,
                )
                region, until = None, time.monotonic() + ASK_AGAIN_AFTER_S
            with _FOUND_LOCK:
                _FOUND[key] = (region, until)
                return region
        finally:
            with _FOUND_LOCK:
                _ASKING.pop(key, None)
            asking.set()


def url_opener() -> urllib.request.OpenerDirector:
    """One opener for the process's own small requests (a bucket's region, a SAS token): ``urlopen`` builds one a
    call, and with it a TLS context whose certificates take 50 ms of CPU to load (what a worker's first granules
    spent, asking together)."""
    with _FOUND_LOCK:
        if not _OPENER:
            _OPENER.append(urllib.request.build_opener())
        return _OPENER[0]


class _NoAnswer(Exception):
    """The endpoint gave no answer that says anything (no connection, a timeout, a 5xx or 429): why."""


def asked_region(endpoint: str, bucket: str, timeout_s: float) -> str | None:
    """The region ``endpoint`` names for ``bucket`` in its answer to an unsigned ``HEAD`` of the bucket (any
    status); None when the answer names none.

    Raises:
        _NoAnswer: the endpoint could not answer (worth asking again later).
    """
    url = f"{endpoint.rstrip('/')}/{quote(bucket, safe='')}"
    request = urllib.request.Request(url, method="HEAD")  # noqa: S310 - an http(s) endpoint of the settings
    try:
        with url_opener().open(request, timeout=timeout_s) as answer:
            region = answer.headers.get(REGION_HEADER)
    except urllib.error.HTTPError as error:  # 301 (another region), 403 (not ours): the header is there too
        region = error.headers.get(REGION_HEADER) if error.headers is not None else None
        if region is None and (error.code >= 500 or error.code == 429):
            raise _NoAnswer(f"HTTP {error.code}") from None
    except (OSError, ValueError, http.client.HTTPException) as error:
        raise _NoAnswer(str(error) or type(error).__name__) from None
    region = (region or "").strip()
    if not REGION_NAME.fullmatch(region):
        log.debug("%s names no region for bucket %s (%r): the region set applies", endpoint, bucket, region[:80])
        return None
    return region
