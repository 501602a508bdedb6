"""Refs and history: what a ref names, the names branches and tags may have, and the commits that lead to a ref.

A ref's history is Icechunk's ancestry of its snapshot, each commit read back
through floe's record in its metadata (``CommitMetadata``): the rows it
added, replaced and deleted, the attempts its commit took, and the table
version it points at. Icechunk's own first snapshot predates the table and
is not part of it. floe makes commits of its own, which change no rows
(the repository's first commit, the groups of new collections, raster
stacks a batch stages under): their messages start ``floe: ``, and ``floe
log`` leaves them out unless asked (:attr:`LogEntry.housekeeping`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

import icechunk

from ingest._faults import fault_point
from ingest.errors import InvalidRefName, RefExists, RefNotFound
from ingest.repository._commit import CommitMetadata
from ingest.stac import shown

if TYPE_CHECKING:
    from ingest.repository._repo import Repository

_REF_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_SNAPSHOT_ID = re.compile(r"^[0-9A-HJKMNP-TV-Z]{20}$")
_KINDS = ("branch", "tag", "snapshot")


def check_ref_name(name: str) -> str:
    """A branch or tag name: letters, digits, '.', '_' and '-', not starting with a symbol."""
    if not _REF_NAME.match(name or "") or ".." in name:
        raise InvalidRefName(
            f"{name!r} is not a valid branch or tag name: use letters, digits, '.', '_' and '-', "
            "starting with a letter or digit (at most 128 characters)"
        )
    return name


def resolve_ref(repository: Repository, ref: str) -> tuple[str, str]:
    """What ``ref`` names: ``("branch" | "tag" | "snapshot", snapshot id)``, looked up in that order.

    A ``branch:``, ``tag:`` or ``snapshot:`` prefix looks up that kind only.
    A branch costs one request, and a snapshot read in this process none, so
    a caller can tell what never changes without listing the branches.

    Raises:
        RefNotFound: no branch, tag or snapshot of that name exists.
    """
    kind, _, name = ref.partition(":") if ref.split(":", 1)[0] in _KINDS else ("", "", ref)
    repo = repository.icechunk
    lookups: dict[str, Callable[[str], str]] = {
        "branch": repo.lookup_branch,
        "tag": repo.lookup_tag,
        "snapshot": lambda snapshot_id: repo.lookup_snapshot(snapshot_id).id,
    }
    if kind == "snapshot" and repository.known.knows(name):
        return kind, name  # read in this process: it exists, and names itself
    order = [kind] if kind else ["branch", "tag"] + (["snapshot"] if _SNAPSHOT_ID.match(name) else [])
    for candidate in order:
        try:
            return candidate, lookups[candidate](name)
        except (icechunk.IcechunkError, KeyError, ValueError):
            continue
    raise RefNotFound(f"no branch, tag or snapshot named {shown(ref)} (see `floe refs`)")


def writable_session(repository: Repository, branch: str) -> icechunk.Session:
    """A writable Icechunk session at the tip of ``branch``.

    Raises:
        RefNotFound: no branch of that name exists.
    """
    try:
        return repository.icechunk.writable_session(branch)
    except icechunk.IcechunkError as error:
        name = branch if len(branch) <= 80 else "NAME"
        raise RefNotFound(f"branch {shown(branch)} does not exist (create it with `floe branch {name}`)") from error


def create_ref(repository: Repository, kind: Literal["branch", "tag"], name: str, at: str | None) -> str:
    """Create branch or tag ``name`` at the snapshot ``at`` resolves to (which must carry a table).

    Returns:
        The snapshot id the new ref points at.

    Raises:
        InvalidRefName: ``name`` is not a valid branch or tag name.
        RefNotFound: ``at`` names no branch, tag or snapshot.
        CorruptRepository: the snapshot carries no items-table pointer.
        RefExists: a ref of that kind and name exists already.
    """
    check_ref_name(name)
    snapshot_id = repository.resolve(at)
    repository.metadata_location_of(snapshot_id)  # refuse a ref to a snapshot without a table
    repo = repository.icechunk
    taken = f"tag {name!r} exists already (tags never move)" if kind == "tag" else f"branch {name!r} exists already"
    if name in (repo.list_tags() if kind == "tag" else repo.list_branches()):
        raise RefExists(taken)
    create = repo.create_tag if kind == "tag" else repo.create_branch
    with repository.location.mutation_lock():
        try:
            fault_point("ref.before_create")
            create(name, snapshot_id)
            fault_point("ref.after_create")
        except icechunk.AlreadyExistsError as error:
            raise RefExists(taken) from error
    return snapshot_id


@dataclass(frozen=True)
class Ref:
    """A named ref and the snapshot it points at."""

    name: str
    kind: str  # "branch" or "tag"
    snapshot_id: str


HOUSEKEEPING_PREFIX = "floe: "
"""How the messages of floe's own commits start (the first commit, groups of collections, raster stacks)."""


@dataclass(frozen=True)
class LogEntry:
    """One commit in a branch's (or any snapshot's) history."""

    snapshot_id: str
    parent_id: str | None
    written_at: datetime
    message: str
    metadata_location: str | None
    rows_added: int = 0
    rows_replaced: int = 0
    attempts: int = 1
    extra: dict[str, Any] = field(default_factory=dict)
    """What else floe's record in the commit holds (see ``CommitMetadata.extra``)."""
    rows_deleted: int = 0

    @property
    def housekeeping(self) -> bool:
        """Whether this is one of floe's own commits, which change no rows: the first commit, and those creating
        collections' groups and raster stacks before a batch stages under them (messages ``floe: ...``)."""
        changed = self.rows_added or self.rows_replaced or self.rows_deleted
        return self.message.startswith(HOUSEKEEPING_PREFIX) and not changed

    def to_json(self) -> dict[str, Any]:
        """The entry as ``floe log --json`` prints it: every field (``extra`` only when it holds something)."""
        document = {**asdict(self), "written_at": self.written_at.isoformat()}
        if not self.extra:
            del document["extra"]
        return document


def history(
    repo: icechunk.Repository,
    snapshot_id: str,
    absolute_location: Callable[[str], str],
    *,
    limit: int | None = None,
    housekeeping: bool = True,
) -> list[LogEntry]:
    """The commits leading to ``snapshot_id``, newest first (floe's, see the module).

    Args:
        repo: the Icechunk repository.
        snapshot_id: where the history ends (a ref resolved).
        absolute_location: turns a commit's table pointer (relative to ``tables/``) into a location.
        limit: at most this many entries.
        housekeeping: also floe's own commits, which change no rows.
    """
    entries: list[LogEntry] = []
    for info in repo.ancestry(snapshot_id=snapshot_id):
        record = CommitMetadata.decode(info.metadata)
        if record is None:
            continue  # Icechunk's own root snapshot predates the table
        entry = LogEntry(
            snapshot_id=info.id,
            parent_id=info.parent_id,
            written_at=info.written_at,
            message=info.message,
            metadata_location=absolute_location(record.items) if record.items is not None else None,
            rows_added=record.rows_added,
            attempts=record.attempts,
            rows_replaced=record.rows_replaced,
            rows_deleted=record.rows_deleted,
            extra=dict(record.extra),
        )
        if housekeeping or not entry.housekeeping:
            entries.append(entry)
        if limit is not None and len(entries) >= limit:
            break
    return entries
