"""Helpers of the remote raster tests: a sample archive uploaded to moto, and arrays compared with its files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import rioxarray

from ingest import Repository, Settings
from ingest.stac import read_arrays_asset
from tests.conftest import MotoServer


def s3_client(moto_server: MotoServer):
    return moto_server.client()


def upload(moto_server: MotoServer, folder: Path, region: str = "us-east-1") -> tuple[str, str]:
    """Every file of ``folder`` under ``s3://<new bucket in region>/archive/``; returns the bucket and the folder
    URL."""
    bucket = moto_server.create_bucket(region)
    client = s3_client(moto_server)
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), bucket, f"archive/{path.relative_to(folder).as_posix()}")
    return bucket, f"s3://{bucket}/archive/"


def remote_repository(root: Path, moto_server: MotoServer) -> Repository:
    # A local repository whose FLOE_S3__* settings reach moto: they are how actors read s3:// rasters.
    return Repository.create(root, Settings(s3=moto_server.s3_settings()))


def assert_arrays_equal_the_files(repository: Repository, folder: Path, item_files: list[Path], prefix: str) -> None:
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
