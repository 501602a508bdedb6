"""The granule stream: every source read, checked and de-duplicated the same way, whichever driver ingests it.

Both drivers (in-process, :func:`~ingest.pipeline.ingest_items`, and Ray, :func:`~ingest.pipeline.ingest_with_ray`)
consume :func:`granule_stream` and cut it into batches (:func:`batched`, :func:`routed_batches`). Its steps, in
order: docs/design.md §5 (one granule stream).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Iterator

from ingest._stages import add, timed
from ingest.errors import FloeError, InvalidInput
from ingest.pipeline._granules import AnyGranule, Granule, RowsGranule, granule_from_item, weight
from ingest.pipeline._prune import SourceScope, with_last
from ingest.pipeline._report import IngestReport, Rejection
from ingest.pipeline.sources import SourcedItem, SourcedRows, SourceName, SourceOptions, is_api_url, read_items
from ingest.remote import is_remote
from ingest.repository import Repository
from ingest.stac import item_as_dict, plainly_valid, refused_geometries, shorten, validate_item

VALIDATION_CHUNK = 2048
"""Items validated together (their geometries parsed in one vectorized call)."""

METADATA_ONLY: frozenset[str] = frozenset()
"""An asset selection that selects no raster: items become rows only."""


def granule_stream(
    repository: Repository,
    sources: Iterable[SourceName],
    report: IngestReport,
    *,
    branch: str,
    default_collection: str | None = None,
    assets: set[str] | frozenset[str] | None = METADATA_ONLY,
    chunk: int = VALIDATION_CHUNK,
    scope: SourceScope | None = None,
    options: SourceOptions | None = None,
) -> Iterator[AnyGranule]:
    """Every valid, first-seen granule of ``sources``, in order; rejections are added to ``report``.

    STAC Collections found in the sources are stored with the repository on
    ``branch`` as they come (one floe refuses is a rejection). Bad input
    (unreadable sources, invalid items, ids seen before in the run, missing
    local assets) is rejected, never raised.

    Args:
        repository: the repository the granules go to (its settings reach remote sources).
        sources: paths and URLs of items, folders and STAC APIs, as :func:`~ingest.pipeline.read_items` reads them.
        report: the run's report: gets each item read and each rejection, with its source.
        branch: the branch collections are stored on, whose recorded cursors ``options.since == "last"`` resumes
            from.
        default_collection: the collection of items that name none.
        assets: the raster assets each granule carries (None: every local raster; empty: none, metadata only;
            default: metadata only).
        chunk: items validated at a time (a driver with small batches passes a smaller chunk, so its first batch
            does not wait for a large one).
        scope: hears what the sources hold (``--prune``; default: a scope of its own).
        options: how to reach remote sources and what to ask STAC APIs (default: nothing asked); where it has
            no S3 or remote settings it takes the repository's, and ``--since last`` resumes from the cursors the
            branch's history recorded.

    Yields:
        Each valid granule whose (collection, id) the run has not seen before, in the sources' order. With no
        asset selected, the items of a local stac-geoparquet file come as rows where they can
        (:class:`~ingest.pipeline._granules.RowsGranule`, at most ``chunk`` each), checked on columns, and those
        of a large NDJSON stream, and the pages of a large STAC API search, as rows checked by reader processes.
    """
    scope = scope if scope is not None else SourceScope()
    options = reaching(repository, options if options is not None else SourceOptions())
    sources = list(sources)
    with_recorded_cursors(repository, options, sources, branch)
    options.rows = assets is not None and not assets  # metadata only: rows need never become items
    options.default_collection = default_collection
    pending: list[SourcedItem] = []
    for sourced in _reading(read_items(sources, options)):
        if sourced.rows is not None:
            yield from _granules(pending, report, scope, default_collection, assets, remote=options.remote_assets)
            pending = []
            yield from _row_granules(sourced.rows, report, scope, chunk)
        elif sourced.collection is not None:
            if isinstance(sourced.collection.get("id"), str):
                scope.collections.add(sourced.collection["id"])
            _store_collection(repository, sourced, report, branch)
        elif sourced.error is not None:
            report.rejected.append(Rejection.of(sourced.error, sourced.source))
            scope.unknown.append(sourced.source)
        else:
            report.items_read += 1
            pending.append(sourced)
            if len(pending) >= chunk:
                yield from _granules(pending, report, scope, default_collection, assets, remote=options.remote_assets)
                pending = []
    yield from _granules(pending, report, scope, default_collection, assets, remote=options.remote_assets)
    for search in options.searches:
        # A search read to its end holds every item of the collections it names, even those it found empty.
        if search.complete:
            scope.collections.update(search.parameters.collections)


def with_recorded_cursors(
    repository: Repository, options: SourceOptions, sources: list[SourceName], branch: str
) -> None:
    """With ``--since last`` and a STAC API among ``sources``, the cursors ``branch``'s history recorded go into
    ``options.recorded`` (none for a branch that does not exist yet)."""
    if options.since == "last" and any(isinstance(source, str) and is_api_url(source) for source in sources):
        branches = {ref.name for ref in repository.refs() if ref.kind == "branch"}
        options.recorded = repository.source_cursors(f"branch:{branch}") if branch in branches else {}


def reaching(repository: Repository, options: SourceOptions) -> SourceOptions:
    """``options``, given the repository's S3 and remote settings where it has none (in place; returned)."""
    if options.s3 is None and repository.settings.s3.given():
        options.s3 = repository.settings.s3  # FLOE_S3__* reach s3:// sources too (over the AWS_* environment)
    if options.remote is None:
        options.remote = repository.settings.remote  # FLOE_REMOTE__*: timeouts, public prefixes
    return options


