"""Other libraries' private names, reached through this one module.

floe relies on a few things its dependencies do not (yet) make public. Each is
wrapped here, once, with the version it was read from, why floe needs it and
what public API would replace it; ``tests/test_compat.py`` checks each one
behaves as floe expects, so an upgrade that breaks one fails there, by name,
and ``pyproject.toml`` bounds these packages from above. Heavy libraries are
imported inside the functions: the API server never loads Ray or GDAL's
Python side for this module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa
    import rasterio
    from pyiceberg.catalog import MetastoreCatalog
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.io import FileIO
    from pyiceberg.manifest import DataFile
    from pyiceberg.schema import Schema
    from pyiceberg.table import StagedTable, Table, Transaction
    from pyiceberg.table.metadata import TableMetadata
    from pyiceberg.table.update import TableRequirement, TableUpdate
    from virtualizarr.manifests import ChunkManifest, ManifestArray

FileTest = Callable[["DataFile"], bool]


# -- pyiceberg 0.12 --------------------------------------------------------------------------------
def may_match(schema: Schema, expression: BooleanExpression) -> FileTest:
    """A test of a data file's column bounds: False when no row of it can match ``expression``.

    pyiceberg's ``_InclusiveMetricsEvaluator`` (``pyiceberg/expressions/visitors.py``),
    which its own scan planning uses; there is no public entry point that
    takes one ``DataFile``.
    """
    from pyiceberg.expressions.visitors import _InclusiveMetricsEvaluator

    return _InclusiveMetricsEvaluator(schema, expression).eval


def must_match(schema: Schema, expression: BooleanExpression) -> FileTest:
    """A test of a data file's column bounds: True when every row of it matches ``expression``.

    pyiceberg's ``_StrictMetricsEvaluator`` (same module), used by its own
    overwrite planning; not public either.
    """
    from pyiceberg.expressions.visitors import _StrictMetricsEvaluator

    return _StrictMetricsEvaluator(schema, expression).eval


def transaction_updates(transaction: Transaction) -> tuple[TableUpdate, ...]:
    """The updates a pyiceberg ``Transaction`` has collected (its ``_updates``), to commit them floe's way.

    floe applies a schema union with pyiceberg's ``UpdateSchema`` (which keeps
    the name mapping current) but writes the metadata itself; the transaction
    keeps what it would send a catalog in ``_updates``.
    """
    return tuple(transaction._updates)


def staged_update(
    catalog: MetastoreCatalog,
    table: Table,
    requirements: tuple[TableRequirement, ...],
    updates: tuple[TableUpdate, ...],
) -> StagedTable:
    """The next version of ``table``: ``requirements`` checked against it and ``updates`` applied, staged (a new
    metadata.json location, nothing written).

    pyiceberg's ``MetastoreCatalog._update_and_stage_table``, which its own catalogs' ``commit_table`` calls;
    floe's catalog keeps its pointer in Icechunk but stages versions the same way. Raises pyiceberg's
    ``CommitFailedException`` when a requirement does not hold.
    """
    return catalog._update_and_stage_table(table, table.name(), requirements, updates)


def write_table_metadata(catalog: MetastoreCatalog, metadata: TableMetadata, io: FileIO, location: str) -> None:
    """Write ``metadata`` as the metadata.json at ``location`` (pyiceberg's ``MetastoreCatalog._write_metadata``:
    the table's compression property, the JSON pyiceberg writes, one create of the file)."""
    catalog._write_metadata(metadata, io, location)


# -- stac-geoparquet 0.8 ---------------------------------------------------------------------------
def geoparquet_metadata(
    schema: pa.Schema, *, schema_version: str, collections: dict[str, Any] | None = None
) -> dict[bytes, bytes]:
    """The ``geo`` and ``stac-geoparquet`` footer keys stac-geoparquet writes for a table of this schema.

    ``stac_geoparquet.arrow._to_parquet.create_parquet_metadata``: floe writes
    the Parquet files itself (streamed, and registered with Iceberg) and needs
    only the footer.
    """
    from stac_geoparquet.arrow._to_parquet import create_parquet_metadata

    version: Any = schema_version
    return create_parquet_metadata(schema, schema_version=version, collections=collections)


def stac_json_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A stac-geoparquet record batch in the layout of STAC JSON: properties nested again, timestamps as RFC 3339
    text, ``bbox`` as a list, geometries still WKB (``StacArrowBatch.to_json_batch``; floe turns the rows into
    items itself, a batch at a time, :func:`ingest.stac.geoparquet_items`)."""
    from stac_geoparquet.arrow._batch import StacArrowBatch

    return StacArrowBatch(batch).to_json_batch().inner


# -- icechunk 2.3 ---------------------------------------------------------------------------------
def azure_store_options(store: object) -> dict[str, str]:
    """The options an Azure virtual chunk container's store was made with (``icechunk.storage.azure_store``'s
    ``account`` and ``config``; empty for another store): icechunk exposes them only as the variant's field."""
    import icechunk

    if not isinstance(store, icechunk.ObjectStoreConfig.Azure):
        return {}
    return dict(getattr(store, "_0", None) or {})


