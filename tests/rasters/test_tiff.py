"""A reference plan reads the first image's tile index from the header itself (``ingest/rasters/_tiff.py``) and asks
virtual-tiff only once per decoding layout.

The parser's tile index is compared with virtual-tiff's for real files
written by GDAL in the layouts archives use (compressions, predictors,
BigTIFF, big-endian, band-separate samples); granules planned from a layout
virtual-tiff parsed once read back equal to their sources through a real
repository; a parser that disagreed with virtual-tiff leaves the layout to
virtual-tiff; malformed headers are refused by the parser, not misread.

End to end the header reader makes a ``--virtual`` ingest of 300 small COGs 1.26x faster than virtual-tiff
parsing every file (``scripts/bench_fast_paths.py``, 3 rounds; docs/benchmarks.md).
"""

from __future__ import annotations

import functools
import logging
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import rasterio
import rioxarray
from rasterio.transform import from_origin
from virtual_tiff import VirtualTIFF

from ingest._compat import manifest_entries, tiff_image
from ingest.rasters import NotVirtualizable, _source, _tiff, plan_references
from ingest.rasters._place import locate
from ingest.rasters._tiff import FirstImage, TiffError, read_first_image
from ingest.repository import Repository
from tests.rasters.test_copy import ingest_granule

ORIGIN = from_origin(500_000.0, 6_000_000.0, 10.0, 10.0)


def write_tiff(path: Path, *, bands: int = 3, dtype: str = "uint16", height: int = 300, width: int = 280, **profile):
    """A tiled GeoTIFF (GTiff driver unless ``driver`` says otherwise) of random pixels, band-separate."""
    rng = np.random.default_rng(len(path.name))
    if np.dtype(dtype).kind == "f":
        data = rng.normal(size=(bands, height, width)).astype(dtype)
    else:
        data = rng.integers(0, 200, size=(bands, height, width)).astype(dtype)
    base = {
        "driver": "GTiff",
        "tiled": True,
        "blockxsize": 128,
        "blockysize": 128,
        "interleave": "band",
        "width": width,
        "height": height,
        "count": bands,
        "dtype": dtype,
        "crs": "EPSG:32633",
        "transform": ORIGIN,
    }
    base.update(profile)
    if base["driver"] == "COG":
        for key in ("tiled", "blockxsize", "blockysize", "interleave"):
            base.pop(key)
        base.setdefault("blocksize", 128)
        base["interleave"] = "band"
    with rasterio.open(path, "w", **base) as dst:
        dst.write(data)
    return path


def parsed(path: Path) -> FirstImage:
    place = locate(str(path), None)
    return read_first_image(functools.partial(_tiff._read_range, place), place.size)


