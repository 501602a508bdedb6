"""From a search to pixels: ``open_search`` runs a STAC search and opens the matching items' arrays, lazily.

The search and the arrays are read at one snapshot: the ref is resolved
once, the search pages at that snapshot, and the returned tree reads the
pixels there too, so a branch that moves meanwhile changes neither.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ingest.api._request import SearchRequest
from ingest.api._search import SearchEngine
from ingest.config import Settings
from ingest.repository import Repository, View

if TYPE_CHECKING:
    import xarray as xr


def open_search(
    repository: Repository | str | Path,
    ref: str | None = None,
    *,
    assets: Iterable[str] | None = None,
    max_items: int | None = None,
    collections: list[str] | None = None,
    ids: list[str] | None = None,
    bbox: Sequence[float] | str | None = None,
    intersects: dict[str, Any] | str | None = None,
    datetime: str | None = None,
    filter: str | dict[str, Any] | None = None,
    filter_lang: str | None = None,
    sortby: str | None = None,
) -> xr.DataTree:
    """Search items at ``ref`` (as ``floe search`` and the STAC API do) and open their arrays as one lazy tree.

    Items on one grid (and with the same asset keys, dtypes and bands) are
    one child Dataset, stacked along ``time`` in datetime order, with ``item``
    and ``collection`` coordinates; each other grid is another child (see
    ``ingest/repository/_series.py``). ``assets`` picks asset keys;
    ``max_items`` stops the search early. The tree's ``floe:snapshot``
    attribute names the snapshot both were read at. Pixels are read only
    when a selection of a variable is loaded.

    >>> tree = open_search("floe-data", "v1", collections=["sentinel-2"], bbox=[5, 45, 6, 46])
    >>> tree.children  # one Dataset per grid: tree["g1a2b3c4d"].ds["data"].isel(time=-1).values

    Args:
        repository: an open repository, or the root of one (a local path or ``s3://bucket/prefix``), opened with
            the settings :func:`~ingest.config.load_settings` returns.
        ref: a branch, a tag or a snapshot id (default: the repository's configured branch).
        assets: the asset keys to open (default: every asset with arrays).
        max_items: stop after this many matching items (default: all).
        collections: only items of these collections.
        ids: only items with these ids.
        bbox: only items intersecting this box: 4 numbers ``[xmin, ymin, xmax, ymax]`` (or 6, with heights), or
            their comma-separated text.
        intersects: only items intersecting this GeoJSON geometry or Feature (a dict or its JSON text).
        datetime: only items at this RFC 3339 date-time or in this interval (``start/end``, ``..`` for an open end).
        filter: a CQL2 filter, as text or JSON.
        filter_lang: the language of ``filter``, ``cql2-text`` or ``cql2-json`` (default: ``cql2-json`` for a dict,
            ``cql2-text`` otherwise).
        sortby: the order of the items, e.g. ``"-datetime,id"``.

    Returns:
        A tree with one child Dataset per grid, read at the snapshot ``ref`` resolved to.

    Raises:
        RefNotFound: ``ref`` names no branch, tag or snapshot.
        CollectionNotFound: ``collections`` names a collection the snapshot does not hold.
        InvalidSearch: the search is malformed (its bbox, intersects, datetime, filter or sortby), gives both
            ``bbox`` and ``intersects``, or, with ``api.refuse_unknown_properties`` set, its filter names a property
            no item at the snapshot has.
        UnsupportedLayout: an earlier floe wrote a matching item's arrays, or laid out the repository's otherwise.
        RepositoryNotFound: ``repository`` is a root where no floe repository is.
        RepositoryMoved: ``repository`` is a root whose table metadata names the root it was copied or moved from.
        StoreUnreachable: ``repository`` is a root whose store cannot be reached, or whose bucket does not exist.
        InvalidRoot: ``repository`` is neither a local path nor ``s3://bucket/prefix``.
        InvalidSettings: ``repository`` is an ``s3://`` root and the S3 settings contradict each other.
    """
    if not isinstance(repository, Repository):
        repository = Repository.open(repository, Settings())
    engine = SearchEngine.in_process(repository)
    name = ref or repository.settings.branch
    snapshot_id = engine.resolve(name)
    request = SearchRequest(
        collections=collections,
        ids=ids,
        bbox=bbox,
        intersects=intersects,
        datetime=datetime,
        filter=filter,
        filter_lang=filter_lang,
        sortby=sortby,
        limit=repository.settings.api.max_limit,
    )
    items = engine.iter_items(request, f"snapshot:{snapshot_id}", max_items=max_items)
    return View(repository, name, snapshot_id).open_items(items, assets)
