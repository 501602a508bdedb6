"""A corpus of hostile input, run through the real ``floe ingest`` (issue 14).

Every case sits beside good items: in an NDJSON file a bad line is line 2, between two good items of its own;
a case that is a whole file sits in the folder beside ``good.ndjson``. One ingest of the metadata corpus
(``--workers 0``) and one Ray ingest of the raster corpus (items whose assets are broken TIFFs, and bare broken
TIFFs with ``--collection``) are shared by every case. For each case: the report (``--report``) holds its
rejection with the source (file, and line for NDJSON), the item id (cut short when huge) and the reason; stderr
holds that on one line, with no traceback; or, where accepting it is the documented decision, the item comes
back from ``floe export -`` equal to its input. Every good item comes back equal to its input, and the
repository passes ``floe check --all --deep``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from ingest import Repository
from ingest.sample import make_archive
from ingest.stac import one_line, shorten, without_arrays_asset
from tests.conftest import make_item

REPO_ROOT = Path(__file__).resolve().parents[2]
HUGE_ID = "h" * 10_000
BIG_INTEGER = 2**70 + 1


@dataclass(frozen=True)
class Case:
    """One hostile input: the bytes of its NDJSON line (or of its whole file) and what floe must do with it."""

    name: str
    line: bytes | None = None
    """An NDJSON line, written between two good items (source ``<file>:2``)."""
    file: str | None = None
    """Instead of a line: a whole file of this name holding ``content``."""
    content: bytes = b""
    reason: str | None = None
    """A part of the rejection's reason; None: the case is accepted."""
    item_id: str | None = None
    """The id the rejection names (as the report holds it)."""
    source_suffix: str = ":2"
    accepted: tuple[dict, ...] = ()
    """Items the case must commit, equal to these."""


def line_of(item: dict) -> bytes:
    return json.dumps(item).encode()


def item_with(item_id: str, **changes: object) -> dict:
    item = make_item(item_id, "hostile")
    for key, value in changes.items():
        if key in ("datetime", "start_datetime", "end_datetime", "deep", "big", "blob"):
            item["properties"][key] = value
        else:
            item[key] = value
    return item


def without(item_id: str, *keys: str, in_properties: bool = False) -> dict:
    item = make_item(item_id, "hostile")
    for key in keys:
        (item["properties"] if in_properties else item).pop(key)
    return item


def nested(item_id: str, depth: int) -> bytes:
    """An item whose property ``deep`` nests ``depth`` objects (json.dumps cannot write that deep)."""
    text = json.dumps(make_item(item_id, "hostile"))
    deep = '{"a":' * depth + "1" + "}" * depth
    return text.replace('"properties": {', '"properties": {"deep": ' + deep + ", ", 1).encode()


def point(x: object, y: object) -> dict:
    return {"type": "Point", "coordinates": [x, y]}


def square(west: float, south: float, east: float, north: float) -> dict:
    return {
        "type": "Polygon",
        "coordinates": [[[west, south], [east, south], [east, north], [west, north], [west, south]]],
    }


ANTIMERIDIAN = item_with(
    "antimeridian",
    geometry={
        "type": "MultiPolygon",
        "coordinates": [square(170, 0, 180, 1)["coordinates"], square(-180, 0, -170, 1)["coordinates"]],
    },
    bbox=[170.0, 0.0, -170.0, 1.0],
)
BIG = item_with("big-integer", big=BIG_INTEGER)
TEN_MB = item_with("ten-megabytes", blob="x" * 10_000_000)
DEEP_200 = nested("nested-200-deep", 200)

