"""`floe serve --workers N`: worker processes on one socket, answering alike, replaced when one dies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from ingest import Repository
from ingest.api import serve_command
from tests.conftest import free_port, make_item

WORKTREE = Path(__file__).resolve().parents[2]


def workers_of(process: psutil.Process) -> list[psutil.Process]:
    """The live uvicorn workers under a supervisor (spawned interpreters; not multiprocessing's resource tracker,
    nor a killed worker not yet reaped)."""
    found = []
    for child in process.children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "spawn_main" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:
            continue  # ended meanwhile
    return found


def wait_for(condition, what: str, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while True:
        found = condition()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=60) as answer:
        return json.loads(answer.read())


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve") / "repo"
    repository = Repository.create(root)
    writer = repository.writer()
    for number in range(30):
        writer.add_item(make_item(f"item-{number:02d}", when=f"2024-01-{number % 28 + 1:02d}T00:00:00Z"))
    writer.commit("30 items")
    port = free_port()
    process = subprocess.Popen(
        serve_command(str(root), port, workers=2),
        cwd=WORKTREE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            get_json(f"{url}/conformance")
        except OSError:
            assert process.poll() is None, "floe serve ended"
            return False
        return True

    try:
        wait_for(answers, "floe serve to answer")
        yield psutil.Process(process.pid), url
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            process.wait(timeout=30)


@pytest.mark.slow
def test_workers_answer_alike_on_one_socket(served):
    supervisor, url = served
    workers = wait_for(lambda: len(workers_of(supervisor)) == 2 and workers_of(supervisor), "two workers")
    assert len({worker.pid for worker in workers}) == 2

    def page(_: int) -> list[str]:
        return [item["id"] for item in get_json(f"{url}/search?limit=5&sortby=id")["features"]]

    with ThreadPoolExecutor(8) as pool:
        pages = list(pool.map(page, range(40)))
    assert {tuple(found) for found in pages} == {("item-00", "item-01", "item-02", "item-03", "item-04")}

    # A page token made by whichever worker answered continues in whichever answers next.
    first = get_json(f"{url}/search?limit=10&sortby=id")
    seen = [item["id"] for item in first["features"]]
    link = next(link["href"] for link in first["links"] if link["rel"] == "next")
    while link:
        page_found = get_json(link)
        seen += [item["id"] for item in page_found["features"]]
        link = next((link["href"] for link in page_found["links"] if link["rel"] == "next"), None)
    assert seen == [f"item-{number:02d}" for number in range(30)]


@pytest.mark.slow
def test_a_worker_that_dies_is_replaced_and_the_server_answers_on(served):
    supervisor, url = served
    workers = wait_for(lambda: len(workers_of(supervisor)) == 2 and workers_of(supervisor), "two workers")
    victim = workers[0]
    os.kill(victim.pid, signal.SIGKILL)
    wait_for(
        lambda: len(workers_of(supervisor)) == 2 and victim.pid not in {w.pid for w in workers_of(supervisor)},
        "the supervisor to start a new worker",
    )
    for _ in range(6):
        assert get_json(f"{url}/search?ids=item-07")["features"][0]["id"] == "item-07"
