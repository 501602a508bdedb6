"""The references of a TIFF's full-resolution image, its tile index read from the header without a full parse.

A reference plan (``--virtual``, and the tile copy into fixed stacks) needs,
for each granule, the offsets and byte counts of the first image's tiles and
the zarr metadata (codec chain, chunk shape, fill value) that decodes them.
virtual-tiff builds both, but it opens every image of the file through
async-tiff, overviews and masks included: about 7 ms of a 13 ms virtual plan
here, and several round trips for a remote file.

The metadata depends only on tags an archive's granules share (compression,
predictor, sample format, tiling, nodata ...), so :func:`read_first_image`
parses the first IFD itself (classic TIFF and BigTIFF, either byte order)
from one read of the header, and :class:`FirstImage` gives its *decoding
layout*: every tag of the image but those that differ from file to file
without changing how a tile decodes (size, tile offsets and byte counts,
georeferencing, descriptive text). :func:`first_image_references` asks
virtual-tiff once per layout, checks that this module's tile index of that
first file equals virtual-tiff's, and builds the later granules' references
from the layout's metadata and their own tile index. A layout where the two
differed, and stripped or pixel-interleaved images, stay with virtual-tiff.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import obstore
from virtual_tiff import VirtualTIFF
from virtualizarr.manifests import ChunkManifest, ManifestArray
from virtualizarr.manifests.manifest import validate_and_normalize_path_to_uri
from virtualizarr.manifests.utils import copy_and_replace_metadata
from zarr.core.metadata.v3 import ArrayV3Metadata

from ingest._compat import manifest_entries, tiff_image
from ingest.rasters._place import Place
from ingest.storage import FILE_SCHEME

__all__ = [
    "FULL_RESOLUTION_IFD",
    "HEAD_BYTES",
    "FirstImage",
    "TiffError",
    "first_image_references",
    "ifds_within",
    "metadata_document",
    "read_first_image",
    "read_head",
    "with_band_axis",
]

log = logging.getLogger(__name__)

#: Bytes read at first: a COG keeps its IFDs and their tag arrays at the start of the file.
HEAD_BYTES = 64 * 1024

#: TIFF field types: (NumPy type, values per count). 5/10 are rationals (two integers), 2 ASCII, 7 undefined bytes.
_TYPES: dict[int, tuple[str, int]] = {
    1: ("u1", 1),
    2: ("u1", 1),
    3: ("u2", 1),
    4: ("u4", 1),
    5: ("u4", 2),
    6: ("i1", 1),
    7: ("u1", 1),
    8: ("i2", 1),
    9: ("i4", 1),
    10: ("i4", 2),
    11: ("f4", 1),
    12: ("f8", 1),
    13: ("u4", 1),
    16: ("u8", 1),
    17: ("i8", 1),
    18: ("u8", 1),
}

IMAGE_WIDTH, IMAGE_LENGTH = 256, 257
STRIP_OFFSETS, STRIP_BYTE_COUNTS = 273, 279
SAMPLES_PER_PIXEL, PLANAR_CONFIGURATION = 277, 284
TILE_WIDTH, TILE_LENGTH, TILE_OFFSETS, TILE_BYTE_COUNTS = 322, 323, 324, 325
GDAL_METADATA = 42112
SUB_IFDS = 330
#: IFDs a header may chain before :func:`ifds_within` gives up (a COG has a few per overview level).
_MAX_IFDS = 1024

#: Tags that differ between an archive's files without changing how a tile decodes: size, the tile index,
#: georeferencing (ModelPixelScale, ModelTiepoint, ModelTransformation, the GeoKey directory and its
#: parameters) and descriptive text (ImageDescription, Make, Model, Software, DateTime, Artist, HostComputer,
#: Copyright). GDAL's metadata (42112) is one of them unless it carries a fill value or nested grids,
#: which virtual-tiff reads from it (``_consolidate_fill_value``, ``_construct_manifest_array``).
PER_FILE_TAGS = frozenset(
    {
        IMAGE_WIDTH,
        IMAGE_LENGTH,
        STRIP_OFFSETS,
        STRIP_BYTE_COUNTS,
        TILE_OFFSETS,
        TILE_BYTE_COUNTS,
        270,
        271,
        272,
        305,
        306,
        315,
        316,
        33432,
        33550,
        33922,
        34264,
        34735,
        34736,
        34737,
        GDAL_METADATA,
    }
)
_DECODING_METADATA = (b"_fillvalue", b"missing_value", b"nested")


class TiffError(ValueError):
    """The bytes are not a TIFF this module can read (the caller leaves the file to virtual-tiff)."""


@dataclass(frozen=True)
class FirstImage:
    """The first IFD of a TIFF: each tag's type and value bytes as stored (numbers decoded when asked for)."""

    byte_order: str
    raw: dict[int, tuple[int, bytes]]

    def _values(self, tag: int) -> np.ndarray:
        kind, data = self.raw[tag]
        code, _per = _TYPES[kind]
        return np.frombuffer(data, dtype=self.byte_order + code)

    def _int(self, tag: int, default: int | None = None) -> int:
        if tag not in self.raw:
            if default is None:
                raise TiffError(f"the first image has no tag {tag}")
            return default
        return int(self._values(tag)[0])

    @property
    def width(self) -> int:
        return self._int(IMAGE_WIDTH)

    @property
    def height(self) -> int:
        return self._int(IMAGE_LENGTH)

    @property
    def tiled(self) -> bool:
        return TILE_WIDTH in self.raw and TILE_LENGTH in self.raw and TILE_OFFSETS in self.raw

    @property
    def samples(self) -> int:
        return self._int(SAMPLES_PER_PIXEL, 1)

    @property
    def planes_separate(self) -> bool:
        """PlanarConfiguration 2: each sample (band) has tiles of its own, band after band."""
        return self._int(PLANAR_CONFIGURATION, 1) == 2

    @functools.cached_property
    def layout(self) -> tuple[Any, ...]:
        """What decoding a tile depends on: the byte order and every tag but the per-file ones."""
        kept = tuple(sorted((tag, *value) for tag, value in self.raw.items() if tag not in PER_FILE_TAGS))
        metadata = self.raw.get(GDAL_METADATA, (0, b""))[1]
        decoding_metadata = metadata if any(word in metadata.lower() for word in _DECODING_METADATA) else b""
        return (self.byte_order, kept, decoding_metadata)

    def tile_index(self) -> tuple[tuple[int, int, int], tuple[int, int, int], np.ndarray, np.ndarray]:
        """``(shape, chunks, offsets, byte_counts)`` of a tiled image as ``(band, y, x)``, the arrays on the tile grid.

        Raises TiffError for what this module does not index: strips,
        pixel-interleaved samples, a tile count that does not match the grid.
        """
        if not self.tiled:
            raise TiffError("the first image is stored in strips")
        bands = self.samples
        if bands > 1 and not self.planes_separate:
            raise TiffError("the first image's samples are pixel-interleaved")
        shape = (bands, self.height, self.width)
        chunks = (1, self._int(TILE_LENGTH), self._int(TILE_WIDTH))
        grid = tuple(math.ceil(size / chunk) for size, chunk in zip(shape, chunks, strict=True))
        offsets = self._values(TILE_OFFSETS).astype(np.uint64)
        counts = self._values(TILE_BYTE_COUNTS).astype(np.uint64) if TILE_BYTE_COUNTS in self.raw else np.empty(0)
        expected = math.prod(grid)
        if offsets.size != expected or counts.size != expected:
            raise TiffError(f"the first image has {offsets.size} tiles on a grid of {expected}")
        return shape, chunks, offsets.reshape(grid), counts.reshape(grid)


