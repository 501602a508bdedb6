"""HTTP headers (an API key, a bearer token) sent to some URL prefixes only: ``floe ingest --header`` and
``remote.headers``.

tests/_http_server.py serves ``/__auth__/<file>`` only to a request that carries its bearer token (401 otherwise)
and notes the ``Authorization`` of every request (``/__requests__``), so a test sees who sent it and who did not.
(A private STAC API read by the page reader: tests/pipeline/test_page_reader.py.)
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from ingest import Repository, Settings
from ingest.cli import app
from ingest.config import RemoteSettings
from ingest.pipeline import SourceOptions, ingest_with_ray
from ingest.remote import GdalOptions, Stores, gdal_options, head
from ingest.remote._headers import Headers, parse_header
from ingest.sample import make_archive
from ingest.stac import read_arrays_asset
from tests._http_server import TOKEN
from tests.conftest import HttpServer
from tests.pipeline._remote_archive import assert_arrays_equal_the_files

GRANULES = 3
BEARER = f"Bearer {TOKEN}"


@pytest.fixture(scope="module")
def archive(tmp_path_factory, http_server: HttpServer) -> tuple[Path, list[Path], list[str]]:
    """The sample archive, locally and served under ``/__auth__/private/``; the items' private URLs."""
    folder = tmp_path_factory.mktemp("private-archive")
    item_files = make_archive(folder, granules=GRANULES, seed=43)
    shutil.copytree(folder, http_server.folder / "private")
    urls = [f"{http_server.url}/__auth__/private/{path.relative_to(folder).as_posix()}" for path in item_files]
    return folder, item_files, urls


def _requests(http_server: HttpServer) -> list[tuple[str, str | None, str | None]]:
    return [tuple(request) for request in json.loads(http_server.get("__requests__"))]


def test_header_is_sent_to_the_sources_named_and_refused_without(tmp_path, archive, http_server):
    _folder, _item_files, urls = archive
    runner = CliRunner()

    refused = runner.invoke(app, ["--root", str(tmp_path / "a"), "ingest", *urls, "--workers", "0"])
    assert refused.exit_code == 3, refused.output
    assert "not authenticated (HTTP 401)" in refused.output and "--header" in refused.output

    read = runner.invoke(
        app, ["--root", str(tmp_path / "b"), "ingest", *urls, "--workers", "0", "--header", f"Authorization: {BEARER}"]
    )
    assert read.exit_code == 0, read.output
    assert len(list(Repository.open(tmp_path / "b").view().items())) == GRANULES
    # The token is not kept: not in the rows, nor in any file of the repository.
    for path in (tmp_path / "b").rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path


def test_header_options_are_checked(tmp_path, archive):
    _folder, _item_files, urls = archive
    runner = CliRunner()
    local = runner.invoke(app, ["--root", str(tmp_path / "r"), "ingest", str(tmp_path), "--header", "X-Key: 1"])
    assert local.exit_code == 2 and "none is named" in local.output
    malformed = runner.invoke(app, ["--root", str(tmp_path / "r"), "ingest", urls[0], "--header", "no colon here"])
    assert malformed.exit_code == 2 and "is not 'Name: value'" in malformed.output
    for text in ("X-Key: a\r\nX-Other: b", "X-Key: a\nb", "Bad Name: x"):
        with pytest.raises(ValueError, match=r"line break|is not 'Name: value'"):
            parse_header(text)
    assert parse_header("  Authorization :  Bearer abc ") == ("Authorization", "Bearer abc")
    # In the settings, a value that would smuggle a header in is refused, and the error does not repeat it.
    with pytest.raises(ValidationError) as error:
        RemoteSettings(headers={"https://api.example.com/": {"X-Key": "secret-value\r\nX-Admin: yes"}})
    assert "line break" in str(error.value) and "secret-value" not in str(error.value)
    with pytest.raises(ValidationError, match="not an http"):
        RemoteSettings(headers={"s3://bucket/": {"X-Key": "1"}})


@pytest.mark.usefixtures("ray_cluster")
def test_rasters_behind_a_header_are_copied_and_virtual_copies_them_saying_why(tmp_path, archive, http_server):
    folder, item_files, urls = archive
    prefix = f"{http_server.url}/__auth__/private/"
    remote = RemoteSettings(headers={prefix: {"Authorization": BEARER}})
    before = len(_requests(http_server))

    repository = Repository.create(tmp_path / "copy", Settings(remote=remote))
    report = ingest_with_ray(repository, urls, workers=2, options=SourceOptions(remote_assets=True))

    assert report.rejected == []
    assert_arrays_equal_the_files(repository, folder, item_files, prefix)
    # Items and HEADs (obstore in the driver and actors) and GDAL's reads of the COGs (actors): all with the token.
    seen = _requests(http_server)[before:]
    tifs = [auth for path, _, auth in seen if path.endswith(".tif")]
    assert tifs and set(tifs) == {BEARER}
    assert {auth for path, _, auth in seen if path.endswith(".json")} == {BEARER}

    virtual = Repository.create(tmp_path / "virtual", Settings(remote=remote))
    report = ingest_with_ray(virtual, urls, workers=2, virtual=True, options=SourceOptions(remote_assets=True))
    assert report.rejected == [] and len(report.fallbacks) == GRANULES
    assert all("carry headers" in fallback.reason for fallback in report.fallbacks)
    assert not any(read_arrays_asset(row).virtual for row in virtual.view().items())
    assert_arrays_equal_the_files(virtual, folder, item_files, prefix)


def test_headers_go_to_their_prefixes_alone(http_server, archive):
    _folder, _item_files, urls = archive
    headers = Headers.given(
        {
            "https://API.example.com/": {"X-Key": "host", "X-Scope": "host"},
            "https://api.example.com/v1/": {"X-Scope": "v1"},
            "https://other.example.com/v1/": {"X-Other": "1"},
        }
    )
    assert headers.for_url("https://api.example.com/v1/search?limit=2") == {"X-Key": "host", "X-Scope": "v1"}
    assert headers.for_url("https://Api.Example.com/v1") == {"X-Key": "host", "X-Scope": "v1"}  # its landing page
    assert headers.for_url("https://api.example.com/v2/x") == {"X-Key": "host", "X-Scope": "host"}
    assert headers.for_url("https://api.example.com.evil.org/v1/") == {}
    assert headers.for_url("http://api.example.com/v1/") == {}  # another scheme
    assert "host" not in repr(headers) and "v1" in repr(headers)

    options = gdal_options(remote=RemoteSettings(headers={"https://api.example.com/": {"X-Key": "k", "X-B": "b"}}))
    copied = pickle.loads(pickle.dumps(options))
    assert isinstance(copied, GdalOptions)
    assert copied.for_url("https://api.example.com/a.tif")["GDAL_HTTP_HEADERS"] == "X-Key: k\r\nX-B: b"
    assert "GDAL_HTTP_HEADERS" not in copied.for_url("https://elsewhere.example.com/a.tif")

    # obstore: one store per host and headers, each sending its own.
    private = Stores.reaching(None, RemoteSettings(headers={f"{http_server.url}/__auth__/": {"Authorization": BEARER}}))
    assert head(private, urls[0])["size"] > 0
    assert private.locate(urls[0])[0] is not private.locate(f"{http_server.url}/private/x.json")[0]
