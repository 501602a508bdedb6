"""The Ray pipeline on a real local cluster: rasters into arrays and items into rows, in the same commits."""

from __future__ import annotations

import io
import json
import os
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import rioxarray

from ingest import Repository
from ingest.pipeline import ingest_with_ray
from ingest.sample import make_archive
from ingest.stac import ARRAYS_ASSET, read_arrays_asset
from tests.conftest import REAL_ITEMS, load_real_items

pytestmark = pytest.mark.usefixtures("ray_cluster")


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> tuple[Path, list[Path]]:
    folder = tmp_path_factory.mktemp("archive")
    return folder, make_archive(folder, granules=40, seed=7)


def rows_at(repo: Repository, ref: str = "main") -> dict[str, dict]:
    items = list(repo.view(ref).items())
    assert len(items) == len({item["id"] for item in items}), "an item is in the table twice"
    return {item["id"]: item for item in items}


def assert_rows_and_slices_match(view) -> None:
    """Every row's pieces are slots holding its id, and every occupied slot belongs to a row."""
    named = set()
    for item in view.items():
        for piece in read_arrays_asset(item).pieces():
            assert view.slot_items(piece.stack).get(piece.slot) == item["id"], (item["id"], piece)
            named.add((piece.stack, piece.slot))
    occupied = {
        (stack, slot)
        for collection in {item["collection"] for item in view.items()}
        for stack in view.stacks(collection)
        for slot in view.slot_items(stack)
    }
    assert occupied == named


def test_archive_ingests_with_arrays_equal_to_the_source(tmp_path, archive):
    folder, item_files = archive
    repo = Repository.create(tmp_path / "repo")
    report = ingest_with_ray(repo, [folder], workers=2, batch_size=8)
    assert report.rejected == []
    # Batches are routed by area (one actor per stack within a run), each at most 8 granules.
    assert sum(commit.rows_added for commit in report.commits) == 40
    assert all(0 < commit.rows_added <= 8 for commit in report.commits)

    rows = rows_at(repo)
    assert len(rows) == len(item_files) == 40
    assert len({row["collection"] for row in rows.values()}) == 3
    tip = repo.view()
    crss = set()
    for item_file in item_files:
        source_item = json.loads(item_file.read_text())
        row = rows[source_item["id"]]
        pieces = read_arrays_asset(row).pieces()
        assert pieces and all(piece.stack.startswith(f"{source_item['collection']}/stacks/") for piece in pieces)
        source = rioxarray.open_rasterio(item_file.parent / source_item["assets"]["data"]["href"])
        dataset = tip.item_arrays(source_item["collection"], source_item["id"])
        array = dataset["data"]
        assert np.array_equal(array.values, source.values)
        assert array.dtype == source.dtype
        assert dataset.rio.crs == source.rio.crs
        assert dataset.rio.transform().almost_equals(source.rio.transform())
        crss.add(source.rio.crs.to_string())
    assert len(crss) >= 2
    # Every commit holds whole granules: rows and their slices appear together, never one without the other.
    for commit in report.commits:
        assert_rows_and_slices_match(repo.view(commit.snapshot_id))


def test_rerun_commits_nothing(tmp_path, archive):
    folder, _ = archive
    repo = Repository.create(tmp_path / "repo")
    ingest_with_ray(repo, [folder], workers=2, batch_size=20)
    tip = repo.resolve("main")
    again = ingest_with_ray(repo, [folder], workers=2, batch_size=20)
    assert again.commits == [] and again.skipped == 40
    assert repo.resolve("main") == tip


def test_bad_granules_are_rejected_and_the_rest_commits(tmp_path, archive):
    folder, item_files = archive
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    files = sorted(bad.rglob("*.json"))
    items = [path for path in files if json.loads(path.read_text()).get("type") == "Feature"]
    truncated, missing, hostile, text = items[0], items[1], items[2], items[3]
    tif = truncated.parent / json.loads(truncated.read_text())["assets"]["data"]["href"]
    tif.write_bytes(tif.read_bytes()[:1000])
    (missing.parent / json.loads(missing.read_text())["assets"]["data"]["href"]).unlink()
    hostile_item = json.loads(hostile.read_text())
    hostile_item["id"] = "../../escape"
    hostile.write_text(json.dumps(hostile_item))
    text_tif = text.parent / json.loads(text.read_text())["assets"]["data"]["href"]
    text_tif.write_text("not a tiff at all")

    repo = Repository.create(tmp_path / "repo")
    report = ingest_with_ray(repo, [bad], workers=2, batch_size=10)
    reasons = {Path(r.source).name: r.reason for r in report.rejected}
    assert set(reasons) == {truncated.name, missing.name, hostile.name, text.name}
    assert "does not exist" in reasons[missing.name]
    assert "path separator" in reasons[hostile.name]
    assert str(tif) in reasons[truncated.name] and str(text_tif) in reasons[text.name]
    rows = rows_at(repo)
    assert len(rows) == len(item_files) - 4
    rejected_ids = {json.loads(path.read_text())["id"] for path in (truncated, missing, text)}
    for commit in report.commits:
        view = repo.view(commit.snapshot_id)
        held = {
            holder
            for collection in {item_id.rsplit("-", 1)[0] for item_id in rejected_ids}
            for stack in view.stacks(collection)
            for holder in view.slot_items(stack).values()
        }
        assert not held & rejected_ids, "a rejected granule left slices behind"
        assert_rows_and_slices_match(view)


