"""Compaction (`floe optimize`): clustered runs, size-tiered selection, and safety next to concurrent writers.

Races are forced, not hoped for: a competing commit is made from inside the
compaction (its progress callback runs after its files are written and before
it commits), or the compaction is run from inside a replacing writer's commit,
between its plan and its compare-and-swap.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import shapely

from ingest import Repository, Settings
from ingest.lifecycle import gc
from ingest.pipeline import ingest_items
from ingest.repository import _commit as commit_module
from ingest.repository._append import ManifestCache
from ingest.repository._files import run_of
from ingest.repository._optimize import CompactionPolicy, select
from ingest.stac import hilbert_index
from tests import invariants
from tests.conftest import make_item, with_square
from tests.lifecycle._helpers import exports


def _spread_item(item_id: str, n: int, *, when: str = "2024-01-05T00:00:00Z", **properties: object) -> dict:
    """An item whose 1-degree footprint lies somewhere on the globe, a pure function of ``n``."""
    item = make_item(item_id, "c", when=when, **properties)
    return with_square(item, (n * 37.7) % 350 - 175, (n * 23.3) % 160 - 80, 1)


def _commit_batches(repository: Repository, batches: int, per_batch: int, prefix: str = "b") -> dict[str, dict]:
    items = {}
    for b in range(batches):
        writer = repository.writer()
        for i in range(per_batch):
            n = b * per_batch + i
            item = _spread_item(f"{prefix}{b}-{i}", n, when=f"2024-01-{1 + n % 28:02d}T{n % 24:02d}:00:00Z", version=1)
            writer.add_item(item)
            items[item["id"]] = item
        writer.commit(f"batch {b}")
    return items


def _live_files(repository: Repository, ref: str = "main") -> dict[str, object]:
    return ManifestCache(repository.io).live_files(repository.view(ref).table.metadata)


def _items_json(repository: Repository, ref: str = "main") -> list[str]:
    return sorted(json.dumps(item, sort_keys=True) for item in repository.view(ref).items())


def test_hilbert_index_visits_every_cell_once_in_unit_steps() -> None:
    for order in (1, 3, 6):
        side = 1 << order
        xs, ys = (axis.ravel() for axis in np.meshgrid(np.arange(side), np.arange(side)))
        distances = hilbert_index(xs, ys, order)
        assert sorted(distances.tolist()) == list(range(side * side))
        walk = np.argsort(distances)
        steps = np.abs(np.diff(xs[walk])) + np.abs(np.diff(ys[walk]))
        assert steps.max() == 1  # the curve never jumps: consecutive cells are neighbours


def test_optimize_clusters_a_partition_into_one_run_and_changes_no_item(tmp_path: Path) -> None:
    settings = Settings(optimize={"target_file_rows": 40})
    repository = Repository.create(tmp_path / "repo", settings)
    _commit_batches(repository, batches=8, per_batch=25)
    repository.tag("before")
    before_items = _items_json(repository)
    before_files = _live_files(repository)
    assert len(before_files) == 8

    result = repository.optimize()

    assert result.summary is not None and result.snapshot_id is not None
    after_files = _live_files(repository)
    assert result.summary.files_before == 8 and result.summary.files_after == len(after_files) == 5
    runs = {run_of(path) for path in after_files}
    assert len(runs) == 1 and next(iter(runs)).level == 1  # one run, made of level-0 batch files
    assert sorted(data_file.record_count for data_file in after_files.values()) == [40] * 5
    assert _items_json(repository) == before_items
    table = repository.view().table
    assert table.current_snapshot().summary.operation.value == "replace"
    # The run's files each cover a stretch of the curve: together their bbox areas are far below the batches'.
    assert _footprint_area(repository, after_files) < _footprint_area(repository, before_files) / 3
    # GeoParquet survives the rewrite.
    with repository.io.new_input(next(iter(after_files))).open() as stream:
        assert b"geo" in pq.read_schema(stream).metadata
    # The tag still reads its own files, and a second run has nothing to do.
    assert _items_json(repository, "before") == before_items
    assert len(_live_files(repository, "before")) == 8
    again = repository.optimize()
    assert again.summary is None and again.snapshot_id is None
    # gc keeps the replaced batch files: the tag (and the history) still name them.
    gc(repository, grace=timedelta(0))
    assert _items_json(repository, "before") == before_items
    assert all(repository.io.new_input(path).exists() for path in before_files)
    invariants.assert_check_passes(repository)


def _footprint_area(repository: Repository, files: dict) -> float:
    """The summed area of the files' bbox bounds (what pruning by bbox sees of each file)."""
    total = 0.0
    for path in files:
        with repository.io.new_input(path).open() as stream:
            bbox = pq.read_table(stream, columns=["bbox"]).column("bbox").combine_chunks()
        xmin, ymin = min(bbox.field("xmin").to_pylist()), min(bbox.field("ymin").to_pylist())
        xmax, ymax = max(bbox.field("xmax").to_pylist()), max(bbox.field("ymax").to_pylist())
        total += shapely.box(xmin, ymin, xmax, ymax).area
    return total


