"""Batches close by item count or, for granules whose rasters are copied, by raster bytes."""

from __future__ import annotations

from pathlib import Path

from ingest.config import Settings
from ingest.pipeline._granules import Granule
from ingest.pipeline._stream import batched
from tests.conftest import make_item


def test_batches_close_by_count_or_by_raster_bytes(tmp_path: Path) -> None:
    rasters = []
    for index, size in enumerate([400, 400, 400, 900, 100, 100]):
        path = tmp_path / f"r{index}.tif"
        path.write_bytes(b"\0" * size)
        rasters.append(str(path))
    granules = [Granule(make_item(f"g{index}"), "src", {"data": path}) for index, path in enumerate(rasters)]
    metadata_only = [Granule(make_item(f"m{index}"), "src") for index in range(7)]

    sizes = [len(batch) for batch in batched(granules, size=100, raster_bytes=1000)]
    assert sizes == [3, 2, 1]  # 1,200 bytes close the first; 900 alone does not, 900 + 100 reach 1,000
    assert [len(batch) for batch in batched(granules, size=2, raster_bytes=10_000)] == [2, 2, 2]
    assert [len(batch) for batch in batched(metadata_only, size=3, raster_bytes=1)] == [3, 3, 1]
    assert [granule.item["id"] for batch in batched(granules, 4, 1000) for granule in batch] == [
        f"g{index}" for index in range(6)
    ]


def test_default_batches_hold_thousands_of_items() -> None:
    settings = Settings()
    assert settings.batch_size >= 5000 and settings.batch_raster_mb >= 256
