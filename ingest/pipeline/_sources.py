"""Read STAC items from files: item JSON, FeatureCollections, JSON arrays, NDJSON, folders of them.

Every item comes with a label naming where it came from (``file``,
``file:line``, ``file#features[3]``), so a rejection can say exactly which
input was bad. A file that cannot be read or parsed is reported and skipped;
the rest goes on.

Sources named by URL go elsewhere: ``s3://`` and ``http(s)://`` files and
folders to :mod:`ingest.pipeline._remote` (obstore), STAC APIs to
:mod:`ingest.pipeline._stac_api`; ``file://`` URLs are local paths.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ingest.errors import InvalidItem, InvalidSource
from ingest.remote import Stores, url_scheme
from ingest.stac import loads_json

if TYPE_CHECKING:
    from ingest.config import RemoteSettings, S3Settings
    from ingest.pipeline._remote import RemoteReader
    from ingest.pipeline._stac_api import ApiSearch, SearchParameters

log = logging.getLogger(__name__)

JSON_SUFFIXES = frozenset((".json", ".geojson"))
NDJSON_SUFFIXES = frozenset((".ndjson", ".jsonl", ".geojsonl"))
PARQUET_SUFFIXES = frozenset((".parquet", ".geoparquet"))
TIFF_SUFFIXES = frozenset((".tif", ".tiff"))
METADATA_SUFFIXES = JSON_SUFFIXES | NDJSON_SUFFIXES | PARQUET_SUFFIXES
STDIN = "-"


@dataclass(slots=True)
class SourcedItem:
    """An item (or the reason it could not be read) and where it came from.

    Made for every item read, so not frozen: a frozen dataclass's ``__init__`` costs 4x (1.4 against 0.3 us).
    """

    source: str
    item: dict[str, Any] | None = None
    error: Exception | None = None
    path: Path | None = None
    """The file the item was read from (relative asset hrefs resolve against its folder)."""
    collection: dict[str, Any] | None = None
    """A STAC Collection found in the source (to be stored with the repository), instead of an item."""
    checked: bool = False
    """``validate_item`` accepts the item as it is: checked already (by a STAC API search's page reader)."""


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
    elif kind == "Collection":
        yield SourcedItem(source, collection=document, path=path)
    elif kind == "Catalog":
        log.info(
            "%s is a STAC Catalog: its items are read from the files beside it (name it to walk its links)", source
        )
    else:
        yield SourcedItem(source, item=document, path=path)


def _read_ndjson(lines: Iterable[bytes], label: str, path: Path | None = None) -> Iterator[SourcedItem]:
    """Each line on its own: a line that is not UTF-8 or not JSON is rejected alone, by its number."""
    for number, raw in enumerate(lines, start=1):
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
                source, error=InvalidItem(f"not valid JSON ({_what(error)} column {error.colno})", source=source)
            )
            continue
        yield from _from_document(document, source, path)


def _what(error: json.JSONDecodeError) -> str:
    """The parser's message, ready for "at column N" ("Unterminated string starting at" ends with "at" already)."""
    return error.msg if error.msg.endswith(" at") else f"{error.msg} at"


def _default_search() -> SearchParameters:
    from ingest.pipeline._stac_api import SearchParameters

    return SearchParameters()


@dataclass
class SourceOptions:
    """How to reach remote sources, and what to ask STAC APIs; what the searches found is added to it."""

    s3: S3Settings | None = None
    """Settings for ``s3://`` sources; where set they override the ``AWS_*`` environment (None: environment only)."""
    anonymous: bool = False
    """Unsigned requests to every S3 bucket (public buckets); ``remote.anonymous`` names some."""
    remote: RemoteSettings | None = None
    """Timeouts, retries and the ``s3://`` prefixes read unsigned (None: the defaults; an ingest passes its
    repository's)."""
    search: SearchParameters = field(default_factory=_default_search)
    since: datetime | str | None = None
    """STAC APIs: only items updated since then; ``"last"``: since the cursor ``recorded`` holds for the search."""
    recorded: dict[str, str] = field(default_factory=dict)
    """Cursors recorded on the branch (search key -> RFC 3339), for ``since="last"``."""
    searches: list[ApiSearch] = field(default_factory=list)
    """Each STAC API search read, in order (whether it was read to its end, its cursor)."""
    remote_assets: bool = False
    """Copy raster assets at ``s3://`` and ``http(s)://`` URLs into arrays too (without it they stay metadata)."""


def read_items(sources: Iterable[str | Path], options: SourceOptions | None = None) -> Iterator[SourcedItem]:
    """Every item in ``sources``, in order, each with its label (or the error that kept it out).

    A source is a local path (file or folder), ``-`` (standard input), a
    ``file://``, ``s3://`` or ``http(s)://`` URL of a file (or an ``s3://``
    folder, ending in ``/``), or a STAC API. ``options`` say how to reach S3
    (settings that are set win over the ``AWS_*`` environment) and what to ask
    STAC APIs.
    """
    options = options if options is not None else SourceOptions()
    remote: RemoteReader | None = None
    for source in sources:
        scheme = url_scheme(source) if isinstance(source, str) else None
        if scheme is None:
            yield from _read_local([source])
        elif scheme == "file":
            from ingest.remote import file_url_path

            try:
                path = file_url_path(str(source))
            except InvalidSource as error:
                yield SourcedItem(str(source), error=error)
                continue
            yield from _read_local([path])
        elif _is_api(str(source)):
            yield from _read_api(str(source), options)
        else:
            if remote is None:
                from ingest.pipeline._remote import RemoteReader

                remote = RemoteReader(Stores.reaching(options.s3, options.remote, anonymous=options.anonymous))
            yield from remote.read(str(source))


