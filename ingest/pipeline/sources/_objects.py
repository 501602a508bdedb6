"""Files in object stores as sources: STAC metadata named by URL (``s3://``, ``http(s)://``, Azure blobs), read
through obstore as local files are read (:mod:`ingest.pipeline.sources._files`).

:class:`ObjectFiles` is the kind of source and :class:`RemoteReader` reads NDJSON streamed in chunks, JSON whole,
stac-geoparquet row group by row group and folders by listing; how stores are reached (credentials, timeouts,
retries) is :mod:`ingest.remote`'s. What each kind of file gives: docs/remote-sources.md#what-a-source-can-be.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

import obstore
from obstore.exceptions import NotFoundError

from ingest._threads import DaemonPool, interruptible
from ingest.errors import InvalidSource
from ingest.pipeline._ahead import InOrder, prefetched
from ingest.pipeline.sources._catalogs import remote_catalog_items
from ingest.pipeline.sources._documents import absolute_hrefs, document_items, ndjson_items, parser_said
from ingest.pipeline.sources._geoparquet import geoparquet_file_items
from ingest.pipeline.sources._ndjson_rows import ChunkedLines, LineBlocks, large, ndjson_chunks_sourced
from ingest.pipeline.sources._types import (
    METADATA_SUFFIXES,
    NDJSON_SUFFIXES,
    PARQUET_SUFFIXES,
    TIFF_SUFFIXES,
    SourcedItem,
    SourceName,
    SourceOptions,
)
from ingest.remote import RemoteError, Stores, describe, url_scheme
from ingest.remote._tokens import blob_address
from ingest.stac import loads_json

if TYPE_CHECKING:
    from obstore import ReadableFile
    from obstore.store import ObjectStore


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Target:
    """An object (or a prefix, for folders) in a store, and the URL that names it."""

    store: ObjectStore
    path: str
    url: str
    listable: bool

    @property
    def name(self) -> str:
        """The object's name: its path in the URL (a signed URL's object, or one signed with a SAS token, is
        requested at the empty path of a store of its own, but is named by its URL's path all the same)."""
        return self.path or unquote(urlparse(self.url).path.lstrip("/"))


FOLDER_READS = 16
"""Whole metadata objects of a listed folder fetched at once, on as many threads."""


def _kind(target: _Target) -> str:
    """How an object is read, by its name's suffix: ``ndjson``, ``parquet``, ``tiff`` or ``json`` (whole)."""
    suffix = PurePosixPath(target.name).suffix.lower()
    if suffix in NDJSON_SUFFIXES:
        return "ndjson"
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    return "tiff" if suffix in TIFF_SUFFIXES else "json"


def _waited[T](call: Callable[[], T]) -> T:
    """``call()`` (an obstore request) where Ctrl-C can end the wait for it (:func:`ingest._threads.interruptible`:
    from the main thread on a daemon thread of its own; the stream's thread and the folder's pool are daemons
    already, and call it directly)."""
    return interruptible(call, name="floe-remote-read")


class ObjectFiles:
    """Files and folders named by URL: ``s3://``, ``http(s)://`` (a URL naming a file; one without a file's
    suffix is a STAC API, which the registry asks first) and Azure blob URLs."""

    name = "object-store files"

    def recognises(self, source: SourceName) -> bool:
        return isinstance(source, str) and url_scheme(source) not in (None, "file")

    def read(self, source: SourceName, options: SourceOptions) -> Iterator[SourcedItem]:
        reader = RemoteReader(
            options.stores(),
            rows=options.rows,
            line_readers=options.rows,
            default_collection=options.default_collection,
        )
        yield from reader.read(str(source))


