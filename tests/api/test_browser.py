"""STAC Browser on every ref of a real `floe serve`, rendered by a real headless Chromium (Playwright).

The build is the one ``floe browser install`` made (``scripts/setup.sh`` runs
it where npm is present). Basemaps are off (``FLOE_API__BASEMAPS=[]``), and
every request the page makes must stay on the server: the test fails on any
request to another host. Without a build, ``/browser/`` says how to install
it and the API answers as before. Screenshots of each page are kept in
``test-artifacts/browser/``.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import pytest

from ingest import Repository, Settings
from ingest.api._browser import browser_home, installed_build
from tests.api._servers import WORKTREE, FloeServer
from tests.conftest import make_item, with_square

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = WORKTREE / "test-artifacts" / "browser"
COLLECTION = {
    "type": "Collection",
    "id": "scenes",
    "title": "Scenes of the browser test",
    "description": "items shown by STAC Browser",
    "license": "other",
    "stac_version": "1.0.0",
    "links": [],
    "extent": {"spatial": {"bbox": [[0, 40, 10, 50]]}, "temporal": {"interval": [["2024-01-01T00:00:00Z", None]]}},
}
NO_BASEMAPS = {"FLOE_API__BASEMAPS": "[]"}


@pytest.fixture(scope="module")
def repository_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("browser") / "repo"
    repository = Repository.create(root, Settings())
    repository.store_collection(COLLECTION)
    writer = repository.writer()
    scene = with_square(make_item("scene-one", "scenes", platform="one"), 2, 44, 1)
    scene["assets"]["metadata"] = {
        "href": "https://example.com/scene-one.xml",
        "type": "application/xml",
        "title": "MTD",
    }
    writer.add_item(scene)
    writer.commit("one scene")
    repository.tag("v1")
    repository.branch("dev", "v1")
    writer = repository.writer("dev")
    writer.add_item(with_square(make_item("scene-on-dev", "scenes", platform="dev"), 4, 44, 1))
    writer.commit("a scene on dev")
    return root


@pytest.fixture(scope="module")
def built() -> Path:
    build = installed_build(browser_home(Settings()))
    if build is None:
        pytest.skip(
            f"STAC Browser is not built at {browser_home(Settings())}: `floe browser install` builds it "
            "(scripts/setup.sh runs it where Node.js and npm are present)"
        )
    return build


@pytest.fixture(scope="module")
def server(repository_root: Path, built: Path) -> Iterator[FloeServer]:
    served = FloeServer(repository_root, env=NO_BASEMAPS)
    try:
        yield served
    finally:
        served.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if CHROMIUM is None:
        pytest.fail("Chromium is missing: install Debian's chromium (scripts/setup.sh does it as root)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()


class Page:
    """A page that records every request, so a test can say none left the server."""

    def __init__(self, browser: object, server: FloeServer) -> None:
        self.page = browser.new_page()  # type: ignore[attr-defined]
        self.page.set_default_timeout(60_000)
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.origin = urlsplit(server.url).netloc
        assert urlsplit(server.url).hostname == "127.0.0.1"
        # Offline, as this machine is: a request to any other host is recorded and refused.
        self.page.route("**/*", self._route)

    def _route(self, route: Any) -> None:
        url = route.request.url
        self.requests.append(url)
        if urlsplit(url).scheme in ("http", "https") and urlsplit(url).netloc != self.origin:
            route.abort()
        else:
            route.continue_()

    def open(self, url: str) -> None:
        """Load ``url`` afresh (going to another ``#/...`` route of the same page would not load it again)."""
        self.page.goto("about:blank")
        self.page.goto(url)

    def text(self, expected: str) -> None:
        """Wait until ``expected`` shows on the page."""
        self.page.get_by_text(expected, exact=False).first.wait_for(state="visible")

    def foreign(self) -> list[str]:
        """Requests to any other host (a basemap's tiles, a schema the queryables would name)."""
        return [
            url
            for url in self.requests
            if urlsplit(url).scheme in ("http", "https") and urlsplit(url).netloc != self.origin
        ]

    def screenshot(self, name: str) -> None:
        """Keep what the page showed as a test artifact (``test-artifacts/browser/<name>.png``)."""
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


@pytest.mark.slow
def test_each_ref_renders_its_own_catalog_collection_and_items(server: FloeServer, browser: object) -> None:
    page = Page(browser, server)
    page.open(f"{server.url}/refs/v1/browser/")
    page.text("Scenes of the browser test")  # the catalog page lists the stored collection
    page.screenshot("catalog-v1")
    page.open(f"{server.url}/refs/v1/browser/#/collections/scenes")
    page.text("scene-one")
    page.screenshot("collection-v1")
    page.open(f"{server.url}/refs/v1/browser/#/collections/scenes/items/scene-one")
    page.page.locator("h1", has_text="scene-one").wait_for(state="visible")  # the item's id as the page title
    platform = page.page.locator('div.label[title="platform"] + div.value')
    platform.wait_for(state="visible")
    assert platform.inner_text().strip() == "one", "the item's properties are not shown"
    assets = page.page.locator("section.assets .card.asset .title")
    assert sorted(assets.all_inner_texts()) == ["MTD", "data"], "the item's asset list is not shown"
    page.screenshot("item-v1")
    # dev holds an item v1 does not; the default mount shows main (= v1 here).
    page.open(f"{server.url}/refs/dev/browser/#/collections/scenes")
    page.text("scene-on-dev")
    page.open(f"{server.url}/browser/#/search")
    page.page.get_by_role("button", name="Submit").wait_for(state="visible")  # the search form, offline
    page.screenshot("search-main")
    assert len(page.requests) > 20, f"only {len(page.requests)} requests: did the pages load?"
    assert page.foreign() == [], f"{len(page.foreign())} of {len(page.requests)} requests left 127.0.0.1"
    assert not page.errors, page.errors


@pytest.mark.slow
def test_the_version_switcher_lists_refs_and_opens_each(server: FloeServer, browser: object) -> None:
    page = Page(browser, server)
    page.open(f"{server.url}/refs/v1/browser/")
    page.text("Scenes of the browser test")
    switcher = page.page.locator("#floe-version")
    labels = switcher.locator("option").all_inner_texts()
    assert labels == ["dev (branch)", "main (branch)", "v1 (tag)"]
    assert switcher.input_value().endswith("/refs/v1/browser/"), "the switcher does not show the ref on view"
    switcher.select_option(label="dev (branch)")
    page.page.wait_for_url(f"{server.url}/refs/dev/browser/**")
    page.open(f"{server.url}/refs/dev/browser/#/collections/scenes")
    page.text("scene-on-dev")
    assert page.foreign() == []


def test_each_mount_gets_its_own_config(server: FloeServer) -> None:
    with httpx.Client(base_url=server.url) as http:
        for mount, root in (
            ("/browser/", "/"),
            ("/refs/v1/browser/", "/refs/v1/"),
            ("/refs/dev/browser/", "/refs/dev/"),
        ):
            script = http.get(f"{mount}config.js")
            assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
            first_line = script.text.splitlines()[0]
            options = orjson.loads(first_line.removeprefix("window.STAC_BROWSER_CONFIG = ").removesuffix(";"))
            assert options["catalogUrl"] == f"{server.url}{root}"
            # The catalog URL is the API root's own self link.
            landing = http.get(root).json()
            assert next(link["href"] for link in landing["links"] if link["rel"] == "self") == options["catalogUrl"]
            # The API root links to its browser.
            page = [link["href"] for link in landing["links"] if link["rel"] == "alternate"]
            assert page == [f"{server.url}{mount}"]
            assert options["floeBasemaps"] == [] and options["historyMode"] == "hash"
        assert http.get("/browser").status_code == 308
        assert http.get("/refs/v1/browser/../../etc/passwd").status_code == 404
        assert http.post("/browser/config.js").status_code == 405


@pytest.mark.slow
def test_without_a_build_the_page_says_how_to_install_it_and_the_api_works(
    repository_root: Path, tmp_path: Path
) -> None:
    served = FloeServer(repository_root, env={"FLOE_API__BROWSER_DIR": str(tmp_path / "none"), **NO_BASEMAPS})
    try:
        with httpx.Client(base_url=served.url) as http:
            answer = http.get("/refs/v1/browser/")
            assert answer.status_code == 404 and "floe browser install" in answer.text
            assert http.get("/refs/v1/collections/scenes/items").json()["features"][0]["id"] == "scene-one"
            links = http.get("/refs/v1/").json()["links"]
            assert not [link for link in links if link["rel"] == "alternate"], "a link to a browser that is not there"
        assert "floe browser install" in served.log.read_text()
    finally:
        served.stop()