def test_real_items_metadata_only_through_the_pipeline(tmp_path):
    repo = Repository.create(tmp_path / "repo")
    report = ingest_with_ray(repo, [REAL_ITEMS], workers=2, batch_size=10)
    assert report.rejected == [] and report.bytes_written == 0
    rows = {(item["collection"], item["id"]): item for item in repo.view().items()}
    assert rows == {(item["collection"], item["id"]): item for item in load_real_items()}
    assert Counter(item["collection"] for item in rows.values()).keys() == {
        item["collection"] for item in load_real_items()
    }


def _counting_starts(monkeypatch) -> list[bool]:
    """Record every start of the actor pool (Ray started or joined, actors made)."""
    from ingest.pipeline import _ray

    starts: list[bool] = []
    original = _ray._ActorPool.start

    def start(pool) -> None:
        starts.append(True)
        original(pool)

    monkeypatch.setattr(_ray._ActorPool, "start", start)
    return starts


def test_items_without_rasters_are_committed_by_the_driver_without_ray(tmp_path, monkeypatch):
    """A batch of items alone never goes to an actor (pickling its items for Ray cost more than committing them:
    a 100,000-item search took 20.3 s against 8.9 s in-process), and no actor is made for such a run."""
    starts = _counting_starts(monkeypatch)
    repo = Repository.create(tmp_path / "repo")
    landed = io.StringIO()
    report = ingest_with_ray(repo, [REAL_ITEMS], workers=2, batch_size=10, report_to=landed)
    assert report.rejected == [] and starts == []
    lines = [json.loads(line) for line in landed.getvalue().splitlines()]
    assert sorted(line["id"] for line in lines) == sorted(item["id"] for item in load_real_items())
    assert all("node" not in line for line in lines)  # written by the driver's own process


def test_batches_with_rasters_still_go_to_the_actors_beside_items_alone(tmp_path, archive, monkeypatch):
    """Granules with rasters are committed by actors (the report names their node) while the driver commits
    the batches that hold items alone, in the same run; every item lands once."""
    folder, item_files = archive
    starts = _counting_starts(monkeypatch)
    repo = Repository.create(tmp_path / "repo")
    landed = io.StringIO()
    report = ingest_with_ray(repo, [folder, REAL_ITEMS], workers=2, batch_size=8, report_to=landed)
    assert report.rejected == [] and starts == [True]
    lines = [json.loads(line) for line in landed.getvalue().splitlines()]
    raster_ids = {json.loads(path.read_text())["id"] for path in item_files}
    assert sorted(line["id"] for line in lines) == sorted(raster_ids | {item["id"] for item in load_real_items()})
    assert all(line.get("node") for line in lines if line["id"] in raster_ids)
    assert any("node" not in line for line in lines)  # some batches held only items without rasters
    assert len(rows_at(repo)) == len(lines)


def test_rerun_of_metadata_only_items_adds_no_rows(tmp_path):
    repo = Repository.create(tmp_path / "repo")
    ingest_with_ray(repo, [REAL_ITEMS], workers=2, batch_size=25)
    tip = repo.resolve("main")
    again = ingest_with_ray(repo, [REAL_ITEMS], workers=2, batch_size=25)
    assert again.commits == [] and again.skipped == len(load_real_items())
    assert repo.resolve("main") == tip
    assert len(rows_at(repo)) == len(load_real_items())


def test_catalog_walk_stores_collections(tmp_path, archive):
    folder, item_files = archive
    repo = Repository.create(tmp_path / "repo")
    report = ingest_with_ray(repo, [folder / "catalog.json"], workers=2, batch_size=20)
    assert report.rejected == []
    assert len(rows_at(repo)) == len(item_files)
    stored = repo.collections()
    assert set(stored) == {"sample-optical", "sample-dem", "sample-landcover"}
    on_disk = json.loads((folder / "sample-dem" / "collection.json").read_text())
    assert stored["sample-dem"]["extent"] == on_disk["extent"]
    assert stored["sample-dem"]["description"] == on_disk["description"]


