"""Azure blobs read with SAS tokens from a token service, as Planetary Computer's COGs and items are.

tests/_blob_server.py stands in for both: its blobs, addressed path-style (``/<account>/<container>/<blob>``, as
``remote.blob_path_style`` declares), refuse a read without a token as Planetary Computer's storage accounts do
(409 ``PublicAccessNotPermitted``) and one with a token it did not issue or that expired (403); its token service
answers ``GET <service>/<account>/<container>`` as Planetary Computer's does. The archive (items and COGs) is laid
out under one container, so items, HEADs and GDAL's range reads all need the token.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import ingest.remote
from ingest import Repository, Settings
from ingest.cli import app
from ingest.config import RemoteSettings
from ingest.errors import InvalidRaster, NotVirtualizable
from ingest.lifecycle import check_ref
from ingest.pipeline import SourceOptions, ingest_items, ingest_with_ray
from ingest.rasters import read_granule
from ingest.rasters._opening import detail
from ingest.rasters._place import locate
from ingest.remote import GdalOptions, RemoteError, SasTokens, Stores, describe, gdal_options, head, redacted
from ingest.sample import make_archive
from ingest.stac import read_arrays_asset
from tests.conftest import BlobServer
from tests.pipeline._remote_archive import assert_arrays_equal_the_files

ACCOUNT = "pcarchive"
GRANULES = 3


@pytest.fixture(scope="module")
def archive(tmp_path_factory, blob_server: BlobServer) -> tuple[Path, list[Path], list[str]]:
    """The sample archive, locally and in the container ``pcarchive/cogs``; the items' blob URLs."""
    folder = tmp_path_factory.mktemp("sas-archive")
    item_files = make_archive(folder, granules=GRANULES, seed=41)
    shutil.copytree(folder, blob_server.folder / ACCOUNT / "cogs")
    urls = [f"{blob_server.url}/{ACCOUNT}/cogs/{path.relative_to(folder).as_posix()}" for path in item_files]
    return folder, item_files, urls


def _remote(blob_server: BlobServer, **more) -> RemoteSettings:
    return RemoteSettings(
        sas_token_url=blob_server.token_service, blob_path_style=[blob_server.host], retries=0, **more
    )


def _environment(blob_server: BlobServer) -> dict[str, str]:
    return {
        "FLOE_REMOTE__SAS_TOKEN_URL": blob_server.token_service,
        "FLOE_REMOTE__BLOB_PATH_STYLE": json.dumps([blob_server.host]),
        "FLOE_REMOTE__SAS_SUBSCRIPTION_KEY": "floe-test-key",
    }


def _nothing_signed_in(repository: Repository, *texts: str) -> None:
    """No token reached the rows (hrefs, the arrays' sources), the report, or a file of the repository."""
    rows = json.dumps(list(repository.view().items()), default=str)
    for text in (rows, *texts):
        assert "sig=" not in text and "se=" not in text
    for path in Path(repository.location.url.removeprefix("file://")).rglob("*"):
        if path.is_file():
            assert b"sig=" not in path.read_bytes(), path


@pytest.mark.usefixtures("ray_cluster")
def test_blobs_are_copied_with_tokens_from_the_service_and_no_token_is_kept(tmp_path, archive, blob_server):
    folder, item_files, urls = archive
    before = blob_server.stats()
    root, report = tmp_path / "repo", tmp_path / "report.jsonl"

    result = CliRunner().invoke(
        app,
        ["--root", str(root), "ingest", *urls, "--remote-assets", "--workers", "2", "--report", str(report)],
        env=_environment(blob_server),
    )

    assert result.exit_code == 0, result.output
    repository = Repository.open(root)
    assert_arrays_equal_the_files(repository, folder, item_files, f"{blob_server.url}/{ACCOUNT}/cogs/")
    after = blob_server.stats()
    # Items (the driver's obstore), HEADs (obstore) and GDAL's reads (in the actors): every one signed.
    assert after["reads"]["signed"] - before["reads"]["signed"] >= 3 * GRANULES
    assert after["reads"]["unsigned"] == before["reads"]["unsigned"]
    assert after["reads"]["refused"] == before["reads"]["refused"]
    # One token per process that read the container (the driver, each actor), not one per read.
    issued = after["issued"].get(f"{ACCOUNT}/cogs", 0) - before["issued"].get(f"{ACCOUNT}/cogs", 0)
    assert 1 <= issued <= 3
    assert set(after["keys"][len(before["keys"]) :]) == {"floe-test-key"}
    assert all(
        set(read_arrays_asset(row).sources) and all("?" not in href for href in _hrefs(row))
        for row in repository.view().items()
    )
    _nothing_signed_in(repository, report.read_text())


