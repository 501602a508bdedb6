"""The items table's FileIO on S3: PyArrow's, except that whole objects are read in one GET and written in one PUT.

:class:`ObjectFileIO` reads metadata.json files, manifest lists and manifests through obstore, one ``GET`` each, and
sends each table file in one conditional ``PUT``; its store comes from the same settings as PyArrow's filesystem and
Icechunk's storage (:mod:`ingest._aws`). Why: docs/design.md §8 (one GET per metadata object, conditional writes).
"""

from __future__ import annotations

import contextlib
import io
import logging
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import TYPE_CHECKING, Any

import obstore
from obstore.exceptions import AlreadyExistsError
from pyiceberg.io import InputStream, OutputStream
from pyiceberg.io.pyarrow import PyArrowFile, PyArrowFileIO

from ingest.remote._buckets import Buckets, s3_endpoint
from ingest.remote._errors import describe
from ingest.remote._object_cache import DiskCache, KeptBytes
from ingest.remote._stores import Stores

if TYPE_CHECKING:
    from obstore.store import ObjectStore

    from ingest.config import S3Settings

log = logging.getLogger(__name__)

PUTS_AT_ONCE = 16
"""Writes sent at once by :meth:`ObjectFileIO.writes_together` (a batch's data files: one PUT each)."""
READ_WHOLE = (".metadata.json", ".avro", ".ids.parquet")
"""What is read whole (table versions, manifest lists, manifests, floe's id sketches beside them): in one GET."""
KEPT_WRITTEN_BYTES = 32 << 20
"""Table metadata this FileIO wrote, kept in memory for reading back (a writer's next batch starts from it)."""


