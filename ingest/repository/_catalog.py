"""An Iceberg catalog whose one table lives at a pointer kept by Icechunk.

floe never registers its table in a catalog service. The location of the
current ``metadata.json`` travels in the metadata of each Icechunk commit, so
"committing" an Iceberg change here only means writing the new metadata file;
the compare-and-swap that makes it current is the Icechunk commit that carries
its location (see :mod:`ingest.repository._commit`).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, NoReturn

from pyiceberg.catalog import MetastoreCatalog
from pyiceberg.io import FileIO
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import CommitTableResponse, Table
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER, NullOrder, SortDirection, SortOrder
from pyiceberg.table.update import TableRequirement, TableUpdate
from pyiceberg.transforms import Transform

from ingest._compat import staged_update, write_table_metadata
from ingest._resources import resource

TABLE_IDENTIFIER = ("floe", "items")
METADATA_KEPT = 64
"""Table versions (parsed metadata.json files) a catalog keeps in memory."""
DEFAULT_NAME_MAPPING = "schema.name-mapping.default"
SCHEMA_FILE = resource("schemas/items.json")


def load_table_definition(path: Path = SCHEMA_FILE) -> tuple[Schema, PartitionSpec, dict[str, str]]:
    """The items table's schema, partition spec and properties, kept as data in ``schemas/``."""
    definition = json.loads(path.read_text())
    schema = Schema.model_validate(definition["schema"])
    spec = PartitionSpec.model_validate(definition["partition-spec"])
    return schema, spec, dict(definition["properties"])


def load_sort_order(path: Path = SCHEMA_FILE) -> SortOrder:
    """The order of the rows in every data file floe writes: (``floe:hilbert``, ``datetime``), nulls last."""
    definition = json.loads(path.read_text())
    return SortOrder.model_validate(definition["sort-order"]) if "sort-order" in definition else UNSORTED_SORT_ORDER


def sort_order_columns(path: Path = SCHEMA_FILE) -> list[tuple[str, Transform[Any, Any], NullOrder]]:
    """The sort order's fields by column name (all ascending), to record it on a table made without it."""
    schema, _, _ = load_table_definition(path)
    order = load_sort_order(path)
    if any(field.direction != SortDirection.ASC for field in order.fields):
        raise ValueError(f"{path}: floe's sort order is ascending on every field")
    return [
        (schema.find_column_name(field.source_id) or "", field.transform, field.null_order) for field in order.fields
    ]


def trim_history(metadata: TableMetadata, keep: int) -> TableMetadata:
    """Keep only the newest ``keep`` snapshots of the current lineage (and what refs point at).

    Icechunk holds the history of table versions, so each metadata.json only
    needs a short snapshot log; without this, every file carries every
    snapshot and commits slow down as history grows.
    """
    by_id = {snapshot.snapshot_id: snapshot for snapshot in metadata.snapshots}
    kept: set[int] = {ref.snapshot_id for ref in metadata.refs.values()}
    snapshot_id = metadata.current_snapshot_id
    while snapshot_id is not None and snapshot_id in by_id and len(kept) < keep:
        kept.add(snapshot_id)
        snapshot_id = by_id[snapshot_id].parent_snapshot_id
    # Old schemas go too (a heterogeneous archive adds one per schema union); kept snapshots keep theirs.
    schema_ids = {metadata.current_schema_id} | {by_id[s].schema_id for s in kept if s in by_id}
    if len(kept) >= len(by_id) and len(schema_ids) >= len(metadata.schemas):
        return metadata
    return metadata.model_copy(
        update={
            "snapshots": [s for s in metadata.snapshots if s.snapshot_id in kept],
            "snapshot_log": [e for e in metadata.snapshot_log if e.snapshot_id in kept],
            "schemas": [schema for schema in metadata.schemas if schema.schema_id in schema_ids],
        }
    )


