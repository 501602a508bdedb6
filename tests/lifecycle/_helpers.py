"""What the lifecycle tests compare: exports per ref and per version, file listings, the live set computed
through pyiceberg, the files one table version names (with the id sketches beside its manifests)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ingest import Repository
from ingest.errors import CorruptRepository
from ingest.lifecycle._store import RootFiles
from ingest.repository import CommitMetadata, View, is_sketched, sketch_location
from ingest.stac import read_arrays_asset


def export(repository: Repository, ref: str) -> list[str]:
    """Every item at ``ref`` as canonical JSON, sorted (what `floe export` writes, order aside)."""
    return sorted(json.dumps(item, sort_keys=True) for item in repository.view(ref).items())


def exports(repository: Repository) -> dict[str, list[str]]:
    return {f"{ref.kind}:{ref.name}": export(repository, ref.snapshot_id) for ref in repository.refs()}


def every_version(repository: Repository) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Every version in the history of every ref: snapshot id -> (its items as canonical JSON, sorted;
    a digest of each asset's pixels as ``View.item_arrays`` puts them back together from the item's pieces).

    The JSON includes each row's ``floe:arrays`` asset (its stacks, arrays and slots), so a version whose rows
    name other slots, or whose slots hold other pixels, reads differently."""
    versions: dict[str, tuple[list[str], dict[str, str]]] = {}
    for ref in repository.refs():
        for info in repository.icechunk.ancestry(snapshot_id=ref.snapshot_id):
            record = CommitMetadata.decode(info.metadata)
            if info.id in versions or record is None or record.items is None:
                continue  # seen, or Icechunk's root snapshot (no table yet)
            view = repository.view(info.id)
            items = list(view.items())
            versions[info.id] = (sorted(json.dumps(item, sort_keys=True) for item in items), item_digests(view, items))
    return versions


def item_digests(view: View, items: list[dict[str, Any]] | None = None) -> dict[str, str]:
    """``<collection>/<id>/<asset key>`` -> a digest of that asset's pixels (dtype, shape and bytes) and its grid,
    read through ``View.item_arrays``, for every item with arrays at ``view``."""
    digests: dict[str, str] = {}
    for item in view.items() if items is None else items:
        asset = read_arrays_asset(item)
        if asset is None:
            continue
        for key, pixels in asset.pixels.items():
            data = view.item_arrays(item["collection"], item["id"], [key])[key]
            digest = hashlib.sha256(f"{data.dtype}{data.shape}{pixels.crs}{pixels.transform}".encode())
            digest.update(data.values.tobytes())
            digests[f"{item['collection']}/{item['id']}/{key}"] = digest.hexdigest()
    return digests


def files_of_version(repository: Repository, pointer: str) -> set[str]:
    """The table files one table version names (paths relative to the root): its metadata.json (``pointer``, as a
    commit carries it), and its current snapshot's manifest list, manifests and data files."""
    location = repository.absolute_location(pointer)
    table = repository.catalog.load_at(location)
    found = {location}
    snapshot = table.current_snapshot()
    if snapshot is not None:
        found.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(repository.io):
            found.add(manifest.manifest_path)
            if is_sketched(snapshot):
                found.add(sketch_location(manifest.manifest_path))
            found.update(entry.data_file.file_path for entry in manifest.fetch_manifest_entry(repository.io))
    files = RootFiles(repository.location)
    return {path for path in (files.relative(location) for location in found) if path is not None}


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
                if is_sketched(snapshot):
                    live.add(sketch_location(manifest.manifest_path))
                live.update(
                    e.data_file.file_path for e in manifest.fetch_manifest_entry(repository.io, discard_deleted=False)
                )
    return {files.relative(location) for location in live}
