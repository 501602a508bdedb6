"""A metadata backfill of a STAC API search: its time lanes go to the actors, a lane each, and give what one
process reading the same lanes gives: the same table, the same labels in ``--report``, the same cursor recorded
for ``--since last`` (issue 52, item 3). The API is a real ``floe serve`` on 127.0.0.1 (it filters by
``datetime`` and by ``updated``)."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from ingest import Repository
from ingest.config import RemoteSettings
from ingest.export import export_ndjson
from ingest.pipeline import SearchParameters, SourceOptions, ingest_items, ingest_with_ray
from ingest.pipeline.sources import ApiSearch, SearchLane, _api_shares, merged_searches, split_sources
from ingest.pipeline.sources._api_lanes import Lane
from tests.api._servers import FloeServer
from tests.pipeline._backfill_sources import DAY, day_items, write_day
from tests.pipeline._static_api import lanes_api


def _options(lanes: int | None, collection: str = "t") -> SourceOptions:
    search = SearchParameters(collections=(collection,), datetime=DAY, page_size=7)
    return SourceOptions(search=search, remote=RemoteSettings(search_lanes=lanes))


def _exported(repository: Repository) -> list[str]:
    stream = io.StringIO()
    export_ndjson(repository.view("main"), stream)
    return sorted(stream.getvalue().splitlines())


def _landed(text: str) -> list[tuple[str, str]]:
    return sorted((line["source"], line["id"]) for line in map(json.loads, text.splitlines()))


@pytest.mark.slow
def test_a_backfill_reads_a_searchs_time_lanes_on_the_actors(tmp_path, ray_cluster):
    api = Repository.create(tmp_path / "api")
    assert not ingest_items(api, [write_day(tmp_path / "items.ndjson")]).rejected
    server = FloeServer(tmp_path / "api", log_dir=tmp_path)
    try:
        url = server.url
        # One process reading the same 4 lanes (its labels are the lanes'), and one reading the search as one.
        alone, alone_lines = Repository.create(tmp_path / "alone"), io.StringIO()
        alone_options = _options(4)
        expected = ingest_items(alone, [url], options=alone_options, batch_size=10, report_to=alone_lines)
        one = Repository.create(tmp_path / "one")
        assert not ingest_items(one, [url], options=_options(1)).rejected

        spread, spread_lines = Repository.create(tmp_path / "spread"), io.StringIO()
        options = _options(4)  # unset, an API on this machine is read by one process
        started = datetime.now(UTC)
        got = ingest_with_ray(
            spread, [url], workers=2, assets="none", batch_size=10, options=options, report_to=spread_lines
        )

        assert not got.rejected and not expected.rejected
        assert _exported(spread) == _exported(alone) == _exported(one)
        assert len(_exported(spread)) == len(day_items())
        # Each lane went to an actor: the labels are the 4 lanes', as one process reading them gives.
        assert _landed(spread_lines.getvalue()) == _landed(alone_lines.getvalue())
        lanes = {source.split("#")[0] for source, _ in _landed(spread_lines.getvalue())}
        assert len(lanes) == 4, lanes
        assert {line["node"] for line in map(json.loads, spread_lines.getvalue().splitlines())}
        assert got.items_read == expected.items_read == len(day_items())  # floe serve matches the datetime alone

        # The search's cursor, merged from its lanes' counts, is recorded in the last commit: the one a single
        # reader records, so `--since last` resumes from it.
        (search,) = options.searches
        assert search.complete and search.lanes_read == alone_options.searches[0].lanes_read
        assert search.items == expected.items_read
        assert spread.source_cursors("branch:main") == alone.source_cursors("branch:main") != {}
        assert spread.source_cursors("branch:main") == {search.key: "2024-03-01T01:16:00Z"}
        assert search.started >= started

        # Resumed: only the items updated at the cursor or after (the newest) are read again, unchanged.
        resumed = _options(4)
        resumed.since = "last"
        again = ingest_with_ray(spread, [url], workers=2, assets="none", options=resumed)
        assert (again.items_read, again.skipped, again.rows_added) == (1, 1, 0)
    finally:
        server.stop()


@pytest.mark.slow
def test_an_item_two_time_lanes_keep_is_read_by_both_and_stored_once(http_server, tmp_path, ray_cluster):
    # A static API answers every lane with the whole collection (it reads no datetime): each lane keeps its own
    # items, and the item whose datetime lies outside its range is kept by the lanes of both. One process drops the
    # second copy; lanes on two actors cannot, and the table holds it once all the same.
    items = day_items("s")
    url = lanes_api(http_server, "ignores", {"s": items}, page=7)
    alone = Repository.create(tmp_path / "alone")
    expected = ingest_items(alone, [url], options=_options(4, "s"))
    spread = Repository.create(tmp_path / "spread")
    options = _options(4, "s")
    got = ingest_with_ray(spread, [url], workers=2, assets="none", batch_size=10, options=options)

    assert not got.rejected and not expected.rejected
    assert _exported(spread) == _exported(alone)
    assert len(_exported(spread)) == len(items)
    assert expected.items_read == len(items)
    assert got.items_read == len(items) + 1
    (search,) = options.searches
    assert search.complete and search.items == len(items) + 1
    assert search.note is not None and "each of the 4 time lanes read its whole search" in search.note


def _lane_read(planned: SearchLane, *, complete: bool, items: int, newest: str | None) -> ApiSearch:
    """What an actor's read of ``planned`` counted."""
    read = replace(planned.search, lane_of=str(planned), complete=complete, items=items)
    read.newest_updated = datetime.fromisoformat(newest) if newest else None
    return read


