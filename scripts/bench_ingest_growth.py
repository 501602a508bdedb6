"""Does an ingest hold its rate as the table grows? The time of a batch's ingest, first tenth against last tenth.

Run:  .venv/bin/python scripts/bench_ingest_growth.py                       (150 batches of 1,000, both id styles)
      .venv/bin/python scripts/bench_ingest_growth.py --batches 40 --ids tile     (a smoke run)

Each batch is its own `ingest_items` call on one repository object, as an hourly
pipeline or a long bulk load makes them: the re-run check (which items exist
already), the data files, the commit and the compaction that runs after an
ingest. Two id styles:

* ``seq``: ids in arrival order (``item-0000001``): each file's id bounds are
  disjoint, so bounds alone prune the re-run check;
* ``tile``: ids tile first (``T123-0000001``), as Sentinel-2 and Landsat name
  scenes: every file's id range spans every id, so bounds prune nothing.

The baseline is the run's own first tenth of batches; the ratio says how much
slower the last tenth is (1.0: the cost of a batch does not grow with the table).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ingest import generated_items

from ingest import Repository, Settings
from ingest.pipeline import ingest_items


def run(batches: int, size: int, ids: str) -> tuple[float, float, int]:
    """Median seconds of the first and the last tenth of the batches, and the live data files at the end."""
    items = generated_items(batches * size)
    if ids == "tile":
        for index, item in enumerate(items):
            item["id"] = f"T{index % 500:03d}-{index:07d}"
    with tempfile.TemporaryDirectory() as workdir:
        root = Path(workdir) / "repo"
        repository = Repository.create(root, Settings(root=str(root)))
        source = Path(workdir) / "batch.ndjson"
        seconds = []
        for number in range(batches):
            source.write_text("".join(json.dumps(item) + "\n" for item in items[number * size : (number + 1) * size]))
            started = time.perf_counter()
            ingest_items(repository, [source], batch_size=size)
            seconds.append(time.perf_counter() - started)
            if (number + 1) % max(1, batches // 10) == 0:
                print(f"  {ids}: {number + 1}/{batches} batches", file=sys.stderr, flush=True)
        files = sum(1 for _ in repository.view().table.scan().plan_files())
    tenth = max(1, batches // 10)
    return statistics.median(seconds[:tenth]), statistics.median(seconds[-tenth:]), files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=150)
    parser.add_argument("--size", type=int, default=1000, help="items per batch (default 1,000)")
    parser.add_argument("--ids", choices=("seq", "tile", "both"), default="both")
    args = parser.parse_args()
    styles = ("seq", "tile") if args.ids == "both" else (args.ids,)
    print(f"{args.batches} batches of {args.size:,} items, each its own ingest on one repository object\n")
    print("| ids | first tenth, ms per batch | last tenth, ms per batch | last / first | live data files at the end |")
    print("|---|---|---|---|---|")
    for style in styles:
        first, last, files = run(args.batches, args.size, style)
        print(f"| {style} | {first * 1000:,.0f} | {last * 1000:,.0f} | {last / first:.2f}x | {files:,} |", flush=True)


if __name__ == "__main__":
    main()
