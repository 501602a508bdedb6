"""Shared fixtures: repositories on local disk and on a real S3-compatible server (moto) on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
import rioxarray  # noqa: F401 - registers the .rio accessor
import xarray as xr
import zarr
import zarr.errors

from ingest import Repository, Settings
from ingest.config import S3Settings

# The shared invariants assert outside test modules: let pytest explain their failures too.
pytest.register_assert_rewrite("tests.invariants")

SLOW_FIXTURES = frozenset(("moto_server", "ray_cluster", "blob_server", "signature_proxy"))
"""Fixtures that start a real part for a test (the moto S3 server, a Ray cluster, the blob server, the signing
proxy): a test that uses one, directly or through another fixture, is ``slow``. With the modules whose every test
starts its own (``pytestmark = pytest.mark.slow``) and the tests marked one by one, ``pytest -m "not slow"`` is
the quick loop of docs/development.md."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


DATA = Path(__file__).parent / "data"
REAL_ITEMS = DATA / "real-items"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def make_item(item_id: str, collection: str = "c", *, when: str = "2024-01-05T00:00:00Z", **properties: Any) -> dict:
    """A small valid STAC item."""
    # crc32, not hash(): Python salts string hashes per process, and test data must not change between runs.
    x = (zlib.crc32(item_id.encode()) % 3600) / 10 - 180
    return {
        "type": "Feature",
        "stac_version": "1.0.0",
        "stac_extensions": [],
        "id": item_id,
        "collection": collection,
        "geometry": {"type": "Point", "coordinates": [x, 10.0]},
        "bbox": [x, 10.0, x, 10.0],
        "properties": {"datetime": when, **properties},
        "assets": {"data": {"href": f"https://example.com/{item_id}.tif", "type": "image/tiff"}},
        "links": [],
    }


def with_square(item: dict, x: float, y: float, size: float) -> dict:
    """``item`` with a ``size``-degree square footprint whose south-west corner is (x, y), and its bbox."""
    ring = [[x, y], [x + size, y], [x + size, y + size], [x, y + size], [x, y]]
    item["geometry"] = {"type": "Polygon", "coordinates": [ring]}
    item["bbox"] = [x, y, x + size, y + size]
    return item


def raster_dataset(
    pixels: np.ndarray,
    *,
    crs: str = "EPSG:32633",
    origin: tuple[float, float] = (500000.0, 4200000.0),
    res: float = 10.0,
) -> xr.Dataset:
    """A georeferenced ``(band, y, x)`` Dataset like ``read_granule`` gives: ``pixels`` at ``origin`` (top-left)."""
    from ingest.pipeline import georeferenced

    x0, y0 = origin
    return georeferenced(pixels, crs, (res, 0.0, x0, 0.0, -res, y0))


def stage_raster(writer, item: dict, pixels: np.ndarray, *, key: str = "data", **where: Any) -> dict:
    """Stage ``pixels`` as asset ``key`` of ``item`` in ``writer`` (stacked as ingest does); returns the item with
    its ``floe:arrays`` asset, ready for ``writer.add_item``."""
    from ingest.pipeline import stage_arrays
    from ingest.stac import arrays_asset, with_arrays_asset

    writer.ensure_collection(item["collection"])
    placed, _ = stage_arrays(writer, item, {key: raster_dataset(pixels, **where)})
    return with_arrays_asset(item, arrays_asset(placed))


def group_exists(store, path: str) -> bool:
    """Whether a Zarr group exists at ``path`` of ``store``."""
    try:
        zarr.open_group(store, path=path, mode="r")
    except (FileNotFoundError, zarr.errors.NodeNotFoundError):
        return False
    return True


def load_real_items() -> list[dict]:
    """Every item in the vendored real-items fixture (13 collections)."""
    items: list[dict] = []
    for path in sorted(REAL_ITEMS.glob("*.json")):
        document = json.loads(path.read_text())
        entries = document if isinstance(document, list) else [document]
        items.extend(entry for entry in entries if entry.get("type") == "Feature")
    return items


@pytest.fixture
def settings() -> Settings:
    return Settings()


@pytest.fixture
def repo(tmp_path: Path, settings: Settings) -> Repository:
    return Repository.create(tmp_path / "repo", settings)


