"""Lifecycle benchmark: gc time against history length; incremental replicate against a plain copy.

    python scripts/bench_lifecycle.py            # gc at 100, 1,000 and 5,000 commits; replicate 200 + 20 commits
    python scripts/bench_lifecycle.py --quick    # gc at 50 and 200 commits; replicate 40 + 10 commits

gc: one history is grown by tiny commits (one item each, no arrays) and ``floe
gc --grace 0s`` runs at each length; the baseline is the same gc at the first
length, so the ratio shows how gc scales with history. It also prints how many
table files gc read against how many live files there are (each file is read
once, whatever the number of versions sharing it).

replicate: a source with arrays (one 64x64 int32 chunk per commit) is
replicated to a local target; after more commits, an incremental replicate
runs. Its bytes written are compared with the bytes the new commits wrote
(every new file under arrays/ and tables/, the refs object aside), and its time
with a plain copy of just those files (``shutil.copyfile`` each) in the same run.
At the same two moments a replica without history (``--history none --refs
main``) is made and brought up to date: its bytes on disk and seconds against
the full replica's, and its incremental run's bytes written against the new
commits' bytes. Local roots on both sides: absolute times on this shared machine are noise, the
ratios are the result.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from ingest import Repository, Settings
from ingest.lifecycle import gc, replicate
from ingest.pipeline import georeferenced, stage_arrays
from ingest.stac import arrays_asset, with_arrays_asset
from ingest.storage import quiet_icechunk_logs


def tiny_item(number: int) -> dict:
    return {
        "type": "Feature",
        "stac_version": "1.0.0",
        "stac_extensions": [],
        "id": f"item-{number:06d}",
        "collection": "bench",
        "geometry": {"type": "Point", "coordinates": [number % 360 - 180, 0.0]},
        "bbox": [number % 360 - 180, 0.0, number % 360 - 180, 0.0],
        "properties": {"datetime": f"2024-{number % 12 + 1:02d}-01T00:00:00Z"},
        "assets": {},
        "links": [],
    }


def commit_tiny(repository: Repository, number: int) -> None:
    writer = repository.writer()
    writer.add_item(tiny_item(number))
    writer.commit(f"tiny {number}")


def commit_with_array(repository: Repository, number: int) -> None:
    writer = repository.writer()
    pixels = np.random.default_rng(number).integers(0, 2**31 - 1, size=(64, 64), dtype="int32")
    granule = georeferenced(pixels, "EPSG:32633", (10.0, 0.0, 500_000.0, 0.0, -10.0, 4_200_000.0))
    item = tiny_item(number)
    placed, _ = stage_arrays(writer, item, {"data": granule})
    writer.add_item(with_arrays_asset(item, arrays_asset(placed)))
    writer.commit(f"array {number}")


def files_under(root: Path) -> dict[str, int]:
    found = {}
    for sub in ("arrays", "tables"):
        for path in (root / sub).rglob("*"):
            if path.is_file():
                relative = str(path.relative_to(root))
                if relative != "arrays/repo" and not relative.startswith("arrays/overwritten/"):
                    found[relative] = path.stat().st_size
    return found


def bench_gc(workdir: Path, lengths: list[int]) -> list[str]:
    repository = Repository.create(workdir / "gc", Settings())
    repository.ensure_groups(["bench"])
    rows = []
    baseline = None
    made = 0
    for length in lengths:
        started = time.perf_counter()
        while made < length:
            commit_tiny(repository, made)
            made += 1
        build = time.perf_counter() - started
        started = time.perf_counter()
        report = gc(repository, grace=timedelta(0))
        seconds = time.perf_counter() - started
        baseline = baseline or seconds
        rows.append(
            f"| gc --grace 0s at {length:,} commits | {seconds:.2f} s "
            f"({seconds / report.snapshots_in_history * 1000:.2f} ms/snapshot; {report.table_reads:,} table reads "
            f"for {report.live_files:,} live files; {len(report.deleted)} deleted) "
            f"| {baseline:.2f} s (gc at {lengths[0]:,} commits) | {seconds / baseline:.2f}x "
            f"(history {length / lengths[0]:.0f}x) |"
        )
        print(f"gc at {length} commits: {seconds:.2f} s (history built in {build:.0f} s)", file=sys.stderr)
    return rows


def bench_replicate(workdir: Path, history: int, new: int) -> list[str]:
    source_root, target_root = workdir / "source", workdir / "target"
    source = Repository.create(source_root, Settings())
    source.ensure_groups(["bench"])
    for number in range(history):
        commit_with_array(source, number)
    started = time.perf_counter()
    first = replicate(str(source_root), str(target_root), Settings())
    first_seconds = time.perf_counter() - started
    heads_root = workdir / "heads"
    started = time.perf_counter()
    replicate(str(source_root), str(heads_root), Settings(), refs=["main"], history="none")
    heads_seconds = time.perf_counter() - started
    full_size, heads_size = sum(files_under(target_root).values()), sum(files_under(heads_root).values())

    before = files_under(source_root)
    for number in range(history, history + new):
        commit_with_array(source, number)
    after = files_under(source_root)
    new_files = {path: size for path, size in after.items() if path not in before}
    new_bytes = sum(new_files.values())

    started = time.perf_counter()
    incremental = replicate(str(source_root), str(target_root), Settings())
    seconds = time.perf_counter() - started
    heads_before = files_under(heads_root)
    started = time.perf_counter()
    heads = replicate(str(source_root), str(heads_root), Settings(), refs=["main"], history="none")
    heads_incremental_seconds = time.perf_counter() - started
    heads_written = sum(size for path, size in files_under(heads_root).items() if path not in heads_before)

    plain = workdir / "plain"
    started = time.perf_counter()
    for path in new_files:
        destination = plain / path
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source_root / path, destination)
    plain_seconds = time.perf_counter() - started

    assert sorted(incremental.files_written) == sorted(new_files), "replicate copied other files than the new ones"
    return [
        f"| first replicate, {history} commits with arrays | {first_seconds:.2f} s, {len(first.files_written):,} "
        f"files, {first.bytes_written:,} B | — | — |",
        f"| incremental replicate after {new} commits: bytes written | {incremental.bytes_written:,} B "
        f"({len(incremental.files_written)} files) | {new_bytes:,} B written by the new commits "
        f"({len(new_files)} files) | {incremental.bytes_written / new_bytes:.3f}x |",
        f"| incremental replicate after {new} commits: time | {seconds:.3f} s | {plain_seconds:.3f} s "
        f"(plain copy of just the new files) | {seconds / plain_seconds:.1f}x |",
        f"| --history none --refs main, first run: size of the target | {heads_size:,} B | {full_size:,} B "
        f"(full replica, every ref's history) | {heads_size / full_size:.3f}x |",
        f"| --history none --refs main, first run: time | {heads_seconds:.2f} s | {first_seconds:.2f} s "
        f"(full replica) | {heads_seconds / first_seconds:.2f}x |",
        f"| --history none after {new} commits: bytes written (every new file at the target) | {heads_written:,} B "
        f"({heads.chunks_copied} chunks through Icechunk) | {new_bytes:,} B written by the new commits "
        f"| {heads_written / new_bytes:.3f}x |",
        f"| --history none after {new} commits: time | {heads_incremental_seconds:.3f} s | {seconds:.3f} s "
        f"(incremental full replica) | {heads_incremental_seconds / seconds:.1f}x |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, a smoke run")
    parser.add_argument(
        "--gc-lengths", type=lambda text: [int(n) for n in text.split(",")], default=None, help="e.g. 100,1000,5000"
    )
    args = parser.parse_args()
    quiet_icechunk_logs()
    lengths = args.gc_lengths or ([50, 200] if args.quick else [100, 1000, 5000])
    history, new = (40, 10) if args.quick else (200, 20)
    with tempfile.TemporaryDirectory(prefix="floe-bench-lifecycle-") as directory:
        workdir = Path(directory)
        rows = bench_gc(workdir, lengths)
        rows += bench_replicate(workdir, history, new)
    print("| figure | floe | baseline (same run) | ratio |")
    print("|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
