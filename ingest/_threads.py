"""Calls on daemon threads: work started early, blocking calls made where Ctrl-C can end the wait, and a pool whose
threads nothing waits for.

A call into Rust (obstore's requests, Icechunk's) holds the main thread until
it returns, and Python runs a signal's handler only between bytecodes: during a
stalled transfer Ctrl-C does nothing until obstore's read times out (30 s,
retried for up to 3 minutes). Made on a daemon thread and waited for on the
main thread, the wait is what Ctrl-C interrupts; the abandoned call does not
hold up the end of the process.
"""

from __future__ import annotations

import contextlib
import functools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any


def on_daemon_thread[T](call: Callable[[], T], name: str) -> Future[T]:
    """``call()`` started on a daemon thread of its own: its future holds what it returns or raises. Nothing
    waits for the thread when its answer is no longer wanted, the end of the process included."""
    answer: Future[T] = Future()

    def run() -> None:
        try:
            answer.set_result(call())
        except BaseException as error:  # noqa: BLE001 - kept in the future, for whoever asks for the answer
            answer.set_exception(error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return answer


def interruptible[T](call: Callable[[], T], name: str) -> T:
    """``call()``, where Ctrl-C can end the wait for it: on the main thread it runs on a daemon thread and is
    waited for; on any other thread (which signals never reach) it is simply called."""
    if threading.current_thread() is not threading.main_thread():
        return call()
    return on_daemon_thread(call, name).result()


class DaemonPool(Executor):
    """A pool of ``workers`` daemon threads running what is submitted, in order: an executor nothing waits for at
    the end of the process.

    ``ThreadPoolExecutor`` joins its threads when its ``with`` block ends and
    again at exit, so after Ctrl-C a read stalled in Rust or GDAL held the
    process until it timed out. Here, a block left by an error still waits for
    the calls running (the next batch does not start beside them), but one left
    by Ctrl-C (a ``BaseException`` that is not an ``Exception``) cancels what has
    not started and waits for nothing.
    """

    def __init__(self, workers: int, name: str) -> None:
        self._workers, self._name = workers, name
        self._tasks: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None] = (
            queue.SimpleQueue()
        )
        self._threads: list[threading.Thread] = []
        """Started as calls are submitted, up to ``workers`` (a batch of items alone starts none)."""

    def submit[T](self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        self._tasks.put((future, functools.partial(fn, **kwargs) if kwargs else fn, args))
        if len(self._threads) < self._workers:
            thread = threading.Thread(target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True)
            self._threads.append(thread)
            thread.start()
        return future

    def _work(self) -> None:
        while (task := self._tasks.get()) is not None:
            future, fn, args = task
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as error:  # noqa: BLE001 - kept in the future, for whoever asks for the answer
                future.set_exception(error)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if cancel_futures:
            with contextlib.suppress(queue.Empty):
                while (task := self._tasks.get_nowait()) is not None:
                    task[0].cancel()
        for _ in self._threads:
            self._tasks.put(None)
        if wait:
            for thread in self._threads:
                thread.join()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: Any) -> None:
        interrupted = kind is not None and not issubclass(kind, Exception)
        self.shutdown(wait=not interrupted, cancel_futures=interrupted)
