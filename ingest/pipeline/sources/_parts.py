"""Parts of files as sources: several readers share a large NDJSON or stac-geoparquet file, each labelling what it
reads with the file's own line and row numbers.

:func:`split_sources` plans the parts of a run's sources (a file of NDJSON in byte ranges, one of stac-geoparquet
in runs of rows, anything else whole); :class:`PartFiles` is the kind of source that reads a
:class:`~ingest.pipeline.sources.SourcePart`, locally or by range requests. The metadata backfill
(``ingest/pipeline/_backfill.py``) hands the parts to Ray actors. docs/ingest.md#a-metadata-backfill-on-a-cluster.

An NDJSON part holds the lines that *start* in its byte range: its reader steps back one byte and skips to the end
of the line there, then reads lines until one starts at or past the range's end. So every line belongs to exactly
one part wherever the cuts fall, and a line longer than a part leaves that part empty. A part's first line number
is the number of lines the parts before it hold (:func:`count_lines`, counted by the same reader), plus one.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import IO, Any

from ingest.errors import InvalidSource
from ingest.pipeline.sources._documents import absolute_hrefs, ndjson_items
from ingest.pipeline.sources._files import expand_paths, local_items
from ingest.pipeline.sources._geoparquet import geoparquet_file_items
from ingest.pipeline.sources._types import (
    NDJSON_SUFFIXES,
    PARQUET_SUFFIXES,
    STDIN,
    SourcedItem,
    SourceName,
    SourceOptions,
    SourcePart,
)
from ingest.remote import RemoteError, describe, file_url_path, url_scheme

READ_BUFFER = 1 << 20
"""Bytes a part's reader buffers (local files and range requests alike)."""


class PartFiles:
    """Parts of files (:class:`~ingest.pipeline.sources.SourcePart`): byte ranges of NDJSON, runs of rows of
    stac-geoparquet, on this machine or at a URL."""

    name = "parts of files"

    def recognises(self, source: SourceName) -> bool:
        return isinstance(source, SourcePart)

    def read(self, source: SourceName, options: SourceOptions) -> Iterator[SourcedItem]:
        assert isinstance(source, SourcePart), "recognises() takes parts only"
        if source.kind == "member":
            yield from _member_items(source, options)
        elif source.kind == "geoparquet":
            yield from _row_items(source, options)
        else:
            yield from _line_items(source, options)


def _member_items(part: SourcePart, options: SourceOptions) -> Iterator[SourcedItem]:
    """A file listed in a folder, read as its folder reads it."""
    if url_scheme(part.file) is None:
        yield from local_items([Path(part.file)], as_named=False, rows=options.rows)
        return
    from ingest.pipeline.sources._objects import RemoteReader

    yield from RemoteReader(options.stores(), rows=options.rows).read_member(part.file)


def _row_items(part: SourcePart, options: SourceOptions) -> Iterator[SourcedItem]:
    """A run of rows of a stac-geoparquet file, labelled with the file's row numbers."""
    rows = range(part.start, part.stop)
    if url_scheme(part.file) is None:
        # pyarrow reads a local file itself (a Python file object between them costs a copy).
        path = Path(part.file)
        yield from geoparquet_file_items(path, part.file, path=path, rows=rows, as_rows=options.rows)
        return
    try:
        stream = _opened(part.file, options)
    except RemoteError as error:
        yield SourcedItem(str(part), error=InvalidSource(error.reason))
        return
    with stream:
        yield from geoparquet_file_items(stream, part.file, base=part.file, rows=rows, as_rows=options.rows)


