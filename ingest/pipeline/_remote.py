"""Read STAC metadata named by URL (``s3://``, ``http(s)://``) through obstore, as local files are read.

The same kinds of files as :mod:`ingest.pipeline._sources` reads from disk:

- **NDJSON** (``.ndjson .jsonl .geojsonl``) is streamed: the object arrives
  in chunks of :attr:`Transport.stream_chunk` bytes, split into lines (a line
  cut by a chunk boundary is carried over), and each line is read on its own,
  labelled ``URL:LINE``. A large file is never held whole.
- **JSON** (``.json .geojson``, or no known suffix): an item, a
  FeatureCollection or an array, read whole. A STAC Catalog or Collection
  named by URL is walked through its links (:class:`ObstoreStacIO`), so
  relative links resolve against the URL, on S3 as over HTTP.
- **stac-geoparquet** (``.parquet .geoparquet``) is read row group by row
  group through a seekable reader (range requests), labelled ``URL#rowN``.
- A **folder**, ``s3://bucket/prefix/`` or an Azure container's
  ``https://{account}.blob.core.windows.net/{container}/prefix/`` (ending in
  ``/``), is listed: its metadata files, sorted by key, each read as above
  (rasters are ignored). A partitioned stac-geoparquet dataset (Planetary
  Computer's ``items/<collection>.parquet/``) is such a folder.

Relative asset hrefs become absolute URLs (joined with the URL of the file
the item came from), so a stored item never points somewhere relative to a
place floe does not keep.

How stores are reached (credentials, timeouts, retries) is :mod:`ingest.remote`'s.

Failures are rejections naming the URL (an unreachable host, 403, "no such
object", a timeout, a document cut short or not JSON); the other sources go
on, after obstore's retries of transient failures.
"""

from __future__ import annotations

import io
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

import obstore
import pystac
from obstore.exceptions import NotFoundError

from ingest._threads import DaemonPool, interruptible
from ingest.errors import InvalidSource
from ingest.pipeline._ahead import InOrder
from ingest.pipeline._pages import prefetched
from ingest.pipeline._sources import (
    METADATA_SUFFIXES,
    NDJSON_SUFFIXES,
    PARQUET_SUFFIXES,
    TIFF_SUFFIXES,
    SourcedItem,
    _from_document,
    _read_ndjson,
    _what,
)
from ingest.remote import RemoteError, Stores, describe, join_url, url_scheme
from ingest.remote._tokens import blob_address
from ingest.stac import ARRAYS_ASSET, geoparquet_items, loads_json, row_group_batches

if TYPE_CHECKING:
    from obstore import ReadableFile
    from obstore.store import ObjectStore


log = logging.getLogger(__name__)


def absolute_hrefs(document: Any, base: str) -> None:
    """Make the relative asset hrefs of an item or collection ``document`` absolute against ``base``, in place."""
    assets = document.get("assets") if isinstance(document, dict) else None
    if not isinstance(assets, dict):
        return
    for key, asset in assets.items():
        if key == ARRAYS_ASSET or not isinstance(asset, dict):
            continue
        href = asset.get("href")
        if isinstance(href, str) and href and url_scheme(href) is None:
            asset["href"] = join_url(base, href)


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


