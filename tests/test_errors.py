"""The error tree: handlers can branch on the parent (and on builtins), every kind is stable and unique."""

from __future__ import annotations

import inspect

import pytest

from ingest import errors


def every_error() -> list[type[errors.FloeError]]:
    return [
        value
        for value in vars(errors).values()
        if inspect.isclass(value) and issubclass(value, errors.FloeError) and value.__module__ == errors.__name__
    ]


def test_every_error_has_its_own_kind():
    kinds = [error.kind for error in every_error()]
    assert len(kinds) == len(set(kinds)), "two errors share a kind"
    assert all(kind and kind == kind.lower() and " " not in kind for kind in kinds)


def test_every_error_belongs_to_one_group_named_in_the_docstring():
    groups = (
        errors.NotFound,
        errors.AlreadyExists,
        errors.InvalidInput,
        errors.Conflict,
        errors.Corrupt,
        errors.Unavailable,
        errors.WriterClosed,
        errors.Refused,
    )
    for error in every_error():
        if error is errors.FloeError:
            continue
        assert issubclass(error, groups), f"{error.__name__} is in no group"
        assert error.__name__ in errors.__doc__, f"{error.__name__} is missing from the tree in errors.py"


@pytest.mark.parametrize(
    ("error", "builtin"),
    [
        (errors.RefNotFound("no ref 'x'"), KeyError),
        (errors.CollectionNotFound("no collection"), KeyError),
        (errors.InvalidSearch("bad bbox"), ValueError),
        (errors.InvalidItem("no id", source="f.json"), ValueError),
        (errors.InvalidRoot("bad root"), ValueError),
    ],
)
def test_groups_are_also_the_builtins_callers_already_catch(error, builtin):
    with pytest.raises(builtin):
        raise error


def test_a_not_found_message_reads_as_written():
    # KeyError would quote it; floe's messages are sentences.
    assert str(errors.RefNotFound("no branch, tag or snapshot named 'x'")) == "no branch, tag or snapshot named 'x'"


def test_an_invalid_item_names_its_source_and_id():
    error = errors.InvalidItem("item has no geometry", item_id="a", source="items.ndjson:3")
    assert str(error) == "in items.ndjson:3 item 'a': item has no geometry"
    assert (error.source, error.item_id, error.reason) == ("items.ndjson:3", "a", "item has no geometry")
