"""The hybrid store: an Icechunk repository whose commits carry the Iceberg items table's pointer."""

from ingest.repository._catalog import PointerCatalog
from ingest.repository._repo import LogEntry, Ref, Repository, View, check_ref_name
from ingest.repository._writer import CommitResult, Writer

__all__ = ["CommitResult", "LogEntry", "PointerCatalog", "Ref", "Repository", "View", "Writer", "check_ref_name"]