def _is_api(url: str) -> bool:
    from ingest.pipeline._stac_api import is_api_url

    return is_api_url(url)


def _read_api(url: str, options: SourceOptions) -> Iterator[SourcedItem]:
    """A STAC API search named by URL (its landing page or its ``/search``), with ``options``' parameters."""
    from ingest.pipeline._stac_api import ApiSearch, parse_since, read_search
    from ingest.remote._headers import Headers

    try:
        search = ApiSearch.parse(url, options.search)
    except InvalidSource as error:
        yield SourcedItem(url, error=error)
        return
    try:
        if options.since == "last":
            cursor = options.recorded.get(search.key)
            search.since = parse_since(cursor) if cursor else None
        elif isinstance(options.since, str):
            search.since = parse_since(options.since)
        else:
            search.since = options.since
    except ValueError as error:
        yield SourcedItem(url, error=InvalidSource(str(error)))
        return
    search.headers = Headers.of(options.remote)
    search.lanes = options.remote.search_lanes if options.remote is not None else None
    options.searches.append(search)
    yield from read_search(search)


def _read_local(sources: Iterable[str | Path]) -> Iterator[SourcedItem]:
    """Every item in the local ``sources`` (files, folders, ``-``), in order."""
    sources = list(sources)
    named = {Path(source): True for source in sources if str(source) != STDIN and Path(source).is_file()}
    for path in expand_paths(sources):
        if isinstance(path, str):  # only STDIN is named by a string
            yield from _read_ndjson(sys.stdin.buffer, "<stdin>")
            continue
        label = str(path)
        if not path.exists():
            yield SourcedItem(label, error=InvalidSource(_missing(path)))
            continue
        suffix = path.suffix.lower()
        if suffix in PARQUET_SUFFIXES:
            yield from _read_geoparquet(path)
            continue
        if suffix in TIFF_SUFFIXES:
            yield _bare_raster(path)
            continue
        try:
            if suffix in NDJSON_SUFFIXES:
                with path.open("rb") as stream:
                    yield from _read_ndjson(stream, label, path)
                continue
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            yield SourcedItem(label, error=InvalidSource(f"cannot be read ({error})"))
            continue
        try:
            document = loads_json(text)
        except json.JSONDecodeError as error:
            yield SourcedItem(
                label, error=InvalidSource(f"not valid JSON ({_what(error)} line {error.lineno}, column {error.colno})")
            )
            continue
        if named.get(path) and isinstance(document, dict) and document.get("type") in ("Catalog", "Collection"):
            yield from _walk_catalog(path)
            continue
        yield from _from_document(document, label, path)


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


def _walk_catalog(path: Path) -> Iterator[SourcedItem]:
    """A STAC Catalog or Collection named as a source: its collections and items, following its links."""
    import pystac

    try:
        root = pystac.read_file(str(path))
    except Exception as error:  # noqa: BLE001 - pystac raises many kinds; all mean "not a readable catalog"
        yield SourcedItem(str(path), error=InvalidSource(f"not a readable STAC catalog ({error})"))
        return
    if not isinstance(root, pystac.Catalog):  # a Collection is a Catalog too
        yield SourcedItem(str(path), error=InvalidSource(f"not a STAC catalog or collection ({type(root).__name__})"))
        return
    collections: list[pystac.Collection] = [root] if isinstance(root, pystac.Collection) else []
    collections += list(root.get_all_collections())
    for collection in collections:
        yield SourcedItem(collection.self_href or str(path), collection=collection.to_dict(include_self_link=False))
    for item in root.get_items(recursive=True):
        href = item.get_self_href()
        item_file = Path(href) if href and "://" not in href else None
        yield SourcedItem(
            href or str(path), item=item.to_dict(include_self_link=False, transform_hrefs=False), path=item_file
        )


def _read_geoparquet(path: Path) -> Iterator[SourcedItem]:
    """Items of a stac-geoparquet file, a record batch at a time (a file of millions of rows is never whole in
    memory); a batch that cannot be read ends the file with the reason, after the rows before it."""
    import pyarrow.parquet as pq

    from ingest.stac import geoparquet_items, row_group_batches

    row = 0
    try:
        with pq.ParquetFile(path) as opened:
            for batch in row_group_batches(opened):
                for item in geoparquet_items(batch):
                    yield SourcedItem(f"{path}#row{row}", item=item, path=path)
                    row += 1
    except Exception as error:  # noqa: BLE001 - any failure means the file is not stac-geoparquet
        yield SourcedItem(str(path), error=InvalidSource(f"not a readable stac-geoparquet file ({error})"))


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
