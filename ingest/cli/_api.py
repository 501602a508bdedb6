"""The STAC API from the command line: ``floe serve`` and ``floe search``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from ingest.cli._app import app, fail, floe_errors, open_repository, settings_of, stderr


@app.command()
def serve(  # noqa: PLR0917 - typer maps parameters to options
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
    transactions: Annotated[
        bool,
        typer.Option(
            "--transactions",
            help=(
                "Accept writes (the STAC Transactions extension: POST, PUT, PATCH, DELETE of items on branches), "
                "each one commit; needs a write token (FLOE_API__WRITE_TOKEN), sent as Authorization: Bearer."
            ),
        ),
    ] = False,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            "-w",
            min=1,
            help=(
                "Processes answering requests on one socket, so a heavy search does not hold up the others "
                "(default: the cores floe may use; api.workers in the settings)."
            ),
            show_default=False,
        ),
    ] = None,
    cache_dir: Annotated[
        Path | None,
        typer.Option(
            "--cache-dir",
            help=(
                "On object storage, keep the table objects read (metadata, small data files) in this directory, "
                "shared by the workers and by the next server started with it (api.cache_dir; its size: "
                "api.cache_dir_mb, 2048)."
            ),
            show_default=False,
        ),
    ] = None,
) -> None:
    """Serve the STAC API: the default branch at /, every branch, tag and snapshot at /refs/{ref}/."""
    from ingest.api import default_workers
    from ingest.api import serve as run_server

    settings = settings_of(ctx)
    if transactions and not settings.api.write_token:
        fail("--transactions needs a write token: set FLOE_API__WRITE_TOKEN (or api.write_token)", code=2)
    if cache_dir is not None:
        settings.api.cache_dir = str(cache_dir)
    with floe_errors():
        repository = open_repository(ctx)
    host = host or settings.api.host
    port = settings.api.port if port is None else port
    workers = workers or settings.api.workers or default_workers()
    writes = " (writes accepted with the write token)" if transactions else ""
    processes = f" by {workers} worker processes" if workers > 1 else ""
    stderr.print(
        f"serving {repository.location.url} at http://{host}:{port}/{processes}{writes} (Ctrl-C stops)",
        highlight=False,
    )
    from ingest.api import browser_home, installed_build

    if installed_build(browser_home(settings)) is None:
        stderr.print("STAC Browser is not installed (`floe browser install`): /browser/ says how", highlight=False)
    else:
        stderr.print(f"STAC Browser at http://{host}:{port}/browser/ and /refs/{{ref}}/browser/", highlight=False)
    run_server(repository, host, port, transactions=transactions, workers=workers)


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
            fail(f"--intersects file {path} does not exist", code=2)
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
    with floe_errors():
        repository = open_repository(ctx)
        engine = SearchEngine.in_process(repository)
        if filter_text and not engine.refuse_unknown_properties:
            unknown = engine.unknown_properties(request, ref)
            if unknown:
                named = ", ".join(map(repr, unknown[:5]))
                stderr.print(
                    f"warning: the filter names {named}, which no item at this ref has: it is null in every item "
                    "(`floe queryables` lists the properties a filter can use)",
                    highlight=False,
                )
        for item in engine.iter_items(request, ref, max_items=max_items):
            sys.stdout.write(json.dumps(item, separators=(",", ":")) + "\n")
            count += 1
    sys.stdout.flush()
    stderr.print(f"{count} item{'' if count == 1 else 's'}", highlight=False)


@app.command()
def queryables(
    ctx: typer.Context,
    ref: Annotated[
        str | None, typer.Option("--ref", help="Branch, tag or snapshot id (default: the configured branch, main).")
    ] = None,
) -> None:
    """Print the properties a filter can use at a ref, and their types (the API's /queryables), as JSON."""
    from ingest.api import SearchEngine

    with floe_errors():
        repository = open_repository(ctx)
        engine = SearchEngine(repository, refuse_unknown_properties=repository.settings.api.refuse_unknown_properties)
        document = engine.queryables(engine.resolve(ref))
    sys.stdout.write(json.dumps(document, indent=2) + "\n")


browser = typer.Typer(
    help="STAC Browser, the web page `floe serve` shows at /browser/ and /refs/{ref}/browser/.",
    no_args_is_help=True,
)
app.add_typer(browser, name="browser")


@browser.command("install")
def browser_install(
    ctx: typer.Context,
    force: Annotated[bool, typer.Option("--force", help="Build again even if a build is there.")] = False,
) -> None:
    """Fetch STAC Browser from the npm registry and build it once for every ref (needs Node.js and npm).

    The build (about 6 MB) goes to api.browser_dir, default ~/.cache/floe/stac-browser/<version>, outside any
    repository; building takes about 3 minutes and 1 GB of node_modules, removed afterwards. Re-running does
    nothing once it is built. `floe serve` picks it up when it starts.
    """
    from ingest.api import browser_home, install_browser

    with floe_errors():
        install_browser(
            browser_home(settings_of(ctx)), force=force, say=lambda line: stderr.print(line, highlight=False)
        )
