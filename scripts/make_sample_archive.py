"""Generate a seeded sample archive of COG granules with STAC items (see ``ingest.sample``).

Run:  .venv/bin/python scripts/make_sample_archive.py OUT_DIR [--granules 40] [--seed 0] [--places 4]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ingest.sample import main, make_archive

__all__ = ["main", "make_archive"]

if __name__ == "__main__":
    sys.exit(main())
