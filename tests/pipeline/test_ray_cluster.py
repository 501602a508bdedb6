"""The Ray clusters floe runs on: the local one it starts (workers preloaded) and one it joins (``--ray-address``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ingest import Repository
from ingest.sample import make_archive
from tests._fresh import last_json_line
from tests.conftest import REAL_ITEMS

REPO_ROOT = Path(__file__).resolve().parents[2]

# A process that owns a local cluster (loopback only, as floe starts it), prints its address, waits for a line
# on stdin, then prints the class names of every actor the cluster ran, and shuts the cluster down on exit.
CLUSTER_OWNER = textwrap.dedent(
    """
    import json, sys
    import ray
    from ingest.pipeline import start_ray

    start_ray(2)
    print(ray.get_runtime_context().gcs_address, flush=True)
    sys.stdin.readline()
    from ray._private import state

    actors = state.actors()
    print(json.dumps(sorted(info["ActorClassName"] for info in actors.values())), flush=True)
    ray.shutdown()
    """
)


@pytest.mark.slow
def test_ingest_joins_an_existing_cluster(tmp_path):
    archive = tmp_path / "archive"
    make_archive(archive, granules=6, seed=3)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    owner = subprocess.Popen(
        [sys.executable, "-c", CLUSTER_OWNER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**env, "RAY_AUTH_MODE": "token"},  # Ray's default for a new local cluster, made explicit
        cwd=REPO_ROOT,
    )
    try:
        address = owner.stdout.readline().strip()
        assert address.startswith("127.0.0.1:"), address
        root = tmp_path / "repo"
        command = [sys.executable, "-m", "ingest.cli", "--root", str(root), "ingest", str(archive)]
        command += ["--workers", "2", "--ray-address", address]

        def ingest(**extra_env: str) -> subprocess.CompletedProcess:
            run_env = {**env, "RAY_gcs_rpc_server_connect_timeout_s": "3", **extra_env}
            return subprocess.run(
                command, capture_output=True, text=True, env=run_env, cwd=REPO_ROOT, timeout=300, check=False
            )

        # Ray starts a local cluster with token authentication and sends the token only to clusters it finds
        # itself, never to a given address: without RAY_AUTH_MODE=token the join fails, with one clear line.
        refused = ingest(RAY_AUTH_MODE="disabled")
        assert refused.returncode == 1
        assert f"the Ray cluster at {address} requires token authentication" in refused.stderr
        assert "Traceback" not in refused.stderr
        # Items alone need no actor, but a cluster named on purpose is joined before anything is read: the
        # same refusal, and nothing committed.
        alone_root = tmp_path / "alone"
        alone_command = [sys.executable, "-m", "ingest.cli", "--root", str(alone_root), "ingest", str(REAL_ITEMS)]
        alone = subprocess.run(
            [*alone_command, "--workers", "2", "--ray-address", address],
            capture_output=True,
            text=True,
            env={**env, "RAY_gcs_rpc_server_connect_timeout_s": "3", "RAY_AUTH_MODE": "disabled"},
            cwd=REPO_ROOT,
            timeout=300,
            check=False,
        )
        assert alone.returncode == 1, alone.stderr
        assert f"the Ray cluster at {address} requires token authentication" in alone.stderr
        assert list(Repository.open(str(alone_root)).view().items()) == []
        done = ingest(RAY_AUTH_MODE="token")
        assert done.returncode == 0, done.stderr
        owner.stdin.write("\n")
        owner.stdin.flush()
        actors = json.loads(owner.stdout.readline())
        # The cluster outlived the ingest (which did not start it, so does not stop it), and the ingest's two
        # actors ran on it, not on a cluster of its own.
        assert actors.count("GranuleWriter") == 2, actors
        rows = list(Repository.open(str(root)).view().items())
        assert sorted(item["id"] for item in rows) == sorted(
            json.loads(path.read_text())["id"] for path in archive.glob("*/*/*.json")
        )
    finally:
        if owner.poll() is None:
            owner.stdin.close()
        try:
            owner.wait(timeout=60)
        except subprocess.TimeoutExpired:
            owner.kill()
            owner.wait()


# A fresh process starts floe's local cluster and reports what a worker had imported before its actor ran
# (the actor class is defined here, so deserialising it imports nothing of floe), and the niceness of the actor
# and of the driver.
PRELOAD_PROBE = textwrap.dedent(
    """
    import json, os, sys
    import ray
    from ingest.pipeline import start_ray

    start_ray(1)

    @ray.remote(num_cpus=1)
    class Probe:
        def __init__(self):
            self.loaded = sorted(name for name in ("ingest.pipeline._ray", "ingest.rasters") if name in sys.modules)

        def report(self):
            return {"loaded": self.loaded, "nice": os.nice(0)}

    print(json.dumps({**ray.get(Probe.remote().report.remote()), "driver": os.nice(0)}), flush=True)
    ray.shutdown()
    """
)


@pytest.mark.slow
def test_local_cluster_workers_import_floe_before_actors_start_and_run_at_the_driver_priority():
    """A fresh process, so the cluster is the one start_ray makes. Ray's default worker niceness (15) starved
    ingest actors next to any other work: 16-55 s for a 0.6 s batch."""
    report = last_json_line(PRELOAD_PROBE)
    assert report["loaded"] == ["ingest.pipeline._ray", "ingest.rasters"]
    assert report["nice"] == report["driver"]


# A plain process commits a batch through the actors' class directly, as a library user (or a test) may.
PLAIN_WRITER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from ingest import Repository, Settings
    from ingest.pipeline import granule_from_item
    from ingest.pipeline._ray import GranuleWriter
    from ingest.sample import make_archive

    work = Path(sys.argv[1])
    Repository.create(work / "repo", Settings())
    items = make_archive(work / "archive", granules=1, seed=5)
    granules = [granule_from_item(json.loads(path.read_text()), str(path), path) for path in items]
    outcome = GranuleWriter(str(work / "repo"), Settings().model_dump(), "main").ingest(granules, "one")
    import ray

    print(json.dumps({"committed": outcome.commit is not None, "ray": ray.is_initialized(), "node": outcome.node}))
    """
)


@pytest.mark.slow
def test_the_actors_writer_used_outside_ray_starts_no_cluster(tmp_path):
    assert last_json_line(PLAIN_WRITER, str(tmp_path)) == {"committed": True, "ray": False, "node": None}
