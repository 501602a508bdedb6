"""A filter naming a property no item has: answered (the property is null in every item), as pgstac and
stac-api-validator expect, by default; refused with a 400 naming it under ``api.refuse_unknown_properties``;
``floe search`` answers and warns; an unknown collection is named with what the ref holds (issue 49, item 4)."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ingest import Repository, Settings
from ingest.api import SearchEngine, SearchRequest
from ingest.cli import app
from ingest.errors import InvalidSearch
from tests.api._servers import FloeServer
from tests.conftest import make_item

ITEMS = 12


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("unknown") / "repo"
    repository = Repository.create(root, Settings())
    writer = repository.writer()
    writer.add_items([make_item(f"i-{n}", "c", **{"eo:cloud_cover": float(n)}) for n in range(ITEMS)])
    writer.commit("items")
    return root


def ids(engine: SearchEngine, text: str) -> list[str]:
    page = engine.search(SearchRequest(filter=text, filter_lang="cql2-text", limit=100))
    return sorted(item["id"] for item in page.items)


def test_by_default_an_unknown_property_is_null_in_every_item(root):
    engine = SearchEngine(Repository.open(root, Settings()))
    assert ids(engine, "mission LIKE 'sentinel%'") == []
    assert ids(engine, "mission = 'x' OR eo:cloud_cover < 2") == ["i-0", "i-1"]
    assert len(ids(engine, "mission IS NULL")) == ITEMS
    assert engine.queryables(engine.resolve())["additionalProperties"] is True
    assert engine.unknown_properties(SearchRequest(filter="mission = 'x' AND eo:cloud_cover < 2")) == ["mission"]


def test_strictly_an_unknown_property_is_refused_by_name(root):
    engine = SearchEngine(Repository.open(root, Settings()), refuse_unknown_properties=True)
    with pytest.raises(InvalidSearch, match="'mission'"):
        ids(engine, "mission LIKE 'sentinel%'")
    assert ids(engine, "eo:cloud_cover < 1") == ["i-0"]
    assert engine.queryables(engine.resolve())["additionalProperties"] is False


@pytest.fixture(scope="module")
def servers(root: Path) -> Iterator[tuple[FloeServer, FloeServer]]:
    default = FloeServer(root)
    try:
        strict = FloeServer(root, env={"FLOE_API__REFUSE_UNKNOWN_PROPERTIES": "true"})
        try:
            yield default, strict
        finally:
            strict.stop()
    finally:
        default.stop()


def get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.slow
def test_the_server_answers_by_default_and_refuses_with_the_setting(servers):
    default, strict = servers
    query = "/search?" + urllib.parse.urlencode({"filter": "mission LIKE 'sentinel%'", "filter-lang": "cql2-text"})
    status, body = get(default.url + query)
    assert status == 200 and body["features"] == []
    status, body = get(strict.url + query)
    assert status == 400 and "mission" in body["description"], body
    # The query extension names properties too: the same rule.
    by_query = "/search?" + urllib.parse.urlencode({"query": json.dumps({"nosuch": {"lt": 3}})})
    assert get(default.url + by_query)[0] == 200
    status, body = get(strict.url + by_query)
    assert status == 400 and "nosuch" in body["description"], body
    assert get(default.url + "/queryables")[1]["additionalProperties"] is True
    assert get(strict.url + "/queryables")[1]["additionalProperties"] is False


def test_floe_search_answers_and_warns_naming_the_property(root):
    result = CliRunner().invoke(app, ["--root", str(root), "search", "--filter", "mission = 'x' OR eo:cloud_cover < 1"])
    assert result.exit_code == 0, result.output
    assert [json.loads(line)["id"] for line in result.stdout.splitlines() if line.startswith("{")] == ["i-0"]
    assert "warning" in result.stderr and "'mission'" in result.stderr
    assert "1 item\n" in result.stderr

    known = CliRunner().invoke(app, ["--root", str(root), "search", "--filter", "eo:cloud_cover < 1"])
    assert "warning" not in known.stderr


def test_floe_queryables_lists_what_a_filter_can_use(root):
    result = CliRunner().invoke(app, ["--root", str(root), "queryables"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["properties"]["eo:cloud_cover"] == {"type": "number"}
    assert "mission" not in document["properties"]


def test_an_unknown_collection_is_named_with_what_the_ref_holds_not_an_http_path(root):
    import ingest
    from ingest.errors import CollectionNotFound

    with pytest.raises(CollectionNotFound) as raised:
        ingest.open_search(str(root), collections=["sentinel-2"])
    said = str(raised.value)
    assert "'sentinel-2'" in said and "it holds 'c'" in said and "/collections" not in said
