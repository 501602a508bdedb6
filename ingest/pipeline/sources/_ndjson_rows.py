"""Large NDJSON as rows: reader processes parse, check and lay out the lines as floe's rows while the ingest
writes and commits, so a metadata-only ingest of NDJSON works on more than one core.

A stream (a local file, standard input) that holds at least :data:`READER_BYTES` is cut into blocks of about
:data:`BLOCK_BYTES` at line ends, and each block goes to a reader: a process started with ``spawn`` (the ingest
has an Icechunk repository open, and is never forked). A reader parses each line exactly
(:func:`~ingest.stac.loads_json`), keeps the items :func:`~ingest.stac.accepted_items` accepts, and lays them out
with :func:`~ingest.stac.items_to_arrow` in their order: the item path's own functions, so the rows are what the
item path would have written. Every other line (not JSON, not an item, an invalid item, a FeatureCollection)
comes back as its bytes and is read here as any NDJSON line is (:func:`ndjson_items`), which names its problem.
The blocks are taken in order, so first-seen items and duplicates are what they are without readers. A smaller
stream is read as items: a reader's start (about a second) would cost more than it saves.
docs/ingest.md#ndjson-as-rows.
"""

from __future__ import annotations

import functools
import io
import itertools
import logging
import signal
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from ingest._stages import moved
from ingest.pipeline.sources._documents import ndjson_items
from ingest.pipeline.sources._types import SourcedItem, SourcedRows

if TYPE_CHECKING:
    from concurrent.futures import Future, ProcessPoolExecutor

    import numpy as np
    import pyarrow as pa

log = logging.getLogger(__name__)

READER_BYTES = 32 << 20
"""A stream holding at least this much is read by reader processes, as rows; a smaller one as items."""

BLOCK_BYTES = 4 << 20
"""About what one block a reader is handed holds (whole lines: a longer line is a block of its own)."""

READERS = 2
"""Reader processes for one stream (this machine's two cores: the ingest itself needs a fraction of one)."""

_DOCUMENT_KINDS = frozenset(("FeatureCollection", "Collection", "Catalog"))
"""What a line may be other than an item (:func:`~._documents.document_items` reads them)."""


@dataclass(slots=True)
class ReadBlock:
    """What a reader made of one block of lines."""

    lines: int
    """Lines the block holds, blank ones too (the next block's first line number follows from it)."""
    rows: pa.Table | None
    """The rows of the items accepted, in the block's order (None: no item was)."""
    offsets: np.ndarray
    """Each row's line, counted from the block's first (0)."""
    others: list[tuple[int, bytes]]
    """The lines left to the item path, each with its offset, in order."""
    seconds: dict[str, float] = field(default_factory=dict)
    """The reader's time by stage (parse, validate, to Arrow)."""


def read_block(block: bytes, default_collection: str | None = None) -> ReadBlock:
    """The rows of a block's lines, and the lines left to the item path (run by a reader, or here)."""
    import numpy as np

    from ingest.stac import accepted_items, items_to_arrow, loads_json, paused_collection

    lines = block.split(b"\n")
    if block.endswith(b"\n"):
        lines.pop()  # the end of the last line, not a line
    items: list[dict[str, object]] = []
    offsets: list[int] = []
    others: list[tuple[int, bytes]] = []
    started = time.perf_counter()
    with paused_collection():  # thousands of acyclic documents: nothing for the collector to find
        for offset, raw in enumerate(lines):
            if not raw.strip():
                continue
            try:
                document = loads_json(raw.rstrip(b"\r\n"))
            except Exception:  # noqa: BLE001 - not JSON (or too deep): the item path names the problem
                others.append((offset, raw))
                continue
            if type(document) is dict and document.get("type") not in _DOCUMENT_KINDS:
                items.append(document)
                offsets.append(offset)
            else:
                others.append((offset, raw))
        parsed = time.perf_counter()
        accepted = accepted_items(items, default_collection=default_collection)
        validated = time.perf_counter()
        kept = [item for item in accepted if item is not None]
        rows = items_to_arrow(kept, in_order=True) if kept else None
    laid_out = time.perf_counter()
    others.extend((offset, lines[offset]) for offset, item in zip(offsets, accepted, strict=True) if item is None)
    others.sort(key=lambda other: other[0])
    kept_offsets = np.array([offset for offset, item in zip(offsets, accepted, strict=True) if item is not None])
    seconds = {"parse": parsed - started, "validate": validated - parsed, "to Arrow": laid_out - validated}
    return ReadBlock(len(lines), rows, kept_offsets.astype(np.int64), others, seconds)


