"""One batch of granules: plan each (skip, row only, or arrays and row), stage them, commit them together.

A batch is what one writer commits. Every row is staged as a replacement, so
the table keeps one version per item whoever else ingests the same items; the
arrays of a granule whose rasters changed are written again in the same
commit. Copies read the next granule's rasters on a second thread while the
current one is written (GDAL decodes without the GIL).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ingest._threads import DaemonPool
from ingest.errors import CommitConflict, InvalidItem, InvalidRaster, NotVirtualizable
from ingest.pipeline._ahead import InOrder
from ingest.pipeline._arrays import stage_arrays, stage_references, stage_tiles
from ingest.pipeline._granules import AnyGranule, Granule, RowsGranule, describe_source, sources_unchanged
from ingest.pipeline._report import BatchOutcome, Rejection
from ingest.rasters import TileCopy, container_prefixes
from ingest.remote import GdalOptions, RemoteError, Stores, gdal_options, is_remote
from ingest.repository import Repository, Writer
from ingest.stac import (
    ARRAYS_ASSET,
    ARRAYS_LAYOUT,
    AssetPixels,
    arrays_asset,
    arrow_to_items,
    read_arrays_asset,
    with_arrays_asset,
    without_arrays_asset,
)

log = logging.getLogger(__name__)

REPLANS = 3
"""How often a batch is planned again after another writer changed the same item's arrays first."""


def commit_batch(
    repository: Repository,
    branch: str,
    granules: list[AnyGranule],
    message: str,
    *,
    virtual: bool = False,
    delete: Sequence[tuple[str, str]] = (),
    metadata: Mapping[str, Any] | None = None,
) -> BatchOutcome:
    """Stage a batch's new and changed granules (arrays and rows) and commit them; unchanged ones are skipped.

    Every row is staged as a replacement, so the table keeps one version per
    item even when other writers ingest the same items meanwhile. Two writers
    rewriting one item's arrays cannot be merged: the loser plans its batch
    again on the winner's version (a bounded number of times). With
    ``virtual``, rasters are referenced in place where they can be and copied
    where they cannot (``fallbacks`` says which and why). The items ``delete``
    names leave in the same commit (``--prune``); ``metadata`` joins the
    commit's (a run's last batch records its searches' cursors).
    """
    for attempt in range(1, REPLANS + 1):
        try:
            outcome = _commit_batch_once(
                repository, branch, granules, message, virtual=virtual, delete=delete, metadata=metadata
            )
        except CommitConflict:
            if attempt == REPLANS:
                raise
            log.info("batch %r met another writer on the same items; planning it again", message)
            continue
        outcome.replans = attempt - 1
        return outcome
    raise AssertionError("unreachable")


@dataclass
class _Step:
    """What a batch does with one granule, decided before any raster is read."""

    granule: Granule
    previous: dict[str, Any] | None
    arrays: dict[str, Any] | None
    """The ``floe:arrays`` asset the row keeps (the stored one until the rasters are written again)."""
    write_rasters: bool


READ_AHEAD = 1
"""Granules whose rasters are read (and hashed) on a second thread while the current one is written."""

REMOTE_READS = 8
"""Granules read at once when a batch's rasters are remote, on as many threads, so round trips overlap."""


@dataclass(frozen=True)
class _Remote:
    """How a batch reaches remote rasters: stores for HEAD requests, GDAL options for reads (the repository's
    S3 settings where set, else the ``AWS_*`` environment; its ``remote`` timeouts and unsigned prefixes)."""

    stores: Stores
    gdal_env: GdalOptions

    @classmethod
    def of(cls, repository: Repository) -> _Remote:
        settings = repository.settings
        s3 = settings.s3 if settings.s3.given() else None
        return cls(Stores.of(settings), gdal_options(s3, remote=settings.remote))


def changed_granules(repository: Repository, branch: str, granules: list[AnyGranule]) -> tuple[list[AnyGranule], int]:
    """The granules of ``granules`` that are new or changed at ``branch``, and how many the branch holds
    unchanged: what a batch would skip, found without staging anything (Ray's driver asks before it hands a batch
    to an actor, so a re-run of an unchanged archive starts no Ray)."""
    steps, skipped, fresh = _plan_steps(repository.writer(branch), granules, _Remote.of(repository))
    return [*(step.granule for step in steps), *fresh], skipped


