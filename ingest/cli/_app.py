"""The ``floe`` application, its global options, and what every command shares (errors, consoles, the repository)."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from ingest.config import Settings, load_settings
from ingest.errors import FloeError, RepositoryExists, RepositoryNotFound
from ingest.repository import Repository

EXIT_ERROR = 1
EXIT_REJECTED = 3
EXIT_PROBLEMS = 4
EXIT_INTERRUPTED = 130
"""Ctrl-C, as shells report a command that SIGINT ended (128 + 2)."""

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


def progress_bar(label: str) -> Progress:
    """The progress bar of a long command, on stderr (gone when it ends): label, bar, done of total, detail, time."""
    return Progress(
        SpinnerColumn(),
        TextColumn(f"[bold]{label}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=stderr,
        transient=True,
    )


def fail(message: str, code: int = EXIT_ERROR) -> NoReturn:
    stderr.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


INTERRUPTED = "commits made before stay, and nothing half-written is visible"


@contextmanager
def floe_errors(interrupted: str = INTERRUPTED) -> Iterator[None]:
    """Render floe's own errors as one clear line and a non-zero exit; Ctrl-C as ``interrupted`` says (what the
    command leaves behind), not a traceback."""
    try:
        yield
    except FloeError as error:
        fail(str(error))
    except KeyboardInterrupt:
        stderr.print(f"[bold yellow]interrupted:[/] {interrupted}", highlight=False)
        raise typer.Exit(EXIT_INTERRUPTED) from None


def settings_of(ctx: typer.Context) -> Settings:
    return ctx.obj["settings"]


def open_repository(ctx: typer.Context) -> Repository:
    return Repository.open(settings=settings_of(ctx))


def open_or_create_repository(ctx: typer.Context) -> Repository:
    """The repository at the root, created (or its stopped creation completed) where there is none; says so."""
    try:
        return open_repository(ctx)
    except RepositoryNotFound:
        pass
    try:
        repository = Repository.create(settings=settings_of(ctx))
    except RepositoryExists:
        return open_repository(ctx)  # another process created it meanwhile
    stderr.print(f"created a floe repository at [bold]{repository.location.url}[/]")
    return repository


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
            fail(f"config file {config} does not exist")
        os.environ["FLOE_CONFIG"] = str(config)
    logging.basicConfig(
        level=[logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)],
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        settings = load_settings(root=root)
    except ValueError as error:
        fail(f"invalid settings: {error}")
    ctx.obj = {"settings": settings}
