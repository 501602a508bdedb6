"""Export as one stac-geoparquet file, streamed batch by batch with a Parquet writer.

:func:`export_geoparquet` conforms each batch of floe's rows to the table's schema at the exported snapshot
(:func:`conform_batch`) and writes the ``geo`` and ``stac-geoparquet`` footers (:func:`geoparquet_footer`);
:func:`read_geoparquet_items` reads the file back exactly. What the file holds: docs/sql.md#a-stac-geoparquet-export.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io.pyarrow import schema_to_pyarrow

from ingest._compat import geoparquet_metadata
from ingest.export._common import ExportResult, replacing_file
from ingest.repository import View
from ingest.stac import (
    HILBERT,
    OVERFLOW,
    TIMESTAMP,
    arrow_to_items,
    loads_json,
    normalize_type,
    parse_datetime,
    render_datetime,
)

GEOPARQUET_VERSION = "1.1.0"
# Properties stac-geoparquet stores (and its reader expects) as timestamps.
TIMESTAMP_PROPERTIES = ("created", "updated", "expires", "published", "unpublished")
ROW_GROUP_ROWS = 65_536


def export_schema(view: View) -> pa.Schema:
    """The Arrow schema of the export: the table's columns at this snapshot, every one nullable.

    Timestamp properties that floe keeps as text (``created``, ``updated``, ...)
    are timestamps here, as stac-geoparquet wants them. floe's sort key
    (the Hilbert index) is left out.

    Args:
        view: the snapshot whose table schema is exported.

    Returns:
        The schema, without the GeoParquet footer (:func:`geoparquet_footer`).
    """
    arrow = schema_to_pyarrow(view.table.schema(), include_field_ids=False)
    fields = []
    for column in arrow:
        if column.name == HILBERT:  # floe's sort key, not an item member: other readers would take it for a property
            continue
        data_type = normalize_type(column.type)
        if column.name in TIMESTAMP_PROPERTIES and pa.types.is_string(data_type):
            data_type = TIMESTAMP
        fields.append(pa.field(column.name, data_type, nullable=True))
    return pa.schema(fields)


def _timestamps_from_text(column: pa.Array, name: str, overflow: list[str | None]) -> tuple[pa.Array, list[str | None]]:
    """Parse a text timestamp column; text that does not come back identical goes to the row's overflow."""
    values: list[datetime | None] = []
    overflow = list(overflow)
    for row, text in enumerate(column.to_pylist()):
        parsed = None
        if text is not None:
            try:
                parsed = parse_datetime(text)
            except ValueError:
                parsed = None
            if parsed is None or render_datetime(parsed) != text:
                payload = loads_json(overflow[row] or "{}")
                payload.setdefault("properties", {})[name] = text
                overflow[row] = json.dumps(payload, separators=(",", ":"), allow_nan=True)
        values.append(parsed)
    return pa.array(values, type=TIMESTAMP), overflow


def conform(array: pa.Array, target: pa.DataType) -> pa.Array:
    """``array`` as ``target``: struct fields matched by name (absent ones null), lists element-wise, else a cast."""
    if array.type == target:
        return array
    mask = array.is_null() if array.null_count else None
    if pa.types.is_struct(target) and pa.types.is_struct(array.type):
        present = {array.type.field(i).name for i in range(array.type.num_fields)}
        children = [
            conform(array.field(field.name), field.type) if field.name in present else pa.nulls(len(array), field.type)
            for field in target
        ]
        return pa.StructArray.from_arrays(children, fields=list(target), mask=mask)
    if pa.types.is_list(target) and (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)):
        offsets = array.offsets.cast(pa.int32())
        return pa.ListArray.from_arrays(offsets, conform(array.values, target.value_type), type=target, mask=mask)
    return array.cast(target)


