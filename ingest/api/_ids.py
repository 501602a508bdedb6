"""Where the rows a search by ids names are: the id index of each table version searched by ids.

An index (``ingest.repository.IdIndex``: every row's id fingerprint, file and
row) comes from the id sketches beside the version's manifests where the
version has them (one small object a manifest; no data file read), else from
the id column of every data file (a table written before sketches). The
sketches are kept by manifest (:class:`~ingest.api._manifests.ManifestFiles`), so
the index of a new version reads only the sketches of its new manifests; the
indexes of the last few versions searched are kept whole.
"""

from __future__ import annotations

import logging

from pyiceberg.io import FileIO

from ingest.api._cache import ColumnCache, Recent, SnapshotState
from ingest.api._manifests import ManifestFiles
from ingest.repository import IdIndex, data_manifests, is_sketched

log = logging.getLogger(__name__)

ID_INDEXES_KEPT = 2
"""Table versions whose id index is kept (12 bytes a row each)."""


class IdIndexes:
    """The id index of the table versions searched by ids most recently."""

    def __init__(self, io: FileIO, columns: ColumnCache, manifests: ManifestFiles) -> None:
        self.io = io
        self.columns = columns
        self.manifests = manifests
        self._indexes: Recent[IdIndex] = Recent(ID_INDEXES_KEPT)

    def of(self, state: SnapshotState) -> IdIndex:
        """Every row's id fingerprint at a snapshot, made on the first search by ids there."""
        return self._indexes.get(state.snapshot_id, lambda: self._made(state))

    def _made(self, state: SnapshotState) -> IdIndex:
        made = self._sketched(state)
        if made is None:
            # Every file's ids (their footers then serve the search's row reads).
            made = IdIndex.build(state.files, lambda data_file: self.columns.whole_column(data_file.file_path, "id"))
        return made

    def _sketched(self, state: SnapshotState) -> IdIndex | None:
        """The index from the id sketches; None where the version has none, or one is missing or disagrees with
        its manifest (``floe check --deep`` names it; the search reads the files' ids instead)."""
        version = state.table.current_snapshot()
        if version is None or not is_sketched(version):
            return None
        try:
            sketches = self.manifests.sketches(data_manifests(self.manifests.manifests(version)))
            return IdIndex.of_sketches(state.table.location(), state.files, sketches)
        except (OSError, ValueError) as error:
            log.warning("snapshot %s: id sketches unusable (%s); reading its files' ids", state.snapshot_id, error)
            return None
