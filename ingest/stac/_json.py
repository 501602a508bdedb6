"""One tolerant JSON parser for everything floe reads: item sources, overflow columns, request bodies."""

from __future__ import annotations

import json
from typing import Any

import orjson

# orjson reads integers beyond 64 bits as floats. A run of 20 digits anywhere (an integer that long, or a long
# fraction, or digits in a string) sends a document to the exact parser instead. Found by mapping every digit to
# a zero byte and looking for 20 in a row: two C-speed passes, about 1 us for a typical item (a regular
# expression took 10-19 us, several times the parse itself).
_DIGITS_TO_ZERO = bytes(0 if 0x30 <= byte <= 0x39 else 1 for byte in range(256))
_TWENTY_DIGITS = bytes(20)


def loads_json(text: str | bytes) -> Any:
    """Parse JSON exactly: fast (orjson) where that is exact, the standard parser where it is not.

    See :func:`read_json_noting_parser`.
    """
    return read_json_noting_parser(text)[0]


def read_json_noting_parser(text: str | bytes) -> tuple[Any, bool]:
    """:func:`loads_json`'s document, and whether orjson read it: then it holds no NaN, no infinity and no
    integer beyond 64 bits, and ``orjson.dumps`` writes it back exactly.

    Real STAC items hold NaN and Infinity (which floe writes back with
    ``allow_nan``) and integers beyond 64 bits, which orjson refuses or, worse,
    reads as floats (2**70 + 1 becomes 1.1805916207174113e+21); the standard
    parser takes those exactly, and gives the error (``json.JSONDecodeError``,
    a ``ValueError``) for input that is not JSON at all, or nests deeper than
    Python can follow; bytes that are not UTF-8 raise ``UnicodeDecodeError``.
    """
    raw = text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")
    try:
        if _TWENTY_DIGITS in raw.translate(_DIGITS_TO_ZERO):
            return json.loads(text), False
        try:
            return orjson.loads(text), True
        except orjson.JSONDecodeError:
            return json.loads(text), False
    except RecursionError:
        # orjson stops at 1,024 levels and the standard parser at Python's recursion limit: no item nests so deep.
        document = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
        raise json.JSONDecodeError("the document nests too deeply to read", document, 0) from None
