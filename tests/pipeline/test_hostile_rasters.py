"""Hostile rasters through the real ``floe ingest`` with Ray (issue 14): one ingest of items whose assets are
broken TIFFs, and of bare broken TIFFs, beside good granules. Each broken one is rejected by name with its reason
on one stderr line and no traceback; the good granules are committed with their arrays; the repository passes
``floe check --all --deep``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from ingest.sample import make_archive
from ingest.stac import without_arrays_asset
from tests.pipeline._hostile import Run, ingest_and_read, rejection_lines


@dataclass(frozen=True)
class RasterCase:
    name: str
    damage: str
    """How the TIFF is broken: truncate, garble, text, empty, missing, loop, or none (a good one)."""
    bare: bool
    reason: str | None


RASTER_CASES = [
    RasterCase("item-tiff-truncated", "truncate", False, "cannot be read: truncated or corrupt pixels"),
    RasterCase("item-tiff-garbled", "garble", False, "cannot be read: not a readable GeoTIFF"),
    RasterCase("item-tiff-is-text", "text", False, "not recognized as being in a supported file format"),
    RasterCase("item-tiff-missing", "missing", False, "asset 'data' does not exist"),
    RasterCase("item-tiff-good", "none", False, None),
    RasterCase("bare-tiff-truncated", "truncate", True, "cannot be read: truncated or corrupt pixels"),
    RasterCase("bare-tiff-garbled", "garble", True, "not a readable raster (bare-tiff-garbled.tif: TIFFReadDirectory"),
    RasterCase("bare-tiff-is-text", "text", True, "not recognized as being in a supported file format"),
    RasterCase("bare-tiff-empty", "empty", True, "not a readable raster"),
    RasterCase("bare-tiff-symlink-loop", "loop", True, "is a symbolic link loop"),
    RasterCase("bare-tiff-good", "none", True, None),
]


def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncate":
        path.write_bytes(data[: len(data) // 3])
    elif how == "garble":
        # The TIFF signature stays, the rest (the first directory included) is noise.
        path.write_bytes(data[:16] + bytes((n * 131 + 7) % 256 for n in range(len(data) - 16)))
    elif how == "text":
        path.write_text("this is not a TIFF, only text named like one\n")
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "missing":
        path.unlink()
    elif how == "loop":
        path.unlink()
        path.symlink_to(path.name)


@pytest.fixture(scope="module")
def raster_corpus(tmp_path_factory, ray_cluster) -> tuple[dict[str, tuple[str, dict | None]], Run]:
    import ray

    base = tmp_path_factory.mktemp("hostile-rasters")
    items_folder, bare_folder = base / "items", base / "bare"
    item_cases = [case for case in RASTER_CASES if not case.bare]
    item_files = make_archive(items_folder, granules=len(item_cases) + 1, seed=5)
    expected: dict[str, tuple[str, dict | None]] = {}  # case -> (source, the item it must commit)
    for case, item_file in zip(item_cases, item_files, strict=False):
        item = json.loads(item_file.read_text())
        damage(item_file.parent / item["assets"]["data"]["href"], case.damage)
        expected[case.name] = (str(item_file), item if case.reason is None else None)
    spare = json.loads(item_files[-1].read_text())  # one more good granule beside the cases
    expected["spare-good-granule"] = (str(item_files[-1]), spare)
    donor = base / "donor"
    (tiff,) = [path for path in make_archive(donor, granules=1, seed=6)[0].parent.glob("*.tif")]
    bare_folder.mkdir()
    for case in RASTER_CASES:
        if case.bare:
            path = bare_folder / f"{case.name}.tif"
            path.write_bytes(tiff.read_bytes())
            damage(path, case.damage)
            expected[case.name] = (str(path), {"id": case.name} if case.reason is None else None)
    address = ray.get_runtime_context().gcs_address
    run = ingest_and_read(
        base / "repo",
        [items_folder, bare_folder],
        "--collection",
        "bare",
        "--workers",
        "2",
        "--batch-size",
        "4",
        "--ray-address",
        address,
        env={"RAY_AUTH_MODE": "token"},
    )
    return expected, run


def test_the_raster_run_exits_3_without_a_traceback_and_passes_the_deep_check(raster_corpus):
    _, run = raster_corpus
    assert run.ingest.returncode == 3, run.ingest.stderr[-3000:]
    assert "Traceback" not in run.ingest.stderr
    assert run.check is not None and run.check.returncode == 0, run.check
    assert len(run.report) == sum(case.reason is not None for case in RASTER_CASES)


@pytest.mark.parametrize("case", RASTER_CASES, ids=[case.name for case in RASTER_CASES])
def test_raster_case(raster_corpus, case):
    expected, run = raster_corpus
    source, item = expected[case.name]
    mine = [entry for entry in run.report if entry["source"] == source]
    if case.reason is None:
        assert mine == []
        key = ("bare", case.name) if case.bare else (item["collection"], item["id"])
        stored = run.exported[key]
        assert "floe:arrays" in stored["assets"]
        if not case.bare:
            assert without_arrays_asset(stored) == item
        return
    (rejection,) = mine
    assert case.reason in rejection["reason"], rejection
    lines = [line for line in rejection_lines(run.ingest.stderr) if line.startswith(f"rejected {source}: ")]
    assert len(lines) == 1 and case.reason in lines[0], run.ingest.stderr


def test_the_good_granule_beside_the_raster_cases_is_committed(raster_corpus):
    expected, run = raster_corpus
    _, item = expected["spare-good-granule"]
    assert without_arrays_asset(run.exported[(item["collection"], item["id"])]) == item