def test_folder_walk_stores_collections_too(tmp_path, archive):
    folder, _ = archive
    repo = Repository.create(tmp_path / "repo")
    ingest_with_ray(repo, [folder], workers=2, batch_size=20)
    assert set(repo.collections()) == {"sample-optical", "sample-dem", "sample-landcover"}
    before = repo.resolve("main")
    ingest_with_ray(repo, [folder], workers=2, batch_size=20)
    assert repo.resolve("main") == before, "storing unchanged collections again made a commit"


def test_bare_geotiffs_and_stac_geoparquet_sources(tmp_path, archive):
    _, item_files = archive
    rasters = tmp_path / "rasters"
    rasters.mkdir()
    for item_file in item_files[:3]:
        tif = next(item_file.parent.glob("*.tif"))
        shutil.copy(tif, rasters / tif.name)
    repo = Repository.create(tmp_path / "repo")
    missing_collection = ingest_with_ray(repo, [rasters], workers=2)
    assert len(missing_collection.rejected) == 3
    assert all("--collection" in r.reason for r in missing_collection.rejected)
    report = ingest_with_ray(repo, [rasters], workers=2, default_collection="bare")
    assert report.rejected == [] and report.rows_added == 3
    rows = rows_at(repo)
    for item_file in item_files[:3]:
        item_id = item_file.stem
        row = rows[item_id]
        assert row["collection"] == "bare"
        source = rioxarray.open_rasterio(next(item_file.parent.glob("*.tif")))
        dataset = repo.view().item_arrays("bare", item_id)
        assert np.array_equal(dataset["data"].values, source.values)

    import pyarrow as pa
    import stac_geoparquet.arrow as sga

    items = [json.loads(path.read_text()) for path in item_files[3:9]]
    for item in items:
        item["assets"] = {"data": {"href": f"https://example.com/{item['id']}.tif", "type": "image/tiff"}}
    parquet = tmp_path / "items.parquet"
    sga.to_parquet(pa.Table.from_batches(sga.parse_stac_items_to_arrow(items)), parquet)
    report = ingest_with_ray(repo, [parquet], workers=2)
    assert report.rejected == [] and report.rows_added == 6
    assert {item["id"] for item in items} <= set(rows_at(repo))


def test_local_cluster_listens_on_loopback_only():
    import psutil

    ray_names = ("gcs_server", "raylet", "ray::", "default_worker")
    pids = {
        process.pid
        for process in psutil.process_iter(["name", "cmdline"])
        if any(name in " ".join(process.info["cmdline"] or [process.info["name"] or ""]) for name in ray_names)
    }
    listening = [
        connection
        for connection in psutil.net_connections(kind="inet")
        if connection.status == psutil.CONN_LISTEN and connection.pid in pids
    ]
    assert listening, "found no Ray server to check"
    exposed = {c.laddr.ip for c in listening} - {"127.0.0.1", "::ffff:127.0.0.1", "::1"}
    assert not exposed, f"Ray listens beyond loopback: {exposed}"


def test_changed_item_and_raster_replace_exactly_those(tmp_path, archive):
    folder, _ = archive
    source = tmp_path / "archive"
    shutil.copytree(folder, source)
    repo = Repository.create(tmp_path / "repo")
    ingest_with_ray(repo, [source], workers=2, batch_size=20)
    before = repo.resolve("main")
    old_rows = rows_at(repo)

    item_files = sorted(source.glob("*/*/*.json"))
    edited_item, edited_raster = item_files[0], item_files[1]
    changed = json.loads(edited_item.read_text())
    changed["properties"]["floe:test-edit"] = "second version"
    edited_item.write_text(json.dumps(changed))
    raster_item = json.loads(edited_raster.read_text())
    tif = edited_raster.parent / raster_item["assets"]["data"]["href"]
    pixels = rioxarray.open_rasterio(tif).load()
    pixels.values[:] = pixels.values[::-1].copy() if pixels.shape[0] > 1 else pixels.values.max() - pixels.values
    pixels.rio.to_raster(tif, driver="COG")
    new_pixels = rioxarray.open_rasterio(tif).values

    report = ingest_with_ray(repo, [source], workers=2, batch_size=20)
    assert report.rejected == []
    assert report.replaced == 2 and report.skipped == 38 and report.rows_added == 2
    rows = rows_at(repo)
    assert len(rows) == 40
    assert rows[changed["id"]]["properties"]["floe:test-edit"] == "second version"
    changed_others = {
        item_id for item_id, row in rows.items() if row != old_rows[item_id] and item_id != raster_item["id"]
    }
    assert changed_others == {changed["id"]}
    collection, item_id = raster_item["collection"], raster_item["id"]
    tip = repo.view().item_arrays(collection, item_id)
    assert np.array_equal(tip["data"].values, new_pixels)
    # The old slices left in the same commit: their slots are free at the tip, and rows and slices still match.
    for piece in read_arrays_asset(old_rows[item_id]).pieces():
        assert piece.slot not in repo.view().slot_items(piece.stack)
    assert_rows_and_slices_match(repo.view())
    # The version before the update still has the old pixels and the old item.
    old = repo.view(before).item_arrays(collection, item_id)
    assert not np.array_equal(old["data"].values, new_pixels)
    assert "floe:test-edit" not in rows_at(repo, before)[changed["id"]]["properties"]

    # A raster rewritten byte for byte (new mtime, same content) is recognised by its digest: nothing to do.
    untouched = item_files[2].parent / json.loads(item_files[2].read_text())["assets"]["data"]["href"]
    untouched.write_bytes(untouched.read_bytes())
    os.utime(untouched, ns=(untouched.stat().st_atime_ns, untouched.stat().st_mtime_ns + 10**9))
    again = ingest_with_ray(repo, [source], workers=2, batch_size=20)
    assert again.commits == [] and again.skipped == 40


