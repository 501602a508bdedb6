"""Files ruled out for all files at once (FileStats) agree with pyiceberg's file-by-file evaluator, file by file."""

from __future__ import annotations

import math

import pytest
from pyiceberg.expressions import (
    AlwaysFalse,
    And,
    BooleanExpression,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNaN,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    NotEqualTo,
    NotIn,
    NotNull,
    Or,
    StartsWith,
)
from pyiceberg.expressions.visitors import bind, rewrite_not

from ingest import Repository, Settings
from ingest._compat import may_match
from ingest.api._prune import FileStats
from tests.conftest import make_item


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Eight commits of files with different bounds: a property some files lack, one all null, NaNs, months."""
    repository = Repository.create(tmp_path_factory.mktemp("prune") / "repo", Settings())
    for batch in range(8):
        items = []
        for n in range(12):
            number = batch * 12 + n
            properties: dict = {"eo:cloud_cover": float(number % 50) if batch != 3 else math.nan}
            if batch % 2 == 0:
                properties["gsd"] = 10 * batch + n
            if batch >= 5:
                properties["platform"] = None if batch == 5 else f"sat-{batch}-{n % 3}"
            item = make_item(
                f"{'ab'[batch % 2]}-{number:04d}",
                ("north", "south", "east")[batch % 3],
                when=f"2024-{1 + batch % 4:02d}-{1 + n:02d}T00:00:00Z",
                **properties,
            )
            items.append(item)
        writer = repository.writer()
        writer.add_items(items)
        writer.commit(f"batch {batch}")
    view = repository.view()
    files = list(view.table.scan().plan_files())
    return {"schema": view.table.schema(), "files": [task.file for task in files]}


EXPRESSIONS: list[BooleanExpression] = [
    EqualTo("collection", "north"),
    EqualTo("collection", "west"),
    In("collection", {"south", "east"}),
    LessThan("datetime", "2024-02-01T00:00:00+00:00"),
    GreaterThanOrEqual("datetime", "2024-03-05T00:00:00+00:00"),
    And(GreaterThan("datetime", "2024-01-31T00:00:00+00:00"), LessThanOrEqual("datetime", "2024-02-03T00:00:00+00:00")),
    In("id", {"a-0001", "b-0013", "zz"}),
    In("id", {f"a-{n:04d}" for n in range(0, 300, 2)} | {"b-0090"}),
    In("id", {f"x-{n}" for n in range(300)}),  # beyond the IN limit: every file may match
    EqualTo("id", "b-0025"),
    LessThan("eo:cloud_cover", 5.0),
    GreaterThan("eo:cloud_cover", 48.5),
    IsNaN("eo:cloud_cover"),
    EqualTo("gsd", 61),
    GreaterThanOrEqual("gsd", 70),
    IsNull("gsd"),
    NotNull("gsd"),
    NotNull("platform"),
    EqualTo("platform", "sat-6-1"),
    StartsWith("platform", "sat-7"),
    NotEqualTo("collection", "north"),
    NotIn("collection", {"north"}),
    Not(EqualTo("collection", "north")),
    Or(EqualTo("collection", "east"), LessThan("gsd", 5)),
    And(Not(LessThan("datetime", "2024-04-01T00:00:00+00:00")), EqualTo("collection", "north")),
    AlwaysFalse(),
]


@pytest.mark.parametrize("expression", EXPRESSIONS, ids=[repr(e)[:60] for e in EXPRESSIONS])
def test_every_file_is_kept_or_ruled_out_as_pyiceberg_decides(table: dict, expression: BooleanExpression) -> None:
    schema, files = table["schema"], table["files"]
    assert len(files) >= 8
    expected = [may_match(schema, expression)(data_file) for data_file in files]
    kept, exact = FileStats(files).may_match(bind(schema, rewrite_not(expression), case_sensitive=True))
    if exact:
        assert kept.tolist() == expected
    else:  # undecided predicates keep the file: the caller asks pyiceberg about the survivors
        assert all(kept[index] for index, keep in enumerate(expected) if keep)


def test_the_usual_predicates_are_decided_without_pyiceberg(table: dict) -> None:
    """Comparisons, IN and null tests on strings, timestamps and numbers rule files out by themselves."""
    schema, files = table["schema"], table["files"]
    stats = FileStats(files)
    for expression in EXPRESSIONS:
        if isinstance(expression, StartsWith | IsNaN):
            continue
        kept, exact = stats.may_match(bind(schema, rewrite_not(expression), case_sensitive=True))
        assert exact, expression
    ruled_out = [
        EqualTo("collection", "north"),
        LessThan("datetime", "2024-02-01T00:00:00+00:00"),
        In("id", {"a-0001", "b-0013"}),
        EqualTo("gsd", 61),
    ]
    for expression in ruled_out:
        kept, _ = stats.may_match(bind(schema, rewrite_not(expression), case_sensitive=True))
        assert 0 < kept.sum() < len(files), expression
