"""What must always hold of a floe repository, written once (modelled on icechunk's ``icechunk.testing.invariants``).

The state machine of interleaved writers, the multi-process concurrency tests
and the lifecycle tests check the repository through these functions, so each
invariant has one definition. Each asserts one thing and its message says what
broke and where:

- :func:`assert_history_holds`: a branch's history is linear and holds every
  commit, in the order each writer made them;
- :func:`assert_items_exactly`: a version holds exactly the items its history
  committed (none lost, none extra, none twice);
- :func:`assert_no_item_twice`: no item (collection, id) twice at a ref;
- :func:`assert_committed_rows_readable`: every committed row is readable at
  every later ref;
- :func:`assert_rows_have_their_arrays`: no row whose ``floe:arrays`` pieces are
  missing at that snapshot: each piece is a slot of an existing stack array
  whose ``item`` coordinate is the row's id;
- :func:`assert_no_slice_without_row`: every occupied slot of every stack is
  named by a row (no arrays without their row);
- :func:`assert_slices_exactly`: the occupied slots of a collection's stacks
  hold exactly the items committed with arrays (none lost, none a refused
  writer left, none twice);
- :func:`assert_item_arrays`: items' arrays read back (``View.item_arrays``)
  equal to the pixels their writers staged;
- :func:`assert_newest_versions`: a replaced item keeps its newest version;
- :func:`assert_properties`: items read back with the properties committed (value and JSON type);
- :func:`assert_arrays_match_rows`: each row's arrays hold the value its row says;
- :func:`assert_check_passes`: ``floe check --all --deep`` finds nothing;
- :func:`assert_tag_unchanged`: a tag never changes (same snapshot, same items).

Rows are read through :class:`Rows`, which plans each version once and reads
each data file once (see there for when to take a fresh one). Without one,
each call reads what it needs anew.
"""

from __future__ import annotations

import itertools
import weakref
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import icechunk
import numpy as np
import pyarrow.parquet as pq

from ingest import Repository
from ingest.errors import FloeError
from ingest.lifecycle import check
from ingest.repository import View
from ingest.stac import ARRAYS_LAYOUT, arrow_to_items, has_arrays_asset, read_arrays_asset

SHOWN = 10
"""How many offending items or paths a message names."""


@dataclass(frozen=True)
class Row:
    """What the invariants need of one row of the items table."""

    collection: str
    id: str
    pieces: tuple[tuple[str, str, int], ...] | None
    """(stack, array, slot) of each piece its ``floe:arrays`` asset names (None without the asset)."""
    unreadable: str | None = None
    """Why its ``floe:arrays`` asset is not one this floe reads (None when it is, or when it has none)."""


class Rows:
    """The rows of the items table at each version: Iceberg plans a version's data files, each file is read once.

    A ``Rows`` plans each table version (metadata.json) once and reads each
    data file once; data files are never rewritten in place (their names are
    unique). After the repository changed, take :meth:`fresh`: it plans every
    version again (so a manifest rewritten or removed since is seen) and still
    reads each data file once. After anything deleted files (gc), make a new
    ``Rows()``, or a deleted data file is still "read" from memory.
    """

    def __init__(self, files: dict[str, tuple[Row, ...]] | None = None) -> None:
        self._files: dict[str, tuple[Row, ...]] = {} if files is None else files
        self._plans: dict[str, tuple[str, ...]] = {}

    def fresh(self) -> Rows:
        """A reader that plans every version again and shares this one's data files."""
        return Rows(self._files)

    def at(self, view: View) -> list[Row]:
        plan = self._plans.get(view.metadata_location)
        if plan is None:
            paths = []
            for task in view.table.scan().plan_files():
                # floe replaces rows copy-on-write; a delete file would hide rows this reader counts.
                assert not task.delete_files, f"{where(view)}: {task.file.file_path} has delete files"
                paths.append(task.file.file_path)
            plan = self._plans[view.metadata_location] = tuple(paths)
        return [row for path in plan for row in self._of_file(view.repository, path)]

    def ids(self, view: View) -> Counter[str]:
        return Counter(row.id for row in self.at(view))

    def _of_file(self, repository: Repository, path: str) -> tuple[Row, ...]:
        if path not in self._files:
            with repository.io.new_input(path).open() as stream:
                items = arrow_to_items(pq.read_table(stream))
            self._files[path] = tuple(_row(item) for item in items)
        return self._files[path]


