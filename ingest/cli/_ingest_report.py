"""What an ingest tells while it runs and when it ends: the progress bar, the summary line, each search's line."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.markup import escape

from ingest.cli._app import counted, progress_bar, stderr


@contextmanager
def ingest_progress(label: str) -> Iterator[Any]:
    """A progress bar for an ingest run: granules done of those read so far, items/s, commits, rejections, MB copied.

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
                    f"{rate:,.0f} items/s · {counted(len(state.commits), 'commit')} · "
                    f"{len(state.rejected)} rejected · {state.bytes_written / 1e6:,.1f} MB copied"
                ),
            )

        yield update


def summary(result: Any) -> str:
    tip = result.commits[-1].snapshot_id if result.commits else "no new snapshot"
    retried = result.conflicts_retried
    return (
        f"ingested {counted(result.rows_added, 'item')} in {counted(len(result.commits), 'commit')} ({tip}): "
        f"{result.rows_added - result.replaced} new, {result.replaced} replaced, {result.skipped} unchanged; "
        f"{result.bytes_written / 1e6:.1f} MB of pixels copied"
        + (
            f", {counted(result.virtual, 'granule')} referenced in place ({len(result.fallbacks)} copied)"
            if result.virtual or result.fallbacks
            else ""
        )
        + f"; {len(result.rejected)} rejected"
        + (
            f"; {counted(retried, 'commit')} retried after another writer's commit landed first (nothing lost)"
            if retried
            else ""
        )
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


def report_search(search: Any) -> None:
    """One line per STAC API search: what it asked for and how far it read."""
    since = f" updated since {search.since.isoformat()}" if search.since is not None else ""
    lanes = f" in {len(search.lanes_read)} lanes" if search.lanes_read else ""
    state = "read to its end" if search.complete else "NOT read to its end (no cursor recorded)"
    stderr.print(f"{escape(search.key)}{since}: {search.items} items{lanes}, {state}", highlight=False, soft_wrap=True)
    if search.note:
        stderr.print(f"[yellow]note[/] {escape(search.note)}", highlight=False, soft_wrap=True)
