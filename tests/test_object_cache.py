"""Objects' bytes kept by URL (``ingest/remote/_object_cache.py``): in memory what a FileIO wrote, on disk what any
process sharing a directory read; counted at the store, a kept object costs no request."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ingest import Repository, Settings
from ingest.api import SearchEngine, SearchRequest
from ingest.remote import DiskCache, KeptBytes, ObjectFileIO
from ingest.storage import Location
from tests.conftest import make_item, with_square


def test_kept_bytes_hold_the_most_recently_used_within_their_budget():
    kept = KeptBytes(10)
    kept.keep("s3://b/a", b"aaaaa")
    kept.keep("s3://b/b", b"bbbbb")
    assert kept.get("s3://b/a") == b"aaaaa"  # used: now the most recent
    kept.keep("s3://b/c", b"ccc")
    assert kept.get("s3://b/b") is None
    assert kept.get("s3://b/a") == b"aaaaa" and kept.get("s3://b/c") == b"ccc"
    kept.keep("s3://b/big", b"x" * 11)  # more than the whole budget: not kept, nothing dropped for it
    assert kept.get("s3://b/big") is None and kept.get("s3://b/a") == b"aaaaa"


def test_a_disk_cache_is_shared_by_every_process_naming_its_directory(tmp_path):
    DiskCache(tmp_path, 1 << 20).keep("s3://bucket/m0.avro", b"manifest bytes")
    read = "import sys; from ingest.remote import DiskCache; sys.stdout.buffer.write(DiskCache(sys.argv[1], 1 << 20)"
    done = subprocess.run(
        [sys.executable, "-c", f"{read}.get('s3://bucket/m0.avro'))", str(tmp_path)],
        capture_output=True,
        check=True,
    )
    assert done.stdout == b"manifest bytes"


def test_a_damaged_or_misplaced_entry_is_dropped_never_returned(tmp_path):
    cache = DiskCache(tmp_path, 1 << 20)
    cache.keep("s3://bucket/one.avro", b"first")
    entry = next(path for path in tmp_path.rglob("*") if path.is_file())
    entry.write_bytes(entry.read_bytes()[:-2])  # cut short (a disk that filled, a copy that stopped)
    assert cache.get("s3://bucket/one.avro") is None
    assert not entry.exists()

    cache.keep("s3://bucket/two.avro", b"second")
    misplaced = next(path for path in tmp_path.rglob("*") if path.is_file())
    misplaced.rename(entry)  # another URL's entry under this URL's name
    assert cache.get("s3://bucket/one.avro") is None
    assert cache.get("s3://bucket/two.avro") is None  # and its own name holds nothing any more


def test_the_directory_is_trimmed_to_its_budget_least_recently_used_first(tmp_path):
    cache = DiskCache(tmp_path, 2000)
    urls = [f"s3://bucket/file-{number}.avro" for number in range(7)]
    for when, url in enumerate(urls[:5], start=1):
        cache.keep(url, bytes(300))
        entry = cache._path(url)
        os.utime(entry, (when, when))  # used in this order, long ago
    assert cache.get(urls[0]) == bytes(300)  # used now: the most recent
    cache.keep(urls[5], bytes(300))
    cache.keep(urls[6], bytes(300))
    cache.trim()
    held = [path for path in tmp_path.rglob("*") if path.is_file()]
    assert sum(path.stat().st_size for path in held) <= 2000
    assert cache.get(urls[0]) is not None and cache.get(urls[6]) is not None
    assert cache.get(urls[1]) is None and cache.get(urls[2]) is None  # the least recently used went


def store_requests(proxy, since: int) -> list[tuple[str, str]]:
    return [(method, path.split("?")[0].rsplit("/", 1)[-1]) for method, path, _ in proxy.requests()[since:]]


@pytest.mark.s3
def test_table_metadata_a_file_io_wrote_is_read_back_without_a_request(moto_server, signature_proxy):
    settings = Settings(s3=signature_proxy.s3_settings(moto_server))
    root = f"s3://{moto_server.create_bucket()}/repo"
    io = Location.parse(root, settings).file_io()
    assert isinstance(io, ObjectFileIO)
    version, data = f"{root}/tables/items/metadata/00001-a.metadata.json", f"{root}/tables/items/data/part.parquet"
    for location in (version, data):
        with io.new_output(location).create() as stream:
            stream.write(b"bytes of " + location.encode())

    before = len(signature_proxy.requests())
    assert io.get(version) == b"bytes of " + version.encode()
    assert io.get(data) == b"bytes of " + data.encode()
    # The metadata is the writer's next base; a data file is read by searches, not by its writer: not kept.
    assert store_requests(signature_proxy, before) == [("GET", "part.parquet")]

    # Inside a block of writes sent together, a file written is read from what waits to be sent.
    pending = f"{root}/tables/items/metadata/m1.avro"
    with io.writes_together():
        with io.new_output(pending).create() as stream:
            stream.write(b"pending manifest")
        assert io.get(pending) == b"pending manifest"
        assert not io.new_input(pending).exists()


@pytest.mark.s3
def test_an_object_read_once_is_read_from_the_disk_by_the_next_process(moto_server, signature_proxy, tmp_path):
    settings = Settings(s3=signature_proxy.s3_settings(moto_server))
    root = f"s3://{moto_server.create_bucket()}/repo"
    repository = Repository.create(root, settings)
    for batch in range(3):
        writer = repository.writer()
        for number in range(4):
            writer.add_item(with_square(make_item(f"b{batch}-{number}", "c"), number * 2.0, batch * 2.0, 1.0))
        writer.commit(f"batch {batch}")
    cached = settings.model_copy(deep=True)
    cached.api.cache_dir = str(tmp_path / "cache")
    request = SearchRequest(bbox=[0.0, 0.0, 8.0, 8.0], limit=100)

    def table_gets(since: int) -> list[str]:
        return [name for method, name in store_requests(signature_proxy, since) if method == "GET"]

    first_start = len(signature_proxy.requests())
    first = SearchEngine(Repository.open(root, cached)).search(request)
    read_from_store = [path for path in signature_proxy.requests()[first_start:] if "/tables/" in path[1]]
    assert read_from_store  # the first process reads the table from the store ...
    second_start = len(signature_proxy.requests())
    second = SearchEngine(Repository.open(root, cached)).search(request)
    assert sorted(item["id"] for item in second.items) == sorted(item["id"] for item in first.items)
    assert len(first.items) == 12
    again = [path for _, path, _ in signature_proxy.requests()[second_start:] if "/tables/" in path]
    # ... the next reads none of it but the metadata.json opening checks (read before anything is kept)
    assert all(path.split("?")[0].endswith(".metadata.json") for path in again), again
    assert len(again) <= 1, again
    assert table_gets(second_start)  # Icechunk's objects are still read: the branch's tip may have moved
