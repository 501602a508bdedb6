"""The ``floe`` command: parse arguments, call the library, render the result.

Exit status: 0 success, 1 error, 2 usage error, 3 some input was rejected
(the rest was committed), 4 ``check`` found problems.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table as RichTable

from ingest.config import Settings, load_settings
from ingest.errors import FloeError, RepositoryNotFound
from ingest.repository import Repository

EXIT_ERROR = 1
EXIT_REJECTED = 3
EXIT_PROBLEMS = 4

app = typer.Typer(
    name="floe",
    help=(
        "floe keeps an Earth-observation archive's STAC items (an Iceberg table) and rasters "
        "(an Icechunk repository) in one versioned store: every commit moves both, every tag pins both.\n\n"
        "The repository root is --root, else $FLOE_ROOT, else ./floe-data (a local path or s3://bucket/prefix)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
stderr = Console(stderr=True)
stdout = Console()


def _fail(message: str, code: int = EXIT_ERROR) -> NoReturn:
    stderr.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


@contextmanager
def _errors() -> Iterator[None]:
    """Render floe's own errors as one clear line and a non-zero exit."""
    try:
        yield
    except FloeError as error:
        _fail(str(error))


def _settings(ctx: typer.Context) -> Settings:
    return ctx.obj["settings"]


def _open(ctx: typer.Context) -> Repository:
    return Repository.open(settings=_settings(ctx))


@app.callback()
def main(
    ctx: typer.Context,
    root: Annotated[
        str | None,
        typer.Option("--root", "-r", help="Repository root: a path or s3://bucket/prefix.", show_default=False),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", help="A TOML settings file (see configs/default.toml).", show_default=False),
    ] = None,
    verbose: Annotated[int, typer.Option("--verbose", "-v", count=True, help="More logging (-v info, -vv debug).")] = 0,
) -> None:
    if config is not None:
        if not config.exists():
            _fail(f"config file {config} does not exist")
        os.environ["FLOE_CONFIG"] = str(config)
    logging.basicConfig(
        level=[logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)],
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        settings = load_settings(root=root)
    except ValueError as error:
        _fail(f"invalid settings: {error}")
    ctx.obj = {"settings": settings}


@app.command()
def init(ctx: typer.Context) -> None:
    """Create an empty repository at the root (an Icechunk repository and an empty items table)."""
    with _errors():
        repository = Repository.create(settings=_settings(ctx))
    stderr.print(f"created a floe repository at [bold]{repository.location.url}[/]")


@contextmanager
def _ingest_progress(label: str) -> Iterator[Any]:
    """A progress bar for an ingest run: granules done of those read so far, items/s, commits, conflicts retried.

    Sources are streamed, so the total grows as the driver reads them.
    """
    import time

    started = time.monotonic()
    with Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.fields[label]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=stderr,
        transient=True,
    ) as progress:
        task = progress.add_task("", total=None, label=label)

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
    )


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
        int | None, typer.Option("--batch-size", "-n", min=1, help="Items per commit (default: 1000).")
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
) -> None:
    """Ingest STAC items and their local rasters, one commit per batch.

    With Ray (the default), each actor copies its granules' rasters into
    Icechunk arrays (one group per item) and commits arrays and rows together
    through its own writer. Items whose assets are remote are ingested as
    metadata. Creates the repository if it does not exist. Bad input
    (unreadable files, invalid items, corrupt rasters, missing assets,
    duplicate or unsafe ids) is reported with its source and skipped;
    everything else is committed, and the exit status is 3.
    """
    from ingest.pipeline import ingest_items, ingest_with_ray

    if virtual and workers == 0:
        _fail("--virtual references rasters, which only the Ray pipeline ingests: use --workers 1 or more", 2)
    with _errors():
        try:
            repository = _open(ctx)
        except RepositoryNotFound:
            repository = Repository.create(settings=_settings(ctx))
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
                )
    for fallback in result.fallbacks:
        stderr.print(f"[cyan]copied instead of referenced[/] {fallback}", highlight=False, soft_wrap=True)
    for rejection in result.rejected:
        stderr.print(f"[yellow]rejected[/] {rejection}", highlight=False, soft_wrap=True)
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

    with _errors():
        items = make_archive(archive, granules=granules, seed=0)
        stderr.print(f"wrote {len(items)} COG granules with STAC items to [bold]{archive}[/]")
        try:
            repository = _open(ctx)
        except RepositoryNotFound:
            repository = Repository.create(settings=_settings(ctx))
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
        _fail(f"unknown format {format!r}: supported formats are {', '.join(FORMATS)}", code=2)
    if out == "-" and format != "ndjson":
        _fail(f"--format {format} writes files: give an output path instead of -", code=2)
    exporters = {"ndjson": export_ndjson, "stac-geoparquet": export_geoparquet, "catalog": export_catalog}
    with _errors():
        view = _open(ctx).view(ref)
        result = exporters[format](view, out)
    where = "" if result.target == "-" else f" to {result.target}"
    stderr.print(
        f"exported {result.items} items of {result.collections} collections from {view.ref} "
        f"({view.snapshot_id}) as {format}{where}",
        highlight=False,
    )


