"""``floe delete``: items leave a branch, rows and arrays together, in one commit."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ingest.cli._app import app, fail, floe_errors, open_repository, progress_bar, stderr


def _ids_of(ids: str | None, ids_from: Path | None) -> list[str]:
    chosen = [value.strip() for value in ids.split(",") if value.strip()] if ids else []
    if ids_from is not None:
        if not ids_from.is_file():
            fail(f"--ids-from file {ids_from} does not exist", code=2)
        chosen += [line.strip() for line in ids_from.read_text().splitlines() if line.strip()]
    return list(dict.fromkeys(chosen))


@app.command()
def delete(  # noqa: PLR0917 - typer maps parameters to options
    ctx: typer.Context,
    branch: Annotated[str | None, typer.Option("--branch", "-b", help="The branch (default: main).")] = None,
    ids: Annotated[str | None, typer.Option("--ids", help="Comma-separated item ids.")] = None,
    ids_from: Annotated[
        Path | None, typer.Option("--ids-from", help="A file of item ids, one per line.", show_default=False)
    ] = None,
    filter_text: Annotated[
        str | None, typer.Option("--filter", help="A CQL2 filter: delete the items it matches ('true': all of them).")
    ] = None,
    filter_lang: Annotated[str, typer.Option("--filter-lang", help="cql2-text or cql2-json.")] = "cql2-text",
    collections: Annotated[
        str | None, typer.Option("--collections", help="Comma-separated collection ids (default: every collection).")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List the items that would go (collection<TAB>id), delete nothing.")
    ] = False,
    message: Annotated[str | None, typer.Option("--message", "-m", help="The commit message.")] = None,
) -> None:
    """Delete items from a branch: their rows and their arrays leave in one commit.

    Choose them by id (--ids, --ids-from) or by a CQL2 filter (--filter), in
    some collections or all. Tags and older snapshots keep everything
    (`floe gc` reclaims the files once no ref needs them). An id the branch
    does not hold is reported, and the rest are deleted. Safe next to running
    writers: a deletion by id removes whatever version of an item the branch
    holds when it lands; a deletion by filter removes only the versions the
    filter matched, and chooses again when another writer changed them.
    """
    from ingest.api import delete_items

    chosen_ids = _ids_of(ids, ids_from)
    if not chosen_ids and filter_text is None:
        fail("say which items to delete: --ids, --ids-from or --filter", code=2)
    with floe_errors():
        repository = open_repository(ctx)
        with progress_bar("choosing" if not dry_run else "listing") as progress:
            task = progress.add_task("", total=len(chosen_ids) or None)
            deletion = delete_items(
                repository,
                branch=branch,
                ids=chosen_ids or None,
                collections=[value for value in collections.split(",") if value] if collections else None,
                filter=filter_text,
                filter_lang=filter_lang,
                dry_run=dry_run,
                message=message,
                progress=lambda count: progress.update(task, completed=count),
            )
    for item_id in deletion.missing_ids:
        stderr.print(f"not found: {item_id}", highlight=False)
    if dry_run:
        for collection, item_id in deletion.keys:
            typer.echo(f"{collection}\t{item_id}")
        stderr.print(f"would delete {len(deletion.keys):,} item(s) from {deletion.branch}", highlight=False)
        return
    result = deletion.result
    if result is None:
        stderr.print(f"nothing to delete on {deletion.branch}", highlight=False)
        return
    for collection, item_id in result.not_found:
        stderr.print(f"not found when the commit landed: {item_id} ({collection})", highlight=False)
    stderr.print(
        f"deleted {result.rows_deleted:,} item(s) and {result.slices_deleted:,} array slice(s); committed "
        f"{result.snapshot_id} on {result.branch} in {result.attempts} attempt(s)"
        + (f", chosen again {deletion.replans} time(s) after concurrent changes" if deletion.replans else ""),
        highlight=False,
    )
