"""Long searches take turns, so a crowd of them cannot starve the short ones.

A search counts as long after :data:`LONG_AFTER_FILES` data files or :data:`LONG_AFTER_SECONDS`; from then on it
reads only while it holds one of its worker's places (:class:`Turns`), which :func:`pace` takes between two windows
of reads. Why and how: docs/stac-api.md#serving-many-clients.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

LONG_AFTER_FILES = 64
"""Data files a search reads before it counts as long (a short search reads a window or two)."""
LONG_AFTER_SECONDS = 0.25
"""Seconds a search runs before it counts as long (a short one answers in tens of milliseconds)."""

_local = threading.local()


@dataclass
class _Ticket:
    turns: Turns
    started: float
    files: int = 0
    holding: bool = False


class Turns:
    """The places long searches run in, ``at_once`` of them (0: no limit).

    Why they take turns: docs/stac-api.md#serving-many-clients.
    """

    def __init__(
        self, at_once: int, *, after_files: int = LONG_AFTER_FILES, after_seconds: float = LONG_AFTER_SECONDS
    ) -> None:
        self.at_once = at_once
        self.after_files = after_files
        self.after_seconds = after_seconds
        self._places = threading.Semaphore(at_once) if at_once > 0 else None
        self._lock = threading.Lock()
        self.waiting = 0
        """Long searches waiting for a place now."""
        self.waited = 0
        """Long searches that had to wait for a place, since this object was made."""

    @contextmanager
    def search(self) -> Iterator[None]:
        """The span of one search on this thread: it paces its reads, and gives back its place when it ends."""
        if self._places is None or getattr(_local, "ticket", None) is not None:
            yield  # no limit, or a search within a search (the outer one's ticket counts)
            return
        ticket = _Ticket(self, time.monotonic())
        _local.ticket = ticket
        try:
            yield
        finally:
            _local.ticket = None
            if ticket.holding:
                self._places.release()

    def take_place(self, ticket: _Ticket) -> None:
        """Hold one of the places for the search of ``ticket``, waiting for one if none is free."""
        assert self._places is not None  # a ticket exists only where places do
        if not self._places.acquire(blocking=False):
            with self._lock:
                self.waiting += 1
                self.waited += 1
            try:
                self._places.acquire()
            finally:
                with self._lock:
                    self.waiting -= 1
        ticket.holding = True


def pace(files: int) -> None:
    """The search on this thread has read ``files`` more data files: once it counts as long, it holds a place (and
    waits for one here if none is free). Outside a search, nothing happens.

    The reading loop (``read_windows``) calls it after each window of files. A search's ticket is kept for its thread
    while :meth:`Turns.search` is open, so the loop needs no argument to pass it along, and a read outside a search
    (an export, the CLI's iteration of items) paces nothing.
    """
    ticket: _Ticket | None = getattr(_local, "ticket", None)
    if ticket is None or ticket.holding:
        return
    ticket.files += files
    turns = ticket.turns
    if ticket.files >= turns.after_files or time.monotonic() - ticket.started >= turns.after_seconds:
        turns.take_place(ticket)