def test_due_partitions_are_size_tiered(tmp_path: Path) -> None:
    settings = Settings(optimize={"target_file_rows": 1000, "small_files": 3, "fan_in": 2})
    repository = Repository.create(tmp_path / "repo", settings)
    policy = CompactionPolicy(target_file_rows=1000, small_files=3, fan_in=2)

    _commit_batches(repository, batches=2, per_batch=5, prefix="a")
    assert select(_live_files(repository), policy) == []  # 2 batch files: below small_files
    assert repository.optimize(full=False).summary is None
    _commit_batches(repository, batches=1, per_batch=5, prefix="b")
    due = select(_live_files(repository), policy)
    assert [(len(selection.sources), selection.level) for selection in due] == [(3, 1)]
    repository.optimize(full=False)
    assert Counter(getattr(run_of(path), "level", 0) for path in _live_files(repository)) == {1: 1}

    _commit_batches(repository, batches=3, per_batch=5, prefix="c")
    repository.optimize(full=False)  # the 3 new batch files make a second level-1 run: 2 runs of level 1 ...
    levels = [getattr(run_of(path), "level", 0) for path in _live_files(repository)]
    # ... which is fan_in, so the same look merges them into one level-2 run only on the next call.
    assert sorted(levels) == [1, 1]
    repository.optimize(full=False)
    assert [getattr(run_of(path), "level", 0) for path in _live_files(repository)] == [2]
    assert repository.view().count() == 30


def test_optimize_loses_to_a_replacer_and_appenders_and_recompacts_from_their_version(
    tmp_path: Path,
) -> None:
    """The compaction's files are written; meanwhile 2 writers append and 1 replaces rows it is compacting."""
    repository = Repository.create(tmp_path / "repo", Settings(optimize={"target_file_rows": 30}))
    items = _commit_batches(repository, batches=6, per_batch=20)
    repository.tag("v1")
    tagged = exports(repository)
    replaced = ["b0-1", "b3-7", "b5-19"]
    raced: list[str] = []

    def compete(_partition: object) -> None:
        if raced:
            return
        raced.append("done")
        for name in ("x", "y"):
            writer = repository.writer()
            for i in range(7):
                writer.add_item(_spread_item(f"{name}-{i}", 500 + i, version=1))
            writer.commit(f"append {name}")
        writer = repository.writer()
        for item_id in replaced:
            writer.add_item(
                {**items[item_id], "properties": {**items[item_id]["properties"], "version": 2}}, replace=True
            )
        assert writer.commit("replace three").rows_replaced == 3

    result = repository.optimize(progress=compete)

    assert raced and result.attempts == 2
    assert result.summary is not None and result.summary.replanned == 1
    view = repository.view()
    expected = Counter({item_id: 1 for item_id in items} | {f"{n}-{i}": 1 for n in "xy" for i in range(7)})
    invariants.assert_items_exactly(view, expected)
    versions = {item["id"]: item["properties"]["version"] for item in view.items()}
    assert {item_id for item_id, version in versions.items() if version == 2} == set(replaced)
    # The compaction made the partition one run, replacement and appends included.
    assert {run_of(path) is not None for path in _live_files(repository)} == {True}
    assert exports(repository)["tag:v1"] == tagged["tag:v1"]
    invariants.assert_check_passes(repository)


