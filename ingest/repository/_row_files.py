"""Items staged as floe's rows (``Writer.add_rows``) written as data files: cut into partitions on columns, typed by
the table as items are (:func:`~ingest.repository._files.write_group`), a column the table types otherwise written
as their items would be."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io import FileIO

from ingest._stages import timed
from ingest.repository._files import (
    FIXED_COLUMNS,
    StagedFile,
    column_conflicts,
    data_file_path,
    merge_types,
    stage,
    widened,
    write_group,
)
from ingest.stac import arrow_to_items, clustered

_NO_MONTH = -(2**62)
"""The partition key of a row without a datetime (a range's), while rows are sorted by partition."""


def partitioned(tables: Iterable[pa.Table]) -> list[tuple[tuple[str, int | None], pa.Table]]:
    """The rows of ``tables`` (floe's rows, ``Writer.add_rows``) by partition, (collection, month), in order.

    Tables are written together where their columns agree: a column one lacks is null in its rows there (a null
    cell is an absent member; an explicit null is in the row's overflow). Tables that type a column differently
    are written apart."""
    groups: list[list[pa.Table]] = []
    schemas: list[pa.Schema] = []
    for table in tables:
        if not table.num_rows:
            continue
        for index, schema in enumerate(schemas):
            try:
                schemas[index] = pa.unify_schemas([schema, table.schema], promote_options="default")
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                continue
            groups[index].append(table)
            break
        else:
            schemas.append(table.schema)
            groups.append([table])
    together = [table for group in groups for table in _concatenated(group)]
    parts: list[tuple[tuple[str, int | None], pa.Table]] = []
    for table in together:
        when = table.column("datetime")
        months = pc.add(pc.multiply(pc.subtract(pc.year(when), 1970), 12), pc.subtract(pc.month(when), 1))
        # Sorted once by partition, then cut where it changes (no month, a range's: a key below every month's).
        keyed = pa.table({"collection": table.column("collection"), "month": pc.fill_null(months, _NO_MONTH)})
        order = pc.sort_indices(keyed, [("collection", "ascending"), ("month", "ascending")])
        rows, keyed = table.take(order), keyed.take(order)
        collections = keyed.column("collection").to_numpy(zero_copy_only=False)
        month_values = keyed.column("month").to_numpy()
        changes = (collections[1:] != collections[:-1]) | (month_values[1:] != month_values[:-1])
        bounds = [0, *(np.flatnonzero(changes) + 1).tolist(), rows.num_rows]
        for start, stop in itertools.pairwise(bounds):
            month = int(month_values[start])
            parts.append(
                ((str(collections[start]), None if month == _NO_MONTH else month), rows.slice(start, stop - start))
            )
    return sorted(parts, key=lambda part: (part[0][0], part[0][1] or 0))


def _concatenated(tables: list[pa.Table]) -> list[pa.Table]:
    """``tables`` as one table (their schemas unify), or as they are if Arrow cannot concatenate them after all."""
    try:
        return [pa.concat_tables(tables, promote_options="default")]
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return tables


def write_rows(
    io: FileIO,
    table_location: str,
    rows: pa.Table,
    partition: tuple[str, int | None],
    column_types: dict[str, pa.DataType],
) -> StagedFile:
    """Write one partition's rows (``Writer.add_rows``) as a GeoParquet file and return it staged, as
    :func:`write_group` does their items; where a column conflicts with the table's type, the rows are written as
    their items are (the column in the overflow)."""
    if column_conflicts(rows, column_types):
        return write_group(io, table_location, list(arrow_to_items(rows)), column_types)
    with timed("to Arrow"):
        table = clustered(widened(rows, column_types))
    for column in table.schema:
        if column.name not in FIXED_COLUMNS:
            column_types[column.name] = merge_types(column_types.get(column.name), column.type)
    collection, month = partition
    return stage(io, data_file_path(table_location, collection, month), table, partition, rows=table)