def conform_batch(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """One batch of a data file with exactly the export's columns, in its order."""
    names = set(batch.schema.names)
    text_timestamps = [
        name
        for name in TIMESTAMP_PROPERTIES
        if name in names
        and pa.types.is_timestamp(schema.field(name).type)
        and not pa.types.is_timestamp(batch.schema.field(name).type)
    ]
    if text_timestamps:
        overflow = batch.column(OVERFLOW).to_pylist() if OVERFLOW in names else [None] * batch.num_rows
        for name in text_timestamps:
            converted, overflow = _timestamps_from_text(batch.column(name).cast(pa.string()), name, overflow)
            batch = batch.set_column(batch.schema.get_field_index(name), name, converted)
        overflow_array = pa.array(overflow, type=pa.string())
        if OVERFLOW in names:
            batch = batch.set_column(batch.schema.get_field_index(OVERFLOW), OVERFLOW, overflow_array)
        else:
            batch = batch.append_column(OVERFLOW, overflow_array)
        names = set(batch.schema.names)
    columns = [
        conform(batch.column(field.name), field.type) if field.name in names else pa.nulls(batch.num_rows, field.type)
        for field in schema
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def geoparquet_footer(schema: pa.Schema, collections: dict[str, Any]) -> dict[bytes, bytes]:
    """The ``geo`` and ``stac-geoparquet`` key-value metadata for ``schema``.

    stac_geoparquet declares ``proj:geometry`` a WKB column whenever one exists;
    floe keeps that property as the GeoJSON object it came in as, so it is only
    declared when it really is binary (readers decode every declared column).
    """
    footer = geoparquet_metadata(schema, schema_version=GEOPARQUET_VERSION, collections=collections or None)
    geo = json.loads(footer[b"geo"])
    geo["columns"] = {
        name: meta for name, meta in geo["columns"].items() if pa.types.is_binary(schema.field(name).type)
    }
    footer[b"geo"] = json.dumps(geo).encode("utf-8")
    return footer


def export_geoparquet(view: View, out: str | os.PathLike[str]) -> ExportResult:
    """Write every item at ``view`` to one GeoParquet file at ``out`` (replaced only once complete).

    Rows stream batch by batch, in the table's order, gathered into row groups
    of up to :data:`ROW_GROUP_ROWS` rows (zstd-compressed, with statistics);
    the footer carries the ``geo`` and ``stac-geoparquet`` metadata, the
    stored collections included.

    Args:
        view: the snapshot to export (:meth:`~ingest.repository.Repository.view`).
        out: the file to write (its folder is created if missing).

    Returns:
        The format (``stac-geoparquet``), the items and collections written, the ref and snapshot, and ``out``.

    Raises:
        InvalidExportTarget: ``out`` is a folder, or a file stands where its folder would be.
    """
    schema = export_schema(view)
    collections = view.repository.collections(view.snapshot_id)
    schema = schema.with_metadata(geoparquet_footer(schema, collections))
    target = Path(out)
    count = 0
    seen: set[str] = set()
    with (
        replacing_file(target, "wb") as stream,
        pq.ParquetWriter(stream, schema, compression="zstd", write_statistics=True) as writer,
    ):
        # Small data files would make small row groups: gather batches up to a row group's worth (bounded memory).
        pending: list[pa.RecordBatch] = []
        pending_rows = 0
        for batch in view.batches():
            pending.append(conform_batch(batch, schema))
            pending_rows += batch.num_rows
            count += batch.num_rows
            seen.update(value for value in batch.column("collection").unique().to_pylist() if value is not None)
            if pending_rows >= ROW_GROUP_ROWS:
                writer.write_table(pa.Table.from_batches(pending, schema=schema), row_group_size=ROW_GROUP_ROWS)
                pending, pending_rows = [], 0
        if pending:
            writer.write_table(pa.Table.from_batches(pending, schema=schema), row_group_size=ROW_GROUP_ROWS)
    return ExportResult("stac-geoparquet", count, len(seen), view.ref, view.snapshot_id, str(target))


def read_geoparquet_items(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """The STAC items of a file written by :func:`export_geoparquet`, exactly as exported (``floe:overflow`` merged
    back), streamed.

    Args:
        path: the GeoParquet file.

    Yields:
        Each item, in the file's order, as a STAC item dict (timestamp properties as RFC 3339 text again).
    """
    parquet = pq.ParquetFile(path)
    for raw in parquet.iter_batches():
        batch = raw
        for name in TIMESTAMP_PROPERTIES:
            if name in batch.schema.names and pa.types.is_timestamp(batch.schema.field(name).type):
                text = [None if value is None else render_datetime(value) for value in batch.column(name).to_pylist()]
                batch = batch.set_column(batch.schema.get_field_index(name), name, pa.array(text, type=pa.string()))
        yield from arrow_to_items(pa.Table.from_batches([batch]))
