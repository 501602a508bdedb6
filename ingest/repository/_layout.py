"""What a repository's root group records about its arrays: the layout version, and the tiling of its stacks.

``floe:arrays-layout`` says how arrays are laid out (2: granules stacked by
grid); a repository an earlier floe wrote with one group per item is refused.
``floe:arrays-tiling`` holds the ``tile`` and ``chunk`` (pixels) the stacks
were cut with when the repository was created: every later writer uses them,
whatever its settings say, since a chunk of another size would be stored
under keys that mean other pixels and a stack cut with another tile size
would take its pixels at the wrong place. A repository created before floe
recorded them has none; there ``ingest.rasters.name_arrays`` writes each
array in its own chunks and refuses a stack of another tile size.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import icechunk
import zarr
import zarr.errors

from ingest.config import Settings
from ingest.errors import RepositoryNotFound, UnsupportedLayout
from ingest.stac import ARRAYS_LAYOUT, LAYOUT_ATTR, STACKS, TILING_ATTR

if TYPE_CHECKING:
    from ingest.repository._repo import Repository

log = logging.getLogger(__name__)


def root_attributes(settings: Settings) -> dict[str, Any]:
    """The root group's attributes of a new repository."""
    tiling = {"tile": settings.arrays.tile, "chunk": settings.arrays.chunk}
    return {LAYOUT_ATTR: ARRAYS_LAYOUT, TILING_ATTR: tiling}


def kept_tiling(root: zarr.Group, settings: Settings, url: str) -> Settings:
    """``settings`` with the tile and chunk the repository was created with; logged when the settings asked for
    others (they apply to new repositories)."""
    recorded = root.attrs.get(TILING_ATTR)
    if not isinstance(recorded, Mapping):
        return settings
    arrays = settings.arrays
    kept = {key: value for key in ("tile", "chunk") if isinstance(value := recorded.get(key), int)}
    changed = {key: value for key, value in kept.items() if getattr(arrays, key) != value}
    if not changed:
        return settings
    log.warning(
        "the repository at %s was created with arrays %s; writing with those, not the settings' %s "
        "(they apply to new repositories)",
        url,
        ", ".join(f"{key} {value}" for key, value in changed.items()),
        ", ".join(f"{key} {getattr(arrays, key)}" for key in changed),
    )
    return settings.model_copy(update={"arrays": arrays.model_copy(update=changed)})


def check_layout(root: zarr.Group, url: str) -> None:
    """Refuse a repository whose arrays an earlier floe laid out otherwise."""
    layout = root.attrs.get(LAYOUT_ATTR, 1)
    if layout == 1 and not _item_groups(root):
        return  # an earlier floe's repository of metadata only: no array in it is laid out otherwise
    if layout != ARRAYS_LAYOUT:
        raise UnsupportedLayout(
            f"the repository at {url} keeps its arrays in layout {layout} "
            f"(one Zarr group per item), and this floe reads layout {ARRAYS_LAYOUT} only (granules stacked "
            "by grid). Open it with the floe that wrote it, or export its items (`floe export`) and ingest "
            "them into a new repository",
            layout=layout if isinstance(layout, int) else None,
        )


def _item_groups(root: zarr.Group) -> list[str]:
    """Groups of an earlier floe's layout 1 (``<collection>/<item>``): any group under a collection's but stacks."""
    return [
        f"{collection}/{name}"
        for collection, group in root.groups()
        for name, _child in group.groups()
        if name != STACKS
    ][:5]


def check_repository_layout(repository: Repository) -> str | None:
    """Refuse a repository whose arrays an earlier floe laid out otherwise, and write with the tiling it was
    created with (both read at ``main``'s tip; the repository's settings take that tiling).

    Args:
        repository: the repository being opened.

    Returns:
        The snapshot id at the tip of ``main``, or None if there is no ``main`` branch.

    Raises:
        RepositoryNotFound: ``main`` has no root group: Icechunk's repository is there without floe's first
            commit (its creation is under way or stopped).
        UnsupportedLayout: an earlier floe laid out the repository's arrays otherwise.
    """
    try:
        session = repository.known.keep(repository.icechunk.readonly_session(branch="main"))
    except icechunk.IcechunkError:
        return None  # no main branch: nothing written by floe's first commit to look at
    url = repository.location.url
    try:
        root = zarr.open_group(session.store, mode="r")
    except zarr.errors.GroupNotFoundError:
        raise RepositoryNotFound(
            f"no floe repository at {url} yet: Icechunk's is there without floe's first commit (being created "
            "now, or its creation stopped: `floe init` completes it, `floe init --force` starts it anew)"
        ) from None
    repository.settings = kept_tiling(root, repository.settings, url)
    check_layout(root, url)
    return session.snapshot_id