LAYOUTS = {
    "cog-deflate-predictor": {"driver": "COG", "compress": "deflate", "predictor": 2},
    "cog-zstd-float-predictor": {"driver": "COG", "compress": "zstd", "predictor": 3, "dtype": "float32"},
    "lzw-int16": {"compress": "lzw", "dtype": "int16", "bands": 1},
    "uncompressed-uint8": {"dtype": "uint8", "bands": 2},
    "bigtiff": {"compress": "deflate", "bigtiff": "YES"},
    "big-endian": {"compress": "deflate", "endianness": "BIG", "dtype": "int32"},
    "nodata": {"compress": "deflate", "nodata": 7},
    "tiles-256-one-band": {"compress": "deflate", "blockxsize": 256, "blockysize": 256, "bands": 1},
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_the_tile_index_is_virtual_tiffs(name, tmp_path):
    """Shape, chunk shape, offsets and byte counts of the first image equal those virtual-tiff builds."""
    path = write_tiff(tmp_path / f"{name}.tif", **LAYOUTS[name])
    place = locate(str(path), None)
    reference = _tiff.with_band_axis(tiff_image(VirtualTIFF(ifd=0)(place.url, place.registry), 0))
    _paths, offsets, lengths = manifest_entries(reference.manifest)

    shape, chunks, our_offsets, our_lengths = parsed(path).tile_index()

    assert shape == reference.shape
    assert chunks == tuple(reference.metadata.chunks)
    np.testing.assert_array_equal(our_offsets, offsets)
    np.testing.assert_array_equal(our_lengths, lengths)
    assert our_offsets.size > 1 and (our_lengths > 0).all()


def test_the_layout_names_what_decoding_depends_on(tmp_path):
    """Files that differ only in pixels, size and place share a layout; compression, predictor, nodata and byte
    order each make another."""
    base = {"compress": "deflate", "predictor": 2}
    first = parsed(write_tiff(tmp_path / "a.tif", **base))
    elsewhere = parsed(
        write_tiff(tmp_path / "bb.tif", **base, height=200, width=333, transform=from_origin(0.0, 0.0, 10.0, 10.0))
    )
    assert first.layout == elsewhere.layout
    assert first.tile_index()[2].tolist() != elsewhere.tile_index()[2].tolist()
    others = {
        "compress": parsed(write_tiff(tmp_path / "c.tif", compress="lzw", predictor=2)),
        "predictor": parsed(write_tiff(tmp_path / "d.tif", compress="deflate")),
        "nodata": parsed(write_tiff(tmp_path / "e.tif", **base, nodata=3)),
        "endianness": parsed(write_tiff(tmp_path / "f.tif", **base, endianness="BIG")),
        "tiles": parsed(write_tiff(tmp_path / "g.tif", **base, blockxsize=256, blockysize=256)),
    }
    for what, image in others.items():
        assert image.layout != first.layout, what


def test_strips_and_pixel_interleaved_images_are_not_indexed(tmp_path):
    strips = write_tiff(tmp_path / "strips.tif", tiled=False, blockysize=20)
    interleaved = write_tiff(tmp_path / "pixel.tif", interleave="pixel")
    with pytest.raises(TiffError, match="strips"):
        parsed(strips).tile_index()
    with pytest.raises(TiffError, match="pixel-interleaved"):
        parsed(interleaved).tile_index()


def _header(entries: int, ifd: int = 8) -> bytes:
    return b"II" + struct.pack("<HI", 42, ifd) + struct.pack("<H", entries)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"\x89PNG\r\n\x1a\n" + bytes(64), "byte order"),
        (b"II" + struct.pack("<H", 7) + bytes(16), "version 7"),
        (b"II*", "truncated"),
        (_header(3, ifd=10_000) + bytes(8), "past the end"),
        (_header(0) + bytes(8), "0 entries"),
        (_header(60_000) + bytes(8), "entries"),
        # One entry (TileOffsets, LONG, 1,000 values) whose values lie past the end of the file.
        (_header(1) + struct.pack("<HHII", 324, 4, 1000, 64) + bytes(32), "past the end"),
    ],
    ids=["not-a-tiff", "bad-version", "short", "ifd-past-end", "no-entries", "too-many-entries", "values-past-end"],
)
def test_malformed_headers_are_refused(body, message):
    """The caller then leaves the file to virtual-tiff, which says what it cannot read."""
    with pytest.raises(TiffError, match=message):
        read_first_image(lambda start, length: body[start : start + length], len(body))


def test_values_past_the_first_read_are_read_once(tmp_path):
    """A header bigger than the first read: the tag arrays are fetched with one more read, not one per tag."""
    path = write_tiff(tmp_path / "big.tif", bands=1, height=4096, width=4096, blockxsize=16, blockysize=16)
    place = locate(str(path), None)
    reads: list[tuple[int, int]] = []

    def read(start: int, length: int) -> bytes:
        reads.append((start, length))
        return _tiff._read_range(place, start, length)

    image = read_first_image(read, place.size, head=512)
    assert len(reads) == 2
    _shape, _chunks, offsets, lengths = image.tile_index()
    assert offsets.shape == (1, 256, 256)
    with rasterio.open(path) as dataset:
        assert int(dataset.get_tag_item("BLOCK_OFFSET_255_255", "TIFF", bidx=1)) == int(offsets[0, 255, 255])
        assert int(dataset.get_tag_item("BLOCK_SIZE_7_3", "TIFF", bidx=1)) == int(lengths[0, 3, 7])


@pytest.fixture
def fresh_layouts(monkeypatch):
    """No layout known yet in this process, and every call of virtual-tiff counted."""
    monkeypatch.setattr(_tiff, "_LAYOUTS", {})
    monkeypatch.setattr(_tiff, "_SHAPED", {})
    monkeypatch.setattr(_tiff, "_DOCUMENTS", {})
    calls: list[str] = []

    class Counting(VirtualTIFF):
        def __call__(self, url, registry):
            calls.append(url)
            return super().__call__(url, registry)

    monkeypatch.setattr(_tiff, "VirtualTIFF", Counting)
    return calls


