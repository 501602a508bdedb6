"""Work done ahead of the one who asks for it: on a pool of threads, handed out in order (:class:`InOrder`: the next
granules' rasters while one is written, the next objects of a folder while one is parsed), or a stream produced
on a thread of its own (:func:`prefetched`: a search's pages while a batch commits, an object's chunks while
one is parsed). One call on a daemon thread of its own: ``ingest._threads``."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from typing import Any


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


def prefetched[T](
    source: Iterator[T], depth: int, weight: Callable[[T], int] | None = None, *, name: str = "floe-pages"
) -> Iterator[T]:
    """``source``'s values, produced up to ``depth`` ahead on a background thread; its exception is re-raised here.

    With ``weight``, a value counts as it says toward ``depth`` (a value heavier than ``depth`` still passes,
    alone). The thread stops when the consumer does (a closed generator): it never waits for longer than a tenth
    of a second for room.
    """
    ahead = _Ahead(depth)
    thread = threading.Thread(target=ahead.produce, args=(source, weight), name=name, daemon=True)
    thread.start()
    try:
        while True:
            value, error = ahead.take()
            if value is _DONE:
                if error is not None:
                    raise error
                return
            yield value
    finally:
        ahead.stop.set()


_DONE = object()


class _Ahead:
    """:func:`prefetched`'s queue: values and their weights, at most ``depth`` in weight held."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.values: deque[tuple[Any, BaseException | None, int]] = deque()
        self.changed = threading.Condition()
        self.held = 0
        self.stop = threading.Event()

    def produce(self, source: Iterator[Any], weight: Callable[[Any], int] | None) -> None:
        try:
            for value in source:
                if not self.offer(value, None, weight(value) if weight is not None else 1):
                    return
            self.offer(_DONE, None, 0)
        except BaseException as error:  # noqa: BLE001 - handed to the consumer, which raises it
            self.offer(_DONE, error, 0)
        finally:
            close = getattr(source, "close", None)
            if callable(close):
                close()  # a generator's own cleanup runs here, on the thread that ran it

    def offer(self, value: Any, error: BaseException | None, cost: int) -> bool:
        """Queue ``value`` (or the end, with its error); False once the consumer has stopped."""
        with self.changed:
            while self.held and self.held + cost > self.depth and not self.stop.is_set():
                self.changed.wait(0.1)
            if self.stop.is_set():
                return False
            self.values.append((value, error, cost))
            self.held += cost
            self.changed.notify_all()
        return True

    def take(self) -> tuple[Any, BaseException | None]:
        with self.changed:
            while not self.values:
                self.changed.wait()
            value, error, cost = self.values.popleft()
            self.held -= cost
            self.changed.notify_all()
        return value, error
