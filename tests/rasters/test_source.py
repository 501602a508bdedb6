"""A remote file's plan reads its header once: later files of a probed layout are described from those bytes.

Real parts: a moto S3 server on 127.0.0.1, GDAL over ``/vsis3/``, COGs and
plain GeoTIFFs written with rasterio. What is counted is how often GDAL opens
the object itself (``_source._opened``), and what is compared is each plan's
description (coordinates, attributes, shape) with GDAL's reading of the file.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import rasterio
from rasterio.enums import Resampling
from rasterio.transform import from_origin

from ingest.rasters import _source
from ingest.rasters._opening import remote_env
from ingest.rasters._tiff import HEAD_BYTES, ifds_within
from ingest.remote import Stores, gdal_options, gdal_path
from tests.pipeline._remote_archive import s3_client
from tests.rasters.test_tiff import write_tiff

COG = {"driver": "COG", "compress": "deflate", "predictor": 2}


@pytest.fixture
def fresh_plans(monkeypatch):
    """No layout probed in this process; every GDAL open of a whole file counted by file name."""
    monkeypatch.setattr(_source, "_PROBED_LAYOUTS", set())
    monkeypatch.setattr(_source, "_HEADER_LAYOUTS", set())
    monkeypatch.setattr(_source, "_PROBING", {})
    opened: list[str] = []
    real = _source._opened

    def counted(source, place, stores):
        opened.append(Path(source).name)
        return real(source, place, stores)

    monkeypatch.setattr(_source, "_opened", counted)
    return opened


def _upload(moto_server, paths: list[Path]) -> list[str]:
    bucket = moto_server.create_bucket()
    client = s3_client(moto_server)
    for path in paths:
        client.upload_file(str(path), bucket, f"cogs/{path.name}")
    return [f"s3://{bucket}/cogs/{path.name}" for path in paths]


def _plan(moto_server, url: str):
    settings = moto_server.s3_settings()
    prefix = url.rsplit("/", 2)[0] + "/"
    return _source.plan_source("data", url, (prefix,), Stores(s3=settings), gdal_options(settings))


def _assert_described_as_gdal_reads_the_file(moto_server, url: str, planned) -> None:
    settings = moto_server.s3_settings()
    with remote_env(gdal_options(settings), url), rasterio.open(gdal_path(url)) as dataset:
        expected = _source._describe(url, dataset)
    got = planned.dataset
    assert tuple(got[_source.GRANULE_VARIABLE].shape) == expected.shape
    for name, variable in expected.coords.items():
        assert got.coords[name].variable.identical(variable), name
    assert _source._same_attrs(got[_source.GRANULE_VARIABLE].attrs, expected.attrs)


def _files(tmp_path: Path, stem: str, count: int, **profile) -> list[Path]:
    """``count`` COG-like files of one layout on grids of their own (two sizes, other origins and nodata)."""
    paths = []
    for number in range(count):
        height, width = (300, 280) if number % 2 else (200, 333)
        transform = from_origin(400_000 + 1000 * number, 5_000_000 - 500 * number, 10, 10)
        path = tmp_path / f"{stem}{number}.tif"
        paths.append(write_tiff(path, height=height, width=width, transform=transform, **{**COG, **profile}))
    return paths


def test_later_remote_files_of_a_probed_layout_are_described_from_their_headers(fresh_plans, tmp_path, moto_server):
    urls = _upload(moto_server, _files(tmp_path, "cog", 4, nodata=3))
    for url in urls:
        planned = _plan(moto_server, url)
        _assert_described_as_gdal_reads_the_file(moto_server, url, planned)
    # GDAL opened the first object only (for its probe); the other three were described from their headers.
    assert fresh_plans == ["cog0.tif"]
    assert len(_source._HEADER_LAYOUTS) == 1


def test_remote_files_of_a_new_layout_planned_at_once_open_one_of_them_with_gdal(
    fresh_plans, tmp_path, moto_server, monkeypatch
):
    """An actor's first batch: four plans of a new layout at once. One opens its object with GDAL and probes;
    the others wait for it and are described from their headers. Forced: GDAL's open starts only once all four
    plans know their layout, so without the wait each would open its object."""
    urls = _upload(moto_server, _files(tmp_path, "batch", 4))
    known = threading.Semaphore(0)
    signature = _source._layout_signature

    def counted_signature(manifest):
        known.release()
        return signature(manifest)

    counted_open = _source._opened

    def open_once_all_know(source, place, stores):
        for _ in urls:
            assert known.acquire(timeout=60), "the plans did not all read their layouts"
        for _ in urls:
            known.release()
        return counted_open(source, place, stores)

    monkeypatch.setattr(_source, "_layout_signature", counted_signature)
    monkeypatch.setattr(_source, "_opened", open_once_all_know)
    with ThreadPoolExecutor(max_workers=len(urls)) as pool:
        plans = list(pool.map(lambda url: _plan(moto_server, url), urls))
    assert len(fresh_plans) == 1, fresh_plans
    for url, planned in zip(urls, plans, strict=True):
        _assert_described_as_gdal_reads_the_file(moto_server, url, planned)


def test_a_layout_whose_header_alone_reads_otherwise_is_opened_whole_every_time(
    fresh_plans, tmp_path, moto_server, monkeypatch
):
    """Forced: GDAL's reading of the first header differs from its reading of the file (an attribute more). The
    layout is still referenced, but every later file is opened by GDAL as it was before."""
    real = _source._described_from_head

    def differing(source, head):
        described = real(source, head)
        return None if described is None else _source._Described(**{**vars(described), "attrs": {"other": 1}})

    monkeypatch.setattr(_source, "_described_from_head", differing)
    urls = _upload(moto_server, _files(tmp_path, "odd", 3))
    for url in urls:
        _assert_described_as_gdal_reads_the_file(moto_server, url, _plan(moto_server, url))
    assert fresh_plans == ["odd0.tif", "odd1.tif", "odd2.tif"]
    assert not _source._HEADER_LAYOUTS


def test_a_tiff_whose_overviews_follow_its_pixels_is_opened_whole_every_time(fresh_plans, tmp_path, moto_server):
    """Overviews added to a finished GeoTIFF land after its pixels, past the header read: GDAL reads the file."""
    paths = []
    for number in range(3):
        path = write_tiff(tmp_path / f"ovr{number}.tif", height=600, width=600, compress="deflate")
        with rasterio.open(path, "r+") as dataset:
            dataset.build_overviews([2, 4], Resampling.nearest)
        assert path.stat().st_size > HEAD_BYTES
        assert not ifds_within(path.read_bytes()[:HEAD_BYTES])
        paths.append(path)
    for url in _upload(moto_server, paths):
        _assert_described_as_gdal_reads_the_file(moto_server, url, _plan(moto_server, url))
    assert fresh_plans == ["ovr0.tif", "ovr1.tif", "ovr2.tif"]


@pytest.mark.parametrize("profile", [COG, {**COG, "bigtiff": "YES"}, {"compress": "deflate", "endianness": "BIG"}])
def test_ifds_within_finds_every_ifd_of_a_small_or_cloud_optimized_header(tmp_path, profile):
    path = write_tiff(tmp_path / "whole.tif", height=900, width=900, **profile)
    head = path.read_bytes()[:HEAD_BYTES]
    assert ifds_within(head)
    assert not ifds_within(head[:16])  # cut before the end of the first IFD
    assert not ifds_within(b"not a tiff" + bytes(100))
