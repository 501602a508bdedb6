"""A search of a repository on object storage, from a fresh engine, counted at the store (moto behind a proxy that
notes every request): no object of the table is asked its size (no HEAD), a small data file is read whole in one
GET, a larger one by its footer and coalesced ranges of column chunks, and a table version's metadata.json is
read once."""

from __future__ import annotations

from collections import Counter

import pytest

import ingest.repository._read as table_reads
from ingest import Repository, Settings
from ingest.api import SearchEngine, SearchRequest
from ingest.api._cache import ColumnCache
from tests.conftest import make_item, with_square

pytestmark = pytest.mark.s3

BATCHES = 6
PER_BATCH = 12


@pytest.fixture
def proxied(moto_server, signature_proxy):
    """A repository of ``BATCHES`` commits (a data file each per collection), reached through the proxy."""
    settings = Settings(s3=signature_proxy.s3_settings(moto_server))
    root = f"s3://{moto_server.create_bucket()}/repo"
    repository = Repository.create(root, settings)
    for batch in range(BATCHES):
        writer = repository.writer()
        for number in range(PER_BATCH):
            item = make_item(f"b{batch}-{number}", f"c{number % 2}", when=f"2024-0{batch % 3 + 1}-05T00:00:00Z")
            writer.add_item(with_square(item, number * 2.0, batch * 2.0, 1.0))
        writer.commit(f"batch {batch}")
    return root, settings, signature_proxy


def made_by(proxy, search) -> tuple[object, list[tuple[str, str]]]:
    """What ``search()`` returned, and the (method, path) of each request it made."""
    before = len(proxy.requests())
    result = search()
    return result, [(method, path.split("?")[0]) for method, path, _ in proxy.requests()[before:]]


def table_requests(requests: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(method, path) for method, path in requests if "/tables/" in path]


def test_a_cold_search_asks_no_size_reads_small_files_whole_and_each_table_version_once(proxied):
    root, settings, proxy = proxied
    wanted = ["b0-3", "b2-7", "b5-11", "b4-0"]

    page, requests = made_by(
        proxy, lambda: SearchEngine(Repository.open(root, settings)).search(SearchRequest(ids=wanted, limit=10))
    )
    assert sorted(item["id"] for item in page.items) == sorted(wanted)
    table = table_requests(requests)
    # Sizes come from the manifests (data files) or are not needed (metadata is read whole, in one GET).
    assert not [request for request in table if request[0] == "HEAD"], table
    for suffix in (".metadata.json", ".avro"):
        assert [path for _, path in table if path.endswith(suffix)], table
    metadata = Counter(path for method, path in requests if method == "GET" and path.endswith(".metadata.json"))
    assert set(metadata.values()) == {1}, metadata  # opening checks it, the search uses it: one read

    # The id sketches beside the manifests name the files and rows: each sketch is read once, and only the files
    # holding a wanted id are read (each small, whole, once), not every file's ids.
    sketches = Counter(path for _, path in table if path.endswith(".ids.parquet"))
    manifests = {path for _, path in table if path.endswith(".avro") and "/snap-" not in path}
    assert len(sketches) == len(manifests) and set(sketches.values()) == {1}, sketches
    data = Counter(path for _, path in table if path.endswith(".parquet") and not path.endswith(".ids.parquet"))
    assert len(data) == len(wanted)  # four ids of four batches, each batch's id in one file
    assert set(data.values()) == {1}, data


def test_a_cold_area_search_reads_footer_and_rows_of_each_larger_candidate_once(proxied, monkeypatch):
    root, settings, proxy = proxied
    monkeypatch.setattr(table_reads, "WHOLE_FILE_BYTES", 0)  # every file is "large": read by its parts
    request = SearchRequest(bbox=[0.0, 0.0, 6.5, 80.0], limit=100)  # the first four squares of every batch

    page, requests = made_by(proxy, lambda: SearchEngine(Repository.open(root, settings)).search(request))
    assert len(page.items) == BATCHES * 4
    data = Counter(request for request in table_requests(requests) if request[1].endswith(".parquet"))
    assert not [key for key in data if key[0] == "HEAD"], data
    # A footer, then the filter columns and the rows of the matches: at most three reads a file, however many
    # columns the rows have.
    assert max(data.values()) <= 3, data
    assert min(data.values()) >= 2, data  # read by parts, not whole


