"""Sources named by URL (issue 13): s3:// on a real moto server, http:// from tests/_http_server.py, file://.

Every test ingests through ``ingest_items`` (or reads with ``read_items``)
and compares what arrives with what was put there; the failures are real
ones (a port nobody listens on, moto refusing a signature, a server that
never answers).
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pystac
import pytest
import stac_geoparquet.arrow as sga

from ingest import Repository
from ingest.config import S3Settings
from ingest.pipeline import SourceOptions, ingest_items, read_items
from ingest.pipeline.sources import RemoteReader
from ingest.remote import Buckets, Stores, Transport, join_url
from tests.conftest import GATE_BYTES, MotoServer, free_port, make_item

REPO_ROOT = Path(__file__).resolve().parents[2]


# -- helpers -------------------------------------------------------------------------------------
def _s3_client(moto_server: MotoServer, service: str = "s3"):
    return moto_server.client(service)


def _put(moto_server: MotoServer, bucket: str, key: str, body: bytes) -> str:
    _s3_client(moto_server).put_object(Bucket=bucket, Key=key, Body=body)
    return f"s3://{bucket}/{key}"


def _ndjson(items: list[dict]) -> bytes:
    return ("\n".join(json.dumps(item) for item in items) + "\n").encode()


def _ingest(repository: Repository, sources: list[str], s3: S3Settings | None = None):
    report = ingest_items(repository, sources, options=SourceOptions(s3=s3))
    return report


def _iam_key(moto_server: MotoServer, user: str) -> dict:
    """A new IAM user allowed every S3 action, and its access key (moto checks it once told to)."""
    iam = _s3_client(moto_server, "iam")
    iam.create_user(UserName=user)
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
    iam.put_user_policy(UserName=user, PolicyName="read", PolicyDocument=json.dumps(policy))
    return iam.create_access_key(UserName=user)["AccessKey"]


def _stored(repository: Repository) -> dict[str, dict]:
    return {item["id"]: item for item in repository.view("main").items()}


def _by_id(items: list[dict]) -> dict[str, dict]:
    return {item["id"]: item for item in items}


# -- s3:// ----------------------------------------------------------------------------------------
@pytest.mark.s3
def test_ndjson_feature_collection_and_geoparquet_on_s3_arrive_equal(moto_server, tmp_path):
    bucket = moto_server.create_bucket()
    lines = [make_item(f"line-{n}") for n in range(5)]
    features = [make_item(f"feature-{n}") for n in range(4)]
    rows = [make_item(f"row-{n}") for n in range(7)]
    parquet = tmp_path / "rows.parquet"
    # Batches of 3 rows, written as row groups of 3: the reader goes through several, labelling rows across them.
    table = pa.Table.from_batches(sga.parse_stac_items_to_arrow(rows))
    sga.to_parquet(pa.Table.from_batches(table.to_batches(max_chunksize=3)), parquet)
    assert pq.ParquetFile(parquet).num_row_groups == 3
    sources = [
        _put(moto_server, bucket, "in/items.ndjson", _ndjson(lines)),
        _put(
            moto_server,
            bucket,
            "in/features.geojson",
            json.dumps({"type": "FeatureCollection", "features": features}).encode(),
        ),
        _put(moto_server, bucket, "in/rows.parquet", parquet.read_bytes()),
    ]
    repository = Repository.create(tmp_path / "repo")
    report = _ingest(repository, sources, moto_server.s3_settings())
    assert report.rejected == []
    # stac_geoparquet writes datetimes its own way (microseconds): the rows as the file holds them.
    as_written = list(sga.stac_table_to_items(pq.read_table(parquet)))
    assert [item["id"] for item in as_written] == [item["id"] for item in rows]
    assert _stored(repository) == _by_id(lines + features + as_written)

    labels = [entry.source for entry in read_items(sources, SourceOptions(s3=moto_server.s3_settings()))]
    assert labels == [
        *(f"{sources[0]}:{n}" for n in range(1, 6)),
        *(f"{sources[1]}#features[{n}]" for n in range(4)),
        *(f"{sources[2]}#row{n}" for n in range(7)),
    ]


@pytest.mark.s3
def test_credentials_from_the_environment_alone(moto_server, tmp_path, monkeypatch):
    bucket = moto_server.create_bucket()
    items = [make_item(f"env-{n}") for n in range(3)]
    url = _put(moto_server, bucket, "env/items.ndjson", _ndjson(items))
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_ENDPOINT_URL": moto_server.endpoint,
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",  # obstore drops it once floe passes timeouts: floe must carry it over
    }.items():
        monkeypatch.setenv(name, value)
    repository = Repository.create(tmp_path / "repo")
    report = ingest_items(repository, [url])  # no settings: s3=None
    assert report.rejected == []
    assert _stored(repository) == _by_id(items)


@pytest.mark.s3
def test_a_static_catalog_on_s3_is_walked_and_relative_hrefs_become_urls(moto_server, tmp_path):
    bucket = moto_server.create_bucket()
    catalog = pystac.Catalog("root", "a catalog uploaded to S3")
    collection = pystac.Collection(
        "c",
        "a collection",
        pystac.Extent(
            pystac.SpatialExtent([[-180.0, -90.0, 180.0, 90.0]]),
            pystac.TemporalExtent([[pystac.utils.str_to_datetime("2024-01-01T00:00:00Z"), None]]),
        ),
    )
    catalog.add_child(collection)
    inputs = [make_item(f"cat-{n}") for n in range(3)]
    for item in inputs:
        item["stac_version"] = pystac.get_stac_version()  # pystac writes its own version
        item["assets"]["local"] = {"href": f"./{item['id']}-band.tif", "type": "image/tiff"}
        collection.add_item(pystac.Item.from_dict(item))
    folder = tmp_path / "catalog"
    catalog.normalize_hrefs(str(folder))
    catalog.save(pystac.CatalogType.SELF_CONTAINED)
    for path in sorted(folder.rglob("*.json")):
        _put(moto_server, bucket, f"stac/{path.relative_to(folder).as_posix()}", path.read_bytes())

    repository = Repository.create(tmp_path / "repo")
    report = _ingest(repository, [f"s3://{bucket}/stac/catalog.json"], moto_server.s3_settings())
    assert report.rejected == []
    assert "c" in repository.collections()
    stored = _stored(repository)
    assert set(stored) == {item["id"] for item in inputs}
    for item in inputs:
        here = f"s3://{bucket}/stac/c/{item['id']}/"
        expected_assets = {**item["assets"], "local": {"href": f"{here}{item['id']}-band.tif", "type": "image/tiff"}}
        assert stored[item["id"]]["assets"] == expected_assets
        without_links = {key: value for key, value in stored[item["id"]].items() if key not in ("links", "assets")}
        assert without_links == {key: value for key, value in item.items() if key not in ("links", "assets")}


@pytest.mark.s3
def test_a_catalog_link_that_fails_is_a_rejection_naming_the_link(moto_server, tmp_path):
    bucket = moto_server.create_bucket()
    catalog = pystac.Catalog("root", "one item link leads nowhere")
    for n in range(2):
        item = make_item(f"linked-{n}")
        item["stac_version"] = pystac.get_stac_version()
        catalog.add_item(pystac.Item.from_dict(item))
    folder = tmp_path / "catalog"
    catalog.normalize_hrefs(str(folder))
    catalog.save(pystac.CatalogType.SELF_CONTAINED)
    for path in sorted(folder.rglob("*.json")):
        if path.parent.name != "linked-1":  # uploaded without its second item
            _put(moto_server, bucket, f"stac/{path.relative_to(folder).as_posix()}", path.read_bytes())
    url = f"s3://{bucket}/stac/catalog.json"
    read = list(read_items([url], SourceOptions(s3=moto_server.s3_settings())))
    assert [(entry.source, entry.item["id"] if entry.item else str(entry.error)) for entry in read] == [
        (f"s3://{bucket}/stac/linked-0/linked-0.json", "linked-0"),
        (url, f"the catalog's link to s3://{bucket}/stac/linked-1/linked-1.json failed: no such object"),
    ]


@pytest.mark.s3
def test_a_folder_url_reads_its_metadata_files_in_key_order(moto_server, tmp_path):
    bucket = moto_server.create_bucket()
    first = [make_item(f"a-{n}") for n in range(3)]
    second = [make_item(f"b-{n}") for n in range(2)]
    _put(moto_server, bucket, "drop/2.ndjson", _ndjson(second))
    _put(moto_server, bucket, "drop/1.ndjson", _ndjson(first))
    _put(moto_server, bucket, "drop/raster.tif", b"II*\x00 not read: rasters in a folder URL are ignored")
    _put(moto_server, bucket, "drop-other/x.ndjson", _ndjson([make_item("not-under-the-prefix")]))
    folder = f"s3://{bucket}/drop/"
    read = list(read_items([folder], SourceOptions(s3=moto_server.s3_settings())))
    assert [entry.source for entry in read] == [
        *(f"s3://{bucket}/drop/1.ndjson:{n}" for n in range(1, 4)),
        *(f"s3://{bucket}/drop/2.ndjson:{n}" for n in range(1, 3)),
    ]
    repository = Repository.create(tmp_path / "repo")
    report = _ingest(repository, [folder], moto_server.s3_settings())
    assert report.rejected == []
    assert _stored(repository) == _by_id(first + second)


@pytest.mark.s3
def test_a_partitioned_geoparquet_dataset_is_read_by_its_name_without_the_slash(moto_server, tmp_path):
    bucket = moto_server.create_bucket()
    expected: list[dict] = []
    for part in range(2):
        path = tmp_path / f"part-{part}.parquet"
        rows = [make_item(f"part-{part}-{n}") for n in range(3)]
        sga.to_parquet(pa.Table.from_batches(sga.parse_stac_items_to_arrow(rows)), path)
        _put(moto_server, bucket, f"items/ds.parquet/part-{part}.parquet", path.read_bytes())
        expected += sga.stac_table_to_items(pq.read_table(path))
    name = f"s3://{bucket}/items/ds.parquet"

    read = list(read_items([name], SourceOptions(s3=moto_server.s3_settings())))

    assert [entry.item for entry in read] == expected
    assert read[-1].source == f"{name}/part-1.parquet#row2"


class _CountingProxy:
    """A TCP proxy on 127.0.0.1 in front of ``target`` that counts the connections open at once. Each
    connection's first bytes wait until ``gate`` connections are open (or a second has passed), so requests
    that are sent together are seen together however busy the machine is."""

    def __init__(self, target: int, gate: int) -> None:
        import socket

        self.port, self.target, self.gate = free_port(), target, gate
        self.open = self.peak = 0
        self._lock = threading.Condition()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket

        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            with self._lock:
                self.open += 1
                self.peak = max(self.peak, self.open)
                self._lock.notify_all()
            threading.Thread(target=self._pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    def _pipe(self, source, sink, counted: bool) -> None:
        with self._lock:
            self._lock.wait_for(lambda: self.open >= self.gate, timeout=1.0)
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            if counted:
                with self._lock:
                    self.open -= 1
            for end in (source, sink):
                end.close()

    def close(self) -> None:
        self._listener.close()


@pytest.mark.s3
def test_a_folder_of_item_documents_is_fetched_several_at_a_time_in_key_order(moto_server, tmp_path):
    """Each item JSON of a folder is a round trip: they go out together (FOLDER_READS), and arrive in key order
    with a bad one rejected in its place."""
    bucket = moto_server.create_bucket()
    items = [make_item(f"doc-{n:02d}") for n in range(24)]
    for item in items:
        _put(moto_server, bucket, f"docs/{item['id']}.json", json.dumps(item).encode())
    _put(moto_server, bucket, "docs/doc-05-broken.json", b"{not json")
    _put(moto_server, bucket, "docs/doc-10.ndjson", _ndjson([make_item("line-1"), make_item("line-2")]))
    proxy = _CountingProxy(moto_server.port, gate=4)
    try:
        s3 = moto_server.s3_settings().model_copy(update={"endpoint_url": f"http://127.0.0.1:{proxy.port}"})
        read = list(read_items([f"s3://{bucket}/docs/"], SourceOptions(s3=s3)))
    finally:
        proxy.close()
    assert proxy.peak >= 4
    labels = [entry.source.removeprefix(f"s3://{bucket}/docs/") for entry in read]
    keys = sorted([f"{item['id']}.json" for item in items] + ["doc-05-broken.json", "doc-10.ndjson"])
    at = keys.index("doc-10.ndjson")
    assert labels == [*keys[:at], "doc-10.ndjson:1", "doc-10.ndjson:2", *keys[at + 1 :]]
    broken = read[labels.index("doc-05-broken.json")]
    assert broken.item is None and "not valid JSON" in str(broken.error)
    assert [entry.item for entry in read if entry.item is not None and entry.item["id"].startswith("doc")] == items


@pytest.mark.s3
def test_relative_asset_hrefs_resolve_against_the_items_url(moto_server, tmp_path):
    bucket = moto_server.create_bucket()
    item = make_item("x")
    item["assets"] = {
        "data": {"href": "x.tif", "type": "image/tiff"},
        "thumbnail": {"href": "../thumbs/x.png", "type": "image/png"},
        "elsewhere": {"href": "https://example.com/x.json"},
    }
    url = _put(moto_server, bucket, "p/items/x.json", json.dumps(item).encode())
    repository = Repository.create(tmp_path / "repo")
    report = _ingest(repository, [url], moto_server.s3_settings())
    assert report.rejected == []
    (stored,) = _stored(repository).values()
    assert {key: asset["href"] for key, asset in stored["assets"].items()} == {
        "data": f"s3://{bucket}/p/items/x.tif",
        "thumbnail": f"s3://{bucket}/p/thumbs/x.png",
        "elsewhere": "https://example.com/x.json",
    }


# -- http:// --------------------------------------------------------------------------------------
def test_ndjson_and_json_over_http(http_server, tmp_path):
    lines = [make_item(f"web-line-{n}") for n in range(4)]
    feature = make_item("web-item")
    feature["assets"]["data"]["href"] = "data/web-item.tif"
    (http_server.folder / "web.ndjson").write_bytes(_ndjson(lines))
    (http_server.folder / "items").mkdir()
    (http_server.folder / "items" / "web-item.json").write_text(json.dumps(feature))
    sources = [f"{http_server.url}/web.ndjson", f"{http_server.url}/items/web-item.json"]
    repository = Repository.create(tmp_path / "repo")
    report = _ingest(repository, sources)
    assert report.rejected == []
    expected = {**feature, "assets": {"data": {**feature["assets"]["data"]}}}
    expected["assets"]["data"]["href"] = f"{http_server.url}/items/data/web-item.tif"
    assert _stored(repository) == _by_id([*lines, expected])


def test_geoparquet_over_http_is_read_with_range_requests(http_server):
    rows = [make_item(f"web-row-{n}") for n in range(5)]
    path = http_server.folder / "web-rows.parquet"
    sga.to_parquet(pa.Table.from_batches(sga.parse_stac_items_to_arrow(rows)), path)
    url = f"{http_server.url}/web-rows.parquet"
    read = list(read_items([url]))
    assert [entry.source for entry in read] == [f"{url}#row{n}" for n in range(5)]
    assert [entry.item for entry in read] == list(sga.stac_table_to_items(pq.read_table(path)))


def test_the_test_server_answers_ranges_heads_and_validators(http_server):
    (http_server.folder / "bytes.bin").write_bytes(bytes(range(100)))
    url = f"{http_server.url}/bytes.bin"

    def fetch(method: str = "GET", **headers: str):
        request = urllib.request.Request(url, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status, dict(answer.headers), answer.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read()

    status, headers, body = fetch(Range="bytes=10-19")
    assert (status, headers["Content-Range"], body) == (206, "bytes 10-19/100", bytes(range(10, 20)))
    assert fetch(Range="bytes=-5")[2] == bytes(range(95, 100))
    assert fetch(Range="bytes=90-")[2] == bytes(range(90, 100))
    status, headers, _ = fetch(Range="bytes=100-")
    assert (status, headers["Content-Range"]) == (416, "bytes */100")
    status, headers, body = fetch("HEAD")
    assert (status, headers["Content-Length"], body) == (200, "100", b"")
    assert headers["ETag"].startswith('"') and headers["Last-Modified"].endswith("GMT")
    assert fetch(**{"If-None-Match": headers["ETag"]})[0] == 304
    assert fetch(**{"If-Match": '"stale"'})[0] == 412


def test_heads_asked_for_together_overlap(http_server):
    # Each object answers only once 6 requests for it and its neighbours wait at the server together
    # (/__together__/6/): HEADs asked one after another would each get a 409, and no answer would be kept.
    from ingest.remote import head

    for index in range(6):
        (http_server.folder / f"together-{index}.tif").write_bytes(bytes(100 + index))
    urls = [f"{http_server.url}/__together__/6/together-{index}.tif" for index in range(6)]
    stores = Stores()
    stores.prefetch_heads(urls, concurrency=6)
    assert sorted(stores.heads) == sorted(urls)
    assert [head(stores, url)["size"] for url in urls] == [100 + index for index in range(6)]  # from memory


def test_ndjson_is_streamed_not_read_whole(http_server):
    """The first item arrives while the server still holds back everything past its gate."""
    items = [make_item(f"big-{n}", padding="x" * 900) for n in range(6000)]
    body = _ndjson(items)
    assert len(body) > 2 * GATE_BYTES
    (http_server.folder / "big.ndjson").write_bytes(body)
    http_server.get("__hold__")
    read = read_items([f"{http_server.url}/__gated__/big.ndjson"])
    first: list = []
    reader = threading.Thread(target=lambda: first.append(next(read)), daemon=True)
    reader.start()
    reader.join(timeout=60)  # only a broken reader waits this long: the gate never opens by itself
    try:
        assert first, "no item before the whole object was sent: the NDJSON was not streamed"
        assert first[0].item["id"] == "big-0"
        assert first[0].source == f"{http_server.url}/__gated__/big.ndjson:1"
        assert http_server.sent()["big.ndjson"] <= GATE_BYTES < len(body)
    finally:
        http_server.get("__release__")
    rest = list(read)
    assert [entry.item["id"] for entry in rest] == [f"big-{n}" for n in range(1, 6000)]
    assert http_server.sent()["big.ndjson"] == len(body)


@pytest.mark.slow
def test_a_server_that_never_answers_times_out(http_server):
    (http_server.folder / "slow.json").write_text(json.dumps(make_item("slow")))
    reader = RemoteReader(
        Stores(
            transport=Transport(
                read_timeout=timedelta(seconds=1), max_retries=1, initial_backoff=timedelta(milliseconds=10)
            )
        )
    )
    url = f"{http_server.url}/__stall__/slow.json"
    (rejected,) = reader.read(url)
    assert rejected.source == url
    assert str(rejected.error) == "timed out after 1 retry"


# -- errors ---------------------------------------------------------------------------------------
@pytest.mark.s3
def test_each_failure_is_a_rejection_naming_its_url_and_the_rest_ingests(moto_server, http_server, tmp_path):
    bucket = moto_server.create_bucket()
    good = [make_item(f"good-{n}") for n in range(3)]
    kept = [make_item(f"kept-{n}") for n in range(2)]
    truncated = _ndjson(kept) + json.dumps(make_item("cut"))[:40].encode()
    refused = f"http://127.0.0.1:{free_port()}/items.ndjson"
    (http_server.folder / "forbidden.ndjson").write_bytes(_ndjson([make_item("forbidden")]))
    sources = {
        "missing": f"s3://{bucket}/nothing/here.ndjson",
        "no bucket": f"s3://{bucket}-gone/items.json",
        "refused": refused,
        "forbidden": f"{http_server.url}/__status__/403/forbidden.ndjson",
        "truncated": _put(moto_server, bucket, "bad/truncated.ndjson", truncated),
        "not json": _put(moto_server, bucket, "bad/page.json", b"<html>an error page, not JSON</html>"),
        "scheme": "gs://bucket/items.json",
        "good": _put(moto_server, bucket, "good/items.ndjson", _ndjson(good)),
    }
    repository = Repository.create(tmp_path / "repo")
    report = _ingest(repository, list(sources.values()), moto_server.s3_settings())
    reasons = {rejection.source: rejection.reason for rejection in report.rejected}
    assert reasons == {
        sources["missing"]: "no such object",
        sources["no bucket"]: "no such bucket",
        refused: "connection refused after 4 retries: nothing listens at that address",
        sources["forbidden"]: "access denied (HTTP 403): check the credentials and what they may read",
        f"{sources['truncated']}:3": "not valid JSON (Unterminated string starting at column 37)",
        sources["not json"]: "not valid JSON (Expecting value at line 1, column 1)",
        sources["scheme"]: (
            "unsupported URL scheme 'gs': floe reads s3://, http://, https:// and file:// URLs (or local paths)"
        ),
    }
    assert _stored(repository) == _by_id(kept + good)


@pytest.mark.s3
def test_a_signature_moto_refuses_is_a_403_rejection(moto_server, http_server, tmp_path):
    bucket = moto_server.create_bucket()
    url = _put(moto_server, bucket, "private/items.ndjson", _ndjson([make_item("private")]))
    (http_server.folder / "public.ndjson").write_bytes(_ndjson([make_item("public")]))
    key = _iam_key(moto_server, f"reader-{bucket}")
    settings = moto_server.s3_settings()
    wrong_secret = settings.model_copy(
        update={"access_key_id": key["AccessKeyId"], "secret_access_key": key["SecretAccessKey"] + "x"}
    )
    right_secret = settings.model_copy(
        update={"access_key_id": key["AccessKeyId"], "secret_access_key": key["SecretAccessKey"]}
    )
    repository = Repository.create(tmp_path / "repo")
    with _moto_checks_signatures(moto_server):
        (accepted,) = read_items([url], SourceOptions(s3=right_secret))
        report = _ingest(repository, [url, f"{http_server.url}/public.ndjson"], wrong_secret)
    assert accepted.item["id"] == "private"
    assert [(rejection.source, rejection.reason) for rejection in report.rejected] == [
        (url, "access denied (HTTP 403, SignatureDoesNotMatch): check the credentials and what they may read")
    ]
    assert set(_stored(repository)) == {"public"}


class _moto_checks_signatures:
    """moto checks signatures and IAM policies only when told to (its own reset-auth switch), until the end."""

    def __init__(self, moto_server: MotoServer) -> None:
        self.endpoint = moto_server.endpoint
        self.previous = "inf"

    def _switch(self, count: str) -> str:
        request = urllib.request.Request(
            f"{self.endpoint}/moto-api/reset-auth",
            data=count.encode(),
            method="POST",
            headers={"Content-Type": "text/plain"},
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read())["PREVIOUS_INITIAL_NO_AUTH_ACTION_COUNT"]

    def __enter__(self) -> None:
        self.previous = self._switch("0")

    def __exit__(self, *_: object) -> None:
        self._switch(self.previous)


# -- file:// and URL joining ----------------------------------------------------------------------
def test_a_file_url_is_read_as_its_local_path(tmp_path):
    items = [make_item(f"local-{n}") for n in range(2)]
    path = tmp_path / "items.ndjson"
    path.write_bytes(_ndjson(items))
    read = list(read_items([f"file://{path}"]))
    assert [(entry.source, entry.item) for entry in read] == [(f"{path}:1", items[0]), (f"{path}:2", items[1])]
    (elsewhere,) = read_items(["file://otherhost/items.ndjson"])
    assert "names a file on this machine" in str(elsewhere.error)


@pytest.mark.parametrize(
    ("base", "href", "joined"),
    [
        ("s3://b/p/items/x.json", "x.tif", "s3://b/p/items/x.tif"),
        ("s3://b/p/items/x.json", "../t/x.png", "s3://b/p/t/x.png"),
        ("s3://b/p/items/x.json", "/root.tif", "s3://b/root.tif"),
        ("https://h/a/b.json", "./c.tif", "https://h/a/c.tif"),
    ],
)
def test_join_url_resolves_relative_hrefs_for_any_scheme(base, href, joined):
    assert join_url(base, href) == joined


def test_signed_urls_keep_their_query_on_every_request(http_server, tmp_path):
    from tests._http_server import SIGNATURE

    lines = [make_item(f"signed-line-{n}") for n in range(3)]
    (http_server.folder / "signed.ndjson").write_bytes(_ndjson(lines))
    (http_server.folder / "signed-item.json").write_text(json.dumps(make_item("signed-item")))
    signed = f"{http_server.url}/__signed__/signed.ndjson?sig={SIGNATURE}&expires=2099"
    single = f"{http_server.url}/__signed__/signed-item.json?sig={SIGNATURE}"
    forged = f"{http_server.url}/__signed__/signed.ndjson?sig=forged"
    repository = Repository.create(tmp_path / "repo")

    report = _ingest(repository, [signed, single, forged])

    # The query went with each request (the server refuses the object without it), and the forged one is a 403
    # rejection naming its URL.
    assert set(_stored(repository)) == {item["id"] for item in lines} | {"signed-item"}
    assert [(rejection.source, "HTTP 403" in rejection.reason) for rejection in report.rejected] == [(forged, True)]
    assert [entry.source for entry in read_items([signed])] == [f"{signed}:{n}" for n in range(1, 4)]


@pytest.mark.s3
def test_keys_and_region_come_from_an_aws_profile(moto_server, tmp_path, monkeypatch):
    bucket = moto_server.create_bucket()
    url = _put(moto_server, bucket, "profile/items.ndjson", _ndjson([make_item("from-profile")]))
    key = _iam_key(moto_server, f"profile-{bucket}")
    (tmp_path / "credentials").write_text(
        f"[reader]\naws_access_key_id = {key['AccessKeyId']}\naws_secret_access_key = {key['SecretAccessKey']}\n"
        f"[forged]\naws_access_key_id = {key['AccessKeyId']}\naws_secret_access_key = not-the-secret\n"
    )
    (tmp_path / "config").write_text("[profile reader]\nregion = eu-west-3\n[profile forged]\nregion = eu-west-3\n")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server.endpoint)
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")

    monkeypatch.setenv("AWS_PROFILE", "reader")
    store, _path = Stores(buckets=Buckets(find=False)).locate(url)
    assert store.config["region"] == "eu-west-3"
    # Where S3 names the bucket's own region (moto: us-east-1), that one is what signs.
    store, _path = Stores().locate(url)
    assert store.config["region"] == "us-east-1"
    with _moto_checks_signatures(moto_server):
        (read,) = read_items([url])
        monkeypatch.setenv("AWS_PROFILE", "forged")
        refused = _ingest(Repository.create(tmp_path / "repo"), [url])
    # Signed with the profile's keys (moto checked the signature), not anonymous, not the environment's.
    assert read.item["id"] == "from-profile"
    assert [(rejection.source, "HTTP 403" in rejection.reason) for rejection in refused.rejected] == [(url, True)]
