"""Schemathesis hooks for floe's runs (``SCHEMATHESIS_HOOKS=tests.api.schemathesis_hooks``): every response counted.

Each response's status, method and path are appended to the file named by
``FLOE_SCHEMATHESIS_LOG``, so a run can report how many requests it made and
how many answered 5xx (schemathesis' own reports count test cases, not responses).
"""

from __future__ import annotations

import os
from typing import Any

import schemathesis

LOG_VARIABLE = "FLOE_SCHEMATHESIS_LOG"


@schemathesis.hook
def after_call(context: Any, case: Any, response: Any) -> None:
    log = os.environ.get(LOG_VARIABLE)
    if log:
        with open(log, "a") as out:
            out.write(f"{response.status_code} {case.method} {response.request.url}\n")
