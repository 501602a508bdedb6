"""Read Iceberg's Avro files (manifest lists, manifests) as plain records, fast.

pyiceberg's ``AvroFile`` converts the file's schema and builds a reader for
every file it opens, which costs several milliseconds; a history of thousands
of versions holds thousands of manifests that all share one or two schemas. So
the schema conversion and the reader are cached by the schema text in the file
header, and the records are decoded with pyiceberg's own Avro decoder.
"""

from __future__ import annotations

import functools
import json

from pyiceberg.avro.decoder import new_decoder
from pyiceberg.avro.file import META_SCHEMA, SYNC_SIZE, AvroFileHeader
from pyiceberg.avro.reader import Reader
from pyiceberg.avro.resolver import construct_reader, resolve_reader
from pyiceberg.schema import Schema
from pyiceberg.typedef import Record
from pyiceberg.types import NestedField, StructType
from pyiceberg.utils.schema_conversion import AvroSchemaConversion

AVRO_SCHEMA_KEY = "avro.schema"
_HEADER_READER = construct_reader(META_SCHEMA, {-1: AvroFileHeader})


@functools.lru_cache(maxsize=64)
def _schema_and_reader(avro_schema: str) -> tuple[Schema, Reader]:
    schema = AvroSchemaConversion().avro_to_iceberg(json.loads(avro_schema))
    return schema, resolve_reader(schema, schema)


def read_avro(data: bytes) -> tuple[Schema, dict[str, str], list[Record]]:
    """The file's schema (Iceberg field ids included), its header metadata and its records."""
    decoder = new_decoder(data)
    header: AvroFileHeader = _HEADER_READER.read(decoder)
    if AVRO_SCHEMA_KEY not in header.meta:
        raise ValueError("no schema in the Avro file header")
    schema, reader = _schema_and_reader(header.meta[AVRO_SCHEMA_KEY])
    codec = header.compression_codec()
    records: list[Record] = []
    while True:
        try:
            count = decoder.read_int()
        except EOFError:
            break
        block = decoder.read_bytes()
        if codec is not None:
            block = codec.decompress(block)
        block_decoder = new_decoder(block)
        records.extend(reader.read(block_decoder) for _ in range(count))
        if decoder.read(SYNC_SIZE) != header.sync:
            raise ValueError("the Avro file is corrupt: a block does not end with the file's sync marker")
    return schema, dict(header.meta), records


def struct_fields(field: NestedField) -> tuple[NestedField, ...]:
    """The fields of a struct-typed field (``data_file`` of a manifest entry)."""
    if not isinstance(field.field_type, StructType):
        raise ValueError(f"the Avro field {field.name!r} is not a record")
    return field.field_type.fields


def field_position(fields: tuple[NestedField, ...], name: str) -> int:
    """The position of the field called ``name`` among ``fields``."""
    for position, field in enumerate(fields):
        if field.name == name:
            return position
    raise ValueError(f"the Avro schema has no field {name!r}")
