"""Rewrite Iceberg metadata files for another root (what Iceberg's ``rewrite_table_path`` does).

metadata.json files, manifest lists and manifests hold absolute locations; a
copy under another root needs them rewritten. Avro files are decoded and
re-encoded with pyiceberg's own Avro reader and writer, keeping the file's own
schema (field ids included) and header metadata; only the locations (and, in
manifest lists, the lengths of the rewritten manifests) change.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

from pyiceberg.avro.file import AvroOutputFile
from pyiceberg.io import InputFile, InputStream, OutputFile, OutputStream
from pyiceberg.schema import Schema
from pyiceberg.typedef import Record

from ingest.lifecycle._avro import AVRO_SCHEMA_KEY, field_position, read_avro, struct_fields


class _BytesInput(InputFile):
    def __init__(self, location: str, data: bytes) -> None:
        super().__init__(location)
        self._data = data

    def __len__(self) -> int:
        return len(self._data)

    def exists(self) -> bool:
        return True

    def open(self, seekable: bool = True) -> InputStream:
        return io.BytesIO(self._data)


class _KeptBytes(io.BytesIO):
    """A BytesIO whose contents survive ``close``."""

    value: bytes = b""

    def close(self) -> None:
        if not self.closed:
            self.value = self.getvalue()
        super().close()


class _BytesOutput(OutputFile):
    def __init__(self, location: str) -> None:
        super().__init__(location)
        self.stream = _KeptBytes()

    def __len__(self) -> int:
        return len(self.stream.value)

    def exists(self) -> bool:
        return False

    def to_input_file(self) -> InputFile:
        return _BytesInput(self.location, self.stream.value)

    def create(self, overwrite: bool = False) -> OutputStream:
        return self.stream


def _rewrite_avro(location: str, data: bytes, change: Callable[[Schema, Record], None], name: str) -> bytes:
    schema, header, records = read_avro(data)
    metadata = {key: value for key, value in header.items() if key != AVRO_SCHEMA_KEY}
    for record in records:
        change(schema, record)
    output = _BytesOutput(location)
    with AvroOutputFile[Record](output, schema, name, metadata=metadata) as writer:
        if records:
            writer.write_block(records)
    return output.stream.value


def rebase_location(location: str, source_prefix: str, target_prefix: str) -> str:
    """``location`` under ``target_prefix`` instead of ``source_prefix`` (unchanged if not under it)."""
    if location == source_prefix:
        return target_prefix
    if location.startswith(source_prefix + "/"):
        return target_prefix + location[len(source_prefix) :]
    return location


def rewrite_metadata_json(data: bytes, source_prefix: str, target_prefix: str) -> bytes:
    """Every location string in a metadata.json moved from one root's tables to another's."""

    def walk(value: Any) -> Any:
        if isinstance(value, str):
            return rebase_location(value, source_prefix, target_prefix)
        if isinstance(value, list):
            return [walk(element) for element in value]
        if isinstance(value, dict):
            return {key: walk(element) for key, element in value.items()}
        return value

    return json.dumps(walk(json.loads(data)), separators=(",", ":")).encode()


def current_only_metadata_json(data: bytes) -> bytes:
    """A metadata.json that keeps only its current snapshot (what a replica without history holds).

    The snapshot list, snapshot log and refs keep the current snapshot only,
    the metadata log and statistics of other snapshots go; the current
    snapshot's parent id stays, dangling, as after Iceberg's snapshot expiry.
    """
    document = json.loads(data)
    current = document.get("current-snapshot-id")
    if current is None or current == -1:
        document["snapshots"], document["snapshot-log"], document["refs"] = [], [], {}
    else:
        document["snapshots"] = [s for s in document.get("snapshots", []) if s.get("snapshot-id") == current]
        document["snapshot-log"] = [s for s in document.get("snapshot-log", []) if s.get("snapshot-id") == current]
        document["refs"] = {n: r for n, r in document.get("refs", {}).items() if r.get("snapshot-id") == current}
    document["metadata-log"] = []
    for key in ("statistics", "partition-statistics"):
        if key in document:
            document[key] = [s for s in document[key] if s.get("snapshot-id") == current]
    return json.dumps(document, separators=(",", ":")).encode()


def rewrite_manifest(location: str, data: bytes, source_prefix: str, target_prefix: str) -> bytes:
    """A manifest whose entries name the data files under the target root."""

    def change(schema: Schema, entry: Record) -> None:
        data_file_position = field_position(schema.fields, "data_file")
        data_file = entry[data_file_position]
        path_position = field_position(struct_fields(schema.fields[data_file_position]), "file_path")
        data_file[path_position] = rebase_location(data_file[path_position], source_prefix, target_prefix)

    return _rewrite_avro(location, data, change, "manifest_entry")


def rewrite_manifest_list(
    location: str, data: bytes, source_prefix: str, target_prefix: str, lengths: dict[str, int]
) -> bytes:
    """A manifest list naming the target's manifests, with their lengths (``lengths``: target location -> bytes)."""

    def change(schema: Schema, manifest: Record) -> None:
        path_position = field_position(schema.fields, "manifest_path")
        length_position = field_position(schema.fields, "manifest_length")
        target = rebase_location(manifest[path_position], source_prefix, target_prefix)
        manifest[path_position] = target
        manifest[length_position] = lengths[target]

    return _rewrite_avro(location, data, change, "manifest_file")
