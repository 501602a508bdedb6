"""What never changes about a snapshot, read once per process: the table pointer it carries, a read-only session.

On object storage each Icechunk look-up is a round trip, and Icechunk 2.3
fetches its ``repo`` object again for every one (``lookup_snapshot``,
``readonly_session``): opening a repository and answering its first search
asked for it six times. A snapshot id always names the same commit, so its
pointer (in its commit metadata) and a read-only session on it serve every
later reader in the process: the engine's state of a version, its collections,
a view of it. A branch still costs its one look-up each time it is resolved
(that is how a reader learns it moved); what it resolves to is then known.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

import icechunk

from ingest.repository._commit import pointer_of

POINTERS_KEPT = 4096
SESSIONS_KEPT = 8
"""Read-only sessions kept (each holds Icechunk's caches of the manifests it read)."""


class KnownSnapshots:
    """Pointers and read-only sessions of the snapshots read so far, least recently used dropped beyond a count."""

    def __init__(self, repo: Callable[[], icechunk.Repository]) -> None:
        self.repo = repo
        """The repository object now (a floe repository may reopen it with another configuration)."""
        self._pointers: OrderedDict[str, str | None] = OrderedDict()
        self._sessions: OrderedDict[str, icechunk.Session] = OrderedDict()
        self._lock = threading.Lock()

    def knows(self, snapshot_id: str) -> bool:
        """Whether ``snapshot_id`` was read in this process (so it exists: snapshots are never rewritten)."""
        with self._lock:
            return snapshot_id in self._pointers or snapshot_id in self._sessions

    def pointer(self, snapshot_id: str) -> str | None:
        """The relative table pointer snapshot ``snapshot_id`` carries (None: none); IcechunkError if no such
        snapshot exists."""
        with self._lock:
            if snapshot_id in self._pointers:
                self._pointers.move_to_end(snapshot_id)
                return self._pointers[snapshot_id]
        pointer = pointer_of(self.repo(), snapshot_id)
        with self._lock:
            self._pointers[snapshot_id] = pointer
            while len(self._pointers) > POINTERS_KEPT:
                self._pointers.popitem(last=False)
        return pointer

    def remember(self, snapshot_id: str, pointer: str | None) -> None:
        """The pointer of a snapshot this process just committed (its next commit builds on it)."""
        with self._lock:
            self._pointers[snapshot_id] = pointer
            while len(self._pointers) > POINTERS_KEPT:
                self._pointers.popitem(last=False)

    def session(self, snapshot_id: str) -> icechunk.Session:
        """A read-only session at ``snapshot_id`` (shared: it reads, and what it reads never changes)."""
        with self._lock:
            found = self._sessions.get(snapshot_id)
            if found is not None:
                self._sessions.move_to_end(snapshot_id)
                return found
        return self.keep(self.repo().readonly_session(snapshot_id=snapshot_id))

    def keep(self, session: icechunk.Session) -> icechunk.Session:
        """Keep a read-only session someone opened (on a branch, say) as its snapshot's."""
        with self._lock:
            self._sessions[session.snapshot_id] = session
            while len(self._sessions) > SESSIONS_KEPT:
                self._sessions.popitem(last=False)
        return session
