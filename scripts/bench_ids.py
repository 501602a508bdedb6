"""What an archive's ids cost: the same items ingested with ids that follow their arrival (``item-0000001``) and with
ids that name a tile first (``S2A_T09463_20240101_0000001``), as real archives name them.

Run:  .venv/bin/python scripts/bench_ids.py                      (1,000,000 items, 3 rounds: ~5 min here)
      .venv/bin/python scripts/bench_ids.py --items 200000 --rounds 1

``scripts/bench_ingest.py``'s generated items are written twice as stac-geoparquet, identical but for their ids,
and each file is ingested by ``ingest_items`` (``floe ingest --workers 0``) at its defaults into a fresh local
repository, in a fresh process each run, the two alternating round by round (the order flipped every round).

Every batch asks whether the table holds its keys already (a re-run's check, ``_replace.find``). Ids that follow
arrival fall outside every earlier file's id bounds, so no file is looked at. Tile-first ids fall inside nearly
every file's bounds, so each file's 32-bit id fingerprints are probed (``KeyIndex.holding``), and a fingerprint
that matches by chance makes the file be read to confirm it. Such chance matches grow with the rows stored times
the batch's keys (about stored x batch / 2^32 a batch), so the script also counts the files read to confirm and
how many of them held a key. ``ratio`` is tile-first's median time over arrival's. Nothing asserts on a time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

_CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from ingest import Repository, Settings
from ingest.pipeline import ingest_items
import ingest.repository._replace as replace
from ingest.repository._keys import KeyIndex
counts = {"read": 0, "held": 0}
holding, locate = KeyIndex.holding, replace.locate
def counted_holding(self, files, ids):
    kept = holding(self, files, ids)
    counts["read"] += len(kept)
    return kept
def counted_locate(cache, files, keys):
    found = locate(cache, files, keys)
    counts["held"] += len(found)
    return found
KeyIndex.holding, replace.locate = counted_holding, counted_locate
repository = Repository.create(sys.argv[3], Settings())
started = time.perf_counter()
report = ingest_items(repository, [Path(sys.argv[2])])
seconds = time.perf_counter() - started
assert report.rows_added == int(sys.argv[4]) and not report.rejected, report.rejected[:3]
print(json.dumps({"seconds": seconds, **counts}))
"""


def tile_first(items: list[dict]) -> list[dict]:
    """The items with ids that name a tile (one of 20,000, at random) and a date before their number."""
    import numpy as np

    tiles = np.random.default_rng(1).integers(0, 20_000, size=len(items))
    for item, tile in zip(items, tiles.tolist(), strict=True):
        day = item["properties"]["datetime"][:10].replace("-", "")
        item["id"] = f"S2A_T{tile:05d}_{day}_{item['id'].removeprefix('item-')}"
    return items


def write(path: Path, items: list[dict]) -> Path:
    import pyarrow as pa
    import stac_geoparquet.arrow as sga

    sga.to_parquet(pa.Table.from_batches(sga.parse_stac_items_to_arrow(items)), path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=1_000_000, help="generated items in each file")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each file, alternating")
    arguments = parser.parse_args()
    from scripts.bench_ingest import generated_items

    runs: dict[str, list[dict]] = {"arrival": [], "tile-first": []}
    with tempfile.TemporaryDirectory(prefix="floe-bench-ids-") as temporary:
        workdir = Path(temporary)
        files = {
            "arrival": write(workdir / "arrival.parquet", generated_items(arguments.items)),
            "tile-first": write(workdir / "tiles.parquet", tile_first(generated_items(arguments.items))),
        }
        for round_number in range(arguments.rounds):
            order = ["arrival", "tile-first"] if round_number % 2 == 0 else ["tile-first", "arrival"]
            for name in order:
                root = workdir / f"{name}-{round_number}"
                child = [sys.executable, "-c", _CHILD, str(ROOT), str(files[name]), str(root), str(arguments.items)]
                done = subprocess.run(child, capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
                runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(f"{name}: {runs[name][-1]}", file=sys.stderr, flush=True)
    print(f"{arguments.items:,} items, {arguments.rounds} rounds (median seconds; files read to confirm a key: a run)")
    print("| ids | seconds | items/s | files read to confirm | of them holding a key | rounds |")
    print("|---|---|---|---|---|---|")
    medians = {}
    for name, results in runs.items():
        medians[name] = statistics.median(result["seconds"] for result in results)
        rounds = ", ".join(f"{result['seconds']:.2f}" for result in results)
        print(
            f"| {name} | {medians[name]:.2f} | {arguments.items / medians[name]:,.0f} | {results[0]['read']} | "
            f"{results[0]['held']} | {rounds} |"
        )
    print(f"ratio tile-first / arrival: **{medians['tile-first'] / medians['arrival']:.2f}x**")


if __name__ == "__main__":
    main()
