"""Uncoordinated writers in separate OS processes, on local disk and on a real S3 server.

Invariants checked afterwards: the branch history is linear and holds every
commit; at every snapshot the table holds exactly the rows of that snapshot's
ancestry (none lost, none twice) and the arrays of those commits; every tag
taken during the run shows exactly the moment it was taken.
"""

from __future__ import annotations

import itertools
import multiprocessing
import time
from collections import Counter
from typing import Any

import pyarrow.parquet as pq
import pytest
import zarr

from ingest import Repository, Settings
from tests.repository._writers import commit_worker

WRITERS = 4
COMMITS = 25
ROWS = 10


def run_writers(root: str, settings: Settings) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Run the writer processes; meanwhile take tags of the tip. Returns commits and {tag: snapshot}."""
    repository = Repository.open(root, settings)
    repository.ensure_groups(["c"])
    context = multiprocessing.get_context("spawn")
    start_at = time.time() + 4.0  # every child is up before the first commit
    tags: dict[str, str] = {}
    with context.Pool(WRITERS) as pool:
        pending = pool.starmap_async(
            commit_worker, [(root, settings.model_dump(), worker, COMMITS, ROWS, start_at) for worker in range(WRITERS)]
        )
        while not pending.ready():
            time.sleep(1.0)
            if time.time() > start_at and len(tags) < 8:
                name = f"t{len(tags)}"
                tags[name] = repository.tag(name, "main")
        results = pending.get(timeout=600)
    return [commit for worker in results for commit in worker], tags


_FILE_IDS: dict[str, list[str]] = {}


def ids_in(repository: Repository, path: str) -> list[str]:
    if path not in _FILE_IDS:
        with repository.io.new_input(path).open() as stream:
            _FILE_IDS[path] = pq.read_table(stream, columns=["id"]).column("id").to_pylist()
    return _FILE_IDS[path]


def verify(root: str, settings: Settings, commits: list[dict[str, Any]], tags: dict[str, str]) -> None:
    repository = Repository.open(root, settings)
    history = list(repository.icechunk.ancestry(branch="main"))
    # Linear: each snapshot's parent is the next one down.
    for newer, older in itertools.pairwise(history):
        assert newer.parent_id == older.id
    by_snapshot = {commit["snapshot_id"]: commit for commit in commits}
    assert len(by_snapshot) == WRITERS * COMMITS, "two writers reported the same snapshot"
    assert set(by_snapshot) <= {info.id for info in history}, "a commit a writer saw succeed is not in the history"
    assert any(commit["attempts"] > 1 for commit in commits), "no race happened: the test proved nothing"

    expected_ids: Counter[str] = Counter()
    expected_groups: set[str] = set()
    expected_at: dict[str, tuple[Counter[str], set[str]]] = {}
    for info in reversed(history):
        commit = by_snapshot.get(info.id)
        if commit is not None:
            expected_ids.update(commit["ids"])
            expected_groups.add(commit["group"])
        expected_at[info.id] = (Counter(expected_ids), set(expected_groups))

    for info in history:
        if "floe" not in (info.metadata or {}):
            continue
        ids, groups = expected_at[info.id]
        view = repository.view(info.id)
        # Plan the snapshot's scan through Iceberg; data files are immutable, so each is read once.
        found = Counter()
        for task in view.table.scan().plan_files():
            found.update(ids_in(repository, task.file.file_path))
        assert found == ids, f"table at {info.id} ({info.message}) differs from its ancestry"
        if groups:
            assert set(view.arrays("c").group_keys()) == groups, f"arrays at {info.id} differ from its ancestry"

    tip = repository.view("main")
    for commit in commits:
        band = zarr.open_array(tip.session.store, path=f"c/{commit['group']}/band", mode="r")
        assert (band[:] == commit["value"]).all()

    assert tags, "no tag was taken during the run"
    for name, snapshot_id in tags.items():
        assert repository.resolve(f"tag:{name}") == snapshot_id
        ids, _ = expected_at[snapshot_id]
        found = Counter(i["id"] for i in repository.view(f"tag:{name}").items())
        assert found == ids, f"tag {name} does not show exactly its moment"


@pytest.mark.slow
def test_uncoordinated_writers_local(tmp_path):
    settings = Settings()
    root = str(tmp_path / "repo")
    Repository.create(root, settings)
    commits, tags = run_writers(root, settings)
    verify(root, settings, commits, tags)


@pytest.mark.slow
@pytest.mark.s3
def test_uncoordinated_writers_s3(s3_root, s3_settings):
    Repository.create(s3_root, s3_settings)
    commits, tags = run_writers(s3_root, s3_settings)
    verify(s3_root, s3_settings, commits, tags)
