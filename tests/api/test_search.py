"""pystac-client against a running `floe serve`: results equal a brute-force evaluation over the same items."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import shapely
import shapely.geometry
from pystac_client import Client

from ingest import Repository, Settings
from ingest.stac._validate import parse_datetime
from tests.api._servers import FloeServer
from tests.conftest import load_real_items, make_item, with_square

COLLECTIONS = ("alpha", "beta", "gamma")


def _generated() -> list[dict]:
    items = []
    for i in range(240):
        item = make_item(
            f"g-{i:04d}",
            COLLECTIONS[i % 3],
            when=f"2024-{1 + i % 12:02d}-{1 + i % 27:02d}T{i % 24:02d}:00:00Z",
            **{"eo:cloud_cover": float((i * 37) % 100), "platform": f"sat-{i % 4}"},
        )
        items.append(with_square(item, (i * 7.3) % 340 - 170, (i * 3.1) % 160 - 80, 2))
    return items


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    root = tmp_path_factory.mktemp("search") / "repo"
    repository = Repository.create(root, Settings())
    items = _generated() + load_real_items()
    writer = repository.writer()
    writer.add_items(items)
    writer.commit("search items")
    repository.tag("v1")
    server = FloeServer(root)
    try:
        yield {"root": root, "repository": repository, "items": items, "server": server}
    finally:
        server.stop()


def _ids(results) -> set[str]:
    return {item["id"] for item in results.items_as_dicts()}


def _when(item: dict) -> datetime | None:
    text = item["properties"].get("datetime")
    return parse_datetime(text) if text else None


@pytest.mark.slow
def test_bbox_intersects_datetime_collections_ids_equal_brute_force(world: dict) -> None:
    client = Client.open(world["server"].url + "/")
    items = world["items"]
    bbox = [-60.0, -30.0, 40.0, 50.0]
    box = shapely.box(*bbox)
    expected = {item["id"] for item in items if shapely.geometry.shape(item["geometry"]).intersects(box)}
    assert expected
    assert _ids(client.search(bbox=bbox, limit=37)) == expected

    polygon = {"type": "Polygon", "coordinates": [[[0, 0], [100, 0], [100, 60], [0, 0]]]}
    expected = {
        item["id"]
        for item in items
        if shapely.geometry.shape(item["geometry"]).intersects(shapely.geometry.shape(polygon))
    }
    assert expected
    assert _ids(client.search(intersects=polygon, limit=50, method="POST")) == expected

    start, end = parse_datetime("2024-03-01T00:00:00Z"), parse_datetime("2024-06-30T23:59:59Z")
    expected = {item["id"] for item in items if (when := _when(item)) is not None and start <= when <= end}
    assert _ids(client.search(datetime="2024-03-01T00:00:00Z/2024-06-30T23:59:59Z", limit=100)) == expected

    expected = {item["id"] for item in items if item["collection"] in ("beta", "gamma")}
    assert _ids(client.search(collections=["beta", "gamma"], limit=100, method="GET")) == expected

    wanted = [items[3]["id"], items[100]["id"], items[-1]["id"]]
    assert _ids(client.search(ids=wanted)) == set(wanted)


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_cql2_filter_and_sortby_equal_brute_force(world: dict, method: str) -> None:
    client = Client.open(world["server"].url + "/")
    items = world["items"]
    text = "eo:cloud_cover < 30 AND platform IN ('sat-1', 'sat-2') AND collection <> 'gamma'"
    expected = {
        item["id"]
        for item in items
        if isinstance(item["properties"].get("eo:cloud_cover"), float)
        and item["properties"]["eo:cloud_cover"] < 30
        and item["properties"].get("platform") in ("sat-1", "sat-2")
        and item["collection"] != "gamma"
    }
    assert expected
    assert _ids(client.search(filter=text, filter_lang="cql2-text", limit=7, method=method)) == expected

    pattern = {"op": "like", "args": [{"property": "platform"}, "sat-3%"]}
    spatial = {
        "op": "s_intersects",
        "args": [
            {"property": "geometry"},
            {"type": "Polygon", "coordinates": [[[-180, 0], [180, 0], [180, 90], [-180, 90], [-180, 0]]]},
        ],
    }
    both = {"op": "and", "args": [pattern, spatial]}
    expected = {
        item["id"]
        for item in items
        if item["properties"].get("platform") == "sat-3"
        and shapely.geometry.shape(item["geometry"]).intersects(shapely.box(-180, 0, 180, 90))
    }
    assert expected
    assert _ids(client.search(filter=both, filter_lang="cql2-json", limit=10, method=method)) == expected

    generated = [item for item in items if item["collection"] in COLLECTIONS]
    results = list(
        client.search(
            collections=list(COLLECTIONS), sortby="-properties.eo:cloud_cover,id", limit=33, method=method
        ).items_as_dicts()
    )
    ordered = sorted(generated, key=lambda item: (-item["properties"]["eo:cloud_cover"], item["id"]))
    assert [item["id"] for item in results] == [item["id"] for item in ordered]


def test_full_pagination_of_a_collection_equals_the_view(world: dict) -> None:
    client = Client.open(world["server"].url + "/")
    repository = world["repository"]
    real = [item["collection"] for item in load_real_items()]
    largest_real = max(set(real), key=real.count)
    for collection in ("alpha", largest_real):
        expected = {item["id"]: item for item in repository.view("main").items(f"collection = '{collection}'")}
        served = list(client.get_collection(collection).get_items())
        assert len(served) == len(expected) > 3
        assert {item.id for item in served} == set(expected)
        searched = list(client.search(collections=[collection], limit=3).items_as_dicts())
        assert [item["id"] for item in searched] == [item.id for item in served]
        for item in searched:
            want = expected[item["id"]]
            assert item["geometry"] == want["geometry"]
            assert item["properties"] == want["properties"]
            assert item["assets"] == want["assets"]


def test_tag_root_serves_exactly_the_tagged_items_after_more_commits(world: dict) -> None:
    repository = world["repository"]
    tagged = {item["id"] for item in repository.view("v1").items()}
    writer = repository.writer()
    writer.add_items([make_item(f"late-{i}", "alpha") for i in range(5)])
    writer.commit("after the tag")
    at_tag = _ids(Client.open(world["server"].url + "/refs/v1/").search(limit=7, method="POST"))
    assert at_tag == tagged
    snapshot = repository.resolve("v1")
    assert _ids(Client.open(f"{world['server'].url}/refs/{snapshot}/").search(limit=100)) == tagged
    assert _ids(Client.open(world["server"].url + "/refs/tag:v1/").search(limit=100, method="GET")) == tagged
    on_main = _ids(Client.open(world["server"].url + "/").search(limit=100))
    assert {f"late-{i}" for i in range(5)} <= on_main
    # Links of a ref's root stay under its prefix, so clients keep paging that ref.
    root = json.load(urllib.request.urlopen(world["server"].url + "/refs/v1/"))
    assert all("/refs/v1/" in link["href"] for link in root["links"] if link["rel"] in ("self", "search", "data"))
    request = urllib.request.Request(
        world["server"].url + "/refs/v1/search", data=b'{"limit": 2}', headers={"Content-Type": "application/json"}
    )
    page = json.load(urllib.request.urlopen(request))
    ours = ("self", "root", "parent", "collection", "next")
    links = page["links"] + [link for feature in page["features"] for link in feature["links"]]
    hrefs = [link["href"] for link in links if link["rel"] in ours]
    assert len(hrefs) >= 3 + 4 * len(page["features"])
    assert all(href.startswith(world["server"].url + "/refs/v1/") for href in hrefs)


def test_paging_a_branch_while_a_writer_commits_is_consistent(world: dict) -> None:
    repository = world["repository"]
    url = world["server"].url
    before = {item["id"] for item in repository.view("main").items()}
    first = json.load(urllib.request.urlopen(f"{url}/search?limit=20"))
    ids = [feature["id"] for feature in first["features"]]
    done = threading.Event()

    def write() -> None:
        for round_ in range(3):
            writer = repository.writer()
            writer.add_items([make_item(f"during-{round_}-{i}", COLLECTIONS[i % 3]) for i in range(30)])
            writer.commit(f"while paging {round_}")
        done.set()

    thread = threading.Thread(target=write)
    thread.start()
    next_link = next(link for link in first["links"] if link["rel"] == "next")
    while next_link is not None:
        page = json.load(urllib.request.urlopen(next_link["href"]))
        ids += [feature["id"] for feature in page["features"]]
        next_link = next((link for link in page["links"] if link["rel"] == "next"), None)
    thread.join()
    assert done.is_set()
    assert len(ids) == len(set(ids))
    assert set(ids) == before
    after = json.load(urllib.request.urlopen(f"{url}/search?limit=10000"))
    assert {f"during-2-{i}" for i in range(30)} <= {feature["id"] for feature in after["features"]}


@pytest.mark.parametrize(
    ("path", "body", "status", "words"),
    [
        ("/search?bbox=1,2,3", None, 400, "bbox"),
        ("/search?bbox=0,50,10,10", None, 400, "south"),
        ("/search?datetime=yesterday", None, 400, "datetime"),
        ("/search?datetime=2024-05-01T00:00:00Z/2024-01-01T00:00:00Z", None, 400, "datetime"),
        ("/search", {"datetime": "2024-05-01T00:00:00Z/2024-01-01T00:00:00Z"}, 400, "datetime"),
        ("/search", {"limit": 5, "sortby": [{"field": "nothing", "direction": "asc"}]}, 400, "nothing"),
        ("/search", {"filter": "eo:cloud_cover <", "filter-lang": "cql2-text"}, 400, "cql2-text"),
        ("/search?filter=cloud%20%3C%3C%203", None, 400, "cql2-text"),
        ("/search", {"filter": {"op": "frobnicate", "args": [1]}}, 400, "frobnicate"),
        ("/search?intersects=%7B%22type%22%3A%22Point%22%7D", None, 400, "intersects"),
        ("/search?sortby=assets", None, 400, "sort"),
        ("/search?token=not-a-token", None, 400, "token"),
        ("/search?token=eyJzIjoiQUJDIiwiZiI6IngifQ", None, 400, "token"),
        ("/search?token=eyJzIjoiMDAwMDAwMDAwMDAwMDAwMDAwMDAiLCJmIjowLCJyIjowfQ", None, 400, "snapshot"),
        ("/search?limit=0", None, 400, "limit"),
        ("/search?collections=nope", None, 404, "nope"),
        ("/collections/nope", None, 404, "nope"),
        ("/collections/alpha/items/nope", None, 404, "nope"),
        ("/refs/no-such-ref/", None, 404, "no-such-ref"),
        ("/refs/no-such-ref/search", None, 404, "no-such-ref"),
    ],
)
def test_bad_requests_answer_4xx_with_a_message(
    world: dict, path: str, body: dict | None, status: int, words: str
) -> None:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        world["server"].url + path,
        data=data,
        headers={"Content-Type": "application/json"},
        method="POST" if data else "GET",
    )
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(request)
    assert raised.value.code == status
    assert words.lower() in raised.value.read().decode().lower()


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("/collections/nope", 404, "collection-not-found"),
        ("/search?collections=nope", 404, "collection-not-found"),
        ("/collections/alpha/items/nope", 404, "item-not-found"),
        ("/refs/no-such-ref/search", 404, "ref-not-found"),
        ("/refs//search", 404, "ref-not-found"),
        ("/search?bbox=0,50,10,10", 400, "invalid-search"),  # south of north: the framework checks only the count
        ("/search?token=not-a-token", 400, "invalid-search"),
    ],
)
def test_errors_answer_their_groups_status_and_their_kind_as_code(
    world: dict, path: str, status: int, code: str
) -> None:
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(world["server"].url + path)
    assert raised.value.code == status
    body = json.loads(raised.value.read())
    assert body["code"] == code
    assert body["description"]


def test_limit_beyond_the_maximum_is_refused_when_configured(tmp_path: Path) -> None:
    from ingest.api import SearchEngine, SearchRequest
    from ingest.errors import InvalidSearch

    repository = Repository.create(tmp_path / "repo", Settings())
    writer = repository.writer()
    writer.add_items([make_item(f"i-{i}", "c") for i in range(5)])
    writer.commit("five")
    with pytest.raises(InvalidSearch, match="exceeds the maximum of 3"):
        SearchEngine(repository, max_limit=3, refuse_over_limit=True).search(SearchRequest(limit=4))
    assert len(SearchEngine(repository, max_limit=3).search(SearchRequest(limit=4)).items) == 3


@pytest.mark.slow
def test_items_point_at_their_arrays_at_the_served_snapshot(tmp_path: Path) -> None:
    import icechunk
    import numpy as np
    import rioxarray
    import zarr

    from ingest.api import SearchEngine, SearchRequest
    from ingest.pipeline import granule_from_item
    from ingest.pipeline._ray import GranuleWriter
    from ingest.sample import make_archive

    root = tmp_path / "repo"
    repository = Repository.create(root, Settings())
    item_files = make_archive(tmp_path / "archive", granules=2, seed=5)
    granules = [granule_from_item(json.loads(path.read_text()), str(path), path) for path in item_files]
    for granule in granules:
        repository.store_collection(
            {
                "type": "Collection",
                "id": granule.item["collection"],
                "description": "d",
                "license": "other",
                "stac_version": "1.0.0",
                "links": [],
                "extent": {"spatial": {"bbox": [[-180, -90, 180, 90]]}, "temporal": {"interval": [[None, None]]}},
            }
        )
    outcome = GranuleWriter(str(root), Settings().model_dump(), "main").ingest(granules, "granules")
    assert outcome.commit is not None and not outcome.rejected
    served_snapshot = repository.resolve("main")
    writer = repository.writer()  # a later commit: the asset must keep naming the snapshot it was served at
    writer.add_items([make_item("later", granules[0].item["collection"])])
    writer.commit("later")

    page = SearchEngine(repository).search(
        SearchRequest(ids=[g.item["id"] for g in granules]), snapshot_id=served_snapshot
    )
    assert len(page.items) == 2
    for item in page.items:
        asset = item["assets"]["floe:arrays"]
        assert asset["floe:snapshot"] == served_snapshot
        storage = icechunk.local_filesystem_storage(asset["floe:repository"])
        session = icechunk.Repository.open(storage).readonly_session(snapshot_id=asset["floe:snapshot"])
        root = zarr.open_group(session.store, mode="r")
        source = next(granule for granule in granules if granule.item["id"] == item["id"])
        for key in asset["floe:variables"]:
            # Plain zarr, following the pieces the served asset names: the source raster, exactly.
            where = asset["floe:pieces"][key]
            first = root[f"{where['pieces'][0]['stack']}/{where['pieces'][0]['array']}"]
            pixels = np.full(where["shape"], first.fill_value, dtype=first.dtype)
            for piece in where["pieces"]:
                row, column, height, width = piece["window"]
                at_row, at_column = piece["at"]
                stack_array = root[f"{piece['stack']}/{piece['array']}"]
                window = stack_array[piece["slot"], :, row : row + height, column : column + width]
                pixels[:, at_row : at_row + height, at_column : at_column + width] = window
            expected = rioxarray.open_rasterio(source.rasters[key]).values
            assert np.array_equal(pixels, expected)


def test_a_limit_above_the_maximum_returns_the_maximum_by_default(world: dict) -> None:
    # OGC API Features: a larger limit "SHALL NOT result in an error"; the server's maximum (10,000) applies.
    page = json.load(urllib.request.urlopen(world["server"].url + "/search?limit=20000"))
    assert len(page["features"]) == len({item["id"] for item in world["repository"].view("main").items()})


def test_number_matched_reaches_pystac_client_when_metadata_decides_it(world: dict) -> None:
    client = Client.open(world["server"].url + "/refs/v1/")  # the branch moves in other tests; the tag does not
    items = world["items"]
    assert client.search(collections=["beta"], limit=5).matched() == sum(
        1 for item in items if item["collection"] == "beta"
    )
    assert client.search(limit=5, method="GET").matched() == len(items)
    with pytest.warns(UserWarning, match="numberMatched"):  # pystac-client says so when a server leaves it out
        assert client.search(bbox=[-60.0, -30.0, 40.0, 50.0], limit=5).matched() is None