def read_first_image(read: Callable[[int, int], bytes], size: int, *, head: int = HEAD_BYTES) -> FirstImage:
    """Parse the first IFD of the TIFF whose bytes ``read(start, length)`` returns (``size`` bytes in all).

    Reads the first ``head`` bytes, then once more for tag values past
    them. Raises TiffError for bytes that are not a well-formed TIFF.
    """
    buffer = read(0, min(head, size))

    def at(start: int, length: int) -> bytes:
        if start + length > size:
            raise TiffError(f"bytes {start}-{start + length} are past the end of a {size}-byte file")
        if start + length <= len(buffer):
            return buffer[start : start + length]
        return read(start, length)

    order, big, ifd = _header(buffer)
    count_format, inline = ("Q", 8) if big else ("H", 4)
    count_size = struct.calcsize(count_format)
    (entries,) = struct.unpack(order + count_format, at(ifd, count_size))
    if not 0 < entries < 4096:
        raise TiffError(f"the first IFD has {entries} entries")
    fields = [("tag", order + "u2"), ("type", order + "u2"), ("count", order + ("u8" if big else "u4"))]
    entry = np.dtype([*fields, ("value", f"V{inline}")])
    table = np.frombuffer(at(ifd + count_size, entries * entry.itemsize), dtype=entry)
    value_offset = order + ("Q" if big else "I")
    raw: dict[int, tuple[int, bytes]] = {}
    located: list[tuple[int, int, int, int]] = []  # tag, type, offset and length of values past the entry
    for tag, kind, count, stored in table.tolist():
        value = bytes(stored)
        if kind not in _TYPES:
            continue  # a type TIFF 6 and BigTIFF do not define: skipped, as readers do
        nbytes = _nbytes(kind, count)
        if nbytes <= inline:
            raw[tag] = (kind, value[:nbytes])
        else:
            located.append((tag, kind, struct.unpack(value_offset, value)[0], nbytes))
    raw.update(_far_values(at, located, head))
    return FirstImage(order, raw)


