"""Serving scales out by replicas: two `floe serve` processes on one S3 root answer as one.

Two real servers (uvicorn, separate OS processes, separate caches) serve the
same repository on a moto S3 server. They answer the same searches with the
same bytes (but for their own address in links), and a page token issued by
one continues on the other: a token is the snapshot, the position and the
search's fingerprint, nothing a server keeps. A replica that never saw a
token's snapshot reads it from the store, so paging a branch across replicas
while a writer commits still returns exactly the snapshot the first page was
read at.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from pystac_client import Client

from ingest import Repository, Settings
from tests.api._servers import FloeServer
from tests.conftest import MotoServer, make_item, with_square

pytestmark = [pytest.mark.s3, pytest.mark.slow]

COLLECTIONS = ("alpha", "beta", "gamma")
TAG = "v1"
PLACEHOLDER = "http://replica"
SNAPSHOT_HEADER = "Floe-Snapshot"
# Paging stops here even if next links never end (a bug): the assertions then say so instead of hanging.
MAX_PAGES = 200


def _generated(start: int, count: int, *, prefix: str = "g", year: int = 2024) -> list[dict]:
    """Items ``start`` .. ``start + count``: three collections, four months, spread over the globe (seeded)."""
    items = []
    for i in range(start, start + count):
        item = make_item(
            f"{prefix}-{i:04d}",
            COLLECTIONS[i % 3],
            when=f"{year}-{1 + i % 4:02d}-{1 + (i * 7) % 28:02d}T{i % 24:02d}:{i % 60:02d}:00Z",
            **{"eo:cloud_cover": float((i * 37) % 100), "platform": f"sat-{i % 4}"},
        )
        items.append(with_square(item, (i * 7.3) % 340 - 170, (i * 3.1) % 160 - 80, 2))
    return items


def _commit(repository: Repository, items: list[dict], message: str) -> str:
    writer = repository.writer()
    writer.add_items(items)
    return writer.commit(message).snapshot_id


@dataclass
class Replicas:
    repository: Repository
    a: FloeServer
    b: FloeServer


@pytest.fixture(scope="module")
def replicas(moto_server: MotoServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    settings = Settings(s3=moto_server.s3_settings())
    root = f"s3://{moto_server.create_bucket()}/repo"
    repository = Repository.create(root, settings)
    # Three commits (each writes a data file per collection and month) up to the tag, one more past it.
    _commit(repository, _generated(0, 100), "first hundred")
    _commit(repository, _generated(100, 100), "second hundred")
    _commit(repository, _generated(200, 80), "eighty more")
    repository.tag(TAG)
    _commit(repository, _generated(280, 80), "past the tag")
    env = {
        f"FLOE_S3__{key.upper()}": str(value).lower() if isinstance(value, bool) else str(value)
        for key, value in settings.s3.model_dump().items()
        if value is not None
    }
    logs = tmp_path_factory.mktemp("replicas")
    started: list[FloeServer] = []
    try:
        started.append(FloeServer(root, env=env, log_dir=logs))
        started.append(FloeServer(root, env=env, log_dir=logs))
        a, b = started
        assert a.process.pid != b.process.pid and a.url != b.url
        yield Replicas(repository, a, b)
    finally:
        for server in started:
            server.stop()


# -- HTTP --------------------------------------------------------------------------------------------------------


@dataclass
class Page:
    """One page of results, as one server answered it."""

    server: FloeServer
    snapshot: str
    body: dict[str, Any]

    @property
    def ids(self) -> list[str]:
        return [feature["id"] for feature in self.body["features"]]

    def normalized(self) -> dict[str, Any]:
        """The body with the answering server's address replaced: what must be equal across replicas."""
        return _normalized(self.body, self.server)

    def next_request(self) -> Request | None:
        """The request of the next page, relative to the server (so any replica can be sent it)."""
        link = next((link for link in self.body["links"] if link["rel"] == "next"), None)
        if link is None:
            return None
        # The next link must name this server: the hand-off to the other replica below is then a real one.
        assert link["href"].startswith(self.server.url + "/"), link
        path = link["href"][len(self.server.url) :]
        return Request(link.get("method", "GET"), path, link.get("body"))


