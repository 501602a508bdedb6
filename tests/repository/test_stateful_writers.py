"""A state machine of interleaved writers on branches, with tags and gc (after icechunk's stateful parallel sessions).

Writers open at arbitrary moments on any branch, stage items, replacements,
rasters (8x8 granules in one of two stacks) and new rasters for items that
have some, and commit in any order. Branches are created from a branch's tip or
from a tag; tags are taken of any branch's tip; ``floe gc`` runs with no grace
period, sometimes expiring every snapshot no branch or tag points at. Rules
apply only where their preconditions hold (a writer to stage in, a writer with
something staged to commit, an item with arrays it may still re-stage), and draw only from
what applies, so no step is skipped silently; a new branch gets a writer at
once, so commits on branches are common; ``note`` records what each step did,
for the report of a failing run.

The model keeps what each branch must hold (:class:`Contents`: items, the
newest version of each replaced item, the pixel value of each item's arrays,
the commits in its history), and what each tag and each snapshot still in the
history held when it was made. The invariants of :mod:`tests.invariants` check
it: every branch's tip and history (and that main's history never
holds a commit made on another branch), every tag and the latest snapshots,
after every change of the repository (they cannot change otherwise); after a
gc, every snapshot the model says is still reachable, and ``floe check --all
--deep``.

What floe does, and the model expects:

- writers appending granules to one stack take the same slots; the loser's
  slots move past the winner's and its rows follow: it commits;
- a writer that re-stages an item's arrays (new slices, the stored ones
  cleared) is refused (``CommitConflict``, naming the item's stack) when
  another writer re-staged that item's arrays *on its branch* after it opened,
  or deleted the item; no other commit is;
- a writer that deletes items (rows and slices) deletes whatever version its
  branch holds when its commit lands (a concurrent replacement or re-stage
  included), and reports the items already gone as not found;
- gc with no grace period deletes only what no version needs: a writer open
  across it commits as if gc had not run (its staged arrays are inline in its
  session here: 16-pixel tiles and chunks keep each chunk under Icechunk's
  inline limit; chunk objects younger than the grace are another matter: a
  grace of 0 is for a repository without writers, see ``ingest/lifecycle/_gc.py``);
- expiring snapshots leaves each branch's history as its tip alone (Icechunk
  keeps tips and tagged snapshots); a writer whose base is not its branch's
  tip any more has no base in that history: one whose base gc deleted is
  refused with a ``CommitConflict`` that says so, nothing committed; one
  whose base a tag keeps commits rows alone, and is refused the same way
  when it has slots to move; a writer opened at the tip commits as usual.

The writers live in this process, so their interleaving is exactly the one
drawn: a failing run replays.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import hypothesis.strategies as st
import icechunk
import numpy as np
import pytest
from hypothesis import HealthCheck, event, note, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ingest import CommitConflict, Repository, Settings, Writer
from ingest.config import ArraysSettings
from ingest.lifecycle import gc
from ingest.repository import CommitResult, View
from ingest.repository._slots import next_free_slot
from tests import invariants
from tests.conftest import make_item, stage_raster
from tests.repository._writers import replace_raster, staged_slots

ORIGINS = ((500000.0, 4200000.0), (500000.0 + 16 * 10 * 4, 4200000.0))
"""Where granules go: two 16-pixel tiles, four apart, so two stacks (``seed-0`` and ``seed-1`` make them first)."""
ARRAYS = ArraysSettings(tile=16, chunk=16)
"""Tiles and chunks of 16 pixels: an 8x8 granule is one small chunk, inline in the session that stages it."""
MAX_OPEN = 4
MAX_BRANCHES = 3
"""``main`` and up to two more."""
SNAPSHOTS_CHECKED = 3
MAX_GCS = 2
"""gc runs per example at most (each reads every version of the repository afterwards)."""


@dataclass
class Contents:
    """What a branch holds (or a tag, or a snapshot, held when it was made)."""

    tip: str
    """The snapshot id of the branch's tip."""
    ids: Counter[str] = field(default_factory=Counter)
    arrays: dict[str, int] = field(default_factory=dict)
    """Item with arrays -> the value of every pixel of its newest ones."""
    versions: dict[str, int] = field(default_factory=dict)
    """Replaced item -> the version its newest replacement carries."""
    commits: list[str] = field(default_factory=list)
    """The model's commits in the branch's history, oldest first (inherited ones included)."""

    def copy(self) -> Contents:
        return Contents(self.tip, Counter(self.ids), dict(self.arrays), dict(self.versions), list(self.commits))


