"""stac-api-validator, offline, against a running `floe serve` with its default settings: every conformance class
floe claims passes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ingest import Repository, Settings
from tests.api._servers import FloeServer, assert_validator_passed, run_validator
from tests.conftest import make_item

CLASSES = ["core", "collections", "features", "item-search", "filter"]
CLASSES += ["item-search#fields", "item-search#sort", "item-search#query"]


def _items() -> list[dict]:
    items = [
        make_item(
            f"a-{i}",
            "alpha",
            when=f"2024-0{1 + i % 6}-05T00:00:00Z",
            # No item has `mission`, which the validator's LIKE checks name: by default such a filter is answered
            # (matching nothing), as the validator expects.
            **{"eo:cloud_cover": i % 100, "platform": f"sat-{i % 3}", "instruments": [["msi"], ["oli", "tirs"]][i % 2]},
        )
        for i in range(60)
    ]
    items += [
        make_item(
            f"b-{i}",
            "beta",
            when=f"2024-0{1 + i % 6}-07T00:00:00Z",
            **{"eo:cloud_cover": i % 50, "platform": "sat-1", "instruments": ["msi"]},
        )
        for i in range(40)
    ]
    return items


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FloeServer]:
    root = tmp_path_factory.mktemp("conformance") / "repo"
    repository = Repository.create(root, Settings())
    writer = repository.writer()
    writer.add_items(_items())
    writer.commit("validator items")
    running = FloeServer(root)
    try:
        yield running
    finally:
        running.stop()


def _validate(root_url: str) -> str:
    arguments = [f"--conformance={name}" for name in CLASSES]
    arguments += [
        f"--root-url={root_url}",
        "--collection=alpha",
        '--geometry={"type":"Polygon","coordinates":[[[-180,-90],[180,-90],[180,90],[-180,90],[-180,-90]]]}',
        "--fields-nested-property=properties.platform",
        "--query-comparison-field=eo:cloud_cover",
        *[f"--query-{op}-value=5" for op in ("eq", "neq", "lt", "lte", "gt", "gte")],
        "--query-substring-field=platform",
        "--query-starts-with-value=sat",
        "--query-ends-with-value=1",
        "--query-contains-value=at",
        "--query-in-field=instruments",
        "--query-in-values=msi,tirs",
    ]
    return run_validator(*arguments)


@pytest.mark.slow
@pytest.mark.parametrize("prefix", ["/", "/refs/main/"])
def test_stac_api_validator_reports_no_errors(server: FloeServer, prefix: str) -> None:
    assert_validator_passed(_validate(server.url + prefix))
