"""Files under a floe root, local or S3, through one pyarrow filesystem: list, stat, read, write, delete.

The lifecycle tools see a repository as plain files: gc lists and deletes under
``tables/``, replicate copies between two roots. Paths here are relative to the
root (``arrays/snapshots/<id>``, ``tables/items/data/...``).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime

import pyarrow.fs as pafs

from ingest.storage import Location

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FileStat:
    """Size and last-modified time (mtime locally, LastModified on S3) of one file."""

    size: int
    modified: datetime | None


class RootFiles:
    """The files of one floe root."""

    def __init__(self, location: Location) -> None:
        self.location = location
        if location.is_local:
            self.fs: pafs.FileSystem = pafs.LocalFileSystem()
            self._base = location.url
        else:
            # The same S3 settings pyiceberg uses for the table files of this root.
            self.fs = location.file_io().fs_by_scheme("s3", location.bucket)
            self._base = f"{location.bucket}/{location.prefix}"

    def _path(self, relative: str) -> str:
        return f"{self._base}/{relative.strip('/')}" if relative else self._base

    def relative(self, location: str) -> str | None:
        """The path under this root of an absolute location (local path or s3:// URL), or None if outside."""
        prefix = self.location.url + "/"
        return location[len(prefix) :] if location.startswith(prefix) else None

    def absolute(self, relative: str) -> str:
        return self.location.join(relative)

    def list(self, under: str) -> dict[str, FileStat]:
        """Every file below ``under`` (recursively), by path relative to the root."""
        selector = pafs.FileSelector(self._path(under), recursive=True, allow_not_found=True)
        found: dict[str, FileStat] = {}
        cut = len(self._base) + 1
        for info in self.fs.get_file_info(selector):
            if info.type == pafs.FileType.File:
                found[info.path[cut:]] = FileStat(info.size or 0, info.mtime)
        return found

    def stat(self, relative: str) -> FileStat | None:
        info = self.fs.get_file_info(self._path(relative))
        if info.type != pafs.FileType.File:
            return None
        return FileStat(info.size or 0, info.mtime)

    def read(self, relative: str) -> bytes:
        with self.fs.open_input_stream(self._path(relative)) as stream:
            return stream.read()

    def write(self, relative: str, data: bytes) -> None:
        """Write a whole file so that no reader sees it half-written.

        An S3 PUT is atomic; a local file is written next to its place and renamed.
        """
        path = self._path(relative)
        if not self.location.is_local:
            with self.fs.open_output_stream(path) as stream:
                stream.write(data)
            return
        parent = path.rsplit("/", 1)[0]
        self.fs.create_dir(parent, recursive=True)
        temporary = f"{parent}/.{path.rsplit('/', 1)[1]}.{uuid.uuid4().hex[:8]}.part"
        try:
            with self.fs.open_output_stream(temporary) as stream:
                stream.write(data)
            self.fs.move(temporary, path)
        except BaseException:
            if self.fs.get_file_info(temporary).type == pafs.FileType.File:
                self.fs.delete_file(temporary)
            raise

    def delete(self, relative: str) -> None:
        self.fs.delete_file(self._path(relative))