def _plan_steps(
    writer: Writer, granules: list[AnyGranule], remote: _Remote
) -> tuple[list[_Step], int, list[RowsGranule]]:
    """Each granule's step, how many are in the repository unchanged (skipped: a re-run commits nothing), and the
    rows of items the branch does not hold (added as they are; a stored item's row becomes an item, compared as
    any granule's)."""
    rows = [granule for granule in granules if isinstance(granule, RowsGranule)]
    plain = [granule for granule in granules if isinstance(granule, Granule)]
    row_keys = [granule.keys() for granule in rows]
    keys = [(granule.item["collection"], granule.item["id"]) for granule in plain]
    stored = writer.stored_items([*keys, *(key for found in row_keys for key in found)])
    fresh: list[RowsGranule] = []
    for run, found in zip(rows, row_keys, strict=True):
        known = [index for index, key in enumerate(found) if key in stored]
        if not known:
            fresh.append(run)
            continue
        decoded = arrow_to_items(run.rows.take(known))
        plain.extend(Granule(item, run.source(index)) for index, item in zip(known, decoded, strict=True))
        new = [index for index, key in enumerate(found) if key not in stored]
        if new:
            fresh.append(run.taken(new))
    steps: list[_Step] = []
    skipped = 0
    # A re-run asks each remote raster whether it changed: the questions go out together, not one by one.
    if stored:
        remote.stores.prefetch_heads(
            path
            for granule in plain
            if (granule.item["collection"], granule.item["id"]) in stored
            for path in granule.rasters.values()
            if is_remote(path)
        )
    for granule in plain:
        item = granule.item
        previous = stored.get((item["collection"], item["id"]))
        stored_arrays = read_arrays_asset(previous) if previous is not None else None
        # The row keeps its stored asset as it is until the rasters are written again.
        arrays = ((previous or {}).get("assets") or {}).get(ARRAYS_ASSET) if stored_arrays is not None else None
        # Without rasters selected this run, arrays already in the repository are kept as they are.
        same_rasters = not granule.rasters or (
            stored_arrays is not None
            and stored_arrays.layout == ARRAYS_LAYOUT
            and all(writer.group_exists(stack) for stack in {piece.stack for piece in stored_arrays.pieces()})
            and sources_unchanged(
                stored_arrays.sources, granule.rasters, virtual=stored_arrays.virtual, stores=remote.stores
            )
        )
        if (
            previous is not None
            and same_rasters
            and _same_item(without_arrays_asset(previous), without_arrays_asset(item))
        ):
            skipped += 1
            continue
        steps.append(_Step(granule, previous, arrays, write_rasters=bool(granule.rasters) and not same_rasters))
    return steps, skipped, fresh


def _same_item(stored: dict[str, Any], item: dict[str, Any]) -> bool:
    """Whether the item is the one stored: equal, or equal as JSON text (a NaN, which equals nothing, not even
    itself, in a property made every re-run replace its item)."""
    return stored == item or json.dumps(stored, sort_keys=True) == json.dumps(item, sort_keys=True)


def _read_granule(granule: Granule, remote: _Remote, *, tiles: bool = False) -> tuple[dict[str, dict[str, Any]], Any]:
    """A copy's inputs: with ``tiles`` (the fixed layout), the file's compressed tiles where zarr can decode them
    (:func:`ingest.rasters.read_tiles`), else the pixels decoded."""
    if not tiles:
        return _read_copy(granule.rasters, remote)
    from ingest.rasters import plan_references, read_assets, read_tiles

    sources = _fingerprints(granule.rasters, remote)
    try:
        collection = granule.item["collection"]
        references = plan_references(
            None, collection, granule.rasters, stores=remote.stores, gdal_env=remote.gdal_env, copy=True
        )
    except NotVirtualizable as error:
        log.info("granule %s is copied by decoding it: %s", granule.item["id"], error.reason)
        return sources, read_assets(granule.rasters, remote.gdal_env, remote.stores)
    return sources, read_tiles(references)


def _read_copy(rasters: dict[str, str], remote: _Remote) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """A copy's inputs, read off the writing thread: each raster's fingerprint, then its pixels."""
    from ingest.rasters import read_assets

    return _fingerprints(rasters, remote), read_assets(rasters, remote.gdal_env, remote.stores)


def _fingerprints(rasters: dict[str, str], remote: _Remote, *, digest: bool = True) -> dict[str, dict[str, Any]]:
    """:func:`describe_source` of each raster; a file that vanished or cannot be opened is an InvalidRaster."""
    described = {}
    for key, path in rasters.items():
        try:
            described[key] = describe_source(path, digest=digest, stores=remote.stores)
        except OSError as error:
            raise InvalidRaster(f"granule {path} cannot be read: {error.strerror or error}", path=path) from error
        except RemoteError as error:
            raise InvalidRaster(f"granule {path} cannot be read: {error.reason}", path=path) from error
    return described


def _plan_virtual(granule: Granule, remote: _Remote, prefixes: tuple[str, ...]) -> tuple[dict[str, Any], Any]:
    """A reference's inputs, found off the writing thread: each raster's fingerprint (a remote one's HEAD, whose
    ETag the references carry), then the plan of its references (header, tile index, probe)."""
    from ingest.rasters import plan_references

    sources = _fingerprints(granule.rasters, remote, digest=False)
    collection = granule.item["collection"]
    plan = plan_references(
        None, collection, granule.rasters, stores=remote.stores, gdal_env=remote.gdal_env, prefixes=prefixes
    )
    return sources, plan


