"""Where a commit's time goes as history grows: phase timers around floe's commit path, early against late.

Run:  .venv/bin/python scripts/bench_commit_phases.py 1000 /tmp/phases   (about a minute: 1,000 commits)

Makes ``N`` commits of ``bench_commits.py``'s batch (10 items and one 64 x 64 granule) into a new repository at
``ROOT``, timing each commit and, inside it, the phases below (wrapped in this process only), then prints each
phase's median over commits 5-15 against the last 10, with the ratio, and the sizes that grow with history:
the metadata.json, the manifests of the current snapshot, and Icechunk's ``repo`` object (every branch, tag
and snapshot of the repository, rewritten by each commit). Issue 52's flat-history item starts from this.
"""

from __future__ import annotations

import collections
import functools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_commits as bc

import ingest.repository._append as A
import ingest.repository._catalog as CAT
import ingest.repository._commit as C
import ingest.repository._plan as P
import ingest.repository._writer as W
from ingest import Repository, Settings

timers: dict[str, float] = collections.defaultdict(float)


def wrap(owner: object, name: str, label: str) -> None:
    """Time every call of ``owner.name`` under ``label`` (for the commit being made)."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def timed(*args: object, **kwargs: object) -> object:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            timers[label] += time.perf_counter() - started

    setattr(owner, name, timed)


wrap(C, "_swap", "swap (icechunk commit)")
wrap(C, "_tip_moved", "tip look")
wrap(C.Base, "table", "base table load")
wrap(P.ItemsPlan, "_write_metadata", "write metadata (manifests+list+json)")
wrap(P.ItemsPlan, "_files_for", "data files")
wrap(CAT.PointerCatalog, "commit_table", "catalog.commit_table (metadata.json)")
wrap(A, "plan_commit", "plan_commit (manifests, list)")
wrap(W.Writer, "__init__", "writer open")
wrap(C.Base, "at", "Base.at")


def summary(rows: list[tuple[float, dict[str, float]]]) -> dict[str, float]:
    """The median of the total and of each phase over ``rows``."""
    out = {"total": statistics.median(total for total, _ in rows)}
    for label in sorted({label for _, phases in rows for label in phases}):
        out[label] = statistics.median(phases.get(label, 0.0) for _, phases in rows)
    return out


def main() -> None:
    commits, root = int(sys.argv[1]), Path(sys.argv[2])
    repository = Repository.create(root, Settings())
    repository.ensure_groups(["bench"])
    rows = []
    for number in range(commits):
        timers.clear()
        started = time.perf_counter()
        bc.floe_commit(repository, f"h{number}", with_array=True)
        rows.append((time.perf_counter() - started, dict(timers)))
    early, late = summary(rows[5:15]), summary(rows[-10:])
    print(f"| phase | commits 5-15 (ms) | last 10 of {commits:,} (ms) | ratio |\n|---|---|---|---|")
    for label, value in early.items():
        print(f"| {label} | {value * 1000:.1f} | {late[label] * 1000:.1f} | {late[label] / value:.2f}x |")
    view = repository.view()
    manifests = len(view.table.current_snapshot().manifests(repository.io))
    repo_object = root / "arrays" / "repo"
    print(
        f"\nmetadata.json {Path(view.metadata_location).stat().st_size:,} bytes; {manifests} manifests; "
        f"Icechunk's repo object {repo_object.stat().st_size:,} bytes"
    )


if __name__ == "__main__":
    main()
