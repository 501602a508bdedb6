"""A writer's change to the items table, replayable on whichever table version its commit lands on.

:class:`ItemsPlan` is a value: the commit loop prepares it once (the data files), applies it to each attempt's
base (requirements and updates, in pyiceberg's split, written as the next metadata.json by
:class:`~ingest.repository.PointerCatalog`) and, after a rebase that moved slices, commits the plan
:meth:`ItemsPlan.rebased` returns. How a plan reconciles with a winner's version: docs/design.md, "§4 The
hybrid commit" (reconciling; the plan is a value).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
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
from ingest.repository._row_files import partitioned, write_rows
from ingest.repository._slots import Moves
from ingest.stac import Piece, arrow_to_items, moved_slots, read_arrays_asset

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.io import FileIO
    from pyiceberg.table import Table

    from ingest.repository._catalog import PointerCatalog

log = logging.getLogger(__name__)

Key = tuple[str, str]


@dataclass
class PlanWork:
    """What a commit's plans wrote so far: each attempt re-uses it, and a plan's rebased successors share it."""

    replacement: ReplacementPlan
    files: list[StagedFile] | None = None
    """The batch's data files (None until the first attempt writes them)."""
    files_base: str | None = None
    """The metadata.json the files were last reconciled with."""
    cleared_from: set[str] = field(default_factory=set)
    """Replaced files whose rows' slices were handed to the commit loop to clear already."""
    deleted_slices: dict[str, int] = field(default_factory=dict)
    added_manifest: AddedManifest | None = None
    files_written: int = 0
    files_rewritten: int = 0


