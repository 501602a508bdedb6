"""A writer's change to the items table, replayable on whichever table version its commit lands on.

The plan holds what a writer stages for the table: its items (grouped into
one GeoParquet data file per collection and month), and which of them replace
the rows of the same items (copy-on-write). Following pyiceberg's split, the
plan turns into *requirements* (what must still hold of the base: the table's
identity and its head snapshot) and *updates* (a schema union, a new snapshot),
which :class:`~ingest.repository.PointerCatalog` checks and writes as the next
metadata.json. :func:`~ingest.repository._commit.commit_change` calls
:meth:`ItemsPlan.prepare` once and :meth:`ItemsPlan.apply` once per attempt,
on the attempt's base:

- ``prepare`` writes the data files (once; every attempt re-registers them)
  against the writer's base's schema;
- on a later base (another writer won), files whose columns the winner typed
  differently are rewritten with those columns untyped (nothing else is), the
  replacement is re-planned against the winner's files, and the manifest of
  the added files is reused when nothing it records changed.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pyiceberg.table.update import AssertTableUUID, TableUpdate

from ingest.errors import CommitConflict
from ingest.remote import writes_together
from ingest.repository._append import AddedManifest, ManifestCache, plan_commit, schema_union_updates
from ingest.repository._commit import AppliedChange, Base, TableChange
from ingest.repository._files import (
    StagedFile,
    file_fits,
    merge_types,
    month_of,
    table_column_types,
    to_data_file,
    union_schema,
    write_group,
)
from ingest.repository._replace import Located, ReplacementPlan, read_rows
from ingest.stac import Piece, arrow_to_items, read_arrays_asset

if TYPE_CHECKING:
    from pyiceberg.io import FileIO
    from pyiceberg.table import Table

    from ingest.repository._catalog import PointerCatalog

log = logging.getLogger(__name__)

Key = tuple[str, str]


class ItemsPlan(TableChange):
    """Items to add to the table (and the keys among them whose stored rows they replace), as one table change."""

    def __init__(
        self,
        io: FileIO,
        catalog: PointerCatalog,
        manifests: ManifestCache,
        items: list[dict[str, Any]],
        *,
        replace: set[Key],
        delete: set[Key] | None = None,
        expected: dict[Key, dict[str, Any] | None] | None = None,
        message: str,
        located: Located | None = None,
        known_rows: dict[Key, dict[str, Any]] | None = None,
        clear_pieces: Callable[[list[Piece], bool], object] | None = None,
        staged_slots: Callable[[], set[tuple[str, int]]] | None = None,
    ) -> None:
        self._io = io
        self._catalog = catalog
        self._manifests = manifests
        self._items = items
        self._message = message
        self._delete = set(delete or ())
        self._expected = dict(expected or {})
        self._replacement = ReplacementPlan(set(replace) | self._delete, primed=located)
        unguarded = set(self._expected) - self._replacement.keys
        if unguarded:
            raise ValueError(f"an expectation guards no change of {sorted(unguarded)[:3]}: replace or delete them")
        self._files: list[StagedFile] | None = None
        self._files_base: str | None = None
        self._moved: dict[Key, dict[str, Any]] = {}
        self._known_rows = known_rows or {}
        self._clear_pieces = clear_pieces
        self._staged_slots = staged_slots or set
        self._cleared_from: set[str] = set()
        self._deleted_slices: dict[str, int] = {}
        self._added_manifest: AddedManifest | None = None
        self.files_written = 0
        """Data files written so far (the batch's files, their rewrites, and the copies replacement made)."""
        self.files_rewritten = 0
        """Data files written again because a concurrent commit typed one of their columns differently."""

    @property
    def rows(self) -> int:
        return len(self._items)

    def moved(self, items: dict[Key, dict[str, Any]]) -> None:
        """These items' slices moved to other slots (the writer lost a race): their rows change.

        Only the data files that hold them are written again, at the next
        attempt (the others are re-used as they are).
        """
        self._moved.update(items)
        self._items = [items.get((item["collection"], item["id"]), item) for item in self._items]

    def prepare(self, base: Base) -> None:
        """Write the data files, typed by the table at the writer's base."""
        self._files_for(base.table())

    def apply(self, base: Base) -> AppliedChange:
        """Bring the plan to ``base`` and write the next metadata.json (requirements checked, updates applied)."""
        table = base.table()
        files = self._files_for(table)
        if self._replacement.keys:
            self.files_written += self._replacement.plan(self._manifests, table)
            self._check_expected()
            self._refuse_vanished_arrays()
            self._clear_replaced_slices()
        location = self._write_metadata(table, files)
        deleted = self.rows_deleted
        return AppliedChange(location, self.rows, self._replacement.rows_removed - deleted, deleted)

    @property
    def rows_deleted(self) -> int:
        """Rows the deletions remove (as of the version last planned)."""
        return sum(len(hits & self._delete) for _, hits in self._replacement.found_files.values())

    @property
    def slices_deleted(self) -> int:
        """Slices (pieces of arrays) of the deleted rows, cleared with them (as of the version last planned)."""
        return sum(self._deleted_slices.get(path, 0) for path in self._replacement.found_files)

    @property
    def not_found(self) -> set[Key]:
        """Keys to delete that no live row holds (as of the version last planned)."""
        found = {key for _, hits in self._replacement.found_files.values() for key in hits}
        return self._delete - found

    def _refuse_vanished_arrays(self) -> None:
        """A row this change replaces was deleted by a commit made meanwhile; if our row keeps that row's
        slices (a metadata change, no rasters of its own), they are gone with it: re-plan it."""
        vanished = self._replacement.vanished - self._delete
        if not vanished:
            return
        staged = self._staged_slots()
        for item in self._items:
            key = (item["collection"], item["id"])
            arrays = read_arrays_asset(item) if key in vanished else None
            if arrays is not None and not all((piece.stack, piece.slot) in staged for piece in arrays.pieces()):
                raise CommitConflict(
                    f"item {key[1]!r} ({key[0]}) was deleted by a commit made meanwhile, and this change keeps "
                    "the arrays of the version that commit deleted; re-plan it from the new tip",
                    paths=[f"{key[0]}/{key[1]}"],
                )

    def _clear_replaced_slices(self) -> None:
        """The slices of the rows this change replaces or deletes leave with them (in the same commit).

        On the first base these are the rows the writer planned against (the
        pipeline clears them itself already: clearing again does nothing); on a
        later one, rows a concurrent writer added for the same items: the
        outcome is the two commits in order, the winner's item then ours, so
        the winner's slices go with its row and no slice is left without one.
        """
        # A row replaced with the same slices (its metadata changed, not its rasters) keeps them.
        kept = {
            (piece.stack, piece.array, piece.slot)
            for item in self._items
            if (arrays := read_arrays_asset(item)) is not None
            for piece in arrays.pieces()
        }
        pieces: list[Piece] = []
        deleted: list[Piece] = []
        for path, (data_file, hits) in self._replacement.found_files.items():
            if path in self._cleared_from:
                continue
            self._cleared_from.add(path)
            planned = path in self._replacement.primed_paths and path not in self._replacement.found_later
            rows = [self._known_rows[key] for key in hits if key in self._known_rows] if planned else []
            if len(rows) < len(hits):
                rows = list(arrow_to_items(read_rows(self._io, data_file, hits)))
            if not planned:
                # Rows this writer did not plan against (a concurrent writer's, or never looked up).
                self._refuse_kept_arrays(rows)
            for row in rows:
                arrays = read_arrays_asset(row)
                if arrays is not None:
                    gone = deleted if (row["collection"], row["id"]) in self._delete else pieces
                    before = len(deleted)
                    gone.extend(
                        piece for piece in arrays.pieces() if (piece.stack, piece.array, piece.slot) not in kept
                    )
                    self._deleted_slices[path] = self._deleted_slices.get(path, 0) + len(deleted) - before
        if self._clear_pieces is not None:
            if pieces:
                self._clear_pieces(pieces, False)
            if deleted:
                # A concurrent commit that cleared (or re-staged) the same slices is no conflict for a deletion.
                self._clear_pieces(deleted, True)

    def _check_expected(self) -> None:
        """Changes made on a condition (``Writer.expect``) hold only for the version of the item they expect:
        the row read at the writer's base, or none. Another one (a concurrent commit's) refuses the commit."""
        if not self._expected:
            return
        found: dict[Key, list[dict[str, Any]]] = {}
        for path, (data_file, hits) in self._replacement.found_files.items():
            wanted = hits & self._expected.keys()
            if not wanted:
                continue
            planned = path in self._replacement.primed_paths and path not in self._replacement.found_later
            if planned and wanted <= self._known_rows.keys():
                rows = [self._known_rows[key] for key in wanted]  # read at the base already (files never change)
            else:
                rows = list(arrow_to_items(read_rows(self._io, data_file, wanted)))
            for row in rows:
                found.setdefault((row["collection"], row["id"]), []).append(row)
        for key, version in self._expected.items():
            rows = found.get(key, [])
            if rows != ([] if version is None else [version]):
                state = "created" if version is None else ("deleted" if not rows else "changed")
                raise CommitConflict(
                    f"item {key[1]!r} ({key[0]}) was {state} by a commit made meanwhile, and this change was "
                    "made for the version it replaced: re-plan it from the new tip",
                    paths=[f"{key[0]}/{key[1]}"],
                )

    def _refuse_kept_arrays(self, rows: list[dict[str, Any]]) -> None:
        """Rows this writer did not plan against are being replaced: a row of ours that keeps arrays it did not
        write, and names other slices than the row it replaces, depends on a version whose slices may be gone
        (a concurrent writer re-staged the item), so it is planned again."""
        staged = self._staged_slots()
        ours = {(item["collection"], item["id"]): item for item in self._items}
        for row in rows:
            key = (row["collection"], row["id"])
            mine = read_arrays_asset(ours[key]) if key in ours else None
            if mine is None or all((piece.stack, piece.slot) in staged for piece in mine.pieces()):
                continue
            theirs = read_arrays_asset(row)
            named = {(piece.stack, piece.array, piece.slot) for piece in (theirs.pieces() if theirs else [])}
            if named != {(piece.stack, piece.array, piece.slot) for piece in mine.pieces()}:
                raise CommitConflict(
                    f"item {key[1]!r} ({key[0]}) was changed by a commit made meanwhile, and this change keeps "
                    "the arrays of the version that commit replaced; re-plan it from the new tip",
                    paths=[f"{key[0]}/{key[1]}"],
                )

    def _files_for(self, table: Table) -> list[StagedFile]:
        """The data files, written on the first base and reconciled with each later one."""
        if self._files is None:
            self._files = self._write_files(table)
            self.files_written += len(self._files)
        elif self._files_base != table.metadata_location:
            self._files, rewritten = self._reconcile_files(self._files, table)
            self.files_written += rewritten
            self.files_rewritten += rewritten
        if self._moved:
            self._files = self._rewrite_moved(self._files, table)
        self._files_base = table.metadata_location
        for staged in self._files:  # the next batch's re-run check need not read back what was just written
            if staged.rows == len(staged.items):  # rows made from these items (not copied from other files)
                self._manifests.keys.learn(staged.path, staged.fingerprints)
        return self._files

    def _rewrite_moved(self, files: list[StagedFile], table: Table) -> list[StagedFile]:
        """Write again the files holding items whose slices moved, with their new ``floe:arrays`` assets."""
        moved, self._moved = self._moved, {}
        column_types = table_column_types(table.schema())
        out = []
        for staged in files:
            if not any((item["collection"], item["id"]) in moved for item in staged.items):
                out.append(staged)
                continue
            items = [moved.get((item["collection"], item["id"]), item) for item in staged.items]
            out.append(write_group(self._io, table.location(), items, column_types, untyped=staged.untyped))
            self.files_written += 1
        return out

    def _write_files(self, table: Table) -> list[StagedFile]:
        groups: dict[tuple[str, int | None], list[dict[str, Any]]] = defaultdict(list)
        for item in self._items:
            groups[(item["collection"], month_of(item))].append(item)
        column_types = table_column_types(table.schema())
        with writes_together(self._io):  # on object storage the batch's files are sent together, not in turn
            return [
                write_group(self._io, table.location(), items, column_types)
                for _, items in sorted(groups.items(), key=lambda pair: (pair[0][0], pair[0][1] or 0))
            ]

    def _reconcile_files(self, files: list[StagedFile], table: Table) -> tuple[list[StagedFile], int]:
        """Keep files that fit the base's schema; rewrite (with the conflicting columns untyped) those that do not."""
        column_types = table_column_types(table.schema())
        reconciled, rewritten = [], 0
        for staged in files:
            if file_fits(staged, column_types):
                reconciled.append(staged)
                for column in staged.schema:
                    column_types[column.name] = merge_types(column_types.get(column.name), column.type)
                continue
            log.info("re-planning %s: a concurrent commit typed one of its columns differently", staged.path)
            reconciled.append(
                write_group(self._io, table.location(), staged.items, column_types, untyped=staged.untyped)
            )
            rewritten += 1
        return reconciled, rewritten

    def _write_metadata(self, table: Table, files: list[StagedFile]) -> str:
        """The updates (schema union, new snapshot) and requirements (same table, same head) -> next metadata.json."""
        replacement = self._replacement
        if not files and not replacement.rewrites:
            return table.metadata_location
        updates: tuple[TableUpdate, ...] = ()
        metadata = table.metadata
        schema = union_schema(files, table_column_types(table.schema()))
        if schema is not None:
            updates, metadata = schema_union_updates(table, schema)
        properties = {"floe.rows-added": str(self.rows), "floe.message": self._message[:200]}
        deleted = self.rows_deleted
        if replacement.rows_removed - deleted:
            properties["floe.rows-replaced"] = str(replacement.rows_removed - deleted)
        if deleted:
            properties["floe.rows-deleted"] = str(deleted)
        staged_files = [*files, *replacement.rewritten_files]
        # The manifests, their sketches and the manifest list name each other, but nothing names them until the
        # metadata.json written after them: on object storage they are sent together, one round trip for all.
        with writes_together(self._io):
            append_updates, head, self._added_manifest = plan_commit(
                metadata,
                [to_data_file(staged, metadata) for staged in staged_files],
                self._manifests,
                properties,
                previous=self._added_manifest,
                removed=replacement.removed_paths,
                fingerprints={staged.path: staged.fingerprints for staged in staged_files},
            )
        requirements = (AssertTableUUID(uuid=table.metadata.table_uuid), head)
        return self._catalog.commit_table(table, requirements, updates + append_updates).metadata_location
