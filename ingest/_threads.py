"""Calls on daemon threads of their own: work started early, and blocking calls made where Ctrl-C can end the wait.

A call into Rust (obstore's requests, Icechunk's) holds the main thread until
it returns, and Python runs a signal's handler only between bytecodes: during a
stalled transfer Ctrl-C does nothing until obstore's read times out (30 s,
retried for up to 3 minutes). Made on a daemon thread and waited for on the
main thread, the wait is what Ctrl-C interrupts; the abandoned call does not
hold up the end of the process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future


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
