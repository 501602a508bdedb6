"""Named fault points: a process that reaches the point named by ``FLOE_FAULT`` kills itself with SIGKILL.

:func:`fault_point` calls sit where a crash would hurt most, and do nothing unless ``FLOE_FAULT=name`` (or
``name:N``, the N-th hit in this process) names them; :data:`POINTS` lists them all. Where each one is, and how
the crash harness uses them: docs/reliability.md#fault-points.
"""

from __future__ import annotations

import os
import signal

ENVIRONMENT_VARIABLE = "FLOE_FAULT"

POINTS = (
    "create.before_first_commit",
    "write.data_file",
    "commit.after_metadata",
    "commit.before_swap",
    "commit.after_swap",
    "ref.before_create",
    "ref.after_create",
    "gc.after_expire",
    "gc.after_icechunk",
    "gc.between_deletions",
    "replicate.between_copies",
    "replicate.between_rewrites",
    "replicate.before_refs",
    "reader.after_page",
)
"""Every fault point floe has (where each one is: docs/reliability.md#fault-points)."""


class _Armed:
    """The point this process dies at and the hits counted so far. The environment is read once, the first time any
    point is reached, so an unset variable costs one attribute test per point."""

    def __init__(self) -> None:
        self.loaded = False
        self.name: str | None = None
        self.at_hit = 1
        self.hits = 0

    def load(self) -> None:
        self.loaded = True
        self.name, self.at_hit = parse(os.environ.get(ENVIRONMENT_VARIABLE, ""))


def parse(value: str) -> tuple[str | None, int]:
    """``name`` or ``name:N`` -> (name, N); an empty value, or a count that is not a positive integer, arms nothing."""
    name, _, count = value.strip().partition(":")
    if not name:
        return None, 1
    if not count:
        return name, 1
    return (name, int(count)) if count.isdigit() and int(count) >= 1 else (None, 1)


_armed = _Armed()


def fault_point(name: str) -> None:
    """Die here (SIGKILL, this process) if ``FLOE_FAULT`` names this point and this is its N-th hit; else nothing."""
    armed = _armed
    if not armed.loaded:
        armed.load()
    if armed.name is None or armed.name != name:
        return
    armed.hits += 1
    if armed.hits == armed.at_hit:
        os.kill(os.getpid(), signal.SIGKILL)