def ifds_within(buffer: bytes) -> bool:
    """Whether every IFD of the TIFF that ``buffer`` begins, and every tag value stored away from its entry, lies
    inside ``buffer``: then a TIFF reader given these bytes alone reads every image's tags as from the file.

    A COG keeps all of that at its start; a TIFF written image after image, or one with SubIFDs, does not.
    """
    try:
        order, big, offset = _header(buffer)
    except TiffError:
        return False
    count_format, pointer = (order + "Q", order + "Q") if big else (order + "H", order + "I")
    count_size, pointer_size = struct.calcsize(count_format), struct.calcsize(pointer)
    entry_size, inline = (20, 8) if big else (12, 4)
    seen: set[int] = set()
    while offset:
        if offset in seen or len(seen) >= _MAX_IFDS or offset + count_size > len(buffer):
            return False
        seen.add(offset)
        (entries,) = struct.unpack_from(count_format, buffer, offset)
        first = offset + count_size
        end = first + entries * entry_size
        if end + pointer_size > len(buffer):
            return False
        for start in range(first, end, entry_size):
            tag, kind = struct.unpack_from(order + "HH", buffer, start)
            if tag == SUB_IFDS:
                return False
            if kind not in _TYPES:
                continue
            (count,) = struct.unpack_from(pointer, buffer, start + 4)
            nbytes = _nbytes(kind, count)
            if nbytes > inline:
                (value_offset,) = struct.unpack_from(pointer, buffer, start + 4 + pointer_size)
                if value_offset + nbytes > len(buffer):
                    return False
        (offset,) = struct.unpack_from(pointer, buffer, end)
    return True


def _header(buffer: bytes) -> tuple[str, bool, int]:
    """``(byte order, BigTIFF, offset of the first IFD)``."""
    if buffer[:2] == b"II":
        order = "<"
    elif buffer[:2] == b"MM":
        order = ">"
    else:
        raise TiffError("no TIFF byte order mark")
    (magic,) = _unpack(order + "H", buffer, 2)
    if magic == 42:
        return order, False, _unpack(order + "I", buffer, 4)[0]
    if magic == 43:
        return order, True, _unpack(order + "Q", buffer, 8)[0]
    raise TiffError(f"TIFF version {magic} is neither 42 (TIFF) nor 43 (BigTIFF)")


def _far_values(
    at: Callable[[int, int], bytes], located: list[tuple[int, int, int, int]], head: int
) -> dict[int, tuple[int, bytes]]:
    """The values stored away from their entries: in a COG they follow the IFD, so one read spans them all;
    scattered ones are read one by one."""
    if not located:
        return {}
    start = min(offset for _tag, _kind, offset, _length in located)
    end = max(offset + length for _tag, _kind, offset, length in located)
    if end - start > sum(length for *_rest, length in located) + head:
        return {tag: (kind, at(offset, length)) for tag, kind, offset, length in located}
    span = at(start, end - start)
    return {tag: (kind, span[offset - start : offset - start + length]) for tag, kind, offset, length in located}


