"""A Ray cluster of two nodes: `floe ingest --ray-address` spreads granules, and a metadata backfill's parts, over
both.

The nodes are a head and a worker started with Ray's own `ray start` command
on this machine, both on 127.0.0.1 (through tests/_ray_node.py, which keeps
Ray from swapping 127.0.0.1 for the machine's address), each with one CPU,
so each of the run's two actors sits on its own node. They keep their files
in a temporary folder of their own, so no other Ray on the machine finds
them. The repository and the rasters are on a moto S3 server: a worker node
reaches both as a machine of a real cluster would, through S3. Each node is
stopped by its own process group (never `ray stop`, which would stop every
Ray on the machine).
"""

from __future__ import annotations

import io
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingest import Repository, Settings
from ingest.config import RemoteSettings
from ingest.export import export_ndjson
from ingest.pipeline import ingest_items
from ingest.pipeline.sources import SourceOptions
from ingest.sample import make_archive
from tests.api._servers import FloeServer
from tests.conftest import MotoServer, free_port
from tests.pipeline._backfill_sources import DAY, day_items, write_day, write_sources
from tests.pipeline._remote_archive import assert_arrays_equal_the_files, upload

REPO_ROOT = Path(__file__).resolve().parents[2]
GRANULES = 12

NODES_ALIVE = textwrap.dedent(
    """
    import sys, ray
    ray.init(address=sys.argv[1], log_to_driver=False)
    print(sum(1 for node in ray.nodes() if node["Alive"]), flush=True)
    """
)


def _start_node(arguments: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("w") as stream:
        return subprocess.Popen(
            [
                *(sys.executable, "-m", "tests._ray_node", "--block", "--node-ip-address=127.0.0.1", "--num-cpus=1"),
                f"--dashboard-agent-listen-port={free_port()}",
                *arguments,
            ],
            env=env,
            cwd=REPO_ROOT,
            stdout=stream,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped, with everything it started, by its pid
        )


def _stop_node(node: subprocess.Popen) -> None:
    """SIGTERM to the node's process group, then SIGKILL to what is left of it (its GCS outlives a SIGTERM)."""
    for sent, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 30)):
        try:
            os.killpg(node.pid, sent)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            # The leader reaped once it exits: a zombie still counts as a member of its group (and the group would
            # look alive for the whole grace, 80 s a test).
            node.poll()
            try:
                os.killpg(node.pid, 0)
            except ProcessLookupError:
                node.wait(timeout=5)
                return
            time.sleep(0.2)
    node.wait(timeout=5)


def _s3_environment(moto_server: MotoServer) -> dict[str, str]:
    settings = moto_server.s3_settings()
    return {
        "FLOE_S3__ENDPOINT_URL": settings.endpoint_url,
        "FLOE_S3__REGION": settings.region,
        "FLOE_S3__ACCESS_KEY_ID": settings.access_key_id,
        "FLOE_S3__SECRET_ACCESS_KEY": settings.secret_access_key,
        "FLOE_S3__ALLOW_HTTP": "true",
        "FLOE_S3__FORCE_PATH_STYLE": "true",
    }


