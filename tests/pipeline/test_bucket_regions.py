"""A source bucket in another region than the one set for everything is read in its own region: by obstore (items,
HEADs), by GDAL (raster copies), by Icechunk (virtual references) and by ``check --deep``.

moto does not care which region a request was signed for; S3 does, and so does tests/_signature_proxy.py in
front of moto: a request signed for another region than its bucket's gets S3's 301 without a place to go. The
repository's settings say ``us-east-1`` throughout; the archive's bucket is in ``eu-west-3``.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from ingest import Repository, Settings
from ingest.config import RemoteSettings
from ingest.lifecycle import check_ref
from ingest.pipeline import SourceOptions, ingest_items, ingest_with_ray
from ingest.remote import GdalOptions, Regions, RemoteError, Stores, describe, gdal_options, head
from ingest.sample import make_archive
from tests.pipeline._remote_archive import assert_arrays_equal_the_files, upload

REGION = "eu-west-3"
GRANULES = 3


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> tuple[Path, list[Path]]:
    folder = tmp_path_factory.mktemp("regions-archive")
    return folder, make_archive(folder, granules=GRANULES, seed=31)


def _bucket_requests(
    notes: list[tuple[str, str, bool, str | None]], bucket: str
) -> list[tuple[str, str, bool, str | None]]:
    """The requests for ``bucket``'s objects and listings (not the HEADs of the bucket that ask its region)."""
    return [
        note for note in notes if note[1].startswith(f"/{bucket}/") or (note[1] == f"/{bucket}" and note[0] != "HEAD")
    ]


def _region_questions(
    notes: list[tuple[str, str, bool, str | None]], bucket: str
) -> list[tuple[str, str, bool, str | None]]:
    return [note for note in notes if note[0] == "HEAD" and note[1] == f"/{bucket}"]


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
    assert {(signed, region) for _, _, signed, region in reads} == {(True, REGION)}
    # The region was asked of S3 by unsigned HEADs of the bucket (once in each process that reads it).
    questions = _region_questions(notes, bucket)
    assert questions and not any(signed for _, _, signed, _ in questions)


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
    assert {region for _, _, _, region in reads} == {REGION}
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
    assert chunk_reads and {(signed, region) for _, _, signed, region in chunk_reads} == {(True, REGION)}
    before = len(signature_proxy.notes())
    assert check_ref(Repository.open(tmp_path / "repo", settings), "main", deep=True) == []
    heads = [note for note in signature_proxy.notes()[before:] if note[0] == "HEAD" and note[1].endswith(".tif")]
    assert len(heads) == len(referenced) and {region for _, _, _, region in heads} == {REGION}


def test_a_bucket_s_region_is_asked_once_a_process_and_a_named_one_wins(moto_server, signature_proxy):
    bucket = moto_server.create_bucket(REGION)
    s3 = signature_proxy.s3_settings(moto_server)
    assert Regions.of(s3, None).of_bucket(bucket) == REGION
    assert Regions.of(s3, RemoteSettings()).of_bucket(bucket) == REGION  # remembered: not asked again
    assert len(_region_questions(signature_proxy.notes(), bucket)) == 1
    assert Regions.of(s3, RemoteSettings(regions={bucket: "ap-south-1"})).of_bucket(bucket) == "ap-south-1"
    assert Regions.of(s3, RemoteSettings(find_regions=False)).of_bucket(moto_server.create_bucket(REGION)) is None
    # A bucket in the region set, and a server that cannot be reached, leave the region set as it is.
    assert Regions.of(s3, None).of_bucket(moto_server.create_bucket()) == "us-east-1"
    unreachable = s3.model_copy(update={"endpoint_url": "http://127.0.0.1:9"})
    assert Regions.of(unreachable, None).of_bucket(bucket) is None


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
