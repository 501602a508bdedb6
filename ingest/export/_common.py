"""What every export shares: its result, safe file names, and outputs that appear only once complete."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow as pa

from ingest.repository import View
from ingest.stac import arrow_to_items

# File names longer than this are shortened with a hash (most file systems allow 255 bytes).
_MAX_NAME = 180


@dataclass(frozen=True)
class ExportResult:
    """What an export wrote: how many items, from which ref and snapshot, where."""

    format: str
    items: int
    collections: int
    ref: str
    snapshot_id: str
    target: str


def safe_name(text: str) -> str:
    """A file name for an id: percent-encoded (so ``/``, ``..`` and control characters cannot escape), never hidden.

    Percent-encoding is injective (``%`` itself is encoded), so two ids never share a name;
    over-long names keep a readable prefix and a hash of the whole id.

    Args:
        text: the id (of an item or a collection).

    Returns:
        The name: a leading ``.`` encoded as ``%2E``, the empty id named ``%00``, and a name longer than 180
        characters cut to a prefix and 32 hex digits of the id's SHA-256.
    """
    name = quote(text, safe="")
    if not name or name.startswith("."):
        name = "%2E" + name[1:] if name else "%00"
    if len(name) > _MAX_NAME:
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
        name = f"{name[: _MAX_NAME - 33]}-{digest}"
    return name


def href_of(*names: str) -> str:
    """A relative link to a file whose path parts are ``names`` (percent signs in names escaped for URLs)."""
    return "/".join(quote(name, safe="") for name in names)


def iter_items(view: View) -> Iterator[tuple[pa.RecordBatch, list[dict[str, Any]]]]:
    """Each batch of the view's rows with its items, in the table's (deterministic) order."""
    for batch in view.batches():
        yield batch, list(arrow_to_items(pa.Table.from_batches([batch])))


def _umask() -> int:
    """The process's umask, read without changing it where the system can say (Linux), else set and restored."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    current = os.umask(0o022)
    os.umask(current)
    return current


def _permissions(target: Path, default: int) -> int:
    """The mode an export at ``target`` gets: the one it replaces, else ``default`` under the umask.

    ``mkstemp`` and ``mkdtemp`` create private files (0600) and folders (0700); an export is for others to
    read, so it gets the mode a plain ``open`` or ``mkdir`` would have given it.
    """
    try:
        return stat.S_IMODE(target.stat().st_mode)
    except OSError:
        return default & ~_umask()


@contextmanager
def replacing_file(target: Path, mode: str = "w") -> Iterator[Any]:
    """A file object whose content replaces ``target`` only when the block completes.

    Raises:
        InvalidExportTarget: ``target`` is a folder, or a file stands where its folder would be.
    """
    from ingest.errors import InvalidExportTarget

    if target.is_dir():
        raise InvalidExportTarget(f"{target} is a folder: name the file to write in it (e.g. {target / 'items'}...)")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise InvalidExportTarget(f"{target}: a file stands where its folder would be; choose another output") from None
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    try:
        os.chmod(fd, _permissions(target, 0o666))
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as stream:
            yield stream
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


@contextmanager
def replacing_directory(target: Path, marker: str) -> Iterator[Path]:
    """A fresh directory that replaces ``target`` when the block completes.

    ``target`` may be absent, empty, or an earlier export (it holds ``marker``);
    anything else is refused rather than deleted.
    """
    from ingest.errors import InvalidExportTarget

    if target.exists():
        if not target.is_dir():
            raise InvalidExportTarget(f"{target} exists and is not a directory; choose another output")
        if any(target.iterdir()) and not (target / marker).is_file():
            raise InvalidExportTarget(
                f"{target} is a non-empty directory that is not an earlier export (no {marker}); "
                "choose an empty or new directory"
            )
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part"))
    try:
        staging.chmod(_permissions(target, 0o777))
        yield staging
        if target.exists():
            retired = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".old"))
            os.replace(target, retired / "previous")
            os.replace(staging, target)
            shutil.rmtree(retired)
        else:
            os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
