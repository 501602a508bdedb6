"""A metadata-only ingest of a large NDJSON file (or standard input) has reader processes parse, check and lay out
its lines as rows: the same table, export and rejections (by line) as the item path, awkward lines included; a
re-run that skips and a change that replaces; and readers that stop are replaced by this process."""

from __future__ import annotations

import io
import json
import logging
import math
import os
import signal
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

import ingest.pipeline.sources._ndjson_reader as ndjson_reader
import ingest.pipeline.sources._ndjson_rows as ndjson_rows
from ingest import Repository, Settings
from ingest.pipeline import ingest_items
from ingest.pipeline._report import IngestReport
from tests.pipeline._compare import exported, rejections
from tests.stac._geoparquet_cases import INVALID, awkward_items


def _awkward_lines() -> bytes:
    """The awkward items three times over (unique ids), with what only NDJSON holds between them: integers beyond
    64 bits and NaN in the text, an item naming no collection, lines that are not JSON, not UTF-8, blank, ended by
    CRLF, a FeatureCollection, an array and a Collection on a line, and a duplicate of an earlier item last."""
    lines: list[bytes] = []
    for copy in range(3):
        for item in awkward_items():
            item["id"] = f"{item['id']}-{copy}" if item["id"].startswith("item-") else item["id"]
            lines.append(json.dumps(item).encode())
    plain = awkward_items()[0]
    huge = {**plain, "id": "huge-int", "properties": {**plain["properties"], "count": 2**70 + 1}}
    lines.append(json.dumps(huge).encode())
    nan = {**plain, "id": "nan-text", "properties": {**plain["properties"], "score": math.nan}}
    lines.append(json.dumps(nan).encode())  # NaN, as Python writes it: the exact parser reads it
    lines.append(
        json.dumps(
            {key: value for key, value in {**plain, "id": "no-collection"}.items() if key != "collection"}
        ).encode()
    )
    lines += [b"{not json", b"\xff\xfe" + json.dumps({**plain, "id": "latin"}).encode(), b"", b"   "]
    lines.append(json.dumps({**plain, "id": "crlf"}).encode() + b"\r")
    features = [{**plain, "id": f"in-fc-{index}"} for index in range(2)]
    lines.append(json.dumps({"type": "FeatureCollection", "features": features}).encode())
    lines.append(json.dumps([{**plain, "id": "in-array"}]).encode())
    collection = {"type": "Collection", "id": "c9", "stac_version": "1.0.0", "description": "d", "license": "x",
                  "extent": {"spatial": {"bbox": [[-180, -90, 180, 90]]}, "temporal": {"interval": [[None, None]]}},
                  "links": []}  # fmt: skip
    lines.append(json.dumps(collection).encode())
    for index in range(40):  # enough plain lines for several blocks
        lines.append(json.dumps({**plain, "id": f"plain-{index}", "collection": f"c{index % 3}"}).encode())
    lines.append(
        json.dumps(
            {**plain, "id": "plain-7", "collection": "c1", "properties": {"datetime": "2024-02-01T00:00:00Z"}}
        ).encode()
    )
    return b"\n".join(lines) + b"\n"


@pytest.fixture
def rows_taken(monkeypatch) -> list[int]:
    """Readers for any stream, in blocks of a few lines; each run of rows that came out, counted."""
    monkeypatch.setattr(ndjson_rows, "READER_BYTES", 1)
    monkeypatch.setattr(ndjson_rows, "BLOCK_BYTES", 4000)
    taken: list[int] = []
    in_order = ndjson_rows._in_order

    def counting(*args: Any) -> Any:
        for sourced in in_order(*args):
            taken.append(sourced.rows.table.num_rows if sourced.rows is not None else 0)
            yield sourced

    monkeypatch.setattr(ndjson_rows, "_in_order", counting)
    return taken


def _item_path(monkeypatch) -> None:
    """No stream is large enough for readers: every line read as an item."""
    monkeypatch.setattr(ndjson_rows, "READER_BYTES", 16 << 20)


def _ingested(root: Path, sources: list[Any], **options: Any) -> tuple[Repository, IngestReport]:
    repository = Repository.create(str(root), Settings())
    return repository, ingest_items(repository, sources, default_collection="c-default", **options)


