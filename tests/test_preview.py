"""``floe preview``: a quick-look PNG of an item's arrays at any ref, read from the repository (issue 51, item 4).

Real rasters are staged and committed; the PNG is read back with rasterio: three bands make RGB in the order
asked, each stretched between its 2nd and 98th percentile; nodata is transparent; a tag shows its pixels after
main replaced them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rasterio

from ingest import Repository, Settings
from ingest.config import ArraysSettings
from ingest.pipeline import stage_arrays
from ingest.stac import arrays_asset, with_arrays_asset
from tests._cli import floe_here
from tests.conftest import make_item, raster_dataset

HEIGHT, WIDTH = 40, 60
pytestmark = pytest.mark.filterwarnings("ignore::rasterio.errors.NotGeoreferencedWarning")  # reading the PNGs back


def _stage(writer, item: dict, pixels: np.ndarray, *, nodata: int | None = None) -> dict:
    writer.ensure_collection(item["collection"])
    dataset = raster_dataset(pixels)
    if nodata is not None:
        dataset["data"].attrs["_FillValue"] = nodata
    placed, _ = stage_arrays(writer, item, {"data": dataset})
    return with_arrays_asset(item, arrays_asset(placed))


def _ramp(offset: int, *, reverse: bool = False) -> np.ndarray:
    """Three bands: a left-to-right ramp (right to left with ``reverse``), a top-to-bottom ramp, a constant; the
    top-left 10 x 10 is nodata (0)."""
    x = np.tile(np.arange(WIDTH, dtype=np.uint16) * 10 + offset, (HEIGHT, 1))
    x = x[:, ::-1] if reverse else x
    y = np.tile((np.arange(HEIGHT, dtype=np.uint16) * 10 + offset)[:, np.newaxis], (1, WIDTH))
    pixels = np.stack([x, y, np.full((HEIGHT, WIDTH), 500, dtype=np.uint16)])
    pixels[:, :10, :10] = 0
    return pixels


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """Item ``scene`` with three bands (tag ``v1``), then replaced on main by pixels with other values."""
    root = tmp_path / "repo"
    repository = Repository.create(root, Settings(arrays=ArraysSettings(tile=64, chunk=16)))
    writer = repository.writer()
    writer.add_item(_stage(writer, make_item("scene"), _ramp(100), nodata=0))
    writer.commit("scene")
    repository.tag("v1")
    writer = repository.writer()
    writer.add_item(_stage(writer, make_item("scene"), _ramp(100, reverse=True), nodata=0), replace=True)
    writer.commit("scene, reprocessed")
    return root


def _said(output: str) -> str:
    """What the command said, its lines joined (rich wraps them where ``COLUMNS`` is set, as pytest's workers do)."""
    return output.replace("\n", "")


def _png(path: Path) -> np.ndarray:
    with rasterio.open(path) as png:
        assert png.driver == "PNG"
        return png.read()


def test_an_rgb_preview_stretches_each_band_and_leaves_nodata_transparent(repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "scene.png"
    result = floe_here(str(repo), "preview", "scene", "--ref", "v1", "--out", str(out))
    assert result.exit_code == 0, result.output
    pixels = _png(out)
    assert pixels.shape == (4, HEIGHT, WIDTH)  # red, green, blue, alpha
    red, green, blue, alpha = pixels
    assert (alpha[:10, :10] == 0).all() and (alpha[10:, :] == 255).all() and (alpha[:, 10:] == 255).all()
    assert (red[:10, :10] == 0).all()
    # The ramps rise along their axis and span the stretch: 1 at or below the 2nd percentile, 255 at or above the
    # 98th; a constant band sits at the bottom.
    assert red[20, 0] == 1 and red[20, -1] == 255 and (np.diff(red[20].astype(int)) >= 0).all()
    assert green[0, 30] == 1 and green[-1, 30] == 255 and (np.diff(green[:, 30].astype(int)) >= 0).all()
    assert set(np.unique(blue[alpha == 255])) == {1}
    assert not Path(f"{out}.aux.xml").exists()
    assert "scene.png (60 x 40; data:1, data:2, data:3)" in _said(result.output)


def test_a_tag_shows_its_pixels_after_main_replaced_them(repo: Path, tmp_path: Path) -> None:
    floe_here(str(repo), "preview", "scene", "--ref", "v1", "--out", str(tmp_path / "v1.png"))
    floe_here(str(repo), "preview", "scene", "--out", str(tmp_path / "main.png"))
    tagged, latest = _png(tmp_path / "v1.png"), _png(tmp_path / "main.png")
    assert tagged[0, 20, -1] == 255 and latest[0, 20, -1] == 1  # main's ramp runs the other way
    np.testing.assert_array_equal(tagged[1], latest[1])  # the vertical ramp did not change


def test_one_band_is_grey_and_size_bounds_the_long_side(repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "small.png"
    result = floe_here(str(repo), "preview", "scene", "--out", str(out), "--size", "15")
    assert result.exit_code == 0, result.output
    assert _png(out).shape[1:] == (10, 15)  # every 4th pixel of 40 x 60
    # One asset of one band shows grey (with its alpha): a single-band item.
    repository = Repository.open(repo, Settings())
    writer = repository.writer()
    writer.add_item(_stage(writer, make_item("dem"), np.arange(400, dtype=np.float32).reshape(20, 20)))
    writer.commit("dem")
    grey = tmp_path / "dem.png"
    assert floe_here(str(repo), "preview", "dem", "--out", str(grey)).exit_code == 0
    pixels = _png(grey)
    assert pixels.shape == (2, 20, 20) and pixels[0, 0, 0] == 1 and pixels[0, -1, -1] == 255


def test_what_cannot_be_previewed_is_named(repo: Path, tmp_path: Path) -> None:
    missing = floe_here(str(repo), "preview", "nope", "--out", str(tmp_path / "x.png"))
    assert missing.exit_code == 1 and "no item 'nope'" in _said(missing.output)
    repository = Repository.open(repo, Settings())
    writer = repository.writer()
    writer.add_item(make_item("plain"))
    writer.commit("an item without arrays")
    plain = floe_here(str(repo), "preview", "plain", "--out", str(tmp_path / "x.png"))
    assert plain.exit_code == 1 and "has no arrays" in _said(plain.output)
    asset = floe_here(str(repo), "preview", "scene", "--assets", "thermal", "--out", str(tmp_path / "x.png"))
    assert asset.exit_code == 2 and "no arrays for asset(s) ['thermal']" in _said(asset.output)
    assert not (tmp_path / "x.png").exists()
