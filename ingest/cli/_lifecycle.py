"""Lifecycle commands: ``floe init``, ``floe check``, ``floe gc``, ``floe replicate``, ``floe relocate``,
``floe optimize``."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ingest.cli._app import (
    EXIT_PROBLEMS,
    app,
    fail,
    floe_errors,
    open_repository,
    progress_bar,
    settings_of,
    stderr,
    stdout,
)
from ingest.errors import InvalidInput

if TYPE_CHECKING:
    from ingest.config import Settings


@app.command()
def init(
    ctx: typer.Context,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help=(
                "Where an earlier creation stopped (Icechunk's repository is there without floe's first commit), "
                "remove what it wrote and start anew instead of completing it. A complete repository is never "
                "removed."
            ),
        ),
    ] = False,
) -> None:
    """Create an empty repository at the root (an Icechunk repository and an empty items table).

    A root where an earlier creation stopped (a crash, a store that refused a write) is completed. Nothing is
    written when the store cannot be reached or its bucket does not exist.
    """
    with floe_errors():
        from ingest.repository import Repository

        repository = Repository.create(settings=settings_of(ctx), force=force)
    stderr.print(f"created a floe repository at [bold]{repository.location.url}[/]")


@app.command()
def check(
    ctx: typer.Context,
    ref: Annotated[str | None, typer.Option("--ref", help="The ref to check (default: main).")] = None,
    all_refs: Annotated[bool, typer.Option("--all", help="Check every branch and tag.")] = False,
    deep: Annotated[
        bool,
        typer.Option(
            "--deep",
            help="Also compare data file and manifest sizes with the sizes the table records, the id sketches "
            "with the files' ids, and check that every row's pieces are slots holding its id and every occupied "
            "slot belongs to a row; referenced sources must still be there (remote ones unchanged).",
        ),
    ] = False,
) -> None:
    """Verify that a ref's (or every ref's) table pointer resolves and every file it references exists.

    Exits with status 4 and lists the problems if anything is wrong.
    """
    from ingest.lifecycle import check as run_check

    if ref is not None and all_refs:
        fail("give --ref or --all, not both", code=2)
    with floe_errors():
        problems = run_check(open_repository(ctx), ref, all_refs=all_refs, deep=deep)
    for problem in problems:
        stdout.print(f"[red]problem[/] {problem}", highlight=False, soft_wrap=True)
    if problems:
        stderr.print(f"{len(problems)} problem(s) found")
        raise typer.Exit(EXIT_PROBLEMS)
    stderr.print(
        "ok: every pointer resolves and every referenced file exists"
        + (" with its recorded size, and every row's arrays exist" if deep else "")
    )


def _human_bytes(count: int) -> str:
    """Bytes in binary units, named as such (1 KiB = 1,024 B)."""
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
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

    Also deletes the copies of Icechunk's `repo` object that every commit
    leaves in arrays/overwritten/ once they are older than --grace (the newest
    10 stay): Icechunk reads them only to list its operations log beyond the
    newest 1,000 entries, and they grow with the square of the commits.
    """
    from ingest.lifecycle import gc, parse_duration

    with floe_errors():
        grace_period = parse_duration(grace)
        expire = parse_duration(expire_older_than) if expire_older_than is not None else None
        report = gc(open_repository(ctx), grace=grace_period, expire_older_than=expire, dry_run=dry_run)
    verb = "would delete" if dry_run else "deleted"
    if dry_run:
        # Table files only, as before (scripts read these lines); arrays/overwritten/ is counted in the summary.
        for path, size in report.deleted:
            typer.echo(f"{path}\t{size}")  # plain tab-separated lines, for scripts
    if expire is not None:
        stderr.print(
            "expiry skipped in a dry run (the live set leaves out what it would drop)"
            if dry_run
            else f"expired {report.expired_snapshots} Icechunk snapshot(s)",
            highlight=False,
        )
    history = report.history
    repo_size = "" if report.repo_bytes is None else f"; arrays/repo is {_human_bytes(report.repo_bytes)}"
    stderr.print(
        f"icechunk: {verb} {report.icechunk_objects_deleted} object(s), {_human_bytes(report.icechunk_bytes_deleted)}\n"
        f"arrays/overwritten: {verb} {len(history.deleted)} replaced version(s) of arrays/repo, "
        f"{_human_bytes(history.bytes_deleted)}; kept {len(history.kept_young)} younger than {grace} "
        f"and {len(history.kept_newest)} of the newest{repo_size}\n"
        f"tables: {verb} {len(report.deleted)} unreferenced file(s), {_human_bytes(report.bytes_deleted)}; "
        f"kept {len(report.kept_young)} younger than {grace}; {report.live_files} live file(s) "
        f"in {report.snapshots_in_history} snapshot(s) of history",
        highlight=False,
    )


