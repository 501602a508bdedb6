"""Reading the items table's rows: Iceberg plans, floe reads its own GeoParquet files by name.

:func:`data_fragment` opens a data file by the size its manifest entry records (reading one of at most
:data:`WHOLE_FILE_BYTES` whole on object storage), and :func:`read_batches` and :func:`read_column` read through it
with pre-buffered column ranges. Why: docs/design.md §8 (one GET per metadata object).
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.expressions.parser import parse
from pyiceberg.expressions.visitors import bind, extract_field_ids
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFileIO, expression_to_pyarrow, schema_to_pyarrow
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from ingest.remote import ObjectFileIO

BATCH_ROWS = 8192
READS_AT_ONCE = 16
WHOLE_FILE_BYTES = 1 << 20
"""On object storage, data files up to this size are read whole in one GET (docs/design.md §8): at ~100 MB/s a
mebibyte costs about one more round trip, the least that reading it by parts costs."""
"""Data files read at once where their reads overlap (on object storage each is a round trip or two)."""
_PARQUET = ds.ParquetFileFormat(default_fragment_scan_options=ds.ParquetFragmentScanOptions(pre_buffer=True))


def data_fragment(io: FileIO, location: str, size: int) -> ds.ParquetFileFragment:
    """The data file at ``location``, of ``size`` bytes, ready to read its footer and row groups without a HEAD.

    Args:
        io: the table's FileIO (a PyArrow one: its filesystem reads the file).
        location: the file's absolute location.
        size: its size in bytes (``DataFile.file_size_in_bytes``).

    Returns:
        A fragment whose ``metadata`` (the footer, one ranged GET) and
        ``subset(row_group_ids=...).to_table(columns=...)`` read the file;
        on object storage, a file of at most :data:`WHOLE_FILE_BYTES` is read
        now, in one GET, and the fragment reads its bytes in memory
        (``fragment.buffer`` holds them).
    """
    if not isinstance(io, PyArrowFileIO):
        raise TypeError(f"floe reads data files through PyArrow's FileIO, not {type(io).__name__}")
    if size <= WHOLE_FILE_BYTES and isinstance(io, ObjectFileIO):
        return _PARQUET.make_fragment(pa.py_buffer(io.get(location)))
    scheme, netloc, path = PyArrowFileIO.parse_location(location)
    return _PARQUET.make_fragment(path, filesystem=io.fs_by_scheme(scheme, netloc), file_size=size)


def read_column(io: FileIO, data_file: DataFile, name: str) -> pa.ChunkedArray:
    """Column ``name`` of a whole data file (the footer, then its chunks in coalesced reads)."""
    fragment = data_fragment(io, data_file.file_path, data_file.file_size_in_bytes)
    return fragment.to_table(columns=[name], use_threads=False).column(name)


def read_batches(
    table: Table,
    io: FileIO,
    row_filter: BooleanExpression | str = "true",
    columns: list[str] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Rows of ``table`` matching ``row_filter``, file by file, batch by batch."""
    expression = parse(row_filter) if isinstance(row_filter, str) else row_filter
    schema = table.schema()
    arrow_filter: pc.Expression | None = None
    filter_columns: dict[str, pa.DataType] = {}
    if not isinstance(expression, AlwaysTrue):
        bound = bind(schema, expression, case_sensitive=True)
        arrow_filter = expression_to_pyarrow(bound, schema)
        table_arrow = schema_to_pyarrow(schema, include_field_ids=False)
        for field_id in extract_field_ids(bound):
            top = _top_level(schema, field_id)
            filter_columns[top] = table_arrow.field(top).type
    for task in table.scan(row_filter=expression).plan_files():
        with io.new_input(task.file.file_path).open() as stream:
            parquet = pq.ParquetFile(stream)
            present = set(parquet.schema_arrow.names)
            wanted = None if columns is None else [name for name in columns if name in present]
            read_columns = None if wanted is None else sorted(set(wanted) | (set(filter_columns) & present))
            for raw in parquet.iter_batches(batch_size=BATCH_ROWS, columns=read_columns):
                batch = raw if arrow_filter is None else _filtered(raw, arrow_filter, filter_columns, wanted)
                if batch.num_rows:
                    yield batch


def _filtered(
    batch: pa.RecordBatch, arrow_filter: pc.Expression, filter_columns: dict[str, pa.DataType], wanted: list[str] | None
) -> pa.RecordBatch:
    # Files written before a column existed lack it: it is null there, as Iceberg reads it.
    for name, data_type in filter_columns.items():
        if name not in batch.schema.names:
            batch = batch.append_column(name, pa.nulls(batch.num_rows, data_type))
    batch = batch.filter(arrow_filter)
    return batch if wanted is None else batch.select(wanted)


def _top_level(schema: Schema, field_id: int) -> str:
    """The top-level column a (possibly nested) field of ``schema`` belongs to."""
    name = schema.find_column_name(field_id)
    if name is None:
        raise ValueError(f"field {field_id} is not in the table schema")
    return name.split(".")[0]
