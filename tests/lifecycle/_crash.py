"""Crash trials: run a real ``floe`` command, SIGKILL it mid-way, then check that nothing committed was lost.

Shared by ``tests/lifecycle/test_crash.py`` (a few deterministic trials in CI)
and ``scripts/crash_harness.py`` (hundreds of random ones). A trial:

1. builds a scenario's starting state in this process, through the library
   (a repository, items, a replacement, a tag, an earlier replica);
2. runs the scenario's ``floe`` command in its own session and kills it,
   either at a named fault point (``FLOE_FAULT``, see ``ingest/_faults.py``)
   or from outside with SIGKILL to its whole process group after a random delay;
3. checks the root: ``check --all --deep`` (the library call behind
   ``floe check``) finds nothing, no ref shows an item twice, every item shown
   equals one of the versions the input allowed, nothing that was committed
   before the kill is missing, no slice of a stack lacks its row and no row
   names a slot that does not hold it, and (for the
   write scenarios) the history agrees with the table: the rows the commits of
   ``floe log`` say they added are the rows the table holds;
4. runs the same command again, without a fault, and checks that it completes
   and that the final state holds every input item exactly once.

With several faults, step 2 and 3 repeat: each run of the command is killed at
the next fault point (CI covers every point in a few trials this way).

Every command is a new ``python -m ingest.cli`` process (about 1.2 s of CPU
to import floe). A forkserver that imported floe once would start commands
in milliseconds, but importing icechunk starts native threads, and the
forked children deadlocked on a lock one of them held (tried here).

*Committed* means what the branch history shows after the kill: a commit is
the only acknowledgement a writer gives (``floe ingest`` reports its batches
when it ends), and the history is what every reader sees. So every row the
log's commits account for must be in the table, each exactly once, and what
was committed before the command started must still be there. A kill at a
fault point is also checked against how many commits the killed process made:
``commit.after_swap:N`` leaves exactly N of its commits, the other points fewer
than N.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zarr

from ingest import Repository, Settings
from ingest._faults import POINTS
from ingest.lifecycle import check, replicate
from ingest.pipeline import ingest_items
from ingest.repository import View
from ingest.stac import read_arrays_asset, without_arrays_asset
from tests import conftest

ROOT_DIR = Path(__file__).resolve().parents[2]
WRITE_POINTS = ("write.data_file", "commit.after_metadata", "commit.before_swap", "commit.after_swap")
SCENARIO_POINTS: dict[str, tuple[str, ...]] = {
    "ingest": WRITE_POINTS,
    "ingest-ray": WRITE_POINTS,
    "writers": WRITE_POINTS,
    "replace": WRITE_POINTS,
    "gc": ("gc.after_expire", "gc.after_icechunk", "gc.between_deletions"),
    "tag": ("ref.before_create", "ref.after_create"),
    "branch": ("ref.before_create", "ref.after_create"),
    "replicate": ("replicate.between_copies", "replicate.between_rewrites", "replicate.before_refs"),
}
OTHER_POINTS = ("reader.after_page", "create.before_first_commit")
"""Points tried elsewhere: a search's page reader, whose death the ingest survives (reading on itself,
tests/pipeline/test_search_lanes.py), and a new repository's creation, which `floe init` or an ingest completes
(tests/repository/test_create.py)."""
assert {point for points in SCENARIO_POINTS.values() for point in points} == set(POINTS) - set(OTHER_POINTS)
COMMAND_TIMEOUT = 600.0


@dataclass
class Storage:
    """Where trial roots live: a local folder, or a bucket of an S3 server (moto) on 127.0.0.1."""

    kind: str
    base: str
    settings: Settings
    env: dict[str, str] = field(default_factory=dict)
    """FLOE_* variables a floe process needs to reach the storage."""

    def root(self, name: str) -> str:
        return f"{self.base.rstrip('/')}/{name}"

    @classmethod
    def local(cls, folder: Path) -> Storage:
        return cls("local", str(folder), Settings())

    @classmethod
    def s3(cls, endpoint: str, bucket: str) -> Storage:
        values = {
            "endpoint_url": endpoint,
            "region": "us-east-1",
            "access_key_id": "testing",
            "secret_access_key": "testing",
            "allow_http": True,
            "force_path_style": True,
        }
        env = {
            f"FLOE_S3__{key.upper()}": str(value).lower() if isinstance(value, bool) else str(value)
            for key, value in values.items()
        }
        return cls("s3", f"s3://{bucket}", Settings(s3=values), env)


@dataclass
class Finished:
    """How one floe command ended."""

    returncode: int
    seconds: float
    stderr: str

    @property
    def completed(self) -> bool:
        return self.returncode == 0


@dataclass
class Running:
    """A floe command started in its own session (so its Ray workers can be killed with it)."""

    process: subprocess.Popen[bytes]
    log_path: Path
    started: float

    def finish(self, timeout: float | None = COMMAND_TIMEOUT) -> Finished | None:
        """Wait for the command (None if still running after ``timeout``); then clean up its process group."""
        if not _exited(self.process.pid, timeout):
            return None
        # The exited leader is not reaped yet, so its group id is still this command's: what a killed Ray
        # driver left behind (its workers share its session) goes with it, and no stranger can be hit.
        _kill_group(self.process.pid)
        self.process.wait()
        stderr = self.log_path.read_text(errors="replace")
        self.log_path.unlink()
        return Finished(self.process.returncode, time.monotonic() - self.started, stderr[-3000:])

    def kill(self) -> Finished:
        """SIGKILL the command's whole process group, from outside."""
        _kill_group(self.process.pid)
        finished = self.finish(timeout=None)
        assert finished is not None
        return finished


