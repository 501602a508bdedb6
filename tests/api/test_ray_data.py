"""A release read by a distributed engine: Ray Data's ``read_iceberg`` through the Iceberg REST catalog of
``floe serve`` reads a tag in parallel tasks and gets exactly ``floe export``'s rows (issue 52, item 5).

A real uvicorn server on 127.0.0.1 serves a repository whose items span two collections and six months, so the
tag's table has a dozen data files to spread over read tasks; a real local Ray cluster (2 CPUs) runs them.
A commit on ``main`` afterwards must not change what the tag reads.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingest import Repository, Settings
from ingest.export import export_ndjson
from tests.api._servers import FloeServer
from tests.conftest import make_item

pytestmark = pytest.mark.slow

MONTHS = 6
READ_TASKS = r"Operator \d+ ReadIceberg[^:\n]*: (\d+) tasks executed"
"""How Ray Data's stats count the read operator's tasks."""
COLUMNS = ("collection", "id", "platform")


def _items(prefix: str, count: int) -> list[dict]:
    return [
        make_item(
            f"{prefix}-{n:03d}",
            ("optical", "radar")[n % 2],
            when=f"2024-{n % MONTHS + 1:02d}-{n % 27 + 1:02d}T10:00:00Z",
            platform=f"sat-{n % 3}",
        )
        for n in range(count)
    ]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """A repository with tag ``v1`` (120 items in 12 partitions), served; ``main`` moves on in the test."""
    root = tmp_path_factory.mktemp("ray-data") / "repo"
    repository = Repository.create(root, Settings())
    writer = repository.writer()
    writer.add_items(_items("first", 120))
    writer.commit("120 items over two collections and six months")
    repository.tag("v1")
    server = FloeServer(root)
    try:
        yield root, f"{server.url}/iceberg"
    finally:
        server.stop()


def _exported(root: Path, ref: str) -> list[tuple]:
    """(collection, id, platform) of every item ``floe export`` writes at ``ref``, sorted."""
    stream = io.StringIO()
    export_ndjson(Repository.open(root, Settings()).view(ref), stream)
    items = [json.loads(line) for line in stream.getvalue().splitlines()]
    return sorted((item["collection"], item["id"], item["properties"].get("platform")) for item in items)


def _read_with_ray(uri: str, ref: str) -> tuple[list[tuple], int]:
    """The rows Ray Data reads at ``ref`` through the REST catalog, and how many read tasks it ran."""
    import ray

    dataset = ray.data.read_iceberg(
        table_identifier="floe.items",
        catalog_kwargs={"name": f"floe-{ref}", "type": "rest", "uri": uri, "warehouse": ref},
        override_num_blocks=4,
    ).select_columns(list(COLUMNS))
    rows = sorted(tuple(row[column] for column in COLUMNS) for row in dataset.iter_rows())
    tasks = sum(int(found) for found in re.findall(READ_TASKS, dataset.stats()))
    return rows, tasks


def test_ray_data_reads_a_tag_in_parallel_tasks_exactly_as_floe_exports_it(served, ray_cluster) -> None:
    root, uri = served
    expected = _exported(root, "v1")
    assert len(expected) == 120

    rows, tasks = _read_with_ray(uri, "v1")
    assert rows == expected
    assert tasks >= 2, "the tag's files were not spread over read tasks"

    # main moves on: an item added, one replaced, one deleted. The tag reads as it did; main reads its own rows.
    repository = Repository.open(root, Settings())
    writer = repository.writer()
    writer.add_item(make_item("later", "optical", platform="sat-9"))
    writer.add_item(make_item("first-000", "optical", when="2024-01-01T10:00:00Z", platform="changed"), replace=True)
    writer.delete_item("radar", "first-001")
    writer.commit("main moves past v1")

    again, _ = _read_with_ray(uri, "v1")
    assert again == expected
    on_main, _ = _read_with_ray(uri, "main")
    assert on_main == _exported(root, "main") != expected
