"""Crash anywhere: floe killed at each named fault point loses nothing, shows nothing half-done, and re-runs.

The trials are those of ``scripts/crash_harness.py`` (``tests/lifecycle/_crash.py``),
made deterministic: each fault point once on local storage, two on moto S3.
Ray ingests are left to the harness (a Ray start costs more than this whole
module); their actors commit through the same fault points as ``--workers 0``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ingest._faults import POINTS, parse
from tests.lifecycle._crash import ROOT_DIR, SCENARIO_POINTS, Storage, run_trial

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
    import ingest._faults

    assert all(point in (ingest._faults.__doc__ or "") for point in POINTS)
    assert {point for points in SCENARIO_POINTS.values() for point in points} == set(POINTS)
    assert {point.partition(":")[0] for _, point, _ in LOCAL_TRIALS} == set(POINTS)


# (scenario, fault, seed): every point once; the seeds pick gc with and without snapshot expiry.
LOCAL_TRIALS = [
    ("ingest", "commit.after_swap:2", 1),
    ("ingest", "commit.after_metadata:3", 2),
    ("replace", "write.data_file:5", 3),
    ("writers", "commit.before_swap:2", 4),
    ("tag", "ref.after_create", 5),
    ("branch", "ref.before_create", 6),
    ("gc", "gc.after_expire", 7),
    ("gc", "gc.after_icechunk", 8),
    ("gc", "gc.between_deletions:2", 9),
    ("replicate", "replicate.between_copies:3", 10),
    ("replicate", "replicate.between_rewrites:2", 11),
    ("replicate", "replicate.before_refs", 12),
]
S3_TRIALS = [("replace", "commit.before_swap:2", 21), ("gc", "gc.between_deletions:1", 22)]


def assert_survived(scenario: str, fault: str, result) -> None:
    assert result.killed, f"{scenario} never reached {fault}"
    assert result.after_kill.clean, f"after the kill at {fault}: {result.after_kill.summary()}"
    assert result.rerun_completed, f"the re-run after {fault} did not complete: {result.notes}"
    assert result.final.clean, f"after the re-run: {result.final.summary()}"


@pytest.mark.parametrize(("scenario", "fault", "seed"), LOCAL_TRIALS, ids=[f"{s}-{f}" for s, f, _ in LOCAL_TRIALS])
def test_killed_at_a_fault_point_on_local_storage(tmp_path: Path, scenario: str, fault: str, seed: int):
    (tmp_path / "roots").mkdir()
    storage = Storage.local(tmp_path / "roots")
    result = run_trial(storage, scenario, tmp_path, name=f"{scenario}-{seed}", seed=seed, fault=fault)
    assert_survived(scenario, fault, result)


@pytest.mark.s3
@pytest.mark.parametrize(("scenario", "fault", "seed"), S3_TRIALS, ids=[f"{s}-{f}" for s, f, _ in S3_TRIALS])
def test_killed_at_a_fault_point_on_s3(tmp_path: Path, moto_server, scenario: str, fault: str, seed: int):
    storage = Storage.s3(moto_server.endpoint, moto_server.create_bucket())
    result = run_trial(storage, scenario, tmp_path, name=f"{scenario}-{seed}", seed=seed, fault=fault)
    assert_survived(scenario, fault, result)
