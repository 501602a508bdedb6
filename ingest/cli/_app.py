"""The ``floe`` application, its global options, and what every command shares (errors, consoles, the repository)."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from ingest.errors import FloeError, RepositoryExists, RepositoryNotFound

if TYPE_CHECKING:
    # The repository package brings Icechunk, PyIceberg and zarr (about 2 s), the settings pydantic (0.3 s):
    # commands import them when they run, so `floe --help`, `floe --version` and a usage error answer without.
    from ingest.config import Settings
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
UNWRAPPED_WIDTH = 10_000
"""The width output gets where it is not a terminal: wide enough that no line of floe's is ever wrapped."""


def console(*, to_stderr: bool) -> Console:
    """A console for stdout or stderr: a terminal's width on a terminal; elsewhere (a pipe, a file, a CI log)
    lines are never wrapped, since a summary broken at 80 columns breaks grep and logs (``COLUMNS`` still wins)."""
    stream = sys.stderr if to_stderr else sys.stdout
    if "COLUMNS" in os.environ or stream.isatty():
        return Console(stderr=to_stderr)
    return Console(stderr=to_stderr, width=UNWRAPPED_WIDTH, soft_wrap=True)


stderr = console(to_stderr=True)
stdout = console(to_stderr=False)


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


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``count`` and ``noun`` as one reads them: "1 item", "2 items", "0 items" (``plural``: when not noun + s)."""
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"


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
    from ingest.repository import Repository

    return Repository.open(settings=settings_of(ctx))


def open_or_create_repository(ctx: typer.Context) -> Repository:
    """The repository at the root, created (or its stopped creation completed) where there is none; says so."""
    from ingest.repository import Repository

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


def _version(asked: bool) -> None:
    if asked:
        from importlib.metadata import PackageNotFoundError, version

        try:
            number = version("floe")
        except PackageNotFoundError:  # a checkout run without being installed
            number = "unknown (not installed)"
        stdout.print(f"floe {number}", highlight=False)
        raise typer.Exit()


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
    version: Annotated[
        bool,
        typer.Option("--version", is_eager=True, help="Print floe's version and exit.", callback=_version),
    ] = False,
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
        from ingest.config import load_settings

        settings = load_settings(root=root)
    except ValueError as error:
        fail(f"invalid settings: {error}")
    ctx.obj = {"settings": settings}
