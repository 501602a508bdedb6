"""Frames between the ingest and a helper process it started (the page reader, the NDJSON readers): a kind byte,
a length, then that many bytes, on the helper's standard input and output.

A helper is a new ``python`` started with ``subprocess`` (:func:`helper_process`), never a fork (the ingest has an
Icechunk repository open) nor ``multiprocessing``'s ``spawn``, which would run the ingest's main script again in
the helper.
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

_HEADER = struct.Struct(">cI")


def write_frame(stream: IO[bytes], kind: bytes, payload: bytes = b"") -> None:
    """Send one frame (and flush it)."""
    stream.write(_HEADER.pack(kind, len(payload)))
    stream.write(payload)
    stream.flush()


def read_frame(stream: IO[bytes]) -> tuple[bytes, bytes]:
    """The next frame's kind and bytes; EOFError when the stream ends first (the other side stopped)."""
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError("the stream ended")
    kind, size = _HEADER.unpack(header)
    payload = stream.read(size)
    if len(payload) < size:
        raise EOFError("the stream ended inside a frame")
    return kind, payload


def helper_process(code: str) -> subprocess.Popen[bytes]:
    """A new Python running ``code`` (an import and a call) with this floe importable, its standard input and
    output piped to this process, its standard error this one's.

    Raises:
        OSError: no Python could be started.
    """
    package_root = str(Path(__file__).resolve().parents[3])
    path = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
    return subprocess.Popen(  # noqa: S603 - this Python, running floe's own code
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": path},
    )


def helper_started() -> IO[bytes]:
    """Set up a helper process as it starts; returns the stream its frames go out on.

    Ctrl-C reaches the whole process group: the ingest stops and closes the helper's input, which ends it, so the
    helper ignores it (no second traceback). Anything printed goes to standard error, not into the frames. pandas
    is refused (:class:`WithoutPandas`).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.meta_path.insert(0, WithoutPandas())
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    return out


class WithoutPandas:
    """Refuses to import pandas. A helper has no use for it, but pyarrow imports it (when installed) at its first
    conversion of Python values, to check for pandas objects: 0.2 s of the page reader's 0.45 s start."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.partition(".")[0] == "pandas":
            raise ModuleNotFoundError("floe's helper processes do not import pandas", name=name)
