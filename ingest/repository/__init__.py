"""The hybrid store: an Icechunk repository whose commits carry the Iceberg items table's pointer.

Modules, in the order a commit flows through them:

- ``_repo``: :class:`Repository`: open or create, refs, log, collections, writers;
  ``_rooted``: the check that refuses a copy not yet relocated; ``_layout``: the arrays' layout and tiling.
- ``_view``: :class:`View`: the table and the arrays at one snapshot.
- ``_writer``: :class:`Writer`: stages arrays and items, then commits them.
- ``_commit``: the commit protocol (look at the tip, apply on the base,
  compare-and-swap under the lock, rebase and back off) and
  :class:`CommitMetadata`, floe's record in every Icechunk commit.
- ``_plan``: a writer's table change, replayable on any base.
- ``_files``, ``_append``, ``_replace``, ``_keys``: data files, the Iceberg snapshot
  (manifests, manifest list), copy-on-write replacement, which rows of which files hold which ids
  (``KeyIndex``; :class:`IdIndex` for searches by ids); ``_sketch``: the id sketch written beside
  each manifest, from which a search by ids finds its rows without reading the files' ids.
- ``_optimize``: compaction of a partition's files into clustered runs (``floe optimize``).
- ``_catalog``: :class:`PointerCatalog`, the Iceberg catalog whose table lives at a pointer.
- ``_groups``: group existence and shared parents; ``_containers``: virtual chunk containers.
- ``_read``: rows of the table, read by floe from its own files.
- ``_snapshots``: what never changes about a snapshot (its pointer, a read-only session), read once.
- ``_series``, ``_chunks``: many items' arrays as lazy time series; the chunks a selection needs, read at once and
  cached.
"""

from typing import TYPE_CHECKING

from ingest._lazy import lazy_names

# Each name loads with its module when first used (``ingest._lazy``): listing refs or history needs Icechunk
# only, not PyIceberg and PyArrow, which the table's modules import.
if TYPE_CHECKING:
    from ingest.repository._catalog import PointerCatalog
    from ingest.repository._chunks import chunk_cache, clear_chunk_cache, set_chunk_cache_size
    from ingest.repository._commit import (
        SOURCE_CURSORS,
        AppliedChange,
        Base,
        CommitMetadata,
        TableChange,
        commit_change,
    )
    from ingest.repository._history import LogEntry, Ref, check_ref_name
    from ingest.repository._keys import IdIndex, id_hashes
    from ingest.repository._optimize import OptimizeResult
    from ingest.repository._read import READS_AT_ONCE, data_fragment, read_column
    from ingest.repository._repo import Repository
    from ingest.repository._rooted import check_rooted, recorded_table_location, sentinel_branch
    from ingest.repository._sketch import (
        SKETCHED,
        by_file,
        data_manifests,
        fingerprints,
        is_sketched,
        read_sketch,
        relative_to,
        sketch_location,
    )
    from ingest.repository._view import View
    from ingest.repository._writer import CommitResult, Writer

_HOMES = {
    **dict.fromkeys(("PointerCatalog",), "ingest.repository._catalog"),
    **dict.fromkeys(("chunk_cache", "clear_chunk_cache", "set_chunk_cache_size"), "ingest.repository._chunks"),
    **dict.fromkeys(
        ("SOURCE_CURSORS", "AppliedChange", "Base", "CommitMetadata", "TableChange", "commit_change"),
        "ingest.repository._commit",
    ),
    **dict.fromkeys(("LogEntry", "Ref", "check_ref_name"), "ingest.repository._history"),
    **dict.fromkeys(("IdIndex", "id_hashes"), "ingest.repository._keys"),
    **dict.fromkeys(("OptimizeResult",), "ingest.repository._optimize"),
    **dict.fromkeys(("READS_AT_ONCE", "data_fragment", "read_column"), "ingest.repository._read"),
    **dict.fromkeys(("Repository",), "ingest.repository._repo"),
    **dict.fromkeys(("check_rooted", "recorded_table_location", "sentinel_branch"), "ingest.repository._rooted"),
    **dict.fromkeys(
        (
            "SKETCHED",
            "by_file",
            "data_manifests",
            "fingerprints",
            "is_sketched",
            "read_sketch",
            "relative_to",
            "sketch_location",
        ),
        "ingest.repository._sketch",
    ),
    **dict.fromkeys(("View",), "ingest.repository._view"),
    **dict.fromkeys(("CommitResult", "Writer"), "ingest.repository._writer"),
}

__all__ = [
    "READS_AT_ONCE",
    "SKETCHED",
    "SOURCE_CURSORS",
    "AppliedChange",
    "Base",
    "CommitMetadata",
    "CommitResult",
    "IdIndex",
    "LogEntry",
    "OptimizeResult",
    "PointerCatalog",
    "Ref",
    "Repository",
    "TableChange",
    "View",
    "Writer",
    "by_file",
    "check_ref_name",
    "check_rooted",
    "chunk_cache",
    "clear_chunk_cache",
    "commit_change",
    "data_fragment",
    "data_manifests",
    "fingerprints",
    "id_hashes",
    "is_sketched",
    "read_column",
    "read_sketch",
    "recorded_table_location",
    "relative_to",
    "sentinel_branch",
    "set_chunk_cache_size",
    "sketch_location",
]

__getattr__ = lazy_names(__name__, globals(), _HOMES)