def _row(item: dict) -> Row:
    collection, item_id = item["collection"], item["id"]
    if not has_arrays_asset(item):
        return Row(collection, item_id, None)
    asset = read_arrays_asset(item)
    if asset is None:
        return Row(collection, item_id, (), "its floe:arrays asset cannot be read")
    if asset.layout != ARRAYS_LAYOUT:
        return Row(collection, item_id, (), f"its floe:arrays asset is in layout {asset.layout}")
    return Row(collection, item_id, tuple((piece.stack, piece.array, piece.slot) for piece in asset.pieces()))


def where(view: View) -> str:
    return f"{view.ref} (snapshot {view.snapshot_id})"


def _some(values: Iterable[object]) -> list[object]:
    return sorted(values, key=str)[:SHOWN]


# -- history -------------------------------------------------------------------------------------------------------
def assert_history_holds(repository: Repository, branch: str, *writers: Sequence[str]) -> list[icechunk.SnapshotInfo]:
    """The history of ``branch`` is one line of snapshots and holds every commit of every writer, in its order.

    Each of ``writers`` lists the snapshot ids one writer's commits returned,
    in the order it made them. No two commits may report the same snapshot.
    Returns the history, newest first.
    """
    history = list(repository.icechunk.ancestry(branch=branch))
    ids = [info.id for info in history]
    assert len(set(ids)) == len(ids), f"a snapshot appears twice in the history of {branch!r}"
    for newer, older in itertools.pairwise(history):
        assert newer.parent_id == older.id, f"{newer.id}'s parent is {newer.parent_id}, not {older.id} below it"
    assert history[-1].parent_id is None, f"the history of {branch!r} does not end at the repository's first snapshot"
    reported = [snapshot_id for commits in writers for snapshot_id in commits]
    twice = [snapshot_id for snapshot_id, count in Counter(reported).items() if count > 1]
    assert not twice, f"two commits reported the same snapshot: {_some(twice)}"
    position = {snapshot_id: index for index, snapshot_id in enumerate(ids)}
    lost = [snapshot_id for snapshot_id in reported if snapshot_id not in position]
    assert not lost, f"{len(lost)} commit(s) that succeeded are not in the history of {branch!r}: {_some(lost)}"
    for number, commits in enumerate(writers):
        # Newest first: a later commit sits nearer the tip.
        order = [position[snapshot_id] for snapshot_id in commits]
        assert order == sorted(order, reverse=True), f"writer {number}'s commits are out of order in {branch!r}"
    return history


# -- items ---------------------------------------------------------------------------------------------------------
def assert_items_exactly(view: View, expected: Mapping[str, int], rows: Rows | None = None) -> None:
    """The table at ``view`` holds exactly the items ``expected`` counts (by id): none lost, none extra, none twice."""
    found = (rows or Rows()).ids(view)
    wanted = Counter(expected)
    assert found == wanted, (
        f"{where(view)} holds other items than its history committed: "
        f"lost {_some((wanted - found).elements())}, unexpected or repeated {_some((found - wanted).elements())}"
    )


def assert_no_item_twice(view: View, rows: Rows | None = None) -> None:
    """No item (collection, id) has two rows at ``view``."""
    counts = Counter((row.collection, row.id) for row in (rows or Rows()).at(view))
    twice = [key for key, count in counts.items() if count > 1]
    assert not twice, f"{where(view)} holds {len(twice)} item(s) more than once: {_some(twice)}"


def assert_committed_rows_readable(
    repository: Repository, committed: Mapping[str, Iterable[str]], ref: str, rows: Rows | None = None
) -> None:
    """Every row a commit in the history of ``ref`` added is readable at ``ref``.

    ``committed`` maps each commit's snapshot id to the ids of the items it
    added (or replaced); commits outside the history of ``ref`` are later than
    it and not looked at.
    """
    view = repository.view(ref)
    history = {info.id for info in repository.icechunk.ancestry(snapshot_id=view.snapshot_id)}
    readable = (rows or Rows()).ids(view)
    for snapshot_id, ids in committed.items():
        if snapshot_id in history:
            missing = [item_id for item_id in ids if item_id not in readable]
            assert not missing, f"rows committed by {snapshot_id} are not readable at {where(view)}: {_some(missing)}"