class RemoteReader:
    """Reads sources named by URL through ``stores`` (credentials, public prefixes, timeouts and retries; by
    default the ``AWS_*`` environment's); with ``rows``, stac-geoparquet rows may come as rows
    (``SourceOptions.rows``), and with ``line_readers`` too, a large NDJSON object's lines, read by reader
    processes (``_ndjson_rows.py``: items without a collection take ``default_collection``)."""

    def __init__(
        self,
        stores: Stores | None = None,
        *,
        rows: bool = False,
        line_readers: bool = False,
        default_collection: str | None = None,
    ) -> None:
        self.stores = stores if stores is not None else Stores()
        self.transport = self.stores.transport
        self.rows = rows
        self.line_readers = rows and line_readers
        self.default_collection = default_collection

    # -- the sources ------------------------------------------------------------------------------
    def read(self, url: str) -> Iterator[SourcedItem]:
        """Every item (or collection, or failure) the URL names, in order."""
        try:
            target = self.target(url)
        except RemoteError as error:
            yield SourcedItem(url, error=InvalidSource(error.reason))
            return
        if target.name == "" or target.name.endswith("/"):
            if not target.listable:
                reason = "names a web folder, which cannot be listed over HTTP: name its files"
                yield SourcedItem(url, error=InvalidSource(reason))
                return
            yield from self._read_folder(target)
            return
        yield from self._read_object(target, named=True)

    def target(self, url: str) -> _Target:
        """The store and path of ``url``.

        Raises:
            RemoteError: an unsupported scheme, a URL without bucket or host, or a store obstore refuses to build.
        """
        store, path = self.stores.locate(url)
        listable = url_scheme(url) == "s3" or blob_address(url, self.stores.tokens.path_style) is not None
        return _Target(store, path, url, listable=listable)

    # -- whole objects and streams ----------------------------------------------------------------
    def read_bytes(self, url: str) -> bytes:
        """The whole object at ``url``.

        Raises:
            RemoteError: it cannot be read.
        """
        target = self.target(url)
        return self._bytes(target)

    def _bytes(self, target: _Target) -> bytes:
        try:
            return _waited(lambda: bytes(obstore.get(target.store, target.path).bytes()))
        except Exception as error:
            raise RemoteError(target.url, describe(error)) from error

    # -- kinds of objects -------------------------------------------------------------------------
    def _read_folder(self, target: _Target, *, named_as: str | None = None) -> Iterator[SourcedItem]:
        """The metadata files listed under ``target``, each read as named; ``named_as``: the URL the source
        named (without the ``/``), which a failure names."""
        try:
            children = self._listed(target)
        except RemoteError as error:
            yield SourcedItem(named_as or target.url, error=InvalidSource(error.reason))
            return
        if not children:
            suffixes = " ".join(sorted(METADATA_SUFFIXES))
            reason = (
                f"holds no STAC metadata files ({suffixes})"
                if named_as is None
                else "no such object, nor a folder of STAC metadata files under it"
            )
            yield SourcedItem(named_as or target.url, error=InvalidSource(reason))
            return
        # Each object is a round trip: one after another, a folder of item JSONs 25 ms away arrives at 40 items/s.
        # Whole documents are fetched FOLDER_READS at a time, in order; streams (NDJSON, Parquet) are read as named.
        kinds = [_kind(child) for child in children]
        whole = [child for child, kind in zip(children, kinds, strict=True) if kind == "json"]
        pool = DaemonPool(FOLDER_READS, name="floe-folder")
        fetched = InOrder(pool, whole, self._fetch, FOLDER_READS)
        try:
            for child, kind in zip(children, kinds, strict=True):
                if kind == "json":
                    yield from self._read_json(child, named=False, fetched=fetched.next())
                else:
                    yield from self._read_object(child, named=False)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)  # what runs still is a read whose answer is not wanted

    def _listed(self, target: _Target, sizes: dict[str, int] | None = None) -> list[_Target]:
        """The metadata files under the folder ``target``, sorted by key (``sizes`` gets each one's size by URL).

        Raises:
            RemoteError: the folder cannot be listed.
        """
        address = blob_address(target.url, self.stores.tokens.path_style)
        try:
            if address is not None:
                # An Azure container's folder: listed (and its objects read) through the container's store.
                store, prefix = self.stores.blob_store(address), address.name
            else:
                store, prefix = target.store, target.path
            listed = _waited(
                lambda: {
                    meta["path"]: int(meta["size"]) for chunk in obstore.list(store, prefix or None) for meta in chunk
                }
            )
        except Exception as error:
            raise RemoteError(target.url, f"cannot be listed ({describe(error)})") from error
        keys = sorted(key for key in listed if PurePosixPath(key).suffix.lower() in METADATA_SUFFIXES)
        if address is not None:
            children = [_Target(store, key, address.url_of(key), listable=True) for key in keys]
        else:
            bucket = urlparse(target.url).netloc
            # Each object through the store its own key calls for (a public prefix of the bucket reads unsigned).
            children = [
                _Target(self.stores.bucket_store(bucket, key), key, f"s3://{bucket}/{key}", listable=True)
                for key in keys
            ]
        if sizes is not None:
            sizes.update((child.url, listed[child.path]) for child in children)
        return children

    # -- what a backfill splits (sources/_parts.py) --------------------------------------------
    def files(self, url: str) -> list[tuple[str, int | None]]:
        """The URLs of the metadata files ``url`` names, each with its size where a listing gave it: itself, or
        those listed under a folder (ending in ``/``).

        Raises:
            RemoteError: the URL is not supported, or its folder cannot be listed.
        """
        target = self.target(url)
        if (target.name == "" or target.name.endswith("/")) and target.listable:
            sizes: dict[str, int] = {}
            return [(child.url, sizes.get(child.url)) for child in self._listed(target, sizes)]
        return [(url, None)]

    def read_member(self, url: str) -> Iterator[SourcedItem]:
        """The items of the file at ``url`` read as a member of its folder (a Collection there is not walked)."""
        try:
            target = self.target(url)
        except RemoteError as error:
            yield SourcedItem(url, error=InvalidSource(error.reason))
            return
        yield from self._read_object(target, named=False)

    def open_file(self, url: str) -> _ArrowFile:
        """The object at ``url`` as a seekable binary file, read by range requests.

        Raises:
            RemoteError: it cannot be opened.
        """
        target = self.target(url)
        try:
            reader = _waited(
                lambda: obstore.open_reader(target.store, target.path, buffer_size=self.transport.reader_buffer)
            )
        except Exception as error:
            raise RemoteError(url, describe(error)) from error
        return _ArrowFile(reader)

    def _fetch(self, target: _Target) -> bytes | RemoteError:
        try:
            return self._bytes(target)
        except RemoteError as error:
            return error

    def _read_object(self, target: _Target, *, named: bool) -> Iterator[SourcedItem]:
        kind = _kind(target)
        if kind == "ndjson":
            yield from self._read_ndjson(target)
        elif kind == "parquet":
            yield from self._read_geoparquet(target)
        elif kind == "tiff":
            reason = "a raster without an item: floe makes items from local rasters only (name its item)"
            yield SourcedItem(target.url, error=InvalidSource(reason))
        else:
            yield from self._read_json(target, named=named)

    def _read_ndjson(self, target: _Target) -> Iterator[SourcedItem]:
        try:
            result = _waited(lambda: obstore.get(target.store, target.path))
        except Exception as error:  # noqa: BLE001 - obstore raises builtins and its own kinds
            yield SourcedItem(target.url, error=InvalidSource(describe(error)))
            return
        # The chunks arrive on a thread ahead (see _waited: Ctrl-C reaches a stalled transfer), while lines parse.
        chunks = prefetched(result.stream(min_chunk_size=self.transport.stream_chunk), 2, name="floe-stream")
        lines: _Lines | LineBlocks
        if self.line_readers and large(result.meta["size"]):
            lines = LineBlocks(chunks)
            read = ndjson_chunks_sourced(lines, target.url, default_collection=self.default_collection, base=target.url)
        else:
            lines = _Lines(chunks)
            read = ndjson_items(lines, target.url)
        for sourced in read:
            absolute_hrefs(sourced.item, target.url)
            absolute_hrefs(sourced.collection, target.url)
            yield sourced
        if lines.failure is not None:
            reason = f"the transfer broke off after line {lines.count} ({describe(lines.failure)})"
            yield SourcedItem(target.url, error=InvalidSource(reason))

    def _read_json(
        self, target: _Target, *, named: bool, fetched: bytes | RemoteError | None = None
    ) -> Iterator[SourcedItem]:
        data = self._fetch(target) if fetched is None else fetched
        if isinstance(data, RemoteError):
            yield SourcedItem(target.url, error=InvalidSource(data.reason))
            return
        try:
            document = loads_json(data)
        except UnicodeDecodeError as error:
            yield SourcedItem(target.url, error=InvalidSource(f"not UTF-8 (byte {data[error.start]:#04x})"))
            return
        except json.JSONDecodeError as error:
            reason = f"not valid JSON ({parser_said(error)} line {error.lineno}, column {error.colno})"
            yield SourcedItem(target.url, error=InvalidSource(reason))
            return
        if named and isinstance(document, dict) and document.get("type") in ("Catalog", "Collection"):
            yield from remote_catalog_items(target.url, document, self.read_bytes)
            return
        for sourced in document_items(document, target.url):
            absolute_hrefs(sourced.item, target.url)
            absolute_hrefs(sourced.collection, target.url)
            yield sourced

    def _read_geoparquet(self, target: _Target) -> Iterator[SourcedItem]:
        """Items of a stac-geoparquet object, one record batch (of one row group) at a time, through a seekable
        reader (range requests); a partitioned dataset named without its ``/`` is read as the folder it is."""
        try:
            reader = _waited(
                lambda: obstore.open_reader(target.store, target.path, buffer_size=self.transport.reader_buffer)
            )
        except Exception as error:  # noqa: BLE001 - obstore raises builtins and its own kinds
            missing = isinstance(error, (FileNotFoundError, NotFoundError))
            if target.listable and missing and not target.url.endswith("/"):
                # No such object: a partitioned dataset is a folder named so (``items/<collection>.parquet/``).
                try:
                    folder = self.target(target.url + "/")
                except RemoteError as failure:
                    yield SourcedItem(target.url, error=InvalidSource(failure.reason))
                    return
                yield from self._read_folder(folder, named_as=target.url)
                return
            yield SourcedItem(target.url, error=InvalidSource(describe(error)))
            return
        file = _ArrowFile(reader)
        try:
            yield from geoparquet_file_items(file, target.url, base=target.url, as_rows=self.rows)
        finally:
            file.close()