def _tree_bytes(path: Path) -> int:
    return sum(file.stat().st_size for file in path.rglob("*") if file.is_file())


def test_virtual_ingest_references_pixels_in_place(tmp_path, archive):
    folder, _ = archive
    source = tmp_path / "archive"
    shutil.copytree(folder, source)
    repo = Repository.create(tmp_path / "repo")
    report = ingest_with_ray(repo, [source], workers=2, batch_size=10, virtual=True)
    assert report.rejected == []
    # Single-band COGs are referenced; the pixel-interleaved optical ones are copied, each named with the reason.
    fallback_ids = {fallback.item_id for fallback in report.fallbacks}
    assert fallback_ids and all(item_id.startswith("sample-optical") for item_id in fallback_ids)
    assert all("interleav" in fallback.reason for fallback in report.fallbacks)
    assert report.virtual + len(report.fallbacks) == 40

    reopened = Repository.open(repo.location.url)
    rows = rows_at(reopened)
    assert len(rows) == 40
    tip = reopened.view()
    referenced_bytes = 0
    for item_file in sorted(source.glob("*/*/*.json")):
        item = json.loads(item_file.read_text())
        asset = rows[item["id"]]["assets"][ARRAYS_ASSET]
        assert asset.get("floe:virtual", False) == (item["id"] not in fallback_ids)
        tif = item_file.parent / item["assets"]["data"]["href"]
        expected = rioxarray.open_rasterio(tif)
        dataset = tip.item_arrays(item["collection"], item["id"])
        assert np.array_equal(dataset["data"].values, expected.values)
        assert dataset.rio.crs == expected.rio.crs
        assert dataset.rio.transform().almost_equals(expected.rio.transform())
        if item["id"] not in fallback_ids:
            referenced_bytes += expected.values.nbytes

    # The referenced pixels are not in the repository: compare with a copy-mode ingest of the same archive.
    copy = Repository.create(tmp_path / "copy")
    ingest_with_ray(copy, [source], workers=2, batch_size=10)
    saved = _tree_bytes(tmp_path / "copy" / "arrays" / "chunks") - _tree_bytes(tmp_path / "repo" / "arrays" / "chunks")
    assert referenced_bytes > 0 and saved > 0.5 * referenced_bytes

    again = ingest_with_ray(repo, [source], workers=2, batch_size=10, virtual=True)
    assert again.commits == [] and again.skipped == 40

    # A referenced file rewritten byte for byte is stale for Icechunk (modified after the reference): unlike a
    # copy, it is referenced again, and reads back.
    referenced = next(
        item_file
        for item_file in sorted(source.glob("*/*/*.json"))
        if json.loads(item_file.read_text())["id"] not in fallback_ids
    )
    item = json.loads(referenced.read_text())
    assert "blake2b" not in rows[item["id"]]["assets"][ARRAYS_ASSET]["floe:sources"]["data"]  # no digest to read
    tif = referenced.parent / item["assets"]["data"]["href"]
    tif.write_bytes(tif.read_bytes())
    os.utime(tif, ns=(tif.stat().st_atime_ns, tif.stat().st_mtime_ns + 10**9))
    refreshed = ingest_with_ray(repo, [source], workers=2, batch_size=10, virtual=True)
    assert refreshed.replaced == 1 and refreshed.skipped == 39 and len(refreshed.commits) == 1
    dataset = Repository.open(repo.location.url).view().item_arrays(item["collection"], item["id"])
    assert np.array_equal(dataset["data"].values, rioxarray.open_rasterio(tif).values)
