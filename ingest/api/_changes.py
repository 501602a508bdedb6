"""Deleting the items a search names (``floe delete``): chosen at one snapshot, committed on its branch.

The items are chosen by the search engine at the writer's base: by ids (with
or without collections) or by a CQL2 filter. A deletion by ids deletes
whatever version of each item the branch holds when the commit lands. A
deletion by filter holds only for the versions the filter matched
(``Writer.delete_item(..., if_unchanged=True)``): when a concurrent commit
changed one of them, the writer refuses, and the deletion is chosen again at
the new tip (the filter may no longer match), a few times at most (any other
refusal is re-planned the same way). Nothing is ever merged blindly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ingest.api._request import SearchRequest
from ingest.api._search import SearchEngine
from ingest.errors import CommitConflict, InvalidInput

if TYPE_CHECKING:
    from ingest.repository import CommitResult, Repository

Key = tuple[str, str]

REPLANS = 5
"""How often a deletion by filter is chosen again after concurrent commits changed the items it chose."""


@dataclass(frozen=True)
class Deletion:
    """What a deletion chose and did."""

    branch: str
    keys: tuple[Key, ...]
    """(collection, id) of the items chosen, at the snapshot the deletion was (last) planned on."""
    snapshot_id: str
    """That snapshot (the base of the commit, or what a dry run looked at)."""
    missing_ids: tuple[str, ...] = ()
    """Ids asked for (``ids``) that no collection searched holds."""
    result: CommitResult | None = None
    """The commit; None for a dry run, or when nothing was chosen."""
    replans: int = 0
    """How often the items were chosen again because concurrent commits changed them."""


def delete_items(
    repository: Repository,
    *,
    branch: str | None = None,
    ids: Sequence[str] | None = None,
    collections: Sequence[str] | None = None,
    filter: str | dict[str, Any] | None = None,
    filter_lang: str | None = None,
    dry_run: bool = False,
    message: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> Deletion:
    """Delete the items ``ids`` and/or ``filter`` choose (in ``collections``) from ``branch``, in one commit.

    The items are chosen at the tip of ``branch``; when a concurrent commit
    makes the commit refuse (by filter: it changed an item chosen), they are
    chosen again at the new tip, at most :data:`REPLANS` times.

    Args:
        repository: the repository.
        branch: the branch to delete from (default: the configured branch).
        ids: the ids of the items to delete; an id no collection searched holds is reported, not an error.
        collections: delete only items of these collections (default: every collection).
        filter: a CQL2 filter choosing the items, as text or CQL2 JSON (a dict, or text with ``filter_lang``
            ``cql2-json``); ``true`` chooses every item of ``collections``; an empty one (``""`` or ``{}``) is
            refused. With ``ids`` too, an item must match both.
        filter_lang: ``cql2-text`` or ``cql2-json`` (default: ``cql2-json`` for a dict, else ``cql2-text``).
        dry_run: choose the items and commit nothing.
        message: the commit message (default: ``delete N item(s)``).
        progress: called with the number of items chosen so far, as they are found.

    Returns:
        The branch, the items chosen and the snapshot they were chosen at, the ids not found, the commit (None for
        a dry run, or when nothing was chosen), and how often the items were chosen again.

    Raises:
        InvalidInput: neither ``ids`` nor ``filter`` is given, or ``filter`` is empty (deleting a whole collection
            takes an explicit filter such as ``true``).
        RefNotFound: no branch ``branch`` exists.
        CollectionNotFound: a collection of ``collections`` is not at the tip of ``branch``.
        InvalidSearch: ``filter`` cannot be parsed, is too long or too deeply nested, or is not valid CQL2 (an
            unknown operator, a wrong number of arguments, a bad geometry), or ``filter_lang`` is neither
            ``cql2-text`` nor ``cql2-json``; the message names what is wrong.
        CommitConflict: the commit was refused :data:`REPLANS` + 1 times in a row.
        ConflictRetriesExhausted: the commit lost ``commit.max_attempts`` races in a row.
    """
    if filter is not None and (filter == {} or (isinstance(filter, str) and not filter.strip())):
        # An empty filter chooses nothing to a reader of the command, and everything to a search: refuse it.
        raise InvalidInput("the filter is empty: give a CQL2 expression (`true` deletes every item of the collections)")
    if not ids and filter is None:
        raise InvalidInput("say which items to delete: ids, or a filter (`true` deletes every item of the collections)")
    branch = branch or repository.settings.branch
    engine = SearchEngine(repository, max_limit=repository.settings.api.max_limit)
    conditional = filter is not None
    replans = 0
    while True:
        writer = repository.writer(branch)
        base = writer.session.snapshot_id
        request = SearchRequest(
            collections=list(collections) if collections else None,
            ids=list(ids) if ids else None,
            filter=filter,
            filter_lang=filter_lang,
            limit=repository.settings.api.max_limit,
        )
        keys: list[Key] = []
        for item in engine.iter_items(request, base):
            keys.append((item["collection"], item["id"]))
            if progress is not None:
                progress(len(keys))
        found_ids = {item_id for _, item_id in keys}
        missing = tuple(item_id for item_id in dict.fromkeys(ids or ()) if item_id not in found_ids)
        if dry_run or not keys:
            return Deletion(branch, tuple(keys), base, missing, None, replans)
        if conditional:
            writer.stored_items(keys)  # the versions the filter matched: only they may go
        for collection, item_id in keys:
            writer.delete_item(collection, item_id, if_unchanged=conditional)
        try:
            result = writer.commit(message or f"delete {len(keys):,} item(s)")
        except CommitConflict:
            if replans >= REPLANS:
                raise
            replans += 1
            continue
        return Deletion(branch, tuple(keys), base, missing, result, replans)
