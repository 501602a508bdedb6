"""Long searches take turns (``ingest/api/_turns.py``): once a search has read its share of files it goes on only in
one of its worker's few places, while short searches are answered beside it."""

from __future__ import annotations

import threading
import time

import pytest

from ingest import Repository, Settings
from ingest.api import SearchEngine, SearchRequest
from ingest.api._turns import Turns, pace
from tests.conftest import make_item

COMMITS = 8
PER_COMMIT = 5


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> SearchEngine:
    """One file of collection ``wide`` per commit, and one file of collection ``small``."""
    repository = Repository.create(tmp_path_factory.mktemp("turns") / "repo", Settings())
    for commit in range(COMMITS):
        writer = repository.writer()
        writer.add_items([make_item(f"w{commit}-{number}", "wide") for number in range(PER_COMMIT)])
        if commit == 0:
            writer.add_item(make_item("needle", "small"))
        writer.commit(f"commit {commit}")
    engine = SearchEngine(repository, long_searches=1)
    engine.turns.after_files = 3  # long after three files, whatever the time
    engine.turns.after_seconds = float("inf")
    return engine


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting: {what}")
        time.sleep(0.01)


def test_a_long_search_waits_for_a_place_while_a_short_one_is_answered(engine):
    turns = engine.turns
    found: dict[str, list[str]] = {}

    def long_search() -> None:
        page = engine.search(SearchRequest(collections=["wide"], limit=1000))
        found["long"] = [item["id"] for item in page.items]

    waited_before = turns.waited
    with turns.search():
        pace(3)  # another long search holds the worker's one place
        runner = threading.Thread(target=long_search)
        runner.start()
        wait_until(lambda: turns.waiting == 1, "the long search to wait for its turn")
        # A search of one file is short: it never asks for a place, and is answered now.
        short = engine.search(SearchRequest(collections=["small"], limit=10))
        assert [item["id"] for item in short.items] == ["needle"]
        assert runner.is_alive() and "long" not in found
    runner.join(timeout=60)
    assert not runner.is_alive()
    assert len(found["long"]) == COMMITS * PER_COMMIT
    assert turns.waited == waited_before + 1 and turns.waiting == 0


def test_without_a_limit_nothing_waits_and_a_search_within_a_search_shares_its_ticket():
    unlimited = Turns(0, after_files=1)
    with unlimited.search(), unlimited.search():
        pace(10)
    assert unlimited.waited == 0

    turns = Turns(1, after_files=1)
    with turns.search():
        pace(1)
        with turns.search():  # nested: the outer search's place, not a second one
            pace(5)
    with turns.search():
        pace(1)  # the place was given back when the search ended
    assert turns.waited == 0
    pace(100)  # outside any search: nothing to pace
