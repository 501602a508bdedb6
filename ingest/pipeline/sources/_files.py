"""Local files as sources: item JSON, FeatureCollections, JSON arrays, NDJSON, stac-geoparquet, static catalogs,
folders of them, bare GeoTIFFs, and standard input (``-``, NDJSON); ``file://`` URLs name local paths.

Every item comes with a label naming where it came from (``file``,
``file:line``, ``file#features[3]``), so a rejection can say exactly which
input was bad. A file that cannot be read or parsed is reported and skipped;
the rest goes on.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from ingest.errors import InvalidSource
from ingest.pipeline.sources._catalogs import local_catalog_items
from ingest.pipeline.sources._documents import document_items, ndjson_items, parser_said
from ingest.pipeline.sources._geoparquet import geoparquet_file_items
from ingest.pipeline.sources._ndjson_rows import ndjson_sourced
from ingest.pipeline.sources._types import (
    METADATA_SUFFIXES,
    NDJSON_SUFFIXES,
    PARQUET_SUFFIXES,
    STDIN,
    TIFF_SUFFIXES,
    SourcedItem,
    SourceName,
    SourceOptions,
)
from ingest.remote import file_url_path, url_scheme
from ingest.stac import loads_json


class LocalFiles:
    """Paths on this machine (files and folders), ``file://`` URLs, and ``-`` (standard input)."""

    name = "local files"

    def recognises(self, source: SourceName) -> bool:
        if not isinstance(source, str | Path):  # a part of a file, a lane of a search: read by their own kinds
            return False
        return isinstance(source, Path) or url_scheme(source) in (None, "file")

    def read(self, source: SourceName, options: SourceOptions) -> Iterator[SourcedItem]:
        assert isinstance(source, str | Path), "a part or a lane is read by its own kind (recognises() refuses it)"
        if isinstance(source, str) and url_scheme(source) == "file":
            try:
                source = file_url_path(source)
            except InvalidSource as error:
                yield SourcedItem(str(source), error=error)
                return
        yield from local_items(
            [source], rows=options.rows, line_readers=options.rows, default_collection=options.default_collection
        )


def expand_paths(sources: Iterable[str | Path]) -> Iterator[Path | str]:
    """Files named directly, and the files under named folders (sorted, recursive).

    A folder yields its JSON, NDJSON and stac-geoparquet files; only a folder
    with none of those (a folder of bare rasters) yields its GeoTIFFs, so the
    rasters that items describe are not ingested twice.
    """
    for source in sources:
        if str(source) == STDIN:
            yield STDIN
            continue
        path = Path(source)
        if path.is_dir():
            children = sorted(path.rglob("*"))
            files = [child for child in children if child.is_file()]
            metadata = [child for child in files if child.suffix.lower() in METADATA_SUFFIXES]
            yield from metadata or [child for child in files if child.suffix.lower() in TIFF_SUFFIXES]
            # A link that leads nowhere (a loop, a missing target) named like an input is reported, not skipped.
            suffixes = METADATA_SUFFIXES | TIFF_SUFFIXES
            yield from (
                child
                for child in children
                if child.suffix.lower() in suffixes and child.is_symlink() and not child.exists()
            )
        else:
            yield path


def local_items(
    sources: Iterable[str | Path],
    *,
    as_named: bool = True,
    rows: bool = False,
    line_readers: bool = False,
    default_collection: str | None = None,
) -> Iterator[SourcedItem]:
    """Every item in the local ``sources`` (files, folders, ``-``), in order (with ``rows``, stac-geoparquet's as
    rows where they can be: ``SourceOptions.rows``; with ``line_readers`` too, large NDJSON's as rows read by
    reader processes, where items without a collection take ``default_collection``: :func:`ndjson_sourced`).

    A STAC Catalog or Collection file named as a source is walked (its items are read through its links); without
    ``as_named`` (a file listed in a folder, read on its own) it is not, as in its folder.
    """
    sources = list(sources)
    named = {Path(source): as_named for source in sources if str(source) != STDIN and Path(source).is_file()}
    for path in expand_paths(sources):
        if isinstance(path, str):  # only STDIN is named by a string
            if line_readers:
                yield from ndjson_sourced(sys.stdin.buffer, "<stdin>", default_collection=default_collection)
            else:
                yield from ndjson_items(sys.stdin.buffer, "<stdin>")
            continue
        label = str(path)
        if not path.exists():
            yield SourcedItem(label, error=InvalidSource(_missing(path)))
            continue
        suffix = path.suffix.lower()
        if suffix in PARQUET_SUFFIXES:
            yield from geoparquet_file_items(path, label, path=path, as_rows=rows)
            continue
        if suffix in TIFF_SUFFIXES:
            yield _bare_raster(path)
            continue
        try:
            if suffix in NDJSON_SUFFIXES:
                with path.open("rb") as stream:
                    if line_readers:
                        yield from ndjson_sourced(stream, label, path, default_collection=default_collection)
                    else:
                        yield from ndjson_items(stream, label, path)
                continue
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            yield SourcedItem(label, error=InvalidSource(f"cannot be read ({error})"))
            continue
        try:
            document = loads_json(text)
        except json.JSONDecodeError as error:
            yield SourcedItem(
                label,
                error=InvalidSource(f"not valid JSON ({parser_said(error)} line {error.lineno}, column {error.colno})"),
            )
            continue
        if named.get(path) and isinstance(document, dict) and document.get("type") in ("Catalog", "Collection"):
            yield from local_catalog_items(path)
            continue
        yield from document_items(document, label, path)


def _missing(path: Path) -> str:
    """Why a path named as a source cannot be opened: a symbolic link loop, a broken link, or nothing there."""
    if not path.is_symlink():
        return "no such file or folder"
    try:
        path.stat()
    except OSError as error:
        if error.errno == errno.ELOOP:
            return "is a symbolic link loop (it never reaches a file)"
    return f"is a broken symbolic link (to {os.readlink(path)!r}, which does not exist)"


def _bare_raster(path: Path) -> SourcedItem:
    """A GeoTIFF without an item: make one with rio-stac (id from the file name, asset ``data``)."""
    from rio_stac import create_stac_item

    try:
        item = create_stac_item(
            str(path),
            id=path.stem,
            asset_name="data",
            asset_href=str(path.resolve()),
            asset_roles=["data"],
            with_proj=True,
        ).to_dict(include_self_link=False, transform_hrefs=False)
    except Exception as error:  # noqa: BLE001 - rasterio raises several kinds for unreadable files
        return SourcedItem(str(path), error=InvalidSource(f"not a readable raster ({error})"))
    item.pop("collection", None)
    item["links"] = [link for link in item.get("links", []) if link.get("rel") != "collection"]
    return SourcedItem(str(path), item=item, path=path)
