"""An NDJSON reader: what a reader process makes of a block of lines (:func:`read_block`), and the process itself
(:func:`main`). The ingest's side, which starts readers and takes their blocks back in order, is
``_ndjson_rows.py``; why and when: docs/ingest.md#ndjson-as-rows.

A reader parses each line exactly (:func:`~ingest.stac.loads_json`), gives items what the stream gives them
(:class:`ItemDefaults`), keeps the items :func:`~ingest.stac.accepted_items` accepts, and lays them out with
:func:`~ingest.stac.items_to_arrow` in their order: the item path's own functions, so the rows are what the item
path would have written. Every other line comes back as its bytes, for the ingest to read as the item path does.
"""

from __future__ import annotations

import contextlib
import pickle
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ingest.pipeline.sources._documents import absolute_hrefs
from ingest.pipeline.sources._frames import helper_started, read_frame, write_frame
from ingest.pipeline.sources._types import ItemDefaults

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

DEFAULTS_FRAME, BLOCK_FRAME, RANGE_FRAME = b"D", b"B", b"F"
"""The frames: the stream's :class:`ItemDefaults` (pickled) first, then each block's bytes or its :class:`FileRange`
(pickled), and each answer (pickled)."""

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


@dataclass(frozen=True, slots=True)
class FileRange:
    """The lines of a local file that start at byte ``start`` or after, and before ``stop``: a block a reader reads
    from the file itself (nothing of it passes through the ingest). Every line belongs to exactly one range, as in
    the parts a backfill reads (``_parts.py``)."""

    path: str
    start: int
    stop: int

    def read(self) -> bytes:
        """The range's lines, as bytes.

        Raises:
            OSError: the file cannot be read.
        """
        with open(self.path, "rb") as stream:
            if self.start > 0:
                stream.seek(self.start - 1)
                stream.readline()  # the end of a line that started before the range: the range before holds it
            begin = stream.tell()
            data = stream.read(max(0, self.stop - begin))
            if data and not data.endswith(b"\n"):
                data += stream.readline()  # a line that starts in the range ends wherever it ends
        return data


type Block = bytes | FileRange
"""What a reader is handed: lines (standard input's), or where to read them."""

_GIVEN_NOTHING = ItemDefaults()
"""Items given nothing: no default collection, no base URL."""


def read_block(block: bytes, defaults: ItemDefaults = _GIVEN_NOTHING) -> ReadBlock:
    """The rows of a block's lines, and the lines left to the item path (run by a reader, or here)."""
    import numpy as np

    from ingest.stac import accepted_items, items_to_arrow, loads_json, paused_collection

    lines = block.split(b"\n") if block else []
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
                if defaults.base is not None:
                    absolute_hrefs(document, defaults.base)
                items.append(document)
                offsets.append(offset)
            else:
                others.append((offset, raw))
        parsed = time.perf_counter()
        accepted = accepted_items(items, default_collection=defaults.collection)
        validated = time.perf_counter()
        kept = [item for item in accepted if item is not None]
        try:
            rows = items_to_arrow(kept, in_order=True) if kept else None
        except Exception:  # noqa: BLE001 - the item path meets the same items, and says what becomes of them
            rows, accepted = None, [None] * len(accepted)
    laid_out = time.perf_counter()
    others.extend((offset, lines[offset]) for offset, item in zip(offsets, accepted, strict=True) if item is None)
    others.sort(key=lambda other: other[0])
    kept_offsets = np.array([offset for offset, item in zip(offsets, accepted, strict=True) if item is not None])
    seconds = {"parse": parsed - started, "validate": validated - parsed, "to Arrow": laid_out - validated}
    return ReadBlock(len(lines), rows, kept_offsets.astype(np.int64), others, seconds)


def main() -> None:
    """A reader: the default collection, then block after block, each answered with what :func:`read_block` made
    of it, until its input ends. Blocks are taken from the input on a thread of their own, so the ingest never waits
    to hand one over while the reader sends an answer."""
    out = helper_started()
    stdin = sys.stdin.buffer
    try:
        _, payload = read_frame(stdin)
    except EOFError:
        return
    defaults = pickle.loads(payload)  # noqa: S301 - from the ingest that started it
    blocks: queue.SimpleQueue[tuple[bytes, bytes] | None] = queue.SimpleQueue()

    def feed() -> None:
        with contextlib.suppress(EOFError, OSError):
            while True:
                blocks.put(read_frame(stdin))
        blocks.put(None)

    threading.Thread(target=feed, name="floe-blocks", daemon=True).start()
    try:
        while (frame := blocks.get()) is not None:
            kind, payload = frame
            # A range the reader cannot read (the file went away) ends it: the ingest reads the rest, and says why.
            block = pickle.loads(payload).read() if kind == RANGE_FRAME else payload  # noqa: S301 - from the ingest
            done = read_block(block, defaults)
            write_frame(out, BLOCK_FRAME, pickle.dumps(done, protocol=pickle.HIGHEST_PROTOCOL))
    except (BrokenPipeError, ConnectionResetError):
        pass  # the ingest stopped listening: nothing is left to say
    finally:
        with contextlib.suppress(OSError):
            out.close()
