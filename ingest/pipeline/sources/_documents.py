"""The items a JSON document holds, and those of NDJSON lines: what a file says, wherever it was read from (a local
file, an object, standard input).

A document is an item, a FeatureCollection, a JSON array of items, or a STAC Collection (kept with the
repository); each item is labelled where it sits (``file#features[3]``, ``file:12``), so a rejection names it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ingest.errors import InvalidItem, InvalidSource
from ingest.pipeline.sources._types import SourcedItem
from ingest.remote import join_url, url_scheme
from ingest.stac import ARRAYS_ASSET, loads_json

log = logging.getLogger(__name__)


def document_items(document: Any, source: str, path: Path | None = None) -> Iterator[SourcedItem]:
    """The items (or the collection) of a decoded JSON ``document`` read from ``source`` (``path``: its file)."""
    if isinstance(document, list):
        for index, entry in enumerate(document):
            yield SourcedItem(f"{source}#[{index}]", item=entry, path=path)
        return
    if not isinstance(document, dict):
        yield SourcedItem(source, error=InvalidSource("expected a STAC item, FeatureCollection or array"))
        return
    kind = document.get("type")
    if kind == "FeatureCollection":
        features = document.get("features")
        if not isinstance(features, list):
            yield SourcedItem(source, error=InvalidSource("FeatureCollection without a features array"))
            return
        for index, entry in enumerate(features):
            yield SourcedItem(f"{source}#features[{index}]", item=entry, path=path)
    elif kind == "Collection":
        yield SourcedItem(source, collection=document, path=path)
    elif kind == "Catalog":
        log.info(
            "%s is a STAC Catalog: its items are read from the files beside it (name it to walk its links)", source
        )
    else:
        yield SourcedItem(source, item=document, path=path)


def ndjson_items(
    lines: Iterable[bytes], label: str, path: Path | None = None, *, first: int = 1
) -> Iterator[SourcedItem]:
    """Each line on its own: a line that is not UTF-8 or not JSON is rejected alone, by its number (the first
    line's is ``first``: a part of a file numbers its lines as the whole file does)."""
    for number, raw in enumerate(lines, start=first):
        if not raw.strip():
            continue
        source = f"{label}:{number}"
        try:
            # The bytes as they are: orjson checks UTF-8 while it parses (the standard parser, on its way, decodes).
            document = loads_json(raw.rstrip(b"\r\n"))
        except UnicodeDecodeError as error:
            reason = f"not UTF-8 (byte {raw[error.start]:#04x} at column {error.start + 1})"
            yield SourcedItem(source, error=InvalidItem(reason, source=source))
            continue
        except json.JSONDecodeError as error:
            yield SourcedItem(
                source, error=InvalidItem(f"not valid JSON ({parser_said(error)} column {error.colno})", source=source)
            )
            continue
        yield from document_items(document, source, path)


def parser_said(error: json.JSONDecodeError) -> str:
    """The parser's message, ready for "at column N" ("Unterminated string starting at" ends with "at" already)."""
    return error.msg if error.msg.endswith(" at") else f"{error.msg} at"


def absolute_hrefs(document: Any, base: str) -> None:
    """Make the relative asset hrefs of an item or collection ``document`` absolute against ``base``, in place (a
    document read from a URL: a stored item never points somewhere relative to a place floe does not keep)."""
    assets = document.get("assets") if isinstance(document, dict) else None
    if not isinstance(assets, dict):
        return
    for key, asset in assets.items():
        if key == ARRAYS_ASSET or not isinstance(asset, dict):
            continue
        href = asset.get("href")
        if isinstance(href, str) and href and url_scheme(href) is None:
            asset["href"] = join_url(base, href)
