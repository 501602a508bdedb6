"""Safe defaults: `floe serve` and the local Ray cluster listen on loopback only; the API never writes; sizes bounded.

What listens where is read from the operating system (psutil's listening
sockets of the processes), not from floe's own idea of it.
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from ingest import Repository, Settings
from ingest.api import MAX_LIMIT
from tests.api._servers import WORKTREE
from tests.conftest import free_port, make_item

LOOPBACK = ("127.", "::1", "::ffff:127.")


def _listening(process: psutil.Process) -> set[tuple[str, int]]:
    """The (address, port) pairs a process listens on."""
    try:
        connections = process.net_connections(kind="inet")
    except psutil.Error:
        return set()
    return {(c.laddr.ip, c.laddr.port) for c in connections if c.status == psutil.CONN_LISTEN}


def _is_loopback(address: str) -> bool:
    return address.startswith(LOOPBACK)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("defaults") / "repo"
    repository = Repository.create(path, Settings())
    writer = repository.writer()
    writer.add_items([make_item(f"i-{n}", "c") for n in range(12)])
    writer.commit("twelve")
    return path


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def served(root: Path) -> Iterator[Served]:
    """`floe serve` as a user types it (no --host), with small limits: 5 items a page, 4 KiB bodies."""
    port = free_port()
    command = [sys.executable, "-m", "ingest.cli", "--root", str(root), "serve", "--port", str(port)]
    environment = {**os.environ, "FLOE_API__MAX_LIMIT": "5", "FLOE_API__MAX_BODY_BYTES": "4096"}
    process = subprocess.Popen(
        command, cwd=WORKTREE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=environment
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/conformance", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("floe serve did not start") from None
                time.sleep(0.2)
        yield Served(process, port)
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            process.wait(timeout=15)


def test_serve_defaults_to_loopback_everywhere_it_is_configured() -> None:
    from ingest.api import serve, serve_command
    from ingest.cli._api import serve as serve_cli

    assert Settings().api.host == "127.0.0.1"
    assert inspect.signature(serve).parameters["host"].default == "127.0.0.1"
    assert inspect.signature(serve_command).parameters["host"].default == "127.0.0.1"
    # The CLI option has no default of its own: it falls back to the settings' host.
    assert inspect.signature(serve_cli).parameters["host"].default is None


@pytest.mark.slow
def test_floe_serve_without_host_listens_on_loopback_only(served: Served) -> None:
    sockets = _listening(psutil.Process(served.process.pid))
    assert ("127.0.0.1", served.port) in sockets, sockets
    assert all(_is_loopback(address) for address, _ in sockets), sockets


def test_the_local_ray_cluster_listens_on_loopback_only(ray_cluster: None) -> None:
    import ray

    assert ray.util.get_node_ip_address() == "127.0.0.1"
    assert {node["NodeManagerAddress"] for node in ray.nodes()} == {"127.0.0.1"}
    assert ray.get_runtime_context().gcs_address.startswith("127.0.0.1:")
    # Every process Ray started for this session (GCS, raylet, workers, agents) is a child of this one: none of
    # them may listen beyond loopback (the other children, floe serve and moto, listen on 127.0.0.1 as well).
    children = psutil.Process().children(recursive=True)
    ray_processes = [child for child in children if _name(child).startswith(("gcs_server", "raylet", "ray::"))]
    assert any(_name(child).startswith("gcs_server") for child in ray_processes), [_name(c) for c in children]
    sockets = {(_name(child), *address) for child in children for address in _listening(child)}
    assert any(name.startswith("gcs_server") for name, _, _ in sockets), sockets
    assert all(_is_loopback(address) for _, address, _ in sockets), sockets


def _name(process: psutil.Process) -> str:
    try:
        return process.name()
    except psutil.Error:
        return ""


def _status(server: Served, method: str, path: str, body: bytes | None = None) -> int:
    request = urllib.request.Request(
        server.url + path, data=body, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


WRITES = [
    ("POST", "/collections"),
    ("PUT", "/collections/c"),
    ("PATCH", "/collections/c"),
    ("DELETE", "/collections/c"),
    ("POST", "/collections/c/items"),
    ("PUT", "/collections/c/items/i-1"),
    ("PATCH", "/collections/c/items/i-1"),
    ("DELETE", "/collections/c/items/i-1"),
    ("DELETE", "/collections/c/items"),
    ("POST", "/collections/new/items"),
    ("PUT", "/search"),
    ("DELETE", "/search"),
]


def test_the_api_is_read_only(root: Path, served: Served) -> None:
    repository = Repository.open(root, Settings())
    tip, refs = repository.resolve("main"), repository.refs()
    item = make_item("i-1", "c", cloud=5.0)
    collection = {"type": "Collection", "id": "new", "description": "x", "license": "CC0-1.0", "links": []}
    for prefix in ("", "/refs/main"):
        for method, path in WRITES:
            body = json.dumps(collection if path == "/collections" else item).encode() if method != "DELETE" else None
            status = _status(served, method, prefix + path, body)
            assert status in (404, 405), (method, prefix + path, status)
    reopened = Repository.open(root, Settings())
    assert reopened.resolve("main") == tip
    assert reopened.refs() == refs
    assert sorted(entry.snapshot_id for entry in reopened.log("main")) == sorted(
        entry.snapshot_id for entry in repository.log("main")
    )


def test_pages_and_bodies_are_bounded(served: Served) -> None:
    assert Settings().api.max_limit == MAX_LIMIT == 10_000
    assert Settings().api.max_body_bytes == 4 * 1024 * 1024
    # A page never holds more than the maximum, however many are asked for (OGC: clamped, not an error).
    page = json.load(urllib.request.urlopen(f"{served.url}/search?limit=1000000000", timeout=60))
    assert len(page["features"]) == 5
    assert any(link["rel"] == "next" for link in page["links"])
    # A body beyond the configured maximum is refused before it is parsed.
    big = json.dumps({"ids": [f"x{n}" for n in range(1000)]}).encode()
    assert len(big) > 4096
    assert _status(served, "POST", "/search", big) == 413
    assert _status(served, "POST", "/search", b'{"limit": 3}') == 200
