"""Ctrl-C in the middle of ``floe ingest``: one line saying what stays (no traceback), exit 130, the committed
batches kept; the same command run again goes on."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ingest import Repository
from ingest.cli import EXIT_INTERRUPTED
from ingest.errors import FloeError
from tests.conftest import GATE_BYTES, make_item

ITEMS = 3000
BATCH = 100

# A terminal's Ctrl-C reaches a Python whose SIGINT handler is the default one; a test run in the background
# may have inherited SIGINT ignored, so the command installs Python's handler itself. `run` is the `floe` command
# (the watchdog of ingest/cli/_interrupt.py armed).
FLOE = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); from ingest.cli import run; run()"


def _commits(root: Path) -> int:
    try:
        return len(Repository.open(root).log("main"))
    except FloeError:  # not there yet, or being created
        return 0


STOPS_WITHIN = 60
"""Seconds the interrupted command has to exit: well under what a stalled read takes to time out and be retried
(30 s, then retries for up to 3 minutes), which is how long Ctrl-C took to act before."""


def _sleeping(pid: int) -> bool:
    """Whether the process's main thread sleeps (waits for something), from /proc."""
    stat = Path(f"/proc/{pid}/task/{pid}/stat").read_text()
    return stat.rpartition(")")[2].split()[0] == "S"


def _wait_stalled(process: subprocess.Popen, root: Path, gate_reached) -> None:
    """Until the ingest waits for the rest of the source: the server has sent all the gate lets through, a batch
    is committed, and the command's main thread has slept through 20 looks in a row with no new commit."""
    deadline = time.monotonic() + 300
    quiet, last = 0, -1
    while quiet < 20:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the ingest never stalled at the gate"
        time.sleep(0.05)
        commits = _commits(root)
        settled = gate_reached() and commits >= 2 and commits == last and _sleeping(process.pid)
        quiet, last = (quiet + 1 if settled else 0), commits


def _interrupted(command: list[str], wait, within: float) -> tuple[int, str, str]:
    """Start ``command`` in a session of its own (the interrupt goes to it alone), ``wait(process)``, send SIGINT;
    its exit code, standard output and error, read within ``within`` seconds (it is killed if it lasts longer)."""
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
        start_new_session=True,
    )
    try:
        wait(process)
        os.kill(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=within)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, out, err


@pytest.mark.slow
def test_an_interrupted_ingest_keeps_its_commits_and_goes_on_when_run_again(http_server, tmp_path):
    lines = [
        json.dumps(make_item(f"item-{number:05d}", "c", note="x" * 900)) for number in range(ITEMS)
    ]  # about 3 MB: more than the gate lets through
    (http_server.folder / "interrupt").mkdir()
    (http_server.folder / "interrupt" / "items.ndjson").write_text("\n".join(lines) + "\n")
    assert len("\n".join(lines)) > 1.2 * GATE_BYTES
    url = f"{http_server.url}/__gated__/interrupt/items.ndjson"
    root = tmp_path / "repo"
    command = [sys.executable, "-c", FLOE, "--root", str(root), "ingest", url, "--workers", "0"]
    command += ["--batch-size", str(BATCH)]
    http_server.get("__hold__")
    gate_reached = lambda: http_server.sent().get("interrupt/items.ndjson", 0) >= GATE_BYTES  # noqa: E731
    try:
        code, _, err = _interrupted(command, lambda process: _wait_stalled(process, root, gate_reached), STOPS_WITHIN)
    finally:
        http_server.get("__release__")

    assert code == EXIT_INTERRUPTED, err
    assert "interrupted:" in err and "run the same command again" in err, err
    assert "Traceback" not in err, err
    kept = {item["id"] for item in Repository.open(root).view("main").items()}
    assert kept and len(kept) % BATCH == 0 and len(kept) < ITEMS  # whole batches, not all

    again = subprocess.run(
        command, capture_output=True, text=True, check=False, cwd=Path(__file__).resolve().parents[1]
    )
    assert again.returncode == 0, again.stderr
    ids = [item["id"] for item in Repository.open(root).view("main").items()]
    assert sorted(ids) == [f"item-{number:05d}" for number in range(ITEMS)]


def test_any_command_interrupted_says_what_stays(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from ingest.cli import app

    Repository.create(tmp_path / "repo")

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Repository, "log", interrupted)
    result = CliRunner().invoke(app, ["--root", str(tmp_path / "repo"), "log"])
    assert result.exit_code == EXIT_INTERRUPTED
    assert "interrupted: commits made before stay" in result.output


# A HEAD to a server that accepts and never answers, asked on the main thread as `floe check --deep` and a
# re-run's change check ask it (all at once, or one).
_HEADS = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from ingest.remote import Stores, head
url = sys.argv[1] + "/__stall__/scene.tif"
print("asking", flush=True)
try:
    if sys.argv[2] == "all":
        Stores().prefetch_heads([url, url.replace("scene", "other")])
    else:
        head(Stores(), url)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
