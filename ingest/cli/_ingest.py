"""Commands that write: ``floe init``, ``floe ingest``, ``floe demo``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from ingest.cli._app import EXIT_REJECTED, app, fail, floe_errors, open_repository, progress_bar, settings_of, stderr
from ingest.errors import RepositoryNotFound
from ingest.repository import Repository


@app.command()
def init(ctx: typer.Context) -> None:
    """Create an empty repository at the root (an Icechunk repository and an empty items table)."""
    with floe_errors():
        repository = Repository.create(settings=settings_of(ctx))
    stderr.print(f"created a floe repository at [bold]{repository.location.url}[/]")


@contextmanager
def _ingest_progress(label: str) -> Iterator[Any]:
    """A progress bar for an ingest run: granules done of those read so far, items/s, commits, conflicts retried.

    Sources are streamed, so the total grows as the driver reads them.
    """

    started = time.monotonic()
    with progress_bar(label) as progress:
        task = progress.add_task("", total=None)

        def update(state: Any) -> None:
            done = state.rows_added + state.skipped + len(state.rejected)
            rate = done / max(time.monotonic() - started, 1e-6)
            progress.update(
                task,
                completed=done,
                total=max(state.items_read, done) or None,
                description=(
                    f"{rate:,.0f} items/s · {len(state.commits)} commits · {state.conflicts_retried} conflicts "
                    f"retried · {len(state.rejected)} rejected · {state.bytes_written / 1e6:,.1f} MB copied"
                ),
            )

        yield update


def _summary(result: Any) -> str:
    tip = result.commits[-1].snapshot_id if result.commits else "no new snapshot"
    return (
        f"ingested {result.rows_added} items in {len(result.commits)} commit(s) ({tip}): "
        f"{result.rows_added - result.replaced} new, {result.replaced} replaced, {result.skipped} unchanged; "
        f"{result.bytes_written / 1e6:.1f} MB of pixels copied"
        + (
            f", {result.virtual} granules referenced in place ({len(result.fallbacks)} copied)"
            if result.virtual or result.fallbacks
            else ""
        )
        + f"; {len(result.rejected)} rejected; "
        f"{result.conflicts_retried} conflicts retried"
        + (f"; {result.pruned} deleted (--prune: gone from the sources)" if result.pruned else "")
        + _compacted(result)
    )


def _compacted(result: Any) -> str:
    """The compactions the run made (``[optimize]`` thresholds), if any, as the end of the summary line."""
    if not result.compactions and not result.compaction_errors:
        return ""
    partitions = sum(len(done.summary.partitions) for done in result.compactions)
    before = sum(done.summary.files_before for done in result.compactions)
    after = sum(done.summary.files_after for done in result.compactions)
    text = f"; compacted {partitions} partition(s), {before} -> {after} files"
    if result.compaction_errors:
        text += f" ({len(result.compaction_errors)} compaction(s) failed: {result.compaction_errors[-1]})"
    return text


@app.command()
def ingest(  # noqa: PLR0917 - typer maps parameters to options
    ctx: typer.Context,
    sources: Annotated[
        list[str],
        typer.Argument(
            help=(
                "STAC item JSON, FeatureCollection, JSON array or NDJSON files, folders of them, "
                "or - for NDJSON on stdin."
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
            help="Items per commit (default: batch_size, 5000), fewer once a batch's rasters reach batch_raster_mb.",
        ),
    ] = None,
    message: Annotated[str | None, typer.Option("--message", "-m", help="Commit message.")] = None,
    collection: Annotated[
        str | None, typer.Option("--collection", help="Collection id for items that have none.")
    ] = None,
    report: Annotated[
        Path | None, typer.Option("--report", help="Write rejected inputs here as JSON lines.", show_default=False)
    ] = None,
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            "-w",
            min=0,
            help="Ray actors copying granules and committing batches (0: no Ray, metadata only).",
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
        str, typer.Option("--assets", help="Raster assets to copy into arrays: all (local GeoTIFFs), none, or KEY,KEY.")
    ] = "all",
    virtual: Annotated[
        bool,
        typer.Option(
            "--virtual",
            help=(
                "Reference local COG tiles in place (Icechunk virtual chunks) instead of copying pixels; "
                "rasters that cannot be referenced (e.g. pixel-interleaved) are copied and listed. "
                "Reading the arrays then needs the source files, unchanged."
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
) -> None:
    """Ingest STAC items and their local rasters, one commit per batch.

    With Ray (the default), each actor copies its granules' rasters into
    Icechunk arrays (slices of stacks shared by the granules of one grid) and
    commits arrays and rows together through its own writer. Items whose assets are remote are ingested as
    metadata. Creates the repository if it does not exist. Bad input
    (unreadable files, invalid items, corrupt rasters, missing assets,
    duplicate or unsafe ids) is reported with its source and skipped;
    everything else is committed, and the exit status is 3.
    """
    from ingest.pipeline import ingest_items, ingest_with_ray

    if virtual and workers == 0:
        fail("--virtual references rasters, which only the Ray pipeline ingests: use --workers 1 or more", 2)
    with floe_errors():
        try:
            repository = open_repository(ctx)
        except RepositoryNotFound:
            repository = Repository.create(settings=settings_of(ctx))
            stderr.print(f"created a floe repository at [bold]{repository.location.url}[/]")
        with _ingest_progress("ingest") as update:
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
                )
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
        result.write_report(report)
    stderr.print(_summary(result), highlight=False)
    if result.rejected:
        raise typer.Exit(EXIT_REJECTED)


@app.command()
def demo(
    ctx: typer.Context,
    granules: Annotated[int, typer.Option("--granules", min=1, help="Granules in the sample archive.")] = 40,
    archive: Annotated[
        Path, typer.Option("--archive", help="Where to write the sample archive (COGs + STAC items).")
    ] = Path("floe-demo-archive"),
    workers: Annotated[int, typer.Option("--workers", "-w", min=1, help="Ray actors.")] = 2,
) -> None:
    """Generate a small sample archive, ingest it with Ray, tag it v1, and say what to run next."""
    from ingest.errors import RefExists
    from ingest.pipeline import ingest_with_ray
    from ingest.sample import make_archive

    with floe_errors():
        items = make_archive(archive, granules=granules, seed=0)
        stderr.print(f"wrote {len(items)} COG granules with STAC items to [bold]{archive}[/]")
        try:
            repository = open_repository(ctx)
        except RepositoryNotFound:
            repository = Repository.create(settings=settings_of(ctx))
        with _ingest_progress("demo") as update:
            result = ingest_with_ray(repository, [archive], workers=workers, batch_size=10, progress=update)
        try:
            repository.tag("v1")
            tagged = "tagged the result [bold]v1[/]"
        except RefExists:
            tagged = "tag v1 exists already (tags never move)"
    root = repository.location.url
    stderr.print(
        f"{_summary(result)}\ninto {root}; {tagged}\n\n"
        "Next:\n"
        "  floe log                          # the commits, with rows and attempts\n"
        "  floe export --ref v1 items.ndjson # the items of v1\n"
        "  floe check --all                  # every ref's files are there\n"
        "  floe search --ref v1 --collections sample-dem --limit 3   # matching items as NDJSON\n"
        "  floe serve                        # a STAC API on http://127.0.0.1:8080 (v1 at /refs/v1/)\n"
        f"  floe ingest {archive}   # again: nothing changed, so nothing is committed\n"
        "  # one granule's pixels at v1, from Python:\n"
        "  #   from ingest import Repository; import xarray\n"
        f"  #   view = Repository.open({root!r}).view('v1')\n"
        "  #   xarray.open_zarr(view.session.store, group='sample-optical/sample-optical-0000', consolidated=False)",
        highlight=False,
        soft_wrap=True,
    )
    if result.rejected:
        raise typer.Exit(EXIT_REJECTED)
