"""A STAC API search page walked into what the ingest takes, whichever process read it (this one, or the page
reader): the items its lane keeps, without the links an API writes about itself, their ``updated`` counted for
the search's cursor, and each collection fetched before its first item.

Items and collections read from an API lose the links an API makes for itself (``self``, ``root``, ``parent``,
``collection``, ...): floe's API makes its own. A ``floe:arrays`` asset names the other repository's arrays and is
dropped too, with the stacks' assets served beside it (and a collection's asset of the whole store).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ingest.pipeline.sources._api_io import failure_reason
from ingest.pipeline.sources._api_lanes import Window, irregular, outside, owned, timestamp
from ingest.stac import ARRAYS_ASSET, without_served_assets

if TYPE_CHECKING:
    import pyarrow as pa

    from ingest.pipeline.sources._types import ItemDefaults

log = logging.getLogger(__name__)

ITEM_STRUCTURAL = frozenset(("self", "root", "parent", "collection"))
"""The links an API writes about an item, dropped."""
COLLECTION_STRUCTURAL = frozenset(
    (
        "self",
        "root",
        "parent",
        "child",
        "item",
        "items",
        "queryables",
        "http://www.opengis.net/def/rel/ogc/1.0/queryables",
    )
)
"""The links an API writes about a collection, dropped."""


@dataclass(slots=True)
class WalkedPage:
    """One page as the ingest takes it (:func:`walk_page`; the page reader adds the validation's flags)."""

    items: list[Any]
    """The page's features, without the links the API writes about them (what is not an object, as it is);
    empty while they travel as :attr:`items_json`."""
    checked: list[bool]
    """For each item, True when :func:`~ingest.stac.validate_item` accepts it as it is (geometry included)."""
    collections: list[tuple[int, str, dict[str, Any] | None]] = field(default_factory=list)
    """Collections seen first on this page: the index of their first item, their id and their document (None
    when it could not be read)."""
    warnings: list[str] = field(default_factory=list)
    updated: UpdatedCount | None = None
    """What the page's items said of ``updated`` (None: nothing counted)."""
    outside: bool = False
    """The page held an item whose time misses its lane's interval (:func:`~._api_lanes.outside`): the API does
    not filter by ``datetime``."""
    items_json: bytes | None = None
    """The items as JSON, where orjson writes and reads them back exactly (a page orjson decoded): cheaper to
    send than a pickle of them (1 us an item to write and 5 to read, against 3 and 6)."""
    rows: pa.Table | None = None
    """The items the ingest would accept, laid out as floe's rows in the page's order (:func:`lay_out_rows`, where
    the ingest takes rows); their places in :attr:`items` hold None."""
    row_at: list[int] = field(default_factory=list)
    """The index in :attr:`items` of each of :attr:`rows`, in order."""
    laid_out: bool = False
    """:func:`lay_out_rows` ran on the page (it may have accepted none)."""


@dataclass(slots=True)
class UpdatedCount:
    """Items whose ``updated`` was looked at, how many had none, and the newest seen (for the search's cursor)."""

    noted: int = 0
    without: int = 0
    newest: datetime | None = None

    def note(self, item: Mapping[str, Any]) -> None:
        """Count ``item``'s ``updated`` (a missing or unreadable one counts as none)."""
        self.noted += 1
        properties = item.get("properties")
        value = properties.get("updated") if isinstance(properties, dict) else None
        when = timestamp(value) if isinstance(value, str) else None
        if when is None:
            self.without += 1
        elif self.newest is None or when > self.newest:
            self.newest = when

    def add(self, other: UpdatedCount) -> None:
        """Count what ``other`` counted too."""
        self.noted += other.noted
        self.without += other.without
        if other.newest is not None and (self.newest is None or other.newest > self.newest):
            self.newest = other.newest


def walk_page(
    page: Mapping[str, Any], io: Any, root: str, fetched: set[str], window: Window | None = None
) -> WalkedPage:
    """A decoded page's features as the ingest takes them: those its lane keeps (``window``: :func:`owned`),
    without the links the API writes about them, their ``updated`` counted, and each collection not in
    ``fetched`` fetched (and added) before its first item. No item is marked checked."""
    counted = UpdatedCount()
    items: list[Any] = []
    collections: list[tuple[int, str, dict[str, Any] | None]] = []
    unfiltered = False
    for feature in page.get("features") or ():
        if not isinstance(feature, dict):
            items.append(feature)  # validation says why it is not an item
            continue
        if window is not None and not owned(feature, window):
            unfiltered = unfiltered or outside(feature, window)
            continue  # another lane's
        counted.note(feature)
        collection_id = feature.get("collection")
        if isinstance(collection_id, str) and collection_id not in fetched:
            fetched.add(collection_id)
            collections.append((len(items), collection_id, fetch_collection(io, root, collection_id)))
        items.append(item_from_api(feature))
    return WalkedPage(items, [False] * len(items), collections, updated=counted, outside=unfiltered)


def lay_out_rows(page: WalkedPage, defaults: ItemDefaults, *, windowed: bool) -> None:
    """The items of ``page`` (checked: :attr:`WalkedPage.checked` holds their verdicts) the ingest would accept
    (given ``defaults``), laid out as floe's rows in the page's order in place of the items
    (:func:`~ingest.stac.items_to_arrow`: the item path's layout, so the rows are what it would write). The rest
    stay items, for the ingest to take as before: those it refuses (it names their problem), and, in a search
    ``windowed`` in time lanes, those two lanes may each keep (:func:`irregular`: the ingest keeps such an item
    once). A page whose layout fails stays items whole. Run by the page reader, or by the ingest on a page the
    reader left to it."""
    from ingest.stac import accepted_items, items_to_arrow

    page.laid_out = True
    items = page.items
    candidates = [
        index for index, item in enumerate(items) if not (windowed and isinstance(item, dict) and irregular(item))
    ]
    flags = [page.checked[index] for index in candidates]
    accepted = accepted_items(
        [items[index] for index in candidates], default_collection=defaults.collection, flags=flags
    )
    kept = [(index, item) for index, item in zip(candidates, accepted, strict=True) if item is not None]
    if not kept:
        return
    try:
        page.rows = items_to_arrow([item for _, item in kept], in_order=True)
    except Exception:  # noqa: BLE001 - the ingest meets the same items on the item path, and says what becomes of them
        return
    page.row_at = [index for index, _ in kept]
    for index in page.row_at:
        items[index] = None


def strip_links(document: dict[str, Any], structural: frozenset[str]) -> dict[str, Any]:
    """``document`` without the links an API writes about itself."""
    links = document.get("links")
    if isinstance(links, list):
        document = {
            **document,
            "links": [link for link in links if not (isinstance(link, dict) and link.get("rel") in structural)],
        }
    return document


def item_from_api(item: dict[str, Any]) -> dict[str, Any]:
    """A page's item without the links the API writes about it, nor a floe source's arrays and stacks' assets.

    Changed in place, not copied: the page was decoded for this search alone
    (a floe source's stack assets are dropped on a copy, the rare case).
    """
    links = item.get("links")
    if isinstance(links, list) and links:
        item["links"] = [link for link in links if not (isinstance(link, dict) and link.get("rel") in ITEM_STRUCTURAL)]
    assets = item.get("assets")
    if isinstance(assets, dict) and ARRAYS_ASSET in assets:
        item["assets"] = {key: value for key, value in assets.items() if key != ARRAYS_ASSET}
    return without_served_assets(item)


def collection_url(root: str, collection_id: str) -> str:
    """The URL of a collection of the API at ``root``."""
    return f"{root}/collections/{quote(collection_id, safe='')}"


def fetch_collection(io: Any, root: str, collection_id: str) -> dict[str, Any] | None:
    """The collection's document from the API, without its API links nor a floe source's store asset; None
    (logged) when it cannot be read."""
    url = collection_url(root, collection_id)
    try:
        document = io.read_json(url)
    except Exception as error:  # noqa: BLE001 - the items still ingest without their collection's document
        log.warning(
            "collection %s could not be read (%s): its items are ingested without it", url, failure_reason(error)
        )
        return None
    if not isinstance(document, dict) or document.get("type") != "Collection":
        return None
    return without_served_assets(strip_links(document, COLLECTION_STRUCTURAL))