def test_only_the_merged_search_vouches_for_a_cursor_once_every_lane_was_read():
    whole = ApiSearch(root="http://api.example", parameters=SearchParameters(collections=("t",), datetime=DAY))
    whole.started = datetime(2025, 1, 1, tzinfo=UTC)
    halves = [
        Lane(interval="2024-02-01T12:00:00Z/2024-02-02T00:00:00Z", window=(datetime(2024, 2, 1, 12, tzinfo=UTC), None)),
        Lane(interval="2024-02-01T00:00:00Z/2024-02-01T12:00:00Z", window=(None, datetime(2024, 2, 1, 12, tzinfo=UTC))),
    ]
    planned = [SearchLane(whole, lane) for lane in halves]
    late = _lane_read(planned[0], complete=True, items=5, newest="2024-03-02T00:00:00+00:00")
    early = _lane_read(planned[1], complete=True, items=3, newest="2024-03-01T00:00:00+00:00")
    # A lane read to its end still vouches for nothing: it saw part of the search.
    assert late.cursor() is None and early.cursor() is None

    (merged,) = merged_searches(planned, [early, late])
    assert (merged.complete, merged.items, merged.cursor()) == (True, 8, "2024-03-02T00:00:00Z")
    assert merged.key == whole.key and merged.lanes_read == [str(lane) for lane in planned]
    # A lane that broke off, or one no actor read: no cursor, so `--since last` reads the search again.
    broken = _lane_read(planned[1], complete=False, items=1, newest=None)
    assert merged_searches(planned, [broken, late])[0].cursor() is None
    assert merged_searches(planned, [late])[0].cursor() is None


def test_a_search_the_backfill_leaves_to_one_process_asks_nothing_of_its_api(monkeypatch):
    # An API on this machine shares the cores the actors would use (there a backfill read 0.54-0.82x what one
    # process reads in lanes), and a search set to one lane is read as one: both go to one reader, planned without
    # opening the API.
    opened = []
    monkeypatch.setattr(_api_shares.OpenedSearch, "of", lambda search, io: opened.append(search.root))
    for url, lanes in (("http://127.0.0.1:9/search?collections=t", None), ("http://api.invalid/stac", 1)):
        options = SourceOptions(remote=RemoteSettings(search_lanes=lanes))
        assert split_sources([url], 1 << 20, options, workers=2) is None
    assert opened == []
