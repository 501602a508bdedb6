"""The items table's data files: planned per (collection, month), written once, registered per attempt.

A writer converts its items into one GeoParquet file per partition and writes
it before the commit loop starts. Each attempt of the loop then builds the
Iceberg ``DataFile`` for that file from the Parquet footer kept in memory,
against whatever schema the attempt's base has, so a retry re-registers the
same files instead of rewriting them. Only a real type conflict with a column
another writer added in the meantime makes a file be written again.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.conversions import to_bytes
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import (
    MetricModeTypes,
    MetricsMode,
    StatisticsCollector,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
    schema_to_pyarrow,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.typedef import Record
from pyiceberg.types import BinaryType, DoubleType, PrimitiveType, StringType

from ingest._compat import geoparquet_metadata
from ingest._faults import fault_point
from ingest._stages import timed
from ingest.repository._sketch import fingerprints
from ingest.stac import HILBERT, RESERVED, arrow_to_items, items_to_arrow, normalize_type, parse_datetime

Fit = Literal["same", "widen", "conflict"]
ROW_GROUP_SIZE = 2_048
"""Rows per Parquet row group of a data file: a search that needs a few rows of a file (a page of an area
search in a file ordered by place, a list of ids) reads and decodes the row groups holding them, about a
fifth of a compacted file, and skips the row groups whose bbox and datetime statistics rule them out.
Measured on 9,400-row compacted files: one 2,048-row group decodes in 2.0 ms against 5.3 ms for the whole
file in one group; a whole read costs 1.8x more, files are 0.2% larger (a footer of 24 KB, not 11 KB)."""
FIXED_COLUMNS = frozenset(
    (
        "type",
        "stac_version",
        "stac_extensions",
        "id",
        "collection",
        "geometry",
        "bbox",
        "datetime",
        "start_datetime",
        "end_datetime",
        "floe:overflow",
    )
)


def fit(file_type: pa.DataType, table_type: pa.DataType) -> Fit:
    """Can a column of ``file_type`` be stored in a table column of ``table_type``?

    ``same``: as it is (struct fields the table lacks are added by the schema
    union); ``widen``: after casting integers to doubles; ``conflict``: no.
    """
    file_type, table_type = normalize_type(file_type), normalize_type(table_type)
    if file_type == table_type:
        return "same"
    if pa.types.is_int64(file_type) and pa.types.is_float64(table_type):
        return "widen"
    if pa.types.is_struct(file_type) and pa.types.is_struct(table_type):
        table_fields = {table_type.field(i).name: table_type.field(i).type for i in range(table_type.num_fields)}
        for i in range(file_type.num_fields):
            inner = file_type.field(i)
            if inner.name in table_fields and fit(inner.type, table_fields[inner.name]) != "same":
                return "conflict"
        return "same"
    if pa.types.is_list(file_type) and pa.types.is_list(table_type):
        return "same" if fit(file_type.value_type, table_type.value_type) == "same" else "conflict"
    return "conflict"


def merge_types(old: pa.DataType | None, new: pa.DataType) -> pa.DataType:
    """The type a table column has after a union with a compatible ``new`` column."""
    new = normalize_type(new)
    if old is None:
        return new
    old = normalize_type(old)
    if pa.types.is_struct(old) and pa.types.is_struct(new):
        fields = {old.field(i).name: old.field(i).type for i in range(old.num_fields)}
        for i in range(new.num_fields):
            inner = new.field(i)
            fields[inner.name] = merge_types(fields.get(inner.name), inner.type)
        return pa.struct([pa.field(name, data_type) for name, data_type in fields.items()])
    if pa.types.is_list(old) and pa.types.is_list(new):
        return pa.list_(merge_types(old.value_type, new.value_type))
    return old


def table_column_types(schema: Schema) -> dict[str, pa.DataType]:
    """Top-level column name -> normalized Arrow type of an Iceberg schema."""
    arrow = schema_to_pyarrow(schema, include_field_ids=False)
    return {arrow_field.name: normalize_type(arrow_field.type) for arrow_field in arrow}


def month_of(item: Mapping[str, Any]) -> int | None:
    """Iceberg's ``month`` transform of the item's datetime: months since 1970-01."""
    text = item["properties"].get("datetime")
    if not isinstance(text, str):
        return None
    when = parse_datetime(text)
    return (when.year - 1970) * 12 + when.month - 1


def month_label(month: int | None) -> str:
    if month is None:
        return "null"
    return f"{1970 + month // 12:04d}-{month % 12 + 1:02d}"


@dataclass
class StagedFile:
    """A data file written by a writer and not yet (or not finally) committed."""

    path: str
    collection: str
    month: int | None
    rows: int
    size: int
    parquet_metadata: pq.FileMetaData
    schema: pa.Schema
    items: list[dict[str, Any]] = field(repr=False)
    untyped: frozenset[str] = frozenset()
    fingerprints: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int32), repr=False)
    """The fingerprint of each row's id, in row order (its manifest's id sketch: ``_sketch.py``)."""
    source_rows: pa.Table | None = field(default=None, repr=False)
    """The rows as written, when they were staged as rows (``Writer.add_rows``), not made from ``items``."""

    def column_types(self) -> dict[str, pa.DataType]:
        return {column.name: column.type for column in self.schema}

    def made_here(self) -> bool:
        """Whether the rows were made from this commit's items or rows (not copied from other files)."""
        return self.source_rows is not None or self.rows == len(self.items)

    def source_items(self) -> list[dict[str, Any]]:
        """The items the rows hold, to write them again (typed differently)."""
        return self.items if self.source_rows is None else list(arrow_to_items(self.source_rows))


