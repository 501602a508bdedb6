"""Parts of files as sources (a backfill's): every line and row read once, wherever the cuts fall, and labelled with
the file's own line and row numbers, locally and by range requests on S3 (moto)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import stac_geoparquet.arrow as sga

from ingest.config import RemoteSettings
from ingest.pipeline.sources import (
    SourceOptions,
    SourcePart,
    count_lines,
    numbered,
    read_items,
    split_sources,
)
from tests.conftest import free_port, make_item


def _awkward_ndjson(path: Path) -> Path:
    """Lines a cut can fall inside of: CRLF endings, blank lines, a line far longer than a part, bad JSON,
    bytes that are not UTF-8, and no newline at the end."""
    lines = [json.dumps(make_item(f"i-{n:03d}", ("a", "b")[n % 2])).encode() for n in range(40)]
    huge = make_item("huge", "a", note="x" * 5000)
    lines[3] = lines[3] + b"\r"
    lines.insert(5, b"")
    lines.insert(9, b"   ")
    lines.insert(12, json.dumps(huge).encode())
    lines.insert(20, b"{not json")
    lines.insert(25, b'{"id": "\xff\xfe"}')
    path.write_bytes(b"\n".join(lines))  # no newline after the last line
    return path


def _split(sources: list, part_bytes: int, options: SourceOptions) -> list | None:
    """The parts and files of every share, in order."""
    shares = split_sources(sources, part_bytes, options)
    return None if shares is None else [source for share in shares for source in share]


def _as_read(sources: list, options: SourceOptions | None = None) -> list[tuple]:
    """Every entry read: its label, and its item or the reason it was refused."""
    entries = []
    for entry in read_items(sources, options or SourceOptions()):
        what = entry.item if entry.error is None else str(entry.error)
        entries.append((entry.source, json.dumps(what, sort_keys=True)))
    return entries


def _numbered_parts(parts: list, options: SourceOptions) -> list:
    """The NDJSON parts of each file numbered from the lines before them, as a backfill numbers them."""
    out = list(parts)
    by_file: dict[str, list[int]] = {}
    for index, part in enumerate(parts):
        if isinstance(part, SourcePart) and part.kind == "ndjson":
            by_file.setdefault(part.file, []).append(index)
    for indexes in by_file.values():
        file_parts = [parts[index] for index in indexes]
        counts = [count_lines(part, options) for part in file_parts]
        for index, part in zip(indexes, numbered(file_parts, counts), strict=True):
            out[index] = part
    return out


@pytest.mark.parametrize("part_bytes", [1, 7, 50, 333, 4096, 1 << 30])
def test_ndjson_parts_hold_every_line_once_numbered_as_in_the_whole_file(tmp_path, part_bytes):
    path = _awkward_ndjson(tmp_path / "items.ndjson")
    options = SourceOptions()
    whole = _as_read([path])
    assert len(whole) == 40 + 3  # 41 items, the bad JSON and the bytes that are not UTF-8

    parts = _split([path], part_bytes, options)
    assert parts is not None
    size = path.stat().st_size
    expected_parts = min(size, -(-size // part_bytes))
    assert len(parts) == expected_parts
    assert all(isinstance(part, SourcePart) for part in parts)
    assert parts[0].start == 0 and parts[-1].stop == size
    assert all(before.stop == after.start for before, after in itertools.pairwise(parts))

    assert _as_read(_numbered_parts(parts, options)) == whole


def test_unnumbered_parts_would_name_the_wrong_lines(tmp_path):
    """The numbering matters: parts read without it label their lines from 1 again."""
    path = _awkward_ndjson(tmp_path / "items.ndjson")
    parts = _split([path], 2000, SourceOptions())
    assert parts is not None and len(parts) > 2
    assert _as_read(parts) != _as_read([path])
    assert sorted(label for label, _ in _as_read(parts)) != sorted(label for label, _ in _as_read([path]))


def _geoparquet(path: Path, rows: int, group: int) -> Path:
    items = [make_item(f"row-{n:03d}", ("a", "b")[n % 2], platform=f"sat-{n % 3}") for n in range(rows)]
    table = pa.Table.from_batches(sga.parse_stac_items_to_arrow(items))
    sga.to_parquet(pa.Table.from_batches(table.to_batches(max_chunksize=group)), path)
    assert pq.ParquetFile(path).num_row_groups == -(-rows // group)
    return path


@pytest.mark.parametrize("part_bytes", [1, 300, 5_000, 1 << 30])
def test_geoparquet_parts_are_runs_of_rows_labelled_with_the_file_rows(tmp_path, part_bytes):
    """Cuts fall inside row groups too (a file written as one big row group still splits)."""
    path = _geoparquet(tmp_path / "rows.parquet", rows=50, group=7)
    whole = _as_read([path])
    assert [label for label, _ in whole] == [f"{path}#row{n}" for n in range(50)]

    parts = _split([path], part_bytes, SourceOptions())
    assert parts is not None and all(isinstance(part, SourcePart) for part in parts)
    assert parts[0].start == 0 and parts[-1].stop == 50
    assert all(before.stop == after.start for before, after in itertools.pairwise(parts))
    if part_bytes == 1:
        assert len(parts) == 50  # a row each
    if part_bytes == 5_000:
        assert 1 < len(parts) < 50 and any(part.start % 7 for part in parts)  # some cut inside a row group
    assert _as_read(parts) == whole


def test_what_cannot_be_cut_is_read_whole_or_leaves_the_run_to_one_reader(tmp_path):
    item_file = tmp_path / "one.json"
    item_file.write_text(json.dumps(make_item("alone")))
    not_parquet = tmp_path / "broken.parquet"
    not_parquet.write_bytes(b"not parquet at all")
    missing = tmp_path / "missing.ndjson"
    options = SourceOptions()

    parts = _split([item_file, not_parquet, missing], 10, options)
    assert parts == [item_file, not_parquet, missing]
    # Read whole, each says what is wrong, as it would to one reader.
    assert _as_read(parts) == _as_read([item_file, not_parquet, missing])

    assert split_sources(["-"], 10, options) is None
    # A STAC API that cannot be opened to plan its time lanes is a share of its own: its reader reports it.
    unreachable = f"http://127.0.0.1:{free_port()}/api"
    lanes = SourceOptions(remote=RemoteSettings(search_lanes=4))
    assert split_sources([unreachable, item_file], 10, lanes) == [[unreachable], [item_file]]


@pytest.mark.s3
def test_parts_of_objects_on_s3_are_read_by_ranges_as_the_whole_objects_are(moto_server, tmp_path):
    bucket = moto_server.create_bucket()
    client = moto_server.client()
    ndjson = _awkward_ndjson(tmp_path / "items.ndjson")
    parquet = _geoparquet(tmp_path / "rows.parquet", rows=30, group=4)
    client.put_object(Bucket=bucket, Key="in/items.ndjson", Body=ndjson.read_bytes())
    client.put_object(Bucket=bucket, Key="in/rows.parquet", Body=parquet.read_bytes())
    client.put_object(Bucket=bucket, Key="in/one.json", Body=json.dumps(make_item("alone")).encode())
    options = SourceOptions(s3=moto_server.s3_settings())
    folder = f"s3://{bucket}/in/"

    parts = _split([folder], 600, options)
    assert parts is not None
    kinds = [part.kind if isinstance(part, SourcePart) else part for part in parts]
    assert kinds.count("ndjson") > 3 and kinds.count("geoparquet") > 1
    assert kinds.count("member") == 1  # one.json, read as the folder reads it

    whole = _as_read([folder], options)
    assert len(whole) == 43 + 30 + 1
    assert sorted(_as_read(_numbered_parts(parts, options), options)) == sorted(whole)


def test_small_files_are_read_several_to_a_share(tmp_path):
    """A folder of item JSONs is not a commit per file: files are packed into shares of about the part size."""
    folder = tmp_path / "items"
    folder.mkdir()
    for n in range(30):
        (folder / f"{n:02d}.json").write_text(json.dumps(make_item(f"item-{n:02d}")))
    part_bytes = 4 * max(path.stat().st_size for path in folder.glob("*.json"))

    shares = split_sources([folder], part_bytes, SourceOptions())
    assert shares is not None
    assert [str(source) for share in shares for source in share] == [
        str(path) for path in sorted(folder.glob("*.json"))
    ]
    assert all(sum(Path(str(source)).stat().st_size for source in share) <= part_bytes for share in shares)
    assert all(len(share) >= 4 for share in shares[:-1]) and len(shares) <= 8
    whole = split_sources([folder], 1 << 30, SourceOptions())
    assert whole is not None and len(whole) == 1 and len(whole[0]) == 30


def _catalog_folder(folder: Path) -> Path:
    """A collection whose links name the items beside it, as a static catalog on disk is laid out."""
    (folder / "a").mkdir(parents=True)
    (folder / "b").mkdir()
    for name in ("a", "b"):
        (folder / name / f"{name}.json").write_text(json.dumps(make_item(name)))
    collection = {
        "type": "Collection",
        "stac_version": "1.0.0",
        "id": "c",
        "description": "items beside their collection",
        "license": "CC-BY-4.0",
        "extent": {"spatial": {"bbox": [[-180, -90, 180, 90]]}, "temporal": {"interval": [[None, None]]}},
        "links": [{"rel": "item", "href": f"./{name}/{name}.json"} for name in ("a", "b")],
    }
    (folder / "collection.json").write_text(json.dumps(collection))
    return folder


def test_a_collection_listed_in_a_folder_is_stored_not_walked_as_in_the_folder(tmp_path):
    """Named alone, a collection's file is walked for its items; listed in a folder it is not (its items are the
    folder's other files). Split into shares, each file is read as its folder reads it: no item twice."""
    folder = _catalog_folder(tmp_path / "catalog")
    whole = _as_read([folder])
    assert sorted(label for label, _ in whole) == sorted(
        str(path) for path in (folder / "a" / "a.json", folder / "b" / "b.json", folder / "collection.json")
    )
    assert _as_read(_split([folder], 1, SourceOptions())) == whole
    walked = _as_read([folder / "collection.json"])
    assert len(walked) == 3  # the collection and its two items, through its links
