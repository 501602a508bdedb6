"""Integrity checks: every ref's pointer resolves and every file its table version references exists.

With ``deep``, also: every data file and manifest has the size the table records
(``file_size_in_bytes``, ``manifest_length``), each manifest's id sketch lists
exactly its live files' rows with their ids' fingerprints (without ``deep``:
the sketch is there, in a snapshot that says it has them), every piece of every row's
``floe:arrays`` asset is a slot of an existing stack array holding that row's
id, every occupied slot is named by a row, the local files virtual chunks
reference exist, and the remote objects they reference answer a HEAD with
the ETag recorded when they were referenced.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np
from pyiceberg.manifest import ManifestFile
from pyiceberg.table import Table

from ingest._compat import azure_store_options
from ingest.errors import FloeError
from ingest.remote import RemoteError, Stores, head, is_remote
from ingest.remote._tokens import virtual_blob_url
from ingest.repository import (
    Repository,
    View,
    by_file,
    data_manifests,
    fingerprints,
    is_sketched,
    read_column,
    read_sketch,
    relative_to,
    sketch_location,
)
from ingest.stac import ARRAYS_LAYOUT, has_arrays_asset, read_arrays_asset

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


def _size(repository: Repository, path: str) -> int | None:
    try:
        return len(repository.io.new_input(path))
    except OSError:
        return None


def _size_problem(repository: Repository, kind: str, path: str, recorded: int) -> str | None:
    size = _size(repository, path)
    if size is None or size == recorded:
        return None
    return f"{kind} {path} has {size} bytes, the table records {recorded}"


def _missing_arrays(view: View) -> list[str]:
    """Rows and slices that do not match at the view's snapshot.

    Every piece a row's ``floe:arrays`` asset names must be a slot of an
    existing stack array whose ``item`` coordinate is that row's id; and every
    occupied slot of every stack must be named by a row (no slice without its
    row).
    """
    problems = []
    claimed: dict[str, set[int]] = {}
    arrays_seen: dict[str, bool] = {}
    slot_items = _SlotItems(view)
    for item in view.items():
        if not has_arrays_asset(item):
            continue
        name = f"item {item.get('id')!r} ({item.get('collection')})"
        arrays = read_arrays_asset(item)
        if arrays is None:
            problems.append(f"{name}: its floe:arrays asset cannot be read")
            continue
        if arrays.layout != ARRAYS_LAYOUT:
            problems.append(f"{name}: its arrays are in layout {arrays.layout} (group {arrays.group!r})")
            continue
        for piece in arrays.pieces():
            # Claimed first: a row naming a slot whose array is missing still names that slot.
            claimed.setdefault(piece.stack, set()).add(piece.slot)
            path = f"{piece.stack}/{piece.array}"
            if path not in arrays_seen:
                arrays_seen[path] = view.has_array(path)
            if not arrays_seen[path]:
                problems.append(f"{name}: stack array {path!r} is missing")
                continue
            holder = slot_items.at(piece.stack, piece.slot)
            if holder != item.get("id"):
                problems.append(f"{name}: slot {piece.slot} of {piece.stack!r} holds {holder!r}, not this item")
    for stack, occupied in slot_items.all().items():
        for slot, holder in occupied.items():
            if slot not in claimed.get(stack, set()):
                problems.append(f"slot {slot} of {stack!r} holds {holder!r}, which no row names (a slice without row)")
    return problems


class _SlotItems:
    """The ``item`` coordinate of every stack of a view, read once per stack."""

    def __init__(self, view: View) -> None:
        self._view = view
        self._read: dict[str, dict[int, str]] = {}

    def at(self, stack: str, slot: int) -> str | None:
        return self._of(stack).get(slot)

    def all(self) -> dict[str, dict[int, str]]:
        for collection, _group in self._view.arrays().groups():
            for stack in self._view.stacks(collection):
                self._of(stack)
        return self._read

    def _of(self, stack: str) -> dict[int, str]:
        if stack not in self._read:
            self._read[stack] = self._view.slot_items(stack) if self._view.has_group(stack) else {}
        return self._read[stack]


def _virtual_source_problems(repository: Repository, view: View) -> list[str]:
    """Problems with the sources virtual chunks of the view's snapshot reference (``--virtual`` ingests).

    A local file must exist. A remote object must answer a HEAD (sent
    ``REMOTE_HEADS`` at a time) with the ETag (or, without one, the last
    modification) recorded when it was referenced: Icechunk refuses the
    chunks of an object that changed, so such an item reads no more.
    """
    problems = []
    remote = []
    endpoints = _azure_endpoints(repository)
    for location in sorted(set(view.session.all_virtual_chunk_locations())):
        parsed = urlparse(location)
        if parsed.scheme == "file" and not os.path.isfile(unquote(parsed.path)):
            problems.append(f"virtual chunks reference {location}, which does not exist (moved or deleted?)")
        elif is_remote(location):
            remote.append(location)
        elif parsed.scheme == "az":
            # An Azure blob read with SAS tokens: asked for at its https:// URL, signed as any read of it.
            prefix = next((prefix for prefix in endpoints if location.startswith(prefix)), None)
            url = virtual_blob_url(location, endpoints[prefix]) if prefix is not None else None
            if url is None:
                problems.append(f"virtual chunks reference {location}, which no container of the repository covers")
            else:
                remote.append(url)
    if remote:
        problems.extend(_remote_source_problems(repository, view, remote))
    return problems


def _azure_endpoints(repository: Repository) -> dict[str, str | None]:
    """The repository's Azure containers (``az://{account}@{container}/``) and their endpoints (None: Azure's)."""
    containers = repository.icechunk.config.virtual_chunk_containers or {}
    endpoints: dict[str, str | None] = {}
    for prefix, container in containers.items():
        if prefix.startswith("az://"):
            endpoints[prefix] = azure_store_options(container.store).get("endpoint")
    return endpoints


REMOTE_HEADS = 32
"""HEAD requests ``check --deep`` keeps in flight for the remote objects virtual chunks reference."""


def _remote_source_problems(repository: Repository, view: View, urls: list[str]) -> list[str]:
    recorded = _recorded_sources(view)
    stores = Stores.of(repository.settings)
    stores.prefetch_heads(urls, concurrency=REMOTE_HEADS)
    problems = []
    for url in urls:
        try:
            now = head(stores, url)
        except RemoteError as error:
            problems.append(f"virtual chunks reference {url}, which cannot be read ({error.reason})")
            continue
        known = recorded.get(url)
        if known is None:
            continue
        if known.get("etag") and now.get("etag"):
            changed = known["etag"] != now["etag"]
            what = f"ETag {known['etag']} when referenced, {now['etag']} now"
        else:
            changed = known.get("last_modified") != now.get("last_modified") or known.get("size") != now.get("size")
            what = f"modified {known.get('last_modified')} when referenced, {now.get('last_modified')} now"
        if changed:
            problems.append(
                f"virtual chunks reference {url}, which changed after it was referenced ({what}): its chunks are "
                "refused on read; ingest its item again"
            )
    return problems


def _recorded_sources(view: View) -> dict[str, dict[str, Any]]:
    """What each remote source referenced by a row was when referenced (its ``floe:sources`` entry), by URL."""
    recorded: dict[str, dict[str, Any]] = {}
    for item in view.items():
        arrays = read_arrays_asset(item) if has_arrays_asset(item) else None
        if arrays is None or not arrays.virtual or not arrays.sources:
            continue
        assets = item.get("assets") or {}
        for key, fingerprint in arrays.sources.items():
            href = (assets.get(key) or {}).get("href")
            if isinstance(href, str) and is_remote(href) and isinstance(fingerprint, dict):
                recorded[href] = fingerprint
    return recorded


def check_ref(repository: Repository, ref: str, *, deep: bool = False) -> list[Problem]:
    """Problems with one ref: its table version (see ``_check_table``) and, with ``deep``, its virtual sources.

    What is wrong is reported, not raised: a ref that does not resolve, a
    snapshot without a pointer, a table file missing, unreadable or outside
    this root, each is a :class:`Problem`.

    Args:
        repository: the repository.
        ref: a branch, a tag or a snapshot id, optionally prefixed ``branch:``, ``tag:`` or ``snapshot:``.
        deep: also compare the sizes the table records with the files', the id sketches with the files' ids, the
            rows' arrays with the stacks' slots, and check the sources virtual chunks reference (remote ones by a
            HEAD request each).

    Returns:
        The problems found, in the order found; empty if the ref checks.
    """
    problems = _check_table(repository, ref, deep=deep)
    if deep:
        try:
            snapshot_id = repository.resolve(ref)
            view = View(repository, ref, snapshot_id)
        except FloeError:
            return problems  # an unresolvable ref or pointer: reported by _check_table already
        problems.extend(Problem(ref, snapshot_id, what) for what in _virtual_source_problems(repository, view))
    return problems


def _check_table(repository: Repository, ref: str, *, deep: bool = False) -> list[Problem]:
    """Problems with one ref: its pointer, metadata.json, manifest list, manifests and data files.

    ``deep`` also compares recorded sizes and checks rows and slots against each other (``_missing_arrays``).
    """
    loaded = _table_version(repository, ref)
    if isinstance(loaded, Problem):
        return [loaded]
    snapshot_id, table = loaded
    if table.location().rstrip("/") != repository.table_location:
        # A copy not relocated: its files would be read from the other root.
        return [Problem(ref, snapshot_id, f"the table names {table.location()}, not this root (run `floe relocate`)")]
    snapshot = table.current_snapshot()
    if snapshot is None:
        return []
    if not _exists(repository, snapshot.manifest_list):
        return [Problem(ref, snapshot_id, f"manifest list {snapshot.manifest_list} is missing")]
    try:
        manifests: list[ManifestFile] = snapshot.manifests(repository.io)
    except Exception as error:  # noqa: BLE001 - any parse failure is a finding, not a crash
        return [Problem(ref, snapshot_id, f"manifest list {snapshot.manifest_list} cannot be read: {error}")]
    findings, readable = _check_files(repository, manifests, deep=deep)
    if readable and is_sketched(snapshot):
        findings += _sketch_problems(repository, table.location(), data_manifests(manifests), deep=deep)
    problems = [Problem(ref, snapshot_id, what) for what in findings]
    if deep and readable:
        try:
            view = View(repository, ref, snapshot_id)
            problems.extend(Problem(ref, snapshot_id, what) for what in _missing_arrays(view))
        except Exception as error:  # noqa: BLE001 - unreadable rows are a finding
            problems.append(Problem(ref, snapshot_id, f"rows cannot be read: {error}"))
    return problems


def _table_version(repository: Repository, ref: str) -> tuple[str, Table] | Problem:
    """The snapshot a ref names and the table version its pointer names, or the problem that stops there."""
    try:
        snapshot_id = repository.resolve(ref)
    except FloeError as error:
        return Problem(ref, None, str(error))
    try:
        location = repository.metadata_location_of(snapshot_id)
    except FloeError as error:
        return Problem(ref, snapshot_id, str(error))
    if not _exists(repository, location):
        return Problem(ref, snapshot_id, f"table metadata {location} is missing")
    try:
        return snapshot_id, repository.catalog.load_at(location)
    except Exception as error:  # noqa: BLE001 - any parse failure is a finding, not a crash
        return Problem(ref, snapshot_id, f"table metadata {location} cannot be read: {error}")


def _check_files(repository: Repository, manifests: list[ManifestFile], *, deep: bool) -> tuple[list[str], bool]:
    """What is wrong with the manifests and the data files they list, and whether every row can be read."""
    findings: list[str] = []
    readable = True
    root = repository.location.tables_url + "/"
    for manifest in manifests:
        path = manifest.manifest_path
        if not path.startswith(root):
            findings.append(f"manifest {path} lies outside this repository ({repository.location.url})")
        if not _exists(repository, path):
            findings.append(f"manifest {path} is missing")
            readable = False
            continue
        if deep and (found := _size_problem(repository, "manifest", path, manifest.manifest_length)):
            findings.append(found)
        try:
            entries = manifest.fetch_manifest_entry(repository.io, discard_deleted=True)
        except Exception as error:  # noqa: BLE001
            findings.append(f"manifest {path} cannot be read: {error}")
            readable = False
            continue
        for entry in entries:
            data_path = entry.data_file.file_path
            if not data_path.startswith(root):
                findings.append(f"data file {data_path} lies outside this repository ({repository.location.url})")
            if not _exists(repository, data_path):
                findings.append(f"data file {data_path} is missing")
                readable = False
            elif deep and (
                found := _size_problem(repository, "data file", data_path, entry.data_file.file_size_in_bytes)
            ):
                findings.append(found)
    return findings, readable


def _sketch_problems(
    repository: Repository, table_location: str, manifests: list[ManifestFile], *, deep: bool
) -> list[str]:
    """What is wrong with the id sketches of a sketched snapshot's manifests: a missing one, or (``deep``) one
    that does not list exactly the manifest's live files, each row of each with its id's fingerprint."""
    findings: list[str] = []
    for manifest in manifests:
        where = sketch_location(manifest.manifest_path)
        try:
            sketch = read_sketch(repository.io, manifest.manifest_path)
        except FileNotFoundError:
            findings.append(f"id sketch {where} is missing (its snapshot says its manifests have one)")
            continue
        except Exception as error:  # noqa: BLE001 - an unreadable sketch is a finding
            findings.append(f"id sketch {where} cannot be read: {error}")
            continue
        if not deep:
            continue
        files = [entry.data_file for entry in manifest.fetch_manifest_entry(repository.io, discard_deleted=True)]
        recorded = by_file(sketch)
        live = {relative_to(table_location, data_file.file_path): data_file for data_file in files}
        for name in sorted(set(recorded) - set(live)):
            findings.append(f"id sketch {where} names {name}, which its manifest does not list")
        for name, data_file in sorted(live.items()):
            part = recorded.get(name)
            if part is None:
                findings.append(f"id sketch {where} lacks {name}")
                continue
            rows, prints = part
            ids = read_column(repository.io, data_file, "id").to_pylist()
            if not (np.array_equal(rows, np.arange(len(ids))) and np.array_equal(prints, fingerprints(ids))):
                findings.append(f"id sketch {where} disagrees with the ids of {name}")
    return findings


def check(
    repository: Repository, ref: str | None = None, *, all_refs: bool = False, deep: bool = False
) -> list[Problem]:
    """Check one ref (default: the default branch) or, with ``all_refs``, every branch and tag (see
    :func:`check_ref`: what is wrong is reported, not raised).

    Args:
        repository: the repository.
        ref: a branch, a tag or a snapshot id, optionally prefixed ``branch:``, ``tag:`` or ``snapshot:``
            (default: the configured branch); ignored with ``all_refs``.
        all_refs: check every branch and tag.
        deep: also check recorded sizes, id sketches, rows against slots and the sources virtual chunks reference
            (see :func:`check_ref`).

    Returns:
        The problems of every ref checked, ref after ref; empty if all check.
    """
    refs = [f"{r.kind}:{r.name}" for r in repository.refs()] if all_refs else [ref or repository.settings.branch]
    problems: list[Problem] = []
    for name in refs:
        found = check_ref(repository, name, deep=deep)
        log.info("checked %s: %d problem(s)", name, len(found))
        problems.extend(found)
    return problems
