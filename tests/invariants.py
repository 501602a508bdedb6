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
- :func:`assert_rows_have_their_arrays`: no row whose ``floe:arrays`` asset
  names a group missing at that snapshot;
- :func:`assert_groups_exactly`, :func:`assert_arrays_hold`: a collection's
  groups are exactly those committed, and their arrays hold the committed values;
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
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import icechunk
import pyarrow.parquet as pq

from ingest import Repository
from ingest.lifecycle import check
from ingest.repository import View
from ingest.stac import arrow_to_items, read_arrays_asset

SHOWN = 10
"""How many offending items or paths a message names."""


@dataclass(frozen=True)
class Row:
    """What the invariants need of one row of the items table."""

    collection: str
    id: str
    arrays_group: str | None
    """The group its ``floe:arrays`` asset names (None without one)."""


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
    asset = read_arrays_asset(item)
    return Row(item["collection"], item["id"], asset.group if asset is not None else None)


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
def assert_rows_have_their_arrays(view: View, rows: Rows | None = None) -> None:
    """No row at ``view`` whose ``floe:arrays`` asset names a group missing at that snapshot."""
    named = {row.arrays_group for row in (rows or Rows()).at(view) if row.arrays_group is not None}
    missing = [group for group in named if not view.has_group(group)]
    assert not missing, f"{where(view)}: rows name array groups the snapshot lacks: {_some(missing)}"


def assert_groups_exactly(view: View, parent: str, expected: Iterable[str]) -> None:
    """The groups under ``parent`` at ``view`` are exactly ``expected`` (none lost, none a refused writer made)."""
    found = set(view.arrays(parent).group_keys()) if view.has_group(parent) else set()
    wanted = set(expected)
    assert found == wanted, f"{where(view)}: /{parent} lacks {_some(wanted - found)} and has {_some(found - wanted)}"


def assert_arrays_hold(view: View, values: Mapping[str, int], array: str = "band") -> None:
    """Every element of the array ``array`` in each group of ``values`` (group path -> value) holds its value."""
    for group, value in values.items():
        data = view.arrays(group)[array][:]
        assert (data == value).all(), f"{where(view)}: /{group}/{array} holds {data.tolist()}, committed {value}"


def assert_arrays_match_rows(view: View, key: str, array: str = "band") -> None:
    """The array ``array`` of every row's ``floe:arrays`` group holds, everywhere, the row's property ``key``."""
    mismatched = []
    for item in view.items():
        asset = read_arrays_asset(item)
        if asset is None:
            continue
        data = view.arrays(asset.group)[array][:]
        if not (data == item["properties"][key]).all():
            mismatched.append(
                f"{item['id']}: /{asset.group}/{array} holds {data.tolist()}, row says {item['properties'][key]}"
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
