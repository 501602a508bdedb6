"""schemathesis against floe's own OpenAPI document, at the root and at ``/refs/{tag}/`` and ``/refs/{snapshot}/``.

Every generated request (valid and invalid: wrong types, bodies that are
booleans, bytes or floats, huge numbers, odd unicode) must be answered without
a 5xx (schemathesis' ``not_a_server_error`` check). schemathesis runs as its
own command against a real ``floe serve``; a hooks module counts every
response, so the test also knows the run did make its requests.

Bounded for CI (a fixed seed and a few examples per operation). A longer run,
as reported in issue 14, against a server of your own::

    SCHEMATHESIS_HOOKS=tests.api.schemathesis_hooks FLOE_SCHEMATHESIS_LOG=/tmp/responses.log \
        schemathesis run http://127.0.0.1:8080/api --checks not_a_server_error --max-time 150
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingest import Repository, Settings
from tests.api._servers import WORKTREE, FloeServer
from tests.api.schemathesis_hooks import LOG_VARIABLE
from tests.conftest import make_item

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FloeServer, str]]:
    root = tmp_path_factory.mktemp("schemathesis") / "repo"
    repository = Repository.create(root, Settings())
    writer = repository.writer()
    writer.add_items([make_item(f"a-{n}", "alpha", cloud=float(n), platform="sat") for n in range(20)])
    writer.add_items([make_item(f"b-{n}", "beta", cloud=float(n)) for n in range(10)])
    writer.commit("thirty")
    repository.tag("v1")
    snapshot = repository.resolve("main")
    writer = repository.writer()
    writer.add_items([make_item("late", "alpha", cloud=1.5)])
    writer.commit("one more")
    server = FloeServer(root)
    try:
        yield server, snapshot
    finally:
        server.stop()


def _schemathesis(server: FloeServer, base: str, log: Path, phases: str) -> subprocess.Popen[bytes]:
    executable = Path(sys.executable).with_name("schemathesis")
    command = [
        str(executable),
        "run",
        f"{server.url}/api",
        "--url",
        server.url + base,
        "--checks",
        "not_a_server_error",
        "--phases",
        phases,
        "--max-examples",
        "10",
        "--seed",
        "14",
        "--workers",
        "1",
        "--request-timeout",
        "60",
        "--generation-database",
        "none",
        "--no-color",
    ]
    environment = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "tests.api.schemathesis_hooks",
        LOG_VARIABLE: str(log),
        "PYTHONPATH": str(WORKTREE),
    }
    return subprocess.Popen(command, cwd=log.parent, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_no_generated_request_gets_a_server_error(served: tuple[FloeServer, str], tmp_path: Path) -> None:
    server, snapshot = served
    # The exhaustive coverage phase (mostly invalid inputs) at a tag, where the ref routing runs too; random
    # examples at the root and at a snapshot id. The three runs go at once: each spends seconds starting up.
    runs = {
        "/refs/v1": "coverage,fuzzing",
        "": "fuzzing",
        f"/refs/{snapshot}": "fuzzing",
    }
    started = {
        base: (_schemathesis(server, base, tmp_path / f"responses-{n}.log", phases), tmp_path / f"responses-{n}.log")
        for n, (base, phases) in enumerate(runs.items())
    }
    for base, (process, log) in started.items():
        output, _ = process.communicate(timeout=600)
        text = output.decode(errors="replace")
        assert process.returncode == 0, f"schemathesis at {base or '/'} found failures:\n{text[-6000:]}"
        lines = log.read_text().splitlines() if log.exists() else []
        statuses = Counter(line.split(" ", 1)[0] for line in lines)
        server_errors = [line for line in lines if line.startswith("5")]
        assert not server_errors, server_errors[:20]
        # The run did make its requests, at the base it was given (and mostly invalid ones: 4xx).
        assert len(lines) >= 30, (base, statuses, text[-2000:])
        assert all(f"{server.url}{base}/" in line for line in lines), lines[:5]
        assert server.process.poll() is None