CASES = [
    # -- files that are not JSON, or not items
    Case(
        "empty-json-file",
        file="empty.json",
        reason="not valid JSON (Expecting value at line 1, column 1)",
        source_suffix="",
    ),
    Case(
        "invalid-json-file",
        file="invalid.json",
        content=b'{"type": "Feature", "id": ',
        reason="not valid JSON",
        source_suffix="",
    ),
    Case(
        "json-file-not-utf8",
        file="latin1.json",
        content=line_of(make_item("latin1")).replace(b"latin1", b"latin\xe91"),
        reason="cannot be read ('utf-8' codec can't decode byte 0xe9",
        source_suffix="",
    ),
    Case("symlink-loop", file="loop.json", reason="is a symbolic link loop", source_suffix=""),
    Case(
        "ndjson-bad-line",
        line=b'{"type": "Feature", "id": "half',
        reason="not valid JSON (Unterminated string starting at column 27)",
    ),
    Case(
        "ndjson-line-not-utf8",
        line=line_of(make_item("not-utf8-x", "hostile")).replace(b"not-utf8-x", b"not-utf8-\xff"),
        reason="not UTF-8 (byte 0xff at column",
    ),
    Case(
        "array-of-non-objects",
        file="array.json",
        content=b'[1, "x"]',
        reason="expected a STAC item object, got int",
        source_suffix="#[0]",
    ),
    Case(
        "array-second-non-object",
        file="array.json",
        reason="expected a STAC item object, got str",
        source_suffix="#[1]",
    ),
    Case("feature-collection-empty", file="empty-fc.json", content=b'{"type": "FeatureCollection", "features": []}'),
    Case("ndjson-empty-file", file="empty.ndjson"),
    Case(
        "not-a-feature",
        line=line_of(item_with("not-a-feature", type="Topology")),
        reason="type must be 'Feature', got 'Topology'",
        item_id="not-a-feature",
    ),
    # -- required members
    Case("missing-id", line=line_of(without("x", "id")), reason="item has no id"),
    Case(
        "missing-geometry",
        line=line_of(without("no-geometry", "geometry")),
        reason="item has no geometry",
        item_id="no-geometry",
    ),
    Case(
        "missing-datetime",
        line=line_of(without("no-datetime", "datetime", in_properties=True)),
        reason="properties.datetime is required",
        item_id="no-datetime",
    ),
    Case(
        "null-datetime-without-range",
        line=line_of(item_with("null-datetime", datetime=None)),
        reason="item has no datetime (and no start_datetime/end_datetime range)",
        item_id="null-datetime",
    ),
    # -- geometries
    Case(
        "geometry-circle",
        line=line_of(item_with("circle", geometry={"type": "Circle", "coordinates": [1, 2], "radius": 3})),
        reason="unknown geometry type 'Circle'",
        item_id="circle",
    ),
    Case(
        "coordinates-string",
        line=line_of(item_with("string-coordinates", geometry={"type": "Point", "coordinates": "1,2"})),
        reason="geometry coordinates must be arrays of numbers, got '1,2'",
        item_id="string-coordinates",
    ),
    Case(
        "coordinates-nan",
        line=line_of(item_with("nan-coordinate", geometry=point(float("nan"), 1.0), bbox=[0, 0, 1, 1])),
        reason="geometry coordinate nan is not a finite number",
        item_id="nan-coordinate",
    ),
    Case(
        "longitude-500",
        line=line_of(item_with("longitude-500", geometry=point(500, 10), bbox=[500, 10, 500, 10])),
        reason="has a longitude outside [-180, 180]",
        item_id="longitude-500",
    ),
    Case(
        "longitude-500-no-bbox",
        line=line_of(without("longitude-500-alone", "bbox") | {"geometry": point(500, 10)}),
        reason="geometry longitude 500 is outside [-180, 180]",
        item_id="longitude-500-alone",
    ),
    Case(
        "latitude-200",
        line=line_of(without("latitude-200", "bbox") | {"geometry": square(0, 0, 1, 200)}),
        reason="geometry latitude 200 is outside [-90, 90]",
        item_id="latitude-200",
    ),
    Case(
        "bbox-far-from-geometry",
        line=line_of(item_with("far-bbox", geometry=square(0, 0, 1, 1), bbox=[50, 50, 51, 51])),
        reason="bbox [50, 50, 51, 51] does not contain the geometry",
        item_id="far-bbox",
    ),
    Case(
        "bbox-inverted",
        line=line_of(item_with("inverted-bbox", geometry=square(0, 0, 1, 1), bbox=[0, 1, 1, 0])),
        reason="bbox [0, 1, 1, 0] has south 1 north of north 0",
        item_id="inverted-bbox",
    ),
    Case(
        "bbox-three-numbers",
        line=line_of(item_with("three-number-bbox", bbox=[1, 2, 3])),
        reason="bbox must be a list of 4 or 6 numbers",
        item_id="three-number-bbox",
    ),
    Case(
        "bbox-nan",
        line=line_of(item_with("nan-bbox", bbox=[0.0, float("nan"), 1.0, 1.0])),
        reason="bbox value nan is not a finite number",
        item_id="nan-bbox",
    ),
    Case(
        "bbox-bottom-above-top",
        line=line_of(item_with("upside-down", geometry=square(0, 0, 1, 1), bbox=[0, 0, 10, 1, 1, 5])),
        reason="bbox [0, 0, 10, 1, 1, 5] has bottom 10 above top 5",
        item_id="upside-down",
    ),
    Case("bbox-antimeridian", line=line_of(ANTIMERIDIAN), accepted=(ANTIMERIDIAN,)),
    # -- ids and collections
    Case("id-slash", line=line_of(item_with("a/b")), reason="id 'a/b' contains a path separator", item_id="a/b"),
    Case("id-dot-dot", line=line_of(item_with("..")), reason="id '..' starts with '.'", item_id=".."),
    Case(
        "id-percent-dot-dot",
        line=line_of(item_with("%2e%2e")),
        reason="id '%2e%2e' percent-decodes to '..'",
        item_id="%2e%2e",
    ),
    Case(
        "id-double-percent-dot-dot",
        line=line_of(item_with("%252e%252e")),
        reason="percent-decodes to '..'",
        item_id="%252e%252e",
    ),
    Case(
        "collection-percent-dot-dot",
        line=line_of(item_with("in-dot-dot", collection="%2e%2e")),
        reason="collection '%2e%2e' percent-decodes to '..'",
        item_id="in-dot-dot",
    ),
    Case(
        "collection-slash",
        line=line_of(item_with("in-slash", collection="../up")),
        reason="collection '../up' contains a path separator",
        item_id="in-slash",
    ),
    Case(
        "id-nul",
        line=line_of(item_with("nul\x00byte")),
        reason="id 'nul\\x00byte' contains control characters",
        item_id="nul\x00byte",
    ),
    Case(
        "id-newline",
        line=line_of(item_with("new\nline")),
        reason="id 'new\\nline' contains control characters",
        item_id="new\nline",
    ),
    Case(
        "id-10000-characters",
        line=line_of(item_with(HUGE_ID)),
        reason="(10,000 characters) is longer than 255 characters",
        item_id=shorten(HUGE_ID),
    ),
    Case(
        "id-lone-surrogate",
        line=line_of(make_item("lone-surrogate", "hostile")).replace(b"lone-surrogate", b"lone-\\udcff"),
        reason="is not valid Unicode (it holds a lone surrogate)",
        item_id="lone-\udcff",
    ),
    Case(
        "id-not-a-string",
        line=line_of(item_with("x") | {"id": 42}),
        reason="id must be a string, got int",
        item_id="42",
    ),
    Case(
        "id-rich-markup",
        line=line_of(item_with("[/bold]")),
        reason="id '[/bold]' contains a path separator",
        item_id="[/bold]",
    ),
    Case(
        "id-rich-emoji",
        line=line_of(item_with(":thumbs_up:/x")),
        reason="id ':thumbs_up:/x' contains",
        item_id=":thumbs_up:/x",
    ),
    Case(
        "stac-collection-percent-dot-dot",
        file="collection.json",
        content=json.dumps({"type": "Collection", "id": "%2e%2e", "description": "x", "links": []}).encode(),
        reason="STAC Collection refused: collection id '%2e%2e' percent-decodes to '..'",
        item_id="%2e%2e",
        source_suffix="",
    ),
    Case(
        "stac-collection-huge-id",
        file="collection-huge.json",
        content=json.dumps({"type": "Collection", "id": HUGE_ID, "description": "x", "links": []}).encode(),
        reason="(10,000 characters) is longer than 255 characters",
        item_id=shorten(HUGE_ID),
        source_suffix="",
    ),
    Case(
        "duplicate-id-in-batch",
        line=line_of(make_item("hostile-duplicate", "hostile")),
        reason="duplicate id (first seen in",
        item_id="hostile-duplicate",
    ),
    # -- times
    Case(
        "start-after-end",
        line=line_of(
            item_with(
                "start-after-end",
                datetime=None,
                start_datetime="2024-02-01T00:00:00Z",
                end_datetime="2024-01-01T00:00:00Z",
            )
        ),
        reason="start_datetime '2024-02-01T00:00:00Z' is after end_datetime",
        item_id="start-after-end",
    ),
    Case(
        "datetime-iso-week",
        line=line_of(item_with("iso-week", datetime="2021-W01")),
        reason="properties.datetime '2021-W01' is not an RFC 3339 date-time",
        item_id="iso-week",
    ),
    Case(
        "datetime-date-only",
        line=line_of(item_with("date-only", datetime="2021-01-01")),
        reason="properties.datetime '2021-01-01' is not an RFC 3339 date-time",
        item_id="date-only",
    ),
    Case(
        "datetime-no-zone",
        line=line_of(item_with("no-zone", datetime="2021-01-01T00:00:00")),
        reason="is not an RFC 3339 date-time with a time zone",
        item_id="no-zone",
    ),
    # -- sizes and numbers
    Case(
        "nested-1000-deep",
        line=nested("nested-1000-deep", 1000),
        reason="the item nests more than 255 levels deep",
        item_id="nested-1000-deep",
    ),
    Case(
        "nested-10000-deep",
        line=nested("nested-10000-deep", 10_000),
        reason="not valid JSON (the document nests too deeply to read",
    ),
    Case("nested-200-deep", line=DEEP_200, accepted=(json.loads(DEEP_200),)),
    Case("property-10-megabytes", line=line_of(TEN_MB), accepted=(TEN_MB,)),
    Case("integer-2-70-plus-1", line=line_of(BIG), accepted=(BIG,)),
]