class RemoteReader:
    """Reads sources named by URL through ``stores`` (credentials, public prefixes, timeouts and retries; by
    default the ``AWS_*`` environment's)."""

    def __init__(self, stores: Stores | None = None) -> None:
        self.stores = stores if stores is not None else Stores()
        self.transport = self.stores.transport

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
        address = blob_address(target.url, self.stores.tokens.path_style)
        try:
            if address is not None:
                # An Azure container's folder: listed (and its objects read) through the container's store.
                store, prefix = self.stores.blob_store(address), address.name
            else:
                store, prefix = target.store, target.path
            listed = _waited(lambda: [meta["path"] for chunk in obstore.list(store, prefix or None) for meta in chunk])
        except Exception as error:  # noqa: BLE001 - obstore raises builtins and its own kinds
            yield SourcedItem(named_as or target.url, error=InvalidSource(f"cannot be listed ({describe(error)})"))
            return
        keys = sorted(key for key in listed if PurePosixPath(key).suffix.lower() in METADATA_SUFFIXES)
        if not keys:
            suffixes = " ".join(sorted(METADATA_SUFFIXES))
            reason = (
                f"holds no STAC metadata files ({suffixes})"
                if named_as is None
                else "no such object, nor a folder of STAC metadata files under it"
            )
            yield SourcedItem(named_as or target.url, error=InvalidSource(reason))
            return
        if address is not None:
            children = [_Target(store, key, address.url_of(key), listable=True) for key in keys]
        else:
            bucket = urlparse(target.url).netloc
            # Each object through the store its own key calls for (a public prefix of the bucket reads unsigned).
            children = [
                _Target(self.stores.bucket_store(bucket, key), key, f"s3://{bucket}/{key}", listable=True)
                for key in keys
            ]
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
        lines = _Lines(prefetched(result.stream(min_chunk_size=self.transport.stream_chunk), 2, name="floe-stream"))
        for sourced in _read_ndjson(lines, target.url):
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
            reason = f"not valid JSON ({_what(error)} line {error.lineno}, column {error.colno})"
            yield SourcedItem(target.url, error=InvalidSource(reason))
            return
        if named and isinstance(document, dict) and document.get("type") in ("Catalog", "Collection"):
            yield from self._walk_catalog(target.url, document)
            return
        for sourced in _from_document(document, target.url):
            absolute_hrefs(sourced.item, target.url)
            absolute_hrefs(sourced.collection, target.url)
            yield sourced

    def _walk_catalog(self, url: str, document: dict[str, Any]) -> Iterator[SourcedItem]:
        """A STAC Catalog or Collection named by URL: its collections and items, following its links."""
        stac_io = ObstoreStacIO(self)
        try:
            root = pystac.read_dict(document, href=url, stac_io=stac_io)
        except Exception as error:  # noqa: BLE001 - pystac raises many kinds; all mean "not a readable catalog"
            yield SourcedItem(url, error=InvalidSource(f"not a readable STAC catalog ({error})"))
            return
        if not isinstance(root, pystac.Catalog):  # a Collection is a Catalog too
            yield SourcedItem(url, error=InvalidSource(f"not a STAC catalog or collection ({type(root).__name__})"))
            return
        try:
            collections: list[pystac.Collection] = [root] if isinstance(root, pystac.Collection) else []
            collections += list(root.get_all_collections())
            for collection in collections:
                collection_url = collection.self_href or url
                collection_dict = collection.to_dict(include_self_link=False)
                absolute_hrefs(collection_dict, collection_url)
                yield SourcedItem(collection_url, collection=collection_dict)
            for item in root.get_items(recursive=True):
                href = item.get_self_href() or url
                item_dict = item.to_dict(include_self_link=False, transform_hrefs=False)
                absolute_hrefs(item_dict, href)
                yield SourcedItem(href, item=item_dict)
        except Exception as error:  # noqa: BLE001 - pystac raises many kinds for a broken child
            remote = _remote_cause(error)
            reason = (
                f"the catalog's link to {remote.url} failed: {remote.reason}"
                if remote is not None
                else f"the catalog could not be walked to its end ({error})"
            )
            yield SourcedItem(url, error=InvalidSource(reason))

    def _read_geoparquet(self, target: _Target) -> Iterator[SourcedItem]:
        """Items of a stac-geoparquet object, one record batch (of one row group) at a time."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        row = 0
        file: _ArrowFile | None = None
        try:
            try:
                file = _ArrowFile(
                    _waited(
                        lambda: obstore.open_reader(target.store, target.path, buffer_size=self.transport.reader_buffer)
                    )
                )
            except Exception as error:  # noqa: BLE001 - obstore raises builtins and its own kinds
                if (
                    target.listable
                    and isinstance(error, (FileNotFoundError, NotFoundError))
                    and not target.url.endswith("/")
                ):
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

            def batches(opened: _ArrowFile) -> Iterator[pa.RecordBatch]:
                yield from row_group_batches(pq.ParquetFile(opened))

            try:
                # Read and decoded on a thread ahead (see _waited), while the last batch becomes items here.
                for batch in prefetched(batches(file), 2, name="floe-stream"):
                    for item in geoparquet_items(batch):
                        absolute_hrefs(item, target.url)
                        yield SourcedItem(f"{target.url}#row{row}", item=item)
                        row += 1
            except Exception as error:  # noqa: BLE001 - any failure means the object is not stac-geoparquet
                if file.failure is not None:
                    reason = f"the transfer broke off after row {row} ({describe(file.failure)})"
                else:
                    reason = f"not a readable stac-geoparquet file ({error})"
                yield SourcedItem(target.url, error=InvalidSource(reason))
        finally:
            if file is not None:
                file.close()


def _remote_cause(error: BaseException | None) -> RemoteError | None:
    """The :class:`RemoteError` behind ``error`` (pystac wraps what a StacIO raises in its own errors)."""
    while error is not None:
        if isinstance(error, RemoteError):
            return error
        error = error.__cause__ or error.__context__
    return None


class _Lines:
    """The lines of a stream of byte chunks (without their ``\\n``); a line cut between chunks is joined.

    A transfer that fails part way ends the lines (the part of a line it cut
    is dropped, not reported as bad JSON) and is kept in ``failure``.
    """

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = chunks
        self.failure: BaseException | None = None
        self.count = 0

    def __iter__(self) -> Iterator[bytes]:
        pending: list[bytes] = []
        chunks = iter(self._chunks)
        while True:
            try:
                chunk = next(chunks)
            except StopIteration:
                break
            except Exception as error:  # noqa: BLE001 - obstore raises builtins and its own kinds
                self.failure = error
                return
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
        if tail:
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


class ObstoreStacIO(pystac.StacIO):
    """A ``pystac.StacIO`` that reads through a :class:`RemoteReader` (so ``s3://`` catalogs walk); never writes."""

    def __init__(self, reader: RemoteReader) -> None:
        super().__init__()
        self.reader = reader

    def read_text(self, source: Any, *args: Any, **kwargs: Any) -> str:
        href = str(os.fspath(source))
        data = self.reader.read_bytes(href)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise RemoteError(href, f"not UTF-8 (byte {data[error.start]:#04x})") from error

    def write_text(self, dest: Any, txt: str, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("floe reads catalogs from URLs; it never writes to them")