class _Lines(ChunkedLines):
    """The lines of a stream of byte chunks (without their ``\\n``); a line cut between chunks is joined.

    A transfer that fails part way ends the lines (the part of a line it cut
    is dropped, not reported as bad JSON) and is kept in ``failure``.
    """

    def __iter__(self) -> Iterator[bytes]:
        pending: list[bytes] = []
        for chunk in self._chunks:
            parts = chunk.split(b"\n")
            if len(parts) == 1:
                pending.append(chunk)
                continue
            pending.append(parts[0])
            for line in (b"".join(pending), *parts[1:-1]):
                self.count += 1
                yield line
            pending = [parts[-1]] if parts[-1] else []
        tail = b"".join(pending)
        if tail and self.failure is None:
            self.count += 1
            yield tail


class _ArrowFile(io.RawIOBase):
    """obstore's seekable reader as the file object pyarrow expects (it wants ``closed`` and ``readinto``).

    A failed read is kept in ``failure`` so the rejection can say it was the
    transfer, not the file, that failed.
    """

    def __init__(self, reader: ReadableFile) -> None:
        super().__init__()
        self._reader = reader
        self.failure: BaseException | None = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._reader.seek(offset, whence)

    def tell(self) -> int:
        return self._reader.tell()

    def size(self) -> int:
        return self._reader.size

    def readinto(self, buffer: Any) -> int:
        data = self._guarded(lambda: self._reader.read(len(buffer)))
        view = memoryview(buffer).cast("B")
        view[: len(data)] = data
        return len(data)

    def read(self, size: int | None = -1) -> bytes:
        return bytes(self._guarded(lambda: self._reader.read(None if size is None or size < 0 else size)))

    def _guarded(self, read: Callable[[], Any]) -> Any:
        try:
            return read()
        except Exception as error:
            self.failure = error
            raise

    def close(self) -> None:
        if not self.closed:
            self._reader.close()
        super().close()
