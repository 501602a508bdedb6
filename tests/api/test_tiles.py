"""Map tiles of an item's arrays at any ref (``ingest/api/_tiles.py``), through a real ``floe serve``.

Three granules, one per CRS (UTM, geographic, polar stereographic), are
written as COGs and copied into floe as an ingest copies them. A tile at a
granule's centre, at a zoom where the granule covers several tiles, must
hold what rio-tiler reads from the source COG for the same tile (same
pixels, same mask, within nearest-neighbour resampling's edge differences),
at a tag and at a snapshot. After the item is replaced on main, the tag's
tile is unchanged and main's shows the new pixels. A matching
``If-None-Match`` is answered 304; a tile outside the data is an empty one
(a map asks for every tile in view) and a bad request is 400 naming what is wrong.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import httpx
import morecantile
import numpy as np
import pytest
import rasterio
import rasterio.errors
from rasterio.io import MemoryFile
from rio_tiler.io import Reader

from ingest import Repository, Settings
from tests.api._granules import GRANULES, SIZE, stage_cog, write_cog
from tests.api._servers import FloeServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("tiles")
    repo = Repository.create(folder / "repo", Settings())
    cogs = {name: write_cog(folder / f"{name}.tif", name) for name in GRANULES}
    for name, cog in cogs.items():
        stage_cog(repo, cog, name)
    repo.tag("v1")
    snapshot = repo.resolve("v1")
    server = FloeServer(folder / "repo")
    try:
        yield server, repo, cogs, snapshot, folder
    finally:
        server.stop()


def _centre_tile(cog: Path, zoom: int) -> morecantile.Tile:
    with rasterio.open(cog) as source:
        from rasterio.warp import transform_bounds

        west, south, east, north = transform_bounds(source.crs, "EPSG:4326", *source.bounds)
    return morecantile.tms.get("WebMercatorQuad").tile((west + east) / 2, (south + north) / 2, zoom)


def _decoded(content: bytes) -> tuple[np.ndarray, np.ndarray]:
    with MemoryFile(content) as memory, memory.open() as tile:
        return tile.read(1), tile.read_masks(1) > 0


def _agree(ours: tuple[np.ndarray, np.ndarray], theirs: tuple[np.ndarray, np.ndarray]) -> None:
    (data, mask), (expected, expected_mask) = ours, theirs
    assert expected_mask.any(), "the reference tile is empty: the test picked a tile outside the granule"
    assert (mask == expected_mask).mean() > 0.98, "the masks differ beyond resampling's edge pixels"
    both = mask & expected_mask
    assert (data[both] == expected[both]).mean() > 0.98, "the pixels differ beyond resampling's edge pixels"


@pytest.mark.parametrize("name", sorted(GRANULES))
def test_a_tile_at_a_tag_and_a_snapshot_equals_rio_tiler_reading_the_cog(served, name: str) -> None:
    server, _repo, cogs, snapshot, _folder = served
    zoom = GRANULES[name][3]
    tile = _centre_tile(cogs[name], zoom)
    with Reader(str(cogs[name])) as reader:
        reference = reader.tile(tile.x, tile.y, tile.z)
    expected = (reference.data[0], ~reference.array.mask[0])
    for ref in ("v1", snapshot):
        item = f"{server.url}/refs/{ref}/collections/tiles/items/{name}"
        response = httpx.get(f"{item}/tiles/WebMercatorQuad/{tile.z}/{tile.x}/{tile.y}.tif", timeout=60)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("image/tiff")
        assert "immutable" in response.headers["cache-control"]
        _agree(_decoded(response.content), expected)


def test_a_png_tile_decodes_and_a_matching_etag_is_304(served) -> None:
    server, *_ = served
    tile = _centre_tile(served[2]["utm"], 15)
    url = f"{server.url}/refs/v1/collections/tiles/items/utm/tiles/WebMercatorQuad/{tile.z}/{tile.x}/{tile.y}.png"
    first = httpx.get(url, params={"rescale": "0,8000", "colormap_name": "viridis"}, timeout=60)
    assert first.status_code == 200 and first.headers["content-type"] == "image/png"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)  # a PNG carries no grid
        with MemoryFile(first.content) as memory, memory.open() as png:
            assert png.count == 4 and png.read(4).any(), "a colormapped PNG is RGBA with some opaque pixels"
    again = httpx.get(
        url, params={"rescale": "0,8000", "colormap_name": "viridis"}, headers={"If-None-Match": first.headers["etag"]}
    )
    assert again.status_code == 304 and not again.content
    other = httpx.get(url, params={"rescale": "0,9000"}, headers={"If-None-Match": first.headers["etag"]})
    assert other.status_code == 200, "another rendering of the tile is another representation"


def test_the_tag_keeps_its_tile_when_main_replaces_the_item(served) -> None:
    server, repo, cogs, _snapshot, folder = served
    tile = _centre_tile(cogs["geographic"], 15)
    path = f"collections/tiles/items/geographic/tiles/WebMercatorQuad/{tile.z}/{tile.x}/{tile.y}.tif"
    before = httpx.get(f"{server.url}/refs/v1/{path}", timeout=60)
    main_before = httpx.get(f"{server.url}/{path}", timeout=60)
    assert main_before.headers["cache-control"] == "no-cache", "a branch's tile moves with it"
    newer = write_cog(folder / "geographic-v2.tif", "geographic", version=1)
    stage_cog(repo, newer, "geographic", replace=True)

    with Reader(str(newer)) as reader:
        reference = reader.tile(tile.x, tile.y, tile.z)
    main_after = httpx.get(f"{server.url}/{path}", timeout=60)
    assert main_after.status_code == 200
    assert main_after.headers["etag"] != main_before.headers["etag"]
    _agree(_decoded(main_after.content), (reference.data[0], ~reference.array.mask[0]))
    after = httpx.get(f"{server.url}/refs/v1/{path}", timeout=60)
    assert after.content == before.content and after.headers["etag"] == before.headers["etag"]


def test_items_with_arrays_carry_a_web_map_link_and_a_tilejson(served) -> None:
    from rasterio.warp import transform_bounds

    server, _repo, cogs, *_ = served
    item = httpx.get(f"{server.url}/refs/v1/collections/tiles/items/utm", timeout=30).json()
    (link,) = [link for link in item["links"] if link["rel"] == "xyz"]
    assert link["href"].startswith(f"{server.url}/refs/v1/collections/tiles/items/utm/tiles/WebMercatorQuad/{{z}}/")
    statistics = item["assets"]["B04"]["raster:bands"][0]["statistics"]
    assert link["href"].endswith(f"?assets=B04&rescale={statistics['minimum']},{statistics['maximum']}")
    assert any("web-map-links" in extension for extension in item["stac_extensions"])
    tilejson = httpx.get(
        f"{server.url}/refs/v1/collections/tiles/items/utm/WebMercatorQuad/tilejson.json", params={"rescale": "0,8000"}
    ).json()
    assert tilejson["tiles"] == [
        f"{server.url}/refs/v1/collections/tiles/items/utm/tiles/WebMercatorQuad/{{z}}/{{x}}/{{y}}.png?rescale=0%2C8000"
    ]
    with rasterio.open(cogs["utm"]) as source:
        expected = transform_bounds(source.crs, "EPSG:4326", *source.bounds)
    np.testing.assert_allclose(tilejson["bounds"], expected, atol=1e-3)
    with Reader(str(cogs["utm"])) as reader:
        assert (tilejson["minzoom"], tilejson["maxzoom"]) == (reader.minzoom, reader.maxzoom)


def test_outside_the_data_is_an_empty_tile_and_bad_requests_are_400_naming_what(served) -> None:
    server, _repo, cogs, *_ = served
    tile = _centre_tile(cogs["utm"], 15)
    base = f"{server.url}/refs/v1/collections/tiles/items/utm/tiles/WebMercatorQuad"
    far = httpx.get(f"{base}/15/0/0.png")
    assert far.status_code == 200 and far.headers["content-type"] == "image/png"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)
        with MemoryFile(far.content) as memory, memory.open() as png:
            assert png.shape == (256, 256) and not png.read(png.count).any(), "outside the data: a transparent tile"
    cases = {
        f"{base}/15/{tile.x}/{tile.y}.bmp": "format",
        f"{base}/99/0/0.png": "99/0/0",
        f"{base}/3/9/0.png": "3/9/0",
        f"{server.url}/refs/v1/collections/tiles/items/utm/tiles/NoSuchGrid/15/0/0.png": "NoSuchGrid",
        f"{base}/15/{tile.x}/{tile.y}.png?expression=B04+%2B+nope": "expression",
        f"{base}/15/{tile.x}/{tile.y}.png?assets=B99": "B99",
        f"{base}/15/{tile.x}/{tile.y}.png?rescale=low": "rescale",
        f"{base}/15/{tile.x}/{tile.y}.png?colormap_name=nope": "colormap_name",
        f"{base}/15/{tile.x}/{tile.y}.png?bidx=2": "bidx",
    }
    for url, named in cases.items():
        response = httpx.get(url, timeout=30)
        assert response.status_code == 400, (url, response.status_code, response.text)
        assert named in response.json()["description"], (url, response.text)
    expression = httpx.get(f"{base}/15/{tile.x}/{tile.y}.tif?expression=B04*2", timeout=60)
    plain = httpx.get(f"{base}/15/{tile.x}/{tile.y}.tif", timeout=60)
    data, mask = _decoded(expression.content)
    plain_data, _ = _decoded(plain.content)
    assert np.allclose(data[mask], plain_data[mask].astype("float64") * 2)


def test_a_search_mosaic_puts_the_newest_item_on_top(served) -> None:
    """A newer granule over the west half of the UTM one: main's mosaic takes its pixels there and the older
    granule's elsewhere, as rio-tiler's mosaic of the two COGs (newest first) does; the tag, made before, shows
    the older one alone."""
    from rio_tiler.mosaic import mosaic_reader
    from rio_tiler.mosaic.methods import FirstMethod

    server, repo, cogs, _snapshot, folder = served
    newer = write_cog(folder / "utm-newer.tif", "utm", version=1, width=SIZE // 2)
    stage_cog(repo, newer, "utm-newer", when="2024-04-01T10:00:00Z")
    tile = _centre_tile(cogs["utm"], 15)

    def reading(path: str, x: int, y: int, z: int) -> Any:
        with Reader(path) as reader:
            return reader.tile(x, y, z)

    reference, _ = mosaic_reader(
        [str(newer), str(cogs["utm"])], reading, tile.x, tile.y, tile.z, pixel_selection=FirstMethod()
    )
    path = f"search/tiles/WebMercatorQuad/{tile.z}/{tile.x}/{tile.y}.tif"
    params = {"collections": "tiles", "assets": "B04"}
    mosaic = httpx.get(f"{server.url}/{path}", params=params, timeout=60)
    assert mosaic.status_code == 200, mosaic.text
    data, mask = _decoded(mosaic.content)
    _agree((data, mask), (reference.data[0], ~reference.array.mask[0]))
    newer_only = reading(str(newer), tile.x, tile.y, tile.z)
    assert (data[~newer_only.array.mask[0]] != 0).all() and newer_only.array.mask[0].any()

    with Reader(str(cogs["utm"])) as reader:
        older = reader.tile(tile.x, tile.y, tile.z)
    at_tag = httpx.get(f"{server.url}/refs/v1/{path}", params=params, timeout=60)
    _agree(_decoded(at_tag.content), (older.data[0], ~older.array.mask[0]))
    assert "immutable" in at_tag.headers["cache-control"]
    nothing = httpx.get(f"{server.url}/{path}", params={**params, "datetime": "2000-01-01T00:00:00Z"}, timeout=60)
    assert nothing.status_code == 200 and not _decoded(nothing.content)[1].any(), "no item there: an empty tile"
    unknown = httpx.get(f"{server.url}/{path}", params={**params, "collections": "none-such"}, timeout=60)
    assert unknown.status_code == 404 and "none-such" in unknown.json()["description"]
    unnamed = httpx.get(f"{server.url}/{path}", params={"collections": "tiles"}, timeout=60)
    assert unnamed.status_code == 400 and "assets" in unnamed.json()["description"]


def test_a_registered_search_draws_what_the_encoded_one_does_at_any_ref(served) -> None:
    """``POST /searches/register`` answers an id; the id's tiles are the encoded search's, at each ref; the id
    reads back as the search, its TileJSON points at its tiles, and a bad body or id is refused naming why."""
    server, _repo, cogs, _snapshot, _folder = served
    tile = _centre_tile(cogs["utm"], 15)
    body = {"collections": ["tiles"], "datetime": "2024-01-01T00:00:00Z/2024-12-31T00:00:00Z"}
    registered = httpx.post(f"{server.url}/searches/register", json=body, timeout=60)
    assert registered.status_code == 200, registered.text
    search_id = registered.json()["id"]
    assert httpx.get(f"{server.url}/refs/v1/searches/{search_id}", timeout=60).json()["search"] == body
    params = {"assets": "B04"}
    for ref in ("", "/refs/v1"):
        by_id = httpx.get(
            f"{server.url}{ref}/searches/{search_id}/tiles/WebMercatorQuad/{tile.z}/{tile.x}/{tile.y}.tif",
            params=params,
            timeout=60,
        )
        encoded = httpx.get(
            f"{server.url}{ref}/search/tiles/WebMercatorQuad/{tile.z}/{tile.x}/{tile.y}.tif",
            params={**params, "collections": "tiles", "datetime": body["datetime"]},
            timeout=60,
        )
        assert by_id.status_code == 200 and by_id.content == encoded.content
    with Reader(str(cogs["utm"])) as reader:  # the tag holds the UTM granule alone there
        older = reader.tile(tile.x, tile.y, tile.z)
    _agree(_decoded(by_id.content), (older.data[0], ~older.array.mask[0]))

    tilejson = httpx.get(f"{server.url}/refs/v1/searches/{search_id}/WebMercatorQuad/tilejson.json", timeout=60)
    assert tilejson.json()["tiles"] == [
        f"{server.url}/refs/v1/searches/{search_id}/tiles/WebMercatorQuad/{{z}}/{{x}}/{{y}}.png"
    ]
    # A search's own bbox bounds its mosaic: a tile outside it is empty.
    west = {**body, "bbox": [0.0, 0.0, 1.0, 1.0]}
    outside_id = httpx.post(f"{server.url}/searches/register", json=west, timeout=60).json()["id"]
    outside = httpx.get(
        f"{server.url}/searches/{outside_id}/tiles/WebMercatorQuad/{tile.z}/{tile.x}/{tile.y}.tif",
        params=params,
        timeout=60,
    )
    assert outside.status_code == 200 and not _decoded(outside.content)[1].any()

    refused = {
        "unknown collection": ({"collections": ["none-such"]}, 404, "none-such"),
        "bad filter": ({"filter": "eo:cloud_cover <<< 3"}, 400, "filter"),
        "unknown field": ({"sortby": "datetime"}, 400, "sortby"),
        "bad bbox": ({"bbox": [1, 2, 3]}, 400, "bbox"),
    }
    for name, (bad, status, named) in refused.items():
        answer = httpx.post(f"{server.url}/searches/register", json=bad, timeout=60)
        assert answer.status_code == status and named in answer.json()["description"], (name, answer.text)
    unknown = httpx.get(f"{server.url}/searches/not-a-search/tiles/WebMercatorQuad/1/1/1.png", timeout=60)
    assert unknown.status_code == 404 and "POST /searches/register" in unknown.json()["description"]
