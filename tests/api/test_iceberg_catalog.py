"""The read-only Iceberg REST catalog of `floe serve` (``/iceberg/``), read by PyIceberg and DuckDB at every ref.

A real uvicorn server on 127.0.0.1 serves a repository with a tag (``v1``),
``main`` one commit past it, and a branch ``dev`` with an item of its own.
PyIceberg's ``RestCatalog`` and DuckDB's iceberg extension (``ATTACH ...
(TYPE iceberg, ENDPOINT ...)``, loaded from the pinned ``duckdb-extension-*``
wheels, no download) must read exactly the rows each ref holds.
"""

from __future__ import annotations

import importlib
import io
import json
from collections.abc import Iterator
from pathlib import Path

import duckdb
import httpx
import pytest
from pyiceberg.catalog import load_catalog
from typer.testing import CliRunner

from ingest import Repository, Settings
from ingest.api._iceberg import ENDPOINTS
from ingest.cli import app
from ingest.export import export_ndjson
from tests.api._servers import FloeServer
from tests.conftest import MotoServer, make_item

REFS = ("v1", "main", "dev")


class Catalog:
    def __init__(self, root: Path, server: FloeServer) -> None:
        self.root = root
        self.server = server
        self.uri = f"{server.url}/iceberg"
        self.http = httpx.Client(base_url=self.uri, timeout=60)

    def repository(self) -> Repository:
        return Repository.open(self.root, Settings())

    def ids(self, ref: str) -> list[str]:
        """What floe's own reader holds at ``ref`` (the expected answer)."""
        return sorted(item["id"] for item in self.repository().view(ref).items())

    def exported(self, ref: str) -> list[tuple[str, str, str | None]]:
        """(collection, id, platform) of every item `floe export` writes at ``ref``, sorted."""
        stream = io.StringIO()
        export_ndjson(self.repository().view(ref), stream)
        items = [json.loads(line) for line in stream.getvalue().splitlines()]
        return sorted((item["collection"], item["id"], item["properties"].get("platform")) for item in items)


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Catalog]:
    root = tmp_path_factory.mktemp("iceberg") / "repo"
    repository = Repository.create(root, Settings())
    writer = repository.writer()
    for item_id in ("a", "b", "c"):
        writer.add_item(make_item(item_id, "one", platform=f"p-{item_id}"))
    writer.commit("three items")
    repository.tag("v1")
    repository.branch("dev", "v1")
    writer = repository.writer("dev")
    writer.add_item(make_item("on-dev", "two"))
    writer.commit("an item on dev")
    writer = repository.writer()
    writer.add_item(make_item("d", "one"))
    writer.delete_item("one", "a")
    writer.commit("d in, a out")
    server = FloeServer(root)
    try:
        yield Catalog(root, server)
    finally:
        server.stop()


@pytest.mark.slow
def test_config_names_the_ref_and_only_read_endpoints(catalog: Catalog) -> None:
    for ref in (*REFS, catalog.repository().resolve("v1")):
        config = catalog.http.get("/v1/config", params={"warehouse": ref}).json()
        assert config["overrides"]["prefix"] == ref
        assert config["endpoints"] == ENDPOINTS
        assert all(endpoint.split()[0] in ("GET", "HEAD") for endpoint in config["endpoints"])
    assert catalog.http.get("/v1/config").json()["overrides"]["prefix"] == "main", "no warehouse: the default branch"
    unknown = catalog.http.get("/v1/config", params={"warehouse": "nope"})
    assert unknown.status_code == 400
    assert unknown.json()["error"]["type"] == "BadRequestException" and "nope" in unknown.json()["error"]["message"]


def test_pyiceberg_reads_the_table_at_every_ref(catalog: Catalog) -> None:
    snapshot = catalog.repository().resolve("v1")
    for ref in (*REFS, snapshot):
        rest = load_catalog(f"floe-{ref}", type="rest", uri=catalog.uri, warehouse=ref)
        assert rest.list_namespaces() == [("floe",)]
        assert rest.list_tables("floe") == [("floe", "items")]
        assert rest.table_exists("floe.items") and not rest.table_exists("floe.other")
        table = rest.load_table("floe.items")
        repository = catalog.repository()
        assert table.metadata_location == repository.metadata_location_of(repository.resolve(ref))
        rows = table.scan(selected_fields=("id", "collection", "platform")).to_arrow()
        read = zip(*(rows.column(name).to_pylist() for name in ("collection", "id", "platform")), strict=True)
        assert sorted(read) == catalog.exported(ref), f"the catalog's {ref} is not what floe export gives"
        # DuckDB on the Arrow PyIceberg returns, as a data engineer would use both.
        counts = duckdb.sql("SELECT collection, count(*) FROM rows GROUP BY collection ORDER BY 1").fetchall()
        expected = sorted({(item["collection"]) for item in repository.view(ref).items()})
        assert [collection for collection, _ in counts] == expected
    assert catalog.ids("v1") == ["a", "b", "c"] and catalog.ids("main") == ["b", "c", "d"]
    assert "on-dev" in catalog.ids("dev")


