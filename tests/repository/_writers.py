"""Writer processes for the concurrency tests (importable by spawned children)."""

from __future__ import annotations

import time
from typing import Any

from ingest import Repository, Settings
from tests.conftest import make_item


def commit_worker(
    root: str, settings: dict[str, Any], worker: int, commits: int, rows: int, start_at: float
) -> list[dict[str, Any]]:
    """Make ``commits`` commits, each of one array and ``rows`` items; report what each commit holds."""
    repository = Repository.open(root, Settings.model_validate(settings))
    time.sleep(max(0.0, start_at - time.time()))
    done = []
    for number in range(commits):
        writer = repository.writer()
        group_name = f"w{worker}-{number}"
        group = writer.item_group("c", group_name)
        array = group.create_array("band", shape=(4,), dtype="int32")
        array[:] = worker * 1000 + number
        ids = [f"{group_name}-{row}" for row in range(rows)]
        for item_id in ids:
            writer.add_item(make_item(item_id, "c", **{f"w{worker}": number}))
        result = writer.commit(f"worker {worker} commit {number}")
        done.append(
            {
                "snapshot_id": result.snapshot_id,
                "ids": ids,
                "group": group_name,
                "value": worker * 1000 + number,
                "attempts": result.attempts,
                "files_written": result.files_written,
            }
        )
    return done