def _hrefs(row: dict) -> list[str]:
    return [asset["href"] for asset in row["assets"].values()]


@pytest.mark.usefixtures("ray_cluster")
def test_virtual_references_blobs_read_with_tokens_asked_for_whenever_the_repository_opens(
    tmp_path, archive, blob_server
):
    folder, item_files, urls = archive
    repository = Repository.create(tmp_path / "repo", Settings(remote=_remote(blob_server)))

    report = ingest_with_ray(
        repository, urls, workers=2, batch_size=4, virtual=True, options=SourceOptions(remote_assets=True)
    )

    assert report.rejected == []
    # The sample's optical granule is pixel-interleaved, which no reference can express: copied, as anywhere.
    assert len(report.fallbacks) == 1 and "pixel-interleaved" in report.fallbacks[0].reason
    assert set(repository.icechunk.config.virtual_chunk_containers) == {f"az://{ACCOUNT}@cogs/"}
    # Another process opening the repository (a fresh token for Icechunk), and one that cannot have a token.
    reopened = Repository.open(tmp_path / "repo", Settings(remote=_remote(blob_server)))
    referenced = [read_arrays_asset(row).virtual for row in reopened.view().items()]
    assert sorted(referenced) == [False] + [True] * (GRANULES - 1)
    before = blob_server.stats()["reads"]["signed"]
    assert_arrays_equal_the_files(reopened, folder, item_files, f"{blob_server.url}/{ACCOUNT}/cogs/")
    assert blob_server.stats()["reads"]["signed"] > before
    _nothing_signed_in(reopened)
    untokened = Repository.open(tmp_path / "repo", Settings(remote=RemoteSettings(blob_path_style=[blob_server.host])))
    with pytest.raises(Exception, match="PublicAccessNotPermitted"):
        assert_arrays_equal_the_files(untokened, folder, item_files, f"{blob_server.url}/{ACCOUNT}/cogs/")
    assert check_ref(reopened, "main", deep=True) == []


@pytest.mark.usefixtures("ray_cluster")
def test_a_referenced_blob_that_changes_is_refused_and_named_by_check_deep(tmp_path, blob_server):
    folder = tmp_path / "archive"
    item_files = make_archive(folder, granules=GRANULES, seed=43)
    shutil.copytree(folder, blob_server.folder / ACCOUNT / "changing")
    base = f"{blob_server.url}/{ACCOUNT}/changing/"
    urls = [base + path.relative_to(folder).as_posix() for path in item_files]
    repository = Repository.create(tmp_path / "repo", Settings(remote=_remote(blob_server)))
    report = ingest_with_ray(
        repository, urls, workers=2, batch_size=4, virtual=True, options=SourceOptions(remote_assets=True)
    )
    referenced = [
        (item_file, row)
        for item_file in item_files
        if (row := repository.view().item(*_key(item_file))) is not None and read_arrays_asset(row).virtual
    ]
    assert report.rejected == [] and len(referenced) == GRANULES - 1
    (changed_file, changed), (gone_file, gone) = referenced
    changed_blob = blob_server.folder / ACCOUNT / "changing" / _tif(folder, changed_file, changed)
    gone_blob = blob_server.folder / ACCOUNT / "changing" / _tif(folder, gone_file, gone)

    # Upstream, one blob is rewritten (a second later: HTTP dates have whole seconds) and another deleted.
    changed_blob.write_bytes(changed_blob.read_bytes())
    later = changed_blob.stat().st_mtime + 2
    os.utime(changed_blob, (later, later))
    gone_blob.unlink()

    with pytest.raises(Exception, match="checksum of the object owning the virtual chunk has changed"):
        repository.view().item_arrays(changed["collection"], changed["id"])["data"].values  # noqa: B018
    problems = [problem.what for problem in check_ref(repository, "main", deep=True)]
    changed_url = base + changed_blob.relative_to(blob_server.folder / ACCOUNT / "changing").as_posix()
    gone_url = base + gone_blob.relative_to(blob_server.folder / ACCOUNT / "changing").as_posix()
    assert any(changed_url in what and "changed after it was referenced" in what for what in problems), problems
    assert any(gone_url in what and "no such object" in what for what in problems), problems
    assert len(problems) == 2 and not any("sig=" in what for what in problems), problems


