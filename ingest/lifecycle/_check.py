"""Integrity checks: every ref's pointer resolves and every file its table version references exists."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pyiceberg.manifest import ManifestFile

from ingest.errors import FloeError
from ingest.repository import Repository

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one ref."""

    ref: str
    snapshot_id: str | None
    what: str

    def __str__(self) -> str:
        at = f" ({self.snapshot_id})" if self.snapshot_id else ""
        return f"{self.ref}{at}: {self.what}"


def _exists(repository: Repository, path: str) -> bool:
    try:
        return repository.io.new_input(path).exists()
    except OSError:
        return False


def check_ref(repository: Repository, ref: str) -> list[Problem]:
    """Problems with one ref: its pointer, metadata.json, manifest list, manifests and data files."""
    try:
        snapshot_id = repository.resolve(ref)
    except FloeError as error:
        return [Problem(ref, None, str(error))]
    try:
        location = repository.metadata_location_of(snapshot_id)
    except FloeError as error:
        return [Problem(ref, snapshot_id, str(error))]
    if not _exists(repository, location):
        return [Problem(ref, snapshot_id, f"table metadata {location} is missing")]
    try:
        table = repository.catalog.load_at(location)
    except Exception as error:  # noqa: BLE001 - any parse failure is a finding, not a crash
        return [Problem(ref, snapshot_id, f"table metadata {location} cannot be read: {error}")]
    snapshot = table.current_snapshot()
    if snapshot is None:
        return []
    problems: list[Problem] = []
    if not _exists(repository, snapshot.manifest_list):
        return [Problem(ref, snapshot_id, f"manifest list {snapshot.manifest_list} is missing")]
    try:
        manifests: list[ManifestFile] = snapshot.manifests(repository.io)
    except Exception as error:  # noqa: BLE001
        return [Problem(ref, snapshot_id, f"manifest list {snapshot.manifest_list} cannot be read: {error}")]
    for manifest in manifests:
        if not _exists(repository, manifest.manifest_path):
            problems.append(Problem(ref, snapshot_id, f"manifest {manifest.manifest_path} is missing"))
            continue
        try:
            entries = manifest.fetch_manifest_entry(repository.io, discard_deleted=True)
        except Exception as error:  # noqa: BLE001
            problems.append(Problem(ref, snapshot_id, f"manifest {manifest.manifest_path} cannot be read: {error}"))
            continue
        for entry in entries:
            path = entry.data_file.file_path
            if not _exists(repository, path):
                problems.append(Problem(ref, snapshot_id, f"data file {path} is missing"))
    return problems


def check(repository: Repository, ref: str | None = None, *, all_refs: bool = False) -> list[Problem]:
    """Check one ref (default: the default branch) or, with ``all_refs``, every branch and tag."""
    refs = [f"{r.kind}:{r.name}" for r in repository.refs()] if all_refs else [ref or repository.settings.branch]
    problems: list[Problem] = []
    for name in refs:
        found = check_ref(repository, name)
        log.info("checked %s: %d problem(s)", name, len(found))
        problems.extend(found)
    return problems
