"""Reading sources: one bad line is rejected alone, by its number; the lines around it are read (issue 14)."""

from __future__ import annotations

import json

import orjson

from ingest import Repository
from ingest.pipeline import ingest_items, read_items
from tests.conftest import make_item


def nested_item(item_id: str, depth: int) -> bytes:
    """An item whose property ``deep`` nests ``depth`` objects (written by hand: json.dumps cannot go that deep)."""
    line = json.dumps(make_item(item_id, "c"))
    deep = '{"a":' * depth + "1" + "}" * depth
    return line.replace('"properties": {', '"properties": {"deep": ' + deep + ", ", 1).encode()


def test_a_line_that_is_not_utf8_is_rejected_alone(tmp_path):
    source = tmp_path / "items.ndjson"
    lines = [json.dumps(make_item(f"good-{n}", "c")).encode() for n in range(5)]
    lines.insert(2, b'{"type": "Feature", "id": "bad-\xff\xfe"}')
    source.write_bytes(b"\n".join(lines) + b"\n")
    read = list(read_items([source]))
    assert [entry.item["id"] for entry in read if entry.item] == [f"good-{n}" for n in range(5)]
    (bad,) = [entry for entry in read if entry.error is not None]
    assert bad.source == f"{source}:3"
    assert f"not UTF-8 (byte 0xff at column {lines[2].index(0xFF) + 1})" in str(bad.error)


def test_items_nested_too_deep_are_rejected_alone_and_a_deep_one_is_kept_exactly(tmp_path):
    source = tmp_path / "items.ndjson"
    lines = [nested_item("deep", 200), nested_item("too-deep", 1000), nested_item("unreadable", 5000)]
    source.write_bytes(b"\n".join([*lines, json.dumps(make_item("after")).encode()]) + b"\n")
    repository = Repository.create(tmp_path / "repo")
    report = ingest_items(repository, [source])
    assert sorted((rejection.source, rejection.item_id, rejection.reason) for rejection in report.rejected) == [
        (f"{source}:2", "too-deep", "the item nests more than 255 levels deep"),
        (f"{source}:3", None, "not valid JSON (the document nests too deeply to read at column 1)"),
    ]
    assert report.rows_added == 2
    stored = {item["id"]: item for item in repository.view().items()}
    expected = orjson.loads(nested_item("deep", 200))
    assert orjson.dumps(stored["deep"]["properties"]["deep"]) == orjson.dumps(expected["properties"]["deep"])


def test_links_that_lead_nowhere_are_reported_by_name_in_a_folder_and_named_directly(tmp_path):
    folder = tmp_path / "items"
    folder.mkdir()
    (folder / "good.json").write_text(json.dumps(make_item("good")))
    (folder / "loop.json").symlink_to("loop.json")
    (folder / "broken.ndjson").symlink_to("gone.ndjson")
    (folder / "loop.txt").symlink_to("loop.txt")  # not named like an input: ignored, as any .txt file is
    read = {entry.source: entry for entry in read_items([folder])}
    assert read[str(folder / "good.json")].item["id"] == "good"
    assert "is a symbolic link loop" in str(read[str(folder / "loop.json")].error)
    assert "is a broken symbolic link (to 'gone.ndjson'" in str(read[str(folder / "broken.ndjson")].error)
    assert len(read) == 3
    (direct,) = read_items([folder / "loop.json"])
    assert "is a symbolic link loop" in str(direct.error)


def test_json_errors_name_the_column_once(tmp_path):
    source = tmp_path / "items.ndjson"
    source.write_bytes(b'{"id": "half\n')
    (bad,) = read_items([source])
    assert str(bad.error).endswith("not valid JSON (Unterminated string starting at column 8)")
