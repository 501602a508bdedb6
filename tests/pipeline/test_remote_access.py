"""How remote objects are reached: public prefixes read unsigned (``remote.anonymous``, ``--anonymous``), the
rest signed, and the timeouts and retries of ``remote`` settings, for sources and rasters alike.

Real servers on 127.0.0.1: moto S3 behind tests/_signature_proxy.py (which notes whether each request was
signed: moto itself cannot refuse a signature it does not check, nor serve a public bucket with its checks on),
tests/_http_server.py, and a local Ray cluster.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from urllib.parse import urlparse

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from ingest import Repository, Settings
from ingest.cli import app
from ingest.config import RemoteSettings
from ingest.errors import InvalidRaster
from ingest.lifecycle import check_ref
from ingest.pipeline import SourceOptions, ingest_with_ray
from ingest.rasters import read_granule
from ingest.remote import GdalOptions, Stores, gdal_options, unsigned
from ingest.repository._containers import _s3_credentials, container_access, with_containers
from ingest.sample import make_archive
from tests.pipeline._remote_archive import assert_arrays_equal_the_files, s3_client, upload

GRANULES = 4


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> tuple[Path, list[Path]]:
    folder = tmp_path_factory.mktemp("access-archive")
    return folder, make_archive(folder, granules=GRANULES, seed=23)


def _publish(moto_server, bucket: str, prefix: str) -> None:
    """Make the objects under ``prefix`` public (readable unsigned: moto refuses unsigned reads of the rest)."""
    client = s3_client(moto_server)
    for listed in client.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]:
        client.put_object_acl(Bucket=bucket, Key=listed["Key"], ACL="public-read")


def _signing_by_area(notes: list[tuple[str, str, bool]], bucket: str, area: str) -> set[bool]:
    """Whether the requests for objects under ``s3://bucket/area`` were signed (both values when mixed)."""
    return {signed for _, path, signed in notes if path.startswith(f"/{bucket}/{area}")}


@pytest.mark.usefixtures("ray_cluster")
def test_a_public_prefix_is_read_unsigned_and_the_rest_of_the_bucket_signed(
    tmp_path, archive, moto_server, signature_proxy
):
    folder, item_files = archive
    bucket, url = upload(moto_server, folder)
    public = f"s3://{bucket}/archive/sample-optical/"
    _publish(moto_server, bucket, "archive/sample-optical/")
    settings = Settings(s3=signature_proxy.s3_settings(moto_server), remote=RemoteSettings(anonymous=[public]))
    repository = Repository.create(tmp_path / "repo", settings)

    report = ingest_with_ray(repository, [url], workers=2, batch_size=2, options=SourceOptions(remote_assets=True))

    assert report.rejected == []
    assert_arrays_equal_the_files(repository, folder, item_files, f"s3://{bucket}/archive/")
    notes = signature_proxy.requests()
    # The optical items, their COGs' HEADs (obstore) and ranges (GDAL), in the actors too, went unsigned ...
    optical = [(method, path) for method, path, _ in notes if path.startswith(f"/{bucket}/archive/sample-optical/")]
    assert {("HEAD", ".tif"), ("GET", ".tif"), ("GET", ".json")} <= {
        (method, Path(path).suffix) for method, path in optical
    }
    assert _signing_by_area(notes, bucket, "archive/sample-optical/") == {False}
    # ... and the rest of the same bucket (the other collections, the listing) with the keys set for it.
    for area in ("archive/sample-dem/", "archive/sample-landcover/"):
        assert _signing_by_area(notes, bucket, area) == {True}, area
    # (The HEADs of the bucket itself ask S3 its region, unsigned: tests/pipeline/test_buckets.py.)
    rest = [note for note in notes if not note[1].startswith(f"/{bucket}/archive/sample-optical/")]
    assert all(signed for method, path, signed in rest if (method, path) != ("HEAD", f"/{bucket}"))


