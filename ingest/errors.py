"""The floe exception tree: every error floe raises on purpose, grouped by what a handler does about it.

Each carries ``kind``, a stable code to branch on without parsing messages (how the CLI and the STAC API use it:
docs/development.md#writing-code). The tree, with the status the STAC API answers (``tests/test_errors.py`` checks
that every error is in it)::

    FloeError
    ├── NotFound                      (also a KeyError)     404
    │   ├── RepositoryNotFound
    │   ├── RefNotFound
    │   ├── CollectionNotFound
    │   ├── ItemNotFound
    │   ├── TileOutsideBounds
    │   └── SearchNotFound
    ├── AlreadyExists                                       409
    │   ├── RepositoryExists
    │   ├── RefExists
    │   └── ItemExists
    ├── InvalidInput                  (also a ValueError)   400
    │   ├── InvalidRoot
    │   ├── InvalidSettings
    │   ├── UnsupportedLayout
    │   ├── InvalidRefName
    │   ├── InvalidItem
    │   ├── InvalidCollection
    │   ├── InvalidSource
    │   ├── InvalidRaster
    │   ├── NotVirtualizable
    │   ├── InvalidSearch
    │   │   └── RequestTooLarge
    │   ├── InvalidTileRequest
    │   ├── InvalidDuration
    │   └── InvalidExportTarget
    ├── Conflict                      (retry or re-plan)    409
    │   ├── CommitConflict
    │   ├── ConflictRetriesExhausted
    │   └── StaleVersion              (If-Match)            412
    ├── Refused                       (not allowed here)
    │   ├── NotAuthorized                                   401
    │   └── ReadOnlyRef                                     405
    ├── WriterClosed                  (a bug in the caller)
    ├── Corrupt                       (the store is damaged) 500
    │   ├── CorruptRepository
    │   ├── UnreadableTableFile
    │   ├── RepositoryMoved
    │   └── ReplicationFailed
    └── Unavailable                   (a service to reach)  503
        ├── RayUnavailable
        ├── StoreUnreachable
        └── BrowserInstallFailed
"""

from __future__ import annotations


class FloeError(Exception):
    """Base class of every error floe raises on purpose."""

    kind: str = "floe-error"
    """A stable code callers match on: kinds are append-only, never renamed."""

    # KeyError quotes its message in str(); floe's messages are sentences, shown as they are.
    __str__ = Exception.__str__


# -- not found ------------------------------------------------------------------------------------
class NotFound(FloeError, KeyError):
    """Something named does not exist (a repository, ref, collection or item)."""

    kind = "not-found"


class RepositoryNotFound(NotFound):
    """No floe repository exists at the given root."""

    kind = "repository-not-found"


class RefNotFound(NotFound):
    """A branch, tag or snapshot id does not exist."""

    kind = "ref-not-found"


class CollectionNotFound(NotFound):
    """No collection of that id exists at the ref searched."""

    kind = "collection-not-found"


class ItemNotFound(NotFound):
    """No item of that id exists in the collection at the ref searched."""

    kind = "item-not-found"


class TileOutsideBounds(NotFound):
    """A map tile asked of an item's arrays lies outside them (titiler's convention: 404)."""

    kind = "tile-outside-bounds"


class SearchNotFound(NotFound):
    """No mosaic search has that id: a registered search's id is the search itself, and this one does not decode
    to a search."""

    kind = "search-not-found"


# -- already exists -------------------------------------------------------------------------------
class AlreadyExists(FloeError):
    """Something to be created exists already."""

    kind = "already-exists"


class RepositoryExists(AlreadyExists):
    """A floe repository already exists where one was to be created."""

    kind = "repository-exists"


class RefExists(AlreadyExists):
    """A branch or tag of that name exists already (tags never move)."""

    kind = "ref-exists"


class ItemExists(AlreadyExists):
    """An item to be created (``POST``) exists already in its collection: ``PUT`` replaces it."""

    kind = "item-exists"


# -- invalid input --------------------------------------------------------------------------------
class InvalidInput(FloeError, ValueError):
    """Input floe refuses; the message names the input and what is wrong with it."""

    kind = "invalid-input"


class InvalidRoot(InvalidInput):
    """A root that is neither a local path nor an s3:// URL."""

    kind = "invalid-root"


class InvalidSettings(InvalidInput):
    """Settings that contradict each other or that a client of the store would read differently (S3's)."""

    kind = "invalid-settings"


class UnsupportedLayout(InvalidInput):
    """A repository written with an array layout this floe does not read (an earlier floe's group per item)."""

    kind = "unsupported-layout"

    def __init__(self, message: str, *, layout: int | None = None) -> None:
        self.layout = layout
        super().__init__(message)


class InvalidRefName(InvalidInput):
    """A branch or tag name floe refuses (empty, path-like, or ambiguous)."""

    kind = "invalid-ref-name"


class InvalidItem(InvalidInput):
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


