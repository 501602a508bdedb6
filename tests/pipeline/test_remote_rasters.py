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

from ingest import Repository
from ingest.pipeline import SourceOptions, ingest_with_ray
from ingest.sample import make_archive
from ingest.stac import read_arrays_asset
from tests.pipeline._remote_archive import assert_arrays_equal_the_files, remote_repository, s3_client, upload

pytestmark = pytest.mark.usefixtures("ray_cluster")

GRANULES = 6


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> tuple[Path, list[Path]]:
    folder = tmp_path_factory.mktemp("remote-archive")
    return folder, make_archive(folder, granules=GRANULES, seed=11)


def test_cogs_on_s3_are_copied_equal_and_a_changed_object_is_copied_again(tmp_path, archive, moto_server):
    folder, item_files = archive
    bucket, url = upload(moto_server, folder)
    repository = remote_repository(tmp_path / "repo", moto_server)

    report = ingest_with_ray(repository, [url], workers=2, batch_size=4, options=SourceOptions(remote_assets=True))

    assert report.rejected == []
    assert report.rows_added == GRANULES
    assert report.bytes_written > 0
    assert_arrays_equal_the_files(repository, folder, item_files, f"s3://{bucket}/archive/")
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
    s3_client(moto_server).upload_file(str(rewritten), bucket, key)
    third = ingest_with_ray(repository, [url], workers=2, batch_size=4, options=SourceOptions(remote_assets=True))
    assert third.rows_added == 1 and third.replaced == 1 and third.skipped == GRANULES - 1
    stored = repository.view().item_arrays(changed["collection"], changed["id"])
    assert np.array_equal(stored["data"].values, pixels[:, ::-1, :])


def test_without_remote_assets_remote_rasters_stay_metadata(tmp_path, archive, moto_server):
    folder, _item_files = archive
    _bucket, url = upload(moto_server, folder)
    repository = remote_repository(tmp_path / "repo", moto_server)
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
    assert_arrays_equal_the_files(repository, folder, item_files, f"{http_server.url}/archive/")
    # The pixels came over HTTP: the server sent bytes of every COG.
    cogs = {path.relative_to(http_server.folder).as_posix() for path in served.rglob("*.tif")}
    sent = http_server.sent()
    assert all(sent.get(name, 0) > 0 for name in cogs), sent


def test_missing_and_corrupt_remote_rasters_are_rejected_by_url(tmp_path, archive, moto_server):
    folder, item_files = archive
    bucket, url = upload(moto_server, folder)
    client = s3_client(moto_server)
    gone = json.loads(item_files[1].read_text())
    gone_key = f"archive/{(item_files[1].parent / gone['assets']['data']['href']).relative_to(folder).as_posix()}"
    client.delete_object(Bucket=bucket, Key=gone_key)
    broken = json.loads(item_files[2].read_text())
    broken_cog = item_files[2].parent / broken["assets"]["data"]["href"]
    broken_key = f"archive/{broken_cog.relative_to(folder).as_posix()}"
    client.put_object(Bucket=bucket, Key=broken_key, Body=broken_cog.read_bytes()[: broken_cog.stat().st_size // 3])
    repository = remote_repository(tmp_path / "repo", moto_server)

    report = ingest_with_ray(repository, [url], workers=2, batch_size=4, options=SourceOptions(remote_assets=True))

    reasons = {rejection.item_id: rejection.reason for rejection in report.rejected}
    assert set(reasons) == {gone["id"], broken["id"]}
    assert f"s3://{bucket}/{gone_key}" in reasons[gone["id"]] and "no such object" in reasons[gone["id"]]
    assert f"s3://{bucket}/{broken_key}" in reasons[broken["id"]]
    assert report.rows_added == GRANULES - 2
    assert {item["id"] for item in repository.view().items()} == {
        json.loads(path.read_text())["id"] for path in item_files
    } - {gone["id"], broken["id"]}