@pytest.mark.usefixtures("ray_cluster")
def test_virtual_references_into_a_public_bucket_are_read_unsigned(tmp_path, archive, moto_server, signature_proxy):
    folder, item_files = archive
    bucket, url = upload(moto_server, folder)
    _publish(moto_server, bucket, "")
    s3 = signature_proxy.s3_settings(moto_server)
    settings = Settings(s3=s3, remote=RemoteSettings(anonymous=[f"s3://{bucket}"]))
    repository = Repository.create(tmp_path / "repo", settings)

    report = ingest_with_ray(
        repository, [url], workers=2, batch_size=2, virtual=True, options=SourceOptions(remote_assets=True)
    )
    # make_archive's optical COGs are pixel-interleaved: copied (and listed), the others referenced.
    referenced = [path for path in item_files if "optical" not in path.name]
    assert report.rejected == [] and report.virtual == len(referenced) > 0
    assert _signing_by_area(signature_proxy.requests(), bucket, "") == {False}

    # Icechunk reads the referenced chunks through the bucket's container, authorized unsigned at open ...
    before = len(signature_proxy.requests())
    assert_arrays_equal_the_files(Repository.open(tmp_path / "repo", settings), folder, item_files, url)
    chunk_reads = [note for note in signature_proxy.requests()[before:] if note[1].endswith(".tif")]
    assert chunk_reads and {signed for _, _, signed in chunk_reads} == {False}
    # ... and with the bucket's keys by whoever opens the repository without the public prefix.
    before = len(signature_proxy.requests())
    assert_arrays_equal_the_files(Repository.open(tmp_path / "repo", Settings(s3=s3)), folder, item_files, url)
    chunk_reads = [note for note in signature_proxy.requests()[before:] if note[1].endswith(".tif")]
    assert chunk_reads and {signed for _, _, signed in chunk_reads} == {True}
    # `check --deep` asks each referenced object for its ETag, unsigned too.
    before = len(signature_proxy.requests())
    assert check_ref(Repository.open(tmp_path / "repo", settings), "main", deep=True) == []
    heads = [note for note in signature_proxy.requests()[before:] if note[0] == "HEAD" and note[1].endswith(".tif")]
    assert len(heads) == len(referenced) and {signed for _, _, signed in heads} == {False}


