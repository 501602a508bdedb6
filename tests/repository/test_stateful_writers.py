"""A state machine of interleaved writers on one branch (modelled on icechunk's parallel-session tests).

Writers open at arbitrary moments, stage items and arrays, and commit in any
order. The model says what the branch must hold; after every step the tip,
every tag, and every committed snapshot must agree with it.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from ingest import CommitConflict, Repository, Settings
from tests.conftest import make_item


class InterleavedWriters(RuleBasedStateMachine):
    writers = Bundle("writers")

    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.TemporaryDirectory(prefix="floe-stateful-")
        self.repo = Repository.create(Path(self.directory.name) / "repo", Settings())
        self.repo.ensure_groups(["c"])
        self.committed_ids: Counter[str] = Counter()
        self.committed_groups: dict[str, int] = {}
        self.tags: dict[str, Counter[str]] = {}
        self.snapshots: dict[str, Counter[str]] = {}
        self.versions: dict[str, int] = {}
        self.counter = 0

    def teardown(self) -> None:
        self.directory.cleanup()

    @rule(target=writers)
    def open_writer(self):
        return {"writer": self.repo.writer(), "ids": [], "groups": {}, "replaced": {}}

    @rule(state=writers, count=st.integers(1, 3), prop=st.sampled_from(["alpha", "beta", None]))
    def stage_items(self, state, count, prop):
        for _ in range(count):
            self.counter += 1
            item_id = f"i{self.counter}"
            extra = {prop: self.counter if prop == "alpha" else str(self.counter)} if prop else {}
            state["writer"].add_item(make_item(item_id, "c", **extra))
            state["ids"].append(item_id)

    @rule(state=writers, pick=st.integers(0, 1000))
    def stage_replacement(self, state, pick):
        """Replace an item some writer committed (or staged, or a fresh one): the table keeps one version."""
        known = sorted(set(self.committed_ids) | {f"i{self.counter + 1}"})
        item_id = known[pick % len(known)]
        if item_id in state["ids"] or item_id in state["replaced"]:
            return
        self.counter += 1
        state["writer"].add_item(make_item(item_id, "c", version=self.counter), replace=True)
        state["replaced"][item_id] = self.counter

    @rule(state=writers, group=st.sampled_from(["g1", "g2", "g3", "g4"]))
    def stage_array(self, state, group):
        if group in state["groups"]:
            return
        self.counter += 1
        node = state["writer"].item_group("c", group)
        if "band" in node:
            return  # already committed by someone: writing it again would be a replace, not an append
        node.create_array("band", shape=(2,), dtype="int32")[:] = self.counter
        state["groups"][group] = self.counter

    @rule(state=consumes(writers))
    def commit(self, state):
        if not state["ids"] and not state["groups"] and not state["replaced"]:
            return
        conflicting = set(state["groups"]) & set(self.committed_groups)
        try:
            result = state["writer"].commit("step")
        except CommitConflict as conflict:
            assert conflicting, f"refused without a real conflict: {conflict}"
            return
        assert not conflicting, "two writers created the same group and both committed"
        self.committed_ids.update(state["ids"])
        for item_id, version in state["replaced"].items():
            self.committed_ids[item_id] = 1
            self.versions[item_id] = version
        assert result.rows_added == len(state["ids"]) + len(state["replaced"])
        self.committed_groups.update(state["groups"])
        self.snapshots[result.snapshot_id] = Counter(self.committed_ids)

    @rule()
    def tag(self):
        name = f"t{len(self.tags)}"
        self.repo.tag(name)
        self.tags[name] = Counter(self.committed_ids)

    @invariant()
    def tip_holds_exactly_what_was_committed(self):
        items = list(self.repo.view().items())
        found = Counter(item["id"] for item in items)
        assert found == self.committed_ids
        for item in items:
            if item["id"] in self.versions and found[item["id"]] == 1:
                assert item["properties"].get("version") == self.versions[item["id"]], "a stale version survived"
        if self.committed_groups:
            arrays = self.repo.view().arrays("c")
            assert set(arrays.group_keys()) == set(self.committed_groups)
            for group, value in self.committed_groups.items():
                assert (arrays[group]["band"][:] == value).all()

    @invariant()
    def tags_and_snapshots_never_change(self):
        for name, expected in self.tags.items():
            assert Counter(i["id"] for i in self.repo.view(f"tag:{name}").items()) == expected
        for snapshot_id, expected in list(self.snapshots.items())[-3:]:
            assert Counter(i["id"] for i in self.repo.view(snapshot_id).items()) == expected


InterleavedWriters.TestCase.settings = settings(
    max_examples=30, stateful_step_count=16, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_interleaved_writers = InterleavedWriters.TestCase
