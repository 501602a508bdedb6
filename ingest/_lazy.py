"""Package namespaces whose names load on first use.

``import ingest`` (or ``ingest.pipeline``) used to import the repository, Icechunk, PyIceberg and zarr at once:
a second, before anything was asked of them. A process that needs one corner of floe (the STAC API search's page
reader, ``floe --help``) now pays only for that corner; ``from ingest import Repository`` works as before.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, namespace: dict[str, Any], homes: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: each name of ``homes`` imported from its module when first asked
    for, then kept in ``namespace`` (the package's globals) so it is looked up directly from then on."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        namespace[name] = value
        return value

    return __getattr__