@pytest.mark.usefixtures("ray_cluster")
def test_floe_ingest_anonymous_reads_every_bucket_unsigned_but_the_repository_s_own(
    tmp_path, archive, moto_server, signature_proxy, monkeypatch
):
    folder, item_files = archive
    bucket, url = upload(moto_server, folder)
    _publish(moto_server, bucket, "")
    s3 = signature_proxy.s3_settings(moto_server)
    for name, value in s3.model_dump(exclude_defaults=True).items():
        monkeypatch.setenv(f"FLOE_S3__{name.upper()}", str(value))
    root = f"s3://{moto_server.create_bucket()}/repo"  # the repository on S3 too, through the proxy

    result = CliRunner().invoke(
        app, ["--root", root, "ingest", url, "--anonymous", "--remote-assets", "--workers", "2"], catch_exceptions=False
    )

    assert result.exit_code == 0, result.output
    assert_arrays_equal_the_files(Repository.open(root, Settings(s3=s3)), folder, item_files, url)
    notes = signature_proxy.requests()
    # The public bucket: the listing, the items, the rasters' HEADs and ranges in the actors, all unsigned; the
    # repository's bucket (Icechunk, the Iceberg files) with the keys FLOE_S3__* gives.
    assert {(method, Path(path).suffix) for method, path, _ in notes if path.startswith(f"/{bucket}/")} >= {
        ("GET", ".json"),
        ("HEAD", ".tif"),
        ("GET", ".tif"),
    }
    assert _signing_by_area(notes, bucket, "") == {False}
    repository_bucket = root.removeprefix("s3://").split("/")[0]
    assert _signing_by_area(notes, repository_bucket, "") == {True}


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.parametrize(
    ("stall", "virtual", "said"),
    [
        ("__stall__", False, "timed out after 1 retry"),  # the HEAD stalls (obstore)
        # The HEAD answers, GDAL's reads stall: GDAL says only "not recognized as being in a supported file
        # format"; floe's read of the first bytes, made once (GDAL has retried), then says why.
        ("__stall_body__", False, "timed out"),
        ("__stall_body__", True, "timed out after 1 retry"),  # the header's range read stalls (obstore)
    ],
)
def test_a_stalled_raster_is_rejected_after_the_retries_the_settings_allow(
    tmp_path, archive, http_server, stall, virtual, said
):
    folder, item_files = archive
    served = http_server.folder / f"stall-{stall}-{virtual}"
    shutil.copytree(folder, served, dirs_exist_ok=True)
    stalled = next(path for path in item_files if "optical" not in path.name)  # one --virtual references
    item = json.loads(stalled.read_text())
    tif = (served / (stalled.parent / item["assets"]["data"]["href"]).relative_to(folder)).relative_to(
        http_server.folder
    )
    item["assets"]["data"]["href"] = f"{http_server.url}/{stall}/{tif.as_posix()}"
    (served / stalled.relative_to(folder)).write_text(json.dumps(item))
    urls = [f"{http_server.url}/{served.name}/{path.relative_to(folder).as_posix()}" for path in item_files]
    # 3 s without a byte: the other granules, served from this machine, never come near it on a busy machine.
    settings = Settings(remote=RemoteSettings(read_timeout_s=3, retries=1, retry_timeout_s=60))
    repository = Repository.create(tmp_path / "repo", settings)

    report = ingest_with_ray(
        repository, urls, workers=2, batch_size=2, virtual=virtual, options=SourceOptions(remote_assets=True)
    )

    ((rejected_id, reason),) = [(rejection.item_id, rejection.reason) for rejection in report.rejected]
    assert rejected_id == item["id"]
    assert item["assets"]["data"]["href"] in reason and said in reason, reason
    assert report.rows_added == GRANULES - 1
    assert {row["id"] for row in repository.view().items()} == {
        json.loads(path.read_text())["id"] for path in item_files if path != stalled
    }


@pytest.mark.slow
def test_the_read_that_explains_a_stalled_transfer_is_made_once(http_server):
    remote = RemoteSettings(read_timeout_s=1, retries=2)

    def requests_while(name: str, stores: Stores | None) -> tuple[int, str]:
        # A file of its own each time: GDAL keeps what it learnt of a URL (its HEAD) for the process.
        (http_server.folder / name).write_bytes(b"II*\x00 never sent")
        url = f"{http_server.url}/__stall_body__/{name}"
        before = len(http_server.requests())
        with pytest.raises(InvalidRaster) as refused:
            read_granule(url, gdal_options(remote=remote), stores)
        made = sum(path == urlparse(url).path for path, *_ in http_server.requests()[before:])
        return made, refused.value.reason.removeprefix(f"granule {url} cannot be read: ")

    gdal_alone, unexplained = requests_while("unexplained.tif", None)
    explained, reason = requests_while("explained.tif", Stores.reaching(None, remote))
    assert "not recognized as being in a supported file format" in unexplained
    assert reason == "timed out"
    # GDAL's requests (its retries included), then one more: the explaining read is not retried.
    assert explained == gdal_alone + 1


@pytest.mark.slow
def test_gdal_gives_up_on_a_stalled_server_after_the_read_timeout(http_server):
    url = f"{http_server.url}/__stall__/never.tif"
    with pytest.raises(InvalidRaster) as refused:
        read_granule(url, gdal_options(remote=RemoteSettings(read_timeout_s=1, retries=0)))
    assert refused.value.reason.startswith(f"granule {url} cannot be read: timed out, nothing received")