def start_floe(storage: Storage, root: str, args: list[str], workdir: Path, fault: str | None = None) -> Running:
    """Start ``floe --root ROOT ARGS`` (with ``FLOE_FAULT=fault``) in its own session."""
    env = {**os.environ, **storage.env, "PYTHONPATH": str(ROOT_DIR)}
    env.pop("FLOE_FAULT", None)
    if fault:
        env["FLOE_FAULT"] = fault
    log_path = workdir / f"stderr-{time.monotonic_ns()}.txt"
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "ingest.cli", "--root", root, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log_file,
            env=env,
            cwd=workdir,
            start_new_session=True,
        )
    return Running(process, log_path, time.monotonic())


def _exited(pid: int, timeout: float | None) -> bool:
    """Whether child ``pid`` exited within ``timeout`` seconds; it is left unreaped."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is None:
        if deadline is not None and time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


# ---------------------------------------------------------------------------- what a root shows


def canonical(item: dict[str, Any]) -> str:
    return json.dumps(without_arrays_asset(item), sort_keys=True)


def key_of(item: dict[str, Any]) -> tuple[str, str]:
    return item["collection"], item["id"]


def ref_items(repository: Repository) -> dict[str, list[dict[str, Any]]]:
    """Every ref's items (branch and tag names prefixed by their kind)."""
    return {f"{ref.kind}:{ref.name}": list(repository.view(ref.snapshot_id).items()) for ref in repository.refs()}


def exports(repository: Repository) -> dict[str, list[str]]:
    """Every ref's items as sorted canonical JSON (arrays asset included: a ref must not change at all)."""
    return {
        name: sorted(json.dumps(item, sort_keys=True) for item in items)
        for name, items in ref_items(repository).items()
    }


def slices_without_rows(repository: Repository) -> list[str]:
    """Arrays half-visible at some ref: a row's piece that is not a slot holding the row's id, or an occupied slot
    of a stack that no row names (a slice without its row)."""
    problems = []
    for ref in repository.refs():
        problems.extend(f"{ref.kind}:{ref.name}: {what}" for what in _slices_disagree(repository.view(ref.snapshot_id)))
    return problems


def _slices_disagree(view: View) -> list[str]:
    problems = []
    slots: dict[str, dict[int, str]] = {}

    def slot_items(stack: str) -> dict[int, str]:
        if stack not in slots:
            slots[stack] = view.slot_items(stack) if view.has_group(stack) else {}
        return slots[stack]

    named: set[tuple[str, int]] = set()
    for item in view.items():
        asset = read_arrays_asset(item)
        if asset is None:
            continue
        for piece in asset.pieces():
            named.add((piece.stack, piece.slot))
            if not view.has_array(f"{piece.stack}/{piece.array}"):
                problems.append(f"{item['id']} names {piece.stack}/{piece.array}, which is missing")
            elif (holder := slot_items(piece.stack).get(piece.slot)) != item["id"]:
                problems.append(f"{item['id']} names slot {piece.slot} of {piece.stack}, which holds {holder!r}")
    collections = [name for name, _ in zarr.open_group(view.session.store, mode="r").groups()]
    for stack in (stack for collection in collections for stack in view.stacks(collection)):
        for slot, holder in slot_items(stack).items():
            if (stack, slot) not in named:
                problems.append(f"slot {slot} of {stack} holds {holder!r}, and no row names it")
    return problems


