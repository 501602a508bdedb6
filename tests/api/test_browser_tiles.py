"""STAC Browser draws a release's pixels: the item page of ``/refs/v1/browser/`` loads map tiles of ``v1``.

A real ``floe serve`` and a real headless Chromium (the set-up of
``test_browser.py``; basemaps off, no request may leave the server). The
item's ``xyz`` link (web-map-links) points at its tiles at the tag; the
page must request them, every one must be answered 200, and the map must
differ from the same page with the tile requests refused (the tiles are
drawn, not only fetched). Screenshots go to ``test-artifacts/browser/``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import rasterio.errors
from rasterio.io import MemoryFile

from ingest import Repository, Settings
from tests.api._granules import stage_cog, write_cog
from tests.api._servers import FloeServer
from tests.api.test_browser import ARTIFACTS, NO_BASEMAPS, Page, browser, built  # noqa: F401 - fixtures

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def raster_server(tmp_path_factory: pytest.TempPathFactory, built: Path) -> Iterator[FloeServer]:  # noqa: F811
    folder = tmp_path_factory.mktemp("browser-tiles")
    repository = Repository.create(folder / "repo", Settings())
    stage_cog(repository, write_cog(folder / "utm.tif", "utm"), "utm")
    repository.tag("v1")
    served = FloeServer(folder / "repo", env=NO_BASEMAPS)
    try:
        yield served
    finally:
        served.stop()


def _map_pixels(page: Page, name: str) -> np.ndarray:
    """The map as the page shows it, ``(row, column, RGB)``, kept as a screenshot too."""
    area = page.page.locator(".map-container, .map").first
    area.wait_for(state="visible")
    page.page.wait_for_timeout(3_000)  # the tiles' images decode after their responses
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = area.screenshot(path=str(ARTIFACTS / f"{name}.png"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)  # a screenshot has no grid
        with MemoryFile(shot) as memory, memory.open() as png:
            return np.moveaxis(png.read()[:3], 0, -1).astype(np.int16)


def test_the_item_page_draws_the_tags_tiles(raster_server: FloeServer, browser: object) -> None:  # noqa: F811
    answered: list[tuple[str, int]] = []
    page = Page(browser, raster_server)
    page.page.on("response", lambda response: answered.append((response.url, response.status)))
    page.open(f"{raster_server.url}/refs/v1/browser/#/collections/tiles/items/utm")
    page.page.locator("h1", has_text="utm").wait_for(state="visible")
    page.page.wait_for_function(
        "() => performance.getEntriesByType('resource').some(entry => entry.name.includes('/tiles/'))",
        timeout=60_000,
    )
    drawn = _map_pixels(page, "item-tiles-v1")
    tiles = [(url, status) for url, status in answered if "/tiles/WebMercatorQuad/" in url]
    assert tiles, "the item page requested no tiles"
    assert all(url.startswith(f"{raster_server.url}/refs/v1/collections/tiles/items/utm/tiles/") for url, _ in tiles)
    assert all(status == 200 for _, status in tiles), [t for t in tiles if t[1] != 200]
    assert page.foreign() == [] and not page.errors, (page.foreign(), page.errors)

    refused = Page(browser, raster_server)
    refused.page.route("**/tiles/WebMercatorQuad/**", lambda route: route.abort())
    refused.open(f"{raster_server.url}/refs/v1/browser/#/collections/tiles/items/utm")
    refused.page.locator("h1", has_text="utm").wait_for(state="visible")
    bare = _map_pixels(refused, "item-without-tiles-v1")
    assert drawn.shape == bare.shape
    changed = np.abs(drawn - bare).sum(axis=2) > 30
    assert changed.mean() > 0.01, f"the map with tiles differs from the map without in {changed.mean():.2%} of pixels"
