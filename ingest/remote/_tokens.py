"""SAS tokens for Azure Blob Storage containers, from a token service such as Planetary Computer's (see
:mod:`ingest.remote`).

:class:`SasTokens` asks the service (``remote.sas_token_url``) for a container's token once per process and again
before it expires; :class:`BlobAddress` says where a blob URL points, and :func:`redacted` keeps tokens out of what
floe records and says. Which reads carry them: docs/remote-sources.md#planetary-computer-and-azure-blobs.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlparse

from ingest.remote._buckets import url_opener

if TYPE_CHECKING:
    from ingest.config import RemoteSettings

PLANETARY_COMPUTER = "https://planetarycomputer.microsoft.com/api/sas/v1/token"
"""Planetary Computer's token service (``floe ingest --planetary-computer``)."""

PLANETARY_COMPUTER_HOST = "planetarycomputer.microsoft.com"
"""A STAC API on this host serves items whose assets need its tokens: ``floe ingest`` asks for them by itself."""

BLOB_SUFFIX = ".blob.core.windows.net"
SUBSCRIPTION_HEADER = "Ocp-Apim-Subscription-Key"
RENEW_BEFORE = timedelta(minutes=5)
"""A token with less left than this is asked for again: a granule's reads take seconds, a slow one minutes."""

# Azure's rules for names (which go into the token service's URL): accounts 3-24 lower-case letters and digits,
# containers 3-63 of those and single hyphens, starting with a letter or digit.
_ACCOUNT = re.compile(r"[a-z0-9]{3,24}")
_CONTAINER = re.compile(r"[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}")
# What a SAS token is made of: query parameters, percent-encoded.
_TOKEN = re.compile(r"[A-Za-z0-9%&=._~+/:-]{1,4096}")
_QUERY_IN_URL = re.compile(r"((?:https?|s3)://[^\s?#'\"<>]*)\?[^\s#'\"<>]*")

_ISSUED: dict[tuple[str, str, str], tuple[str, datetime]] = {}
_ISSUING = threading.Lock()


def redacted(text: str) -> str:
    """``text`` with the query string of every URL in it cut (a SAS token or a presigned URL's signature is a
    credential; an error or a report must not carry it)."""
    return _QUERY_IN_URL.sub(r"\1?...", text)


class TokenError(Exception):
    """No token for a blob URL: why (the URL is told by whoever raises it further)."""


@dataclass(frozen=True)
class SasTokens:
    """Where SAS tokens come from (``service``, None: nowhere, blob URLs are read as they are), the key sent
    with each question, and the hosts addressed path-style."""

    service: str | None = None
    key: str | None = None
    path_style: tuple[str, ...] = ()
    timeout_s: float = 30.0
    retries: int = 4

    @classmethod
    def of(cls, remote: RemoteSettings | None) -> SasTokens:
        if remote is None:
            return cls()
        return cls(
            remote.sas_token_url,
            remote.sas_subscription_key,
            tuple(remote.blob_path_style),
            remote.connect_timeout_s + remote.read_timeout_s,
            remote.retries,
        )

    def __repr__(self) -> str:  # the key is a credential
        return f"SasTokens(service={self.service!r}, path_style={self.path_style!r})"

    def container(self, url: str) -> tuple[str, str] | None:
        """The (account, container) whose token reads ``url``; None: ``url`` is read as it is (no service, not a
        blob URL, or one that carries a query of its own)."""
        if self.service is None:
            return None
        address = blob_address(url, self.path_style)
        return (address.account, address.container) if address is not None else None

    def covers(self, url: str) -> bool:
        """Whether reading ``url`` takes a token."""
        return self.container(url) is not None

    def sign(self, url: str) -> str:
        """``url`` with its container's token (asked for when none is at hand or it expires soon); ``url`` itself
        when it takes none.

        Raises:
            TokenError: the service cannot be reached, refuses, or answers with something else than a token.
        """
        container = self.container(url)
        if container is None:
            return url
        return f"{url}?{self.token(*container)}"

    def token(self, account: str, container: str) -> str:
        """The token of ``account``/``container``, at most one question to the service at a time per process."""
        return self.held(account, container)[0]

    def held(self, account: str, container: str) -> tuple[str, datetime]:
        """The token of ``account``/``container`` and its expiry (asked for when none is at hand or it expires
        within :data:`RENEW_BEFORE`)."""
        assert self.service is not None
        key = (self.service, account, container)
        with _ISSUING:
            held = _ISSUED.get(key)
            if held is not None and held[1] - datetime.now(UTC) > RENEW_BEFORE:
                return held
            held = _ISSUED[key] = self._ask(account, container)
            return held

    def lasting(self, account: str, container: str) -> tuple[str, datetime]:
        """The token at hand for a client that keeps it (obstore's stores, Icechunk's containers), and until when
        to use it: :data:`RENEW_BEFORE` ahead of its expiry, so the client asks again when :meth:`held` would."""
        token, expiry = self.held(account, container)
        return token, expiry - RENEW_BEFORE

    def provider(self, account: str, container: str) -> Callable[[], dict[str, Any]]:
        """obstore's credential provider for a store of ``account``/``container`` (:meth:`lasting`): an
        ``AzureStore`` that lists a folder of a container gets the same tokens as the blob reads.

        Raises (when called):
            TokenError: as :meth:`sign`.
        """

        def credential() -> dict[str, Any]:
            token, until = self.lasting(account, container)
            return {"sas_token": token, "expires_at": until}

        return credential

    def _ask(self, account: str, container: str) -> tuple[str, datetime]:
        assert self.service is not None
        where = f"{self.service.rstrip('/')}/{quote(account, safe='')}/{quote(container, safe='')}"
        headers = {"Accept": "application/json"}
        if self.key:
            headers[SUBSCRIPTION_HEADER] = self.key
        failure = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(10.0, 0.2 * 2 ** (attempt - 1)))
            request = urllib.request.Request(where, headers=headers)  # noqa: S310 - an http(s) URL of the settings
            try:
                with url_opener().open(request, timeout=self.timeout_s) as answer:
                    body = answer.read(64 * 1024)
            except urllib.error.HTTPError as error:
                failure = f"HTTP {error.code}"
                if error.code not in (408, 429) and error.code < 500:
                    break  # refused for good: asking again gets the same answer
                continue
            except (OSError, http.client.HTTPException) as error:
                failure = str(getattr(error, "reason", None) or error) or type(error).__name__
                continue
            return _read_answer(body, f"{account}/{container}", where)
        raise TokenError(f"no SAS token for {account}/{container} from {where} ({failure})")


