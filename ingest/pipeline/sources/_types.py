"""What every kind of source shares: the :class:`Source` contract, the items it yields (:class:`SourcedItem`), the
options of a read (:class:`SourceOptions`, :class:`SearchParameters`) and the file names floe reads.

A leaf: it imports no other module of the sources, so each kind's module imports it and nothing imports back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ingest.remote import Stores

if TYPE_CHECKING:
    from collections.abc import Iterator

    import numpy as np
    import pyarrow as pa

    from ingest.config import RemoteSettings, S3Settings
    from ingest.pipeline.sources._api import ApiSearch, SearchLane

JSON_SUFFIXES = frozenset((".json", ".geojson"))
NDJSON_SUFFIXES = frozenset((".ndjson", ".jsonl", ".geojsonl"))
PARQUET_SUFFIXES = frozenset((".parquet", ".geoparquet"))
TIFF_SUFFIXES = frozenset((".tif", ".tiff"))
METADATA_SUFFIXES = JSON_SUFFIXES | NDJSON_SUFFIXES | PARQUET_SUFFIXES
FILE_SUFFIXES = METADATA_SUFFIXES | TIFF_SUFFIXES
"""What a file's name ends with when floe reads it as a file (an ``https://`` URL without one names an API)."""
STDIN = "-"
"""The source that names standard input (NDJSON)."""

PAGE_SIZE = 1000
"""Items asked of a STAC API per page (a server may send fewer)."""


@dataclass(frozen=True)
class SourcePart:
    """A part of one file, read as a source of its own: lines of NDJSON or row groups of stac-geoparquet.

    Several readers share a large file this way (a metadata backfill on a cluster: ``ingest/pipeline/_backfill.py``),
    each labelling what it reads with the file's own line and row numbers, as one reader of the whole file does.
    Parts are planned by :func:`ingest.pipeline.sources.split_sources` and read by the ``PartFiles`` kind.
    """

    file: str
    """A local path or a URL."""
    kind: Literal["ndjson", "geoparquet", "member"]
    """``member``: the whole file, read as a member of the folder it was listed in (a STAC Collection or Catalog
    there is stored, not walked: its items are the folder's other files)."""
    start: int
    """NDJSON: the first byte; the part holds every line that starts at or after it and before :attr:`stop`.
    stac-geoparquet: the first row (counted from 0)."""
    stop: int
    """NDJSON: the byte after the part; stac-geoparquet: the row after the part."""
    first: int = 1
    """NDJSON: the number of the part's first line (counted from 1, blank lines included), which the lines of the
    parts before it give."""

    def __str__(self) -> str:
        if self.kind == "member":
            return self.file
        unit = "bytes" if self.kind == "ndjson" else "rows"
        return f"{self.file} ({unit} {self.start}-{self.stop})"


type SourceName = str | Path | SourcePart | SearchLane
"""What names a source: a path, a URL (or ``-``), a part of a file, or a lane of a STAC API search."""


@dataclass(slots=True)
class SourcedItem:
    """An item (or the reason it could not be read) and where it came from.

    Made for every item read, so not frozen: a frozen dataclass's ``__init__`` costs 4x (1.4 against 0.3 us).
    """

    source: str
    """Where it came from, precisely enough for a rejection to name the input (``file:line``, ``URL#row3``)."""
    item: dict[str, Any] | None = None
    error: Exception | None = None
    path: Path | None = None
    """The file the item was read from (relative asset hrefs resolve against its folder)."""
    collection: dict[str, Any] | None = None
    """A STAC Collection found in the source (to be stored with the repository), instead of an item."""
    checked: bool = False
    """``validate_item`` accepts the item as it is: checked already (by a STAC API search's page reader)."""
    rows: SourcedRows | None = None
    """Items read as floe's rows instead of one item (see :class:`SourcedRows`)."""