def case_file(folder: Path, case: Case) -> Path:
    return folder / (case.file or f"{case.name}.ndjson")


def good_pair(case: Case) -> tuple[dict, dict]:
    return make_item(f"good-before-{case.name}", "hostile"), make_item(f"good-after-{case.name}", "hostile")


def write_corpus(folder: Path) -> list[dict]:
    """The metadata corpus under ``folder``; returns every good item written beside the cases."""
    folder.mkdir()
    good = [make_item(f"good-{n}", "hostile") for n in range(5)] + [make_item("hostile-duplicate", "hostile")]
    (folder / "000-good.ndjson").write_bytes(b"".join(line_of(item) + b"\n" for item in good))
    for case in CASES:
        path = case_file(folder, case)
        if case.name == "symlink-loop":
            path.symlink_to(path.name)
        elif case.line is not None:
            before, after = good_pair(case)
            path.write_bytes(line_of(before) + b"\n" + case.line + b"\n" + line_of(after) + b"\n")
            good += [before, after]
        elif case.content or not path.exists():
            path.write_bytes(case.content)
    return good


def floe(root: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ingest.cli", "--root", str(root), *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})},
        timeout=600,
        check=False,
    )


@dataclass
class Run:
    """One ingest: its exit status, stderr, report, the items exported after it, and the deep check's result."""

    ingest: subprocess.CompletedProcess
    report: list[dict]
    exported: dict[tuple[str, str], dict]
    check: subprocess.CompletedProcess | None


