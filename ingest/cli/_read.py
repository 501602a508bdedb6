"""Commands that read and name versions: ``floe export``, ``floe log``, ``floe tag``, ``floe branch``, ``floe refs``,
``floe table-location``."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table as RichTable

from ingest.cli._app import app, fail, floe_errors, open_repository, stderr, stdout

if TYPE_CHECKING:
    from ingest.repository import LogEntry


@app.command()
def export(
    ctx: typer.Context,
    out: Annotated[
        str,
        typer.Argument(
            help="Output: a file (ndjson, stac-geoparquet), a folder (catalog), or - for stdout (ndjson only)."
        ),
    ] = "-",
    ref: Annotated[str | None, typer.Option("--ref", help="Branch, tag or snapshot id (default: main).")] = None,
    format: Annotated[
        str,
        typer.Option(
            "--format",
            "-f",
            help=(
                "ndjson: one item per line, exactly as ingested. "
                "stac-geoparquet: one GeoParquet file (geopandas, DuckDB, stac-geoparquet read it). "
                "catalog: a static STAC catalog folder (catalog.json, collection.json per collection, item files)."
            ),
        ),
    ] = "ndjson",
) -> None:
    """Export every item at a ref as NDJSON, one stac-geoparquet file, or a static STAC catalog.

    Streams the table batch by batch; the same ref gives the same output, which appears only once complete.
    """
    from ingest.export import FORMATS, export_catalog, export_geoparquet, export_ndjson

    if format not in FORMATS:
        fail(f"unknown format {format!r}: supported formats are {', '.join(FORMATS)}", code=2)
    if out == "-" and format != "ndjson":
        fail(f"--format {format} writes files: give an output path instead of -", code=2)
    exporters = {"ndjson": export_ndjson, "stac-geoparquet": export_geoparquet, "catalog": export_catalog}
    with floe_errors():
        view = open_repository(ctx).view(ref)
        result = exporters[format](view, out)
    where = "" if result.target == "-" else f" to {result.target}"
    stderr.print(
        f"exported {result.items} items of {result.collections} collections from {view.ref} "
        f"({view.snapshot_id}) as {format}{where}",
        highlight=False,
    )


def _rows(entry: LogEntry) -> str:
    """Rows a commit added, with those it replaced and deleted when there are any."""
    counts = ((entry.rows_replaced, "replaced"), (entry.rows_deleted, "deleted"))
    shown = [f"{count} {what}" for count, what in counts if count]
    return f"{entry.rows_added} ({', '.join(shown)})" if shown else str(entry.rows_added)


@app.command("log")
def log_command(
    ctx: typer.Context,
    ref: Annotated[str | None, typer.Option("--ref", help="Branch, tag or snapshot id (default: main).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="A JSON array, one object per commit, newest first.")] = False,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="Show at most this many commits.")] = 20,
    show_all: Annotated[
        bool,
        typer.Option(
            "--all",
            help="Also floe's own commits, which change no rows (the first one, creating collections and stacks).",
        ),
    ] = False,
) -> None:
    """Show the history of a ref, newest first: snapshot, refs pointing at it, time, rows, attempts, message."""
    with floe_errors():
        repository = open_repository(ctx)
        entries = repository.log(ref, limit=limit, housekeeping=show_all)
        pointing: dict[str, list[str]] = {}
        for found in repository.refs():
            pointing.setdefault(found.snapshot_id, []).append(
                found.name if found.kind == "branch" else f"{found.kind}: {found.name}"
            )
    if as_json:
        stdout.print_json(json.dumps([entry.to_json() for entry in entries]))
        return
    rows = [
        (
            entry.snapshot_id,
            ", ".join(pointing.get(entry.snapshot_id, [])),
            entry.written_at.strftime("%Y-%m-%d %H:%M:%S"),
            _rows(entry),
            str(entry.attempts),
            entry.message,
        )
        for entry in entries
    ]
    table = RichTable(box=None)
    for number, heading in enumerate(("snapshot", "refs", "written at (UTC)", "rows", "attempts")):
        # Whole, always: on a narrow terminal only the message is cut (one line a commit, never wrapped).
        widest = max([len(heading), *(len(row[number]) for row in rows)])
        table.add_column(heading, no_wrap=True, min_width=widest)
    table.add_column("message", no_wrap=True, overflow="ellipsis")
    for row in rows:
        table.add_row(*row)
    stdout.print(table, highlight=False)


@app.command()
def tag(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The new tag's name.")],
    ref: Annotated[str | None, typer.Option("--ref", help="What to tag (default: main).")] = None,
) -> None:
    """Tag a version: arrays and table together, for good (tags never move)."""
    with floe_errors():
        snapshot_id = open_repository(ctx).tag(name, ref)
    stderr.print(f"tagged {snapshot_id} as [bold]{name}[/]")


@app.command()
def branch(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The new branch's name.")],
    from_ref: Annotated[str | None, typer.Option("--from", help="Where it starts (default: main).")] = None,
) -> None:
    """Create a branch at a version."""
    with floe_errors():
        snapshot_id = open_repository(ctx).branch(name, from_ref)
    stderr.print(f"created branch [bold]{name}[/] at {snapshot_id}")


@app.command()
def refs(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="JSON output.")] = False,
) -> None:
    """List branches and tags with the snapshot each points at."""
    with floe_errors():
        found = open_repository(ctx).refs()
    if as_json:
        stdout.print_json(json.dumps([{"name": r.name, "kind": r.kind, "snapshot_id": r.snapshot_id} for r in found]))
        return
    table = RichTable("kind", "name", "snapshot", box=None)
    for ref in found:
        table.add_row(ref.kind, ref.name, ref.snapshot_id)
    stdout.print(table)


@app.command("table-location")
def table_location(
    ctx: typer.Context,
    ref: Annotated[str | None, typer.Option("--ref", help="Branch, tag or snapshot id (default: main).")] = None,
) -> None:
    """Print the items table's metadata.json location at a ref, for engines that read one directly.

    Spark, Trino or DuckDB (`iceberg_scan('<location>')`) read the Iceberg table from it; the location is
    the one the ref's Icechunk commit records, so it stays valid as long as the ref does (until gc).
    `floe serve` also answers the Iceberg REST catalog protocol under /iceberg/ (warehouse = the ref).
    """
    with floe_errors():
        repository = open_repository(ctx)
        snapshot_id = repository.resolve(ref)
        location = repository.metadata_location_of(snapshot_id)
    stdout.print(location, highlight=False, soft_wrap=True)
    stderr.print(f"{ref or repository.settings.branch} is snapshot {snapshot_id}", highlight=False)


@app.command()
def preview(  # noqa: PLR0917 - one per option of `floe preview`
    ctx: typer.Context,
    item_id: Annotated[str, typer.Argument(help="The item's id.", show_default=False)],
    out: Annotated[
        str | None, typer.Option("--out", "-o", help="The PNG to write (default: <id>.png here).", show_default=False)
    ] = None,
    ref: Annotated[str | None, typer.Option("--ref", help="Branch, tag or snapshot id (default: main).")] = None,
    collection: Annotated[
        str | None,
        typer.Option("--collection", "-c", help="The item's collection (needed only if several hold the id)."),
    ] = None,
    assets: Annotated[
        str | None,
        typer.Option(
            "--assets",
            help="Comma-separated asset keys whose bands to show, in order: three bands make RGB, fewer grey "
            "(default: every asset with arrays).",
        ),
    ] = None,
    size: Annotated[int, typer.Option("--size", min=1, help="The picture's long side at most, in pixels.")] = 1024,
) -> None:
    """Write a quick-look PNG of an item's arrays at a ref, read from the repository (not the source files).

    Each band is stretched between its 2nd and 98th percentile; nodata is transparent. Any tag or snapshot
    shows the pixels as they were then.
    """
    from ingest.export import write_preview

    keys = [key.strip() for key in assets.split(",") if key.strip()] if assets else None
    with floe_errors():
        view = open_repository(ctx).view(ref)
        try:
            written = write_preview(view, item_id, out, collection=collection, assets=keys, size=size)
        except ValueError as error:  # an asset the item has no arrays for, or assets on different grids
            fail(str(error), code=2)
    stderr.print(
        f"wrote {written.path} ({written.width} x {written.height}; {', '.join(written.bands)}) of "
        f"{written.collection}/{written.item_id} at {view.ref} ({written.snapshot_id})",
        highlight=False,
    )
