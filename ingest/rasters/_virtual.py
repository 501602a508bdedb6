"""Reference a granule's COGs from fixed stacks instead of copying their pixels (``floe ingest --virtual``).

A referenced asset is one whole slice of the *fixed stack* of its exact grid
(``<collection>/stacks/g<hash>``, see ``_stack.py``): a reference is a whole
tile (or strip) of the source file, so the stack array's chunks are the
file's tiles, and its codecs are the ones virtual-tiff registers with zarr to
decode them. The array's kind (:class:`ReferenceKind`) therefore includes the
file's tiling and codec chain: files on one grid tiled or compressed
differently go to different arrays of the stack. The chunks are stored in
Icechunk as *virtual references* (file, offset, length) at the granule's
slot; the stack's coordinates and attributes are the copy's, so
``View.item_arrays`` reads either alike.

Only the full-resolution image (the first IFD) is referenced; overviews are
not. A COG that virtual-tiff cannot express raises :class:`NotVirtualizable`
and the caller copies the granule instead (``ingest.pipeline``'s batches do,
recording why). Everything is checked before anything is written
(:func:`plan_references`): the layout, that the repository may reference the
file (a virtual chunk container covers it), and that the first tile decoded
through the references equals GDAL's reading of it. A failure while writing
is cleared by the caller (``ingest.pipeline._arrays.stage_references``), so a
granule is referenced whole or not at all.

A virtual array reads the source file every time: moving, deleting or
changing the file after ingest makes the array unreadable (Icechunk refuses
a file modified after the reference was written rather than return other
pixels).

Sources may be remote: a COG at ``s3://`` or ``http(s)://`` is found with one
HEAD (size and ETag), its header read through GDAL's ``/vsis3/`` or
``/vsicurl/`` and its tile index through obstore range reads. An S3 object's
references carry its ETag, so Icechunk sends ``If-Match`` with every chunk
read and refuses the chunk once the object was overwritten (icechunk
``virtual_chunks.rs``, ``get_object``: ``if_match``). Icechunk strips the
ETag's quotes (``strip_quotes``), which S3 accepts and HTTP servers following
RFC 9110 do not, so an HTTP object's references carry its last modification
(``If-Unmodified-Since``, whole seconds; ``fetch_part``), as do S3 objects
without an ETag. The repository needs a container per
bucket or host (``Repository.allow_virtual_sources``), whose credentials are
given when it is opened, never stored.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
from zarr.core.metadata.v3 import ArrayV3Metadata

from ingest._compat import manifest_entries, rasterio_attributes
from ingest.errors import InvalidRaster, NotVirtualizable
from ingest.rasters._copy import (
    GRANULE_VARIABLE,
    GRID_MAPPING,
    _check_asset_key,
    _clean_attrs,
    _detail,
    _open_failure,
    _remote_env,
)
from ingest.rasters._place import locate
from ingest.rasters._slices import write_slot_coordinates
from ingest.rasters._stack import (
    AssetPlan,
    GranulePlan,
    Grid,
    Kind,
    Stack,
    fixed_stack_path,
    kind_of,
    stack_digest,
)
from ingest.rasters._tiff import first_image_references, metadata_document
from ingest.remote import Stores
from ingest.stac import Piece, check_name

if TYPE_CHECKING:
    from zarr.abc.store import Store

__all__ = [
    "NotVirtualizable",
    "ReferenceKind",
    "ReferencePlan",
    "container_prefixes",
    "plan_references",
    "write_references",
]

log = logging.getLogger(__name__)

# virtual-tiff warns each time it builds an imagecodecs codec (LZW, zstd, predictors) that other Zarr readers may
# lack it; floe's readers have it (a dependency), and the warning would repeat for every granule.
warnings.filterwarnings("ignore", message="Imagecodecs codecs are not in the Zarr version 3 specification")

#: TIFF PlanarConfiguration 1: samples of a pixel stored together ("pixel-interleaved").
_CHUNKY = "PIXEL"


@dataclass(frozen=True)
class _Source:
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


def _plan_source(
    key: str, path: str | Path, prefixes: tuple[str, ...] | None, stores: Stores | None, gdal_env: Mapping[str, str]
) -> _Source:
    """``prefixes`` None: the tiles are to be copied, so no virtual chunk container needs to cover the file."""
    source = os.fspath(path)
    place = locate(source, stores)
    url = place.url
    if prefixes is not None and not any(url.startswith(prefix) for prefix in prefixes):
        raise NotVirtualizable(
            f"granule {source} cannot be referenced: the repository has no virtual chunk container for {url} "
            "(call Repository.allow_virtual_sources before opening the writer)",
            path=source,
        )
    with _remote_env(gdal_env):
        try:
            dataset = rasterio.open(place.gdal_path, driver="GTiff")
        except (rasterio.errors.RasterioError, OSError, ValueError) as exc:
            raise InvalidRaster(_open_failure(source, exc), path=source) from exc
        with dataset:
            coords, attrs = _georeferencing(source, dataset)
            shape = (dataset.count, dataset.height, dataset.width)
            dtype = np.dtype(dataset.dtypes[0])
            structure = dataset.tags(ns="IMAGE_STRUCTURE")
            compression = structure.get("COMPRESSION", "NONE")
            if dataset.count > 1 and structure.get("INTERLEAVE", "").upper() == _CHUNKY:
                raise NotVirtualizable(
                    f"granule {source} is pixel-interleaved ({dataset.count} bands, {compression}): "
                    "the installed zarr cannot decode interleaved samples from virtual references",
                    path=source,
                )
            try:
                manifest = first_image_references(place)
            except Exception as exc:
                raise NotVirtualizable(
                    f"granule {source} cannot be referenced: virtual-tiff cannot express its layout "
                    f"({compression}; {type(exc).__name__}: {exc})",
                    path=source,
                ) from exc
            if manifest.shape != shape or np.dtype(manifest.dtype) != dtype:
                raise NotVirtualizable(
                    f"granule {source} cannot be referenced: its first TIFF image is {manifest.dtype} "
                    f"{manifest.shape}, GDAL reads {dtype} {shape}",
                    path=source,
                )
            _check_extent(source, place.size, manifest)
            _probe(source, manifest, dataset, place.registry)
    pixels = xr.Variable(("band", "y", "x"), manifest, attrs=attrs)
    dataset_ = xr.Dataset({GRANULE_VARIABLE: pixels}, coords=coords)
    return _Source(key=key, path=source, url=url, dataset=dataset_, checksum=place.checksum, registry=place.registry)


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
    return coords, _clean_attrs(attrs)


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


def _probe(
    source: str, manifest: ManifestArray, dataset: rasterio.DatasetReader, registry: ObjectStoreRegistry
) -> None:
    """Decode the first tile through the references and compare it with GDAL's reading of the same pixels.

    Once a layout has decoded equal in this process, granules of the same
    layout skip the probe: an archive's granules share it, and the probe
    costs about as much as the rest of the plan.
    """
    signature = _layout_signature(manifest)
    if signature in _PROBED_LAYOUTS:
        return
    _bands, height, width = manifest.shape
    chunk_bands, tile_height, tile_width = manifest.metadata.chunks
    rows, cols = min(tile_height, height), min(tile_width, width)
    try:
        store = ManifestStore(registry=registry, group=ManifestGroup(arrays={"probe": manifest}))
        decoded = np.asarray(zarr.open_array(store, path="probe", mode="r")[:chunk_bands, :rows, :cols])
    except Exception as exc:
        raise NotVirtualizable(
            f"granule {source} cannot be referenced: decoding its tiles through virtual references failed "
            f"({type(exc).__name__}: {_detail(exc)})",
            path=source,
        ) from exc
    try:
        expected = dataset.read(indexes=list(range(1, chunk_bands + 1)), window=Window(0, 0, cols, rows))
    except rasterio.errors.RasterioError as exc:
        raise InvalidRaster(
            f"granule {source} cannot be read: truncated or corrupt pixels ({_detail(exc)})", path=source
        ) from exc
    if decoded.shape != expected.shape or not np.array_equal(decoded, expected, equal_nan=decoded.dtype.kind == "f"):
        raise NotVirtualizable(
            f"granule {source} cannot be referenced: its first tile decoded through virtual references "
            "differs from GDAL's reading",
            path=source,
        )
    if len(_PROBED_LAYOUTS) < _PROBED_LAYOUTS_MAX:
        _PROBED_LAYOUTS.add(signature)


# -- references into stacks (array layout 2) ------------------------------------------------------


@dataclass(frozen=True)
class ReferenceKind(Kind):
    """A kind whose chunks are a source file's own tiles: the tiling and the codecs are part of it.

    Two granules on one grid whose files are tiled or compressed differently
    are two kinds (two arrays of the stack): a reference is a whole tile of a
    file, decoded by the array's codecs.
    """

    document: str = ""
    """The JSON of virtual-tiff's array metadata for the file (its chunking and codec chain)."""

    @functools.cached_property
    def signature(self) -> str:
        decoding = {key: json.loads(self.document).get(key) for key in ("data_type", "chunk_grid", "codecs")}
        return stack_digest(self.dtype, self.bands, self.attributes, json.dumps(decoding, sort_keys=True))

    def metadata(self, stack: Stack, *, capacity: int, chunk: int) -> ArrayV3Metadata:
        copied = Kind.metadata(self, stack, capacity=capacity, chunk=chunk).to_dict()
        document = json.loads(self.document)
        _bands_chunk, tile_height, tile_width = document["chunk_grid"]["configuration"]["chunk_shape"]
        document.update(
            shape=copied["shape"],
            chunk_grid={"name": "regular", "configuration": {"chunk_shape": [1, 1, tile_height, tile_width]}},
            chunk_key_encoding=copied["chunk_key_encoding"],
            attributes=copied["attributes"],
            dimension_names=copied["dimension_names"],
        )
        return ArrayV3Metadata.from_dict(document)


