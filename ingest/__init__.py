"""floe: an Earth-observation archive's rasters (Icechunk) and STAC items (Iceberg) in one versioned store.

The names below load when first used (``ingest._lazy``), but for the errors: importing one module of floe does not
import them all.
"""

from typing import TYPE_CHECKING

from ingest._lazy import lazy_names
from ingest.errors import (
    CommitConflict,
    ConflictRetriesExhausted,
    CorruptRepository,
    FloeError,
    InvalidItem,
    InvalidRaster,
    InvalidRefName,
    InvalidSource,
    RefExists,
    RefNotFound,
    RepositoryExists,
    RepositoryNotFound,
    UnsupportedLayout,
    WriterClosed,
)

if TYPE_CHECKING:
    from ingest.api import open_search
    from ingest.config import Settings, load_settings
    from ingest.repository import CommitResult, LogEntry, Ref, Repository, View, Writer

_HOMES = {
    **dict.fromkeys(("Settings", "load_settings"), "ingest.config"),
    **dict.fromkeys(("CommitResult", "LogEntry", "Ref", "Repository", "View", "Writer"), "ingest.repository"),
    "open_search": "ingest.api",
}

__all__ = [
    "CommitConflict",
    "CommitResult",
    "ConflictRetriesExhausted",
    "CorruptRepository",
    "FloeError",
    "InvalidItem",
    "InvalidRaster",
    "InvalidRefName",
    "InvalidSource",
    "LogEntry",
    "Ref",
    "RefExists",
    "RefNotFound",
    "Repository",
    "RepositoryExists",
    "RepositoryNotFound",
    "Settings",
    "UnsupportedLayout",
    "View",
    "Writer",
    "WriterClosed",
    "load_settings",
    "open_search",
]

__getattr__ = lazy_names(__name__, globals(), _HOMES)