def test_a_blob_whose_name_must_be_escaped_is_copied_not_referenced(blob_server):
    folder = blob_server.folder / ACCOUNT / "escaped"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "a b.tif").write_bytes(b"II*\x00")
    (folder / "plain.tif").write_bytes(b"II*\x00")
    stores = Stores.reaching(None, _remote(blob_server))

    with pytest.raises(NotVirtualizable, match="characters a reference must escape; it is copied"):
        locate(f"{blob_server.url}/{ACCOUNT}/escaped/a%20b.tif", stores)
    place = locate(f"{blob_server.url}/{ACCOUNT}/escaped/plain.tif", stores)
    assert place.url == f"az://{ACCOUNT}@escaped/plain.tif" and place.size == 4
    assert "sig=" in place.gdal_path and "sig=" not in place.url


def _key(item_file: Path) -> tuple[str, str]:
    item = json.loads(item_file.read_text())
    return item["collection"], item["id"]


def _tif(folder: Path, item_file: Path, row: dict) -> Path:
    """The raster of ``row`` (read from ``item_file``), relative to the archive's ``folder``."""
    href = json.loads(item_file.read_text())["assets"]["data"]["href"]
    return (item_file.parent / href).resolve().relative_to(folder.resolve())


def test_without_a_token_service_blobs_are_refused_with_what_to_do(tmp_path, archive, blob_server):
    _folder, _item_files, urls = archive
    repository = Repository.create(tmp_path / "repo")

    report = ingest_items(repository, urls)

    assert report.rows_added == 0 and len(report.rejected) == GRANULES
    for rejection, url in zip(sorted(report.rejected, key=lambda r: r.source), sorted(urls), strict=True):
        assert rejection.source == url
        assert "PublicAccessNotPermitted" in rejection.reason and "--planetary-computer" in rejection.reason


def test_planetary_computer_flag_asks_its_token_service(tmp_path, archive, blob_server, monkeypatch):
    _folder, _item_files, urls = archive
    # The flag names Planetary Computer's service; here it is the test server's (no network to the real one).
    monkeypatch.setattr(ingest.remote, "PLANETARY_COMPUTER", blob_server.token_service)
    env = {"FLOE_REMOTE__BLOB_PATH_STYLE": json.dumps([blob_server.host])}
    runner = CliRunner()

    refused = runner.invoke(app, ["--root", str(tmp_path / "a"), "ingest", *urls, "--workers", "0"], env=env)
    assert refused.exit_code == 3, refused.output
    assert "PublicAccessNotPermitted" in refused.output

    before = blob_server.stats()["reads"]["signed"]
    read = runner.invoke(
        app, ["--root", str(tmp_path / "b"), "ingest", *urls, "--workers", "0", "--planetary-computer"], env=env
    )
    assert read.exit_code == 0, read.output
    assert len(list(Repository.open(tmp_path / "b").view().items())) == GRANULES
    assert blob_server.stats()["reads"]["signed"] - before == GRANULES


def test_a_token_is_asked_for_again_only_when_it_expires_soon(blob_server):
    (blob_server.folder / ACCOUNT / "renewals").mkdir(parents=True, exist_ok=True)
    tokens = SasTokens.of(_remote(blob_server))
    url = f"{blob_server.url}/{ACCOUNT}/renewals/a.tif"

    def issued() -> int:
        return blob_server.stats()["issued"].get(f"{ACCOUNT}/renewals", 0)

    try:
        blob_server.set("ttl", 60)  # under the 5 minutes a token must have left
        first = tokens.sign(url)
        second = tokens.sign(url)
        assert issued() == 2 and first.startswith(url + "?") and "sig=" in second
        blob_server.set("ttl", 3600)
        third = tokens.sign(url)
        assert tokens.sign(url) == third and tokens.sign(url + "x").startswith(url + "x?")
        assert issued() == 3
    finally:
        blob_server.set("ttl", 3600)


