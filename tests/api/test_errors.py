"""floe's errors answer HTTP statuses by their group in the error tree, with their stable kind as the body's code."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import orjson
import pytest

from ingest import errors
from ingest.api._app import RefRouter
from ingest.api._errors import FLOE_STATUS_CODES, error_body, status_of
from ingest.errors import (
    AlreadyExists,
    Conflict,
    Corrupt,
    CorruptRepository,
    FloeError,
    InvalidInput,
    NotFound,
    RefNotFound,
    Unavailable,
)

GROUP_STATUS = {
    NotFound: 404,
    AlreadyExists: 409,
    InvalidInput: 400,
    Conflict: 409,
    errors.Refused: 403,
    Corrupt: 500,
    Unavailable: 503,
}
# Classes more precise than their group, each HTTP's own status: a body too large to read (413), a stale
# If-Match (412), a write without the token (401), a write to a tag or a snapshot (405).
CLASS_STATUS = {
    errors.RequestTooLarge: 413,
    errors.StaleVersion: 412,
    errors.NotAuthorized: 401,
    errors.ReadOnlyRef: 405,
}
EVERY_ERROR = [
    value
    for value in vars(errors).values()
    if inspect.isclass(value) and issubclass(value, FloeError) and value.__module__ == errors.__name__
]


@pytest.mark.parametrize("error_class", EVERY_ERROR, ids=lambda error_class: error_class.__name__)
def test_every_error_answers_its_groups_status_and_its_own_kind(error_class: type[FloeError]) -> None:
    groups = [group for group in GROUP_STATUS if issubclass(error_class, group)]
    expected = CLASS_STATUS.get(error_class) or (GROUP_STATUS[groups[0]] if groups else 500)
    error = error_class("what went wrong")
    assert status_of(error) == expected
    assert error_body(error) == {"code": error_class.kind, "description": "what went wrong"}


def test_statuses_are_mapped_by_group_not_class_by_class() -> None:
    assert set(FLOE_STATUS_CODES) == {*GROUP_STATUS, *CLASS_STATUS, FloeError}


class _Engine:
    """Resolves every ref by raising ``error`` (a stand-in for a SearchEngine over a broken store)."""

    def __init__(self, error: FloeError) -> None:
        self.error = error

    def resolve(self, ref: str | None = None) -> str:
        raise self.error


def _answer(router: RefRouter, path: str) -> tuple[int, dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:  # pragma: no cover - the router answers before reading a body
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(router({"type": "http", "path": path, "root_path": ""}, receive, send))
    return sent[0]["status"], orjson.loads(sent[1]["body"])


async def _unreachable_app(scope: Any, receive: Any, send: Any) -> None:  # pragma: no cover
    raise AssertionError("the router must answer before the app runs")


@pytest.mark.parametrize(
    ("error", "path", "status", "code"),
    [
        (RefNotFound("no branch, tag or snapshot named 'x'"), "/refs/x/search", 404, "ref-not-found"),
        (CorruptRepository("snapshot S has no table pointer"), "/search", 500, "corrupt-repository"),
        (RefNotFound("unused: an empty ref is refused before resolving"), "/refs//", 404, "ref-not-found"),
    ],
)
def test_the_ref_router_answers_with_the_same_mapping(error: FloeError, path: str, status: int, code: str) -> None:
    router = RefRouter(_unreachable_app, _Engine(error), max_body_bytes=1024)  # type: ignore[arg-type]  # a stand-in engine
    answered_status, body = _answer(router, path)
    assert (answered_status, body["code"]) == (status, code)