def ndjson_sourced(
    stream: IO[bytes], label: str, path: Path | None = None, *, default_collection: str | None = None
) -> Iterator[SourcedItem]:
    """The items of an NDJSON ``stream`` (labelled ``label:line``), as rows read by reader processes where it
    holds at least :data:`READER_BYTES`, else as :func:`ndjson_items` reads them.

    Raises:
        OSError: the stream could not be read (after the items before the failure).
    """
    head = stream.read(READER_BYTES)
    if len(head) < READER_BYTES:
        yield from ndjson_items(io.BytesIO(head), label, path)
        return
    head += stream.readline()
    blocks = itertools.chain(_blocks(io.BytesIO(head)), _blocks(stream))
    first = 1
    for done in _read_by_readers(blocks, functools.partial(read_block, default_collection=default_collection)):
        yield from _in_order(done, label, path, first)
        first += done.lines


def _blocks(stream: IO[bytes]) -> Iterator[bytes]:
    """The stream in blocks of about :data:`BLOCK_BYTES`, each ending where a line does (or where the stream
    does)."""
    while True:
        block = stream.read(BLOCK_BYTES)
        if not block:
            return
        if not block.endswith(b"\n"):
            block += stream.readline()
        yield block


def _read_by_readers(blocks: Iterator[bytes], read: Callable[[bytes], ReadBlock]) -> Iterator[ReadBlock]:
    """Each block read by :data:`READERS` reader processes, in order, two blocks ahead of the one taken per
    reader. Readers that stop (a reader killed, for memory) are logged, and the blocks left are read here."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    pool: ProcessPoolExecutor | None = ProcessPoolExecutor(
        READERS, mp_context=multiprocessing.get_context("spawn"), initializer=_reader_started
    )
    pending: deque[tuple[bytes, Future[ReadBlock] | None]] = deque()

    def submitted(block: bytes) -> Future[ReadBlock] | None:
        nonlocal pool
        if pool is None:
            return None
        try:
            return pool.submit(read, block)
        except BrokenProcessPool:
            _stop(pool)
            pool = None
            return None

    def taken(block: bytes, future: Future[ReadBlock] | None) -> ReadBlock:
        nonlocal pool
        if future is not None:
            try:
                return future.result()
            except BrokenProcessPool:
                _stop(pool)
                pool = None
        done = read(block)  # here, inside the pipeline's wait for it (its parse stage): the checks are not parsing
        moved(done.seconds["validate"], out_of="parse", into="validate")
        moved(done.seconds["to Arrow"], out_of="parse", into="to Arrow")
        return done

    try:
        for block in blocks:
            pending.append((block, submitted(block)))
            if len(pending) > 2 * READERS:
                yield taken(*pending.popleft())
        while pending:
            yield taken(*pending.popleft())
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _stop(pool: ProcessPoolExecutor | None) -> None:
    """The reader processes stopped: say so (once), and let the rest be read here."""
    if pool is not None:
        log.warning("the NDJSON reader processes stopped: the rest of the stream is read by this process")
        pool.shutdown(wait=False, cancel_futures=True)


def _reader_started() -> None:
    """A reader ignores Ctrl-C: it reaches the whole process group, and the ingest stops its readers itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _in_order(done: ReadBlock, label: str, path: Path | None, first: int) -> Iterator[SourcedItem]:
    """A block's rows and other lines in the stream's order: each run of rows between two other lines as one
    :class:`SourcedRows`, each other line read as :func:`ndjson_items` reads it. ``first``: the block's first
    line's number."""
    import numpy as np

    taken = 0
    for offset, raw in [*done.others, (done.lines, b"")]:
        stop = int(np.searchsorted(done.offsets, offset))
        if stop > taken and done.rows is not None:
            numbers = done.offsets[taken:stop] + first
            rows = SourcedRows(done.rows.slice(taken, stop - taken), f"{label}:", numbers)
            yield SourcedItem(f"{label}:{numbers[0]}", rows=rows)
            taken = stop
        if offset < done.lines:
            yield from ndjson_items([raw], label, path, first=first + offset)