def test_readers_ingest_what_the_item_path_does_awkward_lines_included(tmp_path, monkeypatch, rows_taken, caplog):
    caplog.set_level(logging.INFO, logger=ndjson_rows.__name__)
    source = tmp_path / "awkward.ndjson"
    source.write_bytes(_awkward_lines())
    rows_repository, rows_report = _ingested(tmp_path / "rows", [source])
    assert "NDJSON readers' stages: parse" in caplog.text  # the readers' own time, said where -v shows it
    assert sum(rows_taken) > 60, "the lines did not come as rows"
    assert rows_taken.count(0) > 10, "the other lines did not come as items"
    _item_path(monkeypatch)
    items_repository, items_report = _ingested(tmp_path / "items", [source])

    assert exported(rows_repository) == exported(items_repository)
    assert rejections(rows_report) == rejections(items_report)
    assert rows_report.rows_added == items_report.rows_added
    assert rows_report.items_read == items_report.items_read
    assert rows_repository.collections("main").keys() == items_repository.collections("main").keys()
    rejected = {item_id for _, item_id, _ in rejections(rows_report)}
    # Every invalid item (each copy of it), and the duplicate, by its line.
    assert all(f"{name}-2" in rejected if name.startswith("item-") else name in rejected for name in INVALID)
    assert "plain-7" in rejected
    reasons = dict(((source, reason) for source, _, reason in rejections(rows_report)))
    assert any(reason.startswith("duplicate id (first seen in") for reason in reasons.values())
    assert any(reason.startswith("not UTF-8") for reason in reasons.values())
    by_id = {json.loads(text)["id"]: json.loads(text) for text in exported(rows_repository)}
    assert by_id["huge-int"]["properties"]["count"] == 2**70 + 1
    assert math.isnan(by_id["nan-text"]["properties"]["score"])
    assert by_id["no-collection"]["collection"] == "c-default"
    assert {"crlf", "in-fc-0", "in-fc-1", "in-array"} <= by_id.keys()


def test_standard_input_is_read_by_readers_too(tmp_path, monkeypatch, rows_taken):
    lines = _awkward_lines()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(lines)))
    rows_repository, rows_report = _ingested(tmp_path / "rows", ["-"])
    assert sum(rows_taken) > 60
    source = tmp_path / "items.ndjson"
    source.write_bytes(lines)
    _item_path(monkeypatch)
    items_repository, _ = _ingested(tmp_path / "items", [source])
    assert exported(rows_repository) == exported(items_repository)
    assert all(source.startswith("<stdin>:") for source, _, _ in rejections(rows_report))


def test_a_rerun_skips_every_line_and_a_changed_line_replaces_its_item(tmp_path, rows_taken):
    source = tmp_path / "items.ndjson"
    source.write_bytes(_awkward_lines())
    repository, report = _ingested(tmp_path / "repo", [source])
    added = report.rows_added

    again = ingest_items(repository, [source], default_collection="c-default")
    assert again.skipped == added and not again.commits

    lines = source.read_bytes().split(b"\n")
    changed = next(index for index, line in enumerate(lines) if b'"id": "plain-3"' in line)
    item = json.loads(lines[changed])
    item["properties"]["platform"] = "s2b"
    lines[changed] = json.dumps(item).encode()
    source.write_bytes(b"\n".join(lines))
    report = ingest_items(repository, [source], default_collection="c-default")
    assert (report.skipped, report.replaced, report.rows_added) == (added - 1, 1, 1)
    by_id = {json.loads(text)["id"]: json.loads(text) for text in exported(repository)}
    assert by_id["plain-3"]["properties"]["platform"] == "s2b"


def test_readers_that_stop_leave_the_rest_to_this_process(tmp_path, monkeypatch, rows_taken, caplog):
    # Every reader is killed once the first block is back: the blocks left are read here, none lost.
    source = tmp_path / "items.ndjson"
    source.write_bytes(_awkward_lines())
    in_order = ndjson_rows._in_order
    killed: list[int] = []

    def killing(*args: Any) -> Any:
        if not killed:
            for child in psutil.Process().children():
                if "_ndjson_reader" in " ".join(child.cmdline()):
                    killed.append(child.pid)
                    os.kill(child.pid, signal.SIGKILL)
        yield from in_order(*args)

    monkeypatch.setattr(ndjson_rows, "_in_order", killing)
    rows_repository, rows_report = _ingested(tmp_path / "rows", [source])
    assert killed, "no reader was running"
    assert "reader process stopped" in caplog.text
    _item_path(monkeypatch)
    items_repository, items_report = _ingested(tmp_path / "items", [source])
    assert exported(rows_repository) == exported(items_repository)
    assert rejections(rows_report) == rejections(items_report)


