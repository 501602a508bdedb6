"""Batch ingestion from files: every source format, bad input rejected by name, the rest committed."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from ingest import Repository
from ingest.pipeline import ingest_items
from tests.conftest import REAL_ITEMS, load_real_items, make_item


def write_ndjson(path: Path, items: list) -> Path:
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return path


def test_every_source_format(tmp_path, repo):
    folder = tmp_path / "items"
    (folder / "nested").mkdir(parents=True)
    (folder / "single.json").write_text(json.dumps(make_item("single")))
    (folder / "nested" / "fc.geojson").write_text(
        json.dumps({"type": "FeatureCollection", "features": [make_item("fc1"), make_item("fc2")]})
    )
    (folder / "array.json").write_text(json.dumps([make_item("arr1")]))
    (folder / "collection.json").write_text(json.dumps({"type": "Collection", "id": "c"}))
    (folder / "notes.txt").write_text("ignored: not an item file")
    ndjson = write_ndjson(tmp_path / "more.ndjson", [make_item("nd1"), make_item("nd2")])

    report = ingest_items(repo, [folder, ndjson], batch_size=2)
    assert report.rejected == []
    assert report.rows_added == 6 and len(report.commits) == 3
    assert Counter(item["id"] for item in repo.view().items()) == Counter(
        ["single", "fc1", "fc2", "arr1", "nd1", "nd2"]
    )


def test_bad_input_is_rejected_by_name_and_the_rest_commits(tmp_path, repo):
    good = [make_item(f"good{n}") for n in range(5)]
    no_geometry = make_item("no-geometry") | {"geometry": None}
    no_datetime = make_item("no-datetime")
    del no_datetime["properties"]["datetime"]
    no_id = make_item("x")
    del no_id["id"]
    lines = [json.dumps(item) for item in good[:3]]
    lines += [
        json.dumps(no_geometry),
        "{ this is not json",
        json.dumps(no_datetime),
        json.dumps(make_item("../escape")),
        json.dumps(make_item("ok", collection="a/b")),
        json.dumps(no_id),
        json.dumps(make_item("good0")),  # duplicate id in the batch
    ]
    lines += [json.dumps(item) for item in good[3:]]
    short_ring = make_item("short-ring") | {"geometry": {"type": "Polygon", "coordinates": [[[0, 0], [1, 1]]]}}
    blob = make_item("blob") | {"geometry": {"type": "Blob", "coordinates": [1]}}
    lines += [json.dumps(short_ring), json.dumps(blob)]  # found by the batch's vectorized geometry parse
    source = tmp_path / "batch.ndjson"
    source.write_text("\n".join(lines) + "\n")
    (tmp_path / "broken.json").write_text('{"type": "Feature", "id": ')

    report = ingest_items(repo, [source, tmp_path / "broken.json", tmp_path / "missing.json"], batch_size=100)

    reasons = {(r.source, r.item_id): r.reason for r in report.rejected}
    assert reasons == {
        (f"{source}:4", "no-geometry"): "item has no geometry",
        (f"{source}:5", None): "not valid JSON (Expecting property name enclosed in double quotes at column 3)",
        (f"{source}:6", "no-datetime"): reasons[(f"{source}:6", "no-datetime")],
        (f"{source}:7", "../escape"): "id '../escape' contains a path separator",
        (f"{source}:8", "ok"): "collection 'a/b' contains a path separator",
        (f"{source}:9", None): "item has no id",
        (f"{source}:10", "good0"): reasons[(f"{source}:10", "good0")],
        (f"{source}:13", "short-ring"): reasons[(f"{source}:13", "short-ring")],
        (f"{source}:14", "blob"): reasons[(f"{source}:14", "blob")],
        (str(tmp_path / "broken.json"), None): reasons[(str(tmp_path / "broken.json"), None)],
        (str(tmp_path / "missing.json"), None): "no such file or folder",
    }
    assert "datetime is required" in reasons[(f"{source}:6", "no-datetime")]
    assert "duplicate id" in reasons[(f"{source}:10", "good0")]
    assert reasons[(f"{source}:13", "short-ring")].startswith("geometry is not valid GeoJSON")
    assert reasons[(f"{source}:14", "blob")].startswith("geometry is not valid GeoJSON")
    assert "not valid JSON" in reasons[(str(tmp_path / "broken.json"), None)]
    # The good items are committed, once; nothing of the bad ones is visible at any snapshot.
    assert Counter(item["id"] for item in repo.view().items()) == Counter(f"good{n}" for n in range(5))
    for entry in repo.log():
        ids = {item["id"] for item in repo.view(entry.snapshot_id).items()}
        assert ids <= {f"good{n}" for n in range(5)}

    report_file = tmp_path / "report.jsonl"
    report.write_report(report_file)
    assert len(report_file.read_text().splitlines()) == len(report.rejected)


def test_duplicate_across_batches_of_one_run_is_rejected(tmp_path, repo):
    source = write_ndjson(tmp_path / "dups.ndjson", [make_item("a"), make_item("b"), make_item("a")])
    report = ingest_items(repo, [source], batch_size=2)
    assert [(r.item_id, "duplicate id" in r.reason) for r in report.rejected] == [("a", True)]
    assert Counter(item["id"] for item in repo.view().items()) == Counter(["a", "b"])


@pytest.mark.slow
def test_real_items_ingest_into_one_table_and_export_equal(repo):
    report = ingest_items(repo, [REAL_ITEMS], batch_size=7)
    real = load_real_items()
    assert report.rejected == [] and report.rows_added == len(real)
    exported = {(item["collection"], item["id"]): item for item in repo.view().items()}
    assert len({collection for collection, _ in exported}) == 13
    assert exported == {(item["collection"], item["id"]): item for item in real}


def test_ingest_to_a_branch(tmp_path, repo):
    repo.branch("staging")
    source = write_ndjson(tmp_path / "i.ndjson", [make_item("on-staging")])
    ingest_items(repo, [source], branch="staging")
    assert [item["id"] for item in repo.view("staging").items()] == ["on-staging"]
    assert list(repo.view("main").items()) == []


@pytest.mark.s3
def test_s3_ingest_and_export(tmp_path, s3_root, s3_settings):
    repo = Repository.create(s3_root, s3_settings)
    report = ingest_items(repo, [REAL_ITEMS], batch_size=20)
    assert report.rejected == []
    exported = {(item["collection"], item["id"]): item for item in repo.view().items()}
    assert exported == {(item["collection"], item["id"]): item for item in load_real_items()}


def test_a_batch_racing_another_writer_on_the_same_granule_ends_with_one_row_and_its_slices(tmp_path, monkeypatch):
    """Both writers stage the same new granule from the same base; the loser's slots move past the winner's, its
    row replaces the winner's, and the winner's slices leave with that row: the two commits in order, nothing
    orphaned, no batch planned again."""
    import numpy as np
    import rioxarray

    from ingest.lifecycle import check
    from ingest.pipeline._batch import commit_batch
    from ingest.pipeline._granules import granule_from_item
    from ingest.repository import Writer
    from ingest.sample import make_archive
    from ingest.stac import read_arrays_asset

    item_file = make_archive(tmp_path / "archive", granules=1, seed=3)[0]
    item = json.loads(item_file.read_text())
    granule = granule_from_item(item, str(item_file), item_file)
    repo = Repository.create(tmp_path / "repo")
    repo.ensure_groups([item["collection"]])
    # The same rasters under another id first: the stacks exist, so both writers below stage on one base.
    seed = granule_from_item({**item, "id": "seed"}, str(item_file), item_file)
    commit_batch(repo, "main", [seed], "seed")

    original = Writer.stored_items
    interfered = []

    def stored_then_beaten(self, keys):
        found = original(self, keys)
        if not interfered:
            interfered.append(None)
            interfered[0] = commit_batch(repo, "main", [granule], "the other writer")
        return found

    monkeypatch.setattr(Writer, "stored_items", stored_then_beaten)
    outcome = commit_batch(repo, "main", [granule], "this writer")

    assert interfered[0].commit is not None and interfered[0].granules == 1
    winner = read_arrays_asset(next(repo.view(interfered[0].commit.snapshot_id).items()))
    assert outcome.replans == 0 and outcome.commit is not None and outcome.commit.attempts >= 2
    rows = {row["id"]: row for row in repo.view().items()}
    assert sorted(rows) == sorted([item["id"], "seed"])
    mine = read_arrays_asset(rows[item["id"]])
    view = repo.view()
    # The winner's slices left with its row; ours hold the item.
    assert all(piece.slot not in view.slot_items(piece.stack) for piece in winner.pieces())
    assert all(view.slot_items(piece.stack)[piece.slot] == item["id"] for piece in mine.pieces())
    assert check(repo, deep=True) == []
    stored = view.item_arrays(item["collection"], item["id"])
    assert np.array_equal(stored["data"].values, rioxarray.open_rasterio(granule.rasters["data"]).values)
