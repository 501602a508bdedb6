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

    def noting(self: Any, root: str, lanes: Any, headers: Any = None) -> Any:
        for lane, page in read_from(self, root, lanes, headers):
            note(lane, page)
            yield lane, page

    monkeypatch.setattr(_api_reader, "HANDOFF_ITEMS", 1)
    monkeypatch.setattr(_api_reader, "HANDOFF_WAITS", True)
    monkeypatch.setattr(_api_reader.PageReader, "read_from", noting)
