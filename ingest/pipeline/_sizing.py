"""How many items a commit takes: on object storage, more as long as commits spend their time waiting on the store.

:class:`BatchSizer` doubles an in-process ingest's batch, up to ``batch_max_size``, after each commit that waited
more than :data:`WAITING_SHARE` of its batch's time (measured with :class:`Stopwatch`). Why, and when a batch keeps
its size: docs/remote-sources.md#batches-and-commits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

WAITING_SHARE = 0.25
"""A commit that waited for more than this share of its batch's time (reading, validating, writing, committing)
doubles the next batch."""


@dataclass
class BatchSizer:
    """The size of the next batch (:attr:`items`), grown from ``first`` towards ``most``, never shrunk
    (docs/remote-sources.md#batches-and-commits)."""

    first: int
    most: int
    items: int = field(init=False)
    sizes: list[int] = field(default_factory=list)
    """The size each batch was given, in order (what ``floe ingest --verbose`` reports)."""

    def __post_init__(self) -> None:
        self.items = self.first
        self.most = max(self.most, self.first)

    def __call__(self) -> int:
        return self.items

    def observe(self, batch_seconds: float, waiting_seconds: float) -> None:
        """A batch took ``batch_seconds`` from its first item to its commit's end, ``waiting_seconds`` of them in
        its commit, waiting on the store: the next batch doubles if that share was above :data:`WAITING_SHARE`."""
        self.sizes.append(self.items)
        if batch_seconds > 0 and waiting_seconds > WAITING_SHARE * batch_seconds:
            self.items = min(self.items * 2, self.most)


class Stopwatch:
    """Wall time and this thread's CPU time since it was made: their difference is time spent waiting."""

    def __init__(self) -> None:
        self.wall = time.perf_counter()
        self.cpu = time.thread_time()

    def seconds(self) -> float:
        return time.perf_counter() - self.wall

    def waiting(self) -> float:
        return max(0.0, self.seconds() - (time.thread_time() - self.cpu))