@pytest.fixture
def two_nodes(tmp_path) -> Iterator[tuple[str, dict[str, str]]]:
    """A head and a worker node on 127.0.0.1 with token authentication; yields the address and the environment
    that reaches them."""
    port = free_port()
    common = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
    }
    # The nodes: Ray refuses to add a node while its loopback switch is on (tests/_ray_node.py keeps them on
    # 127.0.0.1 instead). The clients (probe, ingest): with the switch on, they reach 127.0.0.1 as given.
    nodes = {key: value for key, value in common.items() if key != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    clients = {**common, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    address = f"127.0.0.1:{port}"
    # A short folder of its own (Ray's socket paths must stay short): no other Ray on the machine finds this one.
    temp_dir = Path(tempfile.mkdtemp(prefix="floe-ray-", dir="/tmp"))
    head = _start_node(
        ["--head", f"--port={port}", "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp_dir}"],
        nodes,
        tmp_path / "head.log",
    )
    worker = None
    try:
        worker = _start_node([f"--address={address}"], nodes, tmp_path / "worker.log")
        deadline = time.monotonic() + 120
        alive = 0
        while alive < 2:
            if time.monotonic() > deadline or head.poll() is not None or worker.poll() is not None:
                logs = "\n".join(path.read_text()[-2000:] for path in (tmp_path / "head.log", tmp_path / "worker.log"))
                pytest.fail(f"the two Ray nodes did not come up ({alive} alive):\n{logs}")
            probe = subprocess.run(
                [sys.executable, "-c", NODES_ALIVE, address],
                capture_output=True,
                text=True,
                env=clients,
                timeout=120,
                check=False,
            )
            alive = int(probe.stdout.strip().splitlines()[-1]) if probe.returncode == 0 and probe.stdout.strip() else 0
            if alive < 2:
                time.sleep(1)
        yield address, clients
    finally:
        for node in (worker, head):
            if node is not None:
                _stop_node(node)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_granules_are_ingested_by_actors_on_both_nodes(tmp_path, two_nodes, moto_server):
    address, env = two_nodes
    archive = tmp_path / "archive"
    item_files = make_archive(archive, granules=GRANULES, seed=9)
    bucket, url = upload(moto_server, archive)
    root = f"s3://{bucket}/repo"
    report_path = tmp_path / "report.jsonl"
    command = [sys.executable, "-m", "ingest.cli", "--root", root, "ingest", url, "--remote-assets"]
    command += ["--workers", "2", "--batch-size", "2", "--ray-address", address, "--report", str(report_path)]

    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env={**env, **_s3_environment(moto_server)},
        cwd=REPO_ROOT,
        timeout=600,
        check=False,
    )

    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in report_path.read_text().splitlines()]
    committed = [line for line in lines if line["outcome"] == "committed"]
    assert [line for line in lines if line["outcome"] != "committed"] == []
    # Every item once, and the actors of both nodes wrote some.
    expected = sorted(json.loads(path.read_text())["id"] for path in item_files)
    assert sorted(line["id"] for line in committed) == expected
    nodes = {line["node"] for line in committed}
    assert len(nodes) == 2, nodes
    repository = Repository.open(root, Settings(s3=moto_server.s3_settings()))
    assert {line["snapshot"] for line in committed} <= {entry.snapshot_id for entry in repository.log()}
    assert_arrays_equal_the_files(repository, archive, item_files, f"s3://{bucket}/archive/")


def test_a_metadata_backfill_spreads_its_parts_over_both_nodes(tmp_path, two_nodes, moto_server):
    """`--assets none` with `--ray-address`: the actors of both nodes read parts of the files on S3 (byte ranges of
    NDJSON, runs of rows of stac-geoparquet) and the time lanes of a STAC API search (a real ``floe serve``), and
    commit them; the export equals one process reading the files whole and the search in the same lanes."""
    address, env = two_nodes
    write_sources(tmp_path / "sources")
    bucket, url = upload(moto_server, tmp_path / "sources")
    api = Repository.create(tmp_path / "api")
    assert not ingest_items(api, [write_day(tmp_path / "day.ndjson")]).rejected
    server = FloeServer(tmp_path / "api", log_dir=tmp_path)
    try:
        search = f"{server.url}/search?collections=t&datetime={DAY}"
        root = f"s3://{bucket}/repo"
        report_path = tmp_path / "report.jsonl"
        command = [sys.executable, "-m", "ingest.cli", "--root", root, "ingest", url, search, "--assets", "none"]
        command += ["--workers", "2", "--batch-size", "100", "--ray-address", address, "--report", str(report_path)]
        lanes = {"FLOE_REMOTE__SEARCH_LANES": "4"}  # the API is on this machine: unset, one process would read it
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            env={**env, **_s3_environment(moto_server), "FLOE_PART_MB": str(48 / 1024), **lanes},
            cwd=REPO_ROOT,
            timeout=600,
            check=False,
        )

        # Exit 3: the two bad lines are rejected, by their lines in the file, as one reader rejects them.
        assert done.returncode == 3, done.stderr[-3000:]
        settings = Settings(s3=moto_server.s3_settings())
        alone = Repository.create(tmp_path / "alone", settings)
        options = SourceOptions(s3=moto_server.s3_settings(), remote=RemoteSettings(search_lanes=4))
        expected = ingest_items(alone, [url, search], batch_size=100, options=options)
    finally:
        server.stop()
    lines = [json.loads(line) for line in report_path.read_text().splitlines()]
    rejected = [(line["source"], line["reason"]) for line in lines if line["outcome"] == "rejected"]
    assert rejected == [(rejection.source, rejection.reason) for rejection in expected.rejected[:2]]
    committed = [line for line in lines if line["outcome"] == "committed"]
    assert len({line["node"] for line in committed}) == 2
    assert len({line["snapshot"] for line in committed}) > 4
    lanes_read = {line["source"].split("#")[0] for line in committed if line["source"].startswith(server.url)}
    assert len(lanes_read) == 4, lanes_read
    spread = Repository.open(root, settings)
    assert _exported(spread) == _exported(alone)
    assert len([item for item in spread.view("main").items() if item["collection"] == "t"]) == len(day_items())
    assert spread.source_cursors("branch:main") == alone.source_cursors("branch:main") != {}


def _exported(repository: Repository) -> list[str]:
    stream = io.StringIO()
    export_ndjson(repository.view("main"), stream)
    return sorted(stream.getvalue().splitlines())
