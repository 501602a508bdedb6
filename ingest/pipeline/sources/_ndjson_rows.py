"""Large NDJSON as rows: reader processes parse, check and lay out the lines as floe's rows while the ingest
writes and commits, so a metadata-only ingest of NDJSON works on more than one core.

A stream (a local file, standard input, an object at a URL) that holds at least :data:`READER_BYTES` is cut into
blocks of about :data:`BLOCK_BYTES` at line ends (a local file's as byte ranges its readers read themselves), and
the blocks go to :data:`READERS` readers in turn: new Python processes (``_frames.helper_process``: the ingest has
an Icechunk repository open, and is never forked) running ``_ndjson_reader.py``. Each gives back the rows of the
items it accepts and the bytes of every other line, which are read here as any NDJSON line is
(:func:`ndjson_items`), naming their problems. The blocks are taken in order, so first-seen items and duplicates
are what they are without readers. A smaller stream is read as items: a reader's start (about a second) would
cost more than it saves. docs/ingest.md#ndjson-as-rows.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import logging
import os
import pickle
import stat
import subprocess
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from ingest._stages import moved
from ingest.pipeline.sources._documents import ndjson_items
from ingest.pipeline.sources._frames import helper_process, read_frame, write_frame
from ingest.pipeline.sources._ndjson_reader import (
    BLOCK_FRAME,
    DEFAULTS_FRAME,
    RANGE_FRAME,
    Block,
    FileRange,
    ReadBlock,
    read_block,
)
from ingest.pipeline.sources._types import ItemDefaults, SourcedItem, SourcedRows

log = logging.getLogger(__name__)

READER_BYTES = 32 << 20
"""A stream holding at least this much is read by reader processes, as rows; a smaller one as items."""

BLOCK_BYTES = 4 << 20
"""About what one block a reader is handed holds (whole lines: a longer line is a block of its own)."""

READERS = 2
"""Reader processes for one stream (this machine's two cores: the ingest itself needs a fraction of one)."""

CLOSE_SECONDS = 5.0
"""How long a stopped reader has to exit before it is killed."""


def large(size: int) -> bool:
    """Whether a stream of ``size`` bytes is read by readers (at least :data:`READER_BYTES`)."""
    return size >= READER_BYTES


def ndjson_sourced(
    stream: IO[bytes], label: str, path: Path | None = None, *, default_collection: str | None = None
) -> Iterator[SourcedItem]:
    """The items of an NDJSON ``stream`` (labelled ``label:line``), as rows read by reader processes where it
    holds at least :data:`READER_BYTES`, else as :func:`ndjson_items` reads them.

    Raises:
        OSError: the stream could not be read (after the items before the failure).
    """
    blocks: Iterator[Block]
    size = _file_size(stream) if path is not None else None
    if path is not None and size is not None:
        if size < READER_BYTES:
            yield from ndjson_items(stream, label, path)
            return
        where = os.path.abspath(path)
        blocks = (FileRange(where, start, start + BLOCK_BYTES) for start in range(0, size, BLOCK_BYTES))
    else:
        head = stream.read(READER_BYTES)
        if len(head) < READER_BYTES:
            yield from ndjson_items(io.BytesIO(head), label, path)
            return
        head += stream.readline()
        blocks = itertools.chain(_blocks(io.BytesIO(head)), _blocks(stream))
    yield from _sourced_blocks(blocks, label, path, ItemDefaults(default_collection))


def ndjson_chunks_sourced(
    blocks: LineBlocks, label: str, *, default_collection: str | None = None, base: str | None = None
) -> Iterator[SourcedItem]:
    """The items of an NDJSON stream that arrives in chunks (an object at a URL: ``base``), in :class:`LineBlocks`,
    as rows read by reader processes (the caller knows the stream is large), its items' relative asset hrefs made
    absolute against ``base`` as the item path makes them. The lines a reader leaves come back as
    :func:`ndjson_items` reads them: their hrefs are the caller's to make absolute."""
    yield from _sourced_blocks(iter(blocks), label, None, ItemDefaults(default_collection, base))


def _sourced_blocks(
    blocks: Iterator[Block], label: str, path: Path | None, defaults: ItemDefaults
) -> Iterator[SourcedItem]:
    first = 1
    for done in _read_by_readers(blocks, defaults):
        yield from _in_order(done, label, path, first)
        first += done.lines


class CaughtChunks:
    """A transfer's chunks, ending early where the transfer fails; the failure is kept in ``failure``."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = chunks
        self.failure: BaseException | None = None

    def __iter__(self) -> Iterator[bytes]:
        chunks = iter(self._chunks)
        while True:
            try:
                chunk = next(chunks)
            except StopIteration:
                return
            except Exception as error:  # noqa: BLE001 - obstore raises builtins and its own kinds
                self.failure = error
                return
            yield chunk


class ChunkedLines:
    """The lines a transfer's chunks hold, as something to iterate: a transfer that fails part way ends them (the
    part of a line it cut is dropped, not read as bad JSON), and is kept in ``failure``; ``count`` says how many
    lines were given (blank ones too)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = CaughtChunks(chunks)
        self.count = 0

    @property
    def failure(self) -> BaseException | None:
        """Why the transfer ended early (None: it did not)."""
        return self._chunks.failure