class MotoServer:
    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        executable = Path(sys.executable).with_name("moto_server")
        command = [str(executable)] if executable.exists() else [sys.executable, "-m", "moto.server"]
        self.process = subprocess.Popen(
            [*command, "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(self.endpoint, timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.stop()
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.2)

    def s3_settings(self) -> S3Settings:
        return S3Settings(
            endpoint_url=self.endpoint,
            region="us-east-1",
            access_key_id="testing",
            secret_access_key="testing",
            allow_http=True,
            force_path_style=True,
        )

    def client(self, service: str = "s3", region: str = "us-east-1") -> Any:
        """A boto3 client of this server (moto's test keys), for setting up and looking at what floe did."""
        import boto3

        return boto3.client(
            service,
            endpoint_url=self.endpoint,
            region_name=region,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def create_bucket(self, region: str = "us-east-1") -> str:
        """A new bucket, in ``region`` (moto names it in its answer to a HEAD of the bucket, as S3 does)."""
        bucket = f"floe-{uuid.uuid4().hex[:12]}"
        client = self.client(region=region)
        if region == "us-east-1":
            client.create_bucket(Bucket=bucket)
        else:
            client.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": region})
        return bucket

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, 15)
            self.process.wait(timeout=10)


GATE_BYTES = 2 * 1024 * 1024
"""Bytes of a ``/__gated__/`` file the test HTTP server sends before it waits for ``/__release__``."""


@dataclass
class HttpServer:
    """tests/_http_server.py: a folder served over HTTP with ranges, validators and test-only paths."""

    folder: Path
    url: str
    process: subprocess.Popen

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(f"{self.url}/{path}", timeout=10) as answer:
            return answer.read()

    def sent(self) -> dict[str, int]:
        return json.loads(self.get("__stats__"))

    def requests(self) -> list[list[str | None]]:
        """``[path, Accept-Encoding, Authorization]`` of each request so far (the last 10,000)."""
        return json.loads(self.get("__requests__"))


@pytest.fixture(scope="module")
def http_server(tmp_path_factory) -> Iterator[HttpServer]:
    """tests/_http_server.py serving a folder of its own on 127.0.0.1, as a subprocess."""
    folder = tmp_path_factory.mktemp("served")
    port = free_port()
    process = _test_server("_http_server", str(folder), str(port), "--gate-bytes", str(GATE_BYTES))
    server = HttpServer(folder, f"http://127.0.0.1:{port}", process)
    yield from _serving(process, server.sent, server)


@dataclass
class BlobServer:
    """tests/_blob_server.py: blobs addressed path-style (``/<account>/<container>/<blob>``, the files of
    ``folder``) that refuse reads without a SAS token, and the token service that issues them."""

    folder: Path
    url: str
    process: subprocess.Popen

    @property
    def host(self) -> str:
        return self.url.removeprefix("http://")

    @property
    def token_service(self) -> str:
        return f"{self.url}/__sas__/token"

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/__sas__/stats", timeout=10) as answer:
            return json.loads(answer.read())

    def set(self, what: str, value: object) -> None:
        """``ttl`` (seconds a token is valid), ``mode`` (``ok``, ``garbage``) or ``list-page`` (blobs a listing
        page holds at most)."""
        with urllib.request.urlopen(f"{self.url}/__sas__/{what}/{value}", timeout=10) as answer:
            answer.read()


@pytest.fixture(scope="module")
def blob_server(tmp_path_factory) -> Iterator[BlobServer]:
    """tests/_blob_server.py serving a folder of its own on 127.0.0.1, as a subprocess."""
    folder = tmp_path_factory.mktemp("blobs")
    port = free_port()
    process = _test_server("_blob_server", str(folder), str(port))
    server = BlobServer(folder, f"http://127.0.0.1:{port}", process)
    yield from _serving(process, server.stats, server)


def _test_server(module: str, *arguments: str) -> subprocess.Popen:
    """``python -m tests.<module> arguments...``: one of the test servers, started quietly."""
    return subprocess.Popen(
        [sys.executable, "-m", f"tests.{module}", *arguments],
        cwd=Path(__file__).resolve().parents[1],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _serving[T](process: subprocess.Popen, probe: Callable[[], object], server: T) -> Iterator[T]:
    """``server`` once ``probe`` gets an answer (within 30 s), until the test is done; then SIGTERM to its pid."""
    deadline = time.monotonic() + 30
    while True:
        try:
            probe()
            break
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                raise RuntimeError(f"{process.args[2]} did not start") from None
            time.sleep(0.1)
    try:
        yield server
    finally:
        os.kill(process.pid, signal.SIGTERM)
        process.wait(timeout=10)


class ProxyNote(NamedTuple):
    """One request as tests/_signature_proxy.py saw it."""

    method: str
    path: str
    signed: bool
    region: str | None
    """The region of the signature's scope (None: unsigned)."""
    paying: bool
    """It said its requester pays (``x-amz-request-payer: requester``)."""


@dataclass
class SignatureProxy:
    """tests/_signature_proxy.py in front of moto: what each request asked for, and whether it was signed."""

    endpoint: str
    process: subprocess.Popen

    def requests(self) -> list[tuple[str, str, bool]]:
        """(method, path, signed) of every request passed on so far, in order."""
        return [(note.method, note.path, note.signed) for note in self.notes()]

    def notes(self) -> list[ProxyNote]:
        """Every request so far, in order, those refused (tests/_signature_proxy.py) among them."""
        with urllib.request.urlopen(f"{self.endpoint}/__requests__", timeout=10) as answer:
            return [ProxyNote(*note) for note in json.loads(answer.read())]

    def requester_pays(self, bucket: str) -> None:
        """Refuse, from now on, a request for ``bucket`` that does not say its requester pays (as S3 does)."""
        request = urllib.request.Request(f"{self.endpoint}/__requester_pays__/{bucket}", method="PUT")
        with urllib.request.urlopen(request, timeout=10) as answer:
            answer.read()

    def s3_settings(self, moto_server: MotoServer) -> S3Settings:
        """moto's settings (its keys), its requests going through this proxy."""
        return moto_server.s3_settings().model_copy(update={"endpoint_url": self.endpoint})


@pytest.fixture
def signature_proxy(moto_server) -> Iterator[SignatureProxy]:
    """A proxy of moto on 127.0.0.1 that notes whether each request was signed, and for which region, and
    refuses one signed for another region than its bucket's, as S3 does (a subprocess, stopped by pid)."""
    port = free_port()
    process = _test_server("_signature_proxy", str(port), str(moto_server.port))
    proxy = SignatureProxy(f"http://127.0.0.1:{port}", process)
    yield from _serving(process, proxy.requests, proxy)


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    server = MotoServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_settings(moto_server: MotoServer) -> Settings:
    return Settings(s3=moto_server.s3_settings())


@pytest.fixture
def s3_root(moto_server: MotoServer) -> str:
    return f"s3://{moto_server.create_bucket()}/repo"


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """One local Ray cluster (2 CPUs, loopback only) for the whole test session."""
    import ray

    from ingest.pipeline import start_ray

    started = start_ray(2)
    try:
        yield
    finally:
        if started:
            ray.shutdown()