@dataclass(frozen=True)
class ItemsPlan(TableChange):
    """Items to add to the table (and the keys among them whose stored rows they replace), as one table change.

    A value: the commit loop applies it to each attempt's base, and after a
    rebase that moved slices it gets a new plan from :meth:`rebased`. Make one
    with :meth:`of`.
    """

    io: FileIO
    catalog: PointerCatalog
    manifests: ManifestCache
    items: tuple[dict[str, Any], ...]
    message: str
    work: PlanWork
    row_tables: tuple[pa.Table, ...] = ()
    """Items staged as floe's rows (``Writer.add_rows``): written as they are, without arrays."""
    delete: frozenset[Key] = frozenset()
    expected: Mapping[Key, dict[str, Any] | None] = field(default_factory=dict)
    """Key -> the version of the item the change is made for (None: the item must not exist)."""
    known_rows: Mapping[Key, dict[str, Any]] = field(default_factory=dict)
    """Rows read at the writer's base (``Writer.stored_items``): they need not be read again."""
    staged: frozenset[tuple[str, int]] = frozenset()
    """(stack, slot) of every slice the writer staged."""
    moved: frozenset[Key] = frozenset()
    """Items whose slices moved to other slots since the plan was made (their rows change)."""

    @classmethod
    def of(
        cls,
        io: FileIO,
        catalog: PointerCatalog,
        manifests: ManifestCache,
        items: Iterable[dict[str, Any]],
        *,
        message: str,
        replace: Iterable[Key] = (),
        delete: Iterable[Key] = (),
        expected: Mapping[Key, dict[str, Any] | None] | None = None,
        located: Located | None = None,
        known_rows: Mapping[Key, dict[str, Any]] | None = None,
        staged: Iterable[tuple[str, int]] = (),
        row_tables: Iterable[pa.Table] = (),
    ) -> ItemsPlan:
        """The plan of a batch.

        Args:
            io: the FileIO data files and metadata are written with.
            catalog: the pointer catalog that writes the next metadata.json.
            manifests: the repository's manifest cache.
            items: the items to add.
            message: the commit message (recorded in the snapshot's summary).
            replace: keys among ``items`` whose stored rows they replace.
            delete: keys whose stored rows leave (with their slices).
            expected: key -> the version of the item the change is made for (None: it must not exist).
            located: where the writer found keys at its base (``Writer.stored_items``).
            known_rows: the rows it read there.
            staged: (stack, slot) of every slice the writer staged.
            row_tables: items staged as floe's rows (their keys among ``replace`` where they replace).

        Returns:
            The plan; nothing is written until the commit loop prepares it.

        Raises:
            ValueError: an expectation guards a key that is neither replaced nor deleted.
        """
        deleting = frozenset(delete)
        expectations = dict(expected or {})
        replacement = ReplacementPlan(set(replace) | deleting, primed=located)
        unguarded = set(expectations) - replacement.keys
        if unguarded:
            raise ValueError(f"an expectation guards no change of {sorted(unguarded)[:3]}: replace or delete them")
        return cls(
            io,
            catalog,
            manifests,
            tuple(items),
            message,
            PlanWork(replacement),
            tuple(row_tables),
            delete=deleting,
            expected=expectations,
            known_rows=dict(known_rows or {}),
            staged=frozenset(staged),
        )

    @property
    def rows(self) -> int:
        return len(self.items) + sum(table.num_rows for table in self.row_tables)

    @property
    def files_written(self) -> int:
        """Data files written so far (the batch's files, their rewrites, and the copies replacement made)."""
        return self.work.files_written

    @property
    def files_rewritten(self) -> int:
        """Data files written again because a concurrent commit typed one of their columns differently."""
        return self.work.files_rewritten

    def rebased(self, moves: Sequence[Moves]) -> ItemsPlan:
        """The plan after a rebase moved this writer's slices: the items that own them name their new slots.

        Only the data files that hold those items are written again, at the
        next attempt (the others are re-used as they are).
        """
        items = list(self.items)
        moved = set(self.moved)
        staged = set(self.staged)
        for step in moves:
            for index, item in enumerate(items):
                arrays = read_arrays_asset(item)
                if arrays is not None and any((piece.stack, piece.slot) in step for piece in arrays.pieces()):
                    items[index] = moved_slots(item, step)
                    moved.add((item["collection"], item["id"]))
            staged = {(stack, step.get((stack, slot), slot)) for stack, slot in staged}
        return replace(self, items=tuple(items), moved=frozenset(moved), staged=frozenset(staged))

    def prepare(self, base: Base) -> None:
        """Write the data files, typed by the table at the writer's base."""
        self._files_for(base.table())

    def apply(self, base: Base) -> AppliedChange:
        """Bring the plan to ``base`` and write the next metadata.json (requirements checked, updates applied)."""
        table = base.table()
        files = self._files_for(table)
        replacement = self.work.replacement
        clear: list[Piece] = []
        clear_deleted: list[Piece] = []
        if replacement.keys:
            self.work.files_written += replacement.plan(self.manifests, table)
            self._check_expected()
            self._refuse_vanished_arrays()
            clear, clear_deleted = self._replaced_slices()
        location = self._write_metadata(table, files)
        deleted = self.rows_deleted
        return AppliedChange(
            location,
            self.rows,
            replacement.rows_removed - deleted,
            deleted,
            clear=tuple(clear),
            clear_deleted=tuple(clear_deleted),
        )

    @property
    def rows_deleted(self) -> int:
        """Rows the deletions remove (as of the version last planned)."""
        return sum(len(hits & self.delete) for _, hits in self.work.replacement.found_files.values())

    @property
    def slices_deleted(self) -> int:
        """Slices (pieces of arrays) of the deleted rows, cleared with them (as of the version last planned)."""
        return sum(self.work.deleted_slices.get(path, 0) for path in self.work.replacement.found_files)

    @property
    def not_found(self) -> frozenset[Key]:
        """Keys to delete that no live row holds (as of the version last planned)."""
        found = {key for _, hits in self.work.replacement.found_files.values() for key in hits}
        return self.delete - found

    def _refuse_vanished_arrays(self) -> None:
        """A row this change replaces was deleted by a commit made meanwhile; if our row keeps that row's
        slices (a metadata change, no rasters of its own), they are gone with it: re-plan it."""
        vanished = self.work.replacement.vanished - self.delete
        if not vanished:
            return
        for item in self.items:
            key = (item["collection"], item["id"])
            arrays = read_arrays_asset(item) if key in vanished else None
            if arrays is not None and not all((piece.stack, piece.slot) in self.staged for piece in arrays.pieces()):
                raise CommitConflict(
                    f"item {key[1]!r} ({key[0]}) was deleted by a commit made meanwhile, and this change keeps "
                    "the arrays of the version that commit deleted; re-plan it from the new tip",
                    paths=[f"{key[0]}/{key[1]}"],
                )

    def _replaced_slices(self) -> tuple[list[Piece], list[Piece]]:
        """The slices of the rows this change replaces, and of those it deletes: they leave with them (in the
        same commit).

        On the first base these are the rows the writer planned against (the
        pipeline clears them itself already: clearing again does nothing); on a
        later one, rows a concurrent writer added for the same items: the
        outcome is the two commits in order, the winner's item then ours, so
        the winner's slices go with its row and no slice is left without one.
        Each file's rows are handed over once (the session keeps them cleared).
        """
        # A row replaced with the same slices (its metadata changed, not its rasters) keeps them.
        kept = {
            (piece.stack, piece.array, piece.slot)
            for item in self.items
            if (arrays := read_arrays_asset(item)) is not None
            for piece in arrays.pieces()
        }
        replacement = self.work.replacement
        pieces: list[Piece] = []
        deleted: list[Piece] = []
        for path, (data_file, hits) in replacement.found_files.items():
            if path in self.work.cleared_from:
                continue
            self.work.cleared_from.add(path)
            planned = path in replacement.primed_paths and path not in replacement.found_later
            rows = [self.known_rows[key] for key in hits if key in self.known_rows] if planned else []
            if len(rows) < len(hits):
                rows = list(arrow_to_items(read_rows(self.io, data_file, hits)))
            if not planned:
                # Rows this writer did not plan against (a concurrent writer's, or never looked up).
                self._refuse_kept_arrays(rows)
            for row in rows:
                arrays = read_arrays_asset(row)
                if arrays is not None:
                    gone = deleted if (row["collection"], row["id"]) in self.delete else pieces
                    before = len(deleted)
                    gone.extend(
                        piece for piece in arrays.pieces() if (piece.stack, piece.array, piece.slot) not in kept
                    )
                    self.work.deleted_slices[path] = self.work.deleted_slices.get(path, 0) + len(deleted) - before
        return pieces, deleted

    def _check_expected(self) -> None:
        """Changes made on a condition (``Writer.expect``) hold only for the version of the item they expect:
        the row read at the writer's base, or none. Another one (a concurrent commit's) refuses the commit."""
        if not self.expected:
            return
        replacement = self.work.replacement
        found: dict[Key, list[dict[str, Any]]] = {}
        for path, (data_file, hits) in replacement.found_files.items():
            wanted = hits & self.expected.keys()
            if not wanted:
                continue
            planned = path in replacement.primed_paths and path not in replacement.found_later
            if planned and wanted <= self.known_rows.keys():
                rows = [self.known_rows[key] for key in wanted]  # read at the base already (files never change)
            else:
                rows = list(arrow_to_items(read_rows(self.io, data_file, wanted)))
            for row in rows:
                found.setdefault((row["collection"], row["id"]), []).append(row)
        for key, version in self.expected.items():
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
        ours = {(item["collection"], item["id"]): item for item in self.items}
        for row in rows:
            key = (row["collection"], row["id"])
            mine = read_arrays_asset(ours[key]) if key in ours else None
            if mine is None or all((piece.stack, piece.slot) in self.staged for piece in mine.pieces()):
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
        work = self.work
        if work.files is None:
            work.files = self._write_files(table)
            work.files_written += len(work.files)
        elif work.files_base != table.metadata_location:
            work.files, rewritten = self._reconcile_files(work.files, table)
            work.files_written += rewritten
            work.files_rewritten += rewritten
        if self.moved:
            work.files = self._rewrite_moved(work.files, table)
        work.files_base = table.metadata_location
        for staged in work.files:  # the next batch's re-run check need not read back what was just written
            if staged.made_here():  # rows made from this plan's items (not copied from other files)
                self.manifests.keys.learn(staged.path, staged.fingerprints)
        return work.files

    def _rewrite_moved(self, files: list[StagedFile], table: Table) -> list[StagedFile]:
        """Write again the files holding items whose slices moved since they were written (their new
        ``floe:arrays`` assets); a file already written with this plan's items is kept."""
        current = {key: item for item in self.items if (key := (item["collection"], item["id"])) in self.moved}
        column_types = table_column_types(table.schema())
        out = []
        for staged in files:
            items = [current.get((item["collection"], item["id"]), item) for item in staged.items]
            if all(new is old for new, old in zip(items, staged.items, strict=True)):
                out.append(staged)
                continue
            out.append(write_group(self.io, table.location(), items, column_types, untyped=staged.untyped))
            self.work.files_written += 1
        return out

    def _write_files(self, table: Table) -> list[StagedFile]:
        groups: dict[tuple[str, int | None], list[dict[str, Any]]] = defaultdict(list)
        for item in self.items:
            groups[(item["collection"], month_of(item))].append(item)
        column_types = table_column_types(table.schema())
        with writes_together(self.io):  # on object storage the batch's files are sent together, not in turn
            written = [
                write_group(self.io, table.location(), items, column_types)
                for _, items in sorted(groups.items(), key=lambda pair: (pair[0][0], pair[0][1] or 0))
            ]
            written += [
                write_rows(self.io, table.location(), rows, partition, column_types)
                for partition, rows in partitioned(self.row_tables)
            ]
        return written

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
                write_group(self.io, table.location(), staged.source_items(), column_types, untyped=staged.untyped)
            )
            rewritten += 1
        return reconciled, rewritten

    def _write_metadata(self, table: Table, files: list[StagedFile]) -> str:
        """The updates (schema union, new snapshot) and requirements (same table, same head) -> next metadata.json."""
        replacement = self.work.replacement
        if not files and not replacement.rewrites:
            return table.metadata_location
        updates: tuple[TableUpdate, ...] = ()
        metadata = table.metadata
        schema = union_schema(files, table_column_types(table.schema()))
        if schema is not None:
            updates, metadata = schema_union_updates(table, schema)
        properties = {"floe.rows-added": str(self.rows), "floe.message": self.message[:200]}
        deleted = self.rows_deleted
        if replacement.rows_removed - deleted:
            properties["floe.rows-replaced"] = str(replacement.rows_removed - deleted)
        if deleted:
            properties["floe.rows-deleted"] = str(deleted)
        staged_files = [*files, *replacement.rewritten_files]
        # The manifests, their sketches and the manifest list name each other, but nothing names them until the
        # metadata.json written after them: on object storage they are sent together, one round trip for all.
        with writes_together(self.io):
            append_updates, head, self.work.added_manifest = plan_commit(
                metadata,
                [to_data_file(staged, metadata) for staged in staged_files],
                self.manifests,
                properties,
                previous=self.work.added_manifest,
                removed=replacement.removed_paths,
                fingerprints={staged.path: staged.fingerprints for staged in staged_files},
            )
        requirements = (AssertTableUUID(uuid=table.metadata.table_uuid), head)
        return self.catalog.commit_table(table, requirements, updates + append_updates).metadata_location