class PointerCatalog(MetastoreCatalog):
    """Loads the items table at a metadata location and writes its next versions.

    ``commit_table`` validates the transaction's requirements against the version
    the table was loaded at, writes the next metadata.json and returns it. It
    never moves anything: the caller publishes the new location by committing
    it to Icechunk.
    """

    def __init__(self, io: FileIO, *, snapshot_log: int = 4) -> None:
        super().__init__("floe", **io.properties)
        self._io = io
        self._snapshot_log = snapshot_log
        # A metadata.json is written once under a new name and never changed: each is read once per process.
        self._metadata: OrderedDict[str, TableMetadata] = OrderedDict()
        self._metadata_lock = threading.Lock()

    @property
    def io(self) -> FileIO:
        return self._io

    def _load_file_io(self, properties: dict[str, str] | None = None, location: str | None = None) -> FileIO:
        return self._io

    def load_at(self, metadata_location: str) -> Table:
        """The table as recorded in ``metadata_location`` (read once: metadata files never change)."""
        with self._metadata_lock:
            metadata = self._metadata.get(metadata_location)
            if metadata is not None:
                self._metadata.move_to_end(metadata_location)
        if metadata is None:
            metadata = FromInputFile.table_metadata(self._io.new_input(metadata_location))
            with self._metadata_lock:
                self._metadata[metadata_location] = metadata
                while len(self._metadata) > METADATA_KEPT:
                    self._metadata.popitem(last=False)
        return Table(TABLE_IDENTIFIER, metadata, metadata_location, self._io, self)

    def forget_metadata(self) -> None:
        """Drop the metadata files read so far: ``floe relocate`` rewrites them in place (nothing else does)."""
        with self._metadata_lock:
            self._metadata.clear()

    def create_initial(self, location: str, definition_path: Path | None = None) -> Table:
        """Write version 0 of a new, empty items table under ``location`` (as ``schemas/items.json`` defines it)."""
        definition_path = definition_path or SCHEMA_FILE
        schema, spec, properties = load_table_definition(definition_path)
        metadata = new_table_metadata(
            schema=schema,
            partition_spec=spec,
            sort_order=load_sort_order(definition_path),
            location=location,
            properties=properties,
        )
        # Data files carry no Iceberg field ids; readers resolve columns by this
        # mapping, which pyiceberg keeps current on every schema update.
        mapping = metadata.schema().name_mapping.model_dump_json()
        metadata = metadata.model_copy(update={"properties": {**metadata.properties, DEFAULT_NAME_MAPPING: mapping}})
        metadata_location = load_location_provider(location, metadata.properties).new_table_metadata_file_location(0)
        write_table_metadata(self, metadata, self._io, metadata_location)
        return Table(TABLE_IDENTIFIER, metadata, metadata_location, self._io, self)

    def commit_table(
        self, table: Table, requirements: tuple[TableRequirement, ...], updates: tuple[TableUpdate, ...]
    ) -> CommitTableResponse:
        staged = staged_update(self, table, requirements, updates)
        metadata = trim_history(staged.metadata, self._snapshot_log)
        write_table_metadata(self, metadata, self._io, staged.metadata_location)
        return CommitTableResponse(metadata=metadata, metadata_location=staged.metadata_location)

    # Everything below is catalog-service behaviour floe deliberately does not have.
    def _unsupported(self, *_: Any, **__: Any) -> NoReturn:
        raise NotImplementedError("floe keeps its table pointer in Icechunk; there is no catalog service")

    create_table = _unsupported
    load_table = _unsupported
    register_table = _unsupported
    drop_table = _unsupported
    rename_table = _unsupported
    create_namespace = _unsupported
    drop_namespace = _unsupported
    list_tables = _unsupported
    list_namespaces = _unsupported
    list_views = _unsupported
    load_view = _unsupported
    register_view = _unsupported
    drop_view = _unsupported
    view_exists = _unsupported
    load_namespace_properties = _unsupported
    update_namespace_properties = _unsupported
