"""The items table's FileIO on S3 (``ingest.remote.ObjectFileIO``): metadata read whole in one GET, by its key as
written, and a clear error for a missing object; everything else is PyArrow's."""

from __future__ import annotations

import pickle
import urllib.request

import pytest
from pyiceberg.io.pyarrow import PyArrowFile

from ingest import Settings
from ingest.remote import ObjectFileIO
from ingest.storage import Location

pytestmark = pytest.mark.s3


@pytest.fixture
def table_io(s3_root, s3_settings) -> tuple[str, ObjectFileIO]:
    io = Location.parse(s3_root, s3_settings).file_io()
    assert isinstance(io, ObjectFileIO)
    return s3_root, io


def written(io: ObjectFileIO, location: str, payload: bytes) -> str:
    with io.new_output(location).create(overwrite=True) as stream:
        stream.write(payload)
    return location


def test_metadata_is_read_whole_and_data_files_through_pyarrow(table_io):
    root, io = table_io
    version = written(io, f"{root}/tables/items/metadata/00001-x.metadata.json", b'{"format-version": 2}')
    manifest = written(io, f"{root}/tables/items/metadata/m0.avro", b"avro bytes")

    for location, payload in ((version, b'{"format-version": 2}'), (manifest, b"avro bytes")):
        opened = io.new_input(location)
        assert type(opened) is not PyArrowFile
        with opened.open() as stream:
            assert stream.read() == payload
        assert len(opened) == len(payload)
        assert opened.exists()
    assert type(io.new_input(f"{root}/tables/items/data/part.parquet")) is PyArrowFile


def test_a_key_is_read_as_written_not_unescaped(table_io):
    # Iceberg's partition paths escape a value's "%" as "%25" in the key itself: that key is what is read.
    root, io = table_io
    escaped = written(io, f"{root}/tables/items/metadata/a%25b.metadata.json", b"escaped")
    written(io, f"{root}/tables/items/metadata/a%b.metadata.json", b"plain")
    assert io.get(escaped) == b"escaped"


def test_a_missing_object_is_file_not_found_naming_it(table_io):
    root, io = table_io
    missing = f"{root}/tables/items/metadata/nothing.metadata.json"
    with pytest.raises(FileNotFoundError, match=r"nothing\.metadata\.json"):
        io.new_input(missing).open()
    assert not io.new_input(missing).exists()


def test_it_travels_pickled_and_reads_where_it_lands(table_io):
    root, io = table_io
    location = written(io, f"{root}/tables/items/metadata/00002-y.metadata.json", b"{}")
    io.get(location)  # its client is made: the copy makes its own
    copy = pickle.loads(pickle.dumps(io))
    assert copy.get(location) == b"{}"
    assert copy.s3 == io.s3


def test_a_file_is_written_in_one_put_only_where_none_is_and_knows_its_length(moto_server, signature_proxy):
    settings = Settings(s3=signature_proxy.s3_settings(moto_server))
    root = f"s3://{moto_server.create_bucket()}/repo"
    io = Location.parse(root, settings).file_io()
    location = f"{root}/tables/items/data/collection=c/part-1.parquet"

    before = len(signature_proxy.requests())
    output = io.new_output(location)
    with output.create(overwrite=False) as stream:
        stream.write(b"first")
    assert len(output) == 5
    made = [(method, path.split("?")[0]) for method, path, _ in signature_proxy.requests()[before:]]
    assert made == [("PUT", made[0][1])], made  # no HEAD, no LIST, no multipart upload; no HEAD for its length

    with pytest.raises(FileExistsError, match="already exists"), io.new_output(location).create() as stream:
        stream.write(b"second")
    assert io.get(location) == b"first"
    with io.new_output(location).create(overwrite=True) as stream:
        stream.write(b"third")
    assert io.get(location) == b"third"


def test_a_write_left_by_an_error_leaves_nothing(table_io):
    root, io = table_io
    location = f"{root}/tables/items/metadata/00003-z.metadata.json"
    with pytest.raises(RuntimeError), io.new_output(location).create() as stream:
        stream.write(b"half")
        raise RuntimeError("stopped while writing")
    assert not io.new_input(location).exists()


def test_writes_together_are_sent_at_the_end_of_the_block_and_none_if_it_fails(table_io):
    root, io = table_io
    names = [f"{root}/tables/items/data/collection=c/together-{n}.parquet" for n in range(20)]
    with io.writes_together():
        for number, location in enumerate(names):
            with io.new_output(location).create() as stream:
                stream.write(b"x" * number)
        assert not io.new_input(names[0]).exists()  # not sent yet
    assert [len(io.get(location)) for location in names] == list(range(20))

    failed = f"{root}/tables/items/data/collection=c/never.parquet"
    with pytest.raises(RuntimeError), io.writes_together():
        with io.new_output(failed).create() as stream:
            stream.write(b"payload")
        raise RuntimeError("the batch failed before its files were sent")
    assert not io.new_input(failed).exists()

    # A refused write is raised at the end of the block.
    with pytest.raises(FileExistsError), io.writes_together(), io.new_output(names[3]).create() as stream:
        stream.write(b"again")
    assert len(io.get(names[3])) == 3


def test_a_server_without_conditional_writes_gets_a_head_then_a_put(moto_server, signature_proxy):
    settings = Settings(s3=signature_proxy.s3_settings(moto_server))
    bucket = moto_server.create_bucket()
    refusing = urllib.request.Request(f"{signature_proxy.endpoint}/__no_conditions__/{bucket}", method="PUT")
    urllib.request.urlopen(refusing, timeout=30)
    io = Location.parse(f"s3://{bucket}/repo", settings).file_io()
    first, second = (f"s3://{bucket}/repo/tables/items/metadata/0000{n}-x.metadata.json" for n in (1, 2))
    with io.new_output(first).create() as stream:
        stream.write(b"one")
    with io.new_output(second).create() as stream:
        stream.write(b"two")
    with pytest.raises(FileExistsError), io.new_output(first).create() as stream:
        stream.write(b"again")
    stored = Location.parse(f"s3://{bucket}/repo", settings).file_io()  # reads the store, not what io wrote
    assert stored.get(first) == b"one" and stored.get(second) == b"two"
    made = [
        (method, path.rsplit("/", 1)[-1])
        for method, path, _ in signature_proxy.requests()
        if "/repo/" in path and method != "GET"
    ]
    # The first write learns that the server refuses the condition (obstore retries a 501 a few times); from
    # then on, creating a file asks whether it exists (a HEAD), then PUTs.
    first_head = made.index(("HEAD", "00001-x.metadata.json"))
    assert set(made[:first_head]) == {("PUT", "00001-x.metadata.json")}, made
    assert made[first_head:] == [
        ("HEAD", "00001-x.metadata.json"),
        ("PUT", "00001-x.metadata.json"),
        ("HEAD", "00002-x.metadata.json"),
        ("PUT", "00002-x.metadata.json"),
        ("HEAD", "00001-x.metadata.json"),
    ], made
