"""The ingest's per-stage budget (``ingest/_stages.py``): every stage is measured where it runs, a stage inside
another is taken out of it, and ``floe -v ingest`` prints the line at the end (issue 52, item 1)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pyarrow.parquet as pq

import ingest.pipeline.sources._geoparquet as geoparquet_source
from ingest import Repository, Settings
from ingest._stages import STAGES, active, add, measuring, timed
from ingest.pipeline import ingest_items
from ingest.stac import items_to_arrow
from tests._cli import floe_child
from tests.conftest import make_item
from tests.stac._geoparquet_cases import write_geoparquet


def test_a_stage_inside_another_is_taken_out_of_it_on_its_thread_only() -> None:
    with measuring() as clock:
        with timed("commit"):
            add("write", 100.0)  # as if the write inside the commit had taken 100 s
        with timed("validate"):
            # Another thread's stage runs beside this one, not inside it.
            other = threading.Thread(target=add, args=("parse", 50.0))
            other.start()
            other.join()
        assert active()
    assert not active()
    assert clock.seconds["write"] == 100.0 and clock.seconds["parse"] == 50.0
    assert clock.seconds["commit"] < -99.0, "the commit's own seconds exclude the write timed inside it"
    assert 0.0 <= clock.seconds["validate"] < 50.0
    with timed("commit"):
        add("write", 1.0)  # no clock: nothing is kept, nothing fails
    assert clock.seconds["write"] == 100.0


def _items(count: int) -> list[dict]:
    return [make_item(f"s-{index}", "stages", when=f"2024-02-{1 + index % 28:02d}T00:00:00Z") for index in range(count)]


def test_an_in_process_ingest_measures_every_stage(tmp_path: Path) -> None:
    source = tmp_path / "items.ndjson"
    source.write_text("".join(json.dumps(item) + "\n" for item in _items(300)))
    repository = Repository.create(tmp_path / "repo", Settings())
    report = ingest_items(repository, [source], batch_size=100)
    assert report.rows_added == 300
    assert set(report.stages) == set(STAGES)
    assert all(seconds > 0 for seconds in report.stages.values()), report.stages
    assert report.seconds > 0


def test_reading_stac_geoparquet_counts_as_parsing(tmp_path: Path) -> None:
    source = tmp_path / "items.parquet"
    pq.write_table(items_to_arrow(_items(50)), source)
    repository = Repository.create(tmp_path / "repo", Settings())
    report = ingest_items(repository, [source])
    assert report.rows_added == 50 and report.stages["parse"] > 0, report.stages


def test_stac_geoparquet_rows_count_their_checks_and_layout_as_validation_and_conversion(tmp_path: Path) -> None:
    source = write_geoparquet(_items(200), tmp_path / "items.parquet")
    moves: list[tuple[str, str]] = []
    real = geoparquet_source.moved

    def counting(seconds: float, *, out_of: str, into: str) -> None:
        moves.append((out_of, into))
        real(seconds, out_of=out_of, into=into)

    geoparquet_source.moved = counting  # type: ignore[assignment]
    try:
        report = ingest_items(Repository.create(tmp_path / "repo", Settings()), [source])
    finally:
        geoparquet_source.moved = real  # type: ignore[assignment]
    assert report.rows_added == 200
    # The rows came as rows: their checks and layout were taken out of the wait for them.
    assert moves == [("parse", "validate"), ("parse", "to Arrow")]
    assert all(report.stages[stage] > 0 for stage in ("parse", "validate", "to Arrow")), report.stages


def test_floe_verbose_ingest_prints_the_budget(tmp_path: Path) -> None:
    source = tmp_path / "items.ndjson"
    source.write_text("".join(json.dumps(item) + "\n" for item in _items(40)))
    done = floe_child("-v", "--root", str(tmp_path / "repo"), "ingest", "--workers", "0", str(source))
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stderr.splitlines() if "stages of" in line)
    assert all(f"{stage} " in line for stage in STAGES), line
    quiet = floe_child("--root", str(tmp_path / "repo"), "ingest", "--workers", "0", str(source))
    assert "stages of" not in quiet.stderr