# -- rioxarray 0.23 --------------------------------------------------------------------------------
def rasterio_attributes(dataset: rasterio.DatasetReader) -> dict[str, Any]:
    """The variable attributes rioxarray gives a raster it opens (``rioxarray._io._get_rasterio_attrs``).

    Virtual arrays must carry exactly the attributes a copy made with
    ``rioxarray.open_rasterio`` has; calling rioxarray's own reader keeps the
    two equal by construction.
    """
    from rioxarray._io import _get_rasterio_attrs

    return dict(_get_rasterio_attrs(dataset))


# -- virtualizarr 2.8 / virtual-tiff 0.5 -----------------------------------------------------------
def manifest_entries(manifest: ChunkManifest) -> tuple[Any, np.ndarray, np.ndarray]:
    """A chunk manifest's paths, offsets and lengths as the arrays it keeps (one entry per chunk of the grid).

    ``ChunkManifest._paths``, ``._offsets`` and ``._lengths``: the public
    accessors build a dict per chunk, too slow for thousands of tiles. The
    paths are a NumPy ``StringDType`` array (typed ``Any`` here: ``from_arrays``
    wants that dtype, which NumPy's stubs cannot spell for a derived array).
    """
    return manifest._paths, manifest._offsets, manifest._lengths


def tiff_image(parsed: Any, ifd: int) -> ManifestArray:
    """The manifest array of one TIFF image (IFD) of what ``virtual_tiff.VirtualTIFF`` parsed (its ``_group``)."""
    return parsed._group.arrays[str(ifd)]


# -- virtual-tiff 0.5 / zarr 3.4 -------------------------------------------------------------------
#: virtual-tiff's own codecs: its array metadata names them like this, but zarr learns these names only when
#: ``virtual_tiff.codecs`` is imported (its ``register_codec`` calls, codecs.py 251-252); its ``zarr.codecs``
#: entry points carry them as ``virtual_tiff.<name>`` instead.
VIRTUAL_TIFF_CODECS = ("HorizontalDeltaCodec", "ChunkyCodec")


def find_virtual_tiff_codecs_lazily() -> None:
    """Let zarr find virtual-tiff's codecs under the names its metadata gives, importing virtual-tiff (about 0.9 s)
    only when an array uses one.

    Arrays of referenced or tile-copied COGs with a predictor name
    ``HorizontalDeltaCodec``; without this, a process that had not parsed a
    TIFF (``floe serve``, a fresh ``View``) could not read them. Uses zarr's
    own lazy loading of entry points (``zarr.registry._codec_registries[name]
    .lazy_load_list``, zarr 3.4 ``registry.py``); the public replacement is an
    entry point under these names in virtual-tiff's packaging. A zarr client
    without floe imports ``virtual_tiff`` first (README, "Arrays").
    """
    from importlib.metadata import EntryPoint

    from zarr.registry import _codec_registries

    for name in VIRTUAL_TIFF_CODECS:
        registry = _codec_registries[name]
        if not registry and not registry.lazy_load_list:
            registry.lazy_load_list.append(
                EntryPoint(name=name, value=f"virtual_tiff.codecs:{name}", group="zarr.codecs")
            )


# -- ray 2.60 --------------------------------------------------------------------------------------
def keep_local_ray_on_loopback() -> None:
    """Make a Ray imported before floe set ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` honour it.

    Ray reads the variable into ``ray._private.ray_constants.ENABLE_RAY_CLUSTER``
    when it is first imported; a local cluster then binds its servers to
    127.0.0.1 instead of every interface.
    """
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False
