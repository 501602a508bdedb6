"""``floe ingest``: items and their rasters from files, folders, buckets and STAC APIs, one commit per batch."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from ingest.cli._access import remote_access
from ingest.cli._app import (
    EXIT_REJECTED,
    app,
    fail,
    floe_errors,
    open_or_create_repository,
    settings_of,
    stderr,
)
from ingest.cli._ingest_report import ingest_progress, report_search, summary


@app.command()
def ingest(  # noqa: PLR0917 - typer maps parameters to options
    ctx: typer.Context,
    sources: Annotated[
        list[str],
        typer.Argument(
            help=(
                "STAC item JSON, FeatureCollection, JSON array, NDJSON or stac-geoparquet files, folders of them, "
                "static catalogs, - for NDJSON on stdin; or the same at s3:// or https:// URLs (an s3:// or Azure "
                "blob URL ending in / is a folder); or a STAC API (its root or a /search?... URL), searched with "
                "--collections, --bbox, --datetime, --filter."
            ),
            show_default=False,
        ),
    ],
    branch: Annotated[str | None, typer.Option("--branch", "-b", help="Branch to commit to (default: main).")] = None,
    batch_size: Annotated[
        int | None,
        typer.Option(
            "--batch-size",
            "-n",
            min=1,
            help=(
                "Items per commit (default: batch_size, 5000; with --workers 0 on object storage, doubling up to "
                "batch_max_size while commits mostly wait on the store; stac-geoparquet rows, a large NDJSON "
                "file's lines and a large STAC API search's pages, taken as rows: rows_batch_size, 50000), fewer "
                "once a batch's rasters reach batch_raster_mb. Given, it holds for both."
            ),
        ),
    ] = None,
    message: Annotated[str | None, typer.Option("--message", "-m", help="Commit message.")] = None,
    collection: Annotated[
        str | None, typer.Option("--collection", help="Collection id for items that have none.")
    ] = None,
    report: Annotated[
        Path | None,
        typer.Option(
            "--report",
            help=(
                "Write a JSON line here for every granule: committed (with its snapshot and, under Ray, the node "
                "whose actor wrote it), rejected (with the reason) or copied instead of referenced."
            ),
            show_default=False,
        ),
    ] = None,
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            "-w",
            min=0,
            help=(
                "Ray actors copying granules and committing batches (0: no Ray, metadata only). Batches of items "
                "without rasters are committed by this process; Ray starts with the first batch that has some. With "
                "--assets none (a metadata backfill), the actors read the sources themselves, in parts (byte ranges of "
                "NDJSON, runs of rows of stac-geoparquet: part_mb; time lanes of a STAC API search), and commit them."
            ),
        ),
    ] = 2,
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray-address",
            help=(
                "Join this running Ray cluster (HOST:PORT of its head) instead of starting a local one bound to "
                "127.0.0.1. A cluster with token authentication needs RAY_AUTH_MODE=token and its token."
            ),
            show_default=False,
        ),
    ] = None,
    assets: Annotated[
        str,
        typer.Option(
            "--assets",
            help=(
                "Raster assets to copy into arrays: all (GeoTIFFs; remote ones with --remote-assets), none, or "
                "KEY,KEY. none: items become rows only, and with Ray the files are split over the actors."
            ),
        ),
    ] = "all",
    remote_assets: Annotated[
        bool,
        typer.Option(
            "--remote-assets",
            help=(
                "Copy raster assets at s3:// and http(s):// URLs too (read with GDAL's /vsis3/ and /vsicurl/, 8 "
                "granules in flight per worker; credentials from AWS_*, an AWS_PROFILE, or FLOE_S3__*). Without it "
                "(and without --virtual) they stay metadata: an archive's items can be ingested without moving "
                "its pixels."
            ),
        ),
    ] = False,
    virtual: Annotated[
        bool,
        typer.Option(
            "--virtual",
            help=(
                "Reference COG tiles in place (Icechunk virtual chunks) instead of copying pixels: local files "
                "and s3:// and http(s):// objects (their references carry the ETag, so a changed object is "
                "refused on read; `floe check --deep` finds them). Rasters that cannot be "
                "referenced (e.g. pixel-interleaved, signed URLs) are copied and listed. Reading the arrays then "
                "needs the sources, unchanged."
            ),
        ),
    ] = False,
    collections: Annotated[
        str | None,
        typer.Option(
            "--collections",
            help="STAC API sources: search these collections (comma-separated). A search is read in 3 lanes at "
            "once, a collection and an interval of time each (FLOE_REMOTE__SEARCH_LANES; 1 on a loopback host).",
            show_default=False,
        ),
    ] = None,
    bbox: Annotated[
        str | None,
        typer.Option("--bbox", help="STAC API sources: items intersecting W,S,E,N.", show_default=False),
    ] = None,
    datetime_range: Annotated[
        str | None,
        typer.Option(
            "--datetime",
            help="STAC API sources: items of this instant or interval (RFC 3339, 2024-01-01T00:00:00Z/..).",
            show_default=False,
        ),
    ] = None,
    search_filter: Annotated[
        str | None,
        typer.Option("--filter", help="STAC API sources: a CQL2 filter (text or JSON).", show_default=False),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            help=(
                "STAC API sources: only items updated at or after this RFC 3339 time, or 'last': since the last "
                "run of the same search on this branch read it to its end (recorded in that run's last commit). "
                "Without a filter on 'updated' in the API, or a cursor, the whole search is read again and only "
                "new or changed items are committed."
            ),
            show_default=False,
        ),
    ] = None,
    anonymous: Annotated[
        bool,
        typer.Option(
            "--anonymous",
            help=(
                "Read s3:// sources and remote rasters without credentials (public buckets); the repository "
                "itself still uses AWS_* and FLOE_S3__*. Only some buckets or prefixes: remote.anonymous "
                "(FLOE_REMOTE__ANONYMOUS='[\"s3://bucket/\"]')."
            ),
        ),
    ] = False,
    requester_pays: Annotated[
        bool,
        typer.Option(
            "--requester-pays",
            help=(
                "Read s3:// sources and remote rasters as their requester paying (buckets whose owner charges "
                "readers, such as Landsat Collection 2's s3://usgs-landsat/): requests say so and are signed, so "
                "your AWS account pays for what is read. Only some buckets: remote.requester_pays "
                "(FLOE_REMOTE__REQUESTER_PAYS='[\"s3://usgs-landsat/\"]')."
            ),
        ),
    ] = False,
    header: Annotated[
        list[str] | None,
        typer.Option(
            "--header",
            "-H",
            help=(
                "'Name: value', sent with every request to the http(s) sources named here (their scheme, host "
                "and port: a STAC API's pages and collections, files of items), an API key or a bearer token. "
                "Repeatable. Other hosts (rasters elsewhere) get none: name them in remote.headers "
                '(FLOE_REMOTE__HEADERS=\'{"https://host/": {"Name": "value"}}\').'
            ),
            show_default=False,
        ),
    ] = None,
    planetary_computer: Annotated[
        bool,
        typer.Option(
            "--planetary-computer",
            help=(
                "Read Azure blobs (https://ACCOUNT.blob.core.windows.net/...: Planetary Computer's COGs and "
                "stac-geoparquet) with SAS tokens from Planetary Computer's token service, one per container, "
                "renewed before they expire; rows keep the unsigned URLs and nothing stores a token. On by itself "
                "for sources on planetarycomputer.microsoft.com. Another service: remote.sas_token_url; a "
                "subscription key: FLOE_REMOTE__SAS_SUBSCRIPTION_KEY."
            ),
        ),
    ] = False,
    prune: Annotated[
        bool,
        typer.Option(
            "--prune",
            help=(
                "Mirror the sources: delete (rows and arrays, in the last commit) the items of the sources' "
                "collections that the sources no longer hold. Nothing is pruned if any input cannot be read. "
                "Without it an ingest never deletes."
            ),
        ),
    ] = False,
    layout: Annotated[
        str | None,
        typer.Option(
            "--layout",
            help=(
                "How copied rasters are stacked (arrays.layout). 'tiled' (the default): each grid's lattice (CRS, "
                "pixel size, alignment) is cut into tiles of arrays.tile px, so scenes whose extents vary (Landsat) "
                "share stacks. 'fixed': a stack per exact grid (Sentinel-2 MGRS tiles, fixed DEM tiles), into which "
                "a COG's compressed tiles are copied as they are, without decoding (arrays.tile_copy)."
            ),
            show_default=False,
        ),
    ] = None,
) -> None:
    """Ingest STAC items and their rasters, one commit per batch.

    With Ray (the default), each actor copies its granules' rasters into
    Icechunk arrays (slices of stacks shared by the granules of one grid) and
    commits arrays and rows together through its own writer. Rasters at
    s3:// or http(s):// URLs stay metadata unless --remote-assets (or --virtual) asks for
    their pixels. Creates the repository if it does not exist. Bad input
    (unreadable files, invalid items, corrupt rasters, missing assets,
    duplicate or unsafe ids) is reported with its source and skipped;
    everything else is committed, and the exit status is 3.
    """
    from ingest.pipeline import ingest_items, ingest_with_ray

    if virtual and workers == 0:
        fail("--virtual references rasters, which only the Ray pipeline ingests: use --workers 1 or more", 2)
    if layout is not None:
        if layout not in ("tiled", "fixed"):
            fail(f"--layout must be 'tiled' or 'fixed', not {layout!r}", 2)
        settings_of(ctx).arrays.layout = layout  # type: ignore[assignment]  # checked just above
    options = _source_options(sources, collections, bbox, datetime_range, search_filter, since, anonymous, prune)
    # Referencing pixels in place is asked for by --virtual alone: remote rasters are referenced too (that is what
    # --virtual is for), not left as metadata until --remote-assets is added.
    options.remote_assets = remote_assets or virtual
    remote_access(
        settings_of(ctx).remote,
        sources,
        anonymous=anonymous,
        requester_pays=requester_pays,
        planetary_computer=planetary_computer,
        headers=header or [],
    )
    with _report_file(report) as sink, floe_errors(_INTERRUPTED):
        repository = open_or_create_repository(ctx)
        with ingest_progress("ingest") as update:
            if workers == 0:
                result = ingest_items(
                    repository,
                    sources,
                    branch=branch,
                    batch_size=batch_size,
                    message=message,
                    default_collection=collection,
                    progress=update,
                    prune=prune,
                    options=options,
                    report_to=sink,
                )
            else:
                result = ingest_with_ray(
                    repository,
                    sources,
                    workers=workers,
                    batch_size=batch_size,
                    ray_address=ray_address,
                    assets=assets,
                    branch=branch,
                    message=message,
                    default_collection=collection,
                    progress=update,
                    virtual=virtual,
                    prune=prune,
                    options=options,
                    report_to=sink,
                )
    for search in options.searches:
        report_search(search)
    for fallback in result.fallbacks:
        stderr.print(
            f"[cyan]copied instead of referenced[/] {escape(str(fallback))}",
            highlight=False,
            soft_wrap=True,
            emoji=False,
        )
    for rejection in result.rejected:
        # Ids and file names are the user's text: rich must not read "[/x]" as markup nor ":x:" as an emoji.
        stderr.print(f"[yellow]rejected[/] {escape(str(rejection))}", highlight=False, soft_wrap=True, emoji=False)
    if result.prune_skipped:
        stderr.print(f"[yellow]not pruned[/] {escape(result.prune_skipped)}", highlight=False, soft_wrap=True)
    if report is not None:
        result.write_report(report, append=True)
    stderr.print(summary(result), highlight=False)
    if result.rejected:
        raise typer.Exit(EXIT_REJECTED)


_INTERRUPTED = (
    "the batches committed before stay, and nothing half-written is visible; run the same command again to go on "
    "(what is committed already is skipped)"
)


def _report_file(report: Path | None) -> Any:
    """The ``--report`` file, opened before any work (an unwritable path fails at once, exit 2), or nothing."""
    if report is None:
        return nullcontext()
    try:
        return report.open("w", encoding="utf-8")
    except OSError as error:
        fail(f"cannot write the report {report}: {error.strerror or error}", 2)


def _source_options(  # noqa: PLR0917 - one per option of `floe ingest`
    sources: list[str],
    collections: str | None,
    bbox: str | None,
    datetime_range: str | None,
    search_filter: str | None,
    since: str | None,
    anonymous: bool,
    prune: bool,
) -> Any:
    """What `floe ingest`'s options ask of remote sources; usage errors (exit 2) for options that cannot apply."""
    from ingest.errors import InvalidSearch, InvalidSource
    from ingest.pipeline import SearchParameters, SourceOptions, is_api_url, parse_since
    from ingest.pipeline.sources import filter_json

    if search_filter:
        try:
            filter_json(search_filter)
        except InvalidSearch as error:
            fail(str(error), 2)
    parameters = SearchParameters(
        collections=tuple(part.strip() for part in (collections or "").split(",") if part.strip()),
        bbox=_bbox(bbox) if bbox else None,
        datetime=datetime_range,
        filter=search_filter,
    )
    try:
        apis = [source for source in sources if is_api_url(source)]
    except InvalidSource as error:
        fail(str(error))
    if (parameters.given() or since) and not apis:
        fail("--collections, --bbox, --datetime, --filter and --since apply to STAC API sources, and none is named", 2)
    narrowed = [name for name in ("--bbox", "--datetime", "--filter") if getattr(parameters, name[2:])]
    narrowed += ["--since"] if since else []
    narrowed += [f"{name}= in {url}" for url in apis for name in _narrowing(url)]
    if prune and apis and narrowed:
        fail(
            f"--prune mirrors whole collections: with {', '.join(narrowed)} the search holds only part of them, "
            "and the rest would be deleted",
            2,
        )
    try:
        when = None if since in (None, "last") else parse_since(since)
    except ValueError as error:
        fail(str(error), 2)
    return SourceOptions(anonymous=anonymous, search=parameters, since="last" if since == "last" else when)


_NARROWING = ("bbox", "intersects", "datetime", "filter", "query", "q", "ids")
"""Search parameters under which a search holds only part of its collections (``--prune`` cannot apply)."""


def _narrowing(url: str) -> list[str]:
    """The parameters of a ``/search?...`` URL that narrow its search below whole collections."""
    from urllib.parse import parse_qs, urlsplit

    given = parse_qs(urlsplit(url).query, keep_blank_values=False)
    return [name for name in _NARROWING if given.get(name)]


def _bbox(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError:
        fail(f"--bbox {text!r}: give W,S,E,N as numbers", 2)
    if len(values) not in (4, 6):
        fail(f"--bbox {text!r}: give 4 numbers (W,S,E,N) or 6 (with heights)", 2)
    return values