def _exact_as_double(column: pa.ChunkedArray) -> bool:
    """Whether every integer of ``column`` is exactly a double (magnitude up to 2**53): widening loses nothing."""
    bounds = pc.min_max(column).as_py()
    return bounds["min"] is None or (bounds["min"] >= -(2**53) and bounds["max"] <= 2**53)


def _plan_columns(
    items: list[dict[str, Any]], column_types: dict[str, pa.DataType], untyped: frozenset[str]
) -> tuple[pa.Table, frozenset[str]]:
    """Convert items so every typed column fits the table; conflicting columns go to the overflow."""
    while True:
        with timed("to Arrow"):
            table = items_to_arrow(items, untyped=untyped)
        conflicts = column_conflicts(table, column_types)
        if not conflicts:
            break
        untyped = untyped | conflicts
    return widened(table, column_types), untyped


def column_conflicts(table: pa.Table, column_types: Mapping[str, pa.DataType]) -> set[str]:
    """The columns of ``table`` the table's columns cannot hold as they are typed."""
    return {
        name
        for name in table.column_names
        if name not in FIXED_COLUMNS
        and name in column_types
        and (
            (match := fit(table.schema.field(name).type, column_types[name])) == "conflict"
            or (match == "widen" and not _exact_as_double(table.column(name)))
        )
    }


def widened(table: pa.Table, column_types: Mapping[str, pa.DataType]) -> pa.Table:
    """``table`` with its integer columns that the table holds as doubles cast to doubles."""
    for index, name in enumerate(table.column_names):
        if name in column_types and fit(table.schema.field(name).type, column_types[name]) == "widen":
            table = table.set_column(index, name, table.column(name).cast(pa.float64()))
    return table


def write_group(
    io: FileIO,
    table_location: str,
    items: list[dict[str, Any]],
    column_types: dict[str, pa.DataType],
    *,
    untyped: frozenset[str] = frozenset(),
) -> StagedFile:
    """Write one partition's items as a GeoParquet file and return it staged.

    ``column_types`` is updated with the columns this file adds, so the next
    group of the same commit is checked against them too.
    """
    collection = items[0]["collection"]
    month = month_of(items[0])
    table, untyped = _plan_columns(items, column_types, untyped)
    for column in table.schema:
        if column.name not in FIXED_COLUMNS:
            column_types[column.name] = merge_types(column_types.get(column.name), column.type)

    path = data_file_path(table_location, collection, month)
    return stage(io, path, table, (collection, month), items=items, untyped=untyped)


def stage(
    io: FileIO,
    path: str,
    table: pa.Table,
    partition: tuple[str, int | None],
    *,
    items: list[dict[str, Any]] | None = None,
    untyped: frozenset[str] = frozenset(),
    rows: pa.Table | None = None,
) -> StagedFile:
    """Write ``table`` at ``path`` as a data file of ``partition`` (collection, month) and return it staged.

    ``items`` are the items the rows were made from, kept to write the file
    again if a concurrent commit types a column differently (None for rows
    copied from other data files, which already fit the table).
    """
    size, parquet_metadata = write_parquet(io, path, table)
    collection, month = partition
    return StagedFile(
        path=path,
        collection=collection,
        month=month,
        rows=table.num_rows,
        size=size,
        parquet_metadata=parquet_metadata,
        schema=table.schema.remove_metadata(),
        items=items or [],
        untyped=untyped,
        fingerprints=fingerprints(table.column("id").to_pylist()),
        source_rows=rows,
    )


@dataclass(frozen=True)
class Run:
    """Files written together by one compaction: sorted along one curve, so their bounds hardly overlap.

    ``level`` counts how many compactions their rows went through at most (a
    batch's own file is level 0). The run is recorded in the file names, the
    only place a data file can carry it without a catalog of its own.
    """

    level: int
    run_id: str


