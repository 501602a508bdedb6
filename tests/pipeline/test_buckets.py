"""What each source bucket needs, for every reader (obstore for items and HEADs, GDAL for raster copies,
Icechunk for virtual references, ``check --deep``): its own region, and for a requester-pays bucket, requests
that say their requester pays.

moto cares for neither; S3 does, and so does tests/_signature_proxy.py in front of moto: a request signed for
another region than its bucket's gets S3's 301 without a place to go, and a request for a requester-pays bucket
that does not say it pays gets S3's 403. The repository's settings say ``us-east-1`` throughout; the archive's
bucket is in ``eu-west-3`` (regions) or marked requester-pays at the proxy.
"""

from __future__ import annotations

import pickle
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from typer.testing import CliRunner

from ingest import Repository, Settings
from ingest.cli import app
from ingest.config import RemoteSettings
from ingest.lifecycle import check_ref
from ingest.pipeline import SourceOptions, ingest_items, ingest_with_ray
from ingest.remote import Buckets, GdalOptions, RemoteError, Stores, describe, gdal_options, head
from ingest.remote._buckets import asked_region
from ingest.sample import make_archive
from tests.conftest import ProxyNote
from tests.pipeline._remote_archive import assert_arrays_equal_the_files, upload

REGION = "eu-west-3"
GRANULES = 3


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> tuple[Path, list[Path]]:
    folder = tmp_path_factory.mktemp("regions-archive")
    return folder, make_archive(folder, granules=GRANULES, seed=31)


def _bucket_requests(notes: list[ProxyNote], bucket: str) -> list[ProxyNote]:
    """The requests for ``bucket``'s objects and listings (not the HEADs of the bucket that ask its region)."""
    return [
        note
        for note in notes
        if note.path.startswith(f"/{bucket}/") or (note.path == f"/{bucket}" and note.method != "HEAD")
    ]


def _region_questions(notes: list[ProxyNote], bucket: str) -> list[ProxyNote]:
    return [note for note in notes if note.method == "HEAD" and note.path == f"/{bucket}"]


@pytest.mark.usefixtures("ray_cluster")
def test_a_bucket_in_another_region_is_read_in_its_own_by_items_heads_and_gdal(
    tmp_path, archive, moto_server, signature_proxy
):
    folder, item_files = archive
    bucket, url = upload(moto_server, folder, REGION)
    settings = Settings(s3=signature_proxy.s3_settings(moto_server))  # us-east-1
    assert settings.s3.region == "us-east-1"
    repository = Repository.create(tmp_path / "repo", settings)

    report = ingest_with_ray(repository, [url], workers=2, batch_size=2, options=SourceOptions(remote_assets=True))

    assert report.rejected == []
    assert_arrays_equal_the_files(repository, folder, item_files, url)
    notes = signature_proxy.notes()
    reads = _bucket_requests(notes, bucket)
    # The listing and items (obstore), the COGs' HEADs (obstore) and ranges (GDAL, in the actors) ...
    assert {("GET", ".json"), ("HEAD", ".tif"), ("GET", ".tif")} <= {(note[0], Path(note[1]).suffix) for note in reads}
    # ... every one signed for the bucket's region, none refused.
    assert {(signed, region) for _, _, signed, region, _ in reads} == {(True, REGION)}
    # The region was asked of S3 by unsigned HEADs of the bucket (once in each process that reads it).
    questions = _region_questions(notes, bucket)
    assert questions and not any(signed for _, _, signed, _, _ in questions)


@pytest.mark.usefixtures("ray_cluster")
def test_without_its_region_a_bucket_elsewhere_is_refused_with_a_reason_and_with_it_named_is_read(
    tmp_path, archive, moto_server, signature_proxy
):
    folder, item_files = archive
    bucket, url = upload(moto_server, folder, REGION)
    s3 = signature_proxy.s3_settings(moto_server)

    blind = Repository.create(tmp_path / "blind", Settings(s3=s3, remote=RemoteSettings(find_regions=False)))
    report = ingest_items(blind, [url], options=SourceOptions(remote_assets=True))
    assert report.rows_added == 0
    assert report.rejected and all("remote.regions" in rejection.reason for rejection in report.rejected), (
        report.rejected
    )

    before = len(signature_proxy.notes())
    named = RemoteSettings(find_regions=False, regions={bucket: REGION})
    repository = Repository.create(tmp_path / "named", Settings(s3=s3, remote=named))
    report = ingest_with_ray(repository, [url], workers=2, batch_size=2, options=SourceOptions(remote_assets=True))
    assert report.rejected == []
    assert_arrays_equal_the_files(repository, folder, item_files, url)
    notes = signature_proxy.notes()[before:]
    reads = _bucket_requests(notes, bucket)
    assert ("GET", ".tif") in {(note[0], Path(note[1]).suffix) for note in reads}  # GDAL copied the rasters
    assert {region for _, _, _, region, _ in reads} == {REGION}
    assert _region_questions(notes, bucket) == []  # named: nothing asked