@app.command("replicate")
def replicate_command(  # noqa: PLR0917 - typer passes options as arguments
    ctx: typer.Context,
    source: Annotated[str, typer.Argument(help="The repository to copy: a path or s3://bucket/prefix.")],
    target: Annotated[str, typer.Argument(help="Where the copy lives: a path or s3://bucket/prefix.")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count what would be copied; write nothing.")] = False,
    refs: Annotated[
        str | None,
        typer.Option(
            "--refs", help="Only these branches and tags, comma-separated (default: all).", show_default=False
        ),
    ] = None,
    history: Annotated[
        str,
        typer.Option(
            "--history",
            help="full: every ref's whole history (a mirror; time travel works on the target). "
            "none: each ref's current version only, as one more snapshot of the target's own history "
            "(far smaller; `floe log` on the target names the source snapshot each one reproduces).",
        ),
    ] = "full",
    prune: Annotated[
        bool, typer.Option("--prune", help="Remove refs from the target that the source no longer has.")
    ] = False,
    dst_config: Annotated[
        Path | None,
        typer.Option(
            "--dst-config",
            help="A TOML settings file whose \\[s3] section reaches the target (another S3 service, "
            "its own credentials); default: the source's settings.",
            show_default=False,
        ),
    ] = None,
    dst_s3_endpoint: Annotated[
        str | None,
        typer.Option("--dst-s3-endpoint", help="The target's S3 endpoint URL (over --dst-config).", show_default=False),
    ] = None,
) -> None:
    """Copy a repository to another root (local or S3, between two S3 services); later runs copy only what is new.

    The source's refs are captured once, so a source being written is copied
    at one consistent version. With --history full, Icechunk objects are
    copied byte for byte, Iceberg metadata is rewritten for the target root,
    the target is verified, and the refs move last: a reader of the target
    never sees a half-copied version. With --history none, each chosen ref's
    current arrays and table version become one commit on the target (only
    what changed since the version it has), each ref moving atomically.
    Objects stream through memory, never through a local copy. The target is
    a replica: commits made to it are overwritten (full) or left behind (none)
    by the next run. Refs the source deleted are reported; --prune removes
    them from the target.
    """
    from ingest.lifecycle import replicate

    if history not in ("full", "none"):
        fail(f"--history is full or none, not {history!r}", code=2)
    names = [name.strip() for name in refs.split(",") if name.strip()] if refs is not None else None
    if names is not None and not names:
        fail("--refs names no ref", code=2)
    settings = settings_of(ctx)
    with floe_errors():
        target_settings = _target_settings(settings, dst_config, dst_s3_endpoint)
        report = replicate(
            source,
            target,
            settings,
            dry_run=dry_run,
            refs=names,
            history=history,
            prune=prune,
            target_settings=target_settings,
        )
    for what, refs_of in (
        ("moved (not a descendant of the target's version)", report.moved),
        ("gone from the source, kept (--prune removes it)", report.gone),
        ("gone from the source, removed" if not dry_run else "would be removed", report.removed),
    ):
        for ref in refs_of:
            stderr.print(f"{ref}: {what}", highlight=False)
    verb = "would copy" if dry_run else "copied"
    chunks = f", {report.chunks_copied} chunk(s)" if history == "none" else ""
    updated = f"; new version(s) of {', '.join(report.updated) or 'no ref'}" if history == "none" else ""
    stderr.print(
        f"{verb} {len(report.copied)} file(s){chunks} and {'would rewrite' if dry_run else 'rewrote'} "
        f"{len(report.rewritten)} table metadata file(s), {_human_bytes(report.bytes_written)}; "
        f"{report.branches} branch(es), {report.tags} tag(s), {report.snapshots} snapshot(s){updated} "
        + ("(dry run: nothing written)" if dry_run else f"now at {report.target}"),
        highlight=False,
    )


def _target_settings(settings: Settings, dst_config: Path | None, endpoint: str | None) -> Settings | None:
    """The settings that reach the target: the source's, with the S3 section of ``dst_config`` and ``endpoint``."""
    from ingest.config import S3Settings

    if dst_config is None and endpoint is None:
        return None
    s3 = S3Settings()
    if dst_config is not None:
        if not dst_config.exists():
            raise InvalidInput(f"--dst-config {dst_config} does not exist")
        from pydantic import ValidationError

        from ingest.errors import InvalidSettings

        try:
            with dst_config.open("rb") as stream:
                s3 = S3Settings.model_validate(tomllib.load(stream).get("s3", {}))
        except (tomllib.TOMLDecodeError, ValidationError) as error:
            reason = " ".join(str(error).split())[:400]
            raise InvalidSettings(f"--dst-config {dst_config} is not a floe settings file: {reason}") from None
    if endpoint is not None:
        s3 = s3.model_copy(update={"endpoint_url": endpoint})
    return settings.model_copy(update={"s3": s3})


@app.command("relocate")
def relocate_command(
    ctx: typer.Context,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List the files that would be rewritten.")] = False,
) -> None:
    """Make a copied or moved repository work where it is now (after cp -a, mv or a bucket sync).

    Iceberg's metadata records absolute locations, which still name the old
    root after a copy; until they are rewritten floe refuses the repository
    (reads would read the old root, gc would delete this root's files). This
    rewrites the table metadata of every version in place, for this root: the
    manifests, manifest lists and metadata.json files (data files and
    Icechunk objects are not touched, nor is the old root). Safe to run again
    after an interruption; a repository already at home is left as it is.
    """
    from ingest.lifecycle import relocate
    from ingest.repository import Repository

    with floe_errors():
        repository = Repository.open(settings=settings_of(ctx), moved_ok=True)
        report = relocate(repository, dry_run=dry_run)
    if report.old_root is None:
        stderr.print(f"nothing to do: the table metadata already names {report.root}", highlight=False)
        return
    if dry_run:
        for path, _ in report.rewritten:
            typer.echo(path)
    verb = "would rewrite" if dry_run else "rewrote"
    stderr.print(
        f"{verb} {len(report.rewritten)} table metadata file(s) from {report.old_root} to {report.root}"
        + ("" if dry_run else "; every ref checks"),
        highlight=False,
    )


@app.command("optimize")
def optimize_command(
    ctx: typer.Context,
    branch: Annotated[str | None, typer.Option("--branch", "-b", help="The branch to compact (default: main).")] = None,
    collections: Annotated[
        list[str] | None,
        typer.Option("--collection", "-c", help="Only this collection (repeat for more).", show_default=False),
    ] = None,
    only_due: Annotated[
        bool,
        typer.Option(
            "--only-due",
            help="Only partitions past the thresholds of \\[optimize] (what runs after each ingest), "
            "instead of making every partition one clustered run.",
        ),
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List the partitions that would be compacted.")] = False,
) -> None:
    """Compact the items table: rewrite each partition's files as a few files clustered by place and time.

    Every ingest batch is its own file per (collection, month), spanning
    wherever its items lie, so searches by area read most of them. This rewrites
    a partition's files sorted along a Hilbert curve of the footprints' centres
    (then by datetime), split into files of \\[optimize] target_file_rows rows,
    each covering a small area, in one commit (an Iceberg `replace`). Safe next
    to running writers: their appends stay, and a partition whose rows another
    writer replaced meanwhile is compacted again from that version. Older tags
    keep their files until `floe gc`. Runs again do nothing when nothing changed.
    """
    with floe_errors():
        repository = open_repository(ctx)
        due = repository.optimize(branch, full=not only_due, collections=collections, dry_run=True)
        if dry_run or not due.selections:
            for selection in due.selections:
                collection, month = selection.label.rsplit("/", 1)
                files = len(selection.sources)
                typer.echo(f"{collection}\t{month}\t{files} files\t{selection.rows} rows\t{selection.size} bytes")
            rows = sum(selection.rows for selection in due.selections)
            stderr.print(
                f"{'would compact' if due.selections else 'nothing to compact:'} {len(due.selections)} partition(s), "
                f"{due.files_before} file(s), {rows:,} rows on {due.branch}",
                highlight=False,
            )
            return
        with progress_bar("optimize") as progress:
            task = progress.add_task("", total=len(due.selections))
            result = repository.optimize(
                branch,
                full=not only_due,
                collections=collections,
                progress=lambda part: progress.update(task, advance=1, description=part.label),
            )
    summary = result.summary
    if summary is None:
        stderr.print("nothing to compact (another writer compacted meanwhile)", highlight=False)
        return
    stderr.print(
        f"compacted {len(summary.partitions)} partition(s), {summary.rows:,} rows: {summary.files_before} file(s), "
        f"{_human_bytes(summary.bytes_before)} -> {summary.files_after} file(s), {_human_bytes(summary.bytes_after)}; "
        f"committed {result.snapshot_id} on {result.branch} in {result.attempts} attempt(s)"
        + (f", {summary.replanned} partition(s) re-planned after concurrent changes" if summary.replanned else ""),
        highlight=False,
    )
