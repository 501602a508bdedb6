"""A search of a repository on object storage, from a fresh engine, counted at the store (moto behind a proxy that
notes every request): data files are opened by their recorded size (no HEAD), their column chunks read in
coalesced ranges, and a table version's metadata.json is read once."""

from __future__ import annotations

from collections import Counter

import pytest

from ingest import Repository, Settings
from ingest.api import SearchEngine, SearchRequest
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


def test_a_cold_search_opens_data_files_by_their_size_and_reads_each_table_version_once(proxied):
    root, settings, proxy = proxied
    wanted = ["b0-3", "b2-7", "b5-11", "b4-0"]

    page, requests = made_by(
        proxy, lambda: SearchEngine(Repository.open(root, settings)).search(SearchRequest(ids=wanted, limit=10))
    )
    assert sorted(item["id"] for item in page.items) == sorted(wanted)
    data = [(method, path) for method, path in requests if path.endswith(".parquet")]
    assert data, requests
    assert not [request for request in data if request[0] == "HEAD"], data  # sizes come from the manifests
    metadata = Counter(path for method, path in requests if method == "GET" and path.endswith(".metadata.json"))
    assert set(metadata.values()) == {1}, metadata  # opening checks it, the search uses it: one read

    # Every file of the table held ids to index (read concurrently); each file is a footer and its id column,
    # then the files holding a wanted id are read once more for their rows: no column chunk is asked for alone.
    files = {path for _, path in data}
    assert len(files) == 2 * BATCHES
    assert len(data) <= 2 * len(files) + len(wanted), Counter(path for _, path in data)


def test_a_cold_area_search_reads_footer_and_rows_of_each_candidate_once(proxied):
    root, settings, proxy = proxied
    request = SearchRequest(bbox=[0.0, 0.0, 6.5, 80.0], limit=100)  # the first four squares of every batch

    page, requests = made_by(proxy, lambda: SearchEngine(Repository.open(root, settings)).search(request))
    assert len(page.items) == BATCHES * 4
    data = Counter((method, path) for method, path in requests if path.endswith(".parquet"))
    assert not [key for key in data if key[0] == "HEAD"], data
    # A footer, then the filter columns and the rows of the matches: at most three reads a file, however many
    # columns the rows have.
    assert max(data.values()) <= 3, data