def test_files_read_whole_are_kept_within_a_quarter_of_the_cache_budget(proxied):
    root, settings, proxy = proxied
    repository = Repository.open(root, settings)
    engine = SearchEngine(repository)
    files = engine.state(engine.resolve()).files
    sizes = sorted(data_file.file_size_in_bytes for data_file in files)
    budget = 4 * (sizes[-1] + sizes[-2])  # room for the two largest files' bytes, not for all of them
    cache = ColumnCache(repository.io, budget)
    cache.know(files)

    before = len(proxy.requests())
    for data_file in files:
        assert cache.layout(data_file.file_path).fragment.buffer is not None  # read whole
    held = [data_file for data_file in files if data_file.file_path in cache._layouts]
    assert 1 <= len(held) < len(files)
    assert sum(data_file.file_size_in_bytes for data_file in held) <= budget // 4
    # The newest stay; one dropped is read whole again when next needed, in one GET.
    assert files[-1].file_path in cache._layouts and files[0].file_path not in cache._layouts
    cache.layout(files[0].file_path)
    gets = [path for method, path, _ in proxy.requests()[before:] if method == "GET"]
    assert len(gets) == len(files) + 1


def stored_keys(moto_server, root: str) -> set[str]:
    """The keys under ``root``'s bucket now (listed at moto directly, not through the counting proxy)."""
    bucket = root.removeprefix("s3://").split("/")[0]
    pages = moto_server.client().get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return {f"/{bucket}/{entry['Key']}" for page in pages for entry in page.get("Contents", [])}


def test_a_commit_between_two_searches_costs_the_second_only_the_objects_it_added(proxied, moto_server):
    root, settings, proxy = proxied
    repository = Repository.open(root, settings)
    engine = SearchEngine(repository)
    request = SearchRequest(bbox=[0.0, 0.0, 80.0, 80.0], limit=1000)
    by_ids = SearchRequest(ids=["b0-1", "b5-2", "late-3"], limit=10)
    first, _ = made_by(proxy, lambda: engine.search(request))
    assert len(first.items) == BATCHES * PER_BATCH
    assert sorted(item["id"] for item in engine.search(by_ids).items) == ["b0-1", "b5-2"]

    before = stored_keys(moto_server, root)
    writer = Repository.open(root, settings).writer()
    for number in range(PER_BATCH):
        writer.add_item(with_square(make_item(f"late-{number}", f"c{number % 2}"), number * 2.0, 0.0, 1.0))
    writer.commit("a late batch")
    added = stored_keys(moto_server, root) - before
    assert any("/data/" in key for key in added)

    (second, again), requests = made_by(proxy, lambda: (engine.search(request), engine.search(by_ids)))
    assert len(second.items) == BATCHES * PER_BATCH + PER_BATCH
    assert sorted(item["id"] for item in again.items) == ["b0-1", "b5-2", "late-3"]
    assert any(path.endswith(".ids.parquet") for path in added)  # the new manifest's sketch, read as new
    paths = {path.replace("%3D", "=") for _, path in requests}
    # Learning the branch's tip reads Icechunk's repo object (the one mutable object); everything else read is new.
    old = {path for path in paths - added if not path.endswith("/arrays/repo")}
    assert not old, sorted(old)
    assert {path for path in paths if "/tables/" in path} <= added
    assert [path for path in paths if "/data/" in path], paths  # the new rows were read, from new files


def test_a_sorted_search_reads_only_the_newest_files_even_where_every_file_has_overflow(moto_server, signature_proxy):
    """Files keep a filtered property in floe:overflow, so each file's test depends on its overflow: that column
    is read with the file, when the file's turn comes, not for every candidate before the first is read."""
    settings = Settings(s3=signature_proxy.s3_settings(moto_server))
    root = f"s3://{moto_server.create_bucket()}/repo"
    repository = Repository.create(root, settings)
    for month in range(1, 10):
        writer = repository.writer()
        for number in range(8):
            # "note" is a text column (the first month types it), a number in one row of each later file: that
            # row keeps it in floe:overflow.
            note: object = 7 if number == 0 and month > 1 else f"n{number}"
            item = make_item(f"m{month}-{number}", "c", when=f"2024-0{month}-0{number + 1}T00:00:00Z", note=note)
            writer.add_item(with_square(item, number * 2.0, month * 2.0, 1.0))
        writer.commit(f"month {month}")
    request = SearchRequest(
        filter={"op": "<", "args": [{"property": "note"}, "n9"]},
        filter_lang="cql2-json",
        sortby=[{"field": "datetime", "direction": "desc"}],
        limit=3,
    )
    engine = SearchEngine(Repository.open(root, settings))
    page, requests = made_by(signature_proxy, lambda: engine.search(request))
    assert [item["id"] for item in page.items] == ["m9-7", "m9-6", "m9-5"]
    data = {path for _, path in table_requests(requests) if "/data/" in path}
    assert 1 <= len(data) <= 3, sorted(data)  # the newest months' files, of nine