@dataclass(slots=True)
class SourcedRows:
    """Items that travel as floe's rows, checked on columns (:func:`~ingest.stac.geoparquet_rows`), each
    labelled as its item would be: what a stac-geoparquet file becomes when ``SourceOptions.rows`` allows."""

    table: pa.Table
    """floe's rows, every one valid (``validate_item`` accepts its item), not yet in the table's sort order."""
    prefix: str
    """What each row's label starts with (``file#row``)."""
    numbers: np.ndarray
    """Each row's number in its file: its label is ``prefix`` and its number."""

    @property
    def sources(self) -> list[str]:
        """Each row's label (``file#rowN``)."""
        return [f"{self.prefix}{number}" for number in self.numbers.tolist()]


@dataclass(frozen=True, slots=True)
class ItemDefaults:
    """What every item of a stream is given before it is checked, as the item path gives it: by a source that
    checks and lays out items itself (NDJSON's readers, a STAC API search's page reader)."""

    collection: str | None = None
    """The collection of an item that names none (``--collection``)."""
    base: str | None = None
    """The URL the stream was read from: relative asset hrefs are made absolute against it."""


@dataclass(frozen=True)
class SearchParameters:
    """What ``--collections``, ``--bbox``, ``--datetime`` and ``--filter`` ask of every STAC API source."""

    collections: tuple[str, ...] = ()
    bbox: tuple[float, ...] | None = None
    datetime: str | None = None
    filter: str | None = None
    """CQL2 text or CQL2 JSON."""
    page_size: int = PAGE_SIZE

    def given(self) -> bool:
        """Whether any parameter is set (a source that takes none refuses them)."""
        return bool(self.collections or self.bbox or self.datetime or self.filter)


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
    search: SearchParameters = field(default_factory=SearchParameters)
    since: datetime | str | None = None
    """STAC APIs: only items updated since then; ``"last"``: since the cursor ``recorded`` holds for the search."""
    recorded: dict[str, str] = field(default_factory=dict)
    """Cursors recorded on the branch (search key -> RFC 3339), for ``since="last"``."""
    searches: list[ApiSearch] = field(default_factory=list)
    """Each STAC API search read, in order (whether it was read to its end, its cursor)."""
    remote_assets: bool = False
    """Copy raster assets at ``s3://`` and ``http(s)://`` URLs into arrays too (without it they stay metadata)."""
    rows: bool = False
    """Local stac-geoparquet files, large NDJSON streams and the pages of a large STAC API search (its page
    reader's) may give their items as rows (``SourcedItem.rows``), never made into items: for a reader that writes
    items as rows only (a metadata-only ingest)."""
    default_collection: str | None = None
    """The collection of items that name none, where a source checks items itself (NDJSON, or a search's pages,
    read as rows)."""
    _stores: tuple[Any, Stores] | None = field(default=None, init=False, repr=False, compare=False)

    def stores(self) -> Stores:
        """The object stores files named by URL are read through (credentials, public prefixes, timeouts and
        retries): made once for every source of a read, and again if the settings they come from changed."""
        settings = (self.s3, self.remote, self.anonymous)
        if self._stores is None or self._stores[0] != settings:
            self._stores = (settings, Stores.reaching(self.s3, self.remote, anonymous=self.anonymous))
        return self._stores[1]


class Source(Protocol):
    """One kind of source: it recognises the paths or URLs that name one of its kind, and reads them.

    The registry (:func:`ingest.pipeline.sources.registered`) asks each kind in turn; the first that recognises a
    source reads it.
    """

    name: str
    """What the kind is called in messages ("local files", "a STAC API")."""

    def recognises(self, source: SourceName) -> bool:
        """Whether ``source`` names one of this kind (by its form alone: nothing is read)."""
        ...

    def read(self, source: SourceName, options: SourceOptions) -> Iterator[SourcedItem]:
        """Every item (or collection, or failure) ``source`` holds, in order, each labelled with where it came
        from. A failure is a :class:`SourcedItem` with its ``error``, never an exception: the other sources go
        on."""
        ...