def test_a_block_keeps_its_lines_order_and_count():
    block = b'{"type": "Feature"}\n\n{not json\r\n' + json.dumps(awkward_items()[0]).encode() + b"\r\n"
    done = ndjson_reader.read_block(block)
    assert done.lines == 4
    assert done.offsets.tolist() == [3]
    assert done.rows is not None and done.rows.column("id").to_pylist() == ["item-plain"]
    assert [offset for offset, _ in done.others] == [0, 2]
    # Without a newline at its end, the last line still counts.
    assert ndjson_reader.read_block(block.rstrip(b"\r\n")).lines == 4


def test_a_block_whose_layout_fails_is_left_to_the_item_path(monkeypatch):
    import ingest.stac

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("an item the layout cannot take")

    monkeypatch.setattr(ingest.stac, "items_to_arrow", failing)
    done = ndjson_reader.read_block(json.dumps(awkward_items()[0]).encode() + b"\n")
    assert done.rows is None and done.offsets.tolist() == []
    assert [offset for offset, _ in done.others] == [0]


def test_file_ranges_hold_every_line_once(tmp_path):
    # Lines of every length around the range size, one longer than several ranges, no newline at the very end.
    lines = [b"x" * length for length in (0, 1, 6, 7, 8, 13, 30, 2, 0, 5)] + [b"last"]
    path = tmp_path / "lines.ndjson"
    path.write_bytes(b"\n".join(lines))
    size = path.stat().st_size
    for step in (1, 3, 7, 8, 64):
        parts = [ndjson_reader.FileRange(str(path), start, start + step).read() for start in range(0, size, step)]
        assert b"".join(parts) == path.read_bytes()
        assert sum(ndjson_reader.read_block(part).lines for part in parts) == len(lines)


def test_an_object_at_a_url_is_read_by_readers_its_relative_hrefs_made_absolute(
    tmp_path, monkeypatch, rows_taken, http_server
):
    source = http_server.folder / "awkward.ndjson"
    source.write_bytes(_awkward_lines())
    url = f"{http_server.url}/{source.name}"
    rows_repository, rows_report = _ingested(tmp_path / "rows", [url])
    assert sum(rows_taken) > 60, "the lines did not come as rows"
    _item_path(monkeypatch)
    items_repository, items_report = _ingested(tmp_path / "items", [url])
    assert exported(rows_repository) == exported(items_repository)
    assert rejections(rows_report) == rejections(items_report)
    hrefs = [json.loads(text)["assets"]["thumb"]["href"] for text in exported(rows_repository) if '"thumb"' in text]
    assert hrefs and all(href == f"{http_server.url}/t.png" for href in hrefs)


def test_line_blocks_of_a_broken_transfer_end_where_the_lines_of_the_item_path_do(monkeypatch):
    from ingest.pipeline.sources._objects import _Lines

    monkeypatch.setattr(ndjson_rows, "BLOCK_BYTES", 10)
    text = b"".join(b"%d-%s\n" % (number, b"y" * (number % 7)) for number in range(40)) + b"no newline"

    def chunks(broken: bool) -> Any:
        for start in range(0, len(text), 9):
            if broken and start > len(text) // 2:
                raise OSError("connection reset")
            yield text[start : start + 9]

    for broken in (False, True):
        blocks, lines = ndjson_rows.LineBlocks(chunks(broken)), _Lines(chunks(broken))
        joined = b"".join(blocks)
        assert joined.split(b"\n")[: blocks.count] == list(lines)
        assert (blocks.count, type(blocks.failure)) == (lines.count, type(lines.failure))
        made = list(ndjson_rows.LineBlocks(chunks(broken)))
        assert len(made) > 5 and all(block.endswith(b"\n") for block in made[:-1])