def _read_answer(body: bytes, container: str, where: str) -> tuple[str, datetime]:
    """The token and its expiry in a token service's answer."""
    try:
        answer = json.loads(body)
        token, expiry_text = answer["token"], answer["msft:expiry"]
        expiry = datetime.fromisoformat(expiry_text)
    except (ValueError, TypeError, KeyError) as error:
        raise TokenError(f"the answer of {where} for {container} is not a SAS token ({type(error).__name__})") from None
    if not isinstance(token, str) or not _TOKEN.fullmatch(token.lstrip("?")):
        raise TokenError(f"the answer of {where} for {container} holds no usable SAS token")
    if expiry.tzinfo is None:
        expiry = expiry.replace(tzinfo=UTC)
    return token.lstrip("?"), expiry


@dataclass(frozen=True)
class BlobAddress:
    """Where an Azure blob URL points: its account, container and blob name (or folder, ending in ``/``; empty
    for the container's root), and the endpoint its container is under."""

    account: str
    container: str
    name: str
    endpoint: str
    """``https://{account}.blob.core.windows.net``, or ``{scheme}://{host}/{account}`` on a path-style host."""

    @property
    def container_url(self) -> str:
        return f"{self.endpoint}/{self.container}"

    def url_of(self, name: str) -> str:
        """The URL of blob ``name`` of this container."""
        return f"{self.container_url}/{quote(name)}"

    @property
    def virtual_prefix(self) -> str:
        """The prefix of Icechunk's virtual chunk container for this container: ``az://{account}@{container}/``.
        Icechunk reads an ``az://`` reference from the container its host names and the account its container's
        store names (icechunk 2.3, ``icechunk/src/virtual_chunks.rs``, ``chunk_location.host_str()``); the
        account before the ``@`` keeps containers of the same name in two accounts apart."""
        return f"az://{self.account}@{self.container}/"

    @property
    def virtual_url(self) -> str:
        """This blob's location in a virtual reference (:attr:`virtual_prefix`, then its name)."""
        return self.virtual_prefix + quote(self.name)

    def store_config(self) -> dict[str, str]:
        """The options of Icechunk's Azure store for this container (its endpoint where it is not Azure's own)."""
        if self.endpoint == f"https://{self.account}{BLOB_SUFFIX}":
            return {}
        return {"endpoint": self.endpoint, **({"allow_http": "true"} if self.endpoint.startswith("http://") else {})}


def blob_address(url: str, path_style: Iterable[str] = ()) -> BlobAddress | None:
    """The blob ``url`` names: ``https://{account}.blob.core.windows.net/{container}/{name}``, or
    ``/{account}/{container}/{name}`` on a host of ``path_style`` (Azurite's addressing); None for another
    URL, one that names no more than a container without a ``/`` after it, or one with a query."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or parsed.query:
        return None
    host = (parsed.hostname or "").lower()
    parts = unquote(parsed.path).lstrip("/").split("/")
    if host.endswith(BLOB_SUFFIX):
        account, endpoint = host[: -len(BLOB_SUFFIX)], f"{parsed.scheme}://{parsed.netloc}"
    elif parsed.netloc.lower() in path_style and len(parts) > 1:
        account, endpoint = parts[0], f"{parsed.scheme}://{parsed.netloc}/{parts[0]}"
        parts = parts[1:]
    else:
        return None
    if len(parts) < 2 or not _ACCOUNT.fullmatch(account) or not _CONTAINER.fullmatch(parts[0]):
        return None
    return BlobAddress(account, parts[0], "/".join(parts[1:]), endpoint)


def virtual_blob_url(location: str, endpoint: str | None = None) -> str | None:
    """The https:// URL of a virtual reference's ``az://{account}@{container}/{name}`` location (``endpoint``: the
    container's store's, where it is not Azure's own); None for another location."""
    parsed = urlparse(location)
    if parsed.scheme != "az" or not parsed.username or not parsed.hostname:
        return None
    base = endpoint or f"https://{parsed.username}{BLOB_SUFFIX}"
    return f"{base.rstrip('/')}/{parsed.hostname}{parsed.path}"


def planetary_computer_source(sources: Iterable[str]) -> bool:
    """Whether any of ``sources`` is on Planetary Computer's host (its STAC API, as a rule)."""
    return any((urlparse(source).hostname or "").lower() == PLANETARY_COMPUTER_HOST for source in sources)
