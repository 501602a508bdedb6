"""A user's mistake gets floe's one-line error naming what is wrong, and a non-zero exit: never a traceback.

Each case here once escaped as a Python traceback (found reading what the CLI's library functions raise, issue
50): an ingest to a branch that does not exist, a ``--filter`` that is not CQL2, a source URL Python's parser
refuses, a duration past the calendar, an export onto a folder, a ``--dst-config`` that is not TOML. And one
did worse: ``floe delete --filter ""`` deleted every item. The commands run in this process with exceptions
not caught by the runner, so a traceback fails the test.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ingest import Repository, Settings
from ingest.api import default_workers
from tests._cli import floe_here
from tests.conftest import make_item


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository holding items a and b of collection c."""
    root = tmp_path / "repo"
    writer = Repository.create(root, Settings()).writer()
    writer.add_items([make_item("a"), make_item("b")])
    writer.commit("a and b")
    return root


def _items_file(folder: Path, *, with_collection: bool = False) -> Path:
    path = folder / "items.ndjson"
    lines = [json.dumps(make_item("new"))]
    if with_collection:
        collection = {"type": "Collection", "id": "c", "stac_version": "1.0.0", "description": "c", "links": []}
        collection |= {"license": "proprietary", "extent": {"spatial": {"bbox": [[-180, -90, 180, 90]]}}}
        collection["extent"]["temporal"] = {"interval": [[None, None]]}
        (folder / "collection.json").write_text(json.dumps(collection))
    path.write_text("\n".join(lines) + "\n")
    return path


def _error_line(output: str) -> str:
    """The one error line (rich wraps it where ``COLUMNS`` is set, as pytest's workers set it: lines are joined)."""
    joined = output.replace("\n", "")
    assert joined.count("error:") == 1, output
    return joined[joined.index("error:") :]


@pytest.mark.parametrize("with_collection", [False, True], ids=["items", "items and their collection"])
def test_an_ingest_to_a_branch_that_does_not_exist_says_so(repo: Path, tmp_path: Path, with_collection: bool) -> None:
    source = _items_file(tmp_path, with_collection=with_collection)
    sources = [str(source), str(tmp_path / "collection.json")] if with_collection else [str(source)]
    result = floe_here(str(repo), "ingest", *sources, "--branch", "nope", "--workers", "0")
    assert result.exit_code == 1
    assert "branch 'nope' does not exist" in _error_line(result.output)
    assert [ref.name for ref in Repository.open(repo).refs()] == ["main"]


def test_a_filter_that_is_not_cql2_is_a_usage_error_before_anything_is_read(repo: Path) -> None:
    # Nothing listens at port 1: the filter is refused before any request is made.
    result = floe_here(str(repo), "ingest", "http://127.0.0.1:1/stac", "--filter", "cloud_cover <<< 5")
    assert result.exit_code == 2
    line = _error_line(result.output)
    assert "--filter 'cloud_cover <<< 5'" in line and "neither CQL2 text nor a CQL2 JSON object" in line


def test_a_source_url_python_cannot_parse_is_named(repo: Path) -> None:
    result = floe_here(str(repo), "ingest", "http://[not-an-address/items.json", "--workers", "0")
    assert result.exit_code == 1
    assert "'http://[not-an-address/items.json' is not a URL floe can read" in _error_line(result.output)


@pytest.mark.parametrize("option", ["--grace", "--expire-older-than"])
def test_a_duration_past_the_calendar_is_refused_before_gc_deletes_anything(repo: Path, option: str) -> None:
    before = sorted(path.relative_to(repo) for path in repo.rglob("*"))
    result = floe_here(str(repo), "gc", option, "99999999999d")
    assert result.exit_code != 0
    assert "reaches back before the calendar begins" in _error_line(result.output)
    assert sorted(path.relative_to(repo) for path in repo.rglob("*")) == before


@pytest.mark.parametrize("format", ["ndjson", "stac-geoparquet"])
def test_an_export_onto_a_folder_names_the_folder(repo: Path, tmp_path: Path, format: str) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    result = floe_here(str(repo), "export", str(folder), "--format", format)
    assert result.exit_code == 1
    # Compared without spaces: where rich wraps a line at a space depends on how long the temporary path is.
    assert f"{folder}isafolder" in "".join(_error_line(result.output).split())
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize("empty", ["", "   "])
def test_an_empty_delete_filter_deletes_nothing(repo: Path, empty: str) -> None:
    result = floe_here(str(repo), "delete", "--filter", empty)
    assert result.exit_code == 1
    assert "the filter is empty" in _error_line(result.output)
    assert sorted(item["id"] for item in Repository.open(repo).view().items()) == ["a", "b"]


def test_a_dst_config_that_is_not_toml_is_named(repo: Path, tmp_path: Path) -> None:
    config = tmp_path / "target.toml"
    config.write_text("[s3\nendpoint_url = 'http://127.0.0.1:1'\n")
    result = floe_here(str(repo), "replicate", str(repo), str(tmp_path / "copy"), "--dst-config", str(config))
    assert result.exit_code == 1
    assert f"--dst-config {config} is not a floe settings file" in _error_line(result.output)
    assert not (tmp_path / "copy").exists()


def test_serve_counts_cores_where_python_has_no_affinity(monkeypatch: pytest.MonkeyPatch) -> None:
    """macOS and Windows have no ``os.sched_getaffinity``: ``floe serve`` takes the machine's count there."""
    monkeypatch.delattr(os, "sched_getaffinity")
    assert default_workers() == max(1, os.cpu_count() or 1)