@dataclass
class ReferencePlan:
    """A granule placed in fixed stacks, with the references to write for each asset."""

    plan: GranulePlan
    sources: dict[str, _Source]

    @property
    def bytes_referenced(self) -> int:
        return sum(int(source.manifest.size) * source.manifest.dtype.itemsize for source in self.sources.values())


def container_prefixes(store: Store) -> tuple[str, ...]:
    """The URL prefixes of the virtual chunk containers of the repository ``store`` (an Icechunk store) writes."""
    config = getattr(getattr(store, "session", None), "config", None)
    return tuple((getattr(config, "virtual_chunk_containers", None) or {}).keys())


def plan_references(
    store: Store | None,
    collection: str,
    assets: Mapping[str, str | Path],
    *,
    stores: Stores | None = None,
    gdal_env: Mapping[str, str] | None = None,
    prefixes: tuple[str, ...] | None = None,
    copy: bool = False,
) -> ReferencePlan:
    """Check that every asset can be referenced from ``store`` and place each in its grid's fixed stack.

    Assets are local COGs or ``s3://`` / ``http(s)://`` ones, reached through
    ``stores`` (obstore: HEAD and tile index) and ``gdal_env`` (GDAL: the
    header and the probe tile). ``prefixes`` are the repository's container
    prefixes (default: those of ``store``'s session); given, ``store`` is not
    used, so plans can be made on other threads. With ``copy`` the file's
    tiles are to be copied (``ingest.rasters.read_tiles``), so no container
    is needed. Writes nothing. Raises ``NotVirtualizable`` (copy the granule
    by decoding it instead), ``InvalidRaster`` (copying would fail too) or
    ``ValueError`` (no assets, or a ``collection`` that is not a safe path
    segment).
    """
    check_name(collection, "collection")
    if not assets:
        raise ValueError(f"a granule of {collection} has no assets to reference")
    for key in assets:
        _check_asset_key(key)
    if copy:
        prefixes = None
    elif prefixes is None:
        prefixes = container_prefixes(store) if store is not None else ()
    sources = {key: _plan_source(key, path, prefixes, stores, gdal_env or {}) for key, path in assets.items()}
    stacks: dict[str, Stack] = {}
    kinds: dict[str, list[Kind]] = {}
    planned = []
    for key, source in sources.items():
        grid = _grid_of(source)
        pixels = source.dataset[GRANULE_VARIABLE]
        kind = ReferenceKind(
            key,
            str(pixels.dtype),
            int(pixels.shape[0]),
            kind_of(key, source.dataset).attributes,
            document=metadata_document(source.manifest.metadata),
        )
        stack = Stack(fixed_stack_path(collection, grid), grid)
        stacks.setdefault(stack.path, stack)
        if kind not in kinds.setdefault(stack.path, []):
            kinds[stack.path].append(kind)
        piece = Piece(stack.path, key, (0, 0, grid.height, grid.width), (0, 0))
        planned.append(AssetPlan(key, kind, grid, [piece], np.empty((0, 0, 0), dtype=pixels.dtype)))
    return ReferencePlan(GranulePlan(planned, stacks, kinds), sources)


