"""What the lifecycle tests compare: exports per ref, file listings, the live set computed through pyiceberg."""

from __future__ import annotations

import json

from ingest import Repository
from ingest.errors import CorruptRepository
from ingest.lifecycle._store import RootFiles


def export(repository: Repository, ref: str) -> list[str]:
    """Every item at ``ref`` as canonical JSON, sorted (what `floe export` writes, order aside)."""
    return sorted(json.dumps(item, sort_keys=True) for item in repository.view(ref).items())


def exports(repository: Repository) -> dict[str, list[str]]:
    return {f"{ref.kind}:{ref.name}": export(repository, ref.snapshot_id) for ref in repository.refs()}


def table_files(repository: Repository) -> dict[str, int]:
    """Every file under tables/ (path relative to the root -> bytes)."""
    return {path: stat.size for path, stat in RootFiles(repository.location).list("tables").items()}


def expected_live(repository: Repository) -> set[str]:
    """The live set, computed independently: every version in any ref's history, loaded as a pyiceberg Table."""
    files = RootFiles(repository.location)
    live: set[str] = set()
    snapshots = {
        info.id for ref in repository.refs() for info in repository.icechunk.ancestry(snapshot_id=ref.snapshot_id)
    }
    for snapshot_id in snapshots:
        try:
            location = repository.metadata_location_of(snapshot_id)
        except CorruptRepository:  # Icechunk's root snapshot has no pointer
            continue
        live.add(location)
        table = repository.catalog.load_at(location)
        for snapshot in table.metadata.snapshots:
            live.add(snapshot.manifest_list)
            for manifest in snapshot.manifests(repository.io):
                live.add(manifest.manifest_path)
                live.update(
                    e.data_file.file_path for e in manifest.fetch_manifest_entry(repository.io, discard_deleted=False)
                )
    return {files.relative(location) for location in live}
