"""URLs and storage: a root URL -> Icechunk storage, Iceberg FileIO, the local commit lock; local paths -> URLs.

A floe repository lives under one root: a local path or ``s3://bucket/prefix``.
Icechunk's repository is at ``<root>/arrays`` and Iceberg's files at
``<root>/tables``. Rasters referenced in place are named by ``file://`` URLs
(:func:`local_url`).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import icechunk

from ingest._aws import repository_s3
from ingest.config import S3Settings, Settings
from ingest.errors import InvalidRoot, StoreUnreachable

if TYPE_CHECKING:
    from pyiceberg.io.pyarrow import PyArrowFileIO

log = logging.getLogger(__name__)

ARRAYS_DIR = "arrays"
FILE_SCHEME = "file://"
TABLES_DIR = "tables"
LOCK_FILE = ".floe.lock"


@dataclass(frozen=True)
class Location:
    """Where a floe repository lives, and how to reach it."""

    url: str
    """The normalised root: an absolute local path or ``s3://bucket/prefix``."""
    s3: S3Settings
    """For an ``s3://`` root, what every client of it is given: floe's settings over the ``AWS_*`` environment
    (:func:`ingest._aws.repository_s3`)."""

    @classmethod
    def parse(cls, root: str | os.PathLike[str], settings: Settings | None = None) -> Location:
        """Normalise ``root``; relative local paths become absolute.

        Raises:
            InvalidRoot: ``root`` is neither a local path nor ``s3://bucket/prefix``.
            InvalidSettings: the S3 settings of an ``s3://`` root contradict each other (see ``ingest._aws``).
        """
        s3 = settings.s3 if settings is not None else S3Settings()
        text = os.fspath(root)
        parsed = urlparse(text)
        if parsed.scheme == "s3":
            if not parsed.netloc:
                raise InvalidRoot(f"root {text!r} names no bucket: use s3://bucket/prefix")
            prefix = parsed.path.strip("/")
            if not prefix:
                raise InvalidRoot(f"root {text!r} is a bucket root: give a prefix, s3://{parsed.netloc}/<prefix>")
            return cls(url=f"s3://{parsed.netloc}/{prefix}", s3=repository_s3(s3))
        if parsed.scheme == "file":
            text = parsed.path
        elif parsed.scheme and len(parsed.scheme) > 1:
            raise InvalidRoot(f"root {text!r}: only local paths and s3:// URLs are supported")
        return cls(url=str(Path(text).expanduser().resolve()), s3=s3)

    @property
    def is_local(self) -> bool:
        return not self.url.startswith("s3://")

    @property
    def bucket(self) -> str:
        return urlparse(self.url).netloc

    @property
    def prefix(self) -> str:
        return urlparse(self.url).path.strip("/")

    def join(self, *parts: str) -> str:
        """An absolute location under the root (a path for local roots, a URL for S3)."""
        tail = "/".join(part.strip("/") for part in parts if part)
        return f"{self.url}/{tail}" if tail else self.url

    @property
    def tables_url(self) -> str:
        return self.join(TABLES_DIR)

    def icechunk_config(self) -> icechunk.RepositoryConfig | None:
        """What floe sets in Icechunk's configuration when it opens ``<root>/arrays`` (not saved in it).

        On a local root, one read per object up to 12 MiB (Icechunk's own S3
        default). Icechunk's defaults for local files split any object over
        4 KiB into up to five ranged reads (``ideal_concurrent_request_size``
        4096), so a 130 kB chunk took five opens: one read each halves the
        system time of reading chunks (docs/pixels.md#reading-pixels). Object
        storage keeps Icechunk's defaults (``None``).
        """
        if not self.is_local:
            return None
        concurrency = icechunk.StorageConcurrencySettings(
            max_concurrent_requests_for_object=5, ideal_concurrent_request_size=12 * 2**20
        )
        return icechunk.RepositoryConfig(storage=icechunk.StorageSettings(concurrency=concurrency))

    def icechunk_storage(self) -> icechunk.Storage:
        """The Icechunk storage of ``<root>/arrays``."""
        if self.is_local:
            return icechunk.local_filesystem_storage(self.join(ARRAYS_DIR))
        s3 = self.s3
        has_keys = bool(s3.access_key_id and s3.secret_access_key)
        return icechunk.s3_storage(
            bucket=self.bucket,
            prefix=f"{self.prefix}/{ARRAYS_DIR}",
            region=s3.region,
            endpoint_url=s3.endpoint_url,
            allow_http=s3.allow_http,
            access_key_id=s3.access_key_id if has_keys else None,
            secret_access_key=s3.secret_access_key if has_keys else None,
            session_token=s3.session_token if has_keys else None,
            anonymous=s3.anonymous or None,
            # Without keys in any setting, Icechunk's own chain (an instance role, a container's credentials).
            from_env=None if has_keys or s3.anonymous else True,
            force_path_style=s3.force_path_style,
        )

    def file_io_properties(self) -> dict[str, str]:
        """PyIceberg FileIO properties for the tables of this root."""
        if self.is_local:
            return {}
        s3 = self.s3
        properties = {
            "s3.endpoint": s3.endpoint_url,
            "s3.region": s3.region,
            "s3.access-key-id": s3.access_key_id,
            "s3.secret-access-key": s3.secret_access_key,
            "s3.session-token": s3.session_token,
            "s3.force-virtual-addressing": "false" if s3.force_path_style else None,
            "s3.anonymous": "true" if s3.anonymous else None,
        }
        return {key: value for key, value in properties.items() if value is not None}

    def file_io(self) -> PyArrowFileIO:
        """A PyArrow FileIO that reads and writes this root's table files (on S3, one that reads the table's
        metadata in one GET an object: :class:`ingest.remote.ObjectFileIO`)."""
        from pyiceberg.io.pyarrow import PyArrowFileIO

        if self.is_local:
            return PyArrowFileIO(properties=self.file_io_properties())
        from ingest.remote import ObjectFileIO

        return ObjectFileIO(self.file_io_properties(), self.s3)

    def probe(self) -> None:
        """Ask the store whether this root's bucket is there, as the table's client reaches it (one request).

        A wrong endpoint, a missing bucket or refused credentials fail here in about a second, before anything
        is written (Icechunk retries a refused connection for about half a minute before it gives up).

        Raises:
            StoreUnreachable: the bucket cannot be reached or does not exist; the message names the cause.
        """
        if self.is_local:
            return
        from pyarrow import fs

        try:
            found = self.file_io().fs_by_scheme("s3", self.bucket).get_file_info(self.bucket)
        except OSError as error:
            raise StoreUnreachable(self.unreachable(error)) from None
        if found.type == fs.FileType.NotFound:
            where = f" at {self.s3.endpoint_url}" if self.s3.endpoint_url else ""
            raise StoreUnreachable(f"cannot reach {self.url}: bucket {self.bucket!r} does not exist{where}")

    def unreachable(self, error: BaseException) -> str:
        """One line saying why this root's store failed: its URL, the endpoint, and the client's first line."""
        cause = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        # PyArrow leads with the key it asked for, then says what went wrong after "AWS Error".
        cause = cause.split("AWS Error ", 1)[-1]
        where = f" (endpoint {self.s3.endpoint_url})" if self.s3.endpoint_url else ""
        return f"cannot reach {self.url}{where}: {cause}"

    def remove_contents(self) -> None:
        """Delete everything floe keeps under this root (``arrays/`` and ``tables/``): ``floe init --force`` on a
        half-made repository. The caller holds the mutation lock."""
        if self.is_local:
            for folder in (ARRAYS_DIR, TABLES_DIR):
                shutil.rmtree(self.join(folder), ignore_errors=True)
            return
        filesystem = self.file_io().fs_by_scheme("s3", self.bucket)
        for folder in (ARRAYS_DIR, TABLES_DIR):
            try:
                filesystem.delete_dir_contents(f"{self.bucket}/{self.prefix}/{folder}", missing_dir_ok=True)
            except OSError as error:
                raise StoreUnreachable(self.unreachable(error)) from None

    @contextlib.contextmanager
    def mutation_lock(self) -> Iterator[None]:
        """Serialize mutations of Icechunk refs on local storage.

        Icechunk's local filesystem backend writes its ``repo`` object without a
        condition, so two processes committing at once can lose a commit. An
        exclusive ``flock`` on ``<root>/.floe.lock`` makes each ref update atomic.
        Object stores answer concurrent writes with 412 and need no lock.
        """
        if not self.is_local:
            yield
            return
        Path(self.url).mkdir(parents=True, exist_ok=True)
        fd = os.open(os.path.join(self.url, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def quiet_icechunk_logs() -> None:
    """Silence Icechunk's warning about local storage: floe serializes local commits itself."""
    if os.environ.get("ICECHUNK_LOG") is None:
        icechunk.set_logs_filter("error")


# Characters that would need percent-escaping in a URL: Icechunk and obstore do not agree on unescaping them.
_UNSAFE_IN_URL = frozenset(' #?%\\"<>`{}|^[]') | frozenset(chr(code) for code in range(32))


def local_url(path: str | os.PathLike[str]) -> str:
    """The ``file://`` URL of the local file ``path`` (absolute, symlinks resolved), as virtual references record it.

    Raises:
        ValueError: the path holds characters that would need escaping in a URL.
    """
    text = os.fspath(path)
    if text.startswith(FILE_SCHEME):
        text = urlparse(text).path
    absolute = str(Path(text).expanduser().resolve())
    bad = sorted({char for char in absolute if char in _UNSAFE_IN_URL})
    if bad:
        raise ValueError(f"{absolute} holds characters a file:// URL would have to escape ({''.join(bad)!r})")
    return FILE_SCHEME + absolute
