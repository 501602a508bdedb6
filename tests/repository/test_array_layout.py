"""A repository records its array layout; one written with an earlier layout is refused by name, never misread."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from ingest import Repository, UnsupportedLayout
from ingest.repository import CommitMetadata
from ingest.stac import ARRAYS_LAYOUT, LAYOUT_ATTR
from tests.conftest import make_item, stage_raster


def test_a_new_repository_records_the_layout_it_is_written_with(tmp_path):
    repo = Repository.create(tmp_path / "repo")
    root = zarr.open_group(repo.view().session.store, mode="r")
    assert root.attrs[LAYOUT_ATTR] == ARRAYS_LAYOUT == 2
    Repository.open(tmp_path / "repo")  # and opens


def forget_layout(repo: Repository, recorded: int | None, *, item_group: bool) -> None:
    """Make ``repo`` look like an earlier floe's: the root without the attribute (or another layout), and with
    ``item_group`` one layout-1 group ``c/item`` holding an array."""
    session = repo.icechunk.writable_session("main")
    group = zarr.open_group(session.store, mode="a")
    if item_group:
        zarr.open_group(session.store, path="c", mode="a")
        zarr.create_array(session.store, name="c/item/data", shape=(2,), dtype="uint8")[:] = 1
    attributes = dict(group.attrs)
    attributes.pop(LAYOUT_ATTR)
    if recorded is not None:
        attributes[LAYOUT_ATTR] = recorded
    group.attrs.clear()
    group.attrs.update(attributes)
    pointer = CommitMetadata.decode(repo.icechunk.lookup_snapshot(session.snapshot_id).metadata)
    session.commit("an earlier floe", metadata=CommitMetadata(items=pointer.items).encode())


@pytest.mark.parametrize("recorded", [None, 1, 3])
def test_a_repository_of_another_layout_is_refused_naming_it(tmp_path, recorded):
    forget_layout(Repository.create(tmp_path / "repo"), recorded, item_group=True)
    with pytest.raises(UnsupportedLayout) as refused:
        Repository.open(tmp_path / "repo")
    shown = recorded if recorded is not None else 1
    assert refused.value.layout == shown
    assert f"layout {shown}" in str(refused.value) and f"layout {ARRAYS_LAYOUT}" in str(refused.value)
    assert refused.value.kind == "unsupported-layout"


def test_an_earlier_repository_of_metadata_only_opens(tmp_path):
    """Without item groups nothing is laid out otherwise: an earlier floe's metadata-only repository opens, and
    its collections take stacks from now on."""
    repo = Repository.create(tmp_path / "repo")
    writer = repo.writer()
    writer.add_item(make_item("a", "c"))
    writer.commit("metadata")
    forget_layout(repo, None, item_group=False)
    reopened = Repository.open(tmp_path / "repo")
    writer = reopened.writer()
    writer.add_item(stage_raster(writer, make_item("b", "c"), np.ones((8, 8), dtype="uint8")))
    writer.commit("arrays, stacked")
    assert Repository.open(tmp_path / "repo").view().stacks("c")
    assert sorted(item["id"] for item in reopened.view().items()) == ["a", "b"]