class ObjectFileIO(PyArrowFileIO):
    """PyArrow's FileIO for an ``s3://`` root, reading table metadata in one GET each.

    :meth:`get` reads a metadata.json, a manifest list or a manifest whole, through obstore: PyArrow's S3 filesystem
    asks an object's size (``HEAD``) before it reads a byte, whether opened for random access or as a stream (Arrow's
    ``S3FileSystem::OpenInputFile`` and ``OpenInputStream`` both start with ``ObjectInputFile::Init``). The rest
    (deletes, data files opened by their size, ``len``, ``exists``) is PyArrow's. Every table file is written whole
    from memory (floe builds a data file's bytes before writing it; Avro and JSON writers are small), so one ``PUT``
    sends it when its stream closes (:meth:`put`), conditional on no object being there (``If-None-Match: *``: S3's
    atomic create) unless overwriting is asked for, and the FileIO knows the length it wrote.
    """

    def __init__(self, properties: dict[str, str], s3: S3Settings) -> None:
        super().__init__(properties=properties)
        self.s3 = s3
        self._stores: Stores | None = None
        self._local = threading.local()
        self._no_conditions = False
        """The store refused a conditional PUT: creation asks whether the object exists first."""
        self.kept = KeptBytes(KEPT_WRITTEN_BYTES)
        """The table metadata written here: its next read is free (see ``_object_cache.py``)."""
        self.disk: DiskCache | None = None
        """Where objects read and written are kept on local disk, once :meth:`keep_on_disk` set it."""

    def __getstate__(self) -> dict[str, Any]:
        # obstore's stores are clients, remade on first use wherever this FileIO is unpickled (a Ray actor).
        state = super().__getstate__()
        state["_stores"] = state["disk"] = None
        del state["_local"], state["kept"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._local = threading.local()
        self.kept = KeptBytes(KEPT_WRITTEN_BYTES)

    def keep_on_disk(self, cache: DiskCache | None) -> None:
        """Keep the objects read whole (table metadata, small data files) and written in ``cache`` from now on.

        Only for a repository whose metadata names its own root (``Repository.open`` checked it): the objects of
        a copy not yet relocated are rewritten in place by ``floe relocate``, and must not be kept.
        """
        self.disk = cache

    def new_input(self, location: str) -> PyArrowFile:
        if location.startswith("s3://") and location.endswith(READ_WHOLE):
            return _WholeObject(location, self)
        return super().new_input(location)

    def new_output(self, location: str) -> PyArrowFile:
        if location.startswith("s3://"):
            return _WholeOutput(location, self)
        return super().new_output(location)

    def _store(self, location: str) -> tuple[ObjectStore, str]:
        bucket, _, key = location.removeprefix("s3://").partition("/")
        if self._stores is None:
            # The repository's region is settled (ingest._aws): PyArrow and Icechunk use it, so does this store.
            self._stores = Stores(s3=self.s3, buckets=Buckets(find=False, endpoint=s3_endpoint(self.s3)))
        # The key is the location's path as it is: Iceberg's paths are not URL-escaped (a partition value's "%" is
        # written "%25" in the key itself), so nothing is unquoted.
        return self._stores.bucket_store(bucket, key, url=location), key

    @contextlib.contextmanager
    def writes_together(self) -> Iterator[None]:
        """Within the block, this thread's writes wait; when it ends they are sent together, ``PUTS_AT_ONCE`` at a
        time, and the first failure is raised. A block left by an exception sends none."""
        pending: list[tuple[str, bytes, bool]] = []
        self._local.pending = pending
        try:
            yield
        finally:
            self._local.pending = None
        if pending:
            with ThreadPoolExecutor(min(PUTS_AT_ONCE, len(pending)), thread_name_prefix="floe-puts") as pool:
                list(pool.map(lambda write: self.put(write[0], write[1], overwrite=write[2]), pending))

    def put(self, location: str, data: bytes, *, overwrite: bool) -> None:
        """Write ``data`` as the object at ``location`` in one PUT; without ``overwrite``, only if none is there.
        Inside :meth:`writes_together`, the PUT waits for the block's end.

        Raises:
            FileExistsError: an object is there already (and ``overwrite`` is False).
            OSError: the store refused or could not be reached (named, with the cause).
        """
        pending = getattr(self._local, "pending", None)
        if pending is not None:
            pending.append((location, data, overwrite))
            return
        store, key = self._store(location)
        conditional = not overwrite and not self._no_conditions
        try:
            if not overwrite and not conditional and _exists(store, key):
                raise AlreadyExistsError(f"{location} exists")
            obstore.put(store, key, data, mode="create" if conditional else "overwrite")
            self._remember(location, data)
        except AlreadyExistsError as error:
            raise FileExistsError(f"Cannot create file, already exists: {location}") from error
        except Exception as error:  # obstore raises builtins and its own kinds
            if conditional and _refuses_conditions(error):
                # An S3-compatible server without conditional writes (If-None-Match): ask first, as PyArrow does.
                log.info("%s refuses conditional writes; table files are created after a HEAD instead", location)
                self._no_conditions = True
                self.put(location, data, overwrite=overwrite)
                return
            raise OSError(f"cannot write {location}: {describe(error)}") from error

    def _remember(self, location: str, data: bytes) -> None:
        if location.endswith(READ_WHOLE):
            self.kept.keep(location, data)
        if self.disk is not None:
            self.disk.keep(location, data)

    def get(self, location: str) -> bytes:
        """The whole object at ``location`` (an ``s3://`` URL), in one GET, unless this FileIO wrote it (or holds
        it in a pending :meth:`writes_together` block) or its disk cache has it.

        Raises:
            FileNotFoundError: no object is there.
            OSError: the store could not be read (named, with the cause).
        """
        for pending_location, data, _ in getattr(self._local, "pending", None) or ():
            if pending_location == location:
                return data
        data = self.kept.get(location)
        if data is None and self.disk is not None:
            data = self.disk.get(location)
        if data is not None:
            return data
        try:
            store, key = self._store(location)
            data = bytes(obstore.get(store, key).bytes())
        except FileNotFoundError as error:  # obstore's NotFoundError is one
            raise FileNotFoundError(f"{location}: no such object") from error
        except Exception as error:  # obstore raises builtins and its own kinds
            raise OSError(f"cannot read {location}: {describe(error)}") from error
        if self.disk is not None:
            self.disk.keep(location, data)
        return data


class _WholeObject(PyArrowFile):
    """An object PyIceberg reads whole: fetched in one GET when opened (its size and existence, PyArrow's)."""

    def __init__(self, location: str, file_io: ObjectFileIO) -> None:
        scheme, netloc, path = PyArrowFileIO.parse_location(location)
        super().__init__(location, path, file_io.fs_by_scheme(scheme, netloc))
        self.file_io = file_io

    def open(self, seekable: bool = True) -> InputStream:  # a buffer is always seekable
        return io.BytesIO(self.file_io.get(self.location))


class _WholeOutput(PyArrowFile):
    """A table file written whole: buffered, then one PUT when its stream closes (:meth:`ObjectFileIO.put`)."""

    def __init__(self, location: str, file_io: ObjectFileIO) -> None:
        scheme, netloc, path = PyArrowFileIO.parse_location(location)
        super().__init__(location, path, file_io.fs_by_scheme(scheme, netloc))
        self.file_io = file_io
        self.written: int | None = None

    def create(self, overwrite: bool = False) -> OutputStream:
        return _PutOnClose(self, overwrite=overwrite)

    def __len__(self) -> int:
        return self.written if self.written is not None else super().__len__()


class _PutOnClose(io.BytesIO):
    """The bytes of one table file, PUT when closed (not when left by an exception: nothing half-written lands)."""

    def __init__(self, output: _WholeOutput, *, overwrite: bool) -> None:
        super().__init__()
        self.output = output
        self.overwrite = overwrite
        self.failed = False

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.failed = kind is not None
        super().__exit__(kind, value, traceback)

    def close(self) -> None:
        if not self.closed and not self.failed:
            data = self.getvalue()
            self.output.file_io.put(self.output.location, data, overwrite=self.overwrite)
            self.output.written = len(data)
        super().close()


def writes_together(file_io: object) -> contextlib.AbstractContextManager[None]:
    """:meth:`ObjectFileIO.writes_together` for a table on S3; on a local disk each write is done at once (a write
    there costs microseconds, not a round trip)."""
    return file_io.writes_together() if isinstance(file_io, ObjectFileIO) else contextlib.nullcontext()


def _exists(store: ObjectStore, key: str) -> bool:
    try:
        obstore.head(store, key)
    except FileNotFoundError:  # obstore's NotFoundError is one
        return False
    return True


def _refuses_conditions(error: BaseException) -> bool:
    """Whether a PUT failed because the server does not do ``If-None-Match`` (501, or its own words for it)."""
    text = str(error)
    return "NotImplemented" in text or " 501 " in text or "not supported" in text.lower()
