"""A STAC API search as shares of a metadata backfill: its time lanes, each read by a reader of its own, and what
they read merged back into the search's cursor.

One process reads a search's lanes several at once (``_api_lanes.py``) and parses, checks and commits every page
itself. A backfill (``ingest/pipeline/_backfill.py``) gives each lane to an actor instead: :func:`search_lanes`
plans them in the driver as :class:`~ingest.pipeline.sources._api.SearchLane` sources, whose items are labelled
as one reader labels them. An actor's lane vouches for no cursor; the driver merges the lanes' counts
(:func:`merged_searches`) and records the search's cursor once every lane was read to its end.

What differs from one reader: an item whose start and end datetimes reach into two lanes is kept by both (one
reader keeps it once); the table holds it once (every row is staged as a replacement), and the run's count of
items read counts it twice. docs/ingest.md#a-metadata-backfill-on-a-cluster.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from ingest.errors import InvalidSource
from ingest.pipeline.sources._api import ApiSearch, OpenedSearch, SearchLane, resolved_search
from ingest.pipeline.sources._api_io import failure_reason, session_io
from ingest.pipeline.sources._api_lanes import Lane, lanes_for, plan_lanes
from ingest.pipeline.sources._types import SourceName, SourceOptions

log = logging.getLogger(__name__)

LANES_PER_WORKER = 2
"""Time lanes planned for each of a backfill's actors where the settings do not say (``remote.search_lanes``):
more than one, so that an actor whose lane holds few items takes another while the others read."""


def search_lanes(url: str, options: SourceOptions, workers: int) -> list[SourceName] | None:
    """The shares a backfill's actors read the search ``url`` names in (``options`` as the run gives them, its
    recorded cursors included): its lanes; None where one reader reads it: a search the settings read as one
    (``remote.search_lanes = 1``; unset, an API on a loopback address), one that makes a single lane, one whose
    search is refused here (its read raises it, as one reader's does). The look at the API is one attempt: one
    that does not answer it is a share of its own, whose actor reads it with every retry (and reports it, if it
    never answers), so a run waits out the retries once."""
    try:
        search = resolved_search(url, options)
    except InvalidSource:
        return None
    if lanes_for(search) == 1:
        # Set to 1, or unset for an API on this machine: it makes its pages on the cores the actors would use, and
        # there a backfill read 0.54-0.82x what one process reads in lanes (docs/benchmarks-history.md).
        return None
    io = session_io(search.headers, retries=0)  # a failed look leaves the retries to the search's reader
    try:
        opened = OpenedSearch.of(search, io)
    except InvalidSource as error:
        log.info("%s did not answer the look at its lanes (%s): an actor reads it whole", url, error)
        return [url]
    try:
        formatted = opened.asked(Lane()).get_parameters().get("datetime")
        lanes = plan_lanes(replace(search, lanes=search.lanes or LANES_PER_WORKER * workers), io, formatted)
    except Exception as error:  # noqa: BLE001 - one reader reads it, and says why it cannot be read
        log.info("%s is read by one reader: its lanes cannot be planned (%s)", url, failure_reason(error))
        return None
    if len(lanes) < 2:
        return None
    log.info("%s is read by the actors as %d searches", search.key, len(lanes))
    return [SearchLane(search, lane) for lane in lanes]


def merged_searches(planned: list[SearchLane], read: list[ApiSearch]) -> list[ApiSearch]:
    """Each search ``planned`` names, with the counts of its lanes ``read`` (by whichever actor): complete once
    every lane was read to its end, so that its cursor (:meth:`ApiSearch.cursor`) is the one a single reader
    would vouch for."""
    wholes: dict[str, tuple[ApiSearch, list[str]]] = {}
    for lane in planned:
        wholes.setdefault(lane.search.key, (lane.search, []))[1].append(lane.lane.label(lane.search.root))
    merged = []
    for key, (search, labels) in wholes.items():
        whole = replace(search, items=0, without_updated=0, newest_updated=None, lanes_read=labels, lane_of=None)
        done: set[str | None] = set()
        for part in (search for search in read if search.key == key and search.lane_of in labels):
            whole.items += part.items
            whole.without_updated += part.without_updated
            if part.newest_updated is not None and (
                whole.newest_updated is None or part.newest_updated > whole.newest_updated
            ):
                whole.newest_updated = part.newest_updated
            if part.unfiltered:
                whole.note_unfiltered()
            if part.complete:
                done.add(part.lane_of)
        whole.complete = done == set(labels)
        merged.append(whole)
    return merged