@app.command("log")
def log_command(
    ctx: typer.Context,
    ref: Annotated[str | None, typer.Option("--ref", help="Branch, tag or snapshot id (default: main).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="A JSON array, one object per commit, newest first.")] = False,
    limit: Annotated[int | None, typer.Option("--limit", "-n", min=1, help="Show at most this many commits.")] = None,
) -> None:
    """Show the history of a ref: message, time, rows added, attempts, table pointer."""
    with _errors():
        entries = _open(ctx).log(ref, limit=limit)
    if as_json:
        stdout.print_json(json.dumps([entry.to_json() for entry in entries]))
        return
    table = RichTable("snapshot", "written at (UTC)", "rows", "attempts", "message", box=None)
    for entry in entries:
        table.add_row(
            entry.snapshot_id,
            entry.written_at.strftime("%Y-%m-%d %H:%M:%S"),
            f"{entry.rows_added} ({entry.rows_replaced} replaced)" if entry.rows_replaced else str(entry.rows_added),
            str(entry.attempts),
            entry.message,
        )
    stdout.print(table)


@app.command()
def tag(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The new tag's name.")],
    ref: Annotated[str | None, typer.Option("--ref", help="What to tag (default: main).")] = None,
) -> None:
    """Tag a version: arrays and table together, for good (tags never move)."""
    with _errors():
        snapshot_id = _open(ctx).tag(name, ref)
    stderr.print(f"tagged {snapshot_id} as [bold]{name}[/]")


@app.command()
def branch(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The new branch's name.")],
    from_ref: Annotated[str | None, typer.Option("--from", help="Where it starts (default: main).")] = None,
) -> None:
    """Create a branch at a version."""
    with _errors():
        snapshot_id = _open(ctx).branch(name, from_ref)
    stderr.print(f"created branch [bold]{name}[/] at {snapshot_id}")


@app.command()
def refs(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="JSON output.")] = False,
) -> None:
    """List branches and tags with the snapshot each points at."""
    with _errors():
        found = _open(ctx).refs()
    if as_json:
        stdout.print_json(json.dumps([{"name": r.name, "kind": r.kind, "snapshot_id": r.snapshot_id} for r in found]))
        return
    table = RichTable("kind", "name", "snapshot", box=None)
    for ref in found:
        table.add_row(ref.kind, ref.name, ref.snapshot_id)
    stdout.print(table)


