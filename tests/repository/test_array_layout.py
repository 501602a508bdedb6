"""A repository records its array layout; one written with an earlier layout is refused by name, never misread."""

from __future__ import annotations

import pytest
import zarr

from ingest import Repository, UnsupportedLayout
from ingest.repository import CommitMetadata
from ingest.stac import ARRAYS_LAYOUT, LAYOUT_ATTR


def test_a_new_repository_records_the_layout_it_is_written_with(tmp_path):
    repo = Repository.create(tmp_path / "repo")
    root = zarr.open_group(repo.view().session.store, mode="r")
    assert root.attrs[LAYOUT_ATTR] == ARRAYS_LAYOUT == 2
    Repository.open(tmp_path / "repo")  # and opens


@pytest.mark.parametrize("recorded", [None, 1, 3])
def test_a_repository_of_another_layout_is_refused_naming_it(tmp_path, recorded):
    repo = Repository.create(tmp_path / "repo")
    # What an earlier floe left: the root group without the attribute (layout 1), or a later layout.
    session = repo.icechunk.writable_session("main")
    group = zarr.open_group(session.store, mode="a")
    attributes = dict(group.attrs)
    attributes.pop(LAYOUT_ATTR)
    if recorded is not None:
        attributes[LAYOUT_ATTR] = recorded
    group.attrs.clear()
    group.attrs.update(attributes)
    pointer = CommitMetadata.decode(repo.icechunk.lookup_snapshot(session.snapshot_id).metadata)
    session.commit("an earlier floe", metadata=CommitMetadata(items=pointer.items).encode())

    with pytest.raises(UnsupportedLayout) as refused:
        Repository.open(tmp_path / "repo")
    shown = recorded if recorded is not None else 1
    assert refused.value.layout == shown
    assert f"layout {shown}" in str(refused.value) and f"layout {ARRAYS_LAYOUT}" in str(refused.value)
    assert refused.value.kind == "unsupported-layout"