@pytest.mark.usefixtures("ray_cluster")
def test_virtual_references_into_a_bucket_elsewhere_are_read_and_checked_in_its_region(
    tmp_path, archive, moto_server, signature_proxy
):
    folder, item_files = archive
    bucket, url = upload(moto_server, folder, REGION)
    settings = Settings(s3=signature_proxy.s3_settings(moto_server))
    repository = Repository.create(tmp_path / "repo", settings)

    report = ingest_with_ray(
        repository, [url], workers=2, batch_size=2, virtual=True, options=SourceOptions(remote_assets=True)
    )
    referenced = [path for path in item_files if "optical" not in path.name]  # the optical COGs are copied
    assert report.rejected == [] and report.virtual == len(referenced) > 0
    # The bucket's container holds its region (not a credential: whoever opens the repository reads it so).
    containers = Repository.open(tmp_path / "repo", settings).icechunk.config.virtual_chunk_containers
    assert f"s3://{bucket}/" in containers
    assert REGION in repr(containers[f"s3://{bucket}/"].store)

    before = len(signature_proxy.notes())
    assert_arrays_equal_the_files(Repository.open(tmp_path / "repo", settings), folder, item_files, url)
    chunk_reads = [note for note in signature_proxy.notes()[before:] if note[1].endswith(".tif")]
    assert chunk_reads and {(signed, region) for _, _, signed, region, _ in chunk_reads} == {(True, REGION)}
    before = len(signature_proxy.notes())
    assert check_ref(Repository.open(tmp_path / "repo", settings), "main", deep=True) == []
    heads = [note for note in signature_proxy.notes()[before:] if note[0] == "HEAD" and note[1].endswith(".tif")]
    assert len(heads) == len(referenced) and {region for _, _, _, region, _ in heads} == {REGION}


def test_a_bucket_s_region_is_asked_once_a_process_and_a_named_one_wins(moto_server, signature_proxy):
    bucket = moto_server.create_bucket(REGION)
    s3 = signature_proxy.s3_settings(moto_server)
    assert Buckets.of(s3, None).region(bucket) == REGION
    assert Buckets.of(s3, RemoteSettings()).region(bucket) == REGION  # remembered: not asked again
    assert len(_region_questions(signature_proxy.notes(), bucket)) == 1
    assert Buckets.of(s3, RemoteSettings(regions={bucket: "ap-south-1"})).region(bucket) == "ap-south-1"
    assert Buckets.of(s3, RemoteSettings(find_regions=False)).region(moto_server.create_bucket(REGION)) is None
    # A bucket in the region set, and a server that cannot be reached, leave the region set as it is.
    assert Buckets.of(s3, None).region(moto_server.create_bucket()) == "us-east-1"
    unreachable = s3.model_copy(update={"endpoint_url": "http://127.0.0.1:9"})
    assert Buckets.of(unreachable, None).region(bucket) is None


class _RegionAnswers(BaseHTTPRequestHandler):
    """Answers a HEAD of ``/<status>/<region>`` with that status and that region in ``x-amz-bucket-region``, as
    S3 answers a HEAD of a bucket: 200 (its own), 301 without a Location (another region's), 403 (not yours)."""

    def do_HEAD(self) -> None:
        _, status, region = self.path.split("/", 2)
        self.send_response(int(status))
        self.send_header("x-amz-bucket-region", region.replace("%20", " "))
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


def test_the_region_is_read_from_any_answer_and_a_hostile_one_is_not_taken():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RegionAnswers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        for status in ("200", "301", "403"):
            assert asked_region(f"{endpoint}/{status}", REGION, 5) == REGION, status
        # A name that is no region's (it would go into a host name and a signature) leaves the region set.
        for hostile in ("evil.example.com", "us-west-2%20x", "US-WEST-2"):
            assert asked_region(f"{endpoint}/200", hostile, 5) is None, hostile
    finally:
        server.shutdown()
        server.server_close()


class _HeldRegionAnswers(_RegionAnswers):
    """As :class:`_RegionAnswers`, counting the questions and holding each answer until the test releases it."""

    asked: ClassVar[list[str]] = []
    release: ClassVar[threading.Event] = threading.Event()

    def do_HEAD(self) -> None:
        self.asked.append(self.path)
        self.release.wait(30)
        super().do_HEAD()


