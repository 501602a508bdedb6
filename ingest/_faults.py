"""Named fault points: a process that reaches the point named by ``FLOE_FAULT`` kills itself with SIGKILL.

Storage systems prove that a crash anywhere loses nothing by crashing on
purpose at the moments that matter (failpoints). floe's are one-line calls,
``fault_point("commit.before_swap")``, placed where a crash would hurt most.
They do nothing unless the environment variable ``FLOE_FAULT`` names them:

- ``FLOE_FAULT=commit.after_swap``: the first time this process reaches the point;
- ``FLOE_FAULT=commit.after_swap:3``: the third time this process reaches it.

The variable is read once per process (the first time any point is reached),
so an unset variable costs one attribute test per point. Each process counts
its own hits: the driver of a Ray ingest and each of its actors inherit the
variable, and the first of them to reach the N-th hit dies. SIGKILL runs no
handler, no ``finally`` and no ``atexit``, as a power cut or an OOM kill would.

The points (name: where the process dies):

- ``create.before_first_commit``: a new repository's Icechunk repository is
  there, floe's first commit (the empty items table) is not yet
  (``repository/_repo.py``; ``floe init`` completes such a one);
- ``write.data_file``: right after a data file of the items table is written
  (a writer's new file, or a copy-on-write rewrite for a replacement), before
  the next one of the batch (``repository/_files.py``, ``repository/_replace.py``);
  on S3 a writer's new files are sent together once the batch's are all made
  (``ingest.remote.writes_together``), so a kill here there leaves none of them;
- ``commit.after_metadata``: after the next table metadata.json is written,
  before the Icechunk commit is attempted (``repository/_commit.py``);
- ``commit.before_swap``: inside the commit, under the local lock, just before
  ``Session.commit`` swaps the branch (``repository/_commit.py``);
- ``commit.after_swap``: right after ``Session.commit`` returns, before the
  writer learns its commit landed (``repository/_commit.py``);
- ``ref.before_create`` / ``ref.after_create``: just before and just after
  ``floe tag`` or ``floe branch`` writes the new ref (``repository/_repo.py``);
- ``gc.after_expire``: after snapshots were expired, before Icechunk's garbage
  collection (``lifecycle/_gc.py``);
- ``gc.after_icechunk``: between Icechunk's garbage collection and the sweep
  of ``tables/`` (``lifecycle/_gc.py``);
- ``gc.between_deletions``: after each table file gc deletes, before the next
  (``lifecycle/_gc.py``);
- ``replicate.between_copies``: after each object or data file replicate
  copies, before the next (``lifecycle/_replicate.py``);
- ``replicate.between_rewrites``: after each table metadata file replicate
  rewrites for the target, before the next (``lifecycle/_replicate.py``);
- ``replicate.before_refs``: after the target verified, just before its refs
  move (``lifecycle/_replicate.py``);
- ``reader.after_page``: a search's page reader, right after it sent a page
  to the ingest (``pipeline/sources/_api_reader.py``): the ingest reads on itself.

``scripts/crash_harness.py`` and ``tests/lifecycle/test_crash.py`` kill floe
at each of them and check that nothing committed is lost or half-visible.
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
"""Every fault point floe has (documented above)."""


class _Armed:
    """The point this process dies at (read once from the environment) and the hits counted so far."""

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
