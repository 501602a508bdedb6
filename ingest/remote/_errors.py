"""Remote reads that failed: :class:`RemoteError` (a URL and a short reason) and :func:`describe`, which turns
obstore's errors into such reasons (see :mod:`ingest.remote`)."""

from __future__ import annotations

import re

from obstore.exceptions import PermissionDeniedError, UnauthenticatedError

from ingest.remote._tokens import redacted

_S3_ERROR_CODE = re.compile(r"<Code>([A-Za-z]+)</Code>")
_STATUS = re.compile(r"status code: (\d{3})")


class RemoteError(Exception):
    """A remote object that could not be read: the URL and a short reason."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"{url}: {reason}")


_UNREACHABLE = ("timed out", "access denied", "not authenticated", "no such object", "no such bucket", "cannot connect")


def unreachable(reason: str) -> bool:
    """Whether :func:`describe`'s ``reason`` says the object cannot be reached at all (a timeout after the
    retries, a 403 or 401, a 404, no connection): another read of it would wait for the same answer."""
    return reason.startswith(_UNREACHABLE)


def describe(error: BaseException) -> str:
    """A short reason for an obstore failure, without obstore's debug dump (the URL goes with it elsewhere)."""
    text = str(error)
    code = _S3_ERROR_CODE.search(text)
    code_note = f", {code.group(1)}" if code else ""
    if isinstance(error, FileNotFoundError):
        if code and code.group(1) == "NoSuchBucket":
            return "no such bucket"
        return "no such object"
    if isinstance(error, PermissionDeniedError):
        return f"access denied (HTTP 403{code_note}): check the credentials and what they may read"
    if isinstance(error, UnauthenticatedError):
        return (
            f"not authenticated (HTTP 401{code_note}): give credentials (S3 keys, or --anonymous for a public "
            "bucket; for http(s), a header: --header or remote.headers)"
        )
    retried = re.search(r"after (\d+) retries", text)
    retries = int(retried.group(1)) if retried else 0
    after = f" after {retries} {'retry' if retries == 1 else 'retries'}" if retries else ""
    lowered = text.lower()
    if "connection refused" in lowered:
        return f"connection refused{after}: nothing listens at that address"
    if "timed out" in lowered or "timedout" in lowered:  # not "timeout": every retry error names retry_timeout
        return f"timed out{after}"
    if "dns error" in lowered or "failed to lookup address" in lowered:
        return "unknown host (DNS lookup failed)"
    if "tcp connect error" in lowered or "error sending request" in lowered:
        return f"cannot connect{after}"
    if (known := _store_refusal(lowered, code.group(1) if code else None)) is not None:
        return known
    if "builder error" in lowered and "http://" in lowered:
        return "an http:// endpoint needs allow_http (FLOE_S3__ALLOW_HTTP=true or AWS_ALLOW_HTTP=true)"
    if status := _STATUS.search(text):
        return f"HTTP {status.group(1)}{code_note}{after}"
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return redacted(first)[:300]


def _store_refusal(lowered: str, code: str | None) -> str | None:
    """What to do about a store's refusal that settings answer, from its error text (lower case) and code."""
    if "redirect without location" in lowered or "permanentredirect" in lowered:
        # What AWS answers a request signed for another region than the bucket's (obstore follows no redirect).
        return (
            "the bucket is in another region than the one requests were signed for: name its region in "
            "remote.regions (FLOE_REMOTE__REGIONS)"
        )
    if code == "PublicAccessNotPermitted":
        # Azure's answer (409) to an unsigned read of a storage account that allows none (Planetary Computer's).
        return (
            "the storage account allows no anonymous reads (HTTP 409, PublicAccessNotPermitted): its blobs need a "
            "SAS token (floe ingest --planetary-computer, or remote.sas_token_url)"
        )
    return None
