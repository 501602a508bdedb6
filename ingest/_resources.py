"""Files floe reads beside its code: ``configs/`` (the default settings) and ``schemas/`` (the items table).

They stay at the top of the repository, where people look for them. A
checkout reads them there; a wheel carries them as data files (pyproject's
``[tool.setuptools.data-files]``), which an install puts under its data
directory, ``<prefix>/share/floe/``, and floe finds them there.
"""

from __future__ import annotations

import site
import sys
import sysconfig
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
"""The folder holding the ``ingest`` package: a checkout (it holds pyproject.toml) or site-packages."""


def resource(relative: str) -> Path:
    """The file ``relative`` (``configs/default.toml``) of this floe, in its checkout or its install.

    Raises:
        FileNotFoundError: neither has it (an install made without floe's data files).
    """
    if (CHECKOUT / "pyproject.toml").is_file() and (CHECKOUT / relative).is_file():
        return CHECKOUT / relative
    bases = [sysconfig.get_path("data"), sys.prefix, site.getuserbase()]
    for base in dict.fromkeys(bases):
        candidate = Path(base) / "share" / "floe" / relative
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"floe's {relative} is neither in a checkout at {CHECKOUT} nor under {bases[0]}/share/floe: reinstall floe"
    )