def _nbytes(kind: int, count: int) -> int:
    code, per = _TYPES[kind]
    return count * per * np.dtype(code).itemsize


def _unpack(layout: str, buffer: bytes, offset: int) -> tuple[Any, ...]:
    try:
        return struct.unpack_from(layout, buffer, offset)
    except struct.error as exc:
        raise TiffError(f"the header is truncated ({exc})") from exc


# -- the references of the first image -------------------------------------------------------------

#: The full-resolution image of a COG; later IFDs are overviews (and masks).
FULL_RESOLUTION_IFD = 0
#: (id of a layout's metadata in _LAYOUTS, which keeps it alive; shape) -> that metadata for an image of the shape.
_SHAPED: dict[tuple[int, tuple[int, int, int]], ArrayV3Metadata] = {}
#: id -> (metadata, its JSON) for the metadata objects of _LAYOUTS and _SHAPED.
_DOCUMENTS: dict[int, tuple[ArrayV3Metadata, str]] = {}


#: Decoding layout (``FirstImage.layout``) -> virtual-tiff's array metadata for it, without the per-file
#: attributes; None: this module's tile index of a file of that layout differed from virtual-tiff's, so the
#: layout's files are left to virtual-tiff.
_LAYOUTS: dict[tuple[Any, ...], ArrayV3Metadata | None] = {}
_LAYOUTS_MAX = 256
#: Layouts a thread is having virtual-tiff parse right now -> set when it is done.
_PARSING: dict[tuple[Any, ...], threading.Event] = {}
#: How long a plan waits for another thread's parse of its layout before parsing its file itself.
_PARSE_WAIT_SECONDS = 60.0


def read_head(place: Place) -> bytes:
    """The first :data:`HEAD_BYTES` of the file (all of a smaller one): what :func:`read_first_image` reads first."""
    return _read_range(place, 0, min(HEAD_BYTES, place.size))


def first_image_references(place: Place, head: bytes | None = None) -> ManifestArray:
    """The references of the file's full-resolution image, ``(band, y, x)``.

    virtual-tiff parses the first file of each decoding layout (every image
    of the file); later files of the layout take its metadata and their own
    tile index, read from the header: one read instead of virtual-tiff's
    full open (none when the caller read ``head``, :func:`read_head`,
    already). Raises what virtual-tiff or virtualizarr raise for a file
    they cannot express.
    """
    image = None
    read = functools.partial(_read_range, place)
    if head is not None:
        read = functools.partial(_from_head, head, read)
    try:
        image = read_first_image(read, place.size)
        shape, chunks, offsets, lengths = image.tile_index()
    except Exception as exc:  # anything this parser cannot read is left to virtual-tiff
        log.debug("%s: first image left to virtual-tiff (%s)", place.url, exc)
        if image is not None and image.samples > 1 and not image.planes_separate:
            # No reference can decode interleaved samples (the plan refuses them): virtual-tiff's parse is not asked.
            raise
        image = None
    if image is not None:
        template = _known_layout(image.layout)
        if template is not None:
            return _manifest(place.url, _shaped(template, shape), offsets, lengths)
    if image is None or image.layout in _LAYOUTS or len(_LAYOUTS) >= _LAYOUTS_MAX:
        return _parsed(place)
    parsing = _PARSING.setdefault(image.layout, threading.Event())
    try:
        manifest = _parsed(place)
        return _learn(image.layout, place, manifest, (shape, chunks, offsets, lengths))
    finally:
        parsing.set()
        _PARSING.pop(image.layout, None)


def _known_layout(layout: tuple[Any, ...]) -> ArrayV3Metadata | None:
    """The layout's metadata; while another thread has virtual-tiff parse a file of the layout, after it (a batch
    plans several granules at once: the first of a layout would otherwise be parsed by each)."""
    parsing = _PARSING.get(layout)
    if parsing is not None:
        parsing.wait(timeout=_PARSE_WAIT_SECONDS)
    return _LAYOUTS.get(layout)


def _parsed(place: Place) -> ManifestArray:
    parsed = VirtualTIFF(ifd=FULL_RESOLUTION_IFD)(place.url, place.registry)
    return with_band_axis(tiff_image(parsed, FULL_RESOLUTION_IFD))


