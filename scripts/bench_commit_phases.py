"""Where a commit's time goes as history grows: phase timers around floe's commit path, early against late.

Run:  .venv/bin/python scripts/bench_commit_phases.py 1000 /tmp/phases   (about a minute: 1,000 commits)
      .venv/bin/python scripts/bench_commit_phases.py 5000 /tmp/phases --expire-keep 720

Makes ``N`` commits of ``bench_commits.py``'s batch (10 items and one 64 x 64 granule) into a new repository at
``ROOT``, timing each commit and, inside it, the phases below (wrapped in this process only), then prints each
phase's median over commits 5-15 against the last 10, with the ratio, then 20 more commits alternately with the
stack's next free slot forgotten (the writer lists every slot, as before ``NextSlots``) and remembered, and the
sizes that grow with history:
the metadata.json, the manifests of the current snapshot, and Icechunk's ``repo`` object (every branch, tag
and snapshot of the repository, rewritten by each commit). Issue 52's flat-history item starts from this.
With ``--expire-keep K``, ``floe gc --grace 0s --expire-older-than`` then expires all but the newest K commits
(an hourly pipeline keeping 30 days: 720) and 20 more commits are timed: does expiry bring the cost back?
``--updates-per-file U`` creates the repository with Icechunk's ``num_updates_per_repo_info_file`` at U (the
ops log the repo object carries; 1,000 by default).
"""

from __future__ import annotations

import argparse
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
import ingest.repository._slots as S
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
wrap(S, "next_free_slot", "listing the stack's slots (next_free_slot)")


def summary(rows: list[tuple[float, dict[str, float]]]) -> dict[str, float]:
    """The median of the total and of each phase over ``rows``."""
    out = {"total": statistics.median(total for total, _ in rows)}
    for label in sorted({label for _, phases in rows for label in phases}):
        out[label] = statistics.median(phases.get(label, 0.0) for _, phases in rows)
    return out


def measured(
    repository: Repository, prefix: str, count: int, *, forget: bool = False
) -> list[tuple[float, dict[str, float]]]:
    """``count`` commits, each with its total and phase times. With ``forget``, the repository forgets its
    stacks' next free slots before each commit, so the writer lists the stack (as floe did before ``NextSlots``)."""
    rows = []
    for number in range(count):
        if forget:
            repository.next_slots = S.NextSlots()
        timers.clear()
        started = time.perf_counter()
        bc.floe_commit(repository, f"{prefix}{number}", with_array=True)
        rows.append((time.perf_counter() - started, dict(timers)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("commits", type=int)
    parser.add_argument("root", type=Path)
    parser.add_argument(
        "--expire-keep",
        type=int,
        default=None,
        help="then expire all but the newest K commits (floe gc --grace 0s --expire-older-than) and time 20 more",
    )
    parser.add_argument(
        "--updates-per-file",
        type=int,
        default=None,
        help="Icechunk's num_updates_per_repo_info_file for the new repository (its default: 1,000)",
    )
    arguments = parser.parse_args()
    commits, root = arguments.commits, arguments.root
    if arguments.updates_per_file is not None:
        import ingest.repository._repo as repo_module

        made = repo_module.stack_config

        def with_fewer_updates(split: int) -> object:
            config = made(split)
            config.num_updates_per_repo_info_file = arguments.updates_per_file
            return config

        repo_module.stack_config = with_fewer_updates  # type: ignore[assignment]
    repository = Repository.create(root, Settings())
    repository.ensure_groups(["bench"])
    rows, stamps = [], []
    for number in range(commits):
        rows += measured(repository, f"h{number}-", 1)
        stamps.append(time.time())
    repo_object = root / "arrays" / "repo"
    columns = {"commits 5-15": summary(rows[5:15]), f"last 10 of {commits:,}": summary(rows[-10:])}
    # The baseline of NextSlots in the same run: 20 more commits, alternately listing the stack and not.
    listing: list[tuple[float, dict[str, float]]] = []
    remembered: list[tuple[float, dict[str, float]]] = []
    for number in range(10):
        listing += measured(repository, f"listing{number}-", 1, forget=True)
        remembered += measured(repository, f"remembered{number}-", 1)
    columns["10 more, listing the stack"] = summary(listing)
    columns["10 more, next slot remembered"] = summary(remembered)
    sizes = {"before": repo_object.stat().st_size}
    if arguments.expire_keep is not None:
        from datetime import timedelta

        from ingest.lifecycle import gc

        age = time.time() - stamps[-arguments.expire_keep]
        started = time.perf_counter()
        report = gc(repository, grace=timedelta(0), expire_older_than=timedelta(seconds=age))
        print(f"gc with expiry: {time.perf_counter() - started:.1f} s, {len(report.deleted):,} files deleted")
        repository = Repository.open(root, Settings())
        columns[f"20 after expiring all but {arguments.expire_keep:,}"] = summary(measured(repository, "after-", 20))
        sizes["after expiry"] = repo_object.stat().st_size
    early = columns["commits 5-15"]
    print("| phase | " + " | ".join(f"{name} (ms)" for name in columns) + " | last / early |")
    print("|---|" + "---|" * len(columns) + "---|")
    late = columns[f"last 10 of {commits:,}"]
    labels = [*early, *sorted({label for column in columns.values() for label in column} - set(early))]
    for label in labels:
        cells = " | ".join(f"{column.get(label, 0.0) * 1000:.1f}" for column in columns.values())
        ratio = f"{late.get(label, 0.0) / early[label]:.2f}x" if early.get(label) else "-"
        print(f"| {label} | {cells} | {ratio} |")
    view = repository.view()
    manifests = len(view.table.current_snapshot().manifests(repository.io))
    print(
        f"\nmetadata.json {Path(view.metadata_location).stat().st_size:,} bytes; {manifests} manifests; "
        f"Icechunk's repo object: " + ", ".join(f"{size:,} bytes {when}" for when, size in sizes.items())
    )


if __name__ == "__main__":
    main()
