"""A state machine of interleaved writers on one branch (modelled on icechunk's test_stateful_parallel_sessions.py).

Writers open at arbitrary moments, stage items, replacements and arrays, and
commit in any order. Rules apply only where their preconditions hold (a writer
to stage in, a writer with something staged to commit, a group it may still
create), and draw only from what applies, so no step is skipped silently;
``note`` records what each step did, for the report of a failing run.

The model says what the branch must hold. The invariants of
:mod:`tests.invariants` check it: the tip and the history after every step,
every tag and the latest snapshots after every change of the repository (they
cannot change otherwise). A writer that stages a group another writer
committed after it opened must be refused (``CommitConflict``); no other
commit may be. The writers live in this process, so their interleaving is
exactly the one drawn: a failing run replays.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import hypothesis.strategies as st
from hypothesis import HealthCheck, event, note, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ingest import CommitConflict, Repository, Settings, Writer
from ingest.stac import arrays_asset
from tests import invariants
from tests.conftest import make_item

GROUPS = ("g1", "g2", "g3", "g4")
MAX_OPEN = 4
SNAPSHOTS_CHECKED = 3


@dataclass
class OpenWriter:
    """A writer and what it staged (the model of its pending commit)."""

    name: str
    writer: Writer
    base_groups: frozenset[str]
    """The groups committed when it opened: its session sees them, so it may not create them again."""
    ids: list[str] = field(default_factory=list)
    """Fresh items it appends."""
    replaced: dict[str, int] = field(default_factory=dict)
    """Item id -> the version its replacement carries."""
    groups: dict[str, int] = field(default_factory=dict)
    """Group it creates -> the value of its array."""

    def has_staged(self) -> bool:
        return bool(self.ids or self.replaced or self.groups)

    def creatable(self) -> list[str]:
        return [group for group in GROUPS if group not in self.groups and group not in self.base_groups]


@dataclass(frozen=True)
class Version:
    """What the branch held at one snapshot."""

    ids: Counter[str]
    groups: dict[str, int]


class InterleavedWriters(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.TemporaryDirectory(prefix="floe-stateful-")
        self.repo = Repository.create(Path(self.directory.name) / "repo", Settings())
        self.repo.ensure_groups(["c"])
        self.rows = invariants.Rows()
        """Plans each version once between two changes of the repository (a commit, a refusal, a tag)."""
        self.changes = 0
        self.history_checked_at = -1
        self.writers: dict[str, OpenWriter] = {}
        self.opened = 0
        self.counter = 0
        # The model of the branch.
        self.committed_ids: Counter[str] = Counter()
        self.committed_groups: dict[str, int] = {}
        self.versions: dict[str, int] = {}
        self.commits: list[str] = []
        self.added: dict[str, list[str]] = {}
        self.snapshots: dict[str, Version] = {}
        self.tags: dict[str, tuple[str, Counter[str]]] = {}

    def teardown(self) -> None:
        self.directory.cleanup()

    def draw_writer(
        self, data: st.DataObject, applies: Callable[[OpenWriter], object] = OpenWriter.has_staged
    ) -> OpenWriter:
        names = sorted(name for name, state in self.writers.items() if applies(state))
        return self.writers[data.draw(st.sampled_from(names), label="writer")]

    def changed(self) -> None:
        """The repository changed: plan every version again, and check the tags and older snapshots again."""
        self.rows = self.rows.fresh()
        self.changes += 1

    def tagged(self) -> set[str]:
        return {snapshot_id for snapshot_id, _ in self.tags.values()}

    def fresh_id(self) -> str:
        self.counter += 1
        return f"i{self.counter}"

    # -- rules ---------------------------------------------------------------------------------------------------
    @initialize()
    def two_writers(self) -> None:
        self.open_writer()
        self.open_writer()

    @precondition(lambda self: len(self.writers) < MAX_OPEN)
    @rule()
    def open_writer(self) -> None:
        self.opened += 1
        state = OpenWriter(f"w{self.opened}", self.repo.writer(), frozenset(self.committed_groups))
        self.writers[state.name] = state
        note(f"{state.name} opens at {state.writer.session.snapshot_id} (groups {sorted(state.base_groups)})")

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
        """Replace an item some writer committed, or a fresh one: the table keeps one version of it."""
        state = self.draw_writer(data, applies=lambda _: True)
        fresh = f"i{self.counter + 1}"
        stored = [item_id for item_id in sorted(self.committed_ids) if item_id not in state.replaced]
        choices = st.one_of(st.sampled_from(stored), st.just(fresh)) if stored else st.just(fresh)
        item_id = data.draw(choices, label="replaced item")
        self.counter += 1  # the version (and, for a fresh item, its id)
        state.writer.add_item(make_item(item_id, "c", version=self.counter), replace=True)
        state.replaced[item_id] = self.counter
        note(f"{state.name} stages {item_id!r} version {self.counter}, replacing")

    @precondition(lambda self: any(state.creatable() for state in self.writers.values()))
    @rule(data=st.data())
    def stage_array(self, data: st.DataObject) -> None:
        """Create a group with an array, and an item whose ``floe:arrays`` asset names it."""
        state = self.draw_writer(data, applies=OpenWriter.creatable)
        group = data.draw(st.sampled_from(state.creatable()), label="group")
        item_id = self.fresh_id()
        state.writer.item_group("c", group).create_array("band", shape=(2,), dtype="int32")[:] = self.counter
        item = make_item(item_id, "c")
        item["assets"]["floe:arrays"] = arrays_asset(f"c/{group}", ["band"])
        state.writer.add_item(item)
        state.groups[group] = self.counter
        state.ids.append(item_id)
        note(f"{state.name} creates c/{group} = {self.counter} with item {item_id!r}")

    @precondition(lambda self: any(state.has_staged() for state in self.writers.values()))
    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        state = self.writers.pop(self.draw_writer(data).name)
        # Its groups are none its session saw, so one committed now was created by a writer since it opened.
        conflicting = sorted(set(state.groups) & set(self.committed_groups))
        replacing = [item_id for item_id in state.replaced if item_id in self.committed_ids]
        try:
            result = state.writer.commit(state.name)
        except CommitConflict as conflict:
            note(f"{state.name} is refused: {conflict.paths}")
            event("a writer was refused")
            assert conflicting, f"refused without a real conflict: {conflict}"
            assert {f"/c/{group}" for group in conflicting} & set(conflict.paths), "the refusal names other nodes"
        else:
            note(f"{state.name} commits {result.snapshot_id} after {result.attempts} attempt(s)")
            event(f"commit took {min(result.attempts, 3)} attempt(s)")
            if replacing:
                event("a commit replaced stored rows")
            assert not conflicting, f"two writers created {conflicting} and both committed"
            assert result.rows_added == len(state.ids) + len(state.replaced)
            assert result.rows_replaced == len(replacing), "a replacement removed other rows than the stored version"
            self.committed_ids.update(state.ids)
            for item_id, version in state.replaced.items():
                self.committed_ids[item_id] = 1
                self.versions[item_id] = version
            self.committed_groups.update(state.groups)
            self.commits.append(result.snapshot_id)
            self.added[result.snapshot_id] = [*state.ids, *state.replaced]
            self.snapshots[result.snapshot_id] = Version(Counter(self.committed_ids), dict(self.committed_groups))
        finally:
            self.changed()  # the branch moved, or a refused writer wrote files

    @precondition(lambda self: bool(self.commits) and self.commits[-1] not in self.tagged())
    @rule()
    def tag(self) -> None:
        name = f"t{len(self.tags)}"
        snapshot_id = self.repo.tag(name)
        self.changed()
        self.tags[name] = (snapshot_id, Counter(self.committed_ids))
        note(f"tag {name} at {snapshot_id}")

    # -- invariants ----------------------------------------------------------------------------------------------
    @invariant()
    def history_holds_every_commit_in_order(self) -> None:
        invariants.assert_history_holds(self.repo, "main", self.commits)

    @invariant()
    def committed_rows_are_readable_at_the_tip(self) -> None:
        invariants.assert_committed_rows_readable(self.repo, self.added, "main", self.rows)

    @invariant()
    def tip_holds_exactly_what_was_committed(self) -> None:
        tip = self.repo.view()
        invariants.assert_items_exactly(tip, self.committed_ids, self.rows)
        invariants.assert_no_item_twice(tip, self.rows)
        invariants.assert_newest_versions(tip, self.versions)

    @invariant()
    def tip_arrays_are_what_was_committed(self) -> None:
        tip = self.repo.view()
        invariants.assert_groups_exactly(tip, "c", self.committed_groups)
        invariants.assert_arrays_hold(tip, {f"c/{group}": value for group, value in self.committed_groups.items()})
        invariants.assert_rows_have_their_arrays(tip, self.rows)

    # Tags and older snapshots can change only when the repository does: checked after each change.
    @precondition(lambda self: self.history_checked_at != self.changes)
    @invariant()
    def tags_and_older_snapshots_never_change(self) -> None:
        for name, (snapshot_id, ids) in self.tags.items():
            invariants.assert_tag_unchanged(self.repo, name, snapshot_id, ids, self.rows)
        for snapshot_id, version in list(self.snapshots.items())[-SNAPSHOTS_CHECKED:]:
            view = self.repo.view(snapshot_id)
            invariants.assert_items_exactly(view, version.ids, self.rows)
            invariants.assert_groups_exactly(view, "c", version.groups)
            invariants.assert_arrays_hold(view, {f"c/{group}": value for group, value in version.groups.items()})
        self.history_checked_at = self.changes


InterleavedWriters.TestCase.settings = settings(
    max_examples=30, stateful_step_count=16, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_interleaved_writers = InterleavedWriters.TestCase