def test_a_pixel_interleaved_file_is_refused_without_virtual_tiffs_parse(fresh_layouts, tmp_path):
    """Its samples cannot be decoded from references whatever the layout: the header says so, and the plan refuses
    it (the granule is copied) without having virtual-tiff parse the whole file first."""
    path = write_tiff(tmp_path / "pixel.tif", compress="deflate", interleave="pixel")
    prefixes = (locate(str(path), None).url.rsplit("/", 1)[0] + "/",)
    with pytest.raises(NotVirtualizable, match="pixel-interleaved"):
        plan_references(None, "c", {"data": path}, prefixes=prefixes)
    assert fresh_layouts == []


def _referenced_equal_to_the_source(repo: Repository, item_id: str, path: Path) -> None:
    expected = rioxarray.open_rasterio(path, mask_and_scale=False).values
    np.testing.assert_array_equal(repo.view().item_arrays("c", item_id)["data"].values, expected)


def test_later_granules_of_a_layout_are_planned_without_virtual_tiff(fresh_layouts, tmp_path):
    """Four granules of one layout on two sizes: virtual-tiff parses the first only; all read back exactly."""
    repo = Repository.create(tmp_path / "repo")
    repo.allow_virtual_sources([tmp_path])
    sizes = [(300, 280), (300, 280), (200, 333), (200, 333)]
    cog = {"driver": "COG", "compress": "deflate", "predictor": 2}
    paths = [write_tiff(tmp_path / f"{'g' * (n + 1)}.tif", **cog, height=h, width=w) for n, (h, w) in enumerate(sizes)]
    for number, path in enumerate(paths):
        outcome = ingest_granule(repo, f"item{number}", {"data": path}, virtual=True)
        assert outcome.virtual == 1 and not outcome.fallbacks, outcome.fallbacks
    assert len(fresh_layouts) == 1
    for number, path in enumerate(paths):
        _referenced_equal_to_the_source(repo, f"item{number}", path)
    # Another compression is another layout: virtual-tiff again, once.
    other = write_tiff(tmp_path / "lzw.tif", driver="COG", compress="lzw", predictor=2)
    assert ingest_granule(repo, "lzw", {"data": other}, virtual=True).virtual == 1
    assert len(fresh_layouts) == 2
    _referenced_equal_to_the_source(repo, "lzw", other)


def test_a_tile_index_that_disagrees_with_virtual_tiff_leaves_the_layout_to_it(
    fresh_layouts, tmp_path, monkeypatch, caplog
):
    """A parser bug (offsets one byte off, forced here) is caught on the layout's first file: that layout's files
    all go to virtual-tiff, and their pixels stay right."""
    index = FirstImage.tile_index

    def off_by_one(self):
        shape, chunks, offsets, lengths = index(self)
        return shape, chunks, offsets + np.uint64(1), lengths

    monkeypatch.setattr(_tiff.FirstImage, "tile_index", off_by_one)
    repo = Repository.create(tmp_path / "repo")
    repo.allow_virtual_sources([tmp_path])
    paths = [write_tiff(tmp_path / f"{'x' * (n + 1)}.tif", driver="COG", compress="deflate") for n in range(2)]
    with caplog.at_level(logging.WARNING, logger=_tiff.__name__):
        for number, path in enumerate(paths):
            assert ingest_granule(repo, f"item{number}", {"data": path}, virtual=True).virtual == 1
    assert len(fresh_layouts) == 2
    assert list(_tiff._LAYOUTS.values()) == [None]
    assert "differs from virtual-tiff's" in caplog.text
    for number, path in enumerate(paths):
        _referenced_equal_to_the_source(repo, f"item{number}", path)


def test_granules_planned_at_once_wait_for_one_parse_of_their_layout(fresh_layouts, tmp_path, monkeypatch):
    """Four plans of one new layout at once (a batch plans several granules together): virtual-tiff parses one
    file; the others wait for it and take the layout's metadata. Forced: the parse returns only once all four
    plans have read their headers, so without the wait each would parse its own file."""
    paths = [write_tiff(tmp_path / f"{'w' * (n + 1)}.tif", driver="COG", compress="deflate") for n in range(4)]
    headers_read = threading.Semaphore(0)
    read = _tiff.read_first_image

    def counted_read(*args, **kwargs):
        image = read(*args, **kwargs)
        headers_read.release()
        return image

    parse = _tiff._parsed

    def parse_after_every_header(place):
        for _ in range(len(paths)):
            assert headers_read.acquire(timeout=60), "the plans did not all read their headers"
        for _ in range(len(paths)):
            headers_read.release()
        return parse(place)

    monkeypatch.setattr(_tiff, "read_first_image", counted_read)
    monkeypatch.setattr(_tiff, "_parsed", parse_after_every_header)
    with ThreadPoolExecutor(max_workers=len(paths)) as pool:
        manifests = list(pool.map(lambda path: _tiff.first_image_references(locate(str(path), None)), paths))
    assert len(fresh_layouts) == 1
    for path, manifest in zip(paths, manifests, strict=True):
        _paths, offsets, _lengths = manifest_entries(manifest.manifest)
        np.testing.assert_array_equal(offsets, parsed(path).tile_index()[2])


