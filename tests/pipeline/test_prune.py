"""``--prune``: an ingest mirrors its sources, deleting what they no longer hold in the run's last commit.

Without it nothing is ever deleted by an ingest. An input that cannot be read
(or an item whose key cannot be told) stops pruning altogether; an invalid
item whose key is known keeps its stored version.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from ingest import Repository
from ingest.lifecycle import check
from ingest.pipeline import ingest_items, ingest_with_ray
from ingest.sample import make_archive
from tests import invariants
from tests.conftest import make_item


def _write(folder: Path, item: dict) -> Path:
    path = folder / f"{item['collection']}-{item['id']}.json"
    path.write_text(json.dumps(item))
    return path


def _ids(repo: Repository, ref: str = "main") -> Counter[tuple[str, str]]:
    return Counter((item["collection"], item["id"]) for item in repo.view(ref).items())


@pytest.fixture
def mirrored(tmp_path: Path) -> tuple[Repository, Path]:
    """A folder of 6 items in collections a and b, and a repository that holds them and an item of collection z."""
    folder = tmp_path / "source"
    folder.mkdir()
    for number in range(6):
        _write(folder, make_item(f"i{number}", "a" if number < 4 else "b"))
    repo = Repository.create(tmp_path / "repo")
    ingest_items(repo, [folder], batch_size=4)
    writer = repo.writer()
    writer.add_item(make_item("elsewhere", "z"))
    writer.commit("an item of a collection the source does not name")
    return repo, folder


def test_prune_deletes_what_the_sources_dropped_in_the_last_commit(mirrored):
    repo, folder = mirrored
    (folder / "a-i1.json").unlink()
    (folder / "b-i5.json").unlink()
    _write(folder, make_item("new", "a"))

    plain = ingest_items(repo, [folder], batch_size=4)
    assert plain.pruned == 0 and _ids(repo)[("a", "i1")] == 1, "an ingest without --prune deleted"

    _write(folder, make_item("newer", "b"))
    report = ingest_items(repo, [folder], batch_size=4, prune=True)
    assert report.pruned == 2 and report.prune_skipped is None
    last = report.commits[-1]
    assert (last.rows_deleted, last.rows_added) == (2, 1), "the deletions did not land with the last additions"
    assert set(_ids(repo)) == {("a", "i0"), ("a", "i2"), ("a", "i3"), ("b", "i4"), ("a", "new"), ("b", "newer")} | {
        ("z", "elsewhere")
    }
    assert ingest_items(repo, [folder], prune=True).commits == [], "a second run still found something to do"
    assert check(repo, deep=True) == []


def test_nothing_is_pruned_when_an_input_cannot_be_read(mirrored):
    repo, folder = mirrored
    (folder / "a-i1.json").unlink()
    (folder / "a-broken.json").write_text('{"type": "Feature", "id": ')
    report = ingest_items(repo, [folder], prune=True)
    assert report.pruned == 0 and report.prune_skipped and "a-broken.json" in report.prune_skipped
    assert _ids(repo)[("a", "i1")] == 1


def test_an_invalid_item_keeps_its_stored_version(mirrored):
    repo, folder = mirrored
    broken = make_item("i2", "a")
    broken["geometry"] = {"type": "Polygon", "coordinates": [[[0, 0], [1, 1]]]}  # not a ring
    _write(folder, broken)
    (folder / "a-i3.json").unlink()
    report = ingest_items(repo, [folder], prune=True)
    assert [rejection.item_id for rejection in report.rejected] == ["i2"]
    assert report.pruned == 1 and report.prune_skipped is None
    assert ("a", "i2") in _ids(repo) and ("a", "i3") not in _ids(repo)


def test_prune_with_ray_takes_the_rasters_of_dropped_granules(tmp_path, ray_cluster):
    archive = tmp_path / "archive"
    paths = make_archive(archive, granules=6, seed=5)
    repo = Repository.create(tmp_path / "repo")
    ingest_with_ray(repo, [archive], workers=2, batch_size=2)
    repo.tag("before")
    dropped = paths[0]
    collection, item_id = dropped.parent.parent.name, json.loads(dropped.read_text())["id"]
    shutil.rmtree(dropped.parent)

    report = ingest_with_ray(repo, [archive], workers=2, batch_size=2, prune=True)
    assert report.pruned == 1 and report.commits[-1].slices_deleted >= 1
    assert (collection, item_id) not in _ids(repo) and len(_ids(repo)) == 5
    tip = repo.view()
    invariants.assert_no_slice_without_row(tip)
    invariants.assert_rows_have_their_arrays(tip)
    assert check(repo, deep=True) == []
    assert repo.view("before").item_arrays(collection, item_id).sizes["x"] > 0