def _line_items(part: SourcePart, options: SourceOptions) -> Iterator[SourcedItem]:
    """The lines of an NDJSON part, numbered as in the whole file."""
    remote = url_scheme(part.file) is not None
    try:
        stream = _opened(part.file, options)
    except (OSError, RemoteError) as error:
        reason = error.reason if isinstance(error, RemoteError) else f"cannot be read ({error})"
        yield SourcedItem(str(part), error=InvalidSource(reason))
        return
    with stream:
        try:
            path = None if remote else Path(part.file)
            for sourced in ndjson_items(_part_lines(stream, part), part.file, path, first=part.first):
                if remote:
                    absolute_hrefs(sourced.item, part.file)
                    absolute_hrefs(sourced.collection, part.file)
                yield sourced
        except (OSError, RemoteError) as error:
            reason = error.reason if isinstance(error, RemoteError) else describe(error)
            yield SourcedItem(str(part), error=InvalidSource(f"the read broke off ({reason})"))


def count_lines(part: SourcePart, options: SourceOptions) -> int:
    """How many lines (blank ones too) the NDJSON ``part`` holds: what numbers the next part's first line.

    Raises:
        OSError, RemoteError: the file cannot be read.
    """
    with _opened(part.file, options) as stream:
        return sum(1 for _ in _part_lines(stream, part))


def numbered(parts: list[SourcePart], counts: Iterable[int]) -> list[SourcePart]:
    """The NDJSON ``parts`` of one file, in order, each given its first line's number from the line ``counts`` of
    the parts before it."""
    first = 1
    out = []
    for part, count in zip(parts, counts, strict=True):
        out.append(replace(part, first=first))
        first += count
    return out


def split_sources(
    sources: Iterable[SourceName], part_bytes: int, options: SourceOptions, *, workers: int = 2
) -> list[list[SourceName]] | None:
    """The shares a run's ``sources`` are read in, each of about ``part_bytes``: NDJSON files cut into byte ranges,
    stac-geoparquet files into runs of rows of about as many bytes on disk, and other files (item JSON,
    FeatureCollections, small files) whole, several to a share until it is full. NDJSON parts after a file's first
    still need their first line's number (:func:`count_lines`, :func:`numbered`).

    A file that cannot be looked at here (it is missing, unreadable, not Parquet) is left whole: reading it reports
    why, as a single reader would.

    A STAC API search is cut into time lanes (:func:`~ingest.pipeline.sources._api_shares.search_lanes`, about
    two for each of ``workers``), a share each.

    Returns:
        The shares, in the sources' order, each a list of parts, files and lanes; None if some source cannot be
        split at all (standard input, a search that makes one lane): the run is then read by one reader.
    """
    from ingest.pipeline.sources._api import SearchLane, StacApi
    from ingest.pipeline.sources._api_shares import search_lanes
    from ingest.pipeline.sources._files import LocalFiles
    from ingest.pipeline.sources._objects import ObjectFiles, RemoteReader

    sized: list[tuple[SourceName, int]] = []
    reader: RemoteReader | None = None
    # The kinds asked in the registry's order (a STAC API's URL is an https:// URL too).
    kinds = (LocalFiles(), StacApi(), ObjectFiles())
    for source in sources:
        if isinstance(source, SourcePart | SearchLane):
            sized.append((source, part_bytes))
            continue
        kind = next((kind for kind in kinds if kind.recognises(source)), None)
        if isinstance(kind, LocalFiles):
            local: SourceName = file_url_path(source) if isinstance(source, str) and url_scheme(source) else source
            for path in expand_paths([local]):  # type: ignore[list-item]  # a part is not a LocalFiles source
                if path == STDIN:
                    return None
                member = Path(path) != Path(local)  # type: ignore[arg-type]  # listed in a folder named
                sized.extend(_file_parts(str(path), None, part_bytes, options, member=member))
        elif isinstance(kind, ObjectFiles):
            reader = reader or RemoteReader(options.stores())
            try:
                files = reader.files(str(source))
            except RemoteError:
                sized.append((source, 0))  # its read says why it cannot be listed
                continue
            for url, size in files:
                sized.extend(_file_parts(url, size, part_bytes, options, member=url != str(source)))
        elif isinstance(kind, StacApi):
            shares = search_lanes(str(source), options, workers)
            if shares is None:
                return None
            sized.extend((share, part_bytes) for share in shares)
        else:
            return None
    return _shares(sized, part_bytes)


