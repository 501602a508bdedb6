"""The page-size maximum is a setting: refused with a 400 when configured so (clamped otherwise, as OGC requires)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from ingest import Repository, Settings
from tests.api._servers import FloeServer
from tests.conftest import make_item


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FloeServer]:
    root = tmp_path_factory.mktemp("limits") / "repo"
    repository = Repository.create(root, Settings())
    writer = repository.writer()
    writer.add_items([make_item(f"i-{n}", "c") for n in range(60)])
    writer.commit("sixty")
    running = FloeServer(root, env={"FLOE_API__MAX_LIMIT": "50", "FLOE_API__REFUSE_OVER_LIMIT": "true"})
    try:
        yield running
    finally:
        running.stop()


@pytest.mark.slow
def test_limit_beyond_the_configured_maximum_is_a_400_that_says_so(server: FloeServer) -> None:
    page = json.load(urllib.request.urlopen(f"{server.url}/search?limit=50"))
    assert len(page["features"]) == 50
    for request in (
        urllib.request.Request(f"{server.url}/search?limit=51"),
        urllib.request.Request(
            f"{server.url}/search", data=b'{"limit": 51}', headers={"Content-Type": "application/json"}
        ),
        urllib.request.Request(f"{server.url}/collections/c/items?limit=51"),
    ):
        with pytest.raises(urllib.error.HTTPError) as raised:
            urllib.request.urlopen(request)
        assert raised.value.code == 400
        assert "exceeds the maximum of 50" in raised.value.read().decode()
