"""Garbage collection with Icechunk as the source of truth.

:func:`gc` expires (optionally) and collects Icechunk's garbage, trims ``arrays/overwritten/`` (:mod:`._history`)
and sweeps ``tables/`` of what the live set (:mod:`._live`) does not hold. The steps, and why the grace period makes
gc safe next to writers: docs/lifecycle.md#garbage-collection-floe-gc and docs/design.md §7.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from ingest._faults import fault_point
from ingest.errors import InvalidDuration, RepositoryMoved, UnreadableTableFile
from ingest.lifecycle._history import KEEP_NEWEST, REPO_OBJECT, HistorySweep, sweep_overwritten
from ingest.lifecycle._live import history_pointers, live_table_files
from ingest.lifecycle._store import RootFiles
from ingest.repository import Repository, check_rooted
from ingest.storage import TABLES_DIR

log = logging.getLogger(__name__)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_duration(text: str) -> timedelta:
    """``0s``, ``30m``, ``24h``, ``90d``, ``2w`` -> a timedelta.

    Args:
        text: a number (decimals allowed: ``1.5h``) and a unit, ``s``, ``m``, ``h``, ``d`` or ``w``, spaces around
            either allowed.

    Returns:
        The duration.

    Raises:
        InvalidDuration: ``text`` is not a number followed by one of those units, or reaches back before year 1.
    """
    match = _DURATION.match(text or "")
    if not match:
        raise InvalidDuration(f"duration {text!r} is not a number followed by s, m, h, d or w (e.g. 0s, 30m, 24h, 90d)")
    try:
        duration = timedelta(**{_UNITS[match.group(2)]: float(match.group(1))})
    except OverflowError:
        duration = None
    if duration is None or _before(datetime.now(UTC), duration) is None:
        raise InvalidDuration(f"duration {text!r} reaches back before the calendar begins (year 1)")
    return duration


def _before(now: datetime, duration: timedelta) -> datetime | None:
    """``now - duration``, or None when that is before year 1 (Python's calendar starts there)."""
    try:
        return now - duration
    except OverflowError:
        return None


@dataclass
class GcReport:
    """What a gc run removed (or, in a dry run, would remove)."""

    dry_run: bool
    cutoff: datetime
    """Unreferenced files modified before this were removed."""
    expired_snapshots: int = 0
    icechunk_objects_deleted: int = 0
    icechunk_bytes_deleted: int = 0
    snapshots_in_history: int = 0
    live_files: int = 0
    table_reads: int = 0
    deleted: list[tuple[str, int]] = field(default_factory=list)
    """(path relative to the root, bytes) of each table file removed."""
    kept_young: list[tuple[str, int]] = field(default_factory=list)
    """Unreferenced table files younger than the grace period, left for a later run."""
    history: HistorySweep = field(default_factory=HistorySweep)
    """The replaced versions of ``arrays/repo`` in ``arrays/overwritten/`` removed and kept."""
    repo_bytes: int | None = None
    """Size of ``arrays/repo`` (every ref and the history left) when gc finished."""

    @property
    def bytes_deleted(self) -> int:
        return sum(size for _, size in self.deleted)


def gc(
    repository: Repository,
    *,
    grace: timedelta = timedelta(hours=24),
    expire_older_than: timedelta | None = None,
    dry_run: bool = False,
    keep_newest: int = KEEP_NEWEST,
) -> GcReport:
    """Expire (optionally), collect Icechunk garbage, drop old replaced versions of ``arrays/repo``, then sweep
    ``tables/`` of files no version needs.

    Only files outside the live set (every table file a snapshot in the
    history of a branch or tag needs) and older than ``grace`` are deleted;
    files listed before the live set is computed are the only candidates.
    Icechunk's expiry and collection, and the sweep of ``arrays/overwritten/``,
    run before the table files are walked.

    Args:
        repository: the repository.
        grace: only what is older than this is deleted, by Icechunk's collection and floe's sweeps alike: a writer
            writes its files before its commit lands (default: 24 hours).
        expire_older_than: first expire the Icechunk snapshots written longer ago than this (branch tips and tags
            stay; default: expire nothing). A dry run expires nothing, and leaves out of the live set what expiry
            would drop.
        dry_run: delete nothing; report what would be deleted.
        keep_newest: how many of the newest replaced versions of ``repo`` stay whatever their age.

    Returns:
        What was deleted (or would be) and kept, with sizes; the snapshots expired, the history and live set
        walked.

    Raises:
        RepositoryMoved: the table metadata names another root than the repository's (before anything is
            deleted), or a table file a version needs lies outside this root (no table file is deleted, but
            Icechunk's collection and the sweep of ``arrays/overwritten/`` have run).
        CorruptRepository: the tip that says where the table lives carries no items-table pointer (before
            anything is deleted).
        UnreadableTableFile: a table file a version needs is missing or cannot be parsed (no table file is
            deleted, but Icechunk's collection and the sweep of ``arrays/overwritten/`` have run).
        InvalidDuration: ``grace`` or ``expire_older_than`` reaches back before year 1 (before anything is
            deleted).
        ValueError: ``keep_newest`` is negative (before anything is deleted).
    """
    if keep_newest < 0:
        raise ValueError(f"keep_newest must be 0 or more, not {keep_newest}")
    # A copy whose metadata names another root would make every file here look unreferenced: touch nothing.
    check_rooted(repository)
    now = datetime.now(UTC)
    for name, duration in (("grace", grace), ("expire_older_than", expire_older_than)):
        if duration is not None and _before(now, duration) is None:
            raise InvalidDuration(f"{name} of {duration.days:,} days reaches back before the calendar begins (year 1)")
    cutoff = now - grace
    report = GcReport(dry_run=dry_run, cutoff=cutoff)
    files = RootFiles(repository.location)
    repo = repository.icechunk
    # Listed before the live set is computed: what appears later is never a candidate.
    listed = files.list(TABLES_DIR)

    expire_before = now - expire_older_than if expire_older_than is not None else None
    if expire_before is not None and not dry_run:
        with repository.location.mutation_lock():
            report.expired_snapshots = len(repo.expire_snapshots(expire_before))
        log.info("expired %d snapshot(s) written before %s", report.expired_snapshots, expire_before)
        fault_point("gc.after_expire")
    with repository.location.mutation_lock():
        summary = repo.garbage_collect(cutoff, dry_run=dry_run)
    report.icechunk_objects_deleted = (
        summary.chunks_deleted
        + summary.manifests_deleted
        + summary.snapshots_deleted
        + summary.attributes_deleted
        + summary.transaction_logs_deleted
    )
    report.icechunk_bytes_deleted = summary.bytes_deleted
    fault_point("gc.after_icechunk")
    # Listed after Icechunk's own updates of `repo` (expiry, GC), so their fresh copies count as the newest.
    report.history = sweep_overwritten(files, cutoff, dry_run=dry_run, keep_newest=keep_newest)
    repo_stat = files.stat(REPO_OBJECT)
    report.repo_bytes = repo_stat.size if repo_stat is not None else None

    # A dry run cannot expire, so it leaves out what expiry would drop from history itself.
    pointers = history_pointers(repo, expire_before=expire_before if dry_run else None)
    report.snapshots_in_history = len(pointers)
    try:
        live, report.table_reads = live_table_files(
            repository.io, (repository.absolute_location(pointer) for pointer in pointers.values())
        )
    except UnreadableTableFile as error:
        # Without the whole live set, any deletion could hit a file a version needs.
        raise UnreadableTableFile(
            f"{error}; gc deleted no table file (run `floe check --all` to see which versions are broken)"
        ) from error
    outside = sorted(location for location in live.kinds if files.relative(location) is None)
    if outside:
        # Metadata naming another root (a copy not relocated): this root's files would all look unreferenced.
        raise RepositoryMoved(
            f"{len(outside)} table file(s) a version needs lie outside {repository.location.url} (e.g. "
            f"{outside[0]}); gc deleted no table file. Run `floe --root {repository.location.url} relocate`",
            recorded_root=outside[0],
            root=repository.location.url,
        )
    live_paths = {path for path in (files.relative(location) for location in live.kinds) if path is not None}
    report.live_files = len(live_paths)

    for path, stat in sorted(listed.items()):
        if path in live_paths:
            continue
        if stat.modified is None or stat.modified >= cutoff:
            report.kept_young.append((path, stat.size))
            continue
        report.deleted.append((path, stat.size))
        if not dry_run:
            files.delete(path)
            fault_point("gc.between_deletions")
    log.info(
        "gc %s %d unreferenced table file(s) (%d bytes); %d younger than the grace kept; %d live",
        "would delete" if dry_run else "deleted",
        len(report.deleted),
        report.bytes_deleted,
        len(report.kept_young),
        report.live_files,
    )
    return report
