"""Where an ingest's time goes, by stage: the budget ``floe ingest --verbose`` prints at the end.

The stages (:data:`STAGES`): reading and parsing the sources (JSON, or
stac-geoparquet rows into items: the time the pipeline waits for its next
item, ``_stream._reading``), validating items, turning them into Arrow
columns, writing Parquet files, and committing (Icechunk and the table's
metadata, without the stages it runs inside). While :func:`measuring` is active, :func:`timed`
blocks and :func:`add` calls anywhere in the process add their seconds to
its clock; otherwise they cost a global look-up. Seconds are exclusive: a
stage timed inside another (writing inside a commit) is taken out of the
outer one, on each thread. Stages on different threads (a read-ahead thread
parsing while the main thread commits) add up to more than the wall time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

STAGES = ("parse", "validate", "to Arrow", "write", "commit")


class StageClock:
    """Seconds per stage, added from any thread: each thread adds to its own tally (no lock on the way, a
    parse costs a microsecond or two), summed when read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tallies: dict[int, dict[str, float]] = {}
        self.started = time.perf_counter()

    def add(self, stage: str, seconds: float) -> None:
        tally = self._tallies.get(threading.get_ident())
        if tally is None:
            with self._lock:
                tally = self._tallies.setdefault(threading.get_ident(), {})
        tally[stage] = tally.get(stage, 0.0) + seconds

    @property
    def seconds(self) -> dict[str, float]:
        """Seconds per stage, every :data:`STAGES` one present."""
        with self._lock:
            tallies = list(self._tallies.values())
        total = dict.fromkeys(STAGES, 0.0)
        for tally in tallies:
            for stage, seconds in list(tally.items()):
                total[stage] = total.get(stage, 0.0) + seconds
        return total

    def wall(self) -> float:
        """Seconds since the clock started."""
        return time.perf_counter() - self.started


_active: StageClock | None = None
_frames = threading.local()
"""Per thread, the stages open on it: [start, seconds of the stages timed inside] each."""


@contextmanager
def measuring() -> Iterator[StageClock]:
    """A clock that every stage timed in this process adds to until the block ends."""
    global _active  # noqa: PLW0603 - one clock a process: sources and writers deep in the pipeline add to it
    previous, clock = _active, StageClock()
    _active = clock
    try:
        yield clock
    finally:
        _active = previous


def _stack() -> list[list[float]]:
    stack = getattr(_frames, "stack", None)
    if stack is None:
        stack = _frames.stack = []
    return stack


@contextmanager
def timed(stage: str) -> Iterator[None]:
    """Add the block's seconds to ``stage``, less those of stages timed inside it on this thread."""
    clock = _active
    if clock is None:
        yield
        return
    stack = _stack()
    frame = [time.perf_counter(), 0.0]
    stack.append(frame)
    try:
        yield
    finally:
        stack.pop()
        elapsed = time.perf_counter() - frame[0]
        clock.add(stage, elapsed - frame[1])
        if stack:
            stack[-1][1] += elapsed


def add(stage: str, seconds: float) -> None:
    """Add ``seconds`` measured by the caller to ``stage`` (for work measured in many small pieces, such as
    waiting for each item), taken out of the stage open on this thread, if any."""
    clock = _active
    if clock is None:
        return
    clock.add(stage, seconds)
    stack = getattr(_frames, "stack", None)
    if stack:
        stack[-1][1] += seconds


def moved(seconds: float, *, out_of: str, into: str) -> None:
    """Count ``seconds`` already counted in ``out_of`` in ``into`` instead: work done inside the wait ``out_of``
    measures in many small pieces (stac-geoparquet rows checked and laid out while the pipeline waits for them,
    ``_stream._reading``)."""
    clock = _active
    if clock is None:
        return
    clock.add(out_of, -seconds)
    clock.add(into, seconds)


def budget(seconds: dict[str, float], wall: float) -> str:
    """One line of the stages' seconds and shares of the wall time, in :data:`STAGES` order."""
    parts = [
        f"{stage} {seconds.get(stage, 0.0):.2f} s ({seconds.get(stage, 0.0) / wall:.0%})" if wall > 0 else stage
        for stage in STAGES
    ]
    other = wall - sum(seconds.values())
    rest = f"; other {other:.2f} s" if other >= 0 else "; the stages overlapped on threads"
    return f"stages of {wall:.2f} s: " + ", ".join(parts) + rest


def active() -> bool:
    """Whether a clock is measuring (callers skip their own timing otherwise)."""
    return _active is not None
