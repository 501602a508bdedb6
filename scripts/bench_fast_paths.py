"""Does each of floe's hand-written fast paths pay? Each against the general path it shortcuts, end to end, one run.

Run:  .venv/bin/python scripts/bench_fast_paths.py             (100,000 items, 300 COGs, 3 rounds: ~10 min here)
      .venv/bin/python scripts/bench_fast_paths.py --items 20000 --granules 100 --rounds 1
      .venv/bin/python scripts/bench_fast_paths.py --only wkb,keys --json figures.json

The team's rule: a fast path that makes the end-to-end run less than 5% faster is replaced by the library call
it shortcuts. Every fast path here already has its general fallback (the fast function returns None, or a
slower general function exists), so each is measured ON (as shipped) against OFF (its callers patched to take
the fallback), workloads as a user runs them, the baseline measured in the same run. Nothing asserts on a time.

Each run of an arm is a fresh process (``python -c``, never a fork): it imports floe and the modules the work
uses, switches the fast path off (OFF arms), then times the library call alone (no import, no repository
creation, no branch creation in the figure). ON and OFF alternate round by round (``--rounds``; the order is
rotated every round, so drift on a shared machine touches both alike), after one warm-up run that is not
counted (the first arm's ON: the first process to read the data just written); the median of each counts.
Every run also checks that it did the work expected of it (rows added, skipped, replaced, referenced) and
reports, for each fast function, how many times it ran and how many of those returned a result, counted with
``sys.monitoring`` on the function's own code object (no wrapper: a call by any name counts, and an OFF run
shows 0 only if the original never ran). Counting costs well under a microsecond a call.

The fast paths, their switches, and what was decided reading the code:

* ``wkb``: ``ingest/stac/_wkb.py: simple_wkb`` writes ISO WKB from the GeoJSON dict; None sends the geometry to
  GEOS (``_rows._geometry_to_wkb`` -> ``_geos_wkb``: ``shapely.from_geojson``, ``to_wkb`` and the round trip that
  keeps the row lossless; ``_geometry.refused_geometries`` -> ``_check_parsed``: GEOS parses). Its batch twins
  ``one_ring_polygons_wkb`` (the same bytes for a whole batch of one-ring polygons, in numpy) and
  ``one_ring_positions`` (the same walk for validation) belong to this arm:
  ``_rows._items_to_arrow`` asks ``one_ring_polygons_wkb`` first and reaches ``simple_wkb`` only when it
  declines (``refused_geometries`` likewise with ``one_ring_positions``), so on a batch of plain footprints
  ``simple_wkb`` is never called ON, and switching it off alone would measure nothing. OFF patches all three
  names where they are imported (``_rows``, ``_geometry``): GEOS/shapely does every geometry. A third arm, ROW,
  switches off the twins only (``simple_wkb`` row by row, their own fallback): ROW/ON is what the numpy twins
  add over ``simple_wkb``, OFF/ON what hand-written WKB as a whole adds over the library.
* ``nested``: ``ingest/stac/_columns.py: _plain`` tells from a few scans of a nested column's JSON text (no
  null, no boolean, no 16-digit run) that ``pa.array`` changes none of its values, so the column is typed without
  reading it back to compare; its answer is a (plain, booleans) pair, and (False, True) is the general way (the
  column read back and compared value by value, ``_same``): OFF answers that.
  (Until 2026-12-07 a ``vector`` arm measured ``canonical_times`` and ``plain_bboxes``, timestamps and bboxes
  of a uniform batch converted in Arrow: 1.08x over 3 rounds, 0.99x over 7; they were taken out.)
* ``tiff``: ``ingest/rasters/_tiff.py: first_image_references`` reads a COG's tile index from its header and
  asks virtual-tiff once per decoding layout; OFF replaces it, where ``_source.plan_source`` imports it, by
  ``_tiff._parsed`` (virtual-tiff parses every file: the function's own fallback). The header-described path
  of ``_source.py`` (``_HEADER_LAYOUTS``, ``_described_from_head``: GDAL describes a file from its header bytes
  instead of opening it) is left on in both arms: it shortcuts GDAL's open, not virtual-tiff's parse, does not
  depend on this module's tile index, and runs only for remote files (``plan_source`` reads no ``head`` for a
  ``file://`` URL), so on this local workload it never runs (its count shows 0) and switching it off would
  change nothing; it needs remote COGs to be measured. ``floe ingest --virtual --workers 0`` is refused by the
  CLI (virtual references go through Ray), so the workload runs ``ingest_with_ray(workers=1, virtual=True)``
  with its one actor's work done in the same process: the ``GranuleWriter`` repository, opened when the first
  batch comes, and ``commit_batch`` for each batch, exactly what the actor runs, without Ray's start-up and
  where the switch reaches it.
* ``keys``: ``ingest/repository/_keys.py: KeyIndex.holding`` rules out, in memory (id fingerprints from the
  manifests' id sketches), the candidate data files that hold none of a batch's ids. OFF:
  ``KeyIndex.holding = lambda self, files, ids: list(files)``: ``_replace.locate`` then reads the (collection,
  id) columns of every candidate the partition and id bounds leave, as a plain pyarrow read would. Its upkeep
  (``learn``, ``retain``) still runs OFF, and the id sketches are written for searches either way.

Workloads (``--items``, ``--granules``; default batch size, fresh local repository each run unless said):

* wkb, nested: ``scripts/bench_ingest.py``'s generated items as NDJSON, ``ingest_items`` (what
  ``floe ingest --workers 0`` calls). Items/s.
* tiff: ``--granules`` of ``make_archive``'s small COGs (``scripts/make_sample_archive.py``; 4 grid positions a
  collection, as ``floe demo``), its single-band collections only (the 3-band optical COGs are pixel-interleaved,
  which ``--virtual`` copies instead), in granule order, as NDJSON with absolute hrefs. Granules/s.
* keys: the same generated items as an archive of three years arrives, as ``_keys.py`` describes real ones: in
  time order (datetimes re-spread evenly over 2022-2024: bench_ingest's own tie month to collection, 12
  partitions in all) with ids named tile first (``T33U_20230105_...``), so each batch's ids span every file's id
  bounds and only the partitions (collection, month) of its weeks hold them; ``--keys-ids arrival`` takes
  bench_ingest's items as they are (ids in arrival order, every batch across every partition). Ingested once
  (not timed; then tagged). Each run then works on a branch of its own made from that tag: (a) the same
  ingest again (a re-run: every item found unchanged, nothing committed), then, in a new process, (b) 10% of the
  items (a contiguous run of the arrival order: a reprocessed period) with ``eo:cloud_cover`` changed. There
  is no ``--replace`` option: an ingest replaces the row of every changed item by itself. Seconds of each.

Reading the output: a table per fast path with the median seconds and rate of each arm, every round's
seconds, and the calls of the fast and of the fallback functions; then ``gain OFF/ON`` = OFF's median time /
ON's (1.12x: the fast path makes the run 12% faster) and the verdict, ">= 1.05x: keeps its place" or "< 1.05x:
replace with the library call" (for ``keys``, each workload's; the fast path keeps its place if one of them
passes). With one round the medians are single runs: on a shared machine, noise of several percent (tens
of percent while other work loads it). When wkb
and nested both run, their ON arms run the same code on the same items: the distance between their medians is
printed last, as this run's noise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KEEP = 1.05
"""The least end-to-end gain (OFF time / ON time) for which a fast path keeps its place."""
CHILD = "import sys; sys.path.insert(0, sys.argv[1]); from scripts.bench_fast_paths import run_child; run_child()"
"""What each run's fresh process executes: ``python -c CHILD ROOT SPEC`` (SPEC: JSON)."""
BASE_TAG = "base"
"""The tag of the keys workload's table, from which each keys run makes its branch."""
REPLACED_SHARE = 10
"""The keys workload's replacement ingest takes one item in this many (a contiguous run)."""