_RUN_NAME = re.compile(r"-r(?P<level>\d{1,3})-(?P<run>[0-9a-f]{32})-[0-9a-f]{32}\.parquet$")


def run_of(path: str) -> Run | None:
    """The compaction run a data file belongs to (None: a batch's own file, or one written before runs)."""
    match = _RUN_NAME.search(path)
    return Run(int(match["level"]), match["run"]) if match else None


def data_file_path(table_location: str, collection: str, month: int | None, run: Run | None = None) -> str:
    """A new, unique path for a data file of the partition (collection, month), of ``run`` if given."""
    tag = f"-r{run.level}-{run.run_id}" if run is not None else ""
    name = f"{datetime.now(UTC):%Y%m%dT%H%M%S}{tag}-{uuid.uuid4().hex}.parquet"
    return f"{table_location}/data/collection={quote(collection, safe='')}/datetime_month={month_label(month)}/{name}"


def write_parquet(
    io: FileIO, path: str, table: pa.Table, *, row_group_size: int | None = None
) -> tuple[int, pq.FileMetaData]:
    """Write ``table`` as a GeoParquet file at ``path`` (never over an existing one); its size and footer.

    The ``geo`` and ``stac-geoparquet`` footer keys are made from the table's
    schema, so every file floe writes (a batch, a copy without replaced rows,
    a compacted partition) is GeoParquet that other readers recognise.
    """
    with timed("write"):
        return _write_parquet(io, path, table, row_group_size)


def _write_parquet(io: FileIO, path: str, table: pa.Table, row_group_size: int | None) -> tuple[int, pq.FileMetaData]:
    schema = table.schema.with_metadata(geoparquet_metadata(table.schema, schema_version="1.1.0"))
    sink = pa.BufferOutputStream()
    dictionary = repeating_columns(table)
    with pq.ParquetWriter(sink, schema, compression="zstd", write_statistics=True, use_dictionary=dictionary) as writer:
        writer.write_table(
            table.replace_schema_metadata(schema.metadata), row_group_size=row_group_size or ROW_GROUP_SIZE
        )
    payload = sink.getvalue()
    with io.new_output(path).create(overwrite=False) as stream:
        stream.write(payload)
    fault_point("write.data_file")
    return payload.size, pq.read_metadata(pa.BufferReader(payload))


DICTIONARY_SAMPLE = 256
"""Values of a string column looked at to decide whether it repeats (:func:`repeating_columns`)."""

DICTIONARY_REPEATS = 8
"""A string column is dictionary-encoded when its sample holds at most one distinct value in this many."""


def repeating_columns(table: pa.Table) -> list[str]:
    """The string columns worth a Parquet dictionary (their paths in the file, nested ones included): those whose
    first :data:`DICTIONARY_SAMPLE` values repeat (collection, platform, an asset's type and roles, ...).

    Others stay plain: a dictionary of ids, hrefs or geometries is hashing for
    nothing and a larger file (on the benchmark's items, every column in a
    dictionary made files 14% larger than this, and their writing 40% slower).
    """
    return [path for field in table.schema for path in _repeating(field.name, table.column(field.name))]


def _repeating(path: str, values: pa.Array | pa.ChunkedArray) -> Iterable[str]:
    kind = values.type
    if pa.types.is_struct(kind):
        array = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
        for index in range(kind.num_fields):
            yield from _repeating(f"{path}.{kind.field(index).name}", array.field(index))
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
        yield from _repeating(f"{path}.list.element", pc.list_flatten(values))
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        sample = values.slice(0, DICTIONARY_SAMPLE)
        if len(sample) and pc.count_distinct(sample).as_py() * DICTIONARY_REPEATS <= len(sample):
            yield path


def file_fits(staged: StagedFile, column_types: Mapping[str, pa.DataType]) -> bool:
    """Whether a staged file can be registered as it is into a table with these columns."""
    for name, data_type in staged.column_types().items():
        if name in FIXED_COLUMNS or name not in column_types:
            continue
        if fit(data_type, column_types[name]) != "same":
            return False
    return True


def union_schema(files: Iterable[StagedFile], table_columns: Mapping[str, pa.DataType]) -> pa.Schema | None:
    """One Arrow schema with every column the files carry, or None if the table has them all already.

    Skipping a union that would change nothing keeps the common case (a batch
    of items like the ones before it) from paying for a schema update.
    """
    merged: dict[str, pa.DataType] = {}
    for staged in files:
        for name, data_type in staged.column_types().items():
            merged[name] = merge_types(merged.get(name), data_type)
    grows = any(
        name not in table_columns or merge_types(table_columns[name], data_type) != normalize_type(table_columns[name])
        for name, data_type in merged.items()
    )
    if not grows:
        return None
    return pa.schema([pa.field(name, data_type) for name, data_type in merged.items()])


