"""Getting items into a repository: sources, granules, batch ingestion in-process or with Ray actors.

The names below load when first used (``ingest._lazy``): the STAC API page reader, a process of its own, imports
``ingest.pipeline.sources._api_reader`` without the repository, zarr or Ray. Sources: ``ingest.pipeline.sources``.
"""

from typing import TYPE_CHECKING

from ingest._lazy import lazy_names

if TYPE_CHECKING:
    from ingest.pipeline._arrays import georeferenced, stage_arrays
    from ingest.pipeline._granules import Granule, granule_from_item
    from ingest.pipeline._ingest import ingest_items
    from ingest.pipeline._ray import ingest_with_ray, start_ray
    from ingest.pipeline._report import IngestReport, Rejection
    from ingest.pipeline._stream import granule_stream
    from ingest.pipeline.sources import (
        ApiSearch,
        SearchParameters,
        SourcedItem,
        SourceOptions,
        is_api_url,
        parse_since,
        read_items,
    )

_HOMES = {
    **dict.fromkeys(("georeferenced", "stage_arrays"), "ingest.pipeline._arrays"),
    **dict.fromkeys(("Granule", "granule_from_item"), "ingest.pipeline._granules"),
    "ingest_items": "ingest.pipeline._ingest",
    **dict.fromkeys(("ingest_with_ray", "start_ray"), "ingest.pipeline._ray"),
    **dict.fromkeys(("IngestReport", "Rejection"), "ingest.pipeline._report"),
    **dict.fromkeys(
        ("ApiSearch", "SearchParameters", "SourcedItem", "SourceOptions", "is_api_url", "parse_since", "read_items"),
        "ingest.pipeline.sources",
    ),
    "granule_stream": "ingest.pipeline._stream",
}

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

__getattr__ = lazy_names(__name__, globals(), _HOMES)