class LineBlocks(ChunkedLines):
    """A stream of byte chunks in blocks of whole lines, of about :data:`BLOCK_BYTES` each (what the readers are
    handed), ending as ``_objects._Lines`` ends."""

    def __iter__(self) -> Iterator[bytes]:
        pending: list[bytes] = []
        held = 0
        for chunk in self._chunks:
            pending.append(chunk)
            held += len(chunk)
            if held < BLOCK_BYTES:
                continue
            data = b"".join(pending)
            end = data.rfind(b"\n") + 1
            if not end:  # one line longer than a block so far
                pending = [data]
                continue
            self.count += data.count(b"\n", 0, end)
            yield data[:end]
            pending, held = [data[end:]], len(data) - end
        tail = b"".join(pending)
        if tail and self.failure is None:
            self.count += tail.count(b"\n") + (not tail.endswith(b"\n"))
            yield tail


def _file_size(stream: IO[bytes]) -> int | None:
    """The size of the regular file ``stream`` reads (None: a pipe, a terminal, no file)."""
    try:
        status = os.fstat(stream.fileno())
    except (OSError, AttributeError, io.UnsupportedOperation):
        return None
    return status.st_size if stat.S_ISREG(status.st_mode) else None


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


def _read_by_readers(blocks: Iterator[Block], defaults: ItemDefaults) -> Iterator[ReadBlock]:
    """Each block read by :data:`READERS` reader processes in turn, taken in order, each reader two blocks ahead
    of the one taken. Readers that cannot start, or stop (one killed, for memory), are logged, and the blocks left
    are read here."""
    readers = _Readers.started(READERS, defaults)
    pending: deque[Block] = deque()  # the blocks handed out and not taken yet, in order
    handed = taken = 0
    spent: dict[str, float] = {}  # the readers' seconds by stage, for the log
    try:
        for block in itertools.chain(blocks, [None]):
            if block is not None:
                pending.append(block)
                if readers is not None:
                    readers, handed = _handed(readers, handed, block)
            while pending and (block is None or len(pending) > 2 * READERS):
                done = None
                if readers is not None and taken < handed:
                    readers, done = _taken(readers, taken)
                    for stage, seconds in (done.seconds if done is not None else {}).items():
                        spent[stage] = spent.get(stage, 0.0) + seconds
                if done is None:
                    done = _read_here(pending[0], defaults)
                pending.popleft()
                taken += 1
                yield done
    finally:
        if readers is not None:
            readers.close()
        if spent:
            # The ingest's parse stage is its wait for the readers; where their own time went is said here.
            log.info(
                "NDJSON readers' stages: %s", ", ".join(f"{stage} {seconds:.2f} s" for stage, seconds in spent.items())
            )