def test_a_replacer_that_planned_before_the_compaction_replans_on_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replacing writer has written its copy of the old files; the compaction lands first; the writer re-plans."""
    repository = Repository.create(tmp_path / "repo", Settings(optimize={"target_file_rows": 30}))
    items = _commit_batches(repository, batches=6, per_batch=20)
    real_swap = commit_module._swap
    compacted: list[object] = []

    def compaction_first(*args: object, **kwargs: object) -> str:
        if not compacted:
            compacted.append("running")
            result = repository.optimize()  # nested: its own swap passes straight through
            compacted[0] = result
        return real_swap(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(commit_module, "_swap", compaction_first)
    writer = repository.writer()
    for item_id in ("b1-2", "b4-4"):
        writer.add_item({**items[item_id], "properties": {**items[item_id]["properties"], "version": 2}}, replace=True)
    writer.add_item(_spread_item("fresh", 999, version=1))
    landed = writer.commit("replace two after a compaction")
    monkeypatch.undo()

    assert landed.attempts == 2 and landed.rows_replaced == 2
    assert compacted[0].summary is not None and compacted[0].summary.files_before == 6
    view = repository.view()
    invariants.assert_items_exactly(view, Counter({**{item_id: 1 for item_id in items}, "fresh": 1}))
    versions = {item["id"]: item["properties"]["version"] for item in view.items()}
    assert versions["b1-2"] == versions["b4-4"] == 2
    assert sum(version == 2 for version in versions.values()) == 2
    invariants.assert_check_passes(repository)


def test_an_ingest_that_crosses_the_threshold_compacts_that_partition(tmp_path: Path) -> None:
    settings = Settings(optimize={"small_files": 4, "target_file_rows": 1000})
    repository = Repository.create(tmp_path / "repo", settings)

    def write(name: str, months: list[int], count: int) -> Path:
        path = tmp_path / f"{name}.ndjson"
        lines = [
            json.dumps(_spread_item(f"{name}-{i}", i, when=f"2024-{months[i % len(months)]:02d}-03T00:00:00Z"))
            for i in range(count)
        ]
        path.write_text("\n".join(lines) + "\n")
        return path

    def files_per_month() -> dict[int | None, int]:
        return Counter(data_file.partition[1] for data_file in _live_files(repository).values())

    # Three batches of 5: three files in each of January and February (below the threshold of 4).
    first = ingest_items(repository, [write("first", [1, 2], 30)], batch_size=10)
    assert first.compactions == [] and files_per_month() == {648: 3, 649: 3}
    # One more batch, January only: January crosses the threshold in this ingest and is compacted after it.
    second = ingest_items(repository, [write("second", [1], 10)], batch_size=10)
    assert [len(done.summary.partitions) for done in second.compactions] == [1]
    assert files_per_month() == {648: 1, 649: 3}
    assert repository.view().count() == 40
    invariants.assert_check_passes(repository)


def test_dry_run_and_collection_filter_write_nothing(tmp_path: Path) -> None:
    repository = Repository.create(tmp_path / "repo", Settings())
    _commit_batches(repository, batches=3, per_batch=4)
    tip = repository.resolve("main")
    planned = repository.optimize(dry_run=True)
    assert planned.dry_run and planned.files_before == 3 and planned.snapshot_id is None
    assert repository.optimize(collections=["other"]).summary is None
    assert repository.resolve("main") == tip


def test_every_data_file_records_its_bbox_bounds(tmp_path: Path) -> None:
    """pyiceberg records only counts for fields inside a struct; floe adds the bbox bounds area pruning needs."""
    from pyiceberg.conversions import from_bytes
    from pyiceberg.types import DoubleType

    repository = Repository.create(tmp_path / "repo", Settings(optimize={"target_file_rows": 7}))
    _commit_batches(repository, batches=2, per_batch=10)
    repository.optimize()  # compacted files too
    schema = repository.view().table.schema()
    files = _live_files(repository)
    assert len(files) == 3
    for data_file in files.values():
        with repository.io.new_input(data_file.file_path).open() as stream:
            bbox = pq.read_table(stream, columns=["bbox"]).column("bbox").combine_chunks()
        for name in ("xmin", "ymin", "xmax", "ymax"):
            field_id = schema.find_field(f"bbox.{name}").field_id
            values = bbox.field(name).to_pylist()
            assert from_bytes(DoubleType(), data_file.lower_bounds[field_id]) == min(values)
            assert from_bytes(DoubleType(), data_file.upper_bounds[field_id]) == max(values)
