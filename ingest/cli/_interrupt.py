"""Ctrl-C acts within seconds, even while the main thread is inside a call Python cannot interrupt.

The ``floe`` command arms a watchdog (:func:`arm`): after a Ctrl-C, Python's own handling gets
:data:`GRACE_SECONDS` to start; when it has not, or at a second Ctrl-C, the process says so and ends with exit code
130. Why, and what that means for the repository: docs/design.md §8 (Ctrl-C) and
docs/ingest.md#exit-status-and-ctrl-c.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from ingest.cli._app import EXIT_INTERRUPTED

GRACE_SECONDS = 5.0
"""How long Python's own handling of a Ctrl-C may take to start before the process ends without it."""

STUCK_MESSAGE = (
    "interrupted: the call under way (storage, as a rule) did not return within {grace:g} s of Ctrl-C, so the "
    "process ends without waiting for it; commits made before stay, and nothing half-written is visible\n"
)
AGAIN_MESSAGE = (
    "interrupted again: the process ends now; commits made before stay, and nothing half-written is visible\n"
)

_ARMED = threading.Event()
_HANDLED = [0]
"""How many SIGINTs Python's handler (:func:`_on_interrupt`) has run for."""


def _on_interrupt(signum: int, frame: object) -> None:
    """Python's own SIGINT handling (KeyboardInterrupt, raised as Python's own handler does), noting that it ran: a
    Ctrl-C it has not run for within the grace means the main thread is still inside the call."""
    _HANDLED[0] += 1
    raise KeyboardInterrupt


def arm(grace_seconds: float = GRACE_SECONDS) -> bool:
    """Arm the watchdog for this process (once; from the main thread): the operating system writes each signal's
    number to a pipe as it arrives (``signal.set_wakeup_fd``), whatever the main thread is doing, and a daemon
    thread (:func:`_watch`) reads it. Not armed (False) when SIGINT is not
    Python's default handler (ignored, as in a background job, or handled by someone else) or the wake-up pipe is
    taken (an asyncio loop's)."""
    if _ARMED.is_set():
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return False
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    except ValueError:
        os.close(read_end)
        os.close(write_end)
        return False
    if previous != -1:
        signal.set_wakeup_fd(previous)
        os.close(read_end)
        os.close(write_end)
        return False
    signal.signal(signal.SIGINT, _on_interrupt)
    threading.Thread(target=_watch, args=(read_end, grace_seconds), name="floe-interrupt", daemon=True).start()
    _ARMED.set()
    return True


def _ours() -> bool:
    """Whether Ctrl-C is still floe's to handle (no one has installed another SIGINT handler since)."""
    return signal.getsignal(signal.SIGINT) is _on_interrupt


def _watch(read_end: int, grace_seconds: float) -> None:
    """After a Ctrl-C, look again ``grace_seconds`` later: Python has run its handler for it, or the process ends.
    A second Ctrl-C ends the process at once."""
    received = 0
    deadline: float | None = None
    while True:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        if _readable(read_end, timeout):
            data = os.read(read_end, 64)
            if not data:
                return
            interrupts = data.count(signal.SIGINT)
            if interrupts and _ours():
                if received:
                    _end(AGAIN_MESSAGE)
                received += interrupts
                deadline = time.monotonic() + grace_seconds
            continue
        if deadline is not None:
            deadline = None
            if _ours() and _HANDLED[0] < received:
                _end(STUCK_MESSAGE.format(grace=grace_seconds))


def _readable(fd: int, timeout: float | None) -> bool:
    import select

    return bool(select.select([fd], [], [], timeout)[0])


def _end(message: str) -> None:
    try:
        os.write(2, message.encode())
    finally:
        os._exit(EXIT_INTERRUPTED)
