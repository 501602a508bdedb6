"""Folders of an Azure container listed and read, as Planetary Computer's partitioned stac-geoparquet items are
(``https://pcstacitems.blob.core.windows.net/items/<collection>.parquet/``, a folder of part files).

tests/_blob_server.py answers Azure's List Blobs as it answers reads: refused without a SAS token of its own
token service (409 ``PublicAccessNotPermitted``), in pages of at most ``/__sas__/list-page`` blobs with a
``NextMarker`` while more remain.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import stac_geoparquet.arrow as sga
from typer.testing import CliRunner

from ingest import Repository
from ingest.cli import app
from ingest.config import RemoteSettings
from ingest.pipeline import SourceOptions, read_items
from ingest.remote import SasTokens
from ingest.remote._tokens import RENEW_BEFORE, blob_address
from tests.conftest import BlobServer, make_item

ACCOUNT = "pcstacitems"
PARTS = 3
ROWS = 4


def _remote(blob_server: BlobServer, *, service: bool = True) -> RemoteSettings:
    return RemoteSettings(
        sas_token_url=blob_server.token_service if service else None, blob_path_style=[blob_server.host], retries=0
    )


def _dataset(blob_server: BlobServer, container: str, name: str) -> list[Path]:
    """A partitioned stac-geoparquet dataset ``name`` (a folder of part files, beside a marker file that is not
    metadata) in ``container``; its parts."""
    folder = blob_server.folder / ACCOUNT / container / name
    folder.mkdir(parents=True, exist_ok=True)
    parts = []
    for part in range(PARTS):
        rows = [make_item(f"{name}-{part}-{n}", "pc", when=f"2024-0{part + 1}-0{n + 1}T00:00:00Z") for n in range(ROWS)]
        path = folder / f"part-{part:04d}.parquet"
        sga.to_parquet(pa.Table.from_batches(sga.parse_stac_items_to_arrow(rows)), path)
        parts.append(path)
    (folder / "_SUCCESS").write_bytes(b"")
    return parts


def _as_written(parts: list[Path]) -> dict[str, dict]:
    return {item["id"]: item for part in parts for item in sga.stac_table_to_items(pq.read_table(part))}


def test_a_partitioned_geoparquet_folder_is_listed_page_by_page_and_read_with_tokens(tmp_path, blob_server):
    parts = _dataset(blob_server, "items", "pc-a.parquet")
    url = f"{blob_server.url}/{ACCOUNT}/items/pc-a.parquet/"
    before = blob_server.stats()
    blob_server.set("list-page", 2)  # three parts and a marker: two pages, the second found by its NextMarker
    try:
        result = CliRunner().invoke(
            app,
            ["--root", str(tmp_path / "repo"), "ingest", url, "--workers", "0"],
            env={
                "FLOE_REMOTE__SAS_TOKEN_URL": blob_server.token_service,
                "FLOE_REMOTE__BLOB_PATH_STYLE": json.dumps([blob_server.host]),
            },
        )
    finally:
        blob_server.set("list-page", 5000)

    assert result.exit_code == 0, result.output
    rows = {row["id"]: row for row in Repository.open(tmp_path / "repo").view().items()}
    assert set(rows) == set(_as_written(parts)) and len(rows) == PARTS * ROWS
    after = blob_server.stats()
    assert after["listings"] - before["listings"] == 2
    assert after["reads"]["unsigned"] == before["reads"]["unsigned"]
    assert after["reads"]["refused"] == before["reads"]["refused"]
    assert after["issued"].get(f"{ACCOUNT}/items", 0) - before["issued"].get(f"{ACCOUNT}/items", 0) == 1
    for path in (tmp_path / "repo").rglob("*"):
        if path.is_file():
            assert b"sig=" not in path.read_bytes(), path


def test_a_dataset_named_without_its_slash_is_read_as_the_folder_it_is(blob_server):
    parts = _dataset(blob_server, "named", "pc-b.parquet")
    url = f"{blob_server.url}/{ACCOUNT}/named/pc-b.parquet"

    read = list(read_items([url], SourceOptions(remote=_remote(blob_server))))

    assert [entry.error for entry in read if entry.error] == []
    assert {entry.item["id"]: entry.item for entry in read} == _as_written(parts)
    assert read[0].source == f"{url}/part-0000.parquet#row0"

    missing = f"{blob_server.url}/{ACCOUNT}/named/pc-none.parquet"
    (failed,) = read_items([missing], SourceOptions(remote=_remote(blob_server)))
    assert failed.source == missing
    assert str(failed.error) == "no such object, nor a folder of STAC metadata files under it"


def test_a_folder_listed_without_a_token_is_refused_with_what_to_do(blob_server):
    _dataset(blob_server, "private", "pc-c.parquet")
    url = f"{blob_server.url}/{ACCOUNT}/private/pc-c.parquet/"

    (refused,) = read_items([url], SourceOptions(remote=_remote(blob_server, service=False)))

    assert refused.source == url
    assert str(refused.error).startswith("cannot be listed (")
    assert "PublicAccessNotPermitted" in str(refused.error) and "--planetary-computer" in str(refused.error)


def test_fsspec_azure_urls_are_refused_naming_the_url_to_give():
    (short,) = read_items(["abfs://items/sentinel-2-l2a.parquet"])
    assert "unsupported URL scheme 'abfs'" in str(short.error)
    assert "https://ACCOUNT.blob.core.windows.net/items/sentinel-2-l2a.parquet" in str(short.error)
    (full,) = read_items(["abfss://items@pcstacitems.dfs.core.windows.net/sentinel-2-l2a.parquet/"])
    assert "name it https://pcstacitems.blob.core.windows.net/items/sentinel-2-l2a.parquet/" in str(full.error)


def test_blob_addresses_of_both_styles():
    virtual = blob_address("https://pcstacitems.blob.core.windows.net/items/s2.parquet/part%201.parquet")
    assert virtual is not None
    assert (virtual.account, virtual.container, virtual.name) == ("pcstacitems", "items", "s2.parquet/part 1.parquet")
    assert virtual.url_of("s2.parquet/part 1.parquet") == (
        "https://pcstacitems.blob.core.windows.net/items/s2.parquet/part%201.parquet"
    )
    path_style = blob_address("http://127.0.0.1:9/acct/box/a/", ["127.0.0.1:9"])
    assert path_style is not None
    assert (path_style.endpoint, path_style.container, path_style.name) == ("http://127.0.0.1:9/acct", "box", "a/")
    for url in (
        "https://pcstacitems.blob.core.windows.net/items",  # no more than a container
        "https://pcstacitems.blob.core.windows.net/items/a?sig=x",  # a query of its own
        "http://127.0.0.1:9/acct/box/a",  # not a path-style host of the settings
        "https://PC_ITEMS.blob.core.windows.net/items/a",  # no account's name
        "s3://bucket/items/a",
    ):
        assert blob_address(url) is None, url


def test_obstores_credential_is_the_token_at_hand_said_to_expire_early(blob_server):
    (blob_server.folder / ACCOUNT / "provided").mkdir(parents=True, exist_ok=True)
    credential = SasTokens.of(_remote(blob_server)).provider(ACCOUNT, "provided")

    def issued() -> int:
        return blob_server.stats()["issued"].get(f"{ACCOUNT}/provided", 0)

    first = credential()
    assert credential() == first and issued() == 1
    assert "sig=" in first["sas_token"]
    left = first["expires_at"] - datetime.now(UTC)
    # obstore asks again when its credential expires: 5 minutes before the token does.
    assert 3600 - RENEW_BEFORE.total_seconds() - 60 < left.total_seconds() <= 3600 - RENEW_BEFORE.total_seconds()
