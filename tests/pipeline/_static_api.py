"""A static STAC API's search pages, as files for tests/_http_server.py to serve, and the page reader made to take
over such a search at its second page."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ingest.pipeline.sources import _api_reader


def write_search_pages(
    folder: Path, base: str, path: str, features: list, size: int, *, broken_after: int | None = None, broken: str = ""
) -> None:
    """``features`` as a search's pages of ``size`` under ``folder/path`` (``index.json``, then ``1.json``, ...),
    each with ``numberMatched`` and a next link under ``base/path``; with ``broken_after``, that page's next link is
    ``broken`` (or a file that is not there)."""
    pages = [features[start : start + size] for start in range(0, len(features), size)] or [[]]
    for number, page in enumerate(pages):
        links = []
        if number + 1 < len(pages):
            following = f"{base}/{path}/{number + 1}.json"
            if broken_after == number:
                following = broken or f"{base}/{path}/missing.json"
            links.append({"rel": "next", "href": following, "method": "GET"})
        document = {"type": "FeatureCollection", "features": page, "links": links, "numberMatched": len(features)}
        target = folder / path / ("index.json" if number == 0 else f"{number}.json")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(document))


def hand_over_at_the_second_page(monkeypatch: Any, note: Callable[[int, Any], None]) -> None:
    """Forces the page reader to take over a search once its first page is read (``HANDOFF_ITEMS = 1``, and the
    ingest waits for the reader); ``note(lane, page)`` is told of each page the reader sends."""
    read_from = _api_reader.PageReader.read_from

    def noting(self: Any, root: str, lanes: Any, *args: Any) -> Any:
        for lane, page in read_from(self, root, lanes, *args):
            note(lane, page)
            yield lane, page

    monkeypatch.setattr(_api_reader, "HANDOFF_ITEMS", 1)
    monkeypatch.setattr(_api_reader, "HANDOFF_WAITS", True)
    monkeypatch.setattr(_api_reader.PageReader, "read_from", noting)


def static_collection(collection_id: str) -> dict:
    return {
        "type": "Collection",
        "stac_version": "1.0.0",
        "id": collection_id,
        "description": f"collection {collection_id} of a static API",
        "license": "CC-BY-4.0",
        "extent": {
            "spatial": {"bbox": [[-180, -90, 180, 90]]},
            "temporal": {"interval": [[None, None]]},  # no extent: without --datetime, no lanes of time
        },
        "links": [],
    }


def lanes_api(
    server, name: str, collections: dict[str, list], *, together: int = 0, broken: str | None = None, page: int = 4
) -> str:
    """A static STAC API of ``collections`` (id -> features): its search of all of them, and of each alone. With
    ``together``, the search link is behind the server's gate for that many requests at once; ``broken``: that
    collection's search breaks after its first page (a 404)."""
    folder, url = server.folder / name, server.url
    base = f"{url}/{name}"
    search = f"{url}/__together__/{together}/{name}/search" if together else f"{base}/search"
    (folder / "collections").mkdir(parents=True)
    (folder / "index.json").write_text(json.dumps(landing_page(name, search, "static, searched by collection")))
    everything = [feature for features in collections.values() for feature in features]
    write_search_pages(folder, base, "search", everything, page)
    for collection_id, features in collections.items():
        (folder / "collections" / collection_id).mkdir()
        (folder / "collections" / collection_id / "index.json").write_text(json.dumps(static_collection(collection_id)))
        broken_after = 0 if collection_id == broken else None
        write_search_pages(folder, base, f"search/{collection_id}", features, page, broken_after=broken_after)
    return base


def landing_page(name: str, search: str, description: str = "static") -> dict:
    """A static STAC API's landing page: core and item search, its search at ``search`` (POST)."""
    return {
        "type": "Catalog",
        "id": name,
        "stac_version": "1.0.0",
        "description": description,
        "conformsTo": ["https://api.stacspec.org/v1.0.0/core", "https://api.stacspec.org/v1.0.0/item-search"],
        "links": [{"rel": "search", "href": search, "type": "application/geo+json", "method": "POST"}],
    }


def write_static_api(folder: Path, base: str, features: list, size: int) -> None:
    """``features`` as a static STAC API at ``base`` (its files under ``folder``): its landing page, its search's
    pages of ``size`` and a document for each collection the features name (each one a folder's name can be)."""
    write_search_pages(folder, base, "search", features, size)
    (folder / "index.json").write_text(json.dumps(landing_page(folder.name, f"{base}/search")))
    named = {feature.get("collection") for feature in features if isinstance(feature, dict)}
    for collection_id in sorted(name for name in named if isinstance(name, str) and "/" not in name):
        (folder / "collections" / collection_id).mkdir(parents=True)
        (folder / "collections" / collection_id / "index.json").write_text(json.dumps(static_collection(collection_id)))
