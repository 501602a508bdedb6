"""Work done ahead on a pool of threads, handed out in order (the next granules' rasters while one is written, the
next objects of a folder while one is parsed). One call on a daemon thread of its own: ``ingest._threads``."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future


class InOrder[In, Out]:
    """``read`` of each of ``inputs`` on ``pool``, handed out in their order, up to ``ahead`` beyond the one
    asked for in flight (the pool's size bounds how many run at once)."""

    def __init__(self, pool: Executor, inputs: Iterable[In], read: Callable[[In], Out], ahead: int) -> None:
        self._pool, self._read, self._ahead = pool, read, ahead
        self._todo = iter(inputs)
        self._pending: deque[Future[Out]] = deque()

    def next(self) -> Out:
        """The next input's result; raises what reading it raised.

        Raises:
            StopIteration: every input was handed out.
        """
        while len(self._pending) <= self._ahead:
            entry = next(self._todo, _END)
            if entry is _END:
                break
            self._pending.append(self._pool.submit(self._read, entry))  # type: ignore[arg-type]
        if not self._pending:
            raise StopIteration
        return self._pending.popleft().result()

    def cancel(self) -> None:
        """Drop the reads not started yet (their results will not be asked for)."""
        for future in self._pending:
            future.cancel()


_END = object()