@dataclass
class Findings:
    """What one check of a root found, by kind (the harness's table columns)."""

    check: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)

    def extend(self, other: Findings) -> None:
        for name in ("check", "duplicates", "lost", "corrupt"):
            getattr(self, name).extend(getattr(other, name))

    @property
    def clean(self) -> bool:
        return not (self.check or self.duplicates or self.lost or self.corrupt)

    def summary(self) -> str:
        parts = [
            f"{name}: {values[:3]}"
            for name in ("check", "duplicates", "lost", "corrupt")
            if (values := getattr(self, name))
        ]
        return "; ".join(parts)


def check_root(repository: Repository) -> Findings:
    """``floe check --all --deep``, and (checked here too, not only by the code under test) no arrays without their
    row and no row without its arrays."""
    found = Findings()
    found.check.extend(str(problem) for problem in check(repository, all_refs=True, deep=True))
    found.corrupt.extend(slices_without_rows(repository))
    return found


def compare_items(
    shown: list[dict[str, Any]], allowed: dict[tuple[str, str], set[str]], required: set[tuple[str, str]]
) -> Findings:
    """Items one ref shows against the versions each key may have, and the keys that must be there."""
    found = Findings()
    counts = Counter(key_of(item) for item in shown)
    found.duplicates.extend(f"{key} shown {count} times" for key, count in counts.items() if count > 1)
    for item in shown:
        if canonical(item) not in allowed.get(key_of(item), set()):
            found.corrupt.append(f"{key_of(item)} is not equal to any version ingested")
    found.lost.extend(f"{key} is missing" for key in sorted(required - set(counts)))
    return found


def history_agrees(repository: Repository, branch: str = "main") -> Findings:
    """The rows ``floe log`` says the branch's commits added (less those they replaced) are the rows it holds."""
    found = Findings()
    net = sum(entry.rows_added - entry.rows_replaced for entry in repository.log(branch))
    rows = repository.view(branch).count()
    if rows < net:
        found.lost.append(f"{branch}: the log accounts for {net} rows, the table holds {rows}")
    elif rows > net:
        found.duplicates.append(f"{branch}: the table holds {rows} rows, the log accounts for {net}")
    return found


def commits_with(repository: Repository, prefix: str, branch: str = "main") -> int:
    return sum(1 for entry in repository.log(branch) if entry.message.startswith(prefix))


# ---------------------------------------------------------------------------- inputs


def make_item(item_id: str, collection: str, month: int, version: int) -> dict[str, Any]:
    """A small valid STAC item; ``version`` changes a property, so a re-ingest replaces it."""
    when = f"2024-{month:02d}-05T00:00:00Z"
    return conftest.make_item(item_id, collection, when=when, version=version, cloud=month * 1.5)