@pytest.fixture
def fresh_probes(monkeypatch):
    """No layout probed yet in this process; the plans' probes counted by file, and held until ``ready`` plans
    have reached their probe (so plans of a batch that start together meet there)."""
    monkeypatch.setattr(_source, "_PROBED_LAYOUTS", set())
    monkeypatch.setattr(_source, "_PROBING", {})
    arrived = threading.Semaphore(0)
    probed: list[str] = []
    state = {"ready": 1, "fail_first": False}
    signature = _source._layout_signature

    def arriving(manifest):
        arrived.release()
        return signature(manifest)

    probe = _source._probe_first_tile

    def held_probe(source, manifest, dataset, registry):
        for _ in range(state["ready"]):
            assert arrived.acquire(timeout=60), "the plans did not all reach their probe"
        for _ in range(state["ready"]):
            arrived.release()
        probed.append(Path(source).name)
        if state["fail_first"] and len(probed) == 1:
            raise NotVirtualizable(f"granule {source}: probe failed (forced)", path=source)
        return probe(source, manifest, dataset, registry)

    monkeypatch.setattr(_source, "_layout_signature", arriving)
    monkeypatch.setattr(_source, "_probe_first_tile", held_probe)
    return state, probed


def _plan_at_once(paths: list[Path]) -> list[object]:
    """Each file's reference plan, all made at once on threads (as an actor plans a batch)."""
    prefixes = (locate(str(paths[0]), None).url.rsplit("/", 1)[0] + "/",)

    def plan(path: Path) -> object:
        try:
            return plan_references(None, "c", {"data": path}, prefixes=prefixes)
        except NotVirtualizable as error:
            return error

    with ThreadPoolExecutor(max_workers=len(paths)) as pool:
        return list(pool.map(plan, paths))


def test_granules_planned_at_once_wait_for_one_probe_of_their_layout(fresh_probes, tmp_path):
    """Four plans of one new layout at once: one decodes its first tile against GDAL's reading, the others wait
    for it and skip theirs. Forced: the probe starts only once all four plans have reached it, so without the
    wait each would probe its own file."""
    state, probed = fresh_probes
    paths = [write_tiff(tmp_path / f"{'p' * (n + 1)}.tif", driver="COG", compress="deflate") for n in range(4)]
    state["ready"] = len(paths)
    plans = _plan_at_once(paths)
    assert not [plan for plan in plans if isinstance(plan, Exception)]
    assert len(probed) == 1, probed
    # Once probed, the layout is known: a later plan of it does not probe.
    state["ready"] = 1
    _plan_at_once([write_tiff(tmp_path / "later.tif", driver="COG", compress="deflate")])
    assert len(probed) == 1, probed


def test_when_the_one_probe_fails_the_waiting_plans_probe_their_own_files(fresh_probes, tmp_path):
    """The file probed first may be the bad one (forced: its probe fails): its granule is refused, and every plan
    that waited for it probes a file of its own rather than take a layout that never passed."""
    state, probed = fresh_probes
    paths = [write_tiff(tmp_path / f"{'q' * (n + 1)}.tif", driver="COG", compress="deflate") for n in range(3)]
    state["ready"], state["fail_first"] = len(paths), True
    plans = _plan_at_once(paths)
    refused = [path.name for path, plan in zip(paths, plans, strict=True) if isinstance(plan, NotVirtualizable)]
    assert refused == probed[:1], (refused, probed)
    # The layout passes on another file's probe (the later waiters may take that one's, or probe theirs too).
    assert len(probed) >= 2 and len(set(probed)) == len(probed), probed
    assert len(_source._PROBED_LAYOUTS) == 1