def assert_newest_versions(view: View, versions: Mapping[str, int]) -> None:
    """Each replaced item has one row at ``view``, with the ``version`` property of its newest committed replacement.

    Read through ``View.items``, the public read path.
    """
    found: dict[str, list[object]] = {}
    for item in view.items() if versions else ():
        if item["id"] in versions:
            found.setdefault(item["id"], []).append(item["properties"].get("version"))
    for item_id, version in versions.items():
        assert found.get(item_id) == [version], (
            f"{where(view)}: item {item_id!r} has the versions {found.get(item_id)}, "
            f"its newest commit gave it {version}"
        )


def changed_properties(view: View, expected: Mapping[str, Mapping[str, object]]) -> tuple[list[str], list[str]]:
    """What of ``expected`` (id -> properties) reads back changed at ``view``: (other values, same number as another
    JSON type, e.g. an integer read back as a float). Read through ``View.items``."""
    changed: list[str] = []
    retyped: list[str] = []
    for item in view.items() if expected else ():
        wanted = expected.get(item["id"])
        for key, value in (wanted or {}).items():
            found = item["properties"].get(key)
            if found != value:
                changed.append(f"{item['id']}.{key}: {found!r} (committed {value!r})")
            elif type(found) is not type(value):
                retyped.append(f"{item['id']}.{key}: {found!r} (committed {value!r})")
    return changed, retyped


def assert_properties(view: View, expected: Mapping[str, Mapping[str, object]], *, same_json_type: bool = True) -> None:
    """Each item of ``expected`` (id -> properties) reads back at ``view`` with those properties.

    With ``same_json_type``, an integer read back as a float (or the reverse) counts as changed.
    """
    changed, retyped = changed_properties(view, expected)
    if same_json_type:
        changed += retyped
    assert not changed, f"{where(view)}: {len(changed)} propert(ies) read back changed: {_some(changed)}"


# -- arrays --------------------------------------------------------------------------------------------------------
class _SlotItems:
    """The ``item`` coordinate of each stack of one view (slot -> item id of its occupied slots), read once.

    A snapshot never changes, so the three array invariants asked of one view share what it read: :meth:`of_view`
    (a stack's coordinate is a chunk per slot, read at about 0.3 ms a chunk; read three times, it was most of
    ``test_concurrency``'s checks).
    """

    _views: ClassVar[weakref.WeakKeyDictionary[View, _SlotItems]] = weakref.WeakKeyDictionary()

    def __init__(self, view: View) -> None:
        self.view = view
        self._read: dict[str, dict[int, str] | None] = {}

    @classmethod
    def of_view(cls, view: View) -> _SlotItems:
        """The slot items of ``view``, shared by every invariant asked of that view object while it lives."""
        known = cls._views.get(view)
        if known is None:
            known = cls._views[view] = cls(view)
        return known

    def of(self, stack: str) -> dict[int, str] | None:
        """Slot -> item id of ``stack``'s occupied slots; None when the stack is not at this snapshot."""
        if stack not in self._read:
            self._read[stack] = self.view.slot_items(stack) if self.view.has_group(stack) else None
        return self._read[stack]

    def stacks(self, collection: str | None = None) -> list[str]:
        """The stacks of ``collection`` (of every collection by default)."""
        if collection is not None:
            return self.view.stacks(collection)
        return [stack for name, _ in self.view.arrays().groups() for stack in self.view.stacks(name)]


def assert_rows_have_their_arrays(view: View, rows: Rows | None = None) -> None:
    """No row at ``view`` without its arrays: each piece its ``floe:arrays`` asset names is a slot of an existing
    stack array, and the stack's ``item`` coordinate names the row's id at that slot."""
    slots = _SlotItems.of_view(view)
    arrays: dict[str, bool] = {}
    wrong: list[str] = []
    for row in (rows or Rows()).at(view):
        if row.unreadable is not None:
            wrong.append(f"{row.id}: {row.unreadable}")
        for stack, array, slot in row.pieces or ():
            path = f"{stack}/{array}"
            if path not in arrays:
                arrays[path] = view.has_array(path)
            if not arrays[path]:
                wrong.append(f"{row.id}: the stack array {path} is missing")
                continue
            holder = (slots.of(stack) or {}).get(slot)
            if holder != row.id:
                wrong.append(f"{row.id}: slot {slot} of {stack} holds {holder!r}")
    assert not wrong, f"{where(view)}: {len(wrong)} row(s) lack their arrays: {_some(wrong)}"


