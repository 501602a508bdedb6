"""The standard asset of each stack an item's pixels are in (``ingest/stac/_served.py``): opened without floe.

A served item with arrays carries, per Icechunk stack its pixels lie in, an
asset of type ``application/vnd.zarr+icechunk``: the repository (``href``),
the snapshot (``version``), the bucket (``storage:refs`` into the item's
``storage:schemes``), the group (``xarray:open_kwargs``) and where the item
is in the stack (``floe:slot``, ``floe:windows``). The tests read an item
from a real ``floe serve`` with pystac-client and open its stacks with only
those fields, Icechunk and xarray, as any Zarr tool would: the pixels put
back together equal ``View.item_arrays``, the datacube extents equal the
stack's own georeferencing, and a tag's assets keep the tag's pixels after
main replaces the item.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import icechunk
import numpy as np
import pystac
import pystac_client
import pytest
import xarray as xr
import zarr

from ingest import Repository, Settings
from ingest.api._request import SearchRequest
from ingest.api._search import SearchEngine
from ingest.api._transactions import item_etag
from ingest.pipeline.sources._api_walk import item_from_api
from ingest.stac import ICECHUNK_MEDIA_TYPE, without_served_assets
from tests.api._granules import SIZE, stage_cog, write_cog
from tests.api._servers import FloeServer
from tests.conftest import MotoServer, make_item

pytestmark = pytest.mark.slow

TILING = {"tile": 256, "chunk": 128}
"""Small stacks, so a 384-pixel granule lies across four of them."""


def _settings(base: Settings) -> Settings:
    return base.model_copy(update={"arrays": base.arrays.model_copy(update=TILING)})


def _stacks(item: pystac.Item) -> dict[str, pystac.Asset]:
    return {key: asset for key, asset in item.assets.items() if asset.media_type == ICECHUNK_MEDIA_TYPE}


def _session(schemes: dict[str, Any], asset: pystac.Asset, moto: MotoServer | None) -> icechunk.Session:
    """The Icechunk session an asset names, from its fields and the owner's ``storage:schemes`` alone."""
    fields = asset.extra_fields
    if "storage:refs" in fields:
        scheme = schemes[fields["storage:refs"][0]]
        bucket = scheme["bucket"]
        assert asset.href.startswith(f"s3://{bucket}/")
        assert moto is not None and scheme["type"] == "custom-s3" and scheme["platform"] == moto.endpoint
        storage = icechunk.s3_storage(
            bucket=bucket,
            prefix=asset.href.removeprefix(f"s3://{bucket}/"),
            region=scheme["region"],
            endpoint_url=scheme["platform"],
            allow_http=True,
            force_path_style=True,
            access_key_id="testing",
            secret_access_key="testing",
        )
    else:
        storage = icechunk.local_filesystem_storage(asset.href)
    return icechunk.Repository.open(storage).readonly_session(snapshot_id=fields["version"])


def _open_stack(item: pystac.Item, asset: pystac.Asset, moto: MotoServer | None) -> xr.Dataset:
    """The stack an asset names, opened from the asset's and the item's fields alone."""
    session = _session(item.properties.get("storage:schemes", {}), asset, moto)
    fields = asset.extra_fields
    # The raw values (no CF masking to NaN), as item_arrays gives them.
    return xr.open_dataset(session.store, chunks=None, mask_and_scale=False, **fields["xarray:open_kwargs"])


def _pixels(item: pystac.Item, key: str, moto: MotoServer | None) -> np.ndarray:
    """Asset ``key``'s pixels put back together from every stack asset's window of it (0 where none is)."""
    out = np.zeros((1, SIZE, SIZE), dtype="uint16")
    for asset in _stacks(item).values():
        where = asset.extra_fields["floe:windows"][key]
        row, column, height, width = where["window"]
        at_row, at_column = where["at"]
        stack = _open_stack(item, asset, moto)
        part = stack[where["array"]].isel(slot=asset.extra_fields["floe:slot"]).values
        out[:, at_row : at_row + height, at_column : at_column + width] = part[
            :, row : row + height, column : column + width
        ]
    return out


def _check_extents(item: pystac.Item, moto: MotoServer | None) -> None:
    """Each stack asset's datacube x and y extents are the stack's own georeferencing (its GeoTransform)."""
    for asset in _stacks(item).values():
        stack = _open_stack(item, asset, moto)
        # GDAL's order: x of the first column, pixel width, rotation, y of the first row, rotation, pixel height.
        c, a, _b, f, _d, e = (float(value) for value in stack["spatial_ref"].attrs["GeoTransform"].split())
        height, width = stack.sizes["y"], stack.sizes["x"]
        cube = asset.extra_fields["cube:dimensions"]
        assert cube["x"]["extent"] == pytest.approx(sorted([c, c + width * a]))
        assert cube["y"]["extent"] == pytest.approx(sorted([f, f + height * e]))
        assert cube["x"]["reference_system"] == 32633
        variables = asset.extra_fields["cube:variables"]
        assert {name: list(stack[name].dims) for name in variables} == {
            name: variable["dimensions"] for name, variable in variables.items()
        }


