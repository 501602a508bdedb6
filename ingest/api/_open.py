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
