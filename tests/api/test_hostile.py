"""Hostile requests to a real `floe serve`: each gets a 4xx that says why, and the server answers the next one.

One request used to take the whole service down: a filter nested a few thousand deep overflowed the native
stack of the CQL2 parser and killed the process (issue 14). Others were answered 200 with results that looked
right but were not: a one-argument ``=``, an open or bow-tie polygon, a filter on a property no item has, a page
token of one search followed by another.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator

import pytest

from ingest import Repository, Settings
from tests.api._servers import FloeServer
from tests.conftest import make_item

IDS = [f"i-{n}" for n in range(40)]
LATE = ["late-0", "late-1"]  # committed after the tag v1: on main, not at v1
BOW_TIE = {"type": "Polygon", "coordinates": [[[0, 0], [10, 10], [10, 0], [0, 10], [0, 0]]]}
OPEN_RING = {"type": "Polygon", "coordinates": [[[0, 0], [10, 0], [10, 10], [0, 10]]]}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FloeServer]:
    root = tmp_path_factory.mktemp("hostile") / "repo"
    repository = Repository.create(root, Settings())
    writer = repository.writer()
    writer.add_items([make_item(item_id, "c", cloud=float(n)) for n, item_id in enumerate(IDS)])
    writer.commit("forty")
    repository.tag("v1")
    writer = repository.writer()
    writer.add_items([make_item(item_id, "c", cloud=99.0) for item_id in LATE])
    writer.commit("two more")
    running = FloeServer(root)
    try:
        yield running
    finally:
        running.stop()


def answer(server: FloeServer, path: str, body: bytes | None = None, content_type: str = "application/json"):
    """(status, parsed JSON body) of one request; the server must still answer /conformance afterwards."""
    request = urllib.request.Request(server.url + path, data=body, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            status, text = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, text = error.code, error.read()
    assert server.process.poll() is None, f"the server died on {path[:80]}"
    with urllib.request.urlopen(server.url + "/conformance", timeout=30) as alive:
        assert alive.status == 200
    return status, json.loads(text) if text else None


def get_filter(server: FloeServer, text: str):
    return answer(server, "/search?" + urllib.parse.urlencode({"filter": text, "filter-lang": "cql2-text"}))


@pytest.mark.parametrize(
    ("what", "text"),
    [
        ("3,000 nested parentheses", "(" * 3000 + "id = 'i-1'" + ")" * 3000),
        ("6,000 NOTs", "NOT " * 6000 + "id = 'i-1'"),
    ],
)
def test_a_filter_too_deep_is_refused_before_parsing(server: FloeServer, what: str, text: str) -> None:
    for status, body in (
        get_filter(server, text),
        answer(server, "/search", json.dumps({"filter": text, "filter-lang": "cql2-text"}).encode()),
    ):
        assert status == 400, (what, body)
        assert body["code"] == "invalid-search"
        assert "nests" in body["description"]


def test_a_filter_too_long_is_refused_before_parsing(server: FloeServer) -> None:
    text = " OR ".join(f"id = 'x{n}'" for n in range(20_000))  # 300,000 characters: too long for a URL, so POSTed
    status, body = answer(server, "/search", json.dumps({"filter": text}).encode())
    assert status == 400, body
    assert "characters" in body["description"]


def test_a_cql2_json_filter_nested_thousands_deep_is_refused(server: FloeServer) -> None:
    # Written as text: Python's own json module cannot encode what it is meant to refuse.
    depth = 3000
    node = '{"op":"not","args":[' * depth + '{"op":"=","args":[{"property":"id"},"i-1"]}' + "]}" * depth
    status, body = answer(server, "/search", ('{"filter-lang":"cql2-json","filter":' + node + "}").encode())
    assert status == 400, body
    # In a URL too (shallower: a URL of this one's 130,000 characters is refused by the HTTP server itself).
    shallow = '{"op":"not","args":[' * 200 + '{"op":"=","args":[{"property":"id"},"i-1"]}' + "]}" * 200
    status, body = answer(server, "/search?" + urllib.parse.urlencode({"filter": shallow, "filter-lang": "cql2-json"}))
    assert status == 400, body
    assert body["code"] == "invalid-search"


def test_two_thousand_ored_ids_are_answered(server: FloeServer) -> None:
    text = " OR ".join(f"id = '{item_id}'" for item_id in [*IDS, *(f"missing-{n}" for n in range(1960))])
    status, body = answer(server, "/search", json.dumps({"filter": text, "limit": 100}).encode())
    assert status == 200, body
    assert sorted(feature["id"] for feature in body["features"]) == sorted(IDS)


def test_a_text_value_against_a_number_column_is_a_match_not_a_500(server: FloeServer) -> None:
    status, body = get_filter(server, "cloud = 'cloudy'")
    assert status == 200, body
    assert body["features"] == []


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"[1, 2, 3]", "application/json"),
        (b"true", "application/json"),
        (b'"text"', "application/json"),
        (b"3.5", "application/json"),
        (b"limit=10&collections=c", "application/x-www-form-urlencoded"),
        (b"\xff\xfe not json", "application/json"),
        (b"[" * 50_000 + b"]" * 50_000, "application/json"),
    ],
    ids=["array", "bool", "string", "float", "form", "bytes", "deep-array"],
)
def test_a_body_that_is_not_a_search_object_is_a_4xx(server: FloeServer, body: bytes, content_type: str) -> None:
    status, _ = answer(server, "/search", body, content_type)
    assert 400 <= status < 500


def test_a_body_beyond_the_limit_is_refused_unread(server: FloeServer) -> None:
    huge = b'{"ids": [' + b'"x",' * 2_000_000 + b'"x"]}'  # 8 MB, beyond the 4 MiB default
    status, body = answer(server, "/search", huge)
    assert status == 413, body
    assert body["code"] == "request-too-large"


def test_a_chunked_body_beyond_the_limit_is_cut_off(server: FloeServer) -> None:
    import http.client

    def chunks() -> Iterator[bytes]:
        yield b'{"ids": ['
        for _ in range(200):
            yield b'"x",' * 10_000  # 8 MB in all, with no Content-Length to refuse it by
        yield b'"x"]}'

    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    connection.request(
        "POST", "/search", body=chunks(), headers={"Content-Type": "application/json"}, encode_chunked=True
    )
    response = connection.getresponse()
    assert 400 <= response.status < 500, response.read()
    assert answer(server, "/conformance")[0] == 200


def _reason(body: object) -> str:
    """The reason an error answer gives: floe's description, or the framework's detail."""
    assert isinstance(body, dict), body
    return str(body.get("description") or body.get("detail") or "")


def _query(params: dict[str, object]) -> str:
    return "/search?" + urllib.parse.urlencode(params)


_WKT_OPEN = "S_INTERSECTS(geometry, POLYGON((0 0, 10 0, 10 10, 0 10)))"
_WKT_BOW_TIE = "S_INTERSECTS(geometry, POLYGON((0 0, 10 10, 10 0, 0 10, 0 0)))"
_ONE_ARGUMENT = json.dumps({"op": "=", "args": [{"property": "id"}]})

HOSTILE_GETS = {
    "limit 0": (_query({"limit": 0}), "limit"),
    "limit -1": (_query({"limit": -1}), "limit"),
    "limit text": (_query({"limit": "ten"}), "limit"),
    "bbox letters": (_query({"bbox": "a,b,c,d"}), "bbox"),
    "bbox 3 numbers": (_query({"bbox": "1,2,3"}), "bbox"),
    "bbox south above north": (_query({"bbox": "0,10,10,0"}), "bbox"),
    "cql2-text garbage": (_query({"filter": "id ==== 'x' AND ("}), "cql2-text"),
    "cql2-json not json": (_query({"filter": "{not json", "filter-lang": "cql2-json"}), "cql2-json"),
    "cql2-json unknown op": (_query({"filter": '{"op": "foo", "args": []}', "filter-lang": "cql2-json"}), "foo"),
    "one-argument =": (_query({"filter": _ONE_ARGUMENT, "filter-lang": "cql2-json"}), "takes 2 arguments"),
    "open WKT ring": (_query({"filter": _WKT_OPEN}), "closed"),
    "bow-tie WKT": (_query({"filter": _WKT_BOW_TIE}), "Self-intersection"),
    "unknown sortby": (_query({"sortby": "-nosuch"}), "nosuch"),
    "garbage datetime": (_query({"datetime": "yesterday"}), "datetime"),
    "random token": (_query({"token": "bm90IGEgdG9rZW4"}), "token"),
    "bow-tie intersects": (_query({"intersects": json.dumps(BOW_TIE)}), "Self-intersection"),
    "open-ring intersects": (_query({"intersects": json.dumps(OPEN_RING)}), "closed"),
    "intersects of no GeoJSON type": (_query({"intersects": '{"type": "Foo", "coordinates": [1, 2]}'}), "Foo"),
    "intersects not JSON": (_query({"intersects": "POINT(1 2)"}), "GeoJSON"),
    "intersects out of range": (_query({"intersects": '{"type": "Point", "coordinates": [500, 200]}'}), "outside"),
}


@pytest.mark.parametrize(("path", "word"), HOSTILE_GETS.values(), ids=HOSTILE_GETS.keys())
def test_hostile_get_parameters_are_a_400_with_the_reason(server: FloeServer, path: str, word: str) -> None:
    status, body = answer(server, path)
    assert status == 400, body
    assert word.lower() in _reason(body).lower(), body


HOSTILE_POSTS = {
    "limit 0": ({"limit": 0}, "limit"),
    "limit -1": ({"limit": -1}, "limit"),
    "bbox 3 numbers": ({"bbox": [1, 2, 3]}, "bbox"),
    "cql2-json unknown op": ({"filter": {"op": "foo", "args": []}, "filter-lang": "cql2-json"}, "foo"),
    "one-argument =": ({"filter": json.loads(_ONE_ARGUMENT), "filter-lang": "cql2-json"}, "takes 2 arguments"),
    "bow-tie WKT": ({"filter": _WKT_BOW_TIE, "filter-lang": "cql2-text"}, "Self-intersection"),
    "unknown sortby": ({"sortby": [{"field": "nosuch", "direction": "asc"}]}, "nosuch"),
    "garbage datetime": ({"datetime": "yesterday"}, "datetime"),
    "bow-tie intersects": ({"intersects": BOW_TIE}, "Self-intersection"),
    "intersects of no GeoJSON type": ({"intersects": {"type": "Foo", "coordinates": [1, 2]}}, "intersects"),
    "intersects open ring": ({"intersects": OPEN_RING}, "intersects"),
    "altered token": ({"token": "eyJzIjoiQUJDIiwicSI6IiIsImYiOjAsInIiOjAsImMiOiIwMDAwIn0"}, "altered"),
}


@pytest.mark.parametrize(("body", "word"), HOSTILE_POSTS.values(), ids=HOSTILE_POSTS.keys())
def test_hostile_post_bodies_are_a_400_with_the_reason(server: FloeServer, body: dict, word: str) -> None:
    status, answered = answer(server, "/search", json.dumps(body).encode())
    assert status == 400, answered
    assert word.lower() in _reason(answered).lower(), answered
    assert answered.get("code"), answered  # floe's form: a stable code and a description, not the body echoed


def test_a_filter_on_a_known_property_is_still_answered(server: FloeServer) -> None:
    # The same filters with the names right: the refusals above are about the names, not the forms.
    status, body = get_filter(
        server, "cloud < 3 AND S_INTERSECTS(geometry, POLYGON((-180 -90, 180 -90, 180 90, -180 90, -180 -90)))"
    )
    assert status == 200, body
    assert sorted(feature["id"] for feature in body["features"]) == ["i-0", "i-1", "i-2"]
    status, body = answer(
        server, "/search", json.dumps({"filter": "properties.cloud < 1 AND datetime IS NOT NULL"}).encode()
    )
    assert status == 200, body
    assert [feature["id"] for feature in body["features"]] == ["i-0"]


@pytest.mark.parametrize("limit", [10**9, 10**30])
def test_a_huge_limit_is_clamped_to_the_maximum_page(server: FloeServer, limit: int) -> None:
    # OGC API Features: a limit above the maximum "SHALL NOT result in an error"; the page stays bounded.
    for status, body in (
        answer(server, _query({"limit": limit})),
        answer(server, "/search", json.dumps({"limit": limit}).encode()),
    ):
        assert status == 200, body
        assert len(body["features"]) == len(IDS) + len(LATE)


def test_ten_thousand_ids_are_answered_exactly(server: FloeServer) -> None:
    ids = [*IDS[:5], *(f"m{n}" for n in range(9_995))]  # short ids: the GET URL stays under uvicorn's ~100 KB
    for status, body in (
        answer(server, "/search", json.dumps({"ids": ids, "limit": 100}).encode()),
        answer(server, _query({"ids": ",".join(ids), "limit": 100})),
    ):
        assert status == 200, body
        assert sorted(feature["id"] for feature in body["features"]) == sorted(IDS[:5])


def test_a_url_beyond_the_http_servers_limit_is_refused_and_the_server_answers_on(server: FloeServer) -> None:
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        connection.request("GET", _query({"ids": ",".join(f"missing-{n}" for n in range(10_000))}))
        # uvicorn answers 400 "Invalid HTTP request received." and closes; the client may see the reset instead.
        assert connection.getresponse().status == 400
    except (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected):
        pass
    assert server.process.poll() is None
    assert answer(server, "/conformance")[0] == 200


@pytest.mark.parametrize(
    "path",
    ["/refs/../search", "/refs/%2e%2e/search", "/refs/main/../x/search", "/refs/..%2f..%2fetc/search", "/refs/%00/"],
)
def test_ref_names_that_climb_are_not_found(server: FloeServer, path: str) -> None:
    status, body = answer(server, path)
    assert status == 404, body
    assert _reason(body)


def test_a_body_of_fifty_megabytes_is_refused_without_being_kept(server: FloeServer) -> None:
    import http.client

    import psutil

    size = 50 * 1024 * 1024
    process = psutil.Process(server.process.pid)

    def post() -> tuple[int, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        connection.putrequest("POST", "/search")
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Content-Length", str(size))
        connection.endheaders()
        block = b" " * (1024 * 1024)
        try:
            for _ in range(size // len(block)):
                connection.send(block)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer and close before the client has sent everything
        response = connection.getresponse()
        return response.status, response.read()

    assert post()[0] == 413  # once first, so what the answer itself costs is counted before measuring
    before = process.memory_info().rss
    status, text = post()
    assert status == 413, text
    assert json.loads(text)["code"] == "request-too-large"
    # The body is dropped as it arrives: the server holds a small part of it, never the 50 MB.
    assert process.memory_info().rss - before < 20 * 1024 * 1024
    assert answer(server, "/conformance")[0] == 200


def _page(server: FloeServer, path: str, body: dict | None = None) -> dict:
    status, answered = answer(server, path, json.dumps(body).encode() if body is not None else None)
    assert status == 200, answered
    return answered


def _next_token(page: dict) -> str:
    (link,) = [link for link in page["links"] if link["rel"] == "next"]
    return (
        link["body"]["token"]
        if "body" in link
        else urllib.parse.parse_qs(urllib.parse.urlsplit(link["href"]).query)["token"][0]
    )


def test_a_sorted_searchs_token_is_refused_by_an_unsorted_search_and_the_reverse(server: FloeServer) -> None:
    sorted_token = _next_token(_page(server, _query({"limit": 5, "sortby": "id"})))
    unsorted_token = _next_token(_page(server, _query({"limit": 5})))
    status, body = answer(server, _query({"limit": 5, "token": sorted_token}))
    assert status == 400 and "continues a sorted search" in _reason(body), body
    status, body = answer(server, _query({"limit": 5, "sortby": "id", "token": unsorted_token}))
    assert status == 400 and "continues an unsorted search" in _reason(body), body
    status, body = answer(server, "/search", json.dumps({"limit": 5, "token": sorted_token}).encode())
    assert status == 400 and "sorted" in _reason(body), body
    # Another sort order is another search too.
    status, body = answer(server, _query({"limit": 5, "sortby": "-id", "token": sorted_token}))
    assert status == 400 and "different search" in _reason(body), body


@pytest.mark.parametrize(
    "other",
    [
        {"filter": "cloud < 20"},
        {"collections": "c"},
        {"ids": "i-1,i-2"},
        {"bbox": "-180,-90,0,90"},
        {"datetime": "2024-01-01T00:00:00Z/.."},
    ],
    ids=["filter", "collections", "ids", "bbox", "datetime"],
)
def test_a_token_is_refused_by_a_search_with_other_parameters(server: FloeServer, other: dict) -> None:
    first = {"limit": 5, "filter": "cloud < 30"}
    token = _next_token(_page(server, _query(first)))
    status, body = answer(server, _query({**first, **other, "token": token}))
    assert status == 400, body
    assert "different search" in _reason(body), body


def test_a_token_continues_the_same_search_sent_by_get_or_post_with_any_page_size(server: FloeServer) -> None:
    first = _page(server, _query({"limit": 7, "filter": "cloud < 30", "sortby": "-cloud"}))
    token = _next_token(first)
    by_post = _page(
        server,
        "/search",
        {"limit": 3, "filter": "cloud < 30", "sortby": [{"field": "cloud", "direction": "desc"}], "token": token},
    )
    clouds = [feature["properties"]["cloud"] for feature in [*first["features"], *by_post["features"]]]
    assert clouds == [29.0 - n for n in range(10)]


def test_a_token_of_another_snapshot_is_refused_at_a_tag(server: FloeServer) -> None:
    main_page = _page(server, _query({"limit": 5}))
    tag_page = _page(server, "/refs/v1" + _query({"limit": 5}))
    main_token, tag_token = _next_token(main_page), _next_token(tag_page)
    status, body = answer(server, "/refs/v1" + _query({"limit": 5, "token": main_token}))
    assert status == 400 and "pages snapshot" in _reason(body), body
    # At the tag its own tokens page on; a branch follows the snapshot any token pins (it was the branch's once).
    assert _page(server, "/refs/v1" + _query({"limit": 5, "token": tag_token}))["features"]
    assert _page(server, _query({"limit": 5, "token": tag_token}))["features"]


def test_every_page_names_the_snapshot_it_was_read_at(server: FloeServer) -> None:
    import urllib.request

    with urllib.request.urlopen(server.url + _query({"limit": 5})) as first:
        main_snapshot = first.headers["Floe-Snapshot"]
        token = _next_token(json.loads(first.read()))
    with urllib.request.urlopen(server.url + "/refs/v1" + _query({"limit": 5})) as tagged:
        tag_snapshot = tagged.headers["Floe-Snapshot"]
    assert main_snapshot and tag_snapshot and main_snapshot != tag_snapshot
    with urllib.request.urlopen(server.url + _query({"limit": 5, "token": token})) as second:
        assert second.headers["Floe-Snapshot"] == main_snapshot
