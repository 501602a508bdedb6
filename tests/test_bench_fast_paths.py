"""Smoke test of scripts/bench_fast_paths.py at tiny sizes: every fast path is measured ON and OFF with a ratio
printed, and each OFF switch really switches its fast path off (the runs count the fast functions' calls on their
code objects: none in an OFF run, some in an ON run). Timings are never checked."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench_fast_paths.py"
ARMS = ("wkb", "nested", "tiff", "keys")
GRANULES = 4

pytestmark = pytest.mark.slow  # a dozen processes, each importing floe: about half a minute


def calls(figures: dict[str, Any], group: str, name: str) -> int:
    """Calls of ``name`` in the (only) round of a run's figures."""
    return figures["calls"][0][group][name]["calls"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any], Path]:
    folder = tmp_path_factory.mktemp("bench-fast-paths")
    figures, workdir = folder / "figures.json", folder / "work"
    sizes = ["--items", "300", "--granules", str(GRANULES), "--rounds", "1"]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *sizes, "--json", str(figures), "--workdir", str(workdir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout, json.loads(figures.read_text()), workdir


def test_every_fast_path_prints_a_ratio_and_a_verdict(run):
    stdout, document, workdir = run
    for arm in ARMS:
        assert re.search(rf"^{arm}: gain OFF/ON \d+\.\d\dx \(", stdout, re.MULTILINE), arm
        assert re.search(rf"^{arm}: \d+\.\d\dx -> (>=|<) 1\.05x: ", stdout, re.MULTILINE), arm
    assert re.search(r"^wkb: gain ROW/ON \d+\.\d\dx \(", stdout, re.MULTILINE)
    assert re.search(r"^keys: gain OFF/ON \d+\.\d\dx \(replace", stdout, re.MULTILINE)
    assert set(document["arms"]) == set(ARMS)
    for entry in document["arms"].values():
        assert entry["gains"] and all(gain > 0 for gain in entry["gains"].values())
    assert list(workdir.iterdir()) == []  # the temporary folder was removed


def test_off_switches_the_fast_path_off_and_on_takes_it(run):
    _stdout, document, _workdir = run
    for arm, entry in document["arms"].items():
        for workload, variants in entry["workloads"].items():
            for variant, figures in variants.items():
                fast = figures["calls"][0]["fast"]
                if variant == "on":  # called, and returned a result
                    assert sum(figure["results"] for figure in fast.values()) > 0, (arm, workload)
                elif variant == "off":
                    assert all(figure["calls"] == 0 for figure in fast.values()), (arm, workload, fast)


def test_the_off_runs_take_the_fallback(run):
    """Each OFF run did its work the general way: GEOS, row by row, virtual-tiff for every file, every candidate
    file read; the wkb arm's ROW run takes simple_wkb row by row without the numpy twins."""
    _stdout, document, _workdir = run
    arms = document["arms"]
    wkb = arms["wkb"]["workloads"]["items"]
    assert calls(wkb["on"], "watched", "_geos_wkb") == 0 < calls(wkb["off"], "watched", "_geos_wkb")
    assert calls(wkb["row"], "fast", "simple_wkb") > 0
    assert calls(wkb["row"], "fast", "one_ring_polygons_wkb") == calls(wkb["row"], "fast", "one_ring_positions") == 0
    nested = arms["nested"]["workloads"]["items"]
    assert calls(nested["off"], "watched", "_same") > calls(nested["on"], "watched", "_same")
    tiff = arms["tiff"]["workloads"]["granules"]
    assert calls(tiff["off"], "watched", "_parsed") == GRANULES > calls(tiff["on"], "watched", "_parsed")
    assert calls(tiff["on"], "watched", "_described_from_head") == 0  # local files: the remote-only path is idle
    replace = arms["keys"]["workloads"]["replace"]
    assert calls(replace["off"], "watched", "data_fragment") > calls(replace["on"], "watched", "data_fragment")
    for variant in ("on", "off"):  # each did the work it is measured on: nothing added, then 1 item in 10 replaced
        assert arms["keys"]["workloads"]["rerun"][variant]["report"][0]["rows_added"] == 0
        assert arms["keys"]["workloads"]["replace"][variant]["report"][0]["replaced"] == 30