@dataclass
class OpenWriter:
    """A writer and what it staged (the model of its pending commit)."""

    name: str
    branch: str
    writer: Writer
    base_arrays: dict[str, int]
    """The items with arrays its branch held when it opened (id -> pixel value): it may re-stage those."""
    base_ids: set[str] = field(default_factory=set)
    """The items its branch held when it opened: it may delete those."""
    ids: list[str] = field(default_factory=list)
    """Fresh items it appends (with arrays or without)."""
    replaced: dict[str, int] = field(default_factory=dict)
    """Item id -> the version its replacement carries (rows only: items without arrays)."""
    arrays: dict[str, int] = field(default_factory=dict)
    """Item whose raster it stages (fresh, or re-staged) -> the value of every pixel."""
    restaged: dict[str, str] = field(default_factory=dict)
    """Item whose stored arrays it replaces -> the stack they were in at its base."""
    slots: dict[str, dict[str, int]] = field(default_factory=dict)
    """Item -> stack -> the slot its raster was staged at."""
    deleted: set[str] = field(default_factory=set)
    """Items it deletes (whatever version its branch holds when its commit lands)."""
    base_expired: bool = False
    """gc expired the snapshot it opened at from its branch's history (its commit has nothing to rebase from)."""
    base_gone: bool = False
    """... and deleted it (no tag or tip kept it): nothing can be read at it any more."""
    across_gc: bool = False
    """It was open while gc ran."""

    @property
    def base(self) -> str:
        return self.writer.session.snapshot_id

    def has_staged(self) -> bool:
        return bool(self.ids or self.replaced or self.arrays or self.deleted)

    def deletable(self) -> list[str]:
        """Items its base held that it has neither staged nor deleted yet."""
        staged = {*self.ids, *self.replaced, *self.arrays, *self.deleted}
        return sorted(item_id for item_id in self.base_ids if item_id not in staged)

    def can_stage_arrays(self) -> bool:
        """Whether it may stage a raster: its base snapshot still exists.

        Staging reads the stack's nodes (and a re-staged item's row) at the base
        snapshot; after ``gc --grace 0s --expire-older-than 0s`` expired that
        snapshot it is gone, and the read fails (``--grace`` exists for writers in
        flight). Such a writer may still stage rows; its commit is refused by name.
        """
        return not self.base_gone

    def can_restage(self) -> bool:
        return self.can_stage_arrays() and bool(self.restageable())

    def restageable(self) -> list[str]:
        """Items with arrays at its base that it has not staged yet."""
        return sorted(
            item_id for item_id in self.base_arrays if item_id not in self.arrays and item_id not in self.deleted
        )