@app.command()
def check(
    ctx: typer.Context,
    ref: Annotated[str | None, typer.Option("--ref", help="The ref to check (default: main).")] = None,
    all_refs: Annotated[bool, typer.Option("--all", help="Check every branch and tag.")] = False,
    deep: Annotated[
        bool,
        typer.Option(
            "--deep",
            help="Also compare data file and manifest sizes with the sizes the table records, "
            "and check that every row's array group exists at that snapshot.",
        ),
    ] = False,
) -> None:
    """Verify that a ref's (or every ref's) table pointer resolves and every file it references exists.

    Exits with status 4 and lists the problems if anything is wrong.
    """
    from ingest.lifecycle import check as run_check

    if ref is not None and all_refs:
        _fail("give --ref or --all, not both", code=2)
    with _errors():
        problems = run_check(_open(ctx), ref, all_refs=all_refs, deep=deep)
    for problem in problems:
        stdout.print(f"[red]problem[/] {problem}", highlight=False, soft_wrap=True)
    if problems:
        stderr.print(f"{len(problems)} problem(s) found")
        raise typer.Exit(EXIT_PROBLEMS)
    stderr.print(
        "ok: every pointer resolves and every referenced file exists"
        + (" with its recorded size, and every row's arrays exist" if deep else "")
    )


# -- lifecycle: gc, replicate (check is above) --------------------------------------------------
def _human_bytes(count: int) -> str:
    size = float(count)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size} B"  # pragma: no cover


