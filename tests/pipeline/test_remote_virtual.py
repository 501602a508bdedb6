"""Remote COGs referenced in place (`--virtual` with `--remote-assets`): Icechunk virtual chunks whose
references carry the object's ETag.

Real servers: moto S3 and tests/_http_server.py (ranges, ETags, If-Match) on
127.0.0.1; a real local Ray cluster. The archive is `make_archive`'s: its
single-band COGs (dem, landcover) are referenced, its pixel-interleaved ones
(optical) are copied and listed as fallbacks.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import icechunk
import numpy as np
import pytest
import rasterio

from ingest import Repository, Settings
from ingest.lifecycle import check_ref
from ingest.pipeline import SourceOptions, ingest_with_ray
from ingest.sample import make_archive
from ingest.stac import read_arrays_asset
from tests.pipeline._remote_archive import assert_arrays_equal_the_files, remote_repository, s3_client, upload

pytestmark = pytest.mark.usefixtures("ray_cluster")

GRANULES = 6
REMOTE = SourceOptions(remote_assets=True)


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> tuple[Path, list[Path]]:
    folder = tmp_path_factory.mktemp("remote-virtual-archive")
    return folder, make_archive(folder, granules=GRANULES, seed=5)


def _items(item_files: list[Path]) -> list[dict]:
    return [json.loads(path.read_text()) for path in item_files]


def _cog(item_file: Path, item: dict) -> Path:
    return item_file.parent / item["assets"]["data"]["href"]


def _flipped(cog: Path, out: Path) -> np.ndarray:
    """``cog`` rewritten with its rows reversed (same grid, other pixels) at ``out``; returns the new pixels."""
    with rasterio.open(cog) as source:
        profile, pixels = source.profile, source.read()
    profile.update(driver="GTiff", tiled=True)  # tiled like the source, so it can be referenced again
    with rasterio.open(out, "w", **profile) as target:
        target.write(pixels[:, ::-1, :])
    return pixels[:, ::-1, :]


def _ingest(repository: Repository, sources: list[str]):
    return ingest_with_ray(repository, sources, workers=2, batch_size=4, virtual=True, options=REMOTE)


def test_cogs_on_s3_are_referenced_read_equal_and_refused_once_overwritten(tmp_path, archive, moto_server):
    folder, item_files = archive
    items = _items(item_files)
    bucket, url = upload(moto_server, folder)
    repository = remote_repository(tmp_path / "repo", moto_server)

    report = _ingest(repository, [url])

    interleaved = {item["id"] for item in items if item["collection"] == "sample-optical"}
    assert report.rejected == []
    assert report.virtual == GRANULES - len(interleaved)
    assert {fallback.item_id for fallback in report.fallbacks} == interleaved
    assert all("interleaved" in fallback.reason for fallback in report.fallbacks)
    assert_arrays_equal_the_files(repository, folder, item_files, f"s3://{bucket}/archive/")

    # The chunks are references to the objects themselves, through the bucket's container.
    tip = repository.view()
    locations = set(tip.session.all_virtual_chunk_locations())
    referenced = {
        f"s3://{bucket}/archive/{_cog(path, item).relative_to(folder).as_posix()}"
        for path, item in zip(item_files, items, strict=True)
        if item["id"] not in interleaved
    }
    assert locations == referenced
    assert list(repository.icechunk.config.virtual_chunk_containers) == [f"s3://{bucket}/"]
    rows = {item["id"]: item for item in tip.items()}
    for item in items:
        recorded = read_arrays_asset(rows[item["id"]])
        assert recorded.virtual == (item["id"] not in interleaved)
        assert all(fingerprint.get("etag") for fingerprint in recorded.sources.values())
    # The container records where the bucket is, never the keys: they are given when the repository opens.
    stored = icechunk.Repository.fetch_config(icechunk.local_filesystem_storage(str(tmp_path / "repo" / "arrays")))
    container = repr(stored.virtual_chunk_containers[f"s3://{bucket}/"].store)
    assert moto_server.endpoint in container and "testing" not in container, container

    # Another process opening the repository with its own settings reads the referenced pixels.
    reopened = Repository.open(tmp_path / "repo", Settings(s3=moto_server.s3_settings()))
    assert_arrays_equal_the_files(reopened, folder, item_files, f"s3://{bucket}/archive/")
    assert check_ref(reopened, "main", deep=True) == []

    # Upstream, one referenced object is overwritten and another deleted.
    changed_file, changed = next((p, i) for p, i in zip(item_files, items, strict=True) if i["id"] not in interleaved)
    gone_file, gone = [(p, i) for p, i in zip(item_files, items, strict=True) if i["id"] not in interleaved][1]
    changed_key = f"archive/{_cog(changed_file, changed).relative_to(folder).as_posix()}"
    gone_key = f"archive/{_cog(gone_file, gone).relative_to(folder).as_posix()}"
    flipped = _flipped(_cog(changed_file, changed), tmp_path / "flipped.tif")
    client = s3_client(moto_server)
    client.upload_file(str(tmp_path / "flipped.tif"), bucket, changed_key)
    client.delete_object(Bucket=bucket, Key=gone_key)

    # Reading the overwritten object's chunks is refused, never answered with the new pixels.
    with pytest.raises(Exception, match=r"checksum of the object owning the virtual chunk has changed"):
        reopened.view().item_arrays(changed["collection"], changed["id"])["data"].values  # noqa: B018
    problems = [problem.what for problem in check_ref(reopened, "main", deep=True)]
    assert any(
        f"s3://{bucket}/{changed_key}" in what and "changed after it was referenced" in what for what in problems
    ), problems
    assert any(f"s3://{bucket}/{gone_key}" in what and "no such object" in what for what in problems), problems
    assert len(problems) == 2, problems

    # A re-run references the overwritten object again and rejects the deleted one by URL.
    again = _ingest(reopened, [url])
    assert again.replaced == 1 and again.virtual == 1
    assert [(rejection.item_id, f"s3://{bucket}/{gone_key}" in rejection.reason) for rejection in again.rejected] == [
        (gone["id"], True)
    ]
    stored = reopened.view().item_arrays(changed["collection"], changed["id"])
    assert np.array_equal(stored["data"].values, flipped)


def test_cogs_over_http_are_referenced_and_refused_once_rewritten(tmp_path, archive, http_server):
    folder, item_files = archive
    items = _items(item_files)
    served = http_server.folder / "virtual-archive"
    shutil.copytree(folder, served, dirs_exist_ok=True)
    urls = [f"{http_server.url}/virtual-archive/{path.relative_to(folder).as_posix()}" for path in item_files]
    repository = Repository.create(tmp_path / "repo")

    report = _ingest(repository, urls)

    interleaved = {item["id"] for item in items if item["collection"] == "sample-optical"}
    assert report.rejected == [] and report.virtual == GRANULES - len(interleaved)
    host = http_server.url.rstrip("/") + "/"
    assert list(repository.icechunk.config.virtual_chunk_containers) == [host]
    # The referenced granules' chunks are the objects at their URLs.
    referenced = {
        f"{http_server.url}/virtual-archive/{_cog(path, item).relative_to(folder).as_posix()}"
        for path, item in zip(item_files, items, strict=True)
        if item["id"] not in interleaved
    }
    assert set(repository.view().session.all_virtual_chunk_locations()) == referenced
    assert_arrays_equal_the_files(repository, folder, item_files, f"{http_server.url}/virtual-archive/")
    assert check_ref(repository, "main", deep=True) == []

    # The file behind one URL is rewritten: its ETag changes, its chunks are refused, check names it.
    changed_file, changed = next((p, i) for p, i in zip(item_files, items, strict=True) if i["id"] not in interleaved)
    target = served / _cog(changed_file, changed).relative_to(folder)
    _flipped(_cog(changed_file, changed), target)
    with pytest.raises(Exception, match=r"checksum of the object owning the virtual chunk has changed"):
        repository.view().item_arrays(changed["collection"], changed["id"])["data"].values  # noqa: B018
    problems = [problem.what for problem in check_ref(repository, "main", deep=True)]
    changed_url = f"{http_server.url}/virtual-archive/{_cog(changed_file, changed).relative_to(folder).as_posix()}"
    assert len(problems) == 1 and changed_url in problems[0] and "changed after it was referenced" in problems[0]


def test_virtual_alone_references_remote_rasters_from_the_command_line(tmp_path, archive, moto_server):
    from typer.testing import CliRunner

    from ingest.cli import app

    folder, _ = archive
    _, url = upload(moto_server, folder)
    s3 = moto_server.s3_settings()
    environment = {
        "FLOE_S3__ENDPOINT_URL": s3.endpoint_url,
        "FLOE_S3__REGION": s3.region,
        "FLOE_S3__ACCESS_KEY_ID": s3.access_key_id,
        "FLOE_S3__SECRET_ACCESS_KEY": s3.secret_access_key,
        "FLOE_S3__ALLOW_HTTP": "true",
    }
    root = tmp_path / "repo"
    done = CliRunner().invoke(app, ["--root", str(root), "ingest", url, "--virtual", "--workers", "2"], env=environment)
    assert done.exit_code == 0, done.output
    # Without --remote-assets: the rasters are referenced, not left as metadata.
    tip = Repository.open(root, Settings(s3=s3)).view()
    assert tip.session.all_virtual_chunk_locations()
    assert all(read_arrays_asset(item) is not None for item in tip.items())
    assert "referenced in place" in done.stderr
