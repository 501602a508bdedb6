"""HTTP headers sent to some URL prefixes only: an API key or a bearer token for a STAC API, a web server or an
archive's rasters (see :mod:`ingest.remote`).

:class:`Headers` maps URL prefixes to the headers their requests carry (``remote.headers``, ``floe ingest
--header``), for the STAC API's pages, obstore's requests and GDAL's. Which requests carry which:
docs/remote-sources.md#private-apis-and-servers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from ingest.config import HEADER_NAME, HEADER_VALUE

if TYPE_CHECKING:
    from ingest.config import RemoteSettings


def parse_header(text: str) -> tuple[str, str]:
    """``Name: value`` as given on a command line.

    Raises:
        ValueError: no colon, or a name or value HTTP does not allow.
    """
    name, colon, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not colon or not HEADER_NAME.fullmatch(name):
        raise ValueError(f"{text.split(':', maxsplit=1)[0][:40]!r} is not 'Name: value' (an HTTP header)")
    if not HEADER_VALUE.fullmatch(value):
        raise ValueError(f"the value of header {name} holds a line break or a control character")
    return name, value


def origin(url: str) -> str:
    """``scheme://host[:port]/`` of an http(s) URL: the prefix ``--header`` gives its headers to."""
    parsed = urlparse(url)
    return f"{parsed.scheme.lower()}://{parsed.netloc.lower()}/"


@dataclass(frozen=True)
class Headers:
    """Headers by URL prefix: a request gets those of every prefix it starts with, a longer prefix winning over a
    shorter one for the same name. Hashable and picklable, so it travels to actors and readers."""

    by_prefix: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()

    @classmethod
    def of(cls, remote: RemoteSettings | None) -> Headers:
        return cls.given(remote.headers if remote is not None else {})

    @classmethod
    def given(cls, mapping: Mapping[str, Mapping[str, str]]) -> Headers:
        # Shorter prefixes first, so that a longer one's value for the same name is applied last and wins.
        ordered = sorted(mapping.items(), key=lambda entry: len(entry[0]))
        return cls(tuple((prefix, tuple(headers.items())) for prefix, headers in ordered if headers))

    def __bool__(self) -> bool:
        return bool(self.by_prefix)

    def __repr__(self) -> str:  # values are credentials
        return f"Headers({[(prefix, [name for name, _ in headers]) for prefix, headers in self.by_prefix]})"

    def for_url(self, url: str) -> dict[str, str]:
        """The headers a request for ``url`` carries (empty for most)."""
        found: dict[str, str] = {}
        for prefix, headers in self.by_prefix:
            if _under(url, prefix):
                found.update(headers)
        return found

    def requests_auth(self) -> Any:
        """A requests ``auth`` that adds each request's headers (pystac-client's session: the API's pages and
        collections, whatever host their links name)."""
        import requests.auth

        headers = self

        class _ByPrefix(requests.auth.AuthBase):
            def __call__(self, request: Any) -> Any:
                request.headers.update(headers.for_url(str(request.url)))
                return request

        return _ByPrefix()

    def gdal_option(self, url: str) -> str | None:
        """GDAL's ``GDAL_HTTP_HEADERS`` for ``url`` (``Name: value`` lines), None when it gets none."""
        found = self.for_url(url)
        return "\r\n".join(f"{name}: {value}" for name, value in found.items()) if found else None


def _under(url: str, prefix: str) -> bool:
    """Whether ``url`` starts with ``prefix``, scheme and host compared without case (as HTTP compares them); a
    prefix ending in ``/`` covers the URL without it too (an API's landing page, ``https://host/api``)."""
    if url.startswith(prefix):
        return True
    head = len(origin(prefix))
    if url[:head].lower() != prefix[:head].lower():
        return False
    rest, wanted = url[head:], prefix[head:]
    return rest.startswith(wanted) or (wanted.endswith("/") and rest.split("?")[0] == wanted[:-1])


def merged(
    mapping: Mapping[str, Mapping[str, str]], prefixes: Iterable[str], header: tuple[str, str]
) -> dict[str, dict[str, str]]:
    """``mapping`` with ``header`` added for each of ``prefixes``."""
    out = {prefix: dict(headers) for prefix, headers in mapping.items()}
    for prefix in prefixes:
        out.setdefault(prefix, {})[header[0]] = header[1]
    return out
