"""Hostile requests to a real `floe serve`: each gets a 4xx that says why, and the server answers the next one.

One request used to take the whole service down: a filter nested a few thousand deep overflowed the native
stack of the CQL2 parser and killed the process (issue 14).
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


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FloeServer]:
    root = tmp_path_factory.mktemp("hostile") / "repo"
    repository = Repository.create(root, Settings())
    writer = repository.writer()
    writer.add_items([make_item(item_id, "c", cloud=float(n)) for n, item_id in enumerate(IDS)])
    writer.commit("forty")
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