def assert_no_slice_without_row(view: View, rows: Rows | None = None) -> None:
    """Every occupied slot of every stack at ``view`` is named by a row's ``floe:arrays`` asset."""
    named = {(stack, slot) for row in (rows or Rows()).at(view) for stack, _array, slot in row.pieces or ()}
    slots = _SlotItems.of_view(view)
    orphans = [
        f"slot {slot} of {stack} ({holder!r})"
        for stack in slots.stacks()
        for slot, holder in (slots.of(stack) or {}).items()
        if (stack, slot) not in named
    ]
    assert not orphans, f"{where(view)}: {len(orphans)} slice(s) no row names: {_some(orphans)}"


def slice_ids(view: View, collection: str) -> Counter[str]:
    """The item ids the occupied slots of ``collection``'s stacks hold at ``view``, counted."""
    slots = _SlotItems.of_view(view)
    return Counter(holder for stack in slots.stacks(collection) for holder in (slots.of(stack) or {}).values())


def assert_slices_exactly(view: View, collection: str, expected: Mapping[str, int]) -> None:
    """The occupied slots of ``collection``'s stacks at ``view`` hold exactly the items ``expected`` counts (by id,
    once per stack its granule covers): none lost, none a refused writer left, none twice."""
    found = slice_ids(view, collection)
    wanted = Counter(expected)
    assert found == wanted, (
        f"{where(view)}: the stacks of {collection!r} lack slices of {_some((wanted - found).elements())} "
        f"and hold unexpected or repeated slices of {_some((found - wanted).elements())}"
    )


def _as_bands(pixels: np.ndarray) -> np.ndarray:
    pixels = np.asarray(pixels)
    return pixels[np.newaxis] if pixels.ndim == 2 else pixels


def assert_item_arrays(view: View, collection: str, expected: Mapping[str, np.ndarray], key: str = "data") -> None:
    """Each item of ``expected`` (id -> the pixels its writer staged as asset ``key``) reads back at ``view``
    through ``View.item_arrays`` with exactly those pixels (values, shape and dtype)."""
    wrong: list[str] = []
    for item_id, pixels in expected.items():
        wanted = _as_bands(pixels)
        try:
            found = view.item_arrays(collection, item_id, [key])[key].values
        except (FloeError, ValueError, LookupError, OSError) as error:  # a piece or stack array gone
            wrong.append(f"{item_id}: {error}")
            continue
        if found.dtype != wanted.dtype or found.shape != wanted.shape or not np.array_equal(found, wanted):
            wrong.append(f"{item_id}: read {found.dtype}{list(found.shape)}, staged {wanted.dtype}{list(wanted.shape)}")
    assert not wrong, f"{where(view)}: {len(wrong)} item(s) read back other pixels than staged: {_some(wrong)}"


def assert_arrays_match_rows(view: View, key: str, asset: str = "data") -> None:
    """Every pixel of asset ``asset`` of every row with arrays (read through ``View.item_arrays``) is the row's
    property ``key``."""
    mismatched = []
    for item in view.items():
        if read_arrays_asset(item) is None:
            continue
        data = view.item_arrays(item["collection"], item["id"], [asset])[asset].values
        if not (data == item["properties"][key]).all():
            mismatched.append(
                f"{item['id']}: its {asset} holds {np.unique(data).tolist()[:5]}, row says {item['properties'][key]}"
            )
    assert not mismatched, f"{where(view)}: {len(mismatched)} row(s) disagree with their arrays: {_some(mismatched)}"


# -- refs ----------------------------------------------------------------------------------------------------------
def assert_tag_unchanged(
    repository: Repository, name: str, snapshot_id: str, expected: Mapping[str, int], rows: Rows | None = None
) -> None:
    """Tag ``name`` still names ``snapshot_id`` and holds exactly the items (by id) it held when it was taken."""
    now = repository.resolve(f"tag:{name}")
    assert now == snapshot_id, f"tag {name!r} moved from {snapshot_id} to {now}"
    assert_items_exactly(repository.view(f"tag:{name}"), expected, rows)


def assert_check_passes(repository: Repository) -> None:
    """``floe check --all --deep`` (the library call) finds no problem at any branch or tag."""
    problems = check(repository, all_refs=True, deep=True)
    assert not problems, f"floe check --all --deep found {len(problems)} problem(s): {_some(problems)}"
