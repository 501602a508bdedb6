"""stac-geoparquet rows turned into STAC items, a record batch at a time.

:func:`geoparquet_items` gives the items stac-geoparquet's own reader gives, faster for the millions of rows of an
archive's stac-geoparquet (Planetary Computer publishes its items so); :func:`row_group_batches` reads a file row
group by row group. Where such files come from: docs/remote-sources.md#what-a-source-can-be.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ingest._compat import stac_json_batch
from ingest.stac._rows import geometries_from_wkb, paused_collection

PROJ_GEOMETRY = "proj:geometry"


def geoparquet_items(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """The STAC items of a stac-geoparquet record batch (as a file holds it), in its order.

    The items are those of stac-geoparquet's ``stac_table_to_items`` (the same dicts: every field of the schema,
    null where a row has none; assets a row lacks left out), made faster: stac-geoparquet's own ``to_json_batch``
    puts the columns back into STAC's layout (properties nested, timestamps as text, ``bbox`` a list), as it does;
    the rows become dicts in one Arrow call for the batch, not one per row; the WKB geometries (``geometry``, and
    ``proj:geometry`` of the properties and of each asset) become GeoJSON in one GEOS call per column
    (``to_geojson``; its text gives back the same doubles), not a Shapely object per row. On 1,000,000 rows of
    ``scripts/bench_blob_folder.py``'s items, 2.99x stac-geoparquet's reader (docs/benchmarks-history.md,
    twenty-first run).

    Raises whatever stac-geoparquet or Arrow raise for a batch that is not stac-geoparquet.
    """
    json_batch = stac_json_batch(batch)
    geometries = [(path, geometries_from_wkb(_column(json_batch, path).to_pylist())) for path in _wkb_paths(json_batch)]
    with paused_collection():
        rows = json_batch.to_pylist()
        for index, row in enumerate(rows):
            for path, values in geometries:
                _put(row, path, values[index])
            assets = row.setdefault("assets", {})
            if isinstance(assets, dict) and assets:
                row["assets"] = {key: value for key, value in assets.items() if value is not None}
    return rows


def row_group_batches(opened: pq.ParquetFile, rows: range | None = None) -> Iterator[pa.RecordBatch]:
    """The file's record batches, row group by row group (a batch never spans two, so a row group that cannot
    be read fails after every row before it).

    ``rows``: only these rows of the file (a part of it), read from the row groups that hold them and cut to them.
    """
    if rows is None:
        for group in range(opened.num_row_groups):
            yield from opened.iter_batches(row_groups=[group])
        return
    first = 0
    for group in range(opened.num_row_groups):
        count = opened.metadata.row_group(group).num_rows
        if first < rows.stop and first + count > rows.start:
            position = first
            for batch in opened.iter_batches(row_groups=[group]):
                low, high = max(rows.start - position, 0), min(rows.stop - position, batch.num_rows)
                if high > low:
                    yield batch.slice(low, high - low)
                position += batch.num_rows
        first += count


def _wkb_paths(batch: pa.RecordBatch) -> list[tuple[str, ...]]:
    """Where the batch holds WKB geometries: ``geometry``, and ``proj:geometry`` in the properties and assets."""
    paths: list[tuple[str, ...]] = [("geometry",)]
    schema = batch.schema
    if "properties" in schema.names:
        properties = schema.field("properties").type
        if pa.types.is_struct(properties) and properties.get_field_index(PROJ_GEOMETRY) >= 0:
            paths.append(("properties", PROJ_GEOMETRY))
    if "assets" in schema.names and pa.types.is_struct(schema.field("assets").type):
        for asset in schema.field("assets").type:
            if pa.types.is_struct(asset.type) and asset.type.get_field_index(PROJ_GEOMETRY) >= 0:
                paths.append(("assets", asset.name, PROJ_GEOMETRY))
    return paths


def _column(batch: pa.RecordBatch, path: tuple[str, ...]) -> pa.Array:
    column = batch.column(path[0])
    for name in path[1:]:
        column = pc.struct_field(column, name)
    return column


def _put(row: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    """``value`` at ``path`` of ``row``, where the row has that place (an asset the row lacks has none)."""
    for name in path[:-1]:
        row = row.get(name)  # type: ignore[assignment]
        if not isinstance(row, dict):
            return
    if path[-1] in row or value is not None:
        row[path[-1]] = value
