"""Work done ahead on threads: on a pool, handed out in order (the next granules' rasters while one is written,
the next objects of a folder while one is parsed); or one call on a daemon thread of its own."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor


class InOrder[In, Out]:
    """``read`` of each of ``inputs`` on ``pool``, handed out in their order, up to ``ahead`` beyond the one
    asked for in flight (the pool's size bounds how many run at once)."""

    def __init__(self, pool: ThreadPoolExecutor, inputs: Iterable[In], read: Callable[[In], Out], ahead: int) -> None:
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


def on_daemon_thread[T](call: Callable[[], T], name: str) -> Future[T]:
    """``call()`` started on a daemon thread of its own: its future holds what it returns or raises. Nothing
    waits for the thread when its answer is no longer wanted, the end of the process included."""
    import threading

    answer: Future[T] = Future()

    def run() -> None:
        try:
            answer.set_result(call())
        except BaseException as error:  # noqa: BLE001 - kept in the future, for whoever asks for the answer
            answer.set_exception(error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return answer