@pytest.fixture(scope="module")
def on_s3(moto_server: MotoServer, tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("stack-assets")
    settings = _settings(Settings(s3=moto_server.s3_settings()))
    root = f"s3://{moto_server.create_bucket()}/repo"
    repo = Repository.create(root, settings)
    stage_cog(repo, write_cog(folder / "utm.tif", "utm"), "utm")
    writer = repo.writer()
    writer.add_item(make_item("no-arrays", "plain"))
    writer.commit("a collection without arrays")
    repo.tag("v1")
    stage_cog(repo, write_cog(folder / "utm-2.tif", "utm", version=1), "utm", replace=True)
    env = {f"FLOE_S3__{key.upper()}": str(value) for key, value in settings.s3.model_dump().items() if value}
    server = FloeServer(root, env=env, log_dir=folder)
    try:
        yield server, repo
    finally:
        server.stop()


@pytest.mark.s3
def test_an_items_stacks_on_s3_open_from_its_assets_alone_and_equal_item_arrays(on_s3, moto_server) -> None:
    server, repo = on_s3
    for ref in ("v1", "main"):
        item = pystac_client.Client.open(f"{server.url}/refs/{ref}").get_collection("tiles").get_item("utm")
        stacks = _stacks(item)
        assert len(stacks) == 4  # the granule lies across four 256-pixel tiles of its lattice
        assert {asset.extra_fields["version"] for asset in stacks.values()} == {repo.resolve(ref)}
        assert item.properties["storage:schemes"]["floe"]["bucket"] == repo.location.bucket
        expected = repo.view(ref).item_arrays("tiles", "utm")["B04"].values
        np.testing.assert_array_equal(_pixels(item, "B04", moto_server), expected)
    _check_extents(item, moto_server)
    # The tag's assets keep the tag's pixels: main replaced the item with other ones.
    tagged = pystac_client.Client.open(f"{server.url}/refs/v1").get_collection("tiles").get_item("utm")
    assert not np.array_equal(_pixels(tagged, "B04", moto_server), _pixels(item, "B04", moto_server))


@pytest.mark.s3
def test_a_collection_carries_the_whole_store_at_the_ref(on_s3, moto_server) -> None:
    server, repo = on_s3
    for ref in ("v1", "main"):
        client = pystac_client.Client.open(f"{server.url}/refs/{ref}")
        collection, item = client.get_collection("tiles"), client.get_collection("tiles").get_item("utm")
        store = collection.assets["floe:store"]
        assert store.media_type == ICECHUNK_MEDIA_TYPE and store.extra_fields["version"] == repo.resolve(ref)
        session = _session(collection.extra_fields["storage:schemes"], store, moto_server)
        # The store holds the item's stacks, at the ref's version: the same pixels as the item's own asset reads.
        for asset in _stacks(item).values():
            where = asset.extra_fields["floe:windows"]["B04"]
            group = asset.extra_fields["xarray:open_kwargs"]["group"]
            array = zarr.open_array(session.store, path=f"{group}/{where['array']}", mode="r")
            slot = asset.extra_fields["floe:slot"]
            stack = _open_stack(item, asset, moto_server)
            np.testing.assert_array_equal(array[slot], stack[where["array"]].isel(slot=slot).values)
        # A collection no arrays were written to has no stacks in the store, and no store asset.
        plain = client.get_collection("plain")
        assert "floe:store" not in plain.assets and "storage:schemes" not in plain.extra_fields


def _served(repo: Repository) -> dict[str, Any]:
    """The item as floe's search engine serves it (in this process), at main."""
    request = SearchRequest(collections=["tiles"], ids=["utm"], limit=1)
    page = SearchEngine.in_process(repo).search(request, snapshot_id=repo.resolve("main"))
    return page.items[0]


def test_a_local_repositorys_stack_assets_name_its_path_and_no_storage_scheme(tmp_path: Path) -> None:
    repo = Repository.create(tmp_path / "repo", _settings(Settings()))
    stage_cog(repo, write_cog(tmp_path / "utm.tif", "utm"), "utm")
    item = pystac.Item.from_dict(_served(repo))
    assert len(_stacks(item)) == 4
    assert "storage:schemes" not in item.properties
    assert all("storage:refs" not in asset.extra_fields for asset in _stacks(item).values())
    expected = repo.view().item_arrays("tiles", "utm")["B04"].values
    np.testing.assert_array_equal(_pixels(item, "B04", None), expected)
    _check_extents(item, None)


def test_what_serving_adds_is_not_part_of_the_item(tmp_path: Path) -> None:
    """The ETag of a served item is the stored item's; written back, or ingested from the API into another
    repository, it keeps no stack asset."""
    repo = Repository.create(tmp_path / "repo", _settings(Settings()))
    stage_cog(repo, write_cog(tmp_path / "utm.tif", "utm"), "utm")
    served = _served(repo)
    stored = repo.writer().stored_items([("tiles", "utm")])[("tiles", "utm")]
    assert _stacks(pystac.Item.from_dict(served)) and not _stacks(pystac.Item.from_dict(stored))
    assert item_etag(served) == item_etag(stored)
    unserved = without_served_assets(served)
    assert set(unserved["assets"]) == set(stored["assets"])
    assert unserved["stac_extensions"] == stored.get("stac_extensions", [])
    assert unserved["properties"] == stored["properties"]
    # Ingested from this API into another repository, it leaves this one's stacks behind.
    walked = item_from_api(copy.deepcopy(served))
    assert not [key for key in walked["assets"] if key.startswith("floe:")]
    assert walked["stac_extensions"] == stored.get("stac_extensions", [])
