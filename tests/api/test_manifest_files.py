"""The engine's cache of manifests' files (``ManifestFiles``): the same live files as PyIceberg's scan of each
version, kept by manifest across versions, bounded by the entries it holds."""

from __future__ import annotations

from ingest import Repository
from ingest.api._manifests import ManifestFiles
from tests.conftest import make_item


def versions(tmp_path, commits: int) -> tuple[Repository, list]:
    repository = Repository.create(tmp_path / "repo")
    tables = []
    for commit in range(commits):
        writer = repository.writer()
        for number in range(3):
            writer.add_item(make_item(f"i{commit}-{number}", f"c{number}"))
        writer.commit(f"batch {commit}")
        tables.append(repository.table_at(repository.resolve()))
    return repository, tables


def scanned(table) -> set[str]:
    return {task.file.file_path for task in table.scan().plan_files()}


def test_each_version_lists_what_a_scan_of_it_plans_and_reads_only_new_manifests(tmp_path):
    repository, tables = versions(tmp_path, 4)
    cache = ManifestFiles(repository.io)
    read: list[str] = []
    original = cache._read
    cache._read = lambda manifest: read.append(manifest.manifest_path) or original(manifest)  # type: ignore[method-assign]

    for table in tables:
        manifests = table.current_snapshot().manifests(repository.io)
        assert {data_file.file_path for data_file in cache.live_files(manifests)} == scanned(table)
    assert len(read) == len(set(read))  # a manifest shared by versions was read once


def test_the_entries_kept_are_bounded_but_a_version_always_gets_all_its_files(tmp_path):
    repository, tables = versions(tmp_path, 4)
    cache = ManifestFiles(repository.io, max_files=3)
    for table in (tables[-1], tables[0], tables[-1]):
        manifests = table.current_snapshot().manifests(repository.io)
        assert {data_file.file_path for data_file in cache.live_files(manifests)} == scanned(table)
        assert cache._count <= max(3, len(scanned(table)))
        assert cache._count == sum(len(files) for files in cache._files.values())
