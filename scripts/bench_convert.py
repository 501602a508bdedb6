"""Items to Arrow and back: floe's converter against stac-geoparquet's and rustac's, on the same items.

Issue 11 asks ingest to use the fastest well-kept converter that keeps the
exact round trip. This measures, per item, each library's conversion of
validated items to an Arrow table and back, and counts the items that come
back equal to what went in (matched by id: floe orders rows by place).
rustac is not a floe dependency: install it (``pip install rustac``) to
include it; it is reported as absent otherwise.

    .venv/bin/python scripts/bench_convert.py [--items 20000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "scripts"))

from bench_scale import item_chunks  # noqa: E402

from ingest.stac import arrow_to_items, items_to_arrow  # noqa: E402
from ingest.stac._validate import validate_item  # noqa: E402


def best_of(repeats: int, run: Callable[[], Any]) -> tuple[float, Any]:
    """The fastest of ``repeats`` runs (seconds) and the last result."""
    best, result = float("inf"), None
    for _ in range(repeats):
        started = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - started)
    return best, result


def exact(items: list[dict[str, Any]], back: list[dict[str, Any]]) -> int:
    """How many items came back equal to what went in (by id)."""
    returned = {item.get("id"): item for item in back}
    return sum(1 for item in items if returned.get(item["id"]) == item)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    arguments = parser.parse_args()
    raw = [item for chunk in item_chunks(arguments.items, 0) for item in chunk][: arguments.items]
    items = [validate_item(item) for item in raw]
    count = len(items)
    rows: list[tuple[str, float, float, int]] = []

    to_seconds, table = best_of(arguments.repeats, lambda: items_to_arrow([dict(item) for item in items]))
    back_seconds, back = best_of(arguments.repeats, lambda: list(arrow_to_items(table)))
    rows.append(("floe items_to_arrow / arrow_to_items", to_seconds, back_seconds, exact(items, back)))

    try:
        from stac_geoparquet.arrow import parse_stac_items_to_arrow, stac_table_to_items

        to_seconds, geoparquet = best_of(
            arguments.repeats, lambda: pa.Table.from_batches(list(parse_stac_items_to_arrow(items)))
        )
        back_seconds, back = best_of(arguments.repeats, lambda: list(stac_table_to_items(geoparquet)))
        rows.append(
            (
                "stac-geoparquet parse_stac_items_to_arrow / stac_table_to_items",
                to_seconds,
                back_seconds,
                exact(items, back),
            )
        )
    except ImportError as error:
        print(f"stac-geoparquet: not installed ({error})")

    try:
        import rustac

        to_seconds, arrow = best_of(arguments.repeats, lambda: rustac.to_arrow(items))
        back_seconds, collection = best_of(arguments.repeats, lambda: rustac.from_arrow(arrow))
        features = collection["features"] if isinstance(collection, dict) else list(collection)
        rows.append(
            (
                f"rustac {getattr(rustac, 'version', lambda: '?')()} to_arrow / from_arrow",
                to_seconds,
                back_seconds,
                exact(items, features),
            )
        )
    except ImportError as error:
        print(f"rustac: not installed ({error}); `pip install rustac` to include it")

    floe_to, floe_back = rows[0][1], rows[0][2]
    print(f"\n{count:,} validated items (bench_scale's generator, seed 0), best of {arguments.repeats} runs\n")
    print("| converter | to Arrow, µs/item | back, µs/item | to / floe's | back / floe's | items back exactly |")
    print("|---|---|---|---|---|---|")
    for name, to_seconds, back_seconds, same in rows:
        print(
            f"| {name} | {to_seconds / count * 1e6:.1f} | {back_seconds / count * 1e6:.1f} "
            f"| {to_seconds / floe_to:.2f}x | {back_seconds / floe_back:.2f}x | {same:,} of {count:,} |"
        )


if __name__ == "__main__":
    main()