@dataclass
class Request:
    method: str
    path: str  # with the query, from the server's root
    body: dict[str, Any] | None = None

    def send(self, server: FloeServer) -> Page:
        data = json.dumps(self.body).encode() if self.body is not None else None
        request = urllib.request.Request(
            server.url + self.path, data=data, headers={"Content-Type": "application/json"}, method=self.method
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                assert response.status == 200
                return Page(server, response.headers[SNAPSHOT_HEADER], json.load(response))
        except urllib.error.HTTPError as error:
            pytest.fail(f"{self.method} {self.path} on {server.url}: {error.code} {error.read().decode()[:500]}")


def _normalized(document: Any, server: FloeServer) -> Any:
    return json.loads(json.dumps(document).replace(server.url, PLACEHOLDER))


def _first(prefix: str, method: str, search: dict[str, Any]) -> Request:
    """The first page's request of ``search`` at ``prefix`` (``/`` or ``/refs/<ref>/``), by GET or POST."""
    if method == "POST":
        return Request("POST", f"{prefix}search", search)
    query = {key: ",".join(value) if isinstance(value, list) else value for key, value in search.items()}
    return Request("GET", f"{prefix}search?{urllib.parse.urlencode(query)}")


def _page_through(
    servers: list[FloeServer], first: Request, *, before_page: Callable[[int], None] | None = None
) -> list[Page]:
    """Every page of a search, page ``n`` asked of ``servers[n % len(servers)]`` with the previous page's token.

    ``before_page(n)`` runs before page ``n`` (from 1) is asked for: a test's writer commits there.
    """
    pages = [first.send(servers[0])]
    while (following := pages[-1].next_request()) is not None and len(pages) < MAX_PAGES:
        if before_page is not None:
            before_page(len(pages))
        pages.append(following.send(servers[len(pages) % len(servers)]))
    assert pages[-1].next_request() is None, f"still a next link after {MAX_PAGES} pages"
    return pages


def _ids(pages: list[Page]) -> list[str]:
    return [item_id for page in pages for item_id in page.ids]


# -- identical answers --------------------------------------------------------------------------------------------

SPATIAL_AND_LIKE = {
    "op": "and",
    "args": [
        {"op": "like", "args": [{"property": "platform"}, "sat-3%"]},
        {
            "op": "s_intersects",
            "args": [
                {"property": "geometry"},
                {"type": "Polygon", "coordinates": [[[-180, 0], [180, 0], [180, 90], [-180, 90], [-180, 0]]]},
            ],
        },
    ],
}

SEARCHES: dict[str, tuple[str, dict[str, Any]]] = {
    "bbox": ("GET", {"bbox": "-60,-30,40,50", "limit": 7}),
    "datetime": ("GET", {"datetime": "2024-02-01T00:00:00Z/2024-03-15T00:00:00Z", "limit": 25}),
    "collections": ("GET", {"collections": ["beta", "gamma"], "limit": 40}),
    "cql2-text": (
        "GET",
        {"filter": "eo:cloud_cover < 30 AND platform IN ('sat-1', 'sat-2')", "filter-lang": "cql2-text", "limit": 9},
    ),
    "cql2-json": ("POST", {"filter": SPATIAL_AND_LIKE, "filter-lang": "cql2-json", "limit": 11}),
    "sortby": ("GET", {"sortby": "-datetime", "limit": 30}),
    "all-at-once-sorted": (
        "POST",
        {
            "collections": ["alpha", "gamma"],
            "bbox": [-170, -80, 100, 60],
            "datetime": "2024-01-10T00:00:00Z/..",
            "filter": "eo:cloud_cover >= 20",
            "filter-lang": "cql2-text",
            "sortby": [{"field": "properties.datetime", "direction": "desc"}],
            "limit": 13,
        },
    ),
}


@pytest.mark.parametrize("prefix", ["/", f"/refs/{TAG}/"])
@pytest.mark.parametrize("name", list(SEARCHES))
def test_two_replicas_answer_every_page_of_a_search_identically(replicas: Replicas, name: str, prefix: str) -> None:
    method, search = SEARCHES[name]
    first = _first(prefix, method, search)
    on_a = _page_through([replicas.a], first)
    on_b = _page_through([replicas.b], first)
    # Each search spans pages (its next tokens are compared too) and finds something: equality is not vacuous.
    assert len(on_a) >= 2
    # Only the last page may be empty (a token is issued when more matches may follow).
    assert all(page.body["features"] for page in on_a[:-1])
    assert len(on_a) == len(on_b)
    for page_a, page_b in zip(on_a, on_b, strict=True):
        assert page_b.snapshot == page_a.snapshot
        assert page_b.body["numberReturned"] == page_a.body["numberReturned"] == len(page_a.ids)
        assert page_b.normalized() == page_a.normalized()
        assert page_a.server is replicas.a and page_b.server is replicas.b
    ids = _ids(on_a)
    assert len(ids) == len(set(ids))
    expected_snapshot = replicas.repository.resolve(TAG if prefix != "/" else "main")
    assert {page.snapshot for page in on_a + on_b} == {expected_snapshot}


def test_the_tag_root_serves_the_tag_on_both_replicas(replicas: Replicas) -> None:
    """The tag's routes serve the tag (not the branch, which moved past it), on either replica."""
    repository = replicas.repository
    for ref, prefix in (("main", "/"), (TAG, f"/refs/{TAG}/")):
        expected = {item["id"] for item in repository.view(ref).items("collection = 'beta' OR collection = 'gamma'")}
        for server in (replicas.a, replicas.b):
            pages = _page_through([server], _first(prefix, *SEARCHES["collections"]))
            assert set(_ids(pages)) == expected
    tagged = {item["id"] for item in repository.view(TAG).items()}
    assert tagged < {item["id"] for item in repository.view("main").items()}


# -- a token from one replica continues on the other --------------------------------------------------------------

PAGED: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    # name: (method, the search as _first sends it, the same search as pystac-client's keywords)
    "unsorted": (
        "GET",
        {"filter": "eo:cloud_cover < 60", "filter-lang": "cql2-text", "limit": 17},
        {"filter": "eo:cloud_cover < 60", "filter_lang": "cql2-text", "limit": 17},
    ),
    "sorted": (
        "POST",
        {
            "collections": ["alpha", "beta"],
            "sortby": [{"field": "properties.datetime", "direction": "desc"}],
            "limit": 19,
        },
        {"collections": ["alpha", "beta"], "sortby": "-properties.datetime", "limit": 19},
    ),
}