def ingest_and_read(
    root: Path, sources: list[Path], *extra: str, env: dict | None = None, export: bool = False, check: bool = True
) -> Run:
    """Ingest ``sources`` with the CLI, read every item back (with ``floe export -``, else in this process), check."""
    report = root.parent / f"{root.name}-report.jsonl"
    done = floe(root, "ingest", *map(str, sources), "--report", str(report), *extra, env=env)
    if export:
        exported = floe(root, "export", "-")
        assert exported.returncode == 0, exported.stderr
        items = [json.loads(line) for line in exported.stdout.splitlines()]
    else:  # each CLI start costs seconds on a loaded machine: the same rows, read by the library
        items = list(Repository.open(str(root)).view().items())
    by_key = {}
    for item in items:
        key = (item["collection"], item["id"])
        assert key not in by_key, f"{key} committed twice"
        by_key[key] = item
    rejected = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
    checked = floe(root, "check", "--all", "--deep") if check else None
    return Run(done, rejected, by_key, checked)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, list[dict], Run]:
    base = tmp_path_factory.mktemp("hostile")
    folder = base / "corpus"
    good = write_corpus(folder)
    return folder, good, ingest_and_read(base / "repo", [folder], "--workers", "0", "--batch-size", "50", export=True)


def rejection_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("rejected ")]