def to_data_file(staged: StagedFile, metadata: TableMetadata) -> DataFile:
    """The Iceberg DataFile of a staged file, with statistics keyed to ``metadata``'s schema."""
    schema = metadata.schema()
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=staged.parquet_metadata,
        stats_columns=statistics_plan(schema, metadata.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    )
    serialized = statistics.to_serialized_dict()
    add_nested_bounds(serialized, staged.parquet_metadata, schema)
    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=staged.path,
        file_format=FileFormat.PARQUET,
        partition=Record(staged.collection, staged.month),
        file_size_in_bytes=staged.size,
        # Every file floe writes follows the table's order (Hilbert key, datetime), once the table records one.
        sort_order_id=(metadata.default_sort_order_id or None) if HILBERT in staged.schema.names else None,
        spec_id=metadata.default_spec_id,
        equality_ids=None,
        key_metadata=None,
        **serialized,
    )


PROPERTY_STRING_BOUNDS = MetricsMode(MetricModeTypes.TRUNCATE, 16)
"""Bounds of a string property: its first 16 characters (Iceberg's default for every column)."""


def statistics_plan(schema: Schema, properties: dict[str, str]) -> dict[int, StatisticsCollector]:
    """What each data file records about each column: the table's metrics properties, and typed properties' bounds.

    The table records bounds for id, collection, the datetimes and the bbox
    (its ``write.metadata.metrics.*`` properties; everything else ``none``,
    so asset hrefs and links do not bloat manifests). Each property with a
    column of its own and a primitive type (``eo:cloud_cover``, ``platform``,
    ``gsd`` ...) records bounds too, whatever the properties say, so a filter
    on it rules files out; a column the properties name explicitly keeps
    the mode they give.
    """
    plan = compute_statistics_plan(schema, properties)
    for table_field in schema.fields:
        name = table_field.name
        if name in RESERVED or not isinstance(table_field.field_type, PrimitiveType):
            continue
        if isinstance(table_field.field_type, BinaryType) or f"write.metadata.metrics.column.{name}" in properties:
            continue
        collector = plan.get(table_field.field_id)
        if collector is not None and collector.mode.type == MetricModeTypes.NONE:
            mode = (
                PROPERTY_STRING_BOUNDS
                if isinstance(table_field.field_type, StringType)
                else MetricsMode(MetricModeTypes.FULL)
            )
            plan[table_field.field_id] = StatisticsCollector(
                collector.field_id, collector.iceberg_type, mode, collector.column_name
            )
    return plan


NESTED_BOUNDS = ("bbox.xmin", "bbox.ymin", "bbox.xmax", "bbox.ymax")
"""Nested columns whose bounds every data file records: what pruning by area reads."""


def add_nested_bounds(serialized: dict[str, Any], parquet_metadata: pq.FileMetaData, schema: Schema) -> None:
    """Record the lower and upper bounds of the ``bbox`` fields, from the Parquet footer's statistics.

    pyiceberg records only counts for a field inside a struct, whatever the
    table's metrics properties say (``compute_statistics_plan`` in
    ``pyiceberg/io/pyarrow.py`` turns ``full`` into ``counts`` for nested
    columns), so without this no file has bbox bounds and no search area
    rules a file out. A row group without statistics leaves the field
    unbounded (no bound is recorded), which is always safe.
    """
    positions: dict[str, int] = {}
    row_groups = [parquet_metadata.row_group(index) for index in range(parquet_metadata.num_row_groups)]
    if not row_groups:
        return
    for index in range(row_groups[0].num_columns):
        positions[row_groups[0].column(index).path_in_schema] = index
    for name in NESTED_BOUNDS:
        position = positions.get(name)
        try:
            field = schema.find_field(name)
        except ValueError:
            continue
        if position is None or not isinstance(field.field_type, DoubleType):
            continue
        lows, highs = [], []
        for row_group in row_groups:
            statistics = row_group.column(position).statistics
            if statistics is None or not statistics.has_min_max:
                if row_group.num_rows and (statistics is None or statistics.null_count != row_group.num_rows):
                    break  # rows without statistics: this field stays unbounded
                continue  # only nulls here: nothing to bound
            lows.append(float(statistics.min))
            highs.append(float(statistics.max))
        else:
            if lows and not any(math.isnan(value) for value in (*lows, *highs)):
                serialized["lower_bounds"][field.field_id] = to_bytes(DoubleType(), min(lows))
                serialized["upper_bounds"][field.field_id] = to_bytes(DoubleType(), max(highs))