def _handed(readers: _Readers, index: int, block: Block) -> tuple[_Readers | None, int]:
    """Block ``index`` handed to its reader, and the count handed; no readers after one stopped."""
    try:
        readers.hand(index, block)
    except OSError:
        _stopped(readers)
        return None, index
    return readers, index + 1


def _taken(readers: _Readers, index: int) -> tuple[_Readers | None, ReadBlock | None]:
    """What a reader made of block ``index`` (None, and no readers, after one stopped)."""
    try:
        return readers, readers.take(index)
    except (OSError, EOFError, pickle.UnpicklingError):
        _stopped(readers)
        return None, None


def _stopped(readers: _Readers) -> None:
    """A reader stopped: say so, stop the others, and let the rest be read here."""
    log.warning("an NDJSON reader process stopped: the rest of the stream is read by this process")
    readers.close()


def _read_here(block: Block, defaults: ItemDefaults) -> ReadBlock:
    """A block read by this process, inside the pipeline's wait for it (its parse stage): its checks and layout
    are counted where they belong.

    Raises:
        OSError: the file of a :class:`FileRange` cannot be read.
    """
    done = read_block(block.read() if isinstance(block, FileRange) else block, defaults)
    moved(done.seconds["validate"], out_of="parse", into="validate")
    moved(done.seconds["to Arrow"], out_of="parse", into="to Arrow")
    return done


class _Readers:
    """Reader processes, block ``index`` handed to reader ``index % count``: each reads its blocks in the order it
    is handed them, so the ingest takes them back in the stream's order."""

    def __init__(self, processes: list[subprocess.Popen[bytes]]) -> None:
        self._processes = processes

    @classmethod
    def started(cls, count: int, defaults: ItemDefaults) -> _Readers | None:
        """``count`` readers starting (their first block waits for them); None (logged) when no Python can be
        started here."""
        processes: list[subprocess.Popen[bytes]] = []
        try:
            for _ in range(count):
                processes.append(helper_process("from ingest.pipeline.sources._ndjson_reader import main; main()"))
                stdin = processes[-1].stdin
                assert stdin is not None
                _wider(stdin)
                write_frame(stdin, DEFAULTS_FRAME, pickle.dumps(defaults))
        except OSError as error:
            log.warning("no NDJSON reader could be started (%s): the stream is read by this process alone", error)
            cls(processes).close()
            return None
        return cls(processes)

    def hand(self, index: int, block: Block) -> None:
        """Give block ``index`` to its reader.

        Raises:
            OSError: the reader stopped.
        """
        stdin = self._processes[index % len(self._processes)].stdin
        assert stdin is not None
        if isinstance(block, FileRange):
            write_frame(stdin, RANGE_FRAME, pickle.dumps(block))
        else:
            write_frame(stdin, BLOCK_FRAME, block)

    def take(self, index: int) -> ReadBlock:
        """What its reader made of block ``index`` (every block before it taken already).

        Raises:
            OSError, EOFError, pickle.UnpicklingError: the reader stopped.
        """
        stdout = self._processes[index % len(self._processes)].stdout
        assert stdout is not None
        _, payload = read_frame(stdout)
        done: ReadBlock = pickle.loads(payload)  # noqa: S301 - from the reader this process started
        return done

    def close(self) -> None:
        """Stop the readers (closing their input ends them) and wait for them; safe to call more than once."""
        for process in self._processes:
            for stream in (process.stdin, process.stdout):
                if stream is not None and not stream.closed:
                    with contextlib.suppress(OSError):
                        stream.close()
        for process in self._processes:
            try:
                process.wait(CLOSE_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wider(pipe: IO[bytes]) -> None:
    """Let ``pipe`` hold a megabyte where the system allows (Linux): a block of standard input's lines then passes
    in 4 writes, not 64, each of which waits for the reader to take its turn at its interpreter's lock."""
    try:
        import fcntl

        fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, 1 << 20)
    except (ImportError, AttributeError, OSError):
        pass  # another system, or a limit below a megabyte: the pipe's own size


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