@dataclass(frozen=True)
class Arm:
    """One fast path's arm: its variants (``on`` first), the workloads it is measured on, the functions counted."""

    title: str
    variants: dict[str, str]
    """Variant (``on``: as shipped, ``off``, the wkb arm's ``row``) -> what runs in it."""
    workloads: tuple[str, ...]
    fast: tuple[str, ...]
    """``module:qualname`` of the fast functions: ON runs call them, OFF runs must not."""
    watched: tuple[str, ...]
    """``module:qualname`` of the fallback's functions (and, for tiff, the other fast path left on), for reading."""


ARMS = {
    "wkb": Arm(
        "hand-written WKB (simple_wkb and its numpy twins) against GEOS/shapely",
        {
            "on": "as shipped: the numpy twins, simple_wkb for batches they decline",
            "row": "the twins off: simple_wkb row by row, GEOS for the rest",
            "off": "all three off: GEOS/shapely parses and writes every geometry",
        },
        ("items",),
        (
            "ingest.stac._wkb:simple_wkb",
            "ingest.stac._wkb:one_ring_polygons_wkb",
            "ingest.stac._wkb:one_ring_positions",
        ),
        ("ingest.stac._rows:_geos_wkb", "ingest.stac._geometry:_check_parsed"),
    ),
    "nested": Arm(
        "nested columns typed without a read-back, against reading every column back to compare",
        {"on": "as shipped", "off": "_plain answers (False, True): every nested column read back and compared"},
        ("items",),
        ("ingest.stac._columns:_plain",),
        ("ingest.stac._columns:_same",),
    ),
    "tiff": Arm(
        "TIFF tile index read from the header, against virtual-tiff parsing every file",
        {"on": "as shipped: virtual-tiff once per decoding layout", "off": "virtual-tiff parses every file"},
        ("granules",),
        ("ingest.rasters._tiff:first_image_references",),
        ("ingest.rasters._tiff:_parsed", "ingest.rasters._source:_described_from_head"),
    ),
    "keys": Arm(
        "key index ruling out data files in memory, against reading every candidate's ids",
        {"on": "as shipped", "off": "KeyIndex.holding keeps every candidate: each is read to confirm"},
        ("rerun", "replace"),
        ("ingest.repository._keys:KeyIndex.holding",),
        ("ingest.repository._read:data_fragment",),
    ),
}