class InvalidCollection(InvalidInput):
    """A STAC Collection floe cannot store (its id is missing, or unsafe as a group name)."""

    kind = "invalid-collection"


class InvalidSource(InvalidInput):
    """An input file that cannot be read or parsed at all."""

    kind = "invalid-source"


class InvalidRaster(InvalidInput):
    """A raster asset floe cannot store; the message names the file (or asset key) and the reason."""

    kind = "invalid-raster"

    def __init__(self, message: str, *, path: str | None = None, asset: str | None = None) -> None:
        self.path = path
        self.asset = asset
        self.reason = message
        super().__init__(message)


class NotVirtualizable(InvalidInput):
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


class InvalidSearch(InvalidInput):
    """A search (or API request) that floe refuses: malformed bbox, datetime, CQL2, sortby, token or limit."""

    kind = "invalid-search"


class RequestTooLarge(InvalidSearch):
    """An API request whose body is larger than the server reads (``api.max_body_bytes``)."""

    kind = "request-too-large"


class InvalidTileRequest(InvalidInput):
    """A map tile request floe cannot answer: a tile matrix set, zoom, asset, band, expression, rescale, colormap
    or format it does not know; the message names which."""

    kind = "invalid-tile-request"


class InvalidDuration(InvalidInput):
    """A duration floe cannot parse (expected a number and a unit: 0s, 30m, 24h, 90d)."""

    kind = "invalid-duration"


class InvalidExportTarget(InvalidInput):
    """An export's output cannot be written where it was asked (e.g. a directory holding something else)."""

    kind = "invalid-export-target"


# -- conflicts ------------------------------------------------------------------------------------
class Conflict(FloeError):
    """A change that lost to a concurrent one: plan it again from the new tip, or retry later."""

    kind = "conflict"


class CommitConflict(Conflict):
    """A commit that cannot be reconciled with what another writer committed.

    Raised when the rebase finds changes to the same nodes (for example two
    writers creating the same item group); the message names the paths.
    """

    kind = "commit-conflict"

    def __init__(self, message: str, *, paths: list[str] | None = None) -> None:
        self.paths = paths or []
        super().__init__(message)


class ConflictRetriesExhausted(Conflict):
    """Every attempt of the rebase-and-reconcile loop lost its race."""

    kind = "conflict-retries-exhausted"


class StaleVersion(Conflict):
    """A change made for one version of an item (an ``If-Match``) met another: read the item again."""

    kind = "stale-version"


# -- refusals -------------------------------------------------------------------------------------
class Refused(FloeError):
    """The request is not allowed: without credentials, or on a ref that cannot change."""

    kind = "refused"


class NotAuthorized(Refused):
    """A write without the write token (``Authorization: Bearer <token>``)."""

    kind = "not-authorized"


class ReadOnlyRef(Refused):
    """A write to a tag or a snapshot: only branches move."""

    kind = "read-only-ref"


# -- misuse ---------------------------------------------------------------------------------------
class WriterClosed(FloeError):
    """A writer that has committed (or failed) cannot stage more changes."""

    kind = "writer-closed"


# -- a damaged store ------------------------------------------------------------------------------
class Corrupt(FloeError):
    """What the repository holds is damaged or missing: repair or restore it (see ``floe check``)."""

    kind = "corrupt"


class CorruptRepository(Corrupt):
    """A snapshot carries no usable pointer to the items table."""

    kind = "corrupt-repository"


class UnreadableTableFile(Corrupt):
    """A table file that a live version needs is missing or cannot be parsed; gc and replicate stop."""

    kind = "unreadable-table-file"


class RepositoryMoved(Corrupt):
    """A repository copied or moved to another root whose table metadata still names the old one.

    Until ``floe relocate`` rewrites it, floe neither reads nor writes it: reads would read the old
    root's files, writes would write there, and gc would take this root's files for unreferenced ones.
    """

    kind = "repository-moved"

    def __init__(self, message: str, *, recorded_root: str | None = None, root: str | None = None) -> None:
        self.recorded_root = recorded_root
        self.root = root
        super().__init__(message)


class ReplicationFailed(Corrupt):
    """The target of a replication did not verify; its refs were not moved."""

    kind = "replication-failed"


# -- services -------------------------------------------------------------------------------------
class Unavailable(FloeError):
    """A service floe needs cannot be reached."""

    kind = "unavailable"


class RayUnavailable(Unavailable):
    """The Ray cluster given with ``--ray-address`` could not be joined; the message says why and what to try."""

    kind = "ray-unavailable"


class StoreUnreachable(Unavailable):
    """The object store of a repository's root cannot be reached (a wrong endpoint, a missing bucket, refused
    credentials); the message names the root and the cause."""

    kind = "store-unreachable"


class BrowserInstallFailed(Unavailable):
    """Building STAC Browser failed (npm missing, a step that failed, a build floe cannot configure): the step,
    and where its output is."""

    kind = "browser-install-failed"
