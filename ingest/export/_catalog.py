"""Export as a static STAC catalog: catalog.json, one collection.json per collection, one JSON file per item.

Layout (every link relative, so the folder can be moved or published as is)::

    OUT/catalog.json
    OUT/<collection>/collection.json
    OUT/<collection>/items/<item>.json

Collections are the ones stored in the repository at the exported snapshot
(their extents recomputed from the exported items), or, for items whose
collection has none stored, a collection made up from the items. Items keep
everything they were ingested with (the ``floe:arrays`` asset included); only
their structural links (self, root, parent, collection), which pointed into
their original catalog, are replaced by links into this one. Names come from
ids through :func:`safe_name`, so no id can write outside the folder.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ingest.export._common import ExportResult, href_of, iter_items, replacing_directory, safe_name
from ingest.repository import View
from ingest.stac import render_datetime

CATALOG_FILE = "catalog.json"
COLLECTION_FILE = "collection.json"
ITEMS_DIR = "items"
_STRUCTURAL = frozenset(("self", "root", "parent", "collection"))
_COLLECTION_STRUCTURAL = frozenset(("self", "root", "parent", "child", "item", "items", "collection"))
JSON_MEDIA = "application/json"
GEOJSON_MEDIA = "application/geo+json"


@dataclass
class _CollectionState:
    """What the export learns about one collection while its items stream past."""

    directory: str
    item_hrefs: list[str] = field(default_factory=list)
    bounds: list[float] | None = None
    start: datetime | None = None
    end: datetime | None = None
    stac_version: str = "1.0.0"

    def add_bounds(self, xmin: float, ymin: float, xmax: float, ymax: float) -> None:
        if self.bounds is None:
            self.bounds = [xmin, ymin, xmax, ymax]
        else:
            self.bounds = [
                min(self.bounds[0], xmin),
                min(self.bounds[1], ymin),
                max(self.bounds[2], xmax),
                max(self.bounds[3], ymax),
            ]

    def add_time(self, start: datetime | None, end: datetime | None) -> None:
        if start is not None and (self.start is None or start < self.start):
            self.start = start
        if end is not None and (self.end is None or end > self.end):
            self.end = end

    def extent(self) -> dict[str, Any]:
        spatial = self.bounds if self.bounds is not None else [-180.0, -90.0, 180.0, 90.0]
        interval = [
            render_datetime(self.start) if self.start is not None else None,
            render_datetime(self.end) if self.end is not None else None,
        ]
        return {"spatial": {"bbox": [spatial]}, "temporal": {"interval": [interval]}}


def _version_key(version: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in version.split("-", maxsplit=1)[0].split("."))
    except ValueError:
        return (0,)


def _batch_extents(batch: pa.RecordBatch, states: dict[str, _CollectionState]) -> None:
    """Fold a batch's bbox and time columns into each collection's extent (vectorized, per collection)."""
    names = batch.schema.names
    collections = batch.column("collection")
    for collection in collections.unique().to_pylist():
        if collection is None:
            continue
        rows = batch.filter(pc.equal(collections, collection))
        state = states[collection]
        if "bbox" in names:
            bbox = rows.column("bbox")
            lows = [pc.min(bbox.field(name)).as_py() for name in ("xmin", "ymin")]
            highs = [pc.max(bbox.field(name)).as_py() for name in ("xmax", "ymax")]
            if None not in lows and None not in highs:
                state.add_bounds(lows[0], lows[1], highs[0], highs[1])
        starts = [pc.min(rows.column(name)).as_py() for name in ("datetime", "start_datetime") if name in names]
        ends = [pc.max(rows.column(name)).as_py() for name in ("datetime", "end_datetime") if name in names]
        state.add_time(
            min((value for value in starts if value is not None), default=None),
            max((value for value in ends if value is not None), default=None),
        )


def _item_document(item: dict[str, Any]) -> dict[str, Any]:
    links = [
        link for link in item.get("links") or [] if not (isinstance(link, dict) and link.get("rel") in _STRUCTURAL)
    ]
    links += [
        {"rel": "root", "href": f"../../{CATALOG_FILE}", "type": JSON_MEDIA},
        {"rel": "parent", "href": f"../{COLLECTION_FILE}", "type": JSON_MEDIA},
        {"rel": "collection", "href": f"../{COLLECTION_FILE}", "type": JSON_MEDIA},
    ]
    return {**item, "links": links}


def _collection_document(collection_id: str, stored: dict[str, Any] | None, state: _CollectionState) -> dict[str, Any]:
    if stored is not None:
        document = dict(stored)
        kept = [
            link
            for link in document.get("links") or []
            if not (isinstance(link, dict) and link.get("rel") in _COLLECTION_STRUCTURAL)
        ]
    else:
        document = {
            "type": "Collection",
            "stac_version": state.stac_version,
            "id": collection_id,
            "description": f"The items of collection {collection_id} (none was stored; made up by floe export).",
            "license": "other",
        }
        kept = []
    if state.item_hrefs or stored is None:
        document["extent"] = state.extent()
    links = [
        {"rel": "root", "href": f"../{CATALOG_FILE}", "type": JSON_MEDIA},
        {"rel": "parent", "href": f"../{CATALOG_FILE}", "type": JSON_MEDIA},
        *kept,
        *({"rel": "item", "href": href, "type": GEOJSON_MEDIA} for href in state.item_hrefs),
    ]
    document["links"] = links
    return document


def _write_json(path: Path, document: dict[str, Any]) -> None:
    path.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def export_catalog(view: View, out: str | os.PathLike[str]) -> ExportResult:
    """Write every item at ``view`` as a static STAC catalog in the folder ``out``.

    The catalog is written beside ``out`` and takes its place once complete.
    The same ref always gives the same files.

    Args:
        view: the snapshot to export (:meth:`~ingest.repository.Repository.view`).
        out: the folder: new, empty, or an earlier export (it holds ``catalog.json``), replaced as a whole.

    Returns:
        The format (``catalog``), the items and collections written (stored collections without items included),
        the ref and snapshot, and ``out``.

    Raises:
        InvalidExportTarget: ``out`` exists and is not a folder, or is a folder that is neither empty nor an
            earlier export (nothing is written).
    """
    stored = view.repository.collections(view.snapshot_id)
    states: dict[str, _CollectionState] = {}
    count = 0
    catalog_version = "1.0.0"
    target = Path(out)

    def state_of(collection_id: str) -> _CollectionState:
        if collection_id not in states:
            directory = safe_name(collection_id)
            states[collection_id] = _CollectionState(directory)
            (staging / directory / ITEMS_DIR).mkdir(parents=True)
        return states[collection_id]

    with replacing_directory(target, CATALOG_FILE) as staging:
        for batch, items in iter_items(view):
            for item in items:
                state = state_of(item["collection"])
                name = f"{safe_name(item['id'])}.json"
                _write_json(staging / state.directory / ITEMS_DIR / name, _item_document(item))
                state.item_hrefs.append(f"./{ITEMS_DIR}/{href_of(name)}")
                version = item.get("stac_version")
                if isinstance(version, str) and _version_key(version) > _version_key(state.stac_version):
                    state.stac_version = version
                count += 1
            _batch_extents(batch, states)
        for collection_id in stored:
            state_of(collection_id)
        children = []
        for collection_id in sorted(states):
            state = states[collection_id]
            document = _collection_document(collection_id, stored.get(collection_id), state)
            _write_json(staging / state.directory / COLLECTION_FILE, document)
            for version in (state.stac_version, str(document.get("stac_version") or "1.0.0")):
                if _version_key(version) > _version_key(catalog_version):
                    catalog_version = version
            children.append(
                {
                    "rel": "child",
                    "href": f"./{href_of(state.directory)}/{COLLECTION_FILE}",
                    "type": JSON_MEDIA,
                    "title": str(document.get("title") or collection_id),
                }
            )
        catalog = {
            "type": "Catalog",
            "stac_version": catalog_version,
            "id": "floe-export",
            "title": f"floe export of {view.ref}",
            "description": f"Every item of a floe repository at ref {view.ref} (snapshot {view.snapshot_id}).",
            "links": [{"rel": "root", "href": f"./{CATALOG_FILE}", "type": JSON_MEDIA}, *children],
        }
        _write_json(staging / CATALOG_FILE, catalog)
    return ExportResult("catalog", count, len(states), view.ref, view.snapshot_id, str(target))