WORKLOAD_UNITS = {"items": "items", "granules": "granules", "rerun": "items", "replace": "items"}
WORKLOAD_NAMES = {
    "items": "ingest of generated items (NDJSON, `ingest_items`, fresh repository)",
    "granules": "--virtual ingest of small COGs (fresh repository)",
    "rerun": "(a) re-run of the whole ingest: every item found, nothing committed",
    "replace": f"(b) ingest of 1 item in {REPLACED_SHARE} again, changed: their rows replaced",
}


def log(message: str) -> None:
    print(f"[bench_fast_paths {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def verdict(gain: float) -> str:
    return f">= {KEEP:.2f}x: keeps its place" if gain >= KEEP else f"< {KEEP:.2f}x: replace with the library call"


# -- the runs' processes ---------------------------------------------------------------------------------------


def _declines(*_args: Any, **_kwargs: Any) -> None:
    """A fast path that takes nothing: its caller goes the general way."""
    return None


def switch(arm: str, variant: str) -> None:
    """Switch the arm's fast path off (``off``; the wkb arm's ``row``: its numpy twins only) where callers find it."""
    if variant == "on":
        return
    if arm == "wkb":
        from ingest.stac import _geometry, _rows

        _rows.one_ring_polygons_wkb = _declines
        _geometry.one_ring_positions = _declines
        if variant == "off":
            _rows.simple_wkb = _declines
            _geometry.simple_wkb = _declines
    elif arm == "nested":
        from ingest.stac import _columns

        _columns._plain = lambda values: (False, True)
    elif arm == "tiff":
        from ingest.rasters import _source, _tiff

        def parsed_by_virtual_tiff(place: Any, head: bytes | None = None) -> Any:
            return _tiff._parsed(place)

        _source.first_image_references = parsed_by_virtual_tiff
    elif arm == "keys":
        from ingest.repository._keys import KeyIndex

        KeyIndex.holding = lambda self, files, ids: list(files)  # type: ignore[method-assign]
    else:
        raise ValueError(f"no fast path {arm!r}")


def _function(target: str) -> Any:
    """The function ``module:qualname`` names."""
    import importlib

    module, qualname = target.split(":")
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


class Calls:
    """Calls of some functions, and how many returned a result (not None), counted with ``sys.monitoring`` on
    their code objects: whatever name a caller reaches one by, a run of its code counts."""

    def __init__(self, groups: dict[str, tuple[str, ...]]) -> None:
        monitoring = sys.monitoring
        self.codes: dict[int, tuple[str, str, Any]] = {}  # id(code) -> (group, name, code): the code kept alive
        for group, targets in groups.items():
            for target in targets:
                code = _function(target).__code__
                self.codes[id(code)] = (group, target.split(":")[1], code)
        self.calls = dict.fromkeys(self.codes, 0)
        self.results = dict.fromkeys(self.codes, 0)
        self.tool = next(tool for tool in (3, 4) if monitoring.get_tool(tool) is None)  # ids no standard tool takes
        monitoring.use_tool_id(self.tool, "bench_fast_paths")
        monitoring.register_callback(self.tool, monitoring.events.PY_START, self._started)
        monitoring.register_callback(self.tool, monitoring.events.PY_RETURN, self._returned)
        for _group, _name, code in self.codes.values():
            monitoring.set_local_events(self.tool, code, monitoring.events.PY_START | monitoring.events.PY_RETURN)

    def _started(self, code: Any, _offset: int) -> None:
        self.calls[id(code)] += 1

    def _returned(self, code: Any, _offset: int, value: Any) -> None:
        if value is not None:
            self.results[id(code)] += 1

    def figures(self) -> dict[str, dict[str, dict[str, int]]]:
        """Group -> function -> its calls and results."""
        figures: dict[str, dict[str, dict[str, int]]] = {}
        for key, (group, name, _code) in self.codes.items():
            figures.setdefault(group, {})[name] = {"calls": self.calls[key], "results": self.results[key]}
        return figures


_IMPORTED = {
    "items": ("ingest.pipeline", "ingest.pipeline.sources", "ingest.stac", "ingest.repository"),
    "granules": ("ingest.pipeline", "ingest.pipeline.sources", "ingest.stac", "ingest.repository", "ingest.rasters"),
}
_IMPORTED["rerun"] = _IMPORTED["replace"] = _IMPORTED["setup"] = _IMPORTED["items"]


def _import_everything(workload: str) -> None:
    """Import every module of the packages the work uses (many load on first use): the time is the work's only."""
    import importlib
    import pkgutil

    for package_name in _IMPORTED[workload]:
        package = importlib.import_module(package_name)
        for module in pkgutil.iter_modules(package.__path__, package_name + "."):
            importlib.import_module(module.name)


def _summary(report: Any) -> dict[str, int]:
    return {
        "items_read": report.items_read,
        "rows_added": report.rows_added,
        "skipped": report.skipped,
        "replaced": report.replaced,
        "virtual": report.virtual,
        "fallbacks": len(report.fallbacks),
        "rejected": len(report.rejected),
        "commits": len(report.commits),
        "compactions": len(report.compactions),
    }


def _check(done: bool, what: str, report: Any) -> None:
    """Stop when a run did not do the work it is measured on (a time of other work would compare nothing)."""
    if not done:
        rejected = "; ".join(str(rejection) for rejection in report.rejected[:3])
        raise SystemExit(f"the run did not {what}: {_summary(report)} {rejected}")


def _timed(work: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    result = work()
    return time.perf_counter() - started, result


def _work_items(spec: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    from ingest import Repository, Settings
    from ingest.pipeline import ingest_items

    repository = Repository.create(spec["root"], Settings())
    seconds, report = _timed(lambda: ingest_items(repository, [spec["source"]]))
    _check(report.rows_added == spec["expected"] and not report.rejected, f"add {spec['expected']} rows", report)
    return seconds, _summary(report)


def _in_process_pool(base: type, writer_class: type, commit_batch: Any) -> type:
    """``ingest_with_ray``'s actor pool with its one actor's work done in this process: a ``GranuleWriter``
    (its own repository object, opened when the first batch comes, as the actor is made) and ``commit_batch``
    for each batch, as ``GranuleWriter.ingest`` runs it; no Ray."""

    class InProcessPool(base):  # type: ignore[misc, valid-type]
        writer: Any = None

        def start(self) -> None:
            self.writer = writer_class(self.repository.location.url, self.repository.settings.model_dump(), self.branch)

        def submit(self, batch: list[Any], message: str, virtual: bool, *, lane: int | None = None) -> None:
            if self.writer is None:
                self.start()
            self.collect(commit_batch(self.writer.repository, self.writer.branch, batch, message, virtual=virtual))

        def drain(self) -> None:
            pass

        def close(self) -> None:
            pass

    return InProcessPool


def _work_granules(spec: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    from ingest import Repository, Settings
    from ingest.pipeline import _ray
    from ingest.pipeline._batch import commit_batch

    _ray._ActorPool = _in_process_pool(_ray._ActorPool, _ray.GranuleWriter, commit_batch)  # type: ignore[misc]
    repository = Repository.create(spec["root"], Settings())
    seconds, report = _timed(lambda: _ray.ingest_with_ray(repository, [spec["source"]], workers=1, virtual=True))
    expected = spec["expected"]
    done = report.rows_added == expected and report.virtual == expected and not report.fallbacks
    _check(done and not report.rejected, f"reference {expected} granules", report)
    return seconds, _summary(report)


def _work_setup(spec: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """The keys workload's table: every item ingested once, tagged; with the count of its live data files."""
    from ingest import Repository, Settings
    from ingest.pipeline import ingest_items

    repository = Repository.create(spec["root"], Settings())
    seconds, report = _timed(lambda: ingest_items(repository, [spec["source"]]))
    _check(report.rows_added == spec["expected"] and not report.rejected, f"add {spec['expected']} rows", report)
    repository.tag(BASE_TAG)
    table = repository.table_at(repository.resolve(BASE_TAG))
    return seconds, {**_summary(report), "data_files": len(repository.manifests.live_files(table.metadata))}


def _work_on_branch(spec: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """(a) ``rerun``: the branch made from the base tag, then the same ingest again; (b) ``replace``: the changed
    items, on the branch (a) left as it found it."""
    from ingest import Repository, Settings
    from ingest.pipeline import ingest_items

    if spec["workload"] == "rerun":
        Repository.open(spec["root"], Settings()).branch(spec["branch"], f"tag:{BASE_TAG}")
    repository = Repository.open(spec["root"], Settings())  # opened anew, as a user's next command does
    seconds, report = _timed(lambda: ingest_items(repository, [spec["source"]], branch=spec["branch"]))
    expected = spec["expected"]
    if spec["workload"] == "rerun":
        _check(report.rows_added == 0 and report.skipped == expected, f"skip all {expected} items", report)
    else:
        _check(report.replaced == expected and not report.rejected, f"replace {expected} rows", report)
    return seconds, _summary(report)


WORKLOADS = {
    "items": _work_items,
    "granules": _work_granules,
    "setup": _work_setup,
    "rerun": _work_on_branch,
    "replace": _work_on_branch,
}


def run_child() -> None:
    """One run, in a process of its own: imports, counting, the switch, then the timed work; figures to a file."""
    spec = json.loads(sys.argv[2])
    arm = ARMS[spec["arm"]]
    _import_everything(spec["workload"])
    calls = Calls({"fast": arm.fast, "watched": arm.watched})  # the originals, found before the switch
    switch(spec["arm"], spec["variant"])
    seconds, report = WORKLOADS[spec["workload"]](spec)
    result = {"seconds": seconds, "report": report, "calls": calls.figures()}
    Path(spec["result"]).write_text(json.dumps(result))


# -- the driver ----------------------------------------------------------------------------------------------


def run(workdir: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """Run one arm's work in a fresh process; its figures."""
    result = workdir / "result.json"
    result.unlink(missing_ok=True)
    spec = {**spec, "result": str(result)}
    command = [sys.executable, "-c", CHILD, str(ROOT), json.dumps(spec)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not result.exists():
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-25:])
        raise SystemExit(f"{spec['arm']} {spec['variant']} {spec['workload']} failed (exit {done.returncode}):\n{tail}")
    return json.loads(result.read_text())


def write_ndjson(path: Path, items: list[dict[str, Any]]) -> Path:
    with path.open("w") as out:
        for item in items:
            out.write(json.dumps(item) + "\n")
    return path


_LATITUDE_BANDS = "CDEFGHJKLMNPQRSTUVWX"
KEYS_START = datetime(2022, 1, 1, tzinfo=UTC)
KEYS_YEARS = 3
"""The keys workload's archive spans this many years (36 months a collection: a table of many partitions)."""


def keys_items(count: int, ids: str) -> list[dict[str, Any]]:
    """bench_ingest's items; with ``ids`` ``tile-first``, as an archive of :data:`KEYS_YEARS` years arrives: in time
    order (datetimes spread evenly over the years, collections still in turn), each id its tile (UTM zone and
    latitude band of its corner), then its date, then its number, so a batch's ids span every file's id bounds."""
    from scripts.bench_ingest import generated_items

    items = generated_items(count)
    if ids == "arrival":
        return items
    step = timedelta(days=365 * KEYS_YEARS) / count
    for number, item in enumerate(items):
        moment = KEYS_START + number * step
        item["properties"]["datetime"] = moment.strftime("%Y-%m-%dT%H:%M:%SZ")
        x, y = item["bbox"][0], item["bbox"][1]
        tile = f"{int((x + 180) // 6) + 1:02d}{_LATITUDE_BANDS[min(19, int((y + 80) // 8))]}"
        item["id"] = f"T{tile}_{moment:%Y%m%d}_{item['id'].removeprefix('item-')}"
    return items


def replaced_items(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One item in :data:`REPLACED_SHARE`, a contiguous run from the middle of the arrival order, each changed."""
    count = max(1, len(items) // REPLACED_SHARE)
    start = (len(items) - count) // 2
    changed = []
    for item in items[start : start + count]:
        properties = {**item["properties"], "eo:cloud_cover": (item["properties"]["eo:cloud_cover"] + 1.0) % 100.0}
        changed.append({**item, "properties": properties})
    return changed


def granule_items(folder: Path, count: int) -> list[dict[str, Any]]:
    """``count`` items of make_archive's single-band COGs (DEM and land cover), in granule order, hrefs absolute."""
    from scripts.make_sample_archive import make_archive

    items = []
    for path in make_archive(folder, granules=count * 3 // 2 + 2, seed=5, places=4):
        item = json.loads(path.read_text())
        if item["collection"] == "sample-optical":  # pixel-interleaved: --virtual copies those
            continue
        asset = item["assets"]["data"]
        asset["href"] = str((path.parent / asset["href"]).resolve())
        items.append(item)
    items.sort(key=lambda item: int(item["id"].rsplit("-", 1)[1]))
    return items[:count]


def rotated(variants: list[str], round_number: int) -> list[str]:
    shift = round_number % len(variants)
    return variants[shift:] + variants[:shift]


def counts_text(calls: dict[str, dict[str, int]]) -> str:
    return ", ".join(f"{name} {figure['calls']:,} ({figure['results']:,})" for name, figure in calls.items()) or "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=100_000, help="generated STAC items (wkb, nested, keys; 100,000)")
    parser.add_argument("--granules", type=int, default=300, help="small COGs ingested with --virtual (tiff; 300)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every arm, ON and OFF alternating (3)")
    parser.add_argument(
        "--only", default=",".join(ARMS), help=f"fast paths to measure, comma-separated ({','.join(ARMS)})"
    )
    parser.add_argument(
        "--keys-ids",
        choices=("tile-first", "arrival"),
        default="tile-first",
        help="keys workload: items in time order with ids named tile first (real archives, the default), or "
        "bench_ingest's items as they are (ids in arrival order, every batch across all months)",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write every figure here, as JSON")
    parser.add_argument(
        "--workdir", type=Path, help="make the temporary folder (removed at the end) here instead of in the system's"
    )
    arguments = parser.parse_args()
    arms = [name.strip() for name in arguments.only.split(",") if name.strip()]
    unknown = [name for name in arms if name not in ARMS]
    if unknown or not arms:
        parser.error(f"--only takes {', '.join(ARMS)}; not {', '.join(unknown) or 'nothing'}")
    if min(arguments.items, arguments.granules, arguments.rounds) < 1:
        parser.error("--items, --granules and --rounds must be at least 1")
    if arguments.workdir is not None:
        arguments.workdir.mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryDirectory(prefix="floe-bench-fast-paths-", dir=arguments.workdir) as temporary:
        figures = measure(Path(temporary), arms, arguments)
    report(figures, arms, arguments)


def measure(workdir: Path, arms: list[str], arguments: argparse.Namespace) -> dict[str, Any]:
    """Every arm's runs, round by round; the data made first."""
    sources: dict[str, Path] = {}
    expected: dict[str, int] = {}
    setup: dict[str, Any] = {}
    if {"wkb", "nested"} & set(arms):
        from scripts.bench_ingest import generated_items

        log(f"{arguments.items:,} generated items ...")
        sources["items"] = write_ndjson(workdir / "items.ndjson", generated_items(arguments.items))
        expected["items"] = arguments.items
    if "tiff" in arms:
        log(f"{arguments.granules:,} small COGs (make_archive) ...")
        granules = granule_items(workdir / "archive", arguments.granules)
        sources["granules"] = write_ndjson(workdir / "granules.ndjson", granules)
        expected["granules"] = len(granules)
    base = workdir / "keys-repository"
    if "keys" in arms:
        items = keys_items(arguments.items, arguments.keys_ids)
        sources["rerun"] = write_ndjson(workdir / "keys.ndjson", items)
        sources["replace"] = write_ndjson(workdir / "keys-replaced.ndjson", replaced_items(items))
        expected["rerun"], expected["replace"] = len(items), len(items) // REPLACED_SHARE or 1
        log(f"keys: the table to re-run against, {len(items):,} items ({arguments.keys_ids} ids), not timed ...")
        spec = {"arm": "keys", "variant": "on", "workload": "setup", "root": str(base), "source": str(sources["rerun"])}
        setup = run(workdir, {**spec, "expected": len(items)})

    runs: dict[str, dict[str, dict[str, list[dict[str, Any]]]]] = {
        arm: {workload: {variant: [] for variant in ARMS[arm].variants} for workload in ARMS[arm].workloads}
        for arm in arms
    }
    os.sync()  # the data just written goes to disk now, not during the first timed run

    def spec_of(arm: str, variant: str, workload: str, name: str) -> dict[str, Any]:
        return {
            "arm": arm,
            "variant": variant,
            "workload": workload,
            "root": str(base if arm == "keys" else workdir / f"repository-{name}"),
            "source": str(sources[workload]),
            "expected": expected[workload],
            "branch": name,
        }

    first = spec_of(arms[0], "on", ARMS[arms[0]].workloads[0], f"{arms[0]}-warm-up")
    log(f"warm-up (not counted): {arms[0]} ON {first['workload']} ...")
    run(workdir, first)
    if arms[0] != "keys":
        shutil.rmtree(first["root"], ignore_errors=True)
    for round_number in range(arguments.rounds):
        for arm in arms:
            for variant in rotated(list(ARMS[arm].variants), round_number):
                for workload in ARMS[arm].workloads:
                    spec = spec_of(arm, variant, workload, f"{arm}-{variant}-{round_number}")
                    log(f"round {round_number + 1}/{arguments.rounds}: {arm} {variant.upper()} {workload} ...")
                    figures = run(workdir, spec)
                    runs[arm][workload][variant].append(figures)
                    log(f"  {figures['seconds']:.2f} s; fast calls: {counts_text(figures['calls'].get('fast', {}))}")
                    if arm != "keys":
                        shutil.rmtree(spec["root"], ignore_errors=True)
    return {"runs": runs, "expected": expected, "setup": setup}


def report(figures: dict[str, Any], arms: list[str], arguments: argparse.Namespace) -> None:
    """The tables, the gains and the verdicts; with ``--json``, every figure."""
    runs, expected, setup = figures["runs"], figures["expected"], figures["setup"]
    document: dict[str, Any] = {
        "items": arguments.items,
        "granules": expected.get("granules", 0),
        "rounds": arguments.rounds,
        "keys_ids": arguments.keys_ids,
        "keep_at": KEEP,
        "setup": setup,
        "arms": {},
    }
    print(
        f"**bench_fast_paths: {arguments.rounds} round(s), ON and OFF alternating; median seconds of the timed work "
        f"(each run a fresh process, imports and setup not timed); gain = OFF time / ON time; keep at >= {KEEP:.2f}x**"
    )
    verdicts = []
    for arm in arms:
        definition = ARMS[arm]
        print(f"\n### {arm}: {definition.title}\n")
        if arm == "keys" and setup:
            table = setup["report"]
            print(
                f"Table: {table['rows_added']:,} items ({arguments.keys_ids} ids) in {table['data_files']:,} live data "
                f"files after {table['commits']:,} commit(s) ({setup['seconds']:.1f} s to ingest, not compared).\n"
            )
        print(
            "| workload | arm | what runs | median | rate | each round (s) | fast calls (with a result) | other calls |"
        )
        print("|---|---|---|---|---|---|---|---|")
        entry: dict[str, Any] = {"title": definition.title, "workloads": {}, "gains": {}}
        for workload in definition.workloads:
            unit, count = WORKLOAD_UNITS[workload], expected[workload]
            medians = {}
            entry["workloads"][workload] = {}
            for variant, description in definition.variants.items():
                done = runs[arm][workload][variant]
                seconds = [run_figures["seconds"] for run_figures in done]
                medians[variant] = statistics.median(seconds)
                last = done[-1]["calls"]
                print(
                    f"| {WORKLOAD_NAMES[workload]} | {variant.upper()} | {description} | {medians[variant]:.2f} s | "
                    f"{count / medians[variant]:,.0f} {unit}/s | {', '.join(f'{value:.2f}' for value in seconds)} | "
                    f"{counts_text(last.get('fast', {}))} | {counts_text(last.get('watched', {}))} |"
                )
                entry["workloads"][workload][variant] = {
                    "seconds": seconds,
                    "median": medians[variant],
                    "rate": count / medians[variant],
                    "unit": f"{unit}/s",
                    "calls": [run_figures["calls"] for run_figures in done],
                    "report": [run_figures["report"] for run_figures in done],
                }
            for variant in definition.variants:
                if variant != "on":
                    entry["gains"][f"{variant}/on {workload}"] = medians[variant] / medians["on"]
        print()
        for key, gain in entry["gains"].items():
            variant, workload = key.split(" ")
            what = "; the numpy twins against simple_wkb row by row" if variant == "row/on" else ""
            print(f"{arm}: gain {variant.upper()} {gain:.2f}x ({workload}{what}) -> {verdict(gain)}")
        best = max(gain for key, gain in entry["gains"].items() if key.startswith("off/on"))
        entry["verdict"] = verdict(best)
        verdicts.append(f"{arm}: {best:.2f}x -> {entry['verdict']}")
        document["arms"][arm] = entry
    print("\n### verdicts (OFF/ON; keys: its better workload)\n")
    for line in verdicts:
        print(line)
    if "wkb" in document["arms"] and "nested" in document["arms"]:
        # Both ON arms run the same code on the same items: how far apart they land is this run's noise.
        first, second = (document["arms"][arm]["workloads"]["items"]["on"]["median"] for arm in ("wkb", "nested"))
        document["noise"] = abs(first - second) / min(first, second)
        print(
            f"\nnoise: wkb ON and nested ON run the same code on the same items: {first:.2f} s and {second:.2f} s, "
            f"{document['noise']:.0%} apart (gains within that distance of {KEEP:.2f}x decide nothing)"
        )
    if arguments.json is not None:
        arguments.json.write_text(json.dumps(document, indent=2) + "\n")
        log(f"figures written to {arguments.json}")


if __name__ == "__main__":
    main()
