"""`floe export` on the command line: the three formats, at a ref, and its usage errors."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from ingest.cli import app


@pytest.mark.slow
def test_export_command_writes_each_format_at_a_ref(real_repo, tmp_path):
    runner = CliRunner()
    root = str(real_repo.location.url)
    first_commit = next(entry.snapshot_id for entry in real_repo.log("main") if entry.message == "real (batch 1)")

    def floe(*args: str):
        return runner.invoke(app, ["--root", root, "export", *args], catch_exceptions=False)

    result = floe("--ref", first_commit)  # NDJSON on stdout by default
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines == list(real_repo.view(first_commit).items()) and len(lines) == 10

    result = floe("--format", "stac-geoparquet", str(tmp_path / "items.parquet"))
    assert result.exit_code == 0, result.output
    assert "exported 50 items of 13 collections" in result.stderr
    assert pq.read_metadata(tmp_path / "items.parquet").num_rows == 50

    result = floe("--format", "catalog", "--ref", first_commit, str(tmp_path / "catalog"))
    assert result.exit_code == 0, result.output
    assert len(list((tmp_path / "catalog").glob("*/items/*.json"))) == 10


def test_export_command_usage_errors(real_repo, tmp_path):
    runner = CliRunner()
    root = str(real_repo.location.url)

    def floe(*args: str):
        return runner.invoke(app, ["--root", root, "export", *args], catch_exceptions=False)

    result = floe("--format", "shapefile", str(tmp_path / "x"))
    assert result.exit_code == 2 and "unknown format 'shapefile'" in result.stderr
    result = floe("--format", "catalog", "-")
    assert result.exit_code == 2 and "give an output path" in result.stderr
    result = floe("--ref", "no-such-ref", str(tmp_path / "x.ndjson"))
    assert result.exit_code == 1 and "no-such-ref" in result.stderr
    assert not (tmp_path / "x.ndjson").exists()
