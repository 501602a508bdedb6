"""Rasters at s3:// and http:// URLs copied into arrays by the Ray pipeline (`--remote-assets`).

Real servers: moto S3 and tests/_http_server.py on 127.0.0.1; a real local Ray
cluster. The archive is `make_archive`'s COGs, uploaded as they are written, so
the pixels read back must equal the local files bit for bit.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import rasterio
import rioxarray

from ingest import Repository, Settings
from ingest.pipeline import SourceOptions, ingest_with_ray
from ingest.sample import make_archive
from ingest.stac import read_arrays_asset
from tests.conftest import MotoServer

pytestmark = pytest.mark.usefixtures("ray_cluster")

GRANULES = 6


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> tuple[Path, list[Path]]:
    folder = tmp_path_factory.mktemp("remote-archive")
    return folder, make_archive(folder, granules=GRANULES, seed=11)


def _client(moto_server: MotoServer):
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=moto_server.endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def _upload(moto_server: MotoServer, folder: Path) -> tuple[str, str]:
    """Every file of ``folder`` under ``s3://<new bucket>/archive/``; returns the bucket and the folder URL."""
    bucket = moto_server.create_bucket()
    client = _client(moto_server)
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), bucket, f"archive/{path.relative_to(folder).as_posix()}")
    return bucket, f"s3://{bucket}/archive/"


def _repository(root: Path, moto_server: MotoServer) -> Repository:
    # A local repository whose FLOE_S3__* settings reach moto: they are how actors read s3:// rasters.
    return Repository.create(root, Settings(s3=moto_server.s3_settings()))


def _assert_arrays_equal_the_files(repository: Repository, folder: Path, item_files: list[Path], prefix: str) -> None:
    rows = {item["id"]: item for item in repository.view().items()}
    assert len(rows) == len(item_files)
    tip = repository.view()
    for item_file in item_files:
        source_item = json.loads(item_file.read_text())
        row = rows[source_item["id"]]
        assert row["assets"]["data"]["href"].startswith(prefix), row["assets"]["data"]["href"]
        assert read_arrays_asset(row) is not None
        local = rioxarray.open_rasterio(item_file.parent / source_item["assets"]["data"]["href"])
        dataset = tip.item_arrays(source_item["collection"], source_item["id"])
        assert np.array_equal(dataset["data"].values, local.values)
        assert dataset["data"].dtype == local.dtype
        assert dataset.rio.crs == local.rio.crs
        assert dataset.rio.transform().almost_equals(local.rio.transform())


def test_cogs_on_s3_are_copied_equal_and_a_changed_object_is_copied_again(tmp_path, archive, moto_server):
    folder, item_files = archive
    bucket, url = _upload(moto_server, folder)
    repository = _repository(tmp_path / "repo", moto_server)

    report = ingest_with_ray(repository, [url], workers=2, batch_size=4, options=SourceOptions(remote_assets=True))

    assert report.rejected == []
    assert report.rows_added == GRANULES
    assert report.bytes_written > 0
    _assert_arrays_equal_the_files(repository, folder, item_files, f"s3://{bucket}/archive/")
    recorded = read_arrays_asset(next(iter(repository.view().items()))).sources
    assert all("etag" in fingerprint and "size" in fingerprint for fingerprint in recorded.values())

    again = ingest_with_ray(repository, [url], workers=2, batch_size=4, options=SourceOptions(remote_assets=True))
    assert again.skipped == GRANULES and again.rows_added == 0  # one HEAD each, no pixel moved

    # One COG rewritten upstream with other pixels (same grid): only that granule is copied again.
    changed = json.loads(item_files[0].read_text())
    cog = item_files[0].parent / changed["assets"]["data"]["href"]
    with rasterio.open(cog) as source:
        profile, pixels = source.profile, source.read()
    rewritten = tmp_path / "rewritten.tif"
    with rasterio.open(rewritten, "w", **profile) as target:
        target.write(pixels[:, ::-1, :])
    key = f"archive/{cog.relative_to(folder).as_posix()}"
    _client(moto_server).upload_file(str(rewritten), bucket, key)
    third = ingest_with_ray(repository, [url], workers=2, batch_size=4, options=SourceOptions(remote_assets=True))
    assert third.rows_added == 1 and third.replaced == 1 and third.skipped == GRANULES - 1
    stored = repository.view().item_arrays(changed["collection"], changed["id"])
    assert np.array_equal(stored["data"].values, pixels[:, ::-1, :])


def test_without_remote_assets_remote_rasters_stay_metadata(tmp_path, archive, moto_server):
    folder, _item_files = archive
    _bucket, url = _upload(moto_server, folder)
    repository = _repository(tmp_path / "repo", moto_server)
    report = ingest_with_ray(repository, [url], workers=2, batch_size=4)
    assert report.rejected == [] and report.rows_added == GRANULES and report.bytes_written == 0
    assert all(read_arrays_asset(item) is None for item in repository.view().items())


def test_cogs_over_http_are_copied_equal(tmp_path, archive, http_server):
    folder, item_files = archive
    served = http_server.folder / "archive"
    shutil.copytree(folder, served, dirs_exist_ok=True)
    urls = [f"{http_server.url}/archive/{path.relative_to(folder).as_posix()}" for path in item_files]
    repository = Repository.create(tmp_path / "repo")

    report = ingest_with_ray(repository, urls, workers=2, batch_size=4, options=SourceOptions(remote_assets=True))

    assert report.rejected == []
    _assert_arrays_equal_the_files(repository, folder, item_files, f"{http_server.url}/archive/")
    # The pixels came over HTTP: the server sent bytes of every COG.
    cogs = {path.relative_to(http_server.folder).as_posix() for path in served.rglob("*.tif")}
    sent = http_server.sent()
    assert all(sent.get(name, 0) > 0 for name in cogs), sent


def test_missing_and_corrupt_remote_rasters_are_rejected_by_url(tmp_path, archive, moto_server):
    folder, item_files = archive
    bucket, url = _upload(moto_server, folder)
    client = _client(moto_server)
    gone = json.loads(item_files[1].read_text())
    gone_key = f"archive/{(item_files[1].parent / gone['assets']['data']['href']).relative_to(folder).as_posix()}"
    client.delete_object(Bucket=bucket, Key=gone_key)
    broken = json.loads(item_files[2].read_text())
    broken_cog = item_files[2].parent / broken["assets"]["data"]["href"]
    broken_key = f"archive/{broken_cog.relative_to(folder).as_posix()}"
    client.put_object(Bucket=bucket, Key=broken_key, Body=broken_cog.read_bytes()[: broken_cog.stat().st_size // 3])
    repository = _repository(tmp_path / "repo", moto_server)

    report = ingest_with_ray(repository, [url], workers=2, batch_size=4, options=SourceOptions(remote_assets=True))

    reasons = {rejection.item_id: rejection.reason for rejection in report.rejected}
    assert set(reasons) == {gone["id"], broken["id"]}
    assert f"s3://{bucket}/{gone_key}" in reasons[gone["id"]] and "no such object" in reasons[gone["id"]]
    assert f"s3://{bucket}/{broken_key}" in reasons[broken["id"]]
    assert report.rows_added == GRANULES - 2
    assert {item["id"] for item in repository.view().items()} == {
        json.loads(path.read_text())["id"] for path in item_files
    } - {gone["id"], broken["id"]}
