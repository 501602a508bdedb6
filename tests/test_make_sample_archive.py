"""Tests for scripts/make_sample_archive.py: layout, COG validity, STAC metadata, determinism, CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pystac
import pytest
import rasterio
from rasterio.crs import CRS
from rasterio.transform import Affine
from rasterio.warp import transform as warp_transform
from shapely.geometry import Point, box, shape

from scripts.make_sample_archive import make_archive

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "make_sample_archive.py"
PROJECTION_EXT = "https://stac-extensions.github.io/projection/v2.0.0/schema.json"
COG_TYPE = "image/tiff; application=geotiff; profile=cloud-optimized"


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    out = tmp_path_factory.mktemp("archive")
    return out, make_archive(out, granules=12, seed=0)


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def parse_datetime(value: str) -> datetime:
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", value), value
    return datetime.fromisoformat(value)


def asset_path(item_path: Path, item: dict[str, Any]) -> Path:
    return (item_path.parent / item["assets"]["data"]["href"]).resolve()


def read_pixels(root: Path) -> dict[str, np.ndarray]:
    """Every granule's pixels, keyed by the path relative to the archive root."""
    pixels = {}
    for tif in sorted(root.rglob("*.tif")):
        with rasterio.open(tif) as src:
            pixels[str(tif.relative_to(root))] = src.read()
    return pixels


def test_layout_collections_crs_and_months(archive: tuple[Path, list[Path]]) -> None:
    out, paths = archive
    assert len(paths) == 12
    assert paths == sorted(paths)
    assert sorted(out.rglob("*/*/*.json")) == paths
    assert len(list(out.rglob("*.tif"))) == 12

    items = [load(path) for path in paths]
    collections = {item["collection"] for item in items}
    assert collections == {"sample-optical", "sample-dem", "sample-landcover"}
    # Round-robin: 4 granules each.
    assert all(sum(item["collection"] == c for item in items) == 4 for c in collections)
    assert len({item["properties"]["proj:code"] for item in items}) >= 2
    assert len({parse_datetime(item["properties"]["datetime"]).strftime("%Y-%m") for item in items}) >= 3

    for path, item in zip(paths, items, strict=True):
        assert re.fullmatch(r"[a-z0-9-]+-\d{4}", item["id"])
        assert path == out / item["collection"] / item["id"] / f"{item['id']}.json"
        assert item["type"] == "Feature"
        assert item["stac_version"] == "1.0.0"
        assert PROJECTION_EXT in item["stac_extensions"]
        props = item["properties"]
        assert props["proj:code"] == f"EPSG:{props['proj:epsg']}"
        assert len(props["proj:transform"]) in (6, 9)
        assert props["platform"]
        asset = item["assets"]["data"]
        assert asset["href"] == f"./{item['id']}.tif"
        assert asset["type"] == COG_TYPE
        assert asset["roles"] == ["data"]
        collection_links = [link for link in item["links"] if link["rel"] == "collection"]
        assert [link["href"] for link in collection_links] == ["../collection.json"]
        if item["collection"] == "sample-optical":
            assert 0 <= props["eo:cloud_cover"] <= 100
            assert any("/eo/" in ext for ext in item["stac_extensions"])


def test_assets_are_cogs_matching_projection_fields(archive: tuple[Path, list[Path]]) -> None:
    _, paths = archive
    for path in paths:
        item = load(path)
        props = item["properties"]
        tif = asset_path(path, item)
        assert tif.is_file()
        with rasterio.open(tif) as src:
            assert src.driver == "GTiff"
            # GDAL reports the COG layout (ghost header, IFDs first, tiles in order) here.
            assert src.tags(ns="IMAGE_STRUCTURE").get("LAYOUT") == "COG"
            assert src.compression is not None and src.compression.value == "DEFLATE"
            # Internally tiled 128x128. (rasterio's profile["tiled"] is only "block width != image width",
            # so it is False for the 128-px-wide DEM although that file is tiled too.)
            assert set(src.block_shapes) == {(128, 128)}
            assert src.crs == CRS.from_user_input(props["proj:code"])
            assert [src.height, src.width] == props["proj:shape"]
            assert src.transform == Affine(*props["proj:transform"][:6])
            data = src.read()
            for band in data:
                assert np.unique(band).size > 1, "pixels must not be constant"
            if item["collection"] == "sample-optical":
                assert src.count == 3
                assert src.dtypes == ("uint16",) * 3
                assert src.overviews(1), "a 256x256 COG with 128 px tiles gets an overview level"
            elif item["collection"] == "sample-dem":
                assert src.dtypes == ("float32",)
                assert src.height != src.width
                assert src.nodata == -9999
                assert 0 < int((data == -9999).sum()) < data.size // 100
            else:
                assert src.dtypes == ("uint8",)
                assert src.overviews(1)


