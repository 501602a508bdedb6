"""Where items come from: every kind of source behind one contract, and the registry an ingest reads through.

A kind (:class:`Source`) recognises the paths or URLs of its kind and reads them into :class:`SourcedItem` values;
:func:`read_items` reads each source with the first kind :func:`registered` lists that recognises it. The kinds:
docs/design.md §5 (sources); their modules: docs/lifecycle.md#where-the-code-lives.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from ingest._lazy import lazy_names
from ingest.errors import InvalidSource
from ingest.pipeline.sources._types import (
    FILE_SUFFIXES,
    METADATA_SUFFIXES,
    STDIN,
    TIFF_SUFFIXES,
    SearchParameters,
    Source,
    SourcedItem,
    SourcedRows,
    SourceName,
    SourceOptions,
    SourcePart,
)

if TYPE_CHECKING:
    from ingest.pipeline.sources._api import (
        ApiSearch,
        SearchLane,
        StacApi,
        cursor_metadata,
        filter_json,
        is_api_url,
        parse_since,
    )
    from ingest.pipeline.sources._api_shares import merged_searches
    from ingest.pipeline.sources._files import LocalFiles, expand_paths
    from ingest.pipeline.sources._objects import ObjectFiles, RemoteReader
    from ingest.pipeline.sources._parts import PartFiles, count_lines, numbered, split_sources

# The kinds' modules load when first used (``ingest._lazy``): the page reader, a process of its own, imports the
# STAC API's modules alone, not pystac's catalogs or obstore.
_HOMES = {
    **dict.fromkeys(
        ("ApiSearch", "SearchLane", "StacApi", "cursor_metadata", "filter_json", "is_api_url", "parse_since"),
        "ingest.pipeline.sources._api",
    ),
    "merged_searches": "ingest.pipeline.sources._api_shares",
    **dict.fromkeys(("LocalFiles", "expand_paths"), "ingest.pipeline.sources._files"),
    **dict.fromkeys(("ObjectFiles", "RemoteReader"), "ingest.pipeline.sources._objects"),
    **dict.fromkeys(("PartFiles", "count_lines", "numbered", "split_sources"), "ingest.pipeline.sources._parts"),
}
__getattr__ = lazy_names(__name__, globals(), _HOMES)


@functools.cache
def registered() -> tuple[Source, ...]:
    """The kinds of source, in the order they are asked: parts of files (a backfill's), local files, a STAC API,
    then files at URLs (an ``https://`` URL without a file's suffix names an API). Made on first use: each kind's
    module loads then.

    A new kind is a module with a class that meets :class:`Source`, added here before any kind that would recognise
    its sources too."""
    from ingest.pipeline.sources._api import StacApi
    from ingest.pipeline.sources._files import LocalFiles
    from ingest.pipeline.sources._objects import ObjectFiles
    from ingest.pipeline.sources._parts import PartFiles

    return (PartFiles(), LocalFiles(), StacApi(), ObjectFiles())


def source_kind(source: SourceName) -> Source | None:
    """The kind of source that reads ``source`` (None: none recognises it)."""
    return next((kind for kind in registered() if kind.recognises(source)), None)


def read_items(sources: Iterable[SourceName], options: SourceOptions | None = None) -> Iterator[SourcedItem]:
    """Every item in ``sources``, in order, each with its label (or the error that kept it out).

    Each source is read by the first kind of source (:func:`registered`) that recognises it. A source that cannot
    be read, in whole or in part, is never an exception: the other sources go on.

    Args:
        sources: each a local path (file or folder), ``-`` (standard input), a ``file://``, ``s3://`` or
            ``http(s)://`` URL of a file (or an ``s3://`` folder, ending in ``/``), a STAC API, or a part of a
            file (:class:`SourcePart`).
        options: how to reach S3 (settings that are set win over the ``AWS_*`` environment) and what to ask STAC
            APIs (default: nothing asked); each STAC API search read is added to its ``searches``.

    Yields:
        Each item, STAC Collection or failure, labelled with where it came from; a failure carries its error (an
        ``InvalidSource``, or an ``InvalidItem`` for an NDJSON line that is not UTF-8 or not JSON), a source no kind
        recognises included.
    """
    options = options if options is not None else SourceOptions()
    for source in sources:
        kind = source_kind(source)
        if kind is None:
            yield SourcedItem(str(source), error=InvalidSource("no kind of source floe reads recognises it"))
            continue
        yield from kind.read(source, options)


__all__ = [
    "FILE_SUFFIXES",
    "METADATA_SUFFIXES",
    "STDIN",
    "TIFF_SUFFIXES",
    "ApiSearch",
    "LocalFiles",
    "ObjectFiles",
    "PartFiles",
    "RemoteReader",
    "SearchLane",
    "SearchParameters",
    "Source",
    "SourceName",
    "SourceOptions",
    "SourcePart",
    "SourcedItem",
    "SourcedRows",
    "StacApi",
    "count_lines",
    "cursor_metadata",
    "expand_paths",
    "filter_json",
    "is_api_url",
    "merged_searches",
    "numbered",
    "parse_since",
    "read_items",
    "registered",
    "source_kind",
    "split_sources",
]
