"""Fixtures for the export tests: repositories holding real and generated items, and an offline stac-validator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ingest import Repository, Settings
from ingest.pipeline import ingest_items
from tests.conftest import DATA, REAL_ITEMS, make_item

SCHEMAS = DATA / "stac-schemas"


def schema_map() -> dict[str, str]:
    """Every vendored schema by the URL stac-validator would fetch it from."""
    return {f"https://{path.relative_to(SCHEMAS).as_posix()}": str(path) for path in SCHEMAS.rglob("*.json")}


def generated_items(count: int, collections: tuple[str, ...] = ("alpha", "beta")) -> list[dict[str, Any]]:
    """Items with the eo and view extensions (whose schemas are vendored), a text timestamp and varied properties."""
    items = []
    for index in range(count):
        item = make_item(
            f"gen-{index:04d}",
            collections[index % len(collections)],
            when=f"2024-{1 + index % 12:02d}-{1 + index % 27:02d}T10:00:00Z",
            **{"eo:cloud_cover": float(index % 100), "view:off_nadir": 2.5, "created": "2024-02-01T00:00:00Z"},
        )
        item["stac_extensions"] = [
            "https://stac-extensions.github.io/eo/v1.1.0/schema.json",
            "https://stac-extensions.github.io/view/v1.0.0/schema.json",
        ]
        item["assets"]["data"]["eo:bands"] = [{"name": "red", "common_name": "red"}]
        items.append(item)
    return items


def write_ndjson(path: Path, items: list[dict[str, Any]]) -> Path:
    import json

    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return path


@pytest.fixture(scope="module")
def real_repo(tmp_path_factory) -> Repository:
    """The 50 real items (13 collections, one stored collection) in five commits of ten."""
    repository = Repository.create(tmp_path_factory.mktemp("real") / "repo", Settings())
    report = ingest_items(repository, [REAL_ITEMS], batch_size=10, message="real")
    assert not report.rejected
    return repository
