"""Writer processes for the lifecycle tests (importable by spawned children)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np

from ingest import Repository, Settings
from ingest.repository import CommitMetadata
from ingest.repository import _commit as commit_module
from tests.conftest import make_item, stage_raster


def commit_with_arrays(repository: Repository, item_id: str, value: int, collection: str = "c") -> str:
    """One commit: an item whose 64x64 array (random, so too big to inline: a chunk object of its own) in its group."""
    writer = repository.writer()
    pixels = np.random.default_rng(value).integers(0, 2**31 - 1, size=(64, 64), dtype="int32")
    writer.add_item(stage_raster(writer, make_item(item_id, collection, value=value), pixels))
    return writer.commit(f"add {item_id}").snapshot_id


def killed_mid_commit(root: str, settings: dict[str, Any], item_id: str, pointer_file: str) -> None:
    """Write an item's data file, manifest, manifest list and metadata.json, then die before the Icechunk commit.

    Before dying it writes the pointer its commit would have carried (its metadata.json, relative to
    ``<root>/tables/``) to ``pointer_file``, so the test knows which files it left.
    """
    repository = Repository.open(root, Settings.model_validate(settings))

    def die_before_swap(*args: Any, **kwargs: Any) -> str:
        # The protocol's compare-and-swap is the next step: every table file of the commit is written.
        record = CommitMetadata.decode(args[-1])
        Path(pointer_file).write_text(record.items if record is not None and record.items is not None else "")
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")

    commit_module._swap = die_before_swap  # type: ignore[assignment]
    writer = repository.writer()
    writer.add_item(make_item(item_id, "c"))
    writer.commit(f"never lands: {item_id}")


def steady_writer(
    root: str, settings: dict[str, Any], stop_file: str, prefix: str, pause: float = 0.3, limit: int = 400
) -> None:
    """Commit an item with arrays every ``pause`` seconds or so until ``stop_file`` exists (at most ``limit``).

    Paced, not as fast as it can: a local writer makes thousands of commits a
    minute, and replicating that history to moto would outlast the test.
    """
    repository = Repository.open(root, Settings.model_validate(settings))
    for number in range(limit):
        if os.path.exists(stop_file):
            return
        commit_with_arrays(repository, f"{prefix}-{number}", number)
        time.sleep(pause)
