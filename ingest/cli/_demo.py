"""``floe demo``: a sample archive made, ingested with Ray and tagged, and what to try next."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Annotated

import typer

from ingest.cli._app import EXIT_REJECTED, app, floe_errors, open_or_create_repository, stderr
from ingest.cli._ingest_report import ingest_progress, summary

DEMO_PLACES = 4
"""The demo's grid positions a collection: its 40 granules make 12 grids of 3 or 4 dates each."""


def invocation() -> str:
    """How to call floe from here: ``floe`` when that is this floe on the PATH, else the path of this
    environment's ``floe`` (``.venv/bin/floe`` after ``bash scripts/setup.sh``, its environment not activated)."""
    here = Path(sys.executable).parent / "floe"
    found = shutil.which("floe")
    if found is not None and Path(found).resolve() == here.resolve():
        return "floe"
    if not here.exists():
        return "floe"
    try:
        relative = os.path.relpath(here)
    except ValueError:  # another drive (Windows)
        return str(here)
    return str(here) if relative.startswith("..") else relative


@app.command()
def demo(
    ctx: typer.Context,
    granules: Annotated[int, typer.Option("--granules", min=1, help="Granules in the sample archive.")] = 40,
    archive: Annotated[
        Path, typer.Option("--archive", help="Where to write the sample archive (COGs + STAC items).")
    ] = Path("floe-demo-archive"),
    workers: Annotated[int, typer.Option("--workers", "-w", min=1, help="Ray actors.")] = 2,
    places: Annotated[
        int,
        typer.Option(
            "--places",
            min=1,
            help="Grid positions each collection's granules take in turn: later granules revisit a grid on "
            "another date, so its stack is a time series.",
        ),
    ] = DEMO_PLACES,
) -> None:
    """Generate a small sample archive, ingest it with Ray, tag it v1, and say what to run next."""
    from ingest.errors import RefExists
    from ingest.pipeline import ingest_with_ray
    from ingest.sample import make_archive

    with floe_errors():
        items = make_archive(archive, granules=granules, seed=0, places=places)
        stderr.print(f"wrote {len(items)} COG granules with STAC items to [bold]{archive}[/]")
        repository = open_or_create_repository(ctx)
        with ingest_progress("demo") as update:
            result = ingest_with_ray(repository, [archive], workers=workers, batch_size=10, progress=update)
        try:
            repository.tag("v1")
            tagged = "tagged the result [bold]v1[/]"
        except RefExists:
            tagged = "tag v1 exists already (tags never move)"
    root = repository.location.url
    floe = invocation()
    stderr.print(
        f"{summary(result)}\ninto {root}; {tagged}\n\n"
        "Next:\n"
        f"  {floe} log                          # the commits, with the refs at each\n"
        f"  {floe} export --ref v1 items.ndjson # the items of v1\n"
        f"  {floe} check --all                  # every ref's files are there\n"
        f"  {floe} search --ref v1 --collections sample-dem --max-items 3   # matching items as NDJSON\n"
        f"  {floe} serve                        # a STAC API on http://127.0.0.1:8080 (v1 at /refs/v1/)\n"
        f"  {floe} ingest {archive}   # again: nothing changed, so nothing is committed\n"
        f"  {floe} serve, then open http://127.0.0.1:8080/refs/v1/browser/   # STAC Browser "
        f"(after {floe} browser install)\n"
        "  # pixels at v1, from Python (one granule, then a search's granules stacked by grid and time):\n"
        f"  #   import ingest; view = ingest.Repository.open({root!r}).view('v1')\n"
        "  #   view.item_arrays('sample-optical', 'sample-optical-0000')\n"
        f"  #   ingest.open_search({root!r}, 'v1', collections=['sample-optical'])",
        highlight=False,
        soft_wrap=True,
    )
    if result.rejected:
        raise typer.Exit(EXIT_REJECTED)