def test_the_corpus_is_large_enough():
    assert len(CASES) + len(RASTER_CASES) >= 40
    assert len({case.name for case in [*CASES, *RASTER_CASES]}) == len(CASES) + len(RASTER_CASES)


def test_the_run_exits_3_without_a_traceback_and_passes_the_deep_check(corpus):
    _, _, run = corpus
    assert run.ingest.returncode == 3, run.ingest.stderr[-3000:]
    assert "Traceback" not in run.ingest.stderr
    assert run.check is not None and run.check.returncode == 0, run.check
    # Every rejection is one line of stderr, and the report holds exactly the rejections the cases expect.
    assert len(rejection_lines(run.ingest.stderr)) == len(run.report)
    assert len(run.report) == sum(case.reason is not None for case in CASES)


def test_every_good_item_beside_the_cases_is_committed_unchanged(corpus):
    _, good, run = corpus
    for item in good:
        assert run.exported.get(("hostile", item["id"])) == item, item["id"]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_case(corpus, case):
    folder, _, run = corpus
    source = f"{case_file(folder, case)}{case.source_suffix}"
    mine = [entry for entry in run.report if entry["source"] == source]
    if case.reason is None:
        assert mine == []
        for item in case.accepted:
            assert run.exported[(item["collection"], item["id"])] == item
        return
    (rejection,) = mine
    assert case.reason in rejection["reason"], rejection
    assert rejection["id"] == case.item_id
    # stderr names it on one line: the source and the reason, the id shown short and escaped.
    lines = [line for line in rejection_lines(run.ingest.stderr) if line.startswith(f"rejected {one_line(source)}: ")]
    assert len(lines) == 1, lines
    assert one_line(case.reason) in lines[0] or case.reason in lines[0]
    assert len(lines[0]) < 1000


def test_accepted_cases_alone_exit_0(tmp_path, corpus):
    folder, _, _ = corpus
    accepted = [case_file(folder, case) for case in CASES if case.reason is None]
    run = ingest_and_read(tmp_path / "repo", accepted, "--workers", "0", check=False)
    assert run.ingest.returncode == 0, run.ingest.stderr
    assert run.report == []
    expected = [item for case in CASES for item in case.accepted]
    assert len(run.exported) == len(expected) + 2 * sum(case.line is not None for case in CASES if case.reason is None)
    # The integer beyond 64 bits is kept exactly, not as 1.1805916207174113e+21.
    big = run.exported[("hostile", "big-integer")]["properties"]["big"]
    assert big == BIG_INTEGER and isinstance(big, int)


# -- rasters: one Ray ingest of items whose assets are broken TIFFs, and of bare broken TIFFs ---------------------


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
