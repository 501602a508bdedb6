"""Read STAC items from files: item JSON, FeatureCollections, JSON arrays, NDJSON, folders of them.

Every item comes with a label naming where it came from (``file``,
``file:line``, ``file#features[3]``), so a rejection can say exactly which
input was bad. A file that cannot be read or parsed is reported and skipped;
the rest goes on.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ingest.errors import InvalidItem, InvalidSource

log = logging.getLogger(__name__)

JSON_SUFFIXES = frozenset((".json", ".geojson"))
NDJSON_SUFFIXES = frozenset((".ndjson", ".jsonl", ".geojsonl"))
STDIN = "-"


@dataclass(frozen=True)
class SourcedItem:
    """An item (or the reason it could not be read) and where it came from."""

    source: str
    item: dict[str, Any] | None = None
    error: Exception | None = None
    path: Path | None = None
    """The file the item was read from (relative asset hrefs resolve against its folder)."""


def expand_paths(sources: Iterable[str | Path]) -> Iterator[Path | str]:
    """Files named directly, and the item files under named folders (sorted, recursive)."""
    for source in sources:
        if str(source) == STDIN:
            yield STDIN
            continue
        path = Path(source)
        if path.is_dir():
            for child in sorted(path.rglob("*")):
                if child.is_file() and child.suffix.lower() in JSON_SUFFIXES | NDJSON_SUFFIXES:
                    yield child
        else:
            yield path


def _from_document(document: Any, source: str, path: Path | None = None) -> Iterator[SourcedItem]:
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
    elif kind in ("Collection", "Catalog"):
        log.info("%s is a STAC %s, not an item: skipped", source, kind)
    else:
        yield SourcedItem(source, item=document, path=path)


def _read_ndjson(lines: Iterable[str], label: str, path: Path | None = None) -> Iterator[SourcedItem]:
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        source = f"{label}:{number}"
        try:
            document = json.loads(line)
        except json.JSONDecodeError as error:
            yield SourcedItem(
                source, error=InvalidItem(f"not valid JSON ({error.msg} at column {error.colno})", source=source)
            )
            continue
        yield from _from_document(document, source, path)


def read_items(sources: Iterable[str | Path]) -> Iterator[SourcedItem]:
    """Every item in ``sources``, in order, each with its label (or the error that kept it out)."""
    for path in expand_paths(sources):
        if path == STDIN:
            yield from _read_ndjson(sys.stdin, "<stdin>")
            continue
        label = str(path)
        if not path.exists():
            yield SourcedItem(label, error=InvalidSource("no such file or folder"))
            continue
        try:
            if path.suffix.lower() in NDJSON_SUFFIXES:
                with path.open(encoding="utf-8") as stream:
                    yield from _read_ndjson(stream, label, path)
                continue
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            yield SourcedItem(label, error=InvalidSource(f"cannot be read ({error})"))
            continue
        try:
            document = json.loads(text)
        except json.JSONDecodeError as error:
            yield SourcedItem(
                label, error=InvalidSource(f"not valid JSON ({error.msg} at line {error.lineno}, column {error.colno})")
            )
            continue
        yield from _from_document(document, label, path)
