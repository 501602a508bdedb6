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
from dataclasses import dataclass
from pathlib import Path

import pytest

from ingest.stac import one_line, shorten
from tests.conftest import make_item
from tests.pipeline._hostile import Run, ingest_and_read, rejection_lines

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


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, list[dict], Run]:
    base = tmp_path_factory.mktemp("hostile")
    folder = base / "corpus"
    good = write_corpus(folder)
    return folder, good, ingest_and_read(base / "repo", [folder], "--workers", "0", "--batch-size", "50", export=True)


def test_the_corpus_is_large_enough():
    assert len(CASES) >= 40
    assert len({case.name for case in CASES}) == len(CASES)


@pytest.mark.slow
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


@pytest.mark.slow
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
