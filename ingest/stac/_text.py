"""User input quoted in messages: on one line, and short (a 10,000-character id is not printed whole)."""

from __future__ import annotations

import re
from typing import Any

SHOWN_CHARACTERS = 80
"""How much of a value a message quotes; the rest is summarised by its length."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def shorten(text: str, limit: int = SHOWN_CHARACTERS) -> str:
    """``text`` if at most ``limit`` characters, else its start, an ellipsis and the full length."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text):,} characters)"


def one_line(text: str) -> str:
    """``text`` with line breaks and other control characters escaped, so it prints as one line."""
    return _CONTROL.sub(lambda match: repr(match.group())[1:-1], text)


def shown(value: Any, limit: int = SHOWN_CHARACTERS) -> str:
    """A value as a message quotes it: its repr (escaped, one line), cut to ``limit`` characters.

    A long string keeps its quotes and says its length: ``'aaaa…' (10,000 characters)``.
    """
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}… ({len(value):,} characters)"
    text = repr(value)
    if len(text) > limit:
        return f"{text[:limit]}… ({len(text):,} characters)"
    return text
