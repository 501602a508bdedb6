"""Crash anywhere: floe killed at each named fault point loses nothing, shows nothing half-done, and re-runs.

The trials are those of ``scripts/crash_harness.py`` (``tests/lifecycle/_crash.py``),
made deterministic: every fault point on local storage and two on moto S3,
in five trials, each killing successive runs of one command at successive
points before a last run completes it. Ray ingests are left to the harness
(a Ray start costs more than this whole module); their actors commit through
the same fault points as ``--workers 0``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ingest._faults import POINTS, parse
from tests.lifecycle._crash import OTHER_POINTS, ROOT_DIR, SCENARIO_POINTS, Storage, TrialResult, run_trial

# The module alone (not the ingest package, whose imports take a second): a process that reaches a point thrice.
PROBE = f"""
import importlib.util
spec = importlib.util.spec_from_file_location("faults", {str(ROOT_DIR / "ingest" / "_faults.py")!r})
faults = importlib.util.module_from_spec(spec)
spec.loader.exec_module(faults)
for step in range(3):
    faults.fault_point("probe.point")
    print(step, flush=True)
"""


def probe(fault: str | None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin"}
    if fault is not None:
        env["FLOE_FAULT"] = fault
    return subprocess.run(
        [sys.executable, "-c", PROBE], check=False, env=env, capture_output=True, text=True, timeout=60
    )


def test_an_unset_or_unknown_fault_point_is_harmless():
    for fault in (None, "", "commit.after_swap", "probe.point:x", "probe.point:0"):
        finished = probe(fault)
        assert (finished.returncode, finished.stdout.split()) == (0, ["0", "1", "2"]), fault


def test_the_named_fault_point_kills_the_process_at_its_nth_hit():
    first = probe("probe.point")
    assert (first.returncode, first.stdout.split()) == (-9, [])
    third = probe("probe.point:3")
    assert (third.returncode, third.stdout.split()) == (-9, ["0", "1"])


def test_fault_specs_parse():
    assert parse("commit.after_swap") == ("commit.after_swap", 1)
    assert parse(" gc.between_deletions:4 ") == ("gc.between_deletions", 4)
    assert parse("") == (None, 1)
    assert parse("commit.after_swap:-1") == (None, 1)


def test_every_fault_point_is_documented_and_tried():
    # Documented where the design lives: the table of docs/reliability.md's "Fault points" section.
    guide = (Path(__file__).parents[2] / "docs" / "reliability.md").read_text()
    table = guide[guide.index("### Fault points") :]
    assert [point for point in POINTS if f"`{point}`" not in table] == []
    # The page reader's and the creation's points are tried in their own tests (OTHER_POINTS says where).
    stores = set(POINTS) - set(OTHER_POINTS)
    assert {point for points in SCENARIO_POINTS.values() for point in points} == stores
    assert {fault.partition(":")[0] for _, faults, _ in LOCAL_TRIALS for fault in faults} == stores


# (scenario, the faults it is killed at in turn, seed): every point on local storage, two on moto S3. Each kill
# is checked, then the next run of the same command is killed at the next point, and the last run completes.
LOCAL_TRIALS = [
    ("ingest", ("write.data_file:2", "commit.after_metadata:2", "commit.before_swap:1", "commit.after_swap:1"), 1),
    ("tag", ("ref.before_create", "ref.after_create"), 2),
    ("gc", ("gc.after_expire", "gc.after_icechunk", "gc.between_deletions:2"), 3),
    ("replicate", ("replicate.between_copies:2", "replicate.between_rewrites:1", "replicate.before_refs"), 4),
]
S3_TRIALS = [("replace", ("commit.after_swap:2",), 5)]


def assert_survived(scenario: str, result: TrialResult) -> None:
    assert result.killed, f"{scenario} did not reach every one of {result.point}"
    assert result.after_kill.clean, f"after the kills at {result.point}: {result.after_kill.summary()}"
    assert result.rerun_completed, f"the re-run after {result.point} did not complete: {result.notes}"
    assert result.final.clean, f"after the re-run: {result.final.summary()}"


@pytest.mark.slow
@pytest.mark.parametrize(("scenario", "faults", "seed"), LOCAL_TRIALS, ids=[s for s, _, _ in LOCAL_TRIALS])
def test_killed_at_each_fault_point_on_local_storage(tmp_path: Path, scenario: str, faults: tuple[str, ...], seed: int):
    (tmp_path / "roots").mkdir()
    storage = Storage.local(tmp_path / "roots")
    result = run_trial(storage, scenario, tmp_path, name=scenario, seed=seed, faults=faults)
    assert_survived(scenario, result)


@pytest.mark.slow
@pytest.mark.s3
@pytest.mark.parametrize(("scenario", "faults", "seed"), S3_TRIALS, ids=[s for s, _, _ in S3_TRIALS])
def test_killed_at_fault_points_on_s3(tmp_path: Path, moto_server, scenario: str, faults: tuple[str, ...], seed: int):
    storage = Storage.s3(moto_server.endpoint, moto_server.create_bucket())
    result = run_trial(storage, scenario, tmp_path, name=scenario, seed=seed, faults=faults)
    assert_survived(scenario, result)
