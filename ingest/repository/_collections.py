"""A repository's STAC Collections: each kept in the attributes of its collection's group, so it versions with
the items and arrays; and which collections have stacks (arrays were written to them).

One walk of the root's groups at a ref gives both (:func:`collection_groups`): the API's collections and the
``floe:store`` asset it adds to collections with stacks (``ingest.stac._served``) come from the same listing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ingest.errors import InvalidCollection
from ingest.stac import STACKS

if TYPE_CHECKING:
    from ingest.repository._repo import Repository

COLLECTION_ATTR = "stac:collection"


@dataclass(frozen=True)
class CollectionGroups:
    """What the root's groups hold at one ref."""

    documents: dict[str, dict[str, Any]]
    """Collection id -> the STAC Collection stored with its group."""
    stacked: frozenset[str]
    """The ids of the collections whose group holds stacks."""


def store_collection(repository: Repository, collection: dict[str, Any], branch: str | None) -> str | None:
    """Keep ``collection`` in its group's attributes on ``branch``; the snapshot committed, or None if the group
    held it already (:meth:`Repository.store_collection`)."""
    from ingest.stac import check_name

    try:
        collection_id = check_name(collection.get("id"), "collection id")
    except ValueError as error:
        raise InvalidCollection(f"STAC Collection refused: {error}") from None
    return repository.ensure_groups(
        [collection_id], branch=branch, attributes={collection_id: {COLLECTION_ATTR: collection}}
    )


def collection_groups(repository: Repository, ref: str | None) -> CollectionGroups:
    """The collections stored at ``ref`` and those with stacks, from one walk of the root's groups."""
    documents: dict[str, dict[str, Any]] = {}
    stacked = set()
    for name, group in repository.view(ref).arrays().groups():
        stored = group.attrs.get(COLLECTION_ATTR)
        if isinstance(stored, Mapping):
            documents[name] = dict(stored)
        if STACKS in group:
            stacked.add(name)
    return CollectionGroups(documents, frozenset(stacked))