def test_token_service_failures_are_reasons_naming_the_url(tmp_path, blob_server):
    (blob_server.folder / ACCOUNT / "garbled").mkdir(parents=True, exist_ok=True)
    stores = Stores.reaching(None, _remote(blob_server))

    unknown = f"{blob_server.url}/{ACCOUNT}/nothere/a.tif"
    with pytest.raises(RemoteError) as error:
        head(stores, unknown)
    assert error.value.url == unknown
    assert f"no SAS token for {ACCOUNT}/nothere from {blob_server.token_service}" in error.value.reason
    assert "HTTP 404" in error.value.reason

    # A granule whose token cannot be had is an InvalidRaster naming it, from GDAL's side too.
    with pytest.raises(InvalidRaster, match=f"granule {unknown} cannot be read: no SAS token"):
        read_granule(unknown, gdal_options(remote=_remote(blob_server)))

    try:
        blob_server.set("mode", "garbage")
        with pytest.raises(RemoteError, match="is not a SAS token"):
            head(stores, f"{blob_server.url}/{ACCOUNT}/garbled/a.tif")
    finally:
        blob_server.set("mode", "ok")

    from tests.conftest import free_port

    silent = SasTokens(f"http://127.0.0.1:{free_port()}/token", path_style=(blob_server.host,), retries=1)
    with pytest.raises(RemoteError, match=r"no SAS token for .*refused"):
        Stores(tokens=silent).locate(f"{blob_server.url}/{ACCOUNT}/cogs/a.tif")


def test_blob_urls_and_the_names_that_go_to_the_service():
    tokens = SasTokens("https://tokens.example/token", path_style=("127.0.0.1:10000",))
    assert tokens.container("https://sentinel2l2a01.blob.core.windows.net/sentinel2-l2/01/C/a.tif") == (
        "sentinel2l2a01",
        "sentinel2-l2",
    )
    assert tokens.container("http://127.0.0.1:10000/devaccount/items/x.parquet") == ("devaccount", "items")
    for untouched in (
        "https://example.com/sentinel2-l2/a.tif",  # not a blob host
        "https://acct.blob.core.windows.net/cont/a.tif?st=1&sig=2",  # signed already
        "https://acct.blob.core.windows.net/cont",  # a container, no blob
        "https://Bad_Account.blob.core.windows.net/cont/a.tif",  # not an account name
        "https://acct.blob.core.windows.net/../a.tif",  # not a container name
        "https://acct.blob.core.windows.net/a--b/a.tif",
        "s3://acct/cont/a.tif",
        "http://127.0.0.1:10001/devaccount/items/x.parquet",  # another host
    ):
        assert tokens.container(untouched) is None, untouched
        assert tokens.sign(untouched) == untouched
    assert SasTokens().container("https://acct.blob.core.windows.net/cont/a.tif") is None  # no service
    assert SasTokens(None, key="secret").__repr__().count("secret") == 0


def test_options_carry_the_tokens_to_actors_and_errors_carry_no_query(blob_server):
    options = gdal_options(remote=_remote(blob_server, sas_subscription_key="k"))
    copied = pickle.loads(pickle.dumps(options))
    assert isinstance(copied, GdalOptions) and copied.tokens == options.tokens
    (blob_server.folder / ACCOUNT / "paths").mkdir(parents=True, exist_ok=True)
    url = f"{blob_server.url}/{ACCOUNT}/paths/a.tif"
    assert copied.path(url).startswith(f"/vsicurl/{url}?se=") and "&sig=" in copied.path(url)
    assert copied.path("https://example.com/a.tif") == "/vsicurl/https://example.com/a.tif"

    text = "'/vsicurl/https://a.blob.core.windows.net/c/x.tif?se=2026&sig=SECRET' not recognized"
    assert "SECRET" not in redacted(text) and "https://a.blob.core.windows.net/c/x.tif?..." in redacted(text)
    assert "SECRET" not in describe(OSError(text))
    assert "SECRET" not in detail(OSError(text))
    np.testing.assert_equal(redacted("no URL here"), "no URL here")
