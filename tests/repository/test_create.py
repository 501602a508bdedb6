"""Creating a repository: one S3 configuration for every client, one-line failures that write nothing, and a
creation that stopped half-way completed by ``floe init`` (or replaced with ``--force``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import icechunk
import pytest

from ingest import Repository, Settings
from ingest.errors import RepositoryExists, RepositoryNotFound
from ingest.repository import _repo
from ingest.storage import Location
from tests.api._servers import FloeServer
from tests.conftest import free_port, make_item

WORKTREE = Path(__file__).resolve().parents[2]


def aws_environment(moto_server, **extra: str) -> dict[str, str]:
    """This process's environment without any FLOE_* or AWS_* variable, then moto's as ``AWS_*`` alone."""
    kept = {name: value for name, value in os.environ.items() if not name.startswith(("FLOE_", "AWS_"))}
    return {
        **kept,
        "AWS_ENDPOINT_URL": moto_server.endpoint,
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        **extra,
    }


def floe(root: str, env: dict[str, str], *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ingest.cli", "--root", root, *arguments],
        cwd=WORKTREE,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """The error a command that failed printed: one line, however the terminal is, and no traceback."""
    assert done.returncode == 1, (done.returncode, done.stderr[-3000:])
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    text = " ".join(done.stderr.split())  # rich wraps lines at the console's width
    assert text.startswith("error:"), text
    return text


def test_the_aws_environment_alone_serves_every_command(moto_server, tmp_path):
    env = aws_environment(moto_server)
    root = f"s3://{moto_server.create_bucket()}/archive"
    source = tmp_path / "items.ndjson"
    source.write_text(
        "".join(json.dumps(make_item(f"i{n}", when=f"2024-01-0{n + 1}T00:00:00Z")) + "\n" for n in range(3))
    )

    assert floe(root, env, "init").returncode == 0
    ingested = floe(root, env, "ingest", str(source), "--workers", "0")
    assert ingested.returncode == 0, ingested.stderr[-3000:]
    found = floe(root, env, "search", "--ids", "i1,i2")
    assert found.returncode == 0, found.stderr[-3000:]
    assert sorted(json.loads(line)["id"] for line in found.stdout.splitlines()) == ["i1", "i2"]
    checked = floe(root, env, "check", "--deep")
    assert checked.returncode == 0 and "ok:" in checked.stderr, checked.stderr[-3000:]
    assert floe(root, env, "gc", "--grace", "0s").returncode == 0

    server = FloeServer(root, env=env, log_dir=tmp_path)
    try:
        with urllib.request.urlopen(f"{server.url}/search?ids=i0", timeout=60) as answer:
            assert [feature["id"] for feature in json.loads(answer.read())["features"]] == ["i0"]
    finally:
        server.stop()


def test_an_unreachable_store_is_one_line_and_writes_nothing(moto_server):
    env = aws_environment(moto_server)
    missing = one_line_error(floe("s3://no-such-bucket/archive", env, "init"))
    assert "cannot reach s3://no-such-bucket/archive" in missing and "bucket 'no-such-bucket' does not exist" in missing

    bucket = moto_server.create_bucket()
    closed = f"http://127.0.0.1:{free_port()}"
    refused = one_line_error(floe(f"s3://{bucket}/archive", {**env, "AWS_ENDPOINT_URL": closed}, "init"))
    assert f"cannot reach s3://{bucket}/archive (endpoint {closed})" in refused

    plain = one_line_error(floe(f"s3://{bucket}/archive", {**env, "AWS_ALLOW_HTTP": "false"}, "init"))
    assert "is plain HTTP: set AWS_ALLOW_HTTP=true" in plain

    # None of the three wrote an object, so the root is still free for a creation that works.
    assert floe(f"s3://{bucket}/archive", env, "init").returncode == 0


def test_a_creation_killed_after_icechunk_is_completed_by_init(moto_server):
    env = aws_environment(moto_server)
    root = f"s3://{moto_server.create_bucket()}/archive"
    killed = floe(root, {**env, "FLOE_FAULT": "create.before_first_commit"}, "init")
    assert killed.returncode == -signal.SIGKILL

    # check and init agree on what to do: init completes it.
    advice = one_line_error(floe(root, env, "check"))
    assert "`floe init` completes it" in advice
    completed = floe(root, env, "init")
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "created a floe repository" in completed.stderr
    assert floe(root, env, "check").returncode == 0
    again = one_line_error(floe(root, env, "init"))
    assert "a repository exists already" in again


def test_an_ingest_completes_a_stopped_creation_too(moto_server, tmp_path):
    env = aws_environment(moto_server)
    root = f"s3://{moto_server.create_bucket()}/archive"
    assert floe(root, {**env, "FLOE_FAULT": "create.before_first_commit"}, "init").returncode == -signal.SIGKILL
    source = tmp_path / "one.ndjson"
    source.write_text(json.dumps(make_item("only")) + "\n")
    ingested = floe(root, env, "ingest", str(source), "--workers", "0")
    assert ingested.returncode == 0, ingested.stderr[-3000:]
    assert [line for line in floe(root, env, "search").stdout.splitlines() if '"only"' in line]


def half_made(root: Path) -> None:
    """What a creation leaves when it stops before floe's first commit: Icechunk's repository alone."""
    icechunk.Repository.create(Location.parse(root).icechunk_storage())


def test_force_replaces_a_half_made_repository_never_a_complete_one(tmp_path):
    root = tmp_path / "repo"
    half_made(root)
    stray = root / "tables" / "items" / "data" / "stray.parquet"
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"left by the creation that stopped")
    with pytest.raises(RepositoryNotFound, match="`floe init` completes it"):
        Repository.open(root)

    repository = Repository.create(root, force=True)
    assert not stray.exists()
    assert [entry.message for entry in repository.log()] == ["floe: initialize repository"]

    writer = repository.writer()
    writer.add_item(make_item("kept"))
    writer.commit("one item")
    with pytest.raises(RepositoryExists):
        Repository.create(root, force=True)
    assert [item["id"] for item in Repository.open(root).view().items()] == ["kept"]


def test_two_processes_completing_one_creation_make_one_first_version(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    half_made(root)
    completing = _repo.fault_point

    def other_process_completes_first(name: str) -> None:
        # Forced interleaving: another creator completes the repository between this one's look and its commit.
        monkeypatch.setattr(_repo, "fault_point", completing)
        Repository.create(root)

    monkeypatch.setattr(_repo, "fault_point", other_process_completes_first)
    with pytest.raises(RepositoryExists):
        Repository.create(root)
    repository = Repository.open(root)
    assert [entry.message for entry in repository.log()] == ["floe: initialize repository"]
    assert Repository.open_or_create(root, Settings()).resolve() == repository.resolve()
