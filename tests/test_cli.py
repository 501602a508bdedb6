"""The floe command, end to end: every subcommand, exit codes, and bad input."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import ingest
from ingest import Repository
from ingest.cli import EXIT_PROBLEMS, EXIT_REJECTED, app
from tests.conftest import REAL_ITEMS, load_real_items, make_item

pytestmark = pytest.mark.usefixtures("ray_cluster")


@pytest.fixture
def floe(tmp_path):
    runner = CliRunner()
    root = str(tmp_path / "repo")

    def run(*args: str, input: str | None = None):
        return runner.invoke(app, ["--root", root, *args], input=input, catch_exceptions=False)

    return run


def by_key(items):
    return {(item["collection"], item["id"]): item for item in items}


def test_ingest_export_round_trip_of_real_items(floe, tmp_path):
    assert floe("init").exit_code == 0
    result = floe("ingest", str(REAL_ITEMS), "--batch-size", "10", "--message", "real")
    assert result.exit_code == 0, result.output
    out = tmp_path / "export.ndjson"
    assert floe("export", str(out), "--format", "ndjson").exit_code == 0
    exported = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(exported) == len(load_real_items())
    assert by_key(exported) == by_key(load_real_items())


def test_log_tag_branch_refs(floe, tmp_path):
    source = tmp_path / "a.ndjson"
    source.write_text(json.dumps(make_item("a")) + "\n")
    floe("ingest", str(source), "-m", "first")
    assert floe("tag", "v1").exit_code == 0
    assert floe("branch", "dev", "--from", "v1").exit_code == 0
    source.write_text(json.dumps(make_item("b")) + "\n")
    floe("ingest", str(source), "-m", "second")

    log = json.loads(floe("log", "--json").stdout)
    assert [entry["message"] for entry in log] == ["second (batch 1)", "first (batch 1)"]
    everything = json.loads(floe("log", "--json", "--all").stdout)
    assert [entry["message"] for entry in everything] == [
        "second (batch 1)",
        "first (batch 1)",
        "floe: create /c",  # the collection's group, made before writers need it
        "floe: initialize repository",
    ]
    assert (
        log[0]["rows_added"] == 1 and log[0]["attempts"] == 1 and log[0]["metadata_location"].endswith(".metadata.json")
    )
    assert json.loads(floe("log", "--json", "--ref", "v1").stdout)[0]["message"] == "first (batch 1)"

    refs = {(r["kind"], r["name"]): r["snapshot_id"] for r in json.loads(floe("refs", "--json").stdout)}
    assert refs[("tag", "v1")] == refs[("branch", "dev")] == log[1]["snapshot_id"]
    assert refs[("branch", "main")] == log[0]["snapshot_id"]

    exported = floe("export", "--ref", "v1").stdout
    assert [json.loads(line)["id"] for line in exported.splitlines()] == ["a"]
    assert "exists already" in floe("tag", "v1").output
    assert floe("tag", "v1").exit_code == 1


def test_an_unwritable_report_fails_before_any_work(floe, tmp_path):
    source = tmp_path / "items.ndjson"
    source.write_text(json.dumps(make_item("early")) + "\n")
    result = floe("ingest", str(source), "--workers", "0", "--report", str(tmp_path / "missing" / "report.jsonl"))
    assert result.exit_code == 2
    assert "cannot write the report" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "repo").exists()  # nothing was created or ingested


def test_bad_input_exit_status_and_report(floe, tmp_path):
    source = tmp_path / "mixed.ndjson"
    source.write_text(json.dumps(make_item("fine")) + "\nnot json\n" + json.dumps(make_item("../up")) + "\n")
    report = tmp_path / "rejected.jsonl"
    result = floe("ingest", str(source), "--report", str(report))
    assert result.exit_code == EXIT_REJECTED
    assert f"{source}:2" in result.output and "../up" in result.output
    lines = [json.loads(line) for line in report.read_text().splitlines()]
    rejected = [line for line in lines if line["outcome"] == "rejected"]
    # The report also names what was committed, and in which snapshot.
    committed = [line for line in lines if line["outcome"] == "committed"]
    assert [(line["source"], line["id"]) for line in committed] == [(f"{source}:1", "fine")]
    assert committed[0]["snapshot"] in {entry.snapshot_id for entry in Repository.open(str(tmp_path / "repo")).log()}
    assert [(r["source"], r["id"]) for r in rejected] == [(f"{source}:2", None), (f"{source}:3", "../up")]
    assert [json.loads(line)["id"] for line in floe("export").stdout.splitlines()] == ["fine"]


def test_check_exit_status(floe, tmp_path):
    source = tmp_path / "a.ndjson"
    source.write_text(json.dumps(make_item("a")) + "\n")
    floe("ingest", str(source))
    assert floe("check", "--all").exit_code == 0
    for path in Path(tmp_path / "repo" / "tables" / "items" / "data").rglob("*.parquet"):
        path.unlink()
    result = floe("check")
    assert result.exit_code == EXIT_PROBLEMS
    assert "is missing" in result.stdout


def test_errors_are_one_clear_line(floe):
    result = floe("export")
    assert result.exit_code == 1
    assert "no floe repository" in result.output and "Traceback" not in result.output
    floe("init")
    assert "no branch, tag or snapshot named 'nope'" in floe("export", "--ref", "nope").output
    assert floe("export", "--format", "xml").exit_code == 2


def test_installed_command_and_env_root(tmp_path):
    floe_bin = Path(sys.executable).with_name("floe")
    env = {**os.environ, "FLOE_ROOT": str(tmp_path / "env-root")}
    source = tmp_path / "a.ndjson"
    source.write_text(json.dumps(make_item("a")) + "\n")
    done = subprocess.run([str(floe_bin), "ingest", str(source)], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "env-root" / "arrays").is_dir()
    help_text = subprocess.run([str(floe_bin), "ingest", "--help"], capture_output=True, text=True, check=True).stdout
    assert "--batch-size" in help_text and "--branch" in help_text


def test_demo_ingests_tags_and_reruns_idempotently(floe, tmp_path):
    archive = tmp_path / "archive"
    demo = ("demo", "--granules", "9", "--places", "2", "--archive", str(archive))
    first = floe(*demo)
    assert first.exit_code == 0, first.output
    assert "tagged the result v1" in first.output
    refs = {(r["kind"], r["name"]) for r in json.loads(floe("refs", "--json").stdout)}
    assert ("tag", "v1") in refs
    exported = [json.loads(line) for line in floe("export", "--ref", "v1").stdout.splitlines()]
    assert len(exported) == 9 and all("floe:arrays" in item["assets"] for item in exported)
    # Three optical granules on two places: the first and the third are one grid's time series.
    tree = ingest.open_search(str(tmp_path / "repo"), "v1", collections=["sample-optical"])
    steps = sorted(grid.ds["item"].values.tolist() for grid in tree.children.values())
    assert steps == [["sample-optical-0000", "sample-optical-0006"], ["sample-optical-0003"]]
    log_before = json.loads(floe("log", "--json").stdout)
    second = floe(*demo)
    assert second.exit_code == 0
    assert "9 unchanged" in second.output and "exists already" in second.output
    assert json.loads(floe("log", "--json").stdout) == log_before


def test_virtual_ingest_from_the_cli(floe, tmp_path):
    from ingest.sample import make_archive

    archive = tmp_path / "archive"
    make_archive(archive, granules=6, seed=2)
    refused = floe("ingest", str(archive), "--virtual", "--workers", "0")
    assert refused.exit_code == 2 and "--virtual" in refused.output
    report = tmp_path / "report.jsonl"
    result = floe("ingest", str(archive), "--virtual", "--report", str(report))
    assert result.exit_code == 0, result.output
    assert "referenced in place" in result.output and "copied instead of referenced" in result.output
    lines = [json.loads(line) for line in report.read_text().splitlines()]
    copied = [line for line in lines if line["outcome"] == "copied"]
    assert copied and all(line["id"].startswith("sample-optical") for line in copied)
    # Every granule was committed, each by an actor on a Ray node the report names.
    committed = [line for line in lines if line["outcome"] == "committed"]
    assert len(committed) == 6 and all(line["node"] for line in committed)
    assert {line["outcome"] for line in lines} == {"copied", "committed"}


def test_layout_fixed_from_the_cli_copies_tiles_into_a_stack_per_grid(floe, tmp_path):
    """``--layout fixed``: one stack per exact grid; band-interleaved COGs' tiles are stored as they are (their
    arrays have the files' codecs, not floe's zstd), pixel-interleaved ones are decoded. Every granule reads back
    equal to its file."""
    import rioxarray
    import zarr

    from ingest.rasters._stack import CODECS
    from ingest.sample import make_archive
    from ingest.stac import read_arrays_asset

    archive = tmp_path / "archive"
    item_files = make_archive(archive, granules=6, seed=2)
    refused = floe("ingest", str(archive), "--layout", "diagonal")
    assert refused.exit_code == 2 and "--layout" in refused.output
    result = floe("ingest", str(archive), "--layout", "fixed")
    assert result.exit_code == 0, result.output

    view = Repository.open(tmp_path / "repo").view()
    zstd = [codec.to_dict() for codec in CODECS]
    codecs_seen = []
    for item_file in item_files:
        source = json.loads(item_file.read_text())
        row = view.item(source["collection"], source["id"])
        arrays = read_arrays_asset(row)
        read = view.item_arrays(source["collection"], source["id"])
        for key, where in arrays.pixels.items():
            (piece,) = where.pieces
            assert "/stacks/g" in piece.stack, f"{piece.stack} is not a fixed stack"
            array = zarr.open_array(view.session.store, path=f"{piece.stack}/{piece.array}", mode="r")
            codecs_seen.append([codec.to_dict() for codec in array.metadata.codecs])
            expected = rioxarray.open_rasterio(item_file.parent / source["assets"][key]["href"], mask_and_scale=False)
            assert (read[key].values == expected.values).all(), f"{source['id']} {key}"
    assert len(codecs_seen) >= 6
    assert any(codecs != zstd for codecs in codecs_seen), "no granule's tiles were copied as they are"
    assert any(codecs == zstd for codecs in codecs_seen), "the pixel-interleaved granules were not decoded"


def test_optimize_dry_run_then_compact_then_nothing_to_do(floe, tmp_path):
    source = tmp_path / "items.ndjson"
    source.write_text("".join(json.dumps(make_item(f"o-{i}", "c")) + "\n" for i in range(40)))
    assert floe("ingest", str(source), "--workers", "0", "--batch-size", "10").exit_code == 0
    exported = tmp_path / "before.ndjson"
    assert floe("export", str(exported)).exit_code == 0

    planned = floe("optimize", "--dry-run")
    assert planned.exit_code == 0, planned.output
    assert "c\t2024-01\t4 files\t40 rows" in planned.output
    assert "would compact 1 partition(s), 4 file(s), 40 rows" in planned.output

    done = floe("optimize")
    assert done.exit_code == 0, done.output
    assert "compacted 1 partition(s), 40 rows: 4 file(s)" in done.output and "-> 1 file(s)" in done.output
    after = tmp_path / "after.ndjson"
    assert floe("export", str(after)).exit_code == 0
    assert sorted(after.read_text().splitlines()) == sorted(exported.read_text().splitlines())
    assert "nothing to compact" in floe("optimize").output
    assert floe("check", "--all", "--deep").exit_code == 0
    assert "optimize" in floe("log", "--limit", "1").output


def test_delete_by_ids_and_by_filter_takes_rows_and_arrays_and_tags_keep_them(floe, tmp_path, ray_cluster):
    from ingest import Repository
    from ingest.config import load_settings
    from ingest.sample import make_archive
    from tests import invariants

    archive = tmp_path / "archive"
    make_archive(archive, granules=6, seed=3)
    assert floe("ingest", str(archive), "--workers", "2").exit_code == 0  # rasters into arrays
    assert floe("tag", "before").exit_code == 0
    items = {item["id"]: item for item in map(json.loads, floe("export").stdout.splitlines())}
    optical = sorted(item_id for item_id, item in items.items() if item["collection"] == "sample-optical")
    dem = sorted(item_id for item_id, item in items.items() if item["collection"] == "sample-dem")
    assert len(optical) == 2 and len(dem) == 2

    listed = floe("delete", "--ids", f"{optical[0]},no-such-item", "--dry-run")
    assert listed.exit_code == 0, listed.output
    assert f"sample-optical\t{optical[0]}" in listed.stdout and "not found: no-such-item" in listed.output
    assert "would delete 1 item(s)" in listed.output
    assert len(floe("export").stdout.splitlines()) == 6, "a dry run deleted something"

    by_ids = floe("delete", "--ids", f"{optical[0]},no-such-item", "-m", "withdraw a granule")
    assert by_ids.exit_code == 0, by_ids.output
    assert "not found: no-such-item" in by_ids.output
    slices = re.search(r"deleted 1 item\(s\) and (\d+) array slice\(s\)", by_ids.output)
    assert slices and int(slices.group(1)) >= 1, by_ids.output
    by_filter = floe("delete", "--collections", "sample-dem", "--filter", "true")
    assert by_filter.exit_code == 0, by_filter.output
    assert "deleted 2 item(s)" in by_filter.output
    assert floe("delete", "--ids", optical[0]).output.strip().endswith("nothing to delete on main")
    assert "2 deleted" in floe("log", "--limit", "1").output

    left = {item["id"] for item in map(json.loads, floe("export").stdout.splitlines())}
    assert left == set(items) - {optical[0], *dem}
    assert floe("check", "--all", "--deep").exit_code == 0
    repository = Repository.open(settings=load_settings(root=str(tmp_path / "repo")))
    tip, before = repository.view(), repository.view("before")
    invariants.assert_no_slice_without_row(tip)
    invariants.assert_rows_have_their_arrays(tip)
    # The tag still exports and reads every item, the deleted ones' pixels included.
    assert {item["id"] for item in map(json.loads, floe("export", "--ref", "before").stdout.splitlines())} == set(items)
    for item_id in (optical[0], *dem):
        collection = items[item_id]["collection"]
        assert before.item_arrays(collection, item_id).sizes["x"] > 0
    assert floe("delete").exit_code == 2