def make_items(prefix: str, count: int, version: int = 1) -> list[dict[str, Any]]:
    """``count`` items over two collections and two months, so each batch writes several data files."""
    return [
        make_item(f"{prefix}-{i:03d}", "crash-a" if i % 2 else "crash-b", 1 + i % 4 // 2, version) for i in range(count)
    ]


def write_ndjson(path: Path, items: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return path


def archive_items(archive: Path) -> list[dict[str, Any]]:
    """The items of a sample archive (``ingest.sample.make_archive``)."""
    return [json.loads(path.read_text()) for path in sorted(archive.glob("*/*/*.json"))]


# ---------------------------------------------------------------------------- scenarios


@dataclass
class Context:
    """What a scenario needs: where to put its roots and inputs, its randomness, the shared sample archive."""

    storage: Storage
    name: str
    workdir: Path
    rng: random.Random
    archive: Path | None = None
    fault: str | None = None

    def start(self, args: list[str], fault: str | None = None) -> Running:
        """Start a floe command on this trial's root."""
        return start_floe(self.storage, self.root(), args, self.workdir, fault)

    def root(self, suffix: str = "") -> str:
        return self.storage.root(self.name + suffix)

    def create(self) -> Repository:
        return Repository.create(self.root(), self.storage.settings)

    def open(self, suffix: str = "") -> Repository:
        return Repository.open(self.root(suffix), self.storage.settings)

    def ndjson(self, label: str, items: list[dict[str, Any]]) -> str:
        return str(write_ndjson(self.workdir / f"{self.name}-{label}.ndjson", items))


class Scenario:
    """A starting state, one floe command to kill, and what must hold after the kill and after a re-run."""

    ray = False

    def __init__(self, context: Context) -> None:
        self.context = context
        self.extra: list[Running] = []
        """Commands that run beside the killed one (another writer)."""
        self.finished_beside: list[Finished] = []

    def setup(self) -> list[str]:
        """Build the starting state; return the command's arguments (after ``--root``)."""
        raise NotImplementedError

    def start_beside(self) -> None:
        """Start what runs concurrently with the command (nothing, in most scenarios)."""

    def before_command(self) -> None:
        """Note what the checks after the command compare with (before each run of it)."""

    def after_kill(self, fault: str | None) -> Findings:
        raise NotImplementedError

    def final(self, rerun: Finished) -> tuple[Findings, bool]:
        """Findings after the re-run, and whether the re-run completed the command."""
        raise NotImplementedError


def _versions(*groups: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    allowed: dict[tuple[str, str], set[str]] = {}
    for items in groups:
        for item in items:
            allowed.setdefault(key_of(item), set()).add(canonical(item))
    return allowed


class IngestScenario(Scenario):
    """``floe ingest --workers 0`` of new items into a repository that holds some already."""

    message = "crash-ingest"
    batch = 6

    def setup(self) -> list[str]:
        repository = self.context.create()
        self.before = make_items(f"{self.context.name}-p", 4)
        ingest_items(repository, [self.context.ndjson("before", self.before)], batch_size=4, message="setup")
        self.old: list[dict[str, Any]] = []
        self.new = make_items(f"{self.context.name}-n", 24)
        return ["ingest", "-w", "0", "-n", str(self.batch), "-m", self.message, self.context.ndjson("new", self.new)]

    def before_command(self) -> None:
        self.commits_before = commits_with(self.context.open(), self.message)

    def allowed_after_kill(self) -> dict[tuple[str, str], set[str]]:
        return _versions(self.before, self.old, self.new)

    def after_kill(self, fault: str | None) -> Findings:
        repository = self.context.open()
        found = check_root(repository)
        found.extend(compare_items(list(repository.view().items()), self.allowed_after_kill(), self.required()))
        found.extend(history_agrees(repository))
        if fault and not self.ray:
            found.lost.extend(self.landed_as_expected(repository, fault))
        return found

    def required(self) -> set[tuple[str, str]]:
        return {key_of(item) for item in self.before + self.old}

    def landed_as_expected(self, repository: Repository, fault: str) -> list[str]:
        """A process killed at its N-th ``commit.after_swap`` made N commits; at another commit point, fewer."""
        point, _, count = fault.partition(":")
        hits = int(count or 1)
        landed = commits_with(repository, self.message) - self.commits_before
        if point == "commit.after_swap" and landed != hits:
            return [f"killed right after commit {hits}, the branch shows {landed} of its commits"]
        if point in ("commit.after_metadata", "commit.before_swap") and landed >= hits:
            return [f"killed before commit {hits} landed, the branch shows {landed} of its commits"]
        return []

    def final_items(self) -> list[dict[str, Any]]:
        return self.before + self.new

    def final(self, rerun: Finished) -> tuple[Findings, bool]:
        repository = self.context.open()
        found = check_root(repository)
        expected = self.final_items()
        found.extend(compare_items(list(repository.view().items()), _versions(expected), set(_versions(expected))))
        found.extend(history_agrees(repository))
        return found, rerun.completed


class ReplaceScenario(IngestScenario):
    """Re-ingest changed versions of stored items (copy-on-write replacement) with some new ones."""

    message = "crash-replace"
    batch = 5

    def setup(self) -> list[str]:
        repository = self.context.create()
        self.before = make_items(f"{self.context.name}-p", 4)
        self.old = make_items(f"{self.context.name}-r", 12, version=1)
        ingest_items(repository, [self.context.ndjson("before", self.before + self.old)], batch_size=8, message="setup")
        self.new = make_items(f"{self.context.name}-r", 12, version=2) + make_items(f"{self.context.name}-n", 8)
        return ["ingest", "-w", "0", "-n", str(self.batch), "-m", self.message, self.context.ndjson("new", self.new)]


class RayScenario(IngestScenario):
    """``floe ingest --workers 1|2`` of a sample archive of COGs: arrays and rows, from Ray actors."""

    message = "crash-ray"
    ray = True

    def setup(self) -> list[str]:
        assert self.context.archive is not None
        repository = self.context.create()
        self.before = make_items(f"{self.context.name}-p", 4)
        ingest_items(repository, [self.context.ndjson("before", self.before)], batch_size=4, message="setup")
        self.old = []
        self.new = archive_items(self.context.archive)
        workers = str(self.context.rng.choice((1, 2)))
        return ["ingest", "-w", workers, "-n", "2", "-m", self.message, str(self.context.archive)]

    def final(self, rerun: Finished) -> tuple[Findings, bool]:
        found, completed = super().final(rerun)
        found.corrupt.extend(arrays_differ(self.context.open(), self.context.archive))
        return found, completed


def arrays_differ(repository: Repository, archive: Path | None) -> list[str]:
    """Granules whose stored arrays differ from the pixels of their COG."""
    import numpy as np
    import rasterio

    problems = []
    view = repository.view()
    for item in view.items():
        asset = read_arrays_asset(item)
        if asset is None or archive is None:
            continue
        tif = archive / item["collection"] / item["id"] / f"{item['id']}.tif"
        with rasterio.open(tif) as source:
            pixels = source.read()
        key = asset.variables[0]
        stored = view.item_arrays(item["collection"], item["id"], [key])[key].values
        if stored.dtype != pixels.dtype or stored.shape != pixels.shape or not np.array_equal(stored, pixels):
            problems.append(f"arrays of {item['id']} differ from {tif.name}")
    return problems


class WritersScenario(IngestScenario):
    """Two ``floe ingest --workers 0`` writers at once; the first is the one killed at a fault point."""

    message = "crash-writer-a"

    def setup(self) -> list[str]:
        repository = self.context.create()
        self.before = make_items(f"{self.context.name}-p", 4)
        ingest_items(repository, [self.context.ndjson("before", self.before)], batch_size=4, message="setup")
        self.old = []
        self.other = make_items(f"{self.context.name}-b", 18)
        self.new = make_items(f"{self.context.name}-a", 18)
        self.other_args = ["ingest", "-w", "0", "-n", "6", "-m", "crash-writer-b", self.context.ndjson("b", self.other)]
        return ["ingest", "-w", "0", "-n", "6", "-m", self.message, self.context.ndjson("a", self.new)]

    def start_beside(self) -> None:
        self.extra = [self.context.start(self.other_args)]

    def allowed_after_kill(self) -> dict[tuple[str, str], set[str]]:
        return _versions(self.before, self.new, self.other)

    def required(self) -> set[tuple[str, str]]:
        other_done = all(run.returncode == 0 for run in self.finished_beside)
        return {key_of(item) for item in self.before + (self.other if other_done else [])}

    def final_items(self) -> list[dict[str, Any]]:
        return self.before + self.new + self.other

    def rerun_beside(self) -> bool:
        """Re-run the other writer if it was killed too; whether it completed."""
        if all(run.returncode == 0 for run in self.finished_beside):
            return True
        rerun = self.context.start(self.other_args).finish()
        return rerun is not None and rerun.completed

    def final(self, rerun: Finished) -> tuple[Findings, bool]:
        other_completed = self.rerun_beside()
        found, completed = super().final(rerun)
        return found, completed and other_completed


class GcScenario(Scenario):
    """``floe gc --grace 0s`` after replacements (with snapshot expiry) or after a writer died (orphans)."""

    def setup(self) -> list[str]:
        context = self.context
        repository = context.create()
        first = make_items(f"{context.name}-g", 16, version=1)
        ingest_items(repository, [context.ndjson("v1", first)], batch_size=8, message="setup v1")
        repository.tag("before-replace")
        second = make_items(f"{context.name}-g", 8, version=2)
        ingest_items(repository, [context.ndjson("v2", second)], batch_size=4, message="setup v2")
        args = ["gc", "--grace", "0s"]
        if self.expire:
            args += ["--expire-older-than", "0s"]
        else:  # a writer that died before its commit leaves data files and a metadata.json nobody needs
            orphans = context.ndjson("orphans", make_items(f"{context.name}-o", 6))
            context.start(["ingest", "-w", "0", orphans], fault="commit.before_swap").finish()
        self.before = exports(repository)
        return args

    @property
    def expire(self) -> bool:
        if not hasattr(self, "_expire"):
            at_expiry = "gc.after_expire" in (self.context.fault or "")
            self._expire = at_expiry or self.context.rng.random() < 0.5
        return self._expire

    def unchanged(self) -> Findings:
        repository = self.context.open()
        found = check_root(repository)
        now = exports(repository)
        for ref, items in self.before.items():
            if now.get(ref) != items:
                found.lost.append(f"gc changed what {ref} shows ({len(items)} items before, {len(now.get(ref, []))})")
        return found

    def after_kill(self, fault: str | None) -> Findings:
        return self.unchanged()

    def final(self, rerun: Finished) -> tuple[Findings, bool]:
        return self.unchanged(), rerun.completed


class RefScenario(Scenario):
    """``floe tag`` or ``floe branch``: the new ref is there at the right snapshot, or not at all."""

    kind = "tag"

    def setup(self) -> list[str]:
        repository = self.context.create()
        items = make_items(f"{self.context.name}-t", 8)
        ingest_items(repository, [self.context.ndjson("items", items)], batch_size=4, message="setup")
        self.snapshot = repository.resolve("main")
        self.before = exports(repository)
        self.ref = f"{self.kind}:crash-{self.kind}"
        return [self.kind, f"crash-{self.kind}"]

    def ref_findings(self, *, required: bool) -> Findings:
        repository = self.context.open()
        found = check_root(repository)
        refs = {f"{ref.kind}:{ref.name}": ref.snapshot_id for ref in repository.refs()}
        if self.ref in refs and refs[self.ref] != self.snapshot:
            found.corrupt.append(f"{self.ref} points at {refs[self.ref]}, not {self.snapshot}")
        if required and self.ref not in refs:
            found.lost.append(f"{self.ref} is missing after the re-run")
        now = exports(repository)
        for ref, items in self.before.items():
            if now.get(ref) != items:
                found.lost.append(f"{ref} changed")
        if self.ref in now and now[self.ref] != self.before["branch:main"]:
            found.corrupt.append(f"{self.ref} does not show main's items")
        return found

    def after_kill(self, fault: str | None) -> Findings:
        return self.ref_findings(required=False)

    def final(self, rerun: Finished) -> tuple[Findings, bool]:
        # A re-run after the ref was written says it exists already: the command's work is done.
        completed = rerun.completed or "exists already" in rerun.stderr
        return self.ref_findings(required=True), completed


class BranchScenario(RefScenario):
    kind = "branch"


class ReplicateScenario(Scenario):
    """``floe replicate`` to a fresh target, or to one replicated before and behind the source."""

    def setup(self) -> list[str]:
        context = self.context
        source = context.create()
        ingest_items(source, [context.ndjson("one", make_items(f"{context.name}-s", 12))], batch_size=6, message="one")
        source.tag("v1")
        self.previous: dict[str, list[str]] | None = None
        if context.rng.random() < 0.5:
            replicate(context.root(), context.root("-replica"), context.storage.settings)
            self.previous = exports(source)
            more = make_items(f"{context.name}-m", 8)
            ingest_items(source, [context.ndjson("two", more)], batch_size=4, message="two")
            source.branch("later")
        self.now = exports(source)
        return ["replicate", context.root(), context.root("-replica")]

    def target(self) -> Repository | None:
        from ingest.errors import RepositoryNotFound

        try:
            return self.context.open("-replica")
        except RepositoryNotFound:
            return None

    def after_kill(self, fault: str | None) -> Findings:
        source = self.context.open()
        found = check_root(source)
        if exports(source) != self.now:
            found.lost.append("replicate changed its source")
        target = self.target()
        if target is None:
            if self.previous is not None:
                found.lost.append("the earlier replica is gone")
            return found
        found.extend(check_root(target))
        if exports(target) not in (self.previous, self.now):
            found.corrupt.append("the target shows neither the earlier replica nor the source")
        return found

    def final(self, rerun: Finished) -> tuple[Findings, bool]:
        found = Findings()
        target = self.target()
        if target is None:
            found.lost.append("no replica after the re-run")
            return found, False
        found.extend(check_root(target))
        if exports(target) != self.now:
            found.lost.append("the replica does not export what the source does")
        return found, rerun.completed


SCENARIOS: dict[str, type[Scenario]] = {
    "ingest": IngestScenario,
    "ingest-ray": RayScenario,
    "writers": WritersScenario,
    "replace": ReplaceScenario,
    "gc": GcScenario,
    "tag": RefScenario,
    "branch": BranchScenario,
    "replicate": ReplicateScenario,
}


# ---------------------------------------------------------------------------- one trial


@dataclass
class TrialResult:
    """One trial's outcome: the kill, then what the checks after it and after the re-run found."""

    storage: str
    scenario: str
    kill: str
    """``fault`` (at a named point) or ``delay`` (SIGKILL from outside)."""
    point: str | None
    killed: bool
    after_kill: Findings
    final: Findings
    rerun_completed: bool
    seconds: float
    command_seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return self.after_kill.clean and self.final.clean and self.rerun_completed


def run_trial(
    storage: Storage,
    scenario_name: str,
    workdir: Path,
    *,
    name: str,
    seed: int,
    faults: Sequence[str] = (),
    delay: float | None = None,
    archive: Path | None = None,
) -> TrialResult:
    """One trial: set up; run the command and kill it (at each of ``faults`` in turn, or ``delay`` seconds in),
    checking after each kill; re-run it to completion; check.
    """
    assert bool(faults) != (delay is not None), "a trial kills at fault points or after a delay"
    started = time.monotonic()
    context = Context(storage, name, workdir, random.Random(seed), archive, ",".join(faults) or None)
    scenario = SCENARIOS[scenario_name](context)
    args = scenario.setup()
    after_kill, notes, killed = Findings(), [], True
    for fault in faults or [None]:
        scenario.before_command()
        finished, killed_now = _run_and_kill(scenario, args, fault, delay)
        killed = killed and killed_now
        if fault is not None and not finished.completed and finished.returncode != -signal.SIGKILL:
            # A fault in a Ray actor kills the actor; its driver then fails: say how, to tell it from a real failure.
            notes.append(f"driver exit {finished.returncode}: {finished.stderr.strip().splitlines()[-1:]}")
        after_kill.extend(_guarded(scenario.after_kill, fault if killed_now else None))
    scenario.before_command()
    rerun = context.start(args).finish()
    if rerun is None:
        raise TimeoutError(f"floe {' '.join(args)} did not finish in {COMMAND_TIMEOUT} s")
    try:
        final, completed = scenario.final(rerun)
    except Exception as error:  # a root the checks cannot even read is a finding
        final, completed = Findings(corrupt=[f"reading the root failed: {error!r}"[:500]]), rerun.completed
    if not completed:
        notes.append(f"re-run exit {rerun.returncode}: {rerun.stderr.strip()[-600:]}")
    return TrialResult(
        storage.kind,
        scenario_name,
        "fault" if faults else "delay",
        ",".join(faults) or None,
        killed,
        after_kill,
        final,
        completed,
        time.monotonic() - started,
        rerun.seconds,
        notes,
    )


def _guarded(checks: Callable[[str | None], Findings], fault: str | None) -> Findings:
    """The findings of ``checks(fault)``; a root the checks cannot even read is a finding too."""
    try:
        return checks(fault)
    except Exception as error:
        return Findings(corrupt=[f"reading the root failed: {error!r}"[:500]])


def _run_and_kill(scenario: Scenario, args: list[str], fault: str | None, delay: float | None) -> tuple[Finished, bool]:
    """Run the command (and what runs beside it) until the fault kills it or the delay is up; whether it died."""
    running = scenario.context.start(args, fault)
    scenario.start_beside()
    finished = running.finish(timeout=delay) if delay is not None else running.finish()
    if finished is None:
        finished = running.kill()
        scenario.finished_beside = [other.kill() for other in scenario.extra]
        return finished, True
    scenario.finished_beside = [other.finish() or other.kill() for other in scenario.extra]
    return finished, fault is not None and not finished.completed