def _commit_batch_once(
    repository: Repository,
    branch: str,
    granules: list[AnyGranule],
    message: str,
    *,
    virtual: bool,
    delete: Sequence[tuple[str, str]],
    metadata: Mapping[str, Any] | None,
) -> BatchOutcome:
    if virtual:
        _allow_remote_references(repository, [granule for granule in granules if isinstance(granule, Granule)])
    writer = repository.writer(branch)
    for collection, item_id in delete:
        writer.delete_item(collection, item_id)
    remote = _Remote.of(repository)
    steps, skipped, fresh = _plan_steps(writer, granules, remote)
    outcome = BatchOutcome(commit=None, skipped=skipped)
    for rows in fresh:
        sources = rows.sources  # a label string per row: made once, for the writer and the report
        writer.add_rows(rows.rows, sources=sources)
        outcome.landed.extend(
            (source, collection, item_id) for source, (collection, item_id) in zip(sources, rows.keys(), strict=True)
        )
        outcome.granules += len(rows)
    # Copies read the next granule's rasters (GDAL decodes without the GIL) while this one is written; remote
    # rasters are read REMOTE_READS at a time, so their round trips overlap.
    far = any(is_remote(path) for step in steps for path in step.granule.rasters.values())
    ahead = REMOTE_READS if far else READ_AHEAD
    if virtual:
        prefixes = container_prefixes(writer.store)
        read: Callable[[Granule], Any] = functools.partial(_plan_virtual, remote=remote, prefixes=prefixes)
    else:
        settings = writer.repository.settings.arrays
        tiles = settings.layout == "fixed" and settings.tile_copy
        read = functools.partial(_read_granule, remote=remote, tiles=tiles)
    with DaemonPool(ahead, name="floe-read") as pool:
        reads = InOrder(pool, [step.granule for step in steps if step.write_rasters], read, ahead)
        try:
            for step in steps:
                _stage(writer, step, outcome, reads, remote, virtual=virtual)
        finally:
            reads.cancel()
    if writer.pending_items or writer.pending_deletions or writer.session.has_uncommitted_changes:
        outcome.commit = writer.commit(message, metadata=metadata)
    return outcome


def _allow_remote_references(repository: Repository, granules: list[Granule]) -> None:
    """Containers for the buckets and hosts of the batch's remote rasters, before its writer opens (a writer
    keeps the config it opened with). Local folders were allowed when the run began."""
    far = sorted({path for granule in granules for path in granule.rasters.values() if is_remote(path)})
    if not far:
        return
    try:
        repository.allow_virtual_sources(far)
    except ValueError as error:  # a URL no container can cover: its granule is copied, and the fallback says why
        log.warning("cannot reference every remote raster in place: %s", error)


def _stage(
    writer: Writer, step: _Step, outcome: BatchOutcome, reads: InOrder[Granule, Any], remote: _Remote, *, virtual: bool
) -> None:
    """Stage one granule's arrays (when its rasters are new or changed) and row; bad input becomes a rejection."""
    granule, arrays = step.granule, step.arrays
    item = granule.item
    try:
        if step.write_rasters:
            referenced = False
            settings = writer.repository.settings.arrays
            pixels: dict[str, AssetPixels] | None = None
            if virtual:
                # A reference is stale after any change to its file; only a copy is worth a digest. A remote
                # raster's fingerprint is its HEAD, whose ETag its references carry.
                try:
                    sources, planned = reads.next()
                    pixels, nbytes = stage_references(writer, item, granule.rasters, settings, planned=planned)
                    referenced = True
                except NotVirtualizable as error:
                    log.info("granule %s is copied: %s", item["id"], error.reason)
                    outcome.fallbacks.append(Rejection(granule.source, item["id"], error.reason))
            if pixels is None:
                sources, read = _read_copy(granule.rasters, remote) if virtual else reads.next()
                if isinstance(read, TileCopy):
                    pixels, nbytes = stage_tiles(writer, item, read, settings)
                else:
                    pixels, nbytes = stage_arrays(writer, item, read, settings)
                outcome.bytes_written += nbytes
            arrays = arrays_asset(pixels, sources, virtual=referenced)
            outcome.virtual += referenced
            previous = read_arrays_asset(step.previous) if step.previous is not None else None
            if previous is not None and previous.layout == ARRAYS_LAYOUT:
                # The old slices go in the same commit as the new ones and the new row.
                writer.clear_pieces(previous.pieces())
        if arrays is not None:
            item = with_arrays_asset(item, arrays)
        writer.add_item(item, source=granule.source, replace=True, validated=True)
        outcome.landed.append((granule.source, item["collection"], item["id"]))
        outcome.granules += 1
        outcome.replaced += step.previous is not None
    except (InvalidItem, InvalidRaster) as error:
        outcome.rejected.append(Rejection(granule.source, item["id"], error.reason))