def _reading(items: Iterator[SourcedItem]) -> Iterator[SourcedItem]:
    """``items``, the time spent getting each (reading the sources and parsing them, or waiting for the thread
    that does) added to the ``parse`` stage (``ingest._stages``) every thousand items and at the end."""
    waited = 0.0
    count = 0
    while True:
        started = time.perf_counter()
        sourced = next(items, None)
        waited += time.perf_counter() - started
        if sourced is None:
            add("parse", waited)
            return
        count += 1
        if count % 1000 == 0:
            add("parse", waited)
            waited = 0.0
        yield sourced


def _row_granules(rows: SourcedRows, report: IngestReport, scope: SourceScope, chunk: int) -> Iterator[RowsGranule]:
    """Rows read together, without those whose (collection, id) the run has seen (rejected as duplicates), in
    granules of at most ``chunk`` rows."""
    report.items_read += rows.table.num_rows
    granule = RowsGranule(rows.table, rows.prefix, rows.numbers)
    earlier = scope.seen.add_new_numbered(granule.keys(), granule.prefix, granule.numbers)
    repeated = [index for index, seen in enumerate(earlier) if seen is not None]
    if repeated:
        ids = granule.rows.column("id")
        for index in repeated:
            reason = f"duplicate id (first seen in {earlier[index]})"
            report.rejected.append(Rejection(granule.source(index), ids[index].as_py(), reason))
        granule = granule.taken([index for index, seen in enumerate(earlier) if seen is None])
    while len(granule) > chunk:
        head, granule = granule.split(chunk)
        yield head
    if len(granule):
        yield granule


