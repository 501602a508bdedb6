"""One tolerant JSON parser for everything floe reads: item sources, overflow columns, request bodies."""

from __future__ import annotations

import json
from typing import Any

import orjson


def loads_json(text: str | bytes) -> Any:
    """Parse JSON fast (orjson), falling back to the standard parser for what orjson refuses.

    Real STAC items hold NaN and Infinity (which floe writes back with
    ``allow_nan``) and integers beyond 64 bits; the standard parser takes
    those, and gives the error (``json.JSONDecodeError``, a ``ValueError``)
    for input that is not JSON at all.
    """
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)