def test_a_remote_file_that_is_no_tiff_is_named_so(http_server):
    (http_server.folder / "page.tif").write_text("<html>an error page</html>")
    url = f"{http_server.url}/page.tif"
    with pytest.raises(InvalidRaster) as refused:
        read_granule(url, gdal_options(), Stores())
    assert refused.value.reason == f"granule {url} cannot be read: not a TIFF (it starts with b'<html>an')"


# -- the settings and what they turn into ---------------------------------------------------------------------


def test_anonymous_prefixes_are_s3_urls_and_a_bucket_is_a_whole_name():
    assert RemoteSettings(anonymous=["s3://pub", "s3://b/part/", "s3://"]).anonymous == [
        "s3://pub/",
        "s3://b/part/",
        "s3://",
    ]
    with pytest.raises(ValidationError, match="'https://host/' is not an s3:// URL"):
        RemoteSettings(anonymous=["https://host/"])
    prefixes = RemoteSettings(anonymous=["s3://pub"]).anonymous
    assert unsigned("s3://pub/a.tif", prefixes)
    assert not unsigned("s3://public/a.tif", prefixes)  # another bucket whose name starts alike
    assert not unsigned("https://pub/a.tif", ["s3://"])


def test_environment_settings_reach_the_remote_settings(monkeypatch):
    monkeypatch.setenv("FLOE_REMOTE__ANONYMOUS", '["s3://sentinel-cogs"]')
    monkeypatch.setenv("FLOE_REMOTE__READ_TIMEOUT_S", "7")
    remote = Settings().remote
    assert remote.anonymous == ["s3://sentinel-cogs/"] and remote.read_timeout_s == 7
    stores = Stores.of(Settings())
    assert stores.anonymous == ("s3://sentinel-cogs/",)
    assert stores.transport.read_timeout.total_seconds() == 7
    assert Stores.of(Settings(), anonymous=True).anonymous == ("s3://",)


def test_gdal_reads_a_public_prefix_without_credentials_and_the_rest_with_them(moto_server):
    s3 = moto_server.s3_settings()
    options = gdal_options(s3, remote=RemoteSettings(anonymous=["s3://pub/"], read_timeout_s=5, retries=2))
    public, private = options.for_url("s3://pub/a.tif"), options.for_url("s3://priv/a.tif")
    assert public["AWS_NO_SIGN_REQUEST"] == "YES" and "AWS_SECRET_ACCESS_KEY" not in public
    assert "AWS_NO_SIGN_REQUEST" not in private and private["AWS_SECRET_ACCESS_KEY"] == s3.secret_access_key
    assert public["GDAL_HTTP_LOW_SPEED_TIME"] == "5" and public["GDAL_HTTP_MAX_RETRY"] == "2"
    # Ray hands the options to actors pickled: the prefixes go with them.
    again = pickle.loads(pickle.dumps(options))
    assert isinstance(again, GdalOptions) and again.for_url("s3://pub/a.tif") == public


def test_a_container_is_unsigned_only_when_a_prefix_covers_its_whole_bucket(moto_server):
    s3 = moto_server.s3_settings()

    def kind(container: str, anonymous: list[str]) -> str:
        return type(_s3_credentials(container, s3, RemoteSettings(anonymous=anonymous).anonymous)).__name__

    assert kind("s3://pub/", ["s3://pub"]) == "Anonymous"
    assert kind("s3://pub/", ["s3://"]) == "Anonymous"
    assert kind("s3://priv/", ["s3://pub"]) == "Static"  # the keys the settings hold
    assert kind("s3://pub/", ["s3://pub/part/"]) == "Static"  # a part of the bucket only: its keys
    config = with_containers(None, ["s3://pub/", "s3://priv/"], s3)
    access = container_access(config, s3, ["s3://pub/"])
    assert access is not None and set(access) == {"s3://pub/", "s3://priv/"}