def _grid_of(source: _Source) -> Grid:
    """The grid of a referenced asset, from the georeferencing computed for it (no pixel is read)."""
    reference = source.dataset.coords[GRID_MAPPING].attrs
    c, a, b, f, d, e = (float(value) for value in str(reference["GeoTransform"]).split())
    _bands, height, width = source.manifest.shape
    crs = rasterio.crs.CRS.from_wkt(reference["crs_wkt"])
    return Grid(crs.to_wkt(), crs.to_string(), (a, b, c, d, e, f), int(height), int(width))


async def write_references(store: Store, references: ReferencePlan, *, item_id: str, datetime_us: int) -> int:
    """Write the references of every asset at its slot (slots and names assigned) and the slot coordinates.

    Returns the number of references written. Raises ``NotVirtualizable``
    when Icechunk refuses them (no virtual chunk container covers a file).
    """
    plan = references.plan
    await write_slot_coordinates(store, plan, item_id=item_id, datetime_us=datetime_us)
    # Icechunk refuses to read a referenced local file modified after this moment (it keeps whole seconds: a
    # margin); a remote object's references carry its ETag instead.
    last_updated_at = datetime.now(UTC) + timedelta(seconds=1)
    count = 0
    for asset in plan.assets:
        (piece,) = asset.pieces
        source = references.sources[asset.key]
        entries = source.manifest.manifest
        paths, offsets, lengths = manifest_entries(entries)
        failed = await store.set_virtual_refs_arr_async(  # type: ignore[attr-defined]
            array_path=f"/{piece.stack}/{piece.array}",
            chunk_grid_shape=(1, *entries.shape_chunk_grid),
            locations=paths.flatten().tolist(),
            offsets=offsets.flatten(),
            lengths=lengths.flatten(),
            arr_offset=(piece.slot, 0, 0, 0),
            validate_containers=True,
            checksum=source.checksum if source.checksum is not None else last_updated_at,
        )
        if failed:
            raise NotVirtualizable(
                f"granule {source.path}: Icechunk refused {len(failed)} virtual references to {source.url} "
                "(no virtual chunk container covers it)",
                path=source.path,
            )
        count += int(np.count_nonzero(lengths))
    return count