def batched(
    granules: Iterable[AnyGranule],
    size: int | Callable[[], int],
    raster_bytes: int | None = None,
    rows_size: int | None = None,
) -> Iterator[tuple[list[AnyGranule], bool]]:
    """The granules in batches of ``size`` (or of what ``size()`` says as each batch fills), or fewer once their
    local rasters reach ``raster_bytes`` in all; each with whether it is the last. Items that come as rows
    (:class:`~ingest.pipeline._granules.RowsGranule`) fill a batch at ``rows_size`` (default: ``size``).

    A batch is one commit: items alone are cheap, so thousands make a data
    file of a useful size; a granule whose rasters are copied carries megabytes,
    so a batch of them closes by bytes, keeping a commit's work (and what a
    crash takes back) bounded either way. The last batch is known by reading
    one granule past a full one (:func:`~ingest.pipeline._prune.with_last`), not
    a whole batch: each batch commits as soon as it is full, and when the
    sources end only the last is left to commit.
    """

    def size_now() -> int:
        return size() if callable(size) else size

    # A batch is full at ``size`` items or ``rows_size`` rows, or a mix of the two: an item costs rows_size
    # units of ``size * rows_size``, a row costs size (integers: no rounding).
    def units(granule: AnyGranule) -> int:
        return weight(granule) * (size_now() if isinstance(granule, RowsGranule) else rows_now())

    def rows_now() -> int:
        return rows_size if rows_size is not None else size_now()

    batch: list[AnyGranule] = []
    used = held = 0
    for whole, last in with_last(granules):
        granule = whole
        # Rows fill a batch exactly: the rest begins the next one.
        while isinstance(granule, RowsGranule) and used + units(granule) > size_now() * rows_now() > used:
            head, granule = granule.split(max(1, (size_now() * rows_now() - used) // size_now()))
            yield [*batch, head], False
            batch, used, held = [], 0, 0
        batch.append(granule)
        used += units(granule)
        if raster_bytes is not None and isinstance(granule, Granule):
            held += sum(_size(path) for path in granule.rasters.values())
        if last or used >= size_now() * rows_now() or (raster_bytes is not None and held >= raster_bytes):
            yield batch, last
            batch = []
            used = held = 0


def place_of(granule: AnyGranule) -> tuple[str, int, int] | None:
    """Where a granule's rasters probably go: its collection and the one-degree cell of its footprint's centre
    (granules near each other share stacks, tiles of one lattice); None for a granule without rasters."""
    if isinstance(granule, RowsGranule) or not granule.rasters:
        return None
    bbox = granule.item.get("bbox") or [0.0, 0.0, 0.0, 0.0]
    try:
        cell = (math.floor((bbox[0] + bbox[-2]) / 2), math.floor((bbox[1] + bbox[-1]) / 2))
    except (TypeError, IndexError, ValueError, OverflowError):
        cell = (0, 0)
    return (str(granule.item.get("collection")), *cell)


def routed_batches(
    granules: Iterable[AnyGranule], routes: int, size: int, raster_bytes: int | None = None, *, virtual: bool = False
) -> Iterator[tuple[int, list[AnyGranule], bool]]:
    """Batches as :func:`batched` makes them (each with whether it is the last), each for one route (one per
    actor); with ``virtual``, a raster counts :data:`VIRTUAL_RASTER_BYTES` toward ``raster_bytes`` whatever its
    size (its references are staged, not its pixels). When the granules end, the routes' batches follow one
    another.

    A place (:func:`place_of`) seen for the first time goes to the route that
    has been given the fewest granules so far, and stays there for the run:
    within a run one actor writes a tile's slices, so writers rarely take the
    same slots (when they do, slots move at commit time; correctness never
    depends on the routing), and a run over a few tiles still uses every
    actor (a hash of the place sent all of four tiles to one of two actors).
    Granules without rasters fill whichever route's batch is emptiest.
    """
    batches: list[list[AnyGranule]] = [[] for _ in range(routes)]
    counts = [0] * routes  # granules in each route's batch (a metadata-only search routes every item: C calls only)
    held = [0] * routes
    given = [0] * routes
    route_of: dict[tuple[str, int, int], int] = {}
    for granule, last in with_last(granules):
        place = place_of(granule)
        if place is None:
            route = counts.index(min(counts))
        else:
            route = route_of.get(place, -1)
            if route < 0:
                route = route_of[place] = given.index(min(given))
        given[route] += 1
        batches[route].append(granule)
        counts[route] += weight(granule)
        if raster_bytes is not None and isinstance(granule, Granule) and granule.rasters:
            sizes = (VIRTUAL_RASTER_BYTES if virtual else _size(path) for path in granule.rasters.values())
            held[route] += sum(sizes)
        if not last and (counts[route] >= size or (raster_bytes is not None and held[route] >= raster_bytes)):
            yield route, batches[route], False
            batches[route], held[route], counts[route] = [], 0, 0
    rest = [(route, batch) for route, batch in enumerate(batches) if batch]
    for position, (route, batch) in enumerate(rest, start=1):
        yield route, batch, position == len(rest)


REMOTE_RASTER_BYTES = 64 << 20
"""What a remote raster counts toward a batch's ``batch_raster_mb`` (its size is not asked for: one request each)."""

VIRTUAL_RASTER_BYTES = 1 << 20
"""What a raster referenced in place counts toward ``batch_raster_mb``: its references, not its pixels, are
held (512 rasters a batch at the default; counted as copies, remote scenes made batches of 8, each a commit)."""


def _size(path: str) -> int:
    if is_remote(path):
        return REMOTE_RASTER_BYTES
    try:
        return os.stat(path).st_size
    except OSError:
        return 0  # unreadable: the batch reports it, by name, when it reads the raster


def _store_collection(repository: Repository, sourced: SourcedItem, report: IngestReport, branch: str) -> None:
    """Keep a STAC Collection found in the sources with the repository; one floe refuses is a rejection."""
    collection = sourced.collection or {}
    try:
        repository.store_collection(collection, branch=branch)
    except FloeError as error:
        report.rejected.append(Rejection.of(error, sourced.source, shorten(str(collection.get("id")))))


def _validated(
    pending: list[SourcedItem], default_collection: str | None
) -> list[tuple[SourcedItem, dict[str, object] | InvalidInput]]:
    """Each pending item validated (or the error that refuses it); geometries parsed in one call. An item
    checked already (``SourcedItem.checked``: by a search's page reader, in its own process) is not checked
    again."""
    with timed("validate"):
        return _checked(pending, default_collection)


def _checked(
    pending: list[SourcedItem], default_collection: str | None
) -> list[tuple[SourcedItem, dict[str, object] | InvalidInput]]:
    checked: list[tuple[SourcedItem, dict[str, object] | InvalidInput]] = []
    items = [item_as_dict(sourced.item) for sourced in pending]
    todo = [item for sourced, item in zip(pending, items, strict=True) if not sourced.checked]
    verdicts = iter(plainly_valid(todo) if todo else ())
    suspects: list[int] = []  # of checked: the items whose geometry is still to be checked
    for sourced, item in zip(pending, items, strict=True):
        if sourced.checked:
            checked.append((sourced, item))
            continue
        if next(verdicts):
            suspects.append(len(checked))
            checked.append((sourced, item))
            continue
        try:
            checked.append(
                (
                    sourced,
                    validate_item(
                        item, source=sourced.source, default_collection=default_collection, check_geometry=False
                    ),
                )
            )
            suspects.append(len(checked) - 1)
        except InvalidInput as error:
            checked.append((sourced, error))
    for position in refused_geometries([checked[index][1] for index in suspects]):  # type: ignore[misc]
        sourced, _ = checked[suspects[position]]
        try:  # the item-by-item parse names the problem
            validate_item(item_as_dict(sourced.item), source=sourced.source, default_collection=default_collection)
        except InvalidInput as error:
            checked[suspects[position]] = (sourced, error)
    return checked


def _granules(
    pending: list[SourcedItem],
    report: IngestReport,
    scope: SourceScope,
    default_collection: str | None,
    assets: set[str] | frozenset[str] | None,
    *,
    remote: bool,
) -> Iterator[Granule]:
    checked = _validated(pending, default_collection)
    valid = [(sourced, outcome) for sourced, outcome in checked if not isinstance(outcome, InvalidInput)]
    # The chunk's keys are looked up and added together (see _seen.py).
    first_seen = iter(
        scope.seen.add_new(
            [(str(outcome["collection"]), str(outcome["id"])) for _, outcome in valid],
            [sourced.source for sourced, _ in valid],
        )
    )
    for sourced, outcome in checked:
        if isinstance(outcome, InvalidInput):
            report.rejected.append(Rejection.of(outcome, sourced.source))
            scope.note_unkeyed(sourced.source, sourced.item, default_collection)
            continue
        item_id = str(outcome["id"])
        earlier = next(first_seen)
        if earlier is not None:
            report.rejected.append(Rejection(sourced.source, item_id, f"duplicate id (first seen in {earlier})"))
            continue
        if assets is not None and not assets:  # metadata only: no asset to look for
            yield Granule(outcome, sourced.source)
            continue
        selected = None if assets is None else set(assets)
        granule = granule_from_item(outcome, sourced.source, sourced.path, selected, remote=remote)
        if granule.missing:
            asset, path = next(iter(granule.missing.items()))
            report.rejected.append(Rejection(sourced.source, item_id, f"asset {asset!r} does not exist: {path}"))
            continue
        yield granule
