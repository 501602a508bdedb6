"""What a CQL2 filter must satisfy before floe evaluates it: bounded size and nesting, known operators with the
right number of arguments, and valid geometry literals.

The bounds are checked on the raw text or JSON, before any parser sees it
(:func:`check_filter_bounds`); the rest on the parsed expression
(:func:`check_expression`). Every failure is an InvalidSearch naming the part.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from ingest.api._geometry import checked_geometry, is_geometry_literal
from ingest.errors import InvalidSearch
from ingest.stac import shown

MAX_FILTER_CHARS = 65_536
"""The longest filter accepted (as text; a cql2-json object is measured as its nesting, below)."""
MAX_FILTER_NESTING = 64
"""The deepest filter accepted: parentheses and NOTs in cql2-text; twice that (objects and their args) in JSON."""
_QUOTED_TEXT = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"")
_QUOTED_JSON = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT = re.compile(r"\bnot\b", re.IGNORECASE)


def check_filter_bounds(value: str | dict[str, Any]) -> None:
    """Refuse a filter too long or too deeply nested, before any parser sees it.

    The cql2 parser recurses on the native stack: a filter nested about two
    thousand deep (parentheses, NOTs, JSON objects) overflows it and kills the
    process, taking every client's service with it. Real filters nest a few
    levels; the limits are far above them and far below the crash.
    """
    if isinstance(value, str):
        if len(value) > MAX_FILTER_CHARS:
            raise InvalidSearch(f"the filter has {len(value):,} characters; at most {MAX_FILTER_CHARS:,} are accepted")
        if value.lstrip().startswith(("{", "[")):
            depth = _bracket_depth(_QUOTED_JSON.sub('""', value), "{[", "}]") // 2
        else:
            unquoted = _QUOTED_TEXT.sub("''", value)
            depth = _bracket_depth(unquoted, "(", ")") + len(_NOT.findall(unquoted))
    else:
        depth = _object_depth(value) // 2
    if depth > MAX_FILTER_NESTING:
        raise InvalidSearch(f"the filter nests {depth} deep; at most {MAX_FILTER_NESTING} levels are accepted")


def _bracket_depth(text: str, opening: str, closing: str) -> int:
    depth = deepest = 0
    for char in text:
        if char in opening:
            depth += 1
            deepest = max(deepest, depth)
        elif char in closing:
            depth -= 1
    return deepest


def _object_depth(value: Any) -> int:
    """How deep JSON objects and arrays nest in ``value`` (iteratively: the input may be deeper than the stack)."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        node, depth = pending.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > 2 * MAX_FILTER_NESTING + 2:
            return deepest  # deep enough to refuse: no need to walk the rest
        pending.extend((child, depth + 1) for child in children)
    return deepest


# Every operator and function of CQL2 that the cql2 package evaluates, with how many arguments each takes (a
# minimum, and a maximum or None for any number). Checking names and arities here is enough: the parser checks the
# syntax, and Expr.validate (a JSON-schema check) costs ~100 ms per call. The cql2 package itself accepts
# ``{"op": "=", "args": [{"property": "id"}]}`` and then matches nothing: a search that looks answered but is not.
_ARITY: dict[str, tuple[int, int | None]] = {
    "and": (2, None), "or": (2, None), "not": (1, 1), "isNull": (1, 1), "casei": (1, 1), "accenti": (1, 1),
    "between": (2, 3),  # (value, low, high), or the older (value, [low, high])
    **{op: (2, 2) for op in ("=", "<>", "<", "<=", ">", ">=", "like", "in", "+", "-", "*", "/", "%", "^", "div")},
    **{
        op: (2, 2)
        for op in (
            "s_intersects", "s_equals", "s_disjoint", "s_touches", "s_within", "s_overlaps", "s_crosses",
            "s_contains", "t_after", "t_before", "t_contains", "t_disjoint", "t_during", "t_equals", "t_finishedBy",
            "t_finishes", "t_intersects", "t_meets", "t_metBy", "t_overlappedBy", "t_overlaps", "t_startedBy",
            "t_starts", "a_equals", "a_contains", "a_containedBy", "a_overlaps",
        )
    },
}  # fmt: skip
KNOWN_OPERATORS = frozenset(_ARITY)


def check_expression(node: Any) -> None:
    """Refuse unknown operators, wrong numbers of arguments and invalid geometry literals anywhere in ``node``.

    The filter's nesting is bounded before parsing, so this recursion is too.
    """
    if isinstance(node, list):
        for element in node:
            check_expression(element)
        return
    if not isinstance(node, dict):
        return
    if is_geometry_literal(node):
        checked_geometry(node, f"the filter's geometry {short(node)}")
        return
    if "bbox" in node and "op" not in node:
        _check_bbox_literal(node["bbox"])
        return
    op = node.get("op")
    if op is None:
        return
    if op not in KNOWN_OPERATORS:
        raise InvalidSearch(f"unknown CQL2 operator or function {short(op)}")
    args = node.get("args")
    if not isinstance(args, list):
        raise InvalidSearch(f"CQL2 {op!r} needs its arguments as a list (args)")
    least, most = _ARITY[op]
    if len(args) < least or (most is not None and len(args) > most):
        wanted = f"{least}" if least == most else f"at least {least}" if most is None else f"{least} to {most}"
        raise InvalidSearch(f"CQL2 {op!r} takes {wanted} arguments, not {len(args)}: {short(node)}")
    for value in args:
        check_expression(value)


def _check_bbox_literal(box: Any) -> None:
    numbers = box if isinstance(box, list) else []
    if len(numbers) not in (4, 6) or not all(
        isinstance(number, int | float) and not isinstance(number, bool) and math.isfinite(number) for number in numbers
    ):
        raise InvalidSearch(f"the filter's BBOX {short(box)} must be 4 or 6 finite numbers")
    half = len(numbers) // 2
    if numbers[1] > numbers[half + 1]:
        raise InvalidSearch(f"the filter's BBOX {short(box)}: its southern edge lies north of its northern edge")


def short(value: Any) -> str:
    """A filter's part as an error quotes it: its text (JSON for a JSON part), cut to 200 characters."""
    return shown(value if isinstance(value, str) else json.dumps(value), 200)