@pytest.mark.parametrize("prefix", ["/", f"/refs/{TAG}/"])
@pytest.mark.parametrize("name", list(PAGED))
def test_a_token_from_one_replica_continues_on_the_other(replicas: Replicas, name: str, prefix: str) -> None:
    method, search, keywords = PAGED[name]
    # Paging entirely on A, as a STAC client does: pystac-client follows A's next links.
    client = Client.open(replicas.a.url + prefix)
    on_a = list(client.search(method=method, **keywords).items_as_dicts())

    # Page 1 from A, page 2 from B with A's token, page 3 from A with B's token, and so on.
    across = _page_through([replicas.a, replicas.b], _first(prefix, method, search))
    assert len(across) >= 4
    assert {page.server.url for page in across[1::2]} == {replicas.b.url}
    ids = _ids(across)
    assert len(ids) == len(set(ids)), "a page repeated items of another"
    assert ids == [item["id"] for item in on_a]
    features = [feature for page in across for feature in page.normalized()["features"]]
    assert features == _normalized(on_a, replicas.a)
    assert len({page.snapshot for page in across}) == 1

    # No gaps: the pages hold every match, as one page of them all on B has them.
    whole = _first(prefix, method, {**search, "limit": 10_000}).send(replicas.b)
    assert whole.next_request() is None
    assert sorted(ids) == sorted(whole.ids)
    if name == "sorted":
        times = [feature["properties"]["datetime"] for page in across for feature in page.body["features"]]
        assert times == sorted(times, reverse=True)


@pytest.mark.parametrize("name", list(PAGED))
def test_paging_the_branch_across_replicas_keeps_the_token_snapshot_while_a_commit_lands(
    replicas: Replicas, name: str
) -> None:
    repository = replicas.repository
    method, search, _ = PAGED[name]
    first = _first("/", method, search)
    # A commit of our own first: its snapshot is one neither replica has answered for yet.
    pinned = _commit(repository, _generated(0, 30, prefix=f"{name}-before"), f"before paging ({name})")
    before = _page_through([replicas.a], first)
    assert {page.snapshot for page in before} == {pinned}

    # Items that land after page 1, dated after everything else (each case its own year): a sorted continuation
    # at the branch's new tip would put them first; an unsorted one would find them in new files.
    landed = _generated(0, 40, prefix=f"{name}-during", year=2025 + list(PAGED).index(name))
    tips: list[str] = []

    def commit_after_the_first_page(page: int) -> None:
        if page == 1:
            tips.append(_commit(repository, landed, f"while paging ({name})"))

    # Page 2 is B's first request since `pinned` was committed: B reads that snapshot because the token names it.
    across = _page_through([replicas.a, replicas.b], first, before_page=commit_after_the_first_page)
    assert len(tips) == 1 and tips[0] != pinned
    assert repository.resolve("main") == tips[0]
    assert len(across) >= 4
    assert {page.snapshot for page in across} == {pinned}
    assert _ids(across) == _ids(before)
    assert [page.normalized() for page in across] == [page.normalized() for page in before]
    assert not {item["id"] for item in landed} & set(_ids(across))

    # A new search, on either replica, reads the new tip and finds the new items.
    wanted = [item["id"] for item in landed]
    fresh = [_first("/", "POST", {"ids": wanted, "limit": 100}).send(server) for server in (replicas.a, replicas.b)]
    for page in fresh:
        assert page.snapshot == tips[0]
        assert sorted(page.ids) == sorted(wanted)
    assert fresh[0].normalized() == fresh[1].normalized()
    new_first_pages = [first.send(server) for server in (replicas.a, replicas.b)]
    assert new_first_pages[0].snapshot == new_first_pages[1].snapshot == tips[0]
    assert new_first_pages[0].normalized() == new_first_pages[1].normalized()
    if name == "sorted":
        # Sorted newest first, the new tip's first page is all items that landed while paging.
        assert set(new_first_pages[0].ids) <= set(wanted) and len(new_first_pages[0].ids) == search["limit"]
