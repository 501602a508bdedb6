"""Getting items into a repository: sources and batch ingestion."""

from ingest.pipeline._ingest import IngestReport, Rejection, ingest_items
from ingest.pipeline._sources import SourcedItem, read_items

__all__ = ["IngestReport", "Rejection", "SourcedItem", "ingest_items", "read_items"]
