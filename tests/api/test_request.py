"""Request parsing and the page token: what clients send, checked; tokens issued by earlier versions still decode."""

from __future__ import annotations

import base64
import enum
import json
from dataclasses import dataclass

import pytest
import shapely

from ingest.api import SortKey
from ingest.api._request import PageToken, bbox_geometry, checked_limit, parse_bbox, parse_sortby
from ingest.errors import InvalidSearch

# Tokens as the search engine issued them before PageToken existed (base64 of {"s", "f", "r"} and of {"s", "o"}).
POSITIONAL_TOKEN = "eyJzIjoiQUJDREVGMDEyMyIsImYiOjMsInIiOjE3fQ"
SORTED_TOKEN = "eyJzIjoiQUJDREVGMDEyMyIsIm8iOjQwfQ"


def test_tokens_issued_before_decode_to_the_same_positions() -> None:
    assert PageToken.decode(POSITIONAL_TOKEN) == PageToken("ABCDEF0123", file_index=3, row=17)
    assert PageToken.decode(SORTED_TOKEN) == PageToken("ABCDEF0123", offset=40)


def test_tokens_keep_their_wire_format() -> None:
    # The letters of the tokens issued before, plus the search's fingerprint (q) and a checksum (c).
    padded = PageToken("A", file_index=0, row=1, search="0123abcd").encode()
    assert "=" not in padded
    payload = json.loads(base64.urlsafe_b64decode(padded + "=" * (-len(padded) % 4)))
    assert {key: payload[key] for key in ("s", "f", "r", "q")} == {"s": "A", "f": 0, "r": 1, "q": "0123abcd"}
    assert set(payload) == {"s", "f", "r", "q", "c"}
    assert PageToken.decode(padded) == PageToken("A", file_index=0, row=1, search="0123abcd")
    sorted_token = PageToken("A", offset=40, search="0123abcd")
    assert PageToken.decode(sorted_token.encode()) == sorted_token


def test_an_altered_token_is_refused() -> None:
    token = PageToken("ABCDEF0123", file_index=3, row=17, search="0123abcd").encode()
    payload = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    for key, value in (("f", 4), ("r", 0), ("s", "ABCDEF0124"), ("q", "ffffffff")):
        with pytest.raises(InvalidSearch, match="not a token this server issued, or it was altered"):
            PageToken.decode(_encoded({**payload, key: value}))
    without_check = {key: value for key, value in payload.items() if key != "c"}
    with pytest.raises(InvalidSearch, match="altered"):
        PageToken.decode(_encoded(without_check))
    with pytest.raises(InvalidSearch, match="altered"):
        PageToken.decode(token[:-3])


def test_a_token_continues_only_the_search_that_issued_it() -> None:
    positional = PageToken("A", file_index=1, row=2, search="s1")
    in_order = PageToken("A", offset=10, search="s1")
    positional.check_continues("s1", [])
    in_order.check_continues("s1", [SortKey("id")])
    with pytest.raises(InvalidSearch, match="continues an unsorted search, and this search has a sortby"):
        positional.check_continues("s1", [SortKey("id")])
    with pytest.raises(InvalidSearch, match="continues a sorted search, and this search has no sortby"):
        in_order.check_continues("s1", [])
    with pytest.raises(InvalidSearch, match="continues a different search"):
        positional.check_continues("s2", [])
    # A token issued before tokens named their search still pages, and still knows whether it was sorted.
    legacy = PageToken.decode(SORTED_TOKEN)
    legacy.check_continues("anything", [SortKey("id")])
    with pytest.raises(InvalidSearch, match="continues a sorted search"):
        legacy.check_continues("anything", [])


def _encoded(payload: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "token",
    [
        "not-a-token",
        _encoded(["s", "f"]),
        _encoded({"f": 1, "r": 2}),
        _encoded({"s": 12}),
        _encoded({"s": "ABC", "f": "x"}),
        _encoded({"s": "ABC", "r": -1}),
        _encoded({"s": "ABC", "o": True}),
    ],
)
def test_tokens_this_server_did_not_issue_are_refused(token: str) -> None:
    with pytest.raises(InvalidSearch, match="not a token this server issued"):
        PageToken.decode(token)


def test_bbox_as_text_or_numbers() -> None:
    assert parse_bbox("0,1,2,3") == [0.0, 1.0, 2.0, 3.0]
    assert parse_bbox([0, 1, 10, 2, 3, 20]) == [0.0, 1.0, 10.0, 2.0, 3.0, 20.0]
    assert parse_bbox(None) is None and parse_bbox("") is None
    assert bbox_geometry([0.0, 1.0, 10.0, 2.0, 3.0, 20.0]).equals(shapely.box(0, 1, 2, 3))
    crossing = bbox_geometry([170.0, -10.0, -170.0, 10.0])
    assert crossing.equals(shapely.union(shapely.box(170, -10, 180, 10), shapely.box(-180, -10, -170, 10)))
    for bad, words in (("1,2,3", "4 or 6"), ("0,0,nan,1", "finite"), ("0,50,10,10", "south"), ("0,0,200,1", "outside")):
        with pytest.raises(InvalidSearch, match=words):
            parse_bbox(bad)


class _Direction(enum.Enum):
    desc = "desc"


@dataclass
class _PostedKey:
    field: str
    direction: _Direction


def test_sortby_in_every_form_a_client_sends() -> None:
    expected = [SortKey("datetime", descending=True), SortKey("eo:cloud_cover")]
    assert parse_sortby("-datetime,+properties.eo:cloud_cover") == expected
    assert parse_sortby(["-datetime", "eo:cloud_cover"]) == expected
    posted = [{"field": "datetime", "direction": "desc"}, {"field": "properties.eo:cloud_cover"}]
    assert parse_sortby(posted) == expected
    assert parse_sortby([_PostedKey("properties.datetime", _Direction.desc)]) == expected[:1]
    assert parse_sortby(None) == [] and parse_sortby("") == []
    with pytest.raises(InvalidSearch, match="asc or desc"):
        parse_sortby([{"field": "datetime", "direction": "up"}])
    with pytest.raises(InvalidSearch, match="names no field"):
        parse_sortby("-")


def test_limits() -> None:
    assert checked_limit(10, 100) == 10
    assert checked_limit(1000, 100) == 100
    with pytest.raises(InvalidSearch, match="exceeds the maximum of 100"):
        checked_limit(1000, 100, refuse_over_limit=True)
    for bad in (0, -1, True):
        with pytest.raises(InvalidSearch, match="positive integer"):
            checked_limit(bad, 100)
