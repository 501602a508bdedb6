"""The page reader: a process of its own that reads a large STAC API search's pages, decodes and checks them while
the ingest commits.

:class:`SearchPages` starts it once a search proves large (a new ``python`` running :func:`main`, never a fork: the
ingest has an Icechunk repository open) and takes over its pages; :class:`PageReader` is the ingest's side of the
frames they exchange. Why a process, and what it does: docs/remote-sources.md#pages-ahead-and-a-page-reader.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import select
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Literal

import orjson

from ingest.pipeline._ahead import prefetched
from ingest.pipeline.sources._api_pages import PAGES_AHEAD, Lanes, PageRequest, read_lanes
from ingest.pipeline.sources._frames import helper_process, helper_started, read_frame, write_frame

if TYPE_CHECKING:
    from collections.abc import Generator, Iterator

    from ingest.pipeline.sources._api_walk import WalkedPage
    from ingest.pipeline.sources._types import ItemDefaults
    from ingest.remote import Headers

# The reader's own side imports floe's STAC code and pystac-client inside :func:`main`, once it refuses pandas.

log = logging.getLogger(__name__)

# The protocol: frames (a kind byte, a length, the bytes) on the reader's standard input and output.
# 1. The reader says it is ready (READY).
# 2. The ingest hands it the search's root, the request of each lane's next page (by lane number), how many lanes to
#    read at once, the items each time lane keeps, the headers requests carry and, where the ingest takes rows, what
#    items are given before they are laid out as rows and who lays them out (LAYOUT) (HAND_OVER, a pickle).
# 3. The reader sends each page: its lane and the request after it in that lane (FOLLOWING, a pickle), then the page
#    (PAGE, a pickled WalkedPage, its items as JSON bytes inside); then END with the reason the search failed (a page
#    that could not be read after retries), empty when it read the last page of every lane.
# The ingest's page thread only reads the frames (the lock-free part); a page is loaded by the thread that ingests
# it (SentPage.load), so the two threads do not take turns with the interpreter's lock for it.
READY, HAND_OVER, FOLLOWING, PAGE, END = b"R", b"H", b"F", b"P", b"E"

NICENESS = 10
"""How much the reader defers to other processes (``nice``): it works ahead of the ingest, so the ingest (and,
on one machine, the API) get the cores first; measured on 2 cores, 5-8% more items a second than at 0."""

CLOSE_SECONDS = 5.0
"""How long a stopped reader has to exit before it is killed."""

HANDOFF_ITEMS = 20_000
"""A search with at least this many items still to read (its ``numberMatched``, or, where the API does not say,
this many read already) is read on by a page reader of its own. Behind an API 20 ms a request away, read in 3
lanes, the reader gives 1.18x the items a second of the same search read by the ingest alone
(docs/benchmarks-history.md, issue 50)."""

HANDOFF_WAITS = False
"""Wait for the page reader to start before reading the next page (tests: the hand-over happens at the page it
is asked for); by default pages are read here until the reader is ready."""

type Layout = Literal["reader", "ingest", "shared"]

LAYOUT: Layout = "shared"
"""Where the ingest takes rows, who lays out a page's rows (``lay_out_rows``): the reader (``reader``), the ingest
(``ingest``: the reader sends checked items), or, page by page, the reader unless the ingest waits for pages
(``shared``: the pipe to the ingest is empty when the page is ready; then the ingest lays it out while the reader
reads on). Laying out is the reader's costliest step; shared, the two processes' cores share it as each has time.
``reader`` and ``ingest`` are for tests."""

SENT_PAGES_AHEAD = 12
"""Pages a page reader may have sent ahead of the ingest (as bytes, a sixth of a decoded page's memory): it keeps
reading while the ingest writes a batch."""


@dataclass(slots=True, frozen=True)
class SentPage:
    """A page as the reader sent it; :meth:`load` makes it a :class:`~._api_walk.WalkedPage`."""

    data: bytes

    def load(self) -> WalkedPage:
        """The page, its items decoded (on the thread that ingests them)."""
        page: WalkedPage = pickle.loads(self.data)  # noqa: S301 - from the reader this process started
        if page.items_json is not None:
            page.items, page.items_json = orjson.loads(page.items_json), None
        return page


class SearchFailed(RuntimeError):
    """A page the reader could not read: the search ends there, as it would have without a reader."""


class PageReader:
    """The ingest's side of one page reader."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self._process = process
        self._ready = False
        self.lost = False
        """The reader stopped before it took over."""

    @classmethod
    def start(cls) -> PageReader | None:
        """A reader starting in the background; None (logged) when no Python can be started here."""
        try:
            process = helper_process("from ingest.pipeline.sources._api_reader import main; main()")
        except OSError as error:
            log.warning("no page reader could be started (%s): the search is read by this process alone", error)
            return None
        return cls(process)

    def ready(self, *, wait: bool) -> bool:
        """Whether the reader is ready to take over (with ``wait``, once it is, or has stopped)."""
        if self._ready or self.lost:
            return self._ready
        stdout = self._process.stdout
        assert stdout is not None
        if not wait and not select.select([stdout], [], [], 0)[0]:
            return False
        try:
            kind, _ = read_frame(stdout)
        except (EOFError, OSError):
            kind = b""
        if kind != READY:
            self.lost = True
            log.warning("the page reader stopped as it started: the search is read by this process alone")
            return False
        self._ready = True
        return True

    def read_from(
        self, root: str, lanes: Lanes, headers: Headers | None = None, rows: ItemDefaults | None = None
    ) -> Generator[tuple[int, SentPage]]:
        """The reader's pages, each with its lane, from each lane's next request on. ``lanes`` follows them: once
        a page is taken, its lane's request is the one after it; all are None when the reader read every lane to
        its end. A reader that stopped without saying why leaves them where it stopped (logged). With ``rows``,
        the items the ingest would accept come laid out as rows (:attr:`~._api_walk.WalkedPage.rows`), given
        ``rows`` first, on the pages the reader lays out (:data:`LAYOUT`); the others say it left them
        (``laid_out`` False).

        Raises:
            SearchFailed: a page could not be read (the reader's reason).
        """
        stdin, stdout = self._process.stdin, self._process.stdout
        assert stdin is not None and stdout is not None
        from ingest.remote import Headers

        try:
            handed = (
                root,
                lanes.open(),
                lanes.at_once,
                lanes.windows,
                headers if headers is not None else Headers(),
                rows,
                LAYOUT,
            )
            write_frame(stdin, HAND_OVER, pickle.dumps(handed, protocol=pickle.HIGHEST_PROTOCOL))
            while True:
                kind, payload = read_frame(stdout)
                if kind == END:
                    if payload:
                        raise SearchFailed(payload.decode())
                    lanes.requests = [None] * len(lanes.requests)
                    return
                if kind != FOLLOWING:
                    raise EOFError(f"a frame of kind {kind!r} where the request of the next page belongs")
                lane, following = pickle.loads(payload)  # noqa: S301 - from the reader this process started
                kind, payload = read_frame(stdout)
                if kind != PAGE:
                    raise EOFError(f"a frame of kind {kind!r} where a page belongs")
                yield lane, SentPage(payload)
                lanes.requests[lane] = following
        except (EOFError, pickle.UnpicklingError, OSError) as error:
            code = self._process.poll()
            log.warning(
                "the page reader stopped (%s): the search is read on by this process from %s",
                f"exit code {code}" if code is not None else type(error).__name__,
                ", ".join(request.href for request in lanes.open().values()),
            )

    def close(self) -> None:
        """Stop the reader (it may be done already) and wait for it to exit; safe to call more than once."""
        process = self._process
        for stream in (process.stdin, process.stdout):
            if stream is not None and not stream.closed:
                with contextlib.suppress(OSError):
                    stream.close()
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(CLOSE_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


class SearchPages:
    """A search's pages, each with its lane, read here until the search proves large, then by a page reader of
    its own.

    Iterated on the page thread (:func:`~ingest.pipeline._ahead.prefetched`). Pages read here are
    decoded pages (dicts); the reader's are :class:`SentPage` objects (pages
    already stripped and checked, loaded by the thread that ingests them). The reader starts once
    :data:`HANDOFF_ITEMS` remain (or have been read, where the API does not count); while it starts (half a
    second: a new Python and its imports) pages go on being read here, and it takes over at each lane's next page
    once it is ready (pages read here and not yet taken are dropped: the reader asks for them again). A reader
    that cannot start, or stops without saying why, is logged and the search goes on here from the page each
    lane had reached; a page the reader could not read (after retries) fails the search as one read here would.
    """

    def __init__(
        self, io: Any, root: str, lanes: Lanes, headers: Headers | None = None, rows: ItemDefaults | None = None
    ) -> None:
        self._io, self._root = io, root
        self._headers = headers if headers is not None else Headers()
        self._rows = rows
        self.lanes = lanes
        self._reader: PageReader | None = None
        self._tried = False

    def __iter__(self) -> Iterator[tuple[int, dict[str, Any] | SentPage]]:
        lanes = self.lanes
        here: Generator[tuple[int, dict[str, Any], PageRequest | None, bool]] | None = None
        try:
            while lanes.open():
                reader = self._reader
                if reader is not None and reader.ready(wait=HANDOFF_WAITS):
                    if here is not None:
                        here.close()  # its pages on their way are dropped: the reader asks for them again
                        here = None
                    yield from reader.read_from(self._root, lanes, self._headers, self._rows)
                    self.close()
                    continue
                if reader is not None and reader.lost:
                    self.close()
                if here is None:
                    here = read_lanes(self._io, lanes.open(), lanes.at_once)
                lane, page, following, _ = next(here)
                yield lane, page
                lanes.note(lane, page, following)
                if following is not None and not self._tried and lanes.large(HANDOFF_ITEMS):
                    self._tried = True
                    self._reader = PageReader.start()
        finally:
            if here is not None:
                here.close()

    def close(self) -> None:
        """Stop the page reader, if one runs (the search is done, failed, or no longer wanted)."""
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()


# -- the reader's side ------------------------------------------------------------------------------------------


class _Warnings(logging.Handler):
    """What the reader would log, kept to be sent with the page (the ingest logs it its own way)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@dataclass(frozen=True, slots=True)
class Walk:
    """How the reader walks every page of the search it was handed."""

    root: str
    windows: dict[int, Any]
    """The items each time lane keeps, by lane (none: the search is not read in time lanes)."""
    rows: ItemDefaults | None = None
    """Where the ingest takes rows: what items are given before they are laid out as rows."""
    layout: Layout = "shared"
    """Who lays out the rows (:data:`LAYOUT`)."""


def _prepare(
    page: dict[str, Any],
    io: Any,
    walk: Walk,
    lane: int,
    *,
    seen: set[str],
    caught: _Warnings,
    exact: bool,
    lay_out: bool,
) -> WalkedPage:
    """``page`` walked as the ingest would walk it (keeping what its lane's window keeps), its items checked,
    ready to send: as JSON that orjson reads back exactly, or as they are (pickled) where the page needed the exact
    parser (NaN, integers beyond 64 bits); where the ingest takes rows and ``lay_out`` says, those it would accept
    as rows."""
    from ingest.pipeline.sources._api_walk import lay_out_rows, walk_page

    prepared = walk_page(page, io, walk.root, seen, walk.windows.get(lane))
    if exact:
        # One serialization is both what travels and the validation's nesting check.
        with contextlib.suppress(TypeError, orjson.JSONEncodeError):  # then the items go as they are
            prepared.items_json = orjson.dumps(prepared.items)
    from ingest.stac import certainly_valid

    prepared.checked = certainly_valid(prepared.items, serialized=prepared.items_json is not None)
    if walk.rows is not None and lay_out:
        lay_out_rows(prepared, walk.rows, windowed=bool(walk.windows))
        if prepared.items_json is not None:
            prepared.items_json = orjson.dumps(prepared.items)  # the items left (None where they became rows)
    if prepared.items_json is not None:
        prepared.items = []
    prepared.warnings, caught.messages = caught.messages, []
    return prepared


def _ingest_waits(out: IO[bytes]) -> bool:
    """Whether the ingest has taken every page sent (the pipe to it holds nothing): then it waits for pages, and a
    page's layout is better left to it. False where the pipe cannot say (the reader lays out every page)."""
    try:
        import fcntl
        import termios

        waiting = bytearray(4)
        fcntl.ioctl(out.fileno(), termios.FIONREAD, waiting)
    except (ImportError, AttributeError, OSError):
        return False
    return int.from_bytes(waiting, sys.byteorder) == 0


def _exit_when_orphaned(stdin: IO[bytes]) -> None:
    """Exit as soon as the ingest closes the reader's input (it stopped reading, or died)."""

    def watch() -> None:
        while stdin.read(65536):
            pass
        os._exit(0)

    threading.Thread(target=watch, name="floe-orphaned", daemon=True).start()


def main() -> None:
    """The reader: pages from the request it is handed to the search's end, each sent as it is ready."""
    out = helper_started()
    os.nice(NICENESS)
    try:
        _serve(out)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the ingest stopped listening (it has what it needs, or it stopped): nothing is left to say
    finally:
        with contextlib.suppress(OSError):
            out.close()


def _serve(out: IO[bytes]) -> None:
    from ingest._faults import fault_point
    from ingest.pipeline.sources._api_io import failure_reason, session_io, with_headers

    caught = _Warnings()
    logging.getLogger("ingest").addHandler(caught)
    logging.getLogger("ingest").propagate = False
    # Made before the reader says it is ready: the first one takes 70 ms (pystac-client's and requests' lazy
    # imports), which the search would wait for at the hand-over.
    io = session_io()

    write_frame(out, READY)
    stdin = sys.stdin.buffer
    try:
        kind, payload = read_frame(stdin)
    except EOFError:
        return  # the search ended before the reader was needed
    if kind != HAND_OVER:
        return
    root, requests, at_once, windows, headers, rows, layout = pickle.loads(payload)  # noqa: S301 - from the ingest
    walk = Walk(root, windows, rows, layout)
    _exit_when_orphaned(stdin)
    io = with_headers(io, headers)
    seen: set[str] = set()

    try:
        # The next pages are requested while this one is checked: the server and this reader work at once (lanes
        # read on threads of their own already).
        pages = read_lanes(io, requests, at_once)
        for lane, page, following, exact in prefetched(pages, PAGES_AHEAD) if len(requests) == 1 else pages:
            lay_out = walk.layout == "reader" or (walk.layout == "shared" and not _ingest_waits(out))
            prepared = _prepare(page, io, walk, lane, seen=seen, caught=caught, exact=exact, lay_out=lay_out)
            write_frame(out, FOLLOWING, pickle.dumps((lane, following), protocol=pickle.HIGHEST_PROTOCOL))
            write_frame(out, PAGE, pickle.dumps(prepared, protocol=pickle.HIGHEST_PROTOCOL))
            fault_point("reader.after_page")
    except Exception as error:  # noqa: BLE001 - sent to the ingest, which ends the search with it
        write_frame(out, END, failure_reason(error).encode())
        return
    write_frame(out, END)