def _duckdb_with_iceberg(directory: Path) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with the iceberg extension installed from the pinned wheels (not downloaded)."""
    connection = duckdb.connect(config={"extension_directory": str(directory)})
    for name in ("avro", "httpfs", "iceberg"):
        module = importlib.import_module(f"duckdb_extension_{name}")
        (binary,) = Path(module.__file__ or "").parent.rglob(f"{name}.duckdb_extension")
        connection.execute(f"INSTALL '{binary}'")
    connection.execute("LOAD iceberg")
    return connection


def test_duckdb_attaches_the_catalog_and_scans_a_location(catalog: Catalog, tmp_path: Path) -> None:
    connection = _duckdb_with_iceberg(tmp_path)
    for ref in REFS:
        connection.execute(
            f"ATTACH '{ref}' AS at_{ref} (TYPE iceberg, ENDPOINT '{catalog.uri}', AUTHORIZATION_TYPE 'none')"
        )
        ids = [row[0] for row in connection.execute(f"SELECT id FROM at_{ref}.floe.items ORDER BY id").fetchall()]
        assert ids == catalog.ids(ref), ref
    # `floe table-location` names the metadata.json that iceberg_scan reads.
    printed = CliRunner().invoke(app, ["--root", str(catalog.root), "table-location", "--ref", "v1"])
    assert printed.exit_code == 0, printed.output
    location = printed.stdout.strip()
    assert location == catalog.repository().metadata_location_of(catalog.repository().resolve("v1"))
    ids = connection.execute(f"SELECT id FROM iceberg_scan('{location}') ORDER BY id").fetchall()
    assert [row[0] for row in ids] == catalog.ids("v1")


def test_load_table_etag_is_the_snapshot_and_moves_with_the_branch(catalog: Catalog) -> None:
    path = "/v1/main/namespaces/floe/tables/items"
    first = catalog.http.get(path)
    etag = first.headers["ETag"]
    assert etag == f'"{catalog.repository().resolve("main")}"'
    unchanged = catalog.http.get(path, headers={"If-None-Match": etag})
    assert unchanged.status_code == 304 and not unchanged.content
    assert catalog.http.head(path).status_code == 200
    # A tag's answer never changes; main's does once a commit lands.
    tag_etag = catalog.http.get("/v1/v1/namespaces/floe/tables/items").headers["ETag"]
    writer = catalog.repository().writer()
    writer.add_item(make_item("e", "one"))
    writer.commit("e")
    moved = catalog.http.get(path, headers={"If-None-Match": etag})
    assert moved.status_code == 200 and moved.headers["ETag"] != etag
    assert moved.json()["metadata-location"] != first.json()["metadata-location"]
    tag_again = catalog.http.get("/v1/v1/namespaces/floe/tables/items", headers={"If-None-Match": tag_etag})
    assert tag_again.status_code == 304


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/main/namespaces"),
        ("DELETE", "/v1/main/namespaces/floe"),
        ("POST", "/v1/main/namespaces/floe/tables"),
        ("POST", "/v1/main/namespaces/floe/tables/items"),
        ("DELETE", "/v1/main/namespaces/floe/tables/items"),
        ("POST", "/v1/main/tables/rename"),
        ("POST", "/v1/main/transactions/commit"),
    ],
)
def test_writes_are_refused_and_change_nothing(catalog: Catalog, method: str, path: str) -> None:
    before = catalog.repository().resolve("main")
    answer = catalog.http.request(method, path, json={})
    assert answer.status_code == 405, answer.text
    error = answer.json()["error"]
    assert error["code"] == 405 and "read only" in error["message"]
    assert catalog.repository().resolve("main") == before


def test_unknown_names_answer_the_protocols_errors(catalog: Catalog) -> None:
    cases = {
        "/v1/nope/namespaces": "NoSuchWarehouseException",
        "/v1/main/namespaces/other": "NoSuchNamespaceException",
        "/v1/main/namespaces/other/tables": "NoSuchNamespaceException",
        "/v1/main/namespaces/floe/tables/other": "NoSuchTableException",
        "/v1/main/namespaces/floe/views": "NotFoundException",
    }
    for path, kind in cases.items():
        answer = catalog.http.get(path)
        assert answer.status_code == 404 and answer.json()["error"]["type"] == kind, (path, answer.text)


@pytest.mark.s3
def test_a_repository_on_s3_is_read_with_the_clients_own_credentials(
    moto_server: MotoServer, s3_root: str, s3_settings: Settings, tmp_path: Path
) -> None:
    """The catalog hands out the endpoint and region of an S3 repository, never its credentials: PyIceberg reads
    the table with keys of its own."""
    repository = Repository.create(s3_root, s3_settings)
    writer = repository.writer()
    for item_id in ("s3-a", "s3-b"):
        writer.add_item(make_item(item_id, "one"))
    writer.commit("two items on S3")
    repository.tag("v1")
    env = {f"FLOE_S3__{key.upper()}": str(value) for key, value in s3_settings.s3.model_dump().items() if value}
    server = FloeServer(s3_root, env=env, log_dir=tmp_path)
    try:
        answer = httpx.get(f"{server.url}/iceberg/v1/v1/namespaces/floe/tables/items").json()
        assert answer["metadata-location"].startswith(s3_root.rstrip("/") + "/")
        assert answer["config"] == {
            "s3.endpoint": moto_server.endpoint,
            "s3.region": "us-east-1",
            "s3.force-virtual-addressing": "false",
        }
        assert "testing" not in json.dumps(answer["config"]), "the catalog handed out credentials"
        uri = f"{server.url}/iceberg"
        keys = {"s3.access-key-id": "testing", "s3.secret-access-key": "testing"}
        table = load_catalog("s3-v1", type="rest", uri=uri, warehouse="v1", **keys).load_table("floe.items")
        assert sorted(table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()) == ["s3-a", "s3-b"]
    finally:
        server.stop()
