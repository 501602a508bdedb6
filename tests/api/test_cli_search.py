"""`floe search`: the API's engine in-process, NDJSON on stdout, clear errors."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from ingest import Repository, Settings
from ingest.cli import app
from tests.conftest import make_item


def test_floe_search_prints_the_matching_items_as_ndjson(tmp_path) -> None:
    root = tmp_path / "repo"
    repository = Repository.create(root, Settings())
    items = [make_item(f"i-{n:02d}", "c" if n % 2 else "d", **{"eo:cloud_cover": float(n)}) for n in range(30)]
    writer = repository.writer()
    writer.add_items(items)
    writer.commit("thirty")
    runner = CliRunner()
    arguments = ["--root", str(root), "search", "--collections", "c", "--filter", "eo:cloud_cover >= 11"]
    result = runner.invoke(app, [*arguments, "--sortby", "-eo:cloud_cover", "--limit", "4"])
    assert result.exit_code == 0, result.output
    printed = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    expected = sorted(
        (item for item in items if item["collection"] == "c" and item["properties"]["eo:cloud_cover"] >= 11),
        key=lambda item: -item["properties"]["eo:cloud_cover"],
    )
    assert [item["id"] for item in printed] == [item["id"] for item in expected]
    assert printed[0] == expected[0]

    capped = runner.invoke(app, [*arguments, "--max-items", "3"])
    assert len([line for line in capped.stdout.splitlines() if line.startswith("{")]) == 3

    bad = runner.invoke(app, ["--root", str(root), "search", "--datetime", "not-a-time"])
    assert bad.exit_code == 1
    assert "datetime" in bad.output
