"""Getting items into a repository: sources, granules, batch ingestion in-process or with Ray actors."""

from ingest.pipeline._granules import Granule, granule_from_item
from ingest.pipeline._ingest import IngestReport, Rejection, ingest_items
from ingest.pipeline._ray import ingest_with_ray, start_ray
from ingest.pipeline._sources import SourcedItem, read_items

__all__ = [
    "Granule",
    "IngestReport",
    "Rejection",
    "SourcedItem",
    "granule_from_item",
    "ingest_items",
    "ingest_with_ray",
    "read_items",
    "start_ray",
]
