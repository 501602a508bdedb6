"""``--prune``: an ingest that mirrors its sources deletes the items they no longer hold.

The run notes every item its sources hold (valid or not, when its key is
known) and every collection they name. Once the sources are read, the items
of those collections that the branch holds and the sources do not are
deleted, rows and arrays, in the run's last commit, beside its last
additions. A source that could not be read, or an item whose key could not be
told, might be an item the source still holds: then nothing is pruned, and
the report says why (as ``rsync --delete`` skips deletion after an I/O error).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from pyiceberg.expressions import In

from ingest.pipeline._report import IngestReport
from ingest.pipeline._seen import SeenKeys
from ingest.repository import Repository

Key = tuple[str, str]


@dataclass
class SourceScope:
    """What a run's sources hold, as far as pruning needs to know."""

    seen: SeenKeys = field(default_factory=SeenKeys)
    """(collection, id) of every item read with a key, and the source it came from (outside Python's heap)."""
    collections: set[str] = field(default_factory=set)
    """Collections the sources name (their items' and their collection documents')."""
    refused: set[Key] = field(default_factory=set)
    """Keys of items refused as invalid: the sources still hold them, so their stored versions stay."""
    unknown: list[str] = field(default_factory=list)
    """Sources that could not be read, or held an item whose key could not be told."""

    def note_unkeyed(self, source: str, item: object, default_collection: str | None) -> None:
        """An item refused as invalid: its stored version stays if its key can be told, else nothing is pruned."""
        if isinstance(item, dict):
            item_id, collection = item.get("id"), item.get("collection") or default_collection
            if isinstance(item_id, str) and isinstance(collection, str):
                self.refused.add((collection, item_id))
                return
        self.unknown.append(source)

    def prune_keys(self, repository: Repository, branch: str) -> list[Key]:
        """The items of the named collections that ``branch`` holds and the sources do not."""
        collections = self.collections | self.seen.collections | {collection for collection, _ in self.refused}
        if not collections:
            return []
        view = repository.view(branch)
        gone: list[Key] = []
        for batch in view.batches(In("collection", sorted(collections)), columns=["collection", "id"]):
            keys = list(zip(batch.column("collection").to_pylist(), batch.column("id").to_pylist(), strict=True))
            held = self.seen.contains(keys)
            gone.extend(key for key, known in zip(keys, held, strict=True) if not known and key not in self.refused)
        return sorted(gone)


def prune_keys(repository: Repository, branch: str, scope: SourceScope, report: IngestReport) -> list[Key]:
    """What ``--prune`` deletes once the sources are read; nothing (the reason in ``report``) if some could not be."""
    if scope.unknown:
        first = scope.unknown[0]
        report.prune_skipped = (
            f"{len(scope.unknown)} input(s) could not be read or told apart (first: {first}); "
            "nothing was pruned: an unreadable input may hold items the sources still have"
        )
        return []
    return scope.prune_keys(repository, branch)


def with_last[T](values: Iterable[T]) -> Iterator[tuple[T, bool]]:
    """Each value and whether it is the last one (known once the next one is read)."""
    iterator = iter(values)
    try:
        current = next(iterator)
    except StopIteration:
        return
    for following in iterator:
        yield current, False
        current = following
    yield current, True
