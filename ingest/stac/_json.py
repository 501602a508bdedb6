"""One tolerant JSON parser for everything floe reads: item sources, overflow columns, request bodies."""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

# An integer literal of 20 digits or more (not part of a float): orjson reads those beyond 64 bits as floats.
_LONG_INTEGER_TEXT = re.compile(r"(?<![\d.eE])\d{20,}(?![\d.eE])")
_LONG_INTEGER_BYTES = re.compile(rb"(?<![\d.eE])\d{20,}(?![\d.eE])")


def loads_json(text: str | bytes) -> Any:
    """Parse JSON exactly: fast (orjson) where that is exact, the standard parser where it is not.

    Real STAC items hold NaN and Infinity (which floe writes back with
    ``allow_nan``) and integers beyond 64 bits, which orjson refuses or, worse,
    reads as floats (2**70 + 1 becomes 1.1805916207174113e+21); the standard
    parser takes those exactly, and gives the error (``json.JSONDecodeError``,
    a ``ValueError``) for input that is not JSON at all, or nests deeper than
    Python can follow.
    """
    pattern = _LONG_INTEGER_BYTES if isinstance(text, bytes) else _LONG_INTEGER_TEXT
    try:
        if pattern.search(text):  # type: ignore[arg-type]  # the pattern matches the text's type
            return json.loads(text)
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            return json.loads(text)
    except RecursionError:
        # orjson stops at 1,024 levels and the standard parser at Python's recursion limit: no item nests so deep.
        document = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
        raise json.JSONDecodeError("the document nests too deeply to read", document, 0) from None
