"""The project's exceptions.

Every floe error derives from :class:`FloeError` and carries a stable ``kind``
string that callers (and the CLI) can branch on without parsing messages.
"""

from __future__ import annotations


class FloeError(Exception):
    """Base class of every error floe raises on purpose."""

    kind: str = "floe-error"


class RepositoryNotFound(FloeError):
    """No floe repository exists at the given root."""

    kind = "repository-not-found"


class RepositoryExists(FloeError):
    """A floe repository already exists where one was to be created."""

    kind = "repository-exists"


class RefNotFound(FloeError):
    """A branch, tag or snapshot id does not exist."""

    kind = "ref-not-found"


class RefExists(FloeError):
    """A branch or tag of that name exists already."""

    kind = "ref-exists"


class InvalidRefName(FloeError):
    """A branch or tag name floe refuses (empty, path-like, or ambiguous)."""

    kind = "invalid-ref-name"


class CorruptRepository(FloeError):
    """A snapshot carries no usable pointer to the items table."""

    kind = "corrupt-repository"


class InvalidItem(FloeError):
    """A STAC item that cannot be ingested; the message names the item and the source."""

    kind = "invalid-item"

    def __init__(self, message: str, *, item_id: str | None = None, source: str | None = None) -> None:
        self.item_id = item_id
        self.source = source
        where = " ".join(
            part for part in (f"in {source}" if source else "", f"item {item_id!r}" if item_id else "") if part
        )
        super().__init__(f"{where}: {message}" if where else message)
        self.reason = message


class InvalidSource(FloeError):
    """An input file that cannot be read or parsed at all."""

    kind = "invalid-source"


class InvalidExportTarget(FloeError):
    """An export's output cannot be written where it was asked (e.g. a directory holding something else)."""

    kind = "invalid-export-target"


class CommitConflict(FloeError):
    """A commit that cannot be reconciled with what another writer committed.

    Raised when the rebase finds changes to the same nodes (for example two
    writers creating the same item group); the message names the paths.
    """

    kind = "commit-conflict"

    def __init__(self, message: str, *, paths: list[str] | None = None) -> None:
        self.paths = paths or []
        super().__init__(message)


class ConflictRetriesExhausted(FloeError):
    """Every attempt of the rebase-and-reconcile loop lost its race."""

    kind = "conflict-retries-exhausted"


class WriterClosed(FloeError):
    """A writer that has committed (or failed) cannot stage more changes."""

    kind = "writer-closed"


class InvalidRaster(FloeError):
    """A raster asset floe cannot store; the message names the file (or asset key) and the reason."""

    kind = "invalid-raster"

    def __init__(self, message: str, *, path: str | None = None, asset: str | None = None) -> None:
        self.path = path
        self.asset = asset
        self.reason = message
        super().__init__(message)


class InvalidSearch(FloeError):
    """A search (or API request) that floe refuses: malformed bbox, datetime, CQL2, sortby, token or limit."""

    kind = "invalid-search"


class CollectionNotFound(FloeError):
    """No collection of that id exists at the ref searched."""

    kind = "collection-not-found"


class ItemNotFound(FloeError):
    """No item of that id exists in the collection at the ref searched."""

    kind = "item-not-found"


# -- lifecycle (gc, check, replicate) ----------------------------------------------------------
class InvalidDuration(FloeError):
    """A duration floe cannot parse (expected a number and a unit: 0s, 30m, 24h, 90d)."""

    kind = "invalid-duration"


class UnreadableTableFile(FloeError):
    """A table file that a live version needs is missing or cannot be parsed; gc and replicate stop."""

    kind = "unreadable-table-file"


class ReplicationFailed(FloeError):
    """The target of a replication did not verify; its refs were not moved."""

    kind = "replication-failed"


class RayUnavailable(FloeError):
    """The Ray cluster given with ``--ray-address`` could not be joined; the message says why and what to try."""

    kind = "ray-unavailable"


class NotVirtualizable(FloeError):
    """A raster floe cannot reference in place (``--virtual``); the caller copies the granule instead.

    The message names the file and why (pixel-interleaved, a compression or
    layout virtual-tiff cannot express, no virtual chunk container for it).
    """

    kind = "not-virtualizable"

    def __init__(self, message: str, *, path: str | None = None, asset: str | None = None) -> None:
        self.path = path
        self.asset = asset
        self.reason = message
        super().__init__(message)
