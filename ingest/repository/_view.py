"""The repository at one snapshot: its items table and its arrays, from the same commit."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import icechunk
import pyarrow as pa
import xarray as xr
import zarr
import zarr.errors
from pyiceberg.expressions import BooleanExpression
from pyiceberg.table import Table

from ingest.errors import ItemNotFound
from ingest.repository._arrays import item_arrays, open_stack, slot_items, stack_paths
from ingest.repository._groups import group_exists
from ingest.repository._read import read_batches
from ingest.repository._series import open_items
from ingest.stac import arrow_to_items

if TYPE_CHECKING:
    from ingest.repository._repo import Repository


class View:
    """The repository at one snapshot: the items table and the arrays, from the same commit."""

    def __init__(self, repository: Repository, ref: str, snapshot_id: str) -> None:
        self.repository = repository
        self.ref = ref
        self.snapshot_id = snapshot_id
        self.metadata_location = repository.metadata_location_of(snapshot_id)
        self._table: Table | None = None
        self._session: icechunk.Session | None = None

    @property
    def table(self) -> Table:
        """The Iceberg items table at this snapshot (scan it with row filters)."""
        if self._table is None:
            self._table = self.repository.catalog.load_at(self.metadata_location)
        return self._table

    @property
    def session(self) -> icechunk.Session:
        """A read-only Icechunk session at this snapshot."""
        if self._session is None:
            self._session = self.repository.known.session(self.snapshot_id)
        return self._session

    def arrays(self, path: str = "") -> zarr.Group:
        """The Zarr group at ``path`` in this snapshot (the root by default), read-only.

        Args:
            path: the group's path (default: the root).

        Returns:
            The group, opened read-only.
        """
        return zarr.open_group(self.session.store, path=path, mode="r")

    def has_group(self, path: str) -> bool:
        """Whether a group exists at ``path`` in this snapshot.

        Args:
            path: the group's path (leading and trailing ``/`` are ignored).

        Returns:
            True if a group (not an array) is there.
        """
        return group_exists(self.session, path.strip("/"))

    def batches(
        self, row_filter: BooleanExpression | str = "true", columns: list[str] | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Stream the rows matching ``row_filter`` as Arrow batches, one data file at a time.

        Iceberg plans the scan (partition and column-bound pruning); floe then
        reads its own files by column name and applies the filter exactly. Each
        batch keeps its file's own schema (columns added later are absent, not
        null-filled). pyiceberg's reader is not used for the rows because it turns
        null lists of structs into empty lists, which would change items.

        Args:
            row_filter: an Iceberg expression, or its text (default: every row).
            columns: the columns to read (default: all); a file that lacks one leaves it out.

        Yields:
            The matching rows of one data file at a time, as Arrow record batches (none empty).
        """
        yield from read_batches(self.table, self.repository.io, row_filter, columns)

    def items(self, row_filter: BooleanExpression | str = "true") -> Iterator[dict[str, Any]]:
        """Stream the STAC items at this snapshot, exactly as they were ingested.

        Args:
            row_filter: an Iceberg expression, or its text (default: every item).

        Yields:
            Each matching item as a STAC item dict.
        """
        for batch in self.batches(row_filter):
            yield from arrow_to_items(pa.Table.from_batches([batch]))

    def item(self, collection: str, item_id: str) -> dict[str, Any]:
        """The STAC item ``item_id`` of ``collection`` at this snapshot, as stored. Raises ItemNotFound.

        Args:
            collection: the item's collection.
            item_id: the item's id.

        Returns:
            The item as a STAC item dict.

        Raises:
            ItemNotFound: no item ``item_id`` is in ``collection`` at this snapshot.
        """
        from pyiceberg.expressions import And, EqualTo

        for found in self.items(And(EqualTo("collection", collection), EqualTo("id", item_id))):
            return found
        raise ItemNotFound(f"no item {item_id!r} in collection {collection!r} at {self.ref}")

    def item_arrays(self, collection: str, item_id: str, assets: Sequence[str] | None = None) -> xr.Dataset:
        """The arrays of one item: a georeferenced ``(band, y, x)`` variable per asset (see ``_arrays.py``).

        Args:
            collection: the item's collection.
            item_id: the item's id.
            assets: the asset keys to read (default: all assets with arrays); they must share one grid.

        Returns:
            A Dataset with one variable per asset, ``x`` and ``y`` pixel centres, and a ``spatial_ref`` with the
            CRS and the GeoTransform.

        Raises:
            ItemNotFound: no such item at this snapshot, or it has no arrays.
            UnsupportedLayout: an earlier floe wrote the item's arrays.
            ValueError: an asset key the item has no arrays for, or assets on different grids or with different
                band counts.
        """
        return item_arrays(self, collection, item_id, assets)

    def stacks(self, collection: str) -> list[str]:
        """The stacks (arrays shared by the granules of one grid or tile) of ``collection``.

        Args:
            collection: the collection id.

        Returns:
            The stacks' paths in the repository, sorted (empty if the collection has none).
        """
        return stack_paths(self, collection)

    def has_array(self, path: str) -> bool:
        """Whether an array exists at ``path`` in this snapshot.

        Args:
            path: the array's path (leading and trailing ``/`` are ignored).

        Returns:
            True if an array (not a group) is there.
        """
        try:
            zarr.open_array(self.session.store, path=path.strip("/"), mode="r")
        except (FileNotFoundError, zarr.errors.NodeNotFoundError, zarr.errors.ContainsGroupError):
            return False
        return True

    def slot_items(self, stack: str) -> dict[int, str]:
        """The occupied slots of a stack and the item id each holds.

        Args:
            stack: the stack's path.

        Returns:
            Slot -> the id of the item whose slice it holds.
        """
        return slot_items(self, stack)

    def open_items(self, items: Iterable[dict[str, Any]], assets: Iterable[str] | None = None) -> xr.DataTree:
        """Many items' arrays, lazily: one Dataset per grid stacked along ``time`` (see ``_series.py``).

        Args:
            items: STAC items, as stored or as a search serves them.
            assets: the asset keys to open (default: every asset with arrays).

        Returns:
            A tree with one child Dataset per grid and array signature; its ``floe:without_arrays`` attribute
            counts the items left out for having no arrays.

        Raises:
            UnsupportedLayout: an earlier floe wrote an item's arrays.
        """
        return open_items(self, items, assets)

    def stack(self, stack: str) -> xr.Dataset:
        """A stack as a lazy time series: its granules' slices ordered by datetime, with ``item`` ids.

        Args:
            stack: the stack's path.

        Returns:
            A Dataset over ``time`` of the stack's occupied slots, oldest first; the pixel variables are lazy.
        """
        return open_stack(self, stack)

    def count(self) -> int:
        """The number of items at this snapshot (from the table's metadata; no row is read).

        Returns:
            The number of rows in the items table's data files at this snapshot.
        """
        return sum(task.file.record_count for task in self.table.scan().plan_files())