print("answered", flush=True)
"""

HEAD_STOPS_WITHIN = 20
"""Seconds a stalled HEAD has after Ctrl-C: under obstore's 30 s read timeout, which was the first moment Ctrl-C
could act before (then the retries, for up to 3 minutes)."""


def _wait_asleep(process: subprocess.Popen, asked) -> None:
    """Until the server has the stalled request and the process's main thread has waited through 20 looks."""
    deadline = time.monotonic() + 120
    quiet = 0
    while quiet < 20:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the request never stalled"
        time.sleep(0.05)
        quiet = quiet + 1 if asked() and _sleeping(process.pid) else 0


def _interrupted_once_waiting(arguments: list[str], ready: str, asked) -> str:
    """Run ``python -c ARGUMENTS``; once it prints ``ready``, ``asked()`` holds and its main thread waits, Ctrl-C.
    It must exit 130 within :data:`HEAD_STOPS_WITHIN` seconds; returns what it printed after ``ready``."""

    def wait(process: subprocess.Popen) -> None:
        assert process.stdout is not None and process.stdout.readline() == ready
        _wait_asleep(process, asked)

    code, out, err = _interrupted([sys.executable, "-c", *arguments], wait, HEAD_STOPS_WITHIN)
    assert code == EXIT_INTERRUPTED, err
    return out


@pytest.mark.parametrize("how", ["all", "one"])
@pytest.mark.slow
def test_ctrl_c_ends_a_stalled_head_at_once(http_server, how):
    asked = lambda: "__stall__/scene.tif" in http_server.sent()  # noqa: E731
    assert _interrupted_once_waiting([_HEADS, http_server.url, how], "asking\n", asked) == "interrupted\n"


# The main thread waits for a call on a DaemonPool that never returns (a read stalled in Rust or GDAL, as a folder's
# objects and a batch's rasters are read).
_POOL = """
import signal, sys, threading
signal.signal(signal.SIGINT, signal.default_int_handler)
from ingest._threads import DaemonPool
try:
    with DaemonPool(2, name="floe-test") as pool:
        stalled = pool.submit(threading.Event().wait)
        print("waiting", flush=True)
        stalled.result()
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
"""


@pytest.mark.slow
def test_ctrl_c_leaves_a_pool_whose_call_stalls_and_the_process_ends():
    # With a ThreadPoolExecutor the process never exits: its thread is joined when the block ends, and at exit.
    assert _interrupted_once_waiting([_POOL], "waiting\n", lambda: True) == "interrupted\n"


def test_a_pool_left_by_an_error_still_waits_for_what_runs():
    from ingest._threads import DaemonPool

    started, finished = threading.Event(), []

    def slow() -> None:
        started.set()
        time.sleep(0.3)
        finished.append(True)

    with pytest.raises(ValueError), DaemonPool(1, name="floe-test") as pool:
        running, queued = pool.submit(slow), pool.submit(slow)
        assert started.wait(10)
        raise ValueError("a batch failed")
    assert finished and running.done()  # the next batch does not start beside a read still running
    assert queued.done() and len(finished) == 2  # nothing was cancelled: an error is not Ctrl-C


def test_a_pool_starts_a_thread_for_a_call_only():
    from ingest._threads import DaemonPool

    def ours() -> int:
        return sum(thread.name.startswith("floe-lazy") for thread in threading.enumerate())

    with DaemonPool(4, name="floe-lazy") as pool:
        assert ours() == 0  # a batch of items alone reads no raster: no thread
        assert pool.submit(int, "7").result() == 7
        assert ours() == 1


class _Blackhole:
    """A server on 127.0.0.1 that accepts connections and never answers (a stalled S3 endpoint)."""

    def __init__(self) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.connections: list[socket.socket] = []
        threading.Thread(target=self._accept, name="blackhole", daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):  # closed
            while True:
                self.connections.append(self.socket.accept()[0])

    def close(self) -> None:
        for connection in [*self.connections, self.socket]:
            connection.close()


STORAGE_STOPS_WITHIN = 45
"""Seconds a command inside a stalled Icechunk call has after Ctrl-C: the watchdog's 5 s, and the start of a busy
machine's Python; Icechunk itself waited more than 100 s, Ctrl-C doing nothing meanwhile."""


@pytest.mark.slow
def test_ctrl_c_ends_a_command_stuck_inside_an_icechunk_call(monkeypatch):
    blackhole = _Blackhole()
    settings = {
        "ENDPOINT_URL": f"http://127.0.0.1:{blackhole.port}",
        "ALLOW_HTTP": "true",
        "FORCE_PATH_STYLE": "true",
        "REGION": "us-east-1",
        "ACCESS_KEY_ID": "testing",
        "SECRET_ACCESS_KEY": "testing",
    }
    for name, value in settings.items():
        monkeypatch.setenv(f"FLOE_S3__{name}", value)
    command = [sys.executable, "-c", FLOE, "--root", "s3://stalled/repo", "log"]
    try:
        # Icechunk's open of the repository waits for the endpoint's answer, in Rust, on the main thread.
        code, _, err = _interrupted(
            command, lambda process: _wait_asleep(process, lambda: bool(blackhole.connections)), STORAGE_STOPS_WITHIN
        )
    finally:
        blackhole.close()

    assert code == EXIT_INTERRUPTED, err
    assert "interrupted: the call under way (storage, as a rule) did not return within 5 s of Ctrl-C" in err, err
    assert "nothing half-written is visible" in err and "Traceback" not in err, err