def test_geometry_and_bbox_contain_raster_centre(archive: tuple[Path, list[Path]]) -> None:
    _, paths = archive
    for path in paths:
        item = load(path)
        geometry = item["geometry"]
        assert geometry["type"] == "Polygon"
        ring = geometry["coordinates"][0]
        assert ring[0] == ring[-1] and len(ring) >= 5
        polygon = shape(geometry)
        assert polygon.is_valid
        assert polygon.exterior.is_ccw
        assert polygon.bounds == pytest.approx(tuple(item["bbox"]))
        west, south, east, north = item["bbox"]
        assert -180 <= west < east <= 180 and -90 <= south < north <= 90

        with rasterio.open(asset_path(path, item)) as src:
            cx, cy = src.transform @ (src.width / 2, src.height / 2)
            (lon,), (lat,) = warp_transform(src.crs, "EPSG:4326", [cx], [cy])
        centre = Point(lon, lat)
        assert polygon.contains(centre)
        assert box(*item["bbox"]).contains(centre)


def test_same_seed_is_byte_identical_and_other_seed_differs(tmp_path: Path) -> None:
    first = make_archive(tmp_path / "a", granules=4, seed=7)
    second = make_archive(tmp_path / "b", granules=4, seed=7)
    other = make_archive(tmp_path / "c", granules=4, seed=8)

    rel = [path.relative_to(tmp_path / "a") for path in first]
    assert rel == [path.relative_to(tmp_path / "b") for path in second]
    assert rel == [path.relative_to(tmp_path / "c") for path in other]
    for a, b in zip(first, second, strict=True):
        assert a.read_text() == b.read_text()
    for name in ["catalog.json", *(f"{c}/collection.json" for c in ("sample-optical", "sample-dem"))]:
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()

    pixels_a, pixels_b, pixels_c = (read_pixels(tmp_path / name) for name in "abc")
    assert pixels_a.keys() == pixels_b.keys() == pixels_c.keys()
    assert len(pixels_a) == 4
    for key, values in pixels_a.items():
        assert values.dtype == pixels_b[key].dtype
        assert np.array_equal(values, pixels_b[key])
        assert not np.array_equal(values, pixels_c[key]), key


def test_rejects_no_granules(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="granules"):
        make_archive(tmp_path, granules=0)
    with pytest.raises(ValueError, match="places"):
        make_archive(tmp_path, granules=3, places=0)


def grids_and_dates(paths: list[Path]) -> dict[tuple[str, tuple[float, ...]], list[str]]:
    """The datetimes of each collection's granules, by the grid (collection, transform) each lies on."""
    grids: dict[tuple[str, tuple[float, ...]], list[str]] = {}
    for path in paths:
        item = load(path)
        grid = (item["collection"], tuple(item["properties"]["proj:transform"]))
        grids.setdefault(grid, []).append(item["properties"]["datetime"])
    return grids


def test_places_make_repeat_acquisitions_of_a_few_grids(tmp_path: Path) -> None:
    # 24 granules, 8 a collection, over 3 positions: grids of 3, 3 and 2 acquisitions, each on other dates.
    revisited = grids_and_dates(make_archive(tmp_path / "revisits", granules=24, seed=0, places=3))
    assert sorted(len(dates) for dates in revisited.values()) == [2, 2, 2, 3, 3, 3, 3, 3, 3]
    assert all(len(set(dates)) == len(dates) for dates in revisited.values())
    # The first acquisition of each grid lies where the archive without revisits puts its first granules.
    own = grids_and_dates(make_archive(tmp_path / "own", granules=24, seed=0))
    assert len(own) == 24 and set(revisited) <= set(own)


def test_cli_writes_archive_and_has_help(tmp_path: Path) -> None:
    out = tmp_path / "cli-out"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), "--granules", "4"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert "4 granules" in run.stderr
    assert len(list(out.rglob("*/*/*.json"))) == 4
    assert len(list(out.rglob("*.tif"))) == 4
    assert (out / "catalog.json").is_file()

    help_run = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert help_run.returncode == 0
    assert "--granules" in help_run.stdout and "--seed" in help_run.stdout and "OUT_DIR" in help_run.stdout


def test_collections_and_catalog(archive: tuple[Path, list[Path]]) -> None:
    out, paths = archive
    catalog = load(out / "catalog.json")
    assert catalog["type"] == "Catalog"
    children = {(out / link["href"]).resolve() for link in catalog["links"] if link["rel"] == "child"}
    assert children == {
        (out / c / "collection.json").resolve() for c in ("sample-optical", "sample-dem", "sample-landcover")
    }

    for path in paths:
        item = load(path)
        collection_path = (path.parent / "../collection.json").resolve()
        assert collection_path in children
        collection = load(collection_path)
        assert collection["type"] == "Collection"
        assert collection["id"] == item["collection"]
        assert collection["license"] == "CC-BY-4.0"
        assert collection["description"]
        [[start, end]] = collection["extent"]["temporal"]["interval"]
        assert parse_datetime(start) <= parse_datetime(item["properties"]["datetime"]) <= parse_datetime(end)
        [spatial] = collection["extent"]["spatial"]["bbox"]
        assert box(*spatial).covers(box(*item["bbox"]))
        item_links = {
            (collection_path.parent / link["href"]).resolve() for link in collection["links"] if link["rel"] == "item"
        }
        assert path.resolve() in item_links

    # pystac can walk the whole tree through the relative links.
    stac_catalog = pystac.Catalog.from_file(str(out / "catalog.json"))
    walked = list(stac_catalog.get_items(recursive=True))
    assert sorted(item.id for item in walked) == sorted(path.stem for path in paths)
    for stac_item in walked:
        assert Path(stac_item.assets["data"].get_absolute_href()).is_file()
