"""Getting items into a repository: sources, granules, batch ingestion in-process or with Ray actors."""

from ingest.pipeline._arrays import georeferenced, stage_arrays
from ingest.pipeline._granules import Granule, granule_from_item
from ingest.pipeline._ingest import ingest_items
from ingest.pipeline._ray import ingest_with_ray, start_ray
from ingest.pipeline._report import IngestReport, Rejection
from ingest.pipeline._sources import SourcedItem, SourceOptions, read_items
from ingest.pipeline._stac_api import ApiSearch, SearchParameters, is_api_url, parse_since
from ingest.pipeline._stream import granule_stream

__all__ = [
    "ApiSearch",
    "Granule",
    "IngestReport",
    "Rejection",
    "SearchParameters",
    "SourceOptions",
    "SourcedItem",
    "georeferenced",
    "granule_from_item",
    "granule_stream",
    "ingest_items",
    "ingest_with_ray",
    "is_api_url",
    "parse_since",
    "read_items",
    "stage_arrays",
    "start_ray",
]