class InterleavedWriters(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.TemporaryDirectory(prefix="floe-stateful-")
        self.repo = Repository.create(Path(self.directory.name) / "repo", Settings(arrays=ARRAYS))
        # The stacks exist before the model starts: staging never makes them in a commit of its own meanwhile.
        seed = self.repo.writer()
        for number, origin in enumerate(ORIGINS):
            seed.add_item(stage_raster(seed, make_item(f"seed-{number}", "c"), self.pixels(number), origin=origin))
        seeded = seed.commit("seed the stacks").snapshot_id
        self.rows = invariants.Rows()
        """Plans each version once between two changes of the repository (a commit, a refusal, a tag, a gc)."""
        self.changes = 0
        self.checked_at = -1
        self.writers: dict[str, OpenWriter] = {}
        self.opened = 0
        self.counter = 0
        # The model.
        first = Contents(seeded, Counter({"seed-0": 1, "seed-1": 1}), {"seed-0": 0, "seed-1": 1})
        self.branches: dict[str, Contents] = {"main": first}
        self.snapshots: dict[str, Contents] = {seeded: first.copy()}
        """Every snapshot still in some history that the model knows, and what it holds."""
        self.made_on: dict[str, str] = {}
        """Commit -> the branch it was made on."""
        self.added: dict[str, list[str]] = {}
        self.with_arrays: set[str] = {"seed-0", "seed-1"}
        """Items created with arrays (their rows are only ever replaced with new arrays)."""
        self.tags: dict[str, Contents] = {}
        self.gc_at = -1
        self.gcs = 0

    def teardown(self) -> None:
        self.directory.cleanup()

    @staticmethod
    def pixels(value: int) -> np.ndarray:
        return np.full((8, 8), value, dtype="int32")

    def draw_writer(
        self, data: st.DataObject, applies: Callable[[OpenWriter], object] = OpenWriter.has_staged
    ) -> OpenWriter:
        names = sorted(name for name, state in self.writers.items() if applies(state))
        return self.writers[data.draw(st.sampled_from(names), label="writer")]

    def changed(self) -> None:
        """The repository changed: plan every version again, and check the tags and older snapshots again."""
        self.rows = self.rows.fresh()
        self.changes += 1

    def untagged_tips(self) -> list[str]:
        tagged = {contents.tip for contents in self.tags.values()}
        return sorted(name for name, contents in self.branches.items() if contents.tip not in tagged)

    def fresh_id(self) -> str:
        self.counter += 1
        return f"i{self.counter}"

    # -- rules ---------------------------------------------------------------------------------------------------
    @initialize()
    def two_writers(self) -> None:
        """Two writers on main, each with a granule staged in the same stack: both took the same slot."""
        for _ in range(2):
            state = self.open_writer_on("main")
            self.stage_array_in(state, 0)

    def open_writer_on(self, branch: str) -> OpenWriter:
        self.opened += 1
        held = self.branches[branch]
        state = OpenWriter(f"w{self.opened}", branch, self.repo.writer(branch), dict(held.arrays), set(held.ids))
        self.writers[state.name] = state
        note(f"{state.name} opens on {branch} at {state.base} (arrays {state.base_arrays})")
        return state

    @precondition(lambda self: len(self.writers) < MAX_OPEN)
    @rule(data=st.data())
    def open_writer(self, data: st.DataObject) -> None:
        self.open_writer_on(data.draw(st.sampled_from(sorted(self.branches)), label="branch"))

    @precondition(lambda self: bool(self.writers))
    @rule(data=st.data(), count=st.integers(1, 3), prop=st.sampled_from(["alpha", "beta", None]))
    def stage_items(self, data: st.DataObject, count: int, prop: str | None) -> None:
        state = self.draw_writer(data, applies=lambda _: True)
        for _ in range(count):
            item_id = self.fresh_id()
            extra = {prop: self.counter if prop == "alpha" else str(self.counter)} if prop else {}
            state.writer.add_item(make_item(item_id, "c", **extra))
            state.ids.append(item_id)
        note(f"{state.name} stages {state.ids[-count:]} ({prop or 'no extra property'})")

    @precondition(lambda self: bool(self.writers))
    @rule(data=st.data())
    def stage_replacement(self, data: st.DataObject) -> None:
        """Replace an item without arrays its branch holds, or a fresh one: the table keeps one version of it."""
        state = self.draw_writer(data, applies=lambda _: True)
        fresh = f"i{self.counter + 1}"
        held = self.branches[state.branch].ids
        stored = [
            item_id
            for item_id in sorted(held)
            if item_id not in state.replaced
            and item_id not in self.with_arrays
            and item_id not in state.ids
            and item_id not in state.deleted
        ]
        choices = st.one_of(st.sampled_from(stored), st.just(fresh)) if stored else st.just(fresh)
        item_id = data.draw(choices, label="replaced item")
        self.counter += 1  # the version (and, for a fresh item, its id)
        state.writer.add_item(make_item(item_id, "c", version=self.counter), replace=True)
        state.replaced[item_id] = self.counter
        note(f"{state.name} stages {item_id!r} version {self.counter}, replacing")

    @precondition(lambda self: any(state.deletable() for state in self.writers.values()))
    @rule(data=st.data())
    def stage_deletion(self, data: st.DataObject) -> None:
        """Delete an item the writer's base holds, rows and slices: the version its branch holds at landing goes."""
        state = self.draw_writer(data, applies=OpenWriter.deletable)
        item_id = data.draw(st.sampled_from(state.deletable()), label="deleted item")
        state.writer.delete_item("c", item_id)
        state.deleted.add(item_id)
        note(f"{state.name} deletes {item_id!r}")

    @precondition(lambda self: any(state.can_stage_arrays() for state in self.writers.values()))
    @rule(data=st.data(), origin=st.sampled_from(range(len(ORIGINS))))
    def stage_array(self, data: st.DataObject, origin: int) -> None:
        """Stage a fresh item with a raster of its own into one of the stacks."""
        self.stage_array_in(self.draw_writer(data, applies=OpenWriter.can_stage_arrays), origin)

    def stage_array_in(self, state: OpenWriter, origin: int) -> None:
        item_id = self.fresh_id()
        item = stage_raster(state.writer, make_item(item_id, "c"), self.pixels(self.counter), origin=ORIGINS[origin])
        state.writer.add_item(item)
        self.with_arrays.add(item_id)
        state.arrays[item_id] = self.counter
        state.slots[item_id] = staged_slots(item)
        state.ids.append(item_id)
        note(f"{state.name} stages {item_id!r} = {self.counter} at {state.slots[item_id]}")

    @precondition(lambda self: any(state.can_restage() for state in self.writers.values()))
    @rule(data=st.data())
    def restage_array(self, data: st.DataObject) -> None:
        """Replace the raster of an item with arrays its base holds: new slices, the stored ones cleared."""
        state = self.draw_writer(data, applies=OpenWriter.can_restage)
        item_id = data.draw(st.sampled_from(state.restageable()), label="re-staged item")
        self.counter += 1
        stored = state.writer.stored_items([("c", item_id)])[("c", item_id)]
        (stack,) = staged_slots(stored)
        item = replace_raster(state.writer, make_item(item_id, "c"), self.pixels(self.counter), stored)
        state.writer.add_item(item, replace=True)
        state.arrays[item_id] = self.counter
        state.restaged[item_id] = stack
        state.slots[item_id] = staged_slots(item)
        note(f"{state.name} re-stages {item_id!r} = {self.counter} at {state.slots[item_id]}, replacing")

    @precondition(lambda self: any(state.has_staged() for state in self.writers.values()))
    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        state = self.writers.pop(self.draw_writer(data).name)
        branch = self.branches[state.branch]
        # Items whose arrays another writer re-staged on this branch since this one opened: both cleared their slices.
        # (Or deleted it: its slices went with it.)
        conflicting = sorted(
            item_id for item_id in state.restaged if branch.arrays.get(item_id) != state.base_arrays[item_id]
        )
        replacing = [item_id for item_id in state.replaced if item_id in branch.ids] + list(state.restaged)
        try:
            result = state.writer.commit(state.name)
        except CommitConflict as conflict:
            note(f"{state.name} is refused: {conflict}")
            if state.base_gone or (state.base_expired and "expired" in str(conflict)):
                event("a writer whose base gc expired was refused")  # refused: it must say why
                assert "expired" in str(conflict), f"refused for another reason than its expired base: {conflict}"
            else:
                event("a writer was refused")
                assert conflicting, f"refused without a real conflict: {conflict}"
                stacks = {state.restaged[item_id] for item_id in conflicting}
                named = {path.strip("/").rsplit("/", 1)[0] for path in conflict.paths}
                assert stacks & named, f"the refusal names {conflict.paths}, not the stacks of {conflicting}"
        else:
            note(f"{state.name} commits {result.snapshot_id} on {state.branch} after {result.attempts} attempt(s)")
            event(f"commit took {min(result.attempts, 3)} attempt(s)")
            if state.branch != "main":
                event("a commit on a branch")
            if replacing:
                event("a commit replaced stored rows")
            if state.across_gc:
                event("a writer open across gc committed")
            # Out of the branch's history but kept by a tag, a base still serves a writer with nothing to move
            # (rows alone rebase without it); one whose base is gone cannot commit at all.
            assert not state.base_gone, "a writer whose base gc deleted committed"
            assert not conflicting, f"two writers re-staged {conflicting} on {state.branch} and both committed"
            assert result.rows_added == len(state.ids) + len(state.replaced) + len(state.restaged)
            assert result.rows_replaced == len(replacing), "a replacement removed other rows than the stored version"
            self.apply_deletions(state, branch, result)
            branch.ids.update(state.ids)
            for item_id, version in state.replaced.items():
                branch.ids[item_id] = 1
                branch.versions[item_id] = version
            branch.arrays.update(state.arrays)
            branch.commits.append(result.snapshot_id)
            branch.tip = result.snapshot_id
            self.made_on[result.snapshot_id] = state.branch
            self.added[result.snapshot_id] = [*state.ids, *state.replaced, *state.restaged]
            self.snapshots[result.snapshot_id] = branch.copy()
            if state.slots:
                landed = {row.id: row.pieces for row in self.rows.fresh().at(self.repo.view(result.snapshot_id))}
                if any(
                    {stack: slot for stack, _, slot in landed[item_id] or ()} != slots
                    for item_id, slots in state.slots.items()
                ):
                    event("a loser's slots moved past the winner's")
        finally:
            self.changed()  # the branch moved, or a refused writer wrote files

    @staticmethod
    def apply_deletions(state: OpenWriter, branch: Contents, result: CommitResult) -> None:
        """The model of a landed commit's deletions: the items the branch held go, the others were not found."""
        present = {item_id for item_id in state.deleted if item_id in branch.ids}
        assert result.rows_deleted == len(present), "a deletion removed other rows than the branch held"
        assert {item_id for _, item_id in result.not_found} == state.deleted - present
        if present:
            event("a deletion landed")
        if state.deleted - present:
            event("a deletion found its item gone")
        for item_id in present:
            del branch.ids[item_id]
            branch.arrays.pop(item_id, None)
            branch.versions.pop(item_id, None)

    @precondition(lambda self: bool(self.untagged_tips()))
    @rule(data=st.data())
    def tag(self, data: st.DataObject) -> None:
        branch = data.draw(st.sampled_from(self.untagged_tips()), label="tagged branch")
        name = f"t{len(self.tags)}"
        snapshot_id = self.repo.tag(name, f"branch:{branch}")
        self.changed()
        assert snapshot_id == self.branches[branch].tip, f"tag {name} of {branch} names another snapshot"
        self.tags[name] = self.branches[branch].copy()
        note(f"tag {name} at {snapshot_id} (tip of {branch})")

    @precondition(lambda self: len(self.branches) < MAX_BRANCHES)
    @rule(data=st.data())
    def create_branch(self, data: st.DataObject) -> None:
        """A branch from a branch's tip or from a tag: it holds what its source holds, and moves on its own."""
        sources = [f"branch:{name}" for name in sorted(self.branches)] + [f"tag:{name}" for name in sorted(self.tags)]
        source = data.draw(st.sampled_from(sources), label="source")
        kind, _, name = source.partition(":")
        contents = (self.branches if kind == "branch" else self.tags)[name].copy()
        branch = f"b{len(self.branches)}"
        snapshot_id = self.repo.branch(branch, source)
        self.changed()
        assert snapshot_id == contents.tip, f"branch {branch} from {source} starts at another snapshot"
        self.branches[branch] = contents
        event(f"a branch from a {kind}")
        note(f"branch {branch} from {source} at {snapshot_id}")
        if len(self.writers) < MAX_OPEN:
            self.open_writer_on(branch)

    @precondition(lambda self: self.gc_at != self.changes and self.gcs < MAX_GCS)
    @rule(expire=st.booleans())
    def collect_garbage(self, expire: bool) -> None:
        """``floe gc --grace 0s`` (and ``--expire-older-than 0s``): every ref keeps exactly what it held."""
        report = gc(self.repo, grace=timedelta(0), expire_older_than=timedelta(0) if expire else None)
        note(f"gc{' expiring' if expire else ''}: deleted {len(report.deleted)} table file(s)")
        event("gc expired snapshots" if expire else "gc")
        self.rows = invariants.Rows()  # files were deleted: read nothing from memory
        self.changed()
        self.gc_at = self.changes
        self.gcs += 1
        if expire:
            kept = {contents.tip for contents in [*self.branches.values(), *self.tags.values()]}
            for contents in [*self.branches.values(), *self.tags.values()]:
                # Icechunk keeps tips and tagged snapshots; a ref's history is now its tip alone.
                contents.commits = [contents.tip] if contents.tip in self.made_on else []
            gone = [snapshot_id for snapshot_id in self.snapshots if snapshot_id not in kept]
            self.snapshots = {snapshot_id: held for snapshot_id, held in self.snapshots.items() if snapshot_id in kept}
            for state in self.writers.values():
                # A branch's history is now its tip alone: a writer opened at any other snapshot (even one a tag
                # keeps) has no base in it to rebase from.
                state.base_gone = state.base_gone or state.base not in kept
                state.base_expired = state.base_expired or state.base != self.branches[state.branch].tip
            for snapshot_id in gone[-SNAPSHOTS_CHECKED:]:
                try:
                    self.repo.view(snapshot_id)
                except KeyError:
                    continue
                raise AssertionError(f"snapshot {snapshot_id} is still readable after gc expired it")
        for state in self.writers.values():
            state.across_gc = True
        for snapshot_id, contents in self.snapshots.items():
            self.check_version(self.repo.view(snapshot_id), contents)
        invariants.assert_check_passes(self.repo)

    def check_version(self, view: View, contents: Contents, checked: set[str] | None = None) -> None:
        """The version at ``view`` holds exactly the items of ``contents``, a slice for each with arrays and none
        else, and their arrays read back with the pixels staged last."""
        if checked is not None:
            if view.snapshot_id in checked:
                return
            checked.add(view.snapshot_id)
        invariants.assert_items_exactly(view, contents.ids, self.rows)
        invariants.assert_slices_exactly(view, "c", Counter(contents.arrays.keys()))
        invariants.assert_item_arrays(
            view, "c", {item_id: self.pixels(value) for item_id, value in contents.arrays.items()}
        )

    # -- invariants ----------------------------------------------------------------------------------------------
    # Refs and snapshots change only when the repository does (staging writes nothing to it here: the arrays
    # are inline in the writers' sessions), so everything is checked after each change.
    @precondition(lambda self: self.checked_at != self.changes)
    @invariant()
    def every_ref_holds_its_model(self) -> None:
        checked: set[str] = set()
        """Snapshots whose contents were checked in this round (a tip is often tagged, or among the latest)."""
        for name, contents in self.branches.items():
            self.check_branch(name, contents, checked)
        history = {info.id for info in self.repo.icechunk.ancestry(branch="main")}
        elsewhere = {snapshot_id for snapshot_id, branch in self.made_on.items() if branch != "main"}
        assert not history & elsewhere, "a commit made on another branch is in main's history"
        for name, contents in self.tags.items():
            invariants.assert_tag_unchanged(self.repo, name, contents.tip, contents.ids, self.rows)
            self.check_version(self.repo.view(f"tag:{name}"), contents, checked)
        for snapshot_id, contents in list(self.snapshots.items())[-SNAPSHOTS_CHECKED:]:
            self.check_version(self.repo.view(snapshot_id), contents, checked)
        self.checked_at = self.changes

    @invariant()
    def every_next_slot_known_is_what_a_listing_finds(self) -> None:
        """What the repository remembers of its stacks' next free slots (at snapshots its writers listed or
        committed, some after lost races, deletions and re-stages) is what listing the snapshot finds."""
        for snapshot_id, stack, slot in self.repo.next_slots.known():
            try:
                at = self.repo.icechunk.readonly_session(snapshot_id=snapshot_id)
            except icechunk.IcechunkError:
                continue  # a snapshot gc expired
            listed = next_free_slot(at, stack)
            assert slot == listed, f"next slot of {stack} at {snapshot_id} remembered as {slot}, listed {listed}"

    def check_branch(self, name: str, contents: Contents, checked: set[str]) -> None:
        """The branch's history holds its commits in order, and its tip holds exactly its model."""
        invariants.assert_history_holds(self.repo, name, contents.commits)
        held = {snapshot_id: [i for i in ids if i in contents.ids] for snapshot_id, ids in self.added.items()}
        invariants.assert_committed_rows_readable(self.repo, held, f"branch:{name}", self.rows)
        tip = self.repo.view(f"branch:{name}")
        assert tip.snapshot_id == contents.tip, f"branch {name} is at {tip.snapshot_id}, not {contents.tip}"
        self.check_version(tip, contents, checked)
        invariants.assert_no_item_twice(tip, self.rows)
        invariants.assert_newest_versions(tip, contents.versions)
        invariants.assert_rows_have_their_arrays(tip, self.rows)
        invariants.assert_no_slice_without_row(tip, self.rows)


InterleavedWriters.TestCase.settings = settings(
    max_examples=25, stateful_step_count=24, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
InterleavedWriters.TestCase.pytestmark = [pytest.mark.slow]  # 25 runs of up to 24 steps: about 80 s
test_interleaved_writers = InterleavedWriters.TestCase


def test_writers_open_across_gc_commit_or_are_refused_by_name(tmp_path):
    """What the model expects of gc, pinned: a writer open across ``gc --grace 0s`` commits; after
    ``--expire-older-than 0s`` a writer whose base was a tip still commits, and one whose base was expired is
    refused with a ``CommitConflict`` naming the expired snapshot (not a raw Icechunk error), committing nothing."""
    repo = Repository.create(tmp_path / "repo", Settings())
    repo.ensure_groups(["c"])
    stale, across = repo.writer(), repo.writer()
    stale.add_item(make_item("stale"))
    across.add_item(make_item("across"))
    gc(repo, grace=timedelta(0))
    landed = across.commit("across")  # moves main past the base of `stale`
    at_tip = repo.writer()
    at_tip.add_item(make_item("at-tip"))
    gc(repo, grace=timedelta(0), expire_older_than=timedelta(0))
    with pytest.raises(CommitConflict, match=f"opened at \\({stale.session.snapshot_id}\\) was expired"):
        stale.commit("stale")
    assert repo.resolve("main") == landed.snapshot_id, "a refused writer moved the branch"
    at_tip.commit("at tip")
    invariants.assert_items_exactly(repo.view(), {"across": 1, "at-tip": 1})
    invariants.assert_check_passes(repo)
