"""floe: an Earth-observation archive's rasters (Icechunk) and STAC items (Iceberg) in one versioned store."""

from ingest.config import Settings, load_settings
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
from ingest.repository import CommitResult, LogEntry, Ref, Repository, View, Writer

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


def __getattr__(name: str) -> object:
    # The search engine (and what it imports) loads only when a search is opened.
    if name == "open_search":
        from ingest.api import open_search

        return open_search
    raise AttributeError(name)
