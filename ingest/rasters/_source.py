"""One file to reference, planned: what GDAL reads of it, its references, and the probe of its layout.

:func:`plan_source` checks one asset of a granule before anything is written: that a virtual chunk container covers
it, its georeferencing, its references (``_tiff.py``) and that they decode. How a remote file's header is read once
and a layout probed once: docs/pixels.md#how-a-reference-or-a-tile-copy-is-planned.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyproj
import rasterio
import rasterio.crs
import rasterio.errors
import xarray as xr
import zarr
from obspec_utils.registry import ObjectStoreRegistry
from rasterio.windows import Window
from virtualizarr.manifests import ManifestArray, ManifestGroup, ManifestStore

from ingest._compat import manifest_entries, rasterio_attributes
from ingest.errors import InvalidRaster, NotVirtualizable
from ingest.rasters._copy import GRANULE_VARIABLE, GRID_MAPPING, clean_attrs
from ingest.rasters._opening import detail, open_failure, remote_env, why_unrecognized
from ingest.rasters._place import Place, locate
from ingest.rasters._tiff import first_image_references, ifds_within, metadata_document, read_head
from ingest.remote import Stores, describe, unreachable
from ingest.storage import FILE_SCHEME

log = logging.getLogger(__name__)

#: TIFF PlanarConfiguration 1: samples of a pixel stored together ("pixel-interleaved").
_CHUNKY = "PIXEL"


@dataclass(frozen=True)
class CheckedAsset:
    """One asset, checked and ready to reference."""

    key: str
    path: str
    url: str
    #: One ``(band, y, x)`` variable backed by the ManifestArray, with the copy's coordinates and attributes.
    dataset: xr.Dataset
    #: What the references carry so that Icechunk refuses a changed source (an ETag); None: the writing time.
    checksum: str | datetime | None = None
    #: Where the file's bytes are read from (obstore), for a copy of its tiles.
    registry: ObjectStoreRegistry | None = None

    @property
    def manifest(self) -> ManifestArray:
        return self.dataset[GRANULE_VARIABLE].variable.data


#: Layouts (see _layout_signature) whose first tile decoded equal to GDAL's reading in this process.
_PROBED_LAYOUTS: set[str] = set()
_PROBED_LAYOUTS_MAX = 256
#: Layouts a thread is probing right now -> set when its probe ends (passed or not).
_PROBING: dict[str, threading.Event] = {}
#: Probed layouts whose first file GDAL described from its header bytes alone as it did from the file.
_HEADER_LAYOUTS: set[str] = set()
_PROBING_LOCK = threading.Lock()
#: How long a plan waits for another thread's probe of its layout before probing its own file.
_PROBE_WAIT_SECONDS = 60.0


def plan_source(
    key: str, path: str | Path, prefixes: tuple[str, ...] | None, stores: Stores | None, gdal_env: Mapping[str, str]
) -> CheckedAsset:
    """``prefixes`` None: the tiles are to be copied, so no virtual chunk container needs to cover the file.

    A remote file's header is read once (:func:`read_head`): floe's tile
    index comes from it, and once its layout has passed the probe (with
    GDAL's reading of the header alone equal to its reading of the file),
    GDAL reads the georeferencing from those bytes in memory too, so a plan
    makes one request besides its HEAD instead of GDAL's own round trips.
    """
    source = os.fspath(path)
    place = locate(source, stores)
    url = place.url
    if prefixes is not None and not any(url.startswith(prefix) for prefix in prefixes):
        raise NotVirtualizable(
            f"granule {source} cannot be referenced: the repository has no virtual chunk container for {url} "
            "(call Repository.allow_virtual_sources before opening the writer)",
            path=source,
        )
    with remote_env(gdal_env, source):
        head = None if url.startswith(FILE_SCHEME) else _read_head(source, place)
        try:
            manifest: ManifestArray | None = first_image_references(place, head)
            failure: Exception | None = None
        except Exception as exc:  # noqa: BLE001 - what GDAL makes of the file decides how it is reported
            manifest, failure = None, exc
        signature = _layout_signature(manifest) if manifest is not None else None
        with _layout_turn(signature) as probing:
            if not probing and head is not None and signature in _HEADER_LAYOUTS:
                described = _described_from_head(source, head)
                if described is not None:
                    return _checked_source(key, source, place, described, manifest, failure, probe=None)
            with _opened(source, place, stores) as dataset:
                described = _describe(source, dataset)
                probe = None
                if probing and signature is not None:
                    probe = functools.partial(
                        _probe, source, signature, dataset=dataset, registry=place.registry, head=head
                    )
                return _checked_source(key, source, place, described, manifest, failure, probe=probe)


@dataclass(frozen=True)
class _Described:
    """What GDAL reads of a granule for its plan: the copy's coordinates and attributes, size and structure."""

    coords: dict[str, xr.Variable]
    attrs: dict[str, Any]
    shape: tuple[int, int, int]
    dtype: np.dtype
    compression: str
    interleaved: bool

    def same_as(self, other: _Described) -> bool:
        return (
            (self.shape, self.dtype, self.compression, self.interleaved)
            == (other.shape, other.dtype, other.compression, other.interleaved)
            and self.coords.keys() == other.coords.keys()
            and all(self.coords[name].identical(other.coords[name]) for name in self.coords)
            and _same_attrs(self.attrs, other.attrs)
        )


def _same_attrs(one: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
    if one.keys() != other.keys():
        return False
    return all(np.array_equal(np.asarray(one[name]), np.asarray(other[name])) for name in one)


def _describe(source: str, dataset: rasterio.DatasetReader) -> _Described:
    coords, attrs = _georeferencing(source, dataset)
    structure = dataset.tags(ns="IMAGE_STRUCTURE")
    return _Described(
        coords,
        attrs,
        (dataset.count, dataset.height, dataset.width),
        np.dtype(dataset.dtypes[0]),
        structure.get("COMPRESSION", "NONE"),
        dataset.count > 1 and structure.get("INTERLEAVE", "").upper() == _CHUNKY,
    )


def _read_head(source: str, place: Place) -> bytes | None:
    """The file's first bytes; None if they cannot be read for a reason GDAL's open may name better.

    Raises:
        InvalidRaster: the object cannot be reached at all (a timeout after the retries, a 403, a 404): GDAL,
            and then the read that explains GDAL's failure, would each wait as long again for the same answer.
    """
    try:
        return read_head(place)
    except Exception as exc:
        reason = describe(exc)
        if unreachable(reason):
            raise InvalidRaster(f"granule {source} cannot be read: {reason}", path=source) from exc
        log.debug("%s: header not read ahead (%s)", source, exc)
        return None


@contextlib.contextmanager
def _opened(source: str, place: Place, stores: Stores | None) -> Iterator[rasterio.DatasetReader]:
    try:
        dataset = rasterio.open(place.gdal_path, driver="GTiff")
    except (rasterio.errors.RasterioError, OSError, ValueError) as exc:
        raise why_unrecognized(source, stores, InvalidRaster(open_failure(source, exc), path=source)) from exc
    with dataset:
        yield dataset


def _described_from_head(source: str, head: bytes) -> _Described | None:
    """GDAL's description of the file read from its header bytes alone (every IFD inside them), or None."""
    if not ifds_within(head):
        return None
    try:
        with rasterio.MemoryFile(head) as memory, memory.open(driver="GTiff") as dataset:
            return _describe(source, dataset)
    except (rasterio.errors.RasterioError, OSError, ValueError, InvalidRaster, NotVirtualizable) as exc:
        log.debug("%s: GDAL cannot describe the header alone (%s)", source, exc)
        return None


def _checked_source(  # noqa: PLR0917 - one plan's parts, checked in the order they are reported
    key: str,
    source: str,
    place: Place,
    described: _Described,
    manifest: ManifestArray | None,
    failure: Exception | None,
    probe: Callable[[ManifestArray, _Described], None] | None,
) -> CheckedAsset:
    """The source once its references are checked against GDAL's reading (``probe``: also its first tile)."""
    if described.interleaved:
        raise NotVirtualizable(
            f"granule {source} is pixel-interleaved ({described.shape[0]} bands, {described.compression}): "
            "the installed zarr cannot decode interleaved samples from virtual references",
            path=source,
        )
    if manifest is None:
        raise NotVirtualizable(
            f"granule {source} cannot be referenced: virtual-tiff cannot express its layout "
            f"({described.compression}; {type(failure).__name__}: {failure})",
            path=source,
        ) from failure
    if manifest.shape != described.shape or np.dtype(manifest.dtype) != described.dtype:
        raise NotVirtualizable(
            f"granule {source} cannot be referenced: its first TIFF image is {manifest.dtype} "
            f"{manifest.shape}, GDAL reads {described.dtype} {described.shape}",
            path=source,
        )
    _check_extent(source, place.size, manifest)
    if probe is not None:
        probe(manifest, described)
    pixels = xr.Variable(("band", "y", "x"), manifest, attrs=described.attrs)
    dataset = xr.Dataset({GRANULE_VARIABLE: pixels}, coords=described.coords)
    return CheckedAsset(
        key=key, path=source, url=place.url, dataset=dataset, checksum=place.checksum, registry=place.registry
    )


def _georeferencing(source: str, dataset: rasterio.DatasetReader) -> tuple[dict[str, xr.Variable], dict[str, Any]]:
    """The coordinates and attributes the copy gets from rioxarray, computed from the TIFF's metadata alone.

    Raises InvalidRaster for the rasters the copy refuses too (no CRS, no
    axis-aligned geotransform).
    """
    if dataset.crs is None:
        raise InvalidRaster(f"granule {source} has no CRS: floe stores georeferenced rasters only", path=source)
    transform = dataset.transform
    if dataset.gcps[0] or dataset.rpcs or not transform.is_rectilinear or transform.b or transform.d:
        raise InvalidRaster(
            f"granule {source} has no axis-aligned geotransform (rotated, or georeferenced by GCPs/RPCs only)",
            path=source,
        )
    # rioxarray's own attribute reading keeps the two modes' attributes equal by construction.
    attrs = rasterio_attributes(dataset)
    if any(name.startswith("NETCDF_") for name in attrs):
        raise NotVirtualizable(f"granule {source} carries netCDF dimension tags; it is copied", path=source)
    if "_FillValue" in attrs:
        attrs["_FillValue"] = np.dtype(dataset.dtypes[0]).type(attrs["_FillValue"])
    # Pixel centres, as rioxarray computes them.
    centres = transform * transform.translation(0.5, 0.5)
    x_values, _ = centres * (np.arange(dataset.width), np.zeros(dataset.width))
    _, y_values = centres * (np.zeros(dataset.height), np.arange(dataset.height))
    grid_mapping = {
        **_cf_grid_mapping(dataset.crs.to_wkt()),
        "GeoTransform": " ".join(str(value) for value in transform.to_gdal()),
    }
    coords = {
        "band": xr.Variable("band", np.asarray(dataset.indexes)),
        "x": xr.Variable("x", np.asarray(x_values, dtype=np.float64)),
        "y": xr.Variable("y", np.asarray(y_values, dtype=np.float64)),
        GRID_MAPPING: xr.Variable((), np.int64(0), attrs=grid_mapping),
    }
    return coords, clean_attrs(attrs)


@functools.lru_cache(maxsize=64)
def _cf_grid_mapping(crs_wkt: str) -> dict[str, Any]:
    """The ``spatial_ref`` attributes rioxarray writes for a CRS (CF grid mapping plus WKT); cached, pyproj is slow."""
    try:
        attrs = pyproj.CRS.from_user_input(crs_wkt).to_cf()
    except KeyError:
        attrs = {}
    return {**attrs, "spatial_ref": crs_wkt, "crs_wkt": crs_wkt}


def _check_extent(source: str, size: int, manifest: ManifestArray) -> None:
    """A truncated file would only fail when read: refuse references past its end (``size`` bytes) now."""
    _, offsets, lengths = manifest_entries(manifest.manifest)
    ends = offsets.astype(np.uint64) + lengths.astype(np.uint64)
    if ends.size and int(ends.max()) > size:
        raise InvalidRaster(
            f"granule {source} is truncated: its tiles reach byte {int(ends.max())} of a {size}-byte file",
            path=source,
        )


def _layout_signature(manifest: ManifestArray) -> str:
    """What decoding depends on: dtype, chunk shape and the codec chain (shape and attributes aside)."""
    metadata = json.loads(metadata_document(manifest.metadata))
    decoding = {key: metadata.get(key) for key in ("data_type", "chunk_grid", "codecs", "fill_value")}
    return json.dumps(decoding, sort_keys=True, default=str)


@contextlib.contextmanager
def _layout_turn(signature: str | None) -> Iterator[bool]:
    """Whether this plan is to probe its layout (True) or the layout passed already (False).

    Once a layout has decoded equal in this process, granules of the same
    layout skip the probe: an archive's granules share it, and the probe
    costs about as much as the rest of the plan. Plans of a layout made at
    once (a batch plans several granules together; a Ray actor's first
    batch is all of new layouts) wait while one holds the layout's turn and
    probes; then they skip their probes and, where it passed with the
    header, GDAL's open of their files too. If it does not pass (its own file
    may be the corrupt one), the next waiting plan takes the turn and probes
    its own file. A plan that waited :data:`_PROBE_WAIT_SECONDS` probes
    without the turn.
    """
    if signature is None:  # no references: nothing to probe (the plan is refused)
        yield False
        return
    deadline = time.monotonic() + _PROBE_WAIT_SECONDS
    while True:
        with _PROBING_LOCK:
            if signature in _PROBED_LAYOUTS:
                claimed = None
                break
            running = _PROBING.get(signature)
            if running is None:
                claimed = _PROBING[signature] = threading.Event()
                break
        if not running.wait(timeout=max(0.0, deadline - time.monotonic())):
            yield True
            return
    if claimed is None:
        yield False
        return
    try:
        yield True
    finally:
        with _PROBING_LOCK:
            _PROBING.pop(signature, None)
        claimed.set()


def _probe(
    source: str,
    signature: str,
    manifest: ManifestArray,
    described: _Described,
    *,
    dataset: rasterio.DatasetReader,
    registry: ObjectStoreRegistry,
    head: bytes | None,
) -> None:
    """Decode the first tile through the references and compare it with GDAL's reading of the same pixels; once
    it passes, the layout is known (:func:`_layout_turn`). With the file's ``head``, also check that GDAL
    describes the header alone as it describes the file: then later remote granules of the layout are described
    from their headers."""
    _probe_first_tile(source, manifest, dataset, registry)
    from_head = _described_from_head(source, head) if head is not None else None
    with _PROBING_LOCK:
        if from_head is not None and from_head.same_as(described) and len(_HEADER_LAYOUTS) < _PROBED_LAYOUTS_MAX:
            _HEADER_LAYOUTS.add(signature)
        if len(_PROBED_LAYOUTS) < _PROBED_LAYOUTS_MAX:
            _PROBED_LAYOUTS.add(signature)


def _probe_first_tile(
    source: str, manifest: ManifestArray, dataset: rasterio.DatasetReader, registry: ObjectStoreRegistry
) -> None:
    """Refuse the granule unless its first tile decodes through the references as GDAL reads it."""
    _bands, height, width = manifest.shape
    chunk_bands, tile_height, tile_width = manifest.metadata.chunks
    rows, cols = min(tile_height, height), min(tile_width, width)
    try:
        store = ManifestStore(registry=registry, group=ManifestGroup(arrays={"probe": manifest}))
        decoded = np.asarray(zarr.open_array(store, path="probe", mode="r")[:chunk_bands, :rows, :cols])
    except Exception as exc:
        raise NotVirtualizable(
            f"granule {source} cannot be referenced: decoding its tiles through virtual references failed "
            f"({type(exc).__name__}: {detail(exc)})",
            path=source,
        ) from exc
    try:
        expected = dataset.read(indexes=list(range(1, chunk_bands + 1)), window=Window(0, 0, cols, rows))
    except rasterio.errors.RasterioError as exc:
        raise InvalidRaster(
            f"granule {source} cannot be read: truncated or corrupt pixels ({detail(exc)})", path=source
        ) from exc
    if decoded.shape != expected.shape or not np.array_equal(decoded, expected, equal_nan=decoded.dtype.kind == "f"):
        raise NotVirtualizable(
            f"granule {source} cannot be referenced: its first tile decoded through virtual references "
            "differs from GDAL's reading",
            path=source,
        )