def _learn(
    layout: tuple[Any, ...],
    place: Place,
    manifest: ManifestArray,
    index: tuple[tuple[int, int, int], tuple[int, int, int], np.ndarray, np.ndarray],
) -> ManifestArray:
    """Keep the layout's metadata once this module's tile index of the file equals virtual-tiff's (else mark the
    layout as virtual-tiff's for good); the file's references."""
    shape, chunks, offsets, lengths = index
    _paths, parsed_offsets, parsed_lengths = manifest_entries(manifest.manifest)
    if (
        manifest.shape != shape
        or tuple(manifest.metadata.chunks) != chunks
        or not np.array_equal(parsed_offsets, offsets)
        or not np.array_equal(parsed_lengths, lengths)
    ):
        log.warning("%s: floe's tile index differs from virtual-tiff's; its layout is left to virtual-tiff", place.url)
        _LAYOUTS[layout] = None
        return manifest
    template = _remembered(copy_and_replace_metadata(manifest.metadata, new_attributes={}))
    _LAYOUTS[layout] = template
    return _manifest(place.url, template, offsets, lengths)


def _from_head(head: bytes, read: Callable[[int, int], bytes], start: int, length: int) -> bytes:
    if start + length <= len(head):
        return head[start : start + length]
    return read(start, length)


def _read_range(place: Place, start: int, length: int) -> bytes:
    if place.url.startswith(FILE_SCHEME):  # a local file: a plain read is ten times obstore's here
        with open(place.gdal_path, "rb") as file:
            file.seek(start)
            return file.read(length)
    store, path = place.registry.resolve(place.url)
    return bytes(obstore.get_range(store, path, start=start, length=length))


def _shaped(template: ArrayV3Metadata, shape: tuple[int, int, int]) -> ArrayV3Metadata:
    if tuple(template.shape) == shape:
        return template
    key = (id(template), shape)
    metadata = _SHAPED.get(key)
    if metadata is None:
        metadata = copy_and_replace_metadata(template, new_shape=list(shape))
        if len(_SHAPED) < _LAYOUTS_MAX:
            _SHAPED[key] = _remembered(metadata)
    return metadata


def _remembered(metadata: ArrayV3Metadata) -> ArrayV3Metadata:
    """Keep the JSON of a metadata object that lives as long as the process (a layout's), for its later granules."""
    _DOCUMENTS[id(metadata)] = (metadata, json.dumps(metadata.to_dict(), default=str, sort_keys=True))
    return metadata


def metadata_document(metadata: ArrayV3Metadata) -> str:
    """The metadata as sorted JSON (what a ReferenceKind keeps)."""
    remembered = _DOCUMENTS.get(id(metadata))
    if remembered is not None and remembered[0] is metadata:
        return remembered[1]
    return json.dumps(metadata.to_dict(), default=str, sort_keys=True)


def _manifest(url: str, metadata: ArrayV3Metadata, offsets: np.ndarray, lengths: np.ndarray) -> ManifestArray:
    # One URL for every tile: normalised once, not once per tile as from_arrays would (a third of its cost).
    paths = np.full(offsets.shape, validate_and_normalize_path_to_uri(url), dtype=np.dtypes.StringDType())
    chunks = ChunkManifest.from_arrays(paths=paths, offsets=offsets, lengths=lengths, validate_paths=False)
    return ManifestArray(metadata=metadata, chunkmanifest=chunks)


def with_band_axis(manifest: ManifestArray) -> ManifestArray:
    """virtual-tiff gives single-band images as ``(y, x)``; the copy's layout is ``(band, y, x)`` everywhere."""
    if manifest.ndim == 3:
        return manifest
    metadata = copy_and_replace_metadata(
        manifest.metadata,
        new_shape=[1, *manifest.shape],
        new_chunks=[1, *manifest.metadata.chunks],
        new_dimension_names=("band", "y", "x"),
    )
    paths, offsets, lengths = manifest_entries(manifest.manifest)
    chunks = ChunkManifest.from_arrays(
        paths=paths[np.newaxis],
        offsets=offsets[np.newaxis],
        lengths=lengths[np.newaxis],
    )
    return ManifestArray(metadata=metadata, chunkmanifest=chunks)
