"""Bytes of the table's objects kept by URL, in memory and optionally on a local disk, so they are fetched once.

:class:`KeptBytes` keeps in memory what a writer wrote itself; :class:`DiskCache` keeps what is read in a directory
(``api.cache_dir``) shared by every process that names it. Why bytes kept by URL never go stale, and the one
exception (``floe relocate``): docs/design.md §8 (objects kept on disk).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import struct
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

log = logging.getLogger(__name__)

_MAGIC = b"floe-object-1\n"
_HEADER = struct.Struct("<IQ")
"""After the magic: the URL's length in bytes, then the content's."""


class KeptBytes:
    """Bytes by URL in memory, the most recently used within ``max_bytes``; safe to share between threads.

    What a writer wrote itself: its next batch starts from the table version it just committed, and reading back the
    metadata.json, manifest list and manifest it wrote cost three round trips a commit.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._values: OrderedDict[str, bytes] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    def get(self, url: str) -> bytes | None:
        with self._lock:
            data = self._values.get(url)
            if data is not None:
                self._values.move_to_end(url)
            return data

    def keep(self, url: str, data: bytes) -> None:
        if len(data) > self.max_bytes:
            return
        with self._lock:
            previous = self._values.pop(url, None)
            self._held -= len(previous) if previous is not None else 0
            self._values[url] = data
            self._held += len(data)
            while self._held > self.max_bytes:
                _, dropped = self._values.popitem(last=False)
                self._held -= len(dropped)


class DiskCache:
    """Objects' bytes by URL in files under ``directory``, within about ``max_bytes``.

    Entries are written to a temporary file and renamed into place, so readers in other processes see a whole entry
    or none; each starts with its URL and length, checked on every read, so a damaged entry is dropped, never
    returned. The directory is kept under ``max_bytes`` by removing the least recently used entries (a hit touches
    its file), checked every ``max_bytes // 16`` bytes written.

    Any number of processes may share one directory. Failures to write or
    read an entry (a full disk, a file removed meanwhile) cost the cache, never
    the read: they are logged and the object is fetched as if not kept.
    """

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int) -> None:
        self.directory = Path(directory).expanduser()
        self.max_bytes = max_bytes
        self._written_since_trim = 0
        self._lock = threading.Lock()

    def _path(self, url: str) -> Path:
        digest = hashlib.sha256(url.encode()).hexdigest()
        return self.directory / digest[:2] / digest[2:]

    def get(self, url: str) -> bytes | None:
        """The bytes kept for ``url``, or None (not kept, or an entry that does not check out, which is removed)."""
        path = self._path(url)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as error:
            log.debug("object cache: cannot read %s: %s", path, error)
            return None
        data = _unpack(raw, url)
        if data is None:
            log.warning("object cache: dropping a damaged entry for %s (%s)", url, path)
            _remove(path)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: the last to be removed when the directory is trimmed
        return data

    def keep(self, url: str, data: bytes) -> None:
        """Keep ``data`` as the bytes of ``url`` (replacing any entry atomically)."""
        if len(data) > self.max_bytes // 4:
            return
        path = self._path(url)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".part-")
            try:
                with os.fdopen(handle, "wb") as out:
                    out.write(_pack(url, data))
                os.replace(temporary, path)
            except BaseException:
                _remove(Path(temporary))
                raise
        except OSError as error:
            log.debug("object cache: cannot keep %s in %s: %s", url, self.directory, error)
            return
        with self._lock:
            self._written_since_trim += len(data)
            due = self._written_since_trim >= max(self.max_bytes // 16, 1)
            if due:
                self._written_since_trim = 0
        if due:
            self.trim()

    def trim(self) -> int:
        """Remove the least recently used entries until the directory holds at most ``max_bytes``; bytes freed."""
        entries: list[tuple[float, int, Path]] = []
        for path in self.directory.glob("*/*"):
            try:
                status = path.stat()
            except OSError:
                continue  # removed by another process meanwhile
            entries.append((status.st_mtime, status.st_size, path))
        held = sum(size for _, size, _ in entries)
        freed = 0
        for _, size, path in sorted(entries):
            if held - freed <= self.max_bytes:
                break
            _remove(path)
            freed += size
        return freed


def _pack(url: str, data: bytes) -> bytes:
    name = url.encode()
    return b"".join((_MAGIC, _HEADER.pack(len(name), len(data)), name, data))


def _unpack(raw: bytes, url: str) -> bytes | None:
    """The content of an entry made by :func:`_pack` for ``url``, or None if it is not one (damaged, or another
    URL's)."""
    start = len(_MAGIC) + _HEADER.size
    if len(raw) < start or not raw.startswith(_MAGIC):
        return None
    name_length, data_length = _HEADER.unpack_from(raw, len(_MAGIC))
    if raw[start : start + name_length] != url.encode() or len(raw) != start + name_length + data_length:
        return None
    return raw[start + name_length :]


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()
