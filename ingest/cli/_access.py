"""How `floe ingest` reaches remote sources, from its flags: unsigned or requester-pays buckets, Azure blobs read
with SAS tokens, and headers for http(s) sources. Each sets ``remote`` settings, which the actors read too."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingest.cli._app import fail, stderr

if TYPE_CHECKING:
    from ingest.config import RemoteSettings


def remote_access(
    remote: RemoteSettings,
    sources: list[str],
    *,
    anonymous: bool,
    requester_pays: bool,
    planetary_computer: bool,
    headers: list[str],
) -> None:
    """``remote`` as the flags say (exit 2 on flags that cannot go together or cannot be sent)."""
    _unsigned(remote, anonymous=anonymous, requester_pays=requester_pays)
    _signed_blobs(remote, sources, asked=planetary_computer)
    _given_headers(remote, sources, headers)


def _unsigned(remote: RemoteSettings, *, anonymous: bool, requester_pays: bool) -> None:
    """``--anonymous``: every bucket read unsigned, rasters too, and the virtual references into every bucket;
    the repository's own storage keeps its credentials. ``--requester-pays``: every bucket read as its requester
    paying."""
    if anonymous and requester_pays:
        fail("--anonymous and --requester-pays exclude each other: a requester who pays signs its requests", 2)
    if anonymous:
        remote.anonymous = ["s3://"]
    if requester_pays:
        remote.requester_pays = ["s3://"]


def _signed_blobs(remote: RemoteSettings, sources: list[str], *, asked: bool) -> None:
    """``--planetary-computer``, or a source on Planetary Computer's host (whose items' assets cannot be read
    otherwise): Azure blobs are read with Planetary Computer's SAS tokens, unless remote.sas_token_url names
    another service."""
    from ingest import remote as reach  # PLANETARY_COMPUTER read when called (a test points it elsewhere)

    if remote.sas_token_url is not None or not (asked or reach.planetary_computer_source(sources)):
        return
    remote.sas_token_url = reach.PLANETARY_COMPUTER
    if not asked:
        stderr.print("Azure blobs are read with SAS tokens from Planetary Computer's token service")


def _given_headers(remote: RemoteSettings, sources: list[str], given: list[str]) -> None:
    """``--header``: each header for the origin (scheme, host, port) of every http(s) source."""
    if not given:
        return
    from ingest.remote import url_scheme
    from ingest.remote._headers import merged, origin, parse_header

    origins = sorted({origin(source) for source in sources if url_scheme(source) in ("http", "https")})
    if not origins:
        fail("--header is sent to http(s) sources, and none is named (other hosts: remote.headers)", 2)
    for text in given:
        try:
            pair = parse_header(text)
        except ValueError as error:
            fail(f"--header {error}", 2)
        remote.headers = merged(remote.headers, origins, pair)