@app.command("gc")
def gc_command(
    ctx: typer.Context,
    grace: Annotated[
        str,
        typer.Option(
            "--grace",
            help="Keep unreferenced table files younger than this (writers in flight own them): 0s, 30m, 24h, 90d.",
        ),
    ] = "24h",
    expire_older_than: Annotated[
        str | None,
        typer.Option(
            "--expire-older-than",
            help="First expire Icechunk snapshots older than this (branch tips and tags stay), e.g. 90d.",
            show_default=False,
        ),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would be deleted and how many bytes.")] = False,
) -> None:
    """Delete table files no version needs, after Icechunk's own garbage collection.

    The live set is every metadata.json, manifest list, manifest and data file
    reachable from the pointer of any snapshot in the history of any branch or
    tag. Only files outside it AND older than --grace are deleted: a writer
    writes its files before its commit lands, so keep --grace longer than any
    commit takes (the default, 24h, is safe next to running writers; use 0s
    only when nothing writes).
    """
    from ingest.lifecycle import gc, parse_duration

    with _errors():
        grace_period = parse_duration(grace)
        expire = parse_duration(expire_older_than) if expire_older_than is not None else None
        report = gc(_open(ctx), grace=grace_period, expire_older_than=expire, dry_run=dry_run)
    verb = "would delete" if dry_run else "deleted"
    if dry_run:
        for path, size in report.deleted:
            typer.echo(f"{path}\t{size}")  # plain tab-separated lines, for scripts
    if expire is not None:
        stderr.print(
            "expiry skipped in a dry run (the live set leaves out what it would drop)"
            if dry_run
            else f"expired {report.expired_snapshots} Icechunk snapshot(s)",
            highlight=False,
        )
    stderr.print(
        f"icechunk: {verb} {report.icechunk_objects_deleted} object(s), {_human_bytes(report.icechunk_bytes_deleted)}\n"
        f"tables: {verb} {len(report.deleted)} unreferenced file(s), {_human_bytes(report.bytes_deleted)}; "
        f"kept {len(report.kept_young)} younger than {grace}; {report.live_files} live file(s) "
        f"in {report.snapshots_in_history} snapshot(s) of history",
        highlight=False,
    )


@app.command("replicate")
def replicate_command(
    ctx: typer.Context,
    source: Annotated[str, typer.Argument(help="The repository to copy: a path or s3://bucket/prefix.")],
    target: Annotated[str, typer.Argument(help="Where the copy lives: a path or s3://bucket/prefix.")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count what would be copied; write nothing.")] = False,
) -> None:
    """Copy a repository to another root (local or S3, either direction); later runs copy only what is new.

    The source's refs are captured once, so a source being written is copied
    at one consistent version. Icechunk objects are copied byte for byte,
    Iceberg metadata is rewritten for the target root, the target is verified,
    and the refs move last: a reader of the target never sees a half-copied
    version. Both roots use the same S3 settings (FLOE_S3__*). The target is a
    replica: commits made to it are overwritten by the next run.
    """
    from ingest.lifecycle import replicate

    with _errors():
        report = replicate(source, target, _settings(ctx), dry_run=dry_run)
    verb = "would copy" if dry_run else "copied"
    stderr.print(
        f"{verb} {len(report.copied)} file(s) and {'would rewrite' if dry_run else 'rewrote'} "
        f"{len(report.rewritten)} table metadata file(s), {_human_bytes(report.bytes_written)}; "
        f"{report.branches} branch(es), {report.tags} tag(s), {report.snapshots} snapshot(s) "
        + ("(dry run: nothing written)" if dry_run else f"now at {report.target}"),
        highlight=False,
    )


# -- STAC API: serve and search ---------------------------------------------------------------


@app.command()
def serve(
    ctx: typer.Context,
    host: Annotated[
        str | None,
        typer.Option(
            "--host", help="Address to listen on (default 127.0.0.1: loopback only; api.host in the settings)."
        ),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option("--port", "-p", min=0, max=65535, help="Port (default 8080; api.port in the settings)."),
    ] = None,
) -> None:
    """Serve the STAC API: the default branch at /, every branch, tag and snapshot at /refs/{ref}/."""
    from ingest.api import serve as run_server

    settings = _settings(ctx)
    with _errors():
        repository = _open(ctx)
    host = host or settings.api.host
    port = settings.api.port if port is None else port
    stderr.print(f"serving {repository.location.url} at http://{host}:{port}/ (Ctrl-C stops)", highlight=False)
    run_server(repository, host, port)


@app.command()
def search(  # noqa: PLR0917 - typer maps parameters to options
    ctx: typer.Context,
    ref: Annotated[
        str | None, typer.Option("--ref", help="Branch, tag or snapshot id (default: the configured branch, main).")
    ] = None,
    bbox: Annotated[
        str | None, typer.Option("--bbox", help="xmin,ymin,xmax,ymax (or 6 numbers), degrees CRS84.")
    ] = None,
    intersects: Annotated[
        str | None, typer.Option("--intersects", help="A GeoJSON geometry (text, or @file.json).")
    ] = None,
    datetime: Annotated[
        str | None, typer.Option("--datetime", help="An RFC 3339 instant or interval start/end (.. for open).")
    ] = None,
    collections: Annotated[str | None, typer.Option("--collections", help="Comma-separated collection ids.")] = None,
    ids: Annotated[str | None, typer.Option("--ids", help="Comma-separated item ids.")] = None,
    filter_text: Annotated[str | None, typer.Option("--filter", help="A CQL2 filter.")] = None,
    filter_lang: Annotated[str, typer.Option("--filter-lang", help="cql2-text or cql2-json.")] = "cql2-text",
    sortby: Annotated[
        str | None, typer.Option("--sortby", help="Comma-separated fields, - for descending: -datetime,id.")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="Items read per page.")] = 100,
    max_items: Annotated[
        int | None, typer.Option("--max-items", min=1, help="Stop after this many items (default: all of them).")
    ] = None,
) -> None:
    """Search items at a ref (the API's search engine, in-process) and print them as NDJSON on stdout."""
    from ingest.api import SearchEngine, SearchRequest

    if intersects is not None and intersects.startswith("@"):
        path = Path(intersects[1:])
        if not path.is_file():
            _fail(f"--intersects file {path} does not exist", code=2)
        intersects = path.read_text()
    request = SearchRequest(
        collections=[value for value in collections.split(",") if value] if collections else None,
        ids=[value for value in ids.split(",") if value] if ids else None,
        bbox=bbox,
        intersects=intersects,
        datetime=datetime,
        filter=filter_text,
        filter_lang=filter_lang,
        sortby=sortby,
        limit=limit,
    )
    count = 0
    with _errors():
        repository = _open(ctx)
        engine = SearchEngine(repository, max_limit=repository.settings.api.max_limit, refuse_over_limit=True)
        for item in engine.iter_items(request, ref, max_items=max_items):
            sys.stdout.write(json.dumps(item, separators=(",", ":")) + "\n")
            count += 1
    sys.stdout.flush()
    stderr.print(f"{count} items", highlight=False)


if __name__ == "__main__":  # pragma: no cover
    app()
