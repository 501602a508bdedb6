"""A static STAC API's search pages, as files for tests/_http_server.py to serve."""

from __future__ import annotations

import json
from pathlib import Path


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