def _shares(sized: list[tuple[SourceName, int]], part_bytes: int) -> list[list[SourceName]]:
    """Consecutive sources packed into shares of about ``part_bytes`` (a source as large is a share of its own)."""
    shares: list[list[SourceName]] = []
    taken = 0
    for source, size in sized:
        if not shares or taken + size > part_bytes:
            shares.append([])
            taken = 0
        shares[-1].append(source)
        taken += size
    return shares


def _file_parts(
    file: str, size: int | None, part_bytes: int, options: SourceOptions, *, member: bool
) -> list[tuple[SourceName, int]]:
    """One file's parts, with the bytes each reads: the file itself when it is read whole (named, or as a
    ``member`` of the folder it was listed in)."""
    suffix = PurePosixPath(file.split("?", 1)[0]).suffix.lower()
    remote = url_scheme(file) is not None
    whole: SourceName = SourcePart(file, "member", 0, 0) if member else file if remote else Path(file)
    try:
        size = size if size is not None else _size(file, options)
        if suffix in NDJSON_SUFFIXES:
            count = max(1, -(-size // max(1, part_bytes)))
            cuts = [size * index // count for index in range(count + 1)]
            return [(SourcePart(file, "ndjson", start, stop), stop - start) for start, stop in itertools.pairwise(cuts)]
        if suffix in PARQUET_SUFFIXES:
            return list(_row_parts(file, part_bytes, options)) or [(whole, size)]
    except (OSError, RemoteError, ValueError):
        return [(whole, 0)]  # reading it whole reports why it cannot be read
    return [(whole, size)]


def _row_parts(file: str, part_bytes: int, options: SourceOptions) -> Iterator[tuple[SourcePart, int]]:
    """Runs of the file's rows of about ``part_bytes`` on disk each (by the file's average row), with their bytes.
    A part may cut a row group: its reader decodes the whole group and keeps its rows, which costs little beside
    making items of them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with _opened(file, options) as stream:
            metadata = pq.ParquetFile(stream).metadata
    except pa.ArrowException as error:
        raise ValueError(str(error)) from error
    rows = metadata.num_rows
    size = sum(
        metadata.row_group(group).column(column).total_compressed_size
        for group in range(metadata.num_row_groups)
        for column in range(metadata.num_columns)
    )
    count = max(1, min(rows, -(-size // max(1, part_bytes))))
    cuts = [rows * index // count for index in range(count + 1)]
    for start, stop in itertools.pairwise(cuts):
        yield SourcePart(file, "geoparquet", start, stop), size * (stop - start) // max(1, rows)


def _size(file: str, options: SourceOptions) -> int:
    if url_scheme(file) is None:
        return Path(file).stat().st_size
    from ingest.remote import head

    return int(head(options.stores(), file)["size"])


def _opened(file: str, options: SourceOptions) -> IO[bytes]:
    """``file`` (a path or a URL) as a buffered, seekable binary stream."""
    if url_scheme(file) is None:
        return open(file, "rb", buffering=READ_BUFFER)
    from ingest.pipeline.sources._objects import RemoteReader

    raw: Any = RemoteReader(options.stores()).open_file(file)
    return io.BufferedReader(raw, buffer_size=READ_BUFFER)


def _part_lines(stream: IO[bytes], part: SourcePart) -> Iterator[bytes]:
    """The lines (with their ``\\n``) that start within the part's byte range."""
    if part.start > 0:
        stream.seek(part.start - 1)
        stream.readline()  # the rest of the line that began before the part (or the newline just before it)
    position = stream.tell()
    while position < part.stop:
        line = stream.readline()
        if not line:
            return
        position += len(line)
        yield line
