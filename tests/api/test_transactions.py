"""The STAC Transactions extension on a real `floe serve --transactions` (uvicorn, 127.0.0.1), driven with httpx.

Every write is one commit on a branch; a tag answers 405, a write without the
token 401, a stale ``If-Match`` 412, an invalid item 400 with nothing
committed. Items with arrays keep them through PUT and PATCH and lose them
with DELETE. stac-api-validator's own transaction checks run last.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ingest import Repository, Settings
from ingest.lifecycle import check
from ingest.stac import ARRAYS_ASSET
from tests import invariants
from tests.api._servers import FloeServer, assert_validator_passed, run_validator
from tests.conftest import make_item, stage_raster
from tests.repository._writers import pixels_of

TOKEN = "s3cret-write-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
COLLECTION = {
    "type": "Collection",
    "id": "c",
    "description": "items written over HTTP",
    "license": "other",
    "stac_version": "1.0.0",
    "links": [],
    "extent": {"spatial": {"bbox": [[-180, -90, 180, 90]]}, "temporal": {"interval": [[None, None]]}},
}


class Served:
    def __init__(self, root: Path, server: FloeServer) -> None:
        self.root = root
        self.server = server
        self.http = httpx.Client(base_url=server.url, timeout=60)

    def repository(self) -> Repository:
        return Repository.open(self.root, Settings())

    def commits(self, ref: str = "main") -> int:
        return len(self.repository().log(ref))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("transactions") / "repo"
    repository = Repository.create(root, Settings())
    repository.store_collection(COLLECTION)
    writer = repository.writer()
    writer.add_item(make_item("plain", "c", platform="one"))
    writer.add_item(stage_raster(writer, make_item("raster", "c", platform="one"), pixels_of("raster")))
    writer.commit("two items, one with arrays")
    repository.tag("v1")
    repository.branch("dev")
    server = FloeServer(root, env={"FLOE_API__WRITE_TOKEN": TOKEN}, transactions=True)
    try:
        yield Served(root, server)
    finally:
        server.stop()


@pytest.mark.slow
def test_the_extension_is_advertised_and_writes_need_the_token(served: Served) -> None:
    classes = served.http.get("/conformance").json()["conformsTo"]
    assert "https://api.stacspec.org/v1.0.0/ogcapi-features/extensions/transaction" in classes
    before = served.commits()
    item = make_item("nope", "c")
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
        assert served.http.post("/collections/c/items", json=item, headers=headers).status_code == 401
        assert served.http.put("/collections/c/items/plain", json=item, headers=headers).status_code == 401
        assert served.http.delete("/collections/c/items/plain", headers=headers).status_code == 401
    assert served.commits() == before


def test_an_item_collection_lands_in_one_commit_and_an_invalid_one_commits_nothing(served: Served) -> None:
    before = served.commits()
    features = [make_item(f"posted-{n}", "c", platform="two") for n in range(3)]
    answer = served.http.post(
        "/collections/c/items", json={"type": "FeatureCollection", "features": features}, headers=AUTH
    )
    assert answer.status_code == 201, answer.text
    repository = served.repository()
    assert served.commits() == before + 1
    assert repository.log(limit=1)[0].rows_added == 3
    assert {f"posted-{n}" for n in range(3)} <= {item["id"] for item in repository.view().items()}

    bad = [make_item(f"bad-{n}", "c") for n in range(3)]
    bad[1]["geometry"] = {"type": "Point", "coordinates": [500, 0]}
    refused = served.http.post(
        "/collections/c/items", json={"type": "FeatureCollection", "features": bad}, headers=AUTH
    )
    assert refused.status_code == 400 and "bad-1" in refused.json()["description"]
    again = served.http.post("/collections/c/items", json=make_item("posted-0", "c"), headers=AUTH)
    assert again.status_code == 409 and again.json()["code"] == "item-exists"
    assert served.commits() == before + 1, "a refused POST committed"
    assert not {item["id"] for item in served.repository().view().items()} & {item["id"] for item in bad}


def test_tags_and_snapshots_refuse_writes_and_branches_take_them(served: Served) -> None:
    snapshot = served.repository().resolve("v1")
    for prefix in ("/refs/v1", f"/refs/{snapshot}"):
        answer = served.http.post(f"{prefix}/collections/c/items", json=make_item("on-tag", "c"), headers=AUTH)
        assert answer.status_code == 405 and answer.json()["code"] == "read-only-ref"
    on_dev = served.http.post("/refs/dev/collections/c/items", json=make_item("on-dev", "c"), headers=AUTH)
    assert on_dev.status_code == 201, on_dev.text
    assert on_dev.headers["Location"].endswith("/refs/dev/collections/c/items/on-dev")
    repository = served.repository()
    assert "on-dev" in {item["id"] for item in repository.view("dev").items()}
    assert "on-dev" not in {item["id"] for item in repository.view("main").items()}


def test_if_match_guards_replacement_and_arrays_stay_with_the_item(served: Served) -> None:
    fetched = served.http.get("/collections/c/items/raster")
    etag = fetched.headers["ETag"]
    assert served.http.get("/collections/c/items/raster").headers["ETag"] == etag, "the ETag is not stable"
    changed = make_item("raster", "c", platform="two")
    put = served.http.put("/collections/c/items/raster", json=changed, headers={**AUTH, "If-Match": etag})
    assert put.status_code == 204, put.text
    assert put.headers["ETag"] != etag
    stale = served.http.put(
        "/collections/c/items/raster",
        json=make_item("raster", "c", platform="three"),
        headers={**AUTH, "If-Match": etag},
    )
    assert stale.status_code == 412 and stale.json()["code"] == "stale-version"
    patched = served.http.patch(
        "/collections/c/items/raster",
        json={"properties": {"gsd": 10}},
        headers={**AUTH, "If-Match": put.headers["ETag"], "Prefer": "return=representation"},
    )
    assert patched.status_code == 200, patched.text
    body = patched.json()
    assert body["properties"]["platform"] == "two" and body["properties"]["gsd"] == 10
    assert ARRAYS_ASSET in body["assets"], "a PATCH lost the item's arrays"
    tip = served.repository().view()
    invariants.assert_item_arrays(tip, "c", {"raster": pixels_of("raster")})
    invariants.assert_rows_have_their_arrays(tip)


def test_delete_takes_the_item_and_its_arrays_and_a_stale_if_match_takes_nothing(served: Served) -> None:
    etag = served.http.get("/collections/c/items/plain").headers["ETag"]
    served.http.patch("/collections/c/items/plain", json={"properties": {"platform": "moved"}}, headers=AUTH)
    stale = served.http.delete("/collections/c/items/plain", headers={**AUTH, "If-Match": etag})
    assert stale.status_code == 412
    assert served.http.get("/collections/c/items/plain").status_code == 200
    # The ETag a GET answers is the one a DELETE checks.
    current = served.http.get("/collections/c/items/plain").headers["ETag"]
    assert served.http.delete("/collections/c/items/plain", headers={**AUTH, "If-Match": current}).status_code == 204
    assert served.http.get("/collections/c/items/plain").status_code == 404

    assert "raster" in invariants.slice_ids(served.repository().view(), "c")
    assert served.http.delete("/collections/c/items/raster", headers=AUTH).status_code == 204
    assert served.http.get("/collections/c/items/raster").status_code == 404
    assert served.http.delete("/collections/c/items/raster", headers=AUTH).status_code == 204, "DELETE is idempotent"
    missing = served.http.put("/collections/c/items/raster", json=make_item("raster", "c"), headers=AUTH)
    assert missing.status_code == 404 and missing.json()["code"] == "item-not-found", missing.text
    for answer in (
        served.http.delete("/collections/nowhere/items/raster", headers=AUTH),
        served.http.patch("/collections/nowhere/items/raster", json={"properties": {}}, headers=AUTH),
    ):
        assert answer.status_code == 404 and answer.json()["code"] == "collection-not-found", answer.text
    tip = served.repository().view()
    assert "raster" not in invariants.slice_ids(tip, "c")
    invariants.assert_no_slice_without_row(tip)
    assert check(served.repository(), deep=True) == []
    # The tag still holds it, arrays and all.
    invariants.assert_item_arrays(served.repository().view("v1"), "c", {"raster": pixels_of("raster")})


@pytest.mark.slow
def test_stac_api_validator_transaction_checks_pass(served: Served) -> None:
    arguments = [
        "--conformance=core",
        "--conformance=transaction",
        f"--root-url={served.server.url}/",
        "--collection=c",
        "--transaction-collection=c",
        f"--auth-bearer-token={TOKEN}",
        '--geometry={"type":"Polygon","coordinates":[[[-180,-90],[180,-90],[180,90],[-180,90],[-180,-90]]]}',
    ]
    assert_validator_passed(run_validator(*arguments))