def test_threads_that_need_a_region_at_once_ask_once():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _HeldRegionAnswers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    buckets = Buckets(endpoint=f"http://127.0.0.1:{server.server_address[1]}/200")
    bucket = f"{REGION}-held"  # the server answers with the bucket's name as its region
    entered, answers = [], []

    def ask() -> None:
        entered.append(1)
        answers.append(buckets.region(bucket))

    try:
        threads = [threading.Thread(target=ask) for _ in range(8)]
        for thread in threads:
            thread.start()
        # The first question is held at the server until every thread is in region() and has had time to ask
        # too (were each to ask, 8 would arrive; the count below holds whatever the timing).
        while len(entered) < len(threads) or not _HeldRegionAnswers.asked:
            threading.Event().wait(0.01)
        threading.Event().wait(0.5)
        _HeldRegionAnswers.release.set()
        for thread in threads:
            thread.join(30)
        assert answers == [bucket] * 8
        assert len(_HeldRegionAnswers.asked) == 1
    finally:
        _HeldRegionAnswers.release.set()
        server.shutdown()
        server.server_close()


class _FlakyRegionAnswers(_RegionAnswers):
    """As :class:`_RegionAnswers`, counting the questions per bucket and answering the first of each 503 without
    a region (S3 slowing down), and a bucket named ``silent-...`` 200 without one (an endpoint that never says)."""

    asked: ClassVar[dict[str, int]] = {}

    def do_HEAD(self) -> None:
        bucket = self.path.rsplit("/", 1)[1]
        self.asked[bucket] = self.asked.get(bucket, 0) + 1
        if self.asked[bucket] == 1 or bucket.startswith("silent-"):
            self.send_response(200 if bucket.startswith("silent-") else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        super().do_HEAD()


def test_a_region_question_that_got_no_answer_is_asked_again_later(monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FlakyRegionAnswers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    buckets = Buckets(endpoint=f"http://127.0.0.1:{server.server_address[1]}/200")
    try:
        # Within the wait, the failed question is not asked again: the region set applies.
        assert buckets.region(f"{REGION}-flaky") is None
        assert buckets.region(f"{REGION}-flaky") is None
        assert _FlakyRegionAnswers.asked[f"{REGION}-flaky"] == 1
        # Once it is over, it is (the server answers with the bucket's name as its region).
        monkeypatch.setattr("ingest.remote._buckets.ASK_AGAIN_AFTER_S", 0.0)
        assert buckets.region(f"{REGION}-later") is None
        assert buckets.region(f"{REGION}-later") == f"{REGION}-later"
        assert buckets.region(f"{REGION}-later") == f"{REGION}-later"
        assert _FlakyRegionAnswers.asked[f"{REGION}-later"] == 2
        # An answer that names no region is an answer: kept, not asked again.
        assert buckets.region("silent-bucket") is None and buckets.region("silent-bucket") is None
        assert _FlakyRegionAnswers.asked["silent-bucket"] == 1
    finally:
        server.shutdown()
        server.server_close()


def test_gdal_options_and_stores_take_the_bucket_s_region(moto_server, signature_proxy):
    bucket = moto_server.create_bucket(REGION)
    s3 = signature_proxy.s3_settings(moto_server)
    remote = RemoteSettings(regions={"named": "ap-south-1"})
    options = gdal_options(s3, remote=remote)
    assert options["AWS_REGION"] == "us-east-1"
    assert options.for_url(f"s3://{bucket}/a.tif")["AWS_REGION"] == REGION
    assert options.for_url("s3://named/a.tif")["AWS_REGION"] == "ap-south-1"
    assert options.for_url("https://host/a.tif")["AWS_REGION"] == "us-east-1"
    again = pickle.loads(pickle.dumps(options))  # as Ray actors get it
    assert isinstance(again, GdalOptions) and again.for_url("s3://named/a.tif")["AWS_REGION"] == "ap-south-1"

    stores = Stores.reaching(s3, remote)
    assert stores.bucket_store(bucket, "a").config["region"] == REGION
    assert stores.bucket_store("named", "a").config["region"] == "ap-south-1"


def test_a_request_refused_for_its_region_says_what_to_set(moto_server, signature_proxy):
    bucket = moto_server.create_bucket(REGION)
    s3 = signature_proxy.s3_settings(moto_server)
    stores = Stores.reaching(s3, RemoteSettings(find_regions=False))
    with pytest.raises(RemoteError) as raised:
        head(stores, f"s3://{bucket}/missing.tif")
    assert "another region" in raised.value.reason and "remote.regions" in raised.value.reason
    assert describe(RuntimeError("Received redirect without LOCATION, this normally indicates ...")).startswith(
        "the bucket is in another region"
    )


# -- requester pays --------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("ray_cluster")
def test_floe_ingest_requester_pays_reads_a_requester_pays_bucket_saying_so(
    tmp_path, archive, moto_server, signature_proxy, monkeypatch
):
    folder, item_files = archive
    bucket, url = upload(moto_server, folder)
    signature_proxy.requester_pays(bucket)
    s3 = signature_proxy.s3_settings(moto_server)
    for name, value in s3.model_dump(exclude_defaults=True).items():
        monkeypatch.setenv(f"FLOE_S3__{name.upper()}", str(value))
    root = str(tmp_path / "repo")
    runner = CliRunner()

    refused = runner.invoke(app, ["--root", root, "ingest", url, "--remote-assets", "--workers", "2"])
    assert refused.exit_code != 0 and "HTTP 403" in refused.output, refused.output

    result = runner.invoke(
        app, ["--root", root, "ingest", url, "--requester-pays", "--remote-assets", "--workers", "2"]
    )

    assert result.exit_code == 0, result.output
    assert_arrays_equal_the_files(Repository.open(root, Settings(s3=s3)), folder, item_files, url)
    reads = _bucket_requests(signature_proxy.notes(), bucket)
    # The listing and items (obstore), the COGs' HEADs (obstore) and ranges (GDAL, in the actors), each signed and
    # saying its requester pays, past the first run's refused listing.
    paid = reads[[note.paying for note in reads].index(True) :]
    assert {("GET", ".json"), ("HEAD", ".tif"), ("GET", ".tif")} <= {
        (note.method, Path(note.path).suffix) for note in paid
    }
    assert {(note.signed, note.paying) for note in paid} == {(True, True)}


@pytest.mark.usefixtures("ray_cluster")
def test_virtual_granules_of_a_requester_pays_bucket_are_copied_and_say_why(
    tmp_path, archive, moto_server, signature_proxy
):
    folder, item_files = archive
    bucket, url = upload(moto_server, folder)
    signature_proxy.requester_pays(bucket)
    settings = Settings(
        s3=signature_proxy.s3_settings(moto_server), remote=RemoteSettings(requester_pays=[f"s3://{bucket}"])
    )
    repository = Repository.create(tmp_path / "repo", settings)

    report = ingest_with_ray(
        repository, [url], workers=2, batch_size=2, virtual=True, options=SourceOptions(remote_assets=True)
    )

    # Icechunk's reads of virtual chunks cannot say their requester pays: each granule is copied, and says why.
    assert report.rejected == [] and report.virtual == 0
    assert len(report.fallbacks) == len(item_files)
    assert all("requester pays" in fallback.reason for fallback in report.fallbacks)
    assert_arrays_equal_the_files(Repository.open(tmp_path / "repo", settings), folder, item_files, url)
    reads = _bucket_requests(signature_proxy.notes(), bucket)
    assert ("GET", ".tif") in {(note.method, Path(note.path).suffix) for note in reads}
    assert {(note.signed, note.paying) for note in reads} == {(True, True)}


def test_requester_pays_prefixes_reach_gdal_and_stores_and_exclude_anonymous(moto_server, signature_proxy):
    s3 = signature_proxy.s3_settings(moto_server)
    remote = RemoteSettings(requester_pays=["s3://landsat"], anonymous=["s3://public/"])
    assert remote.requester_pays == ["s3://landsat/"]  # a bucket, not every bucket whose name starts so
    options = gdal_options(s3, remote=remote)
    assert options.for_url("s3://landsat/a.tif")["AWS_REQUEST_PAYER"] == "requester"
    assert "AWS_REQUEST_PAYER" not in options.for_url("s3://landsat-other/a.tif")
    assert "AWS_REQUEST_PAYER" not in options.for_url("s3://public/a.tif")  # unsigned: nobody to charge
    again = pickle.loads(pickle.dumps(options))
    assert again.for_url("s3://landsat/a.tif")["AWS_REQUEST_PAYER"] == "requester"
    stores = Stores.reaching(s3, remote)
    assert stores.bucket_store("landsat", "a.tif").config["request_payer"] in (True, "true")
    assert "request_payer" not in stores.bucket_store("landsat-other", "a.tif").config

    both = CliRunner().invoke(app, ["ingest", "s3://b/x.json", "--anonymous", "--requester-pays"])
    assert both.exit_code == 2 and "exclude each other" in both.output
