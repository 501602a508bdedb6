"""The fields extension: which members of each item a search response keeps.

Clients ask with GET ``fields=id,-properties.x`` or POST
``{"include": [...], "exclude": [...]}``; :func:`apply_fields` trims one item
accordingly, always keeping what identifies it as a Feature.
"""

from __future__ import annotations

from typing import Any


def requested_fields(value: Any) -> tuple[set[str], set[str], bool]:
    """GET ``fields=id,-properties.x`` or POST ``{"include": [...], "exclude": [...]}``.

    Returns (include, exclude, include_given): an ``include`` member that is
    present but empty asks for the default field set.
    """
    if value is None:
        return set(), set(), False
    if isinstance(value, list | tuple | set):
        include, exclude = set(), set()
        for entry in value:
            text = str(entry).strip()
            if text.startswith("-"):
                exclude.add(text[1:])
            elif text:
                include.add(text.lstrip("+"))
        return include, exclude, False
    given = "include" in getattr(value, "model_fields_set", set())
    return set(getattr(value, "include", None) or ()), set(getattr(value, "exclude", None) or ()), given


# What the fields extension always keeps, so a trimmed item is still an identifiable Feature.
_ALWAYS = ("type", "stac_version", "id", "collection")
# The default set when ``include`` is given but empty.
_DEFAULT = (*_ALWAYS, "geometry", "bbox", "links", "assets", "properties.datetime")


def _pick(item: dict[str, Any], path: list[str]) -> tuple[bool, Any]:
    value: Any = item
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return False, None
        value = value[key]
    return True, value


def _put(target: dict[str, Any], path: list[str], value: Any) -> None:
    for key in path[:-1]:
        target = target.setdefault(key, {})
    target[path[-1]] = value


def _drop(target: dict[str, Any], path: list[str]) -> None:
    parent: Any = target
    for key in path[:-1]:
        parent = parent.get(key)
        if not isinstance(parent, dict):
            return
    parent.pop(path[-1], None)


def apply_fields(
    item: dict[str, Any], include: set[str], exclude: set[str], include_given: bool = False
) -> dict[str, Any]:
    """The fields extension: keep ``include`` (or the default set), then drop ``exclude`` unless included."""
    if include or include_given:
        trimmed: dict[str, Any] = {}
        for path in [*_ALWAYS, *sorted(include)] if include else _DEFAULT:
            found, value = _pick(item, path.split("."))
            if found:
                _put(trimmed, path.split("."), value)
        item = trimmed
    for path in exclude:
        # An include of the same or a deeper path wins over the exclude.
        if path in _ALWAYS or any(kept == path or kept.startswith(path + ".") for kept in include):
            continue
        _drop(item, path.split("."))
    return item
