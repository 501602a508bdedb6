"""A partitioned stac-geoparquet dataset in an Azure container, as Planetary Computer publishes its items
(``https://pcstacitems.blob.core.windows.net/items/<collection>.parquet/``, a folder of part files), ingested
by floe against the same parts on the local disk, one run.

Run:  .venv/bin/python scripts/bench_blob_folder.py                 (1,000,000 items in 20 parts; ~5 min)
      .venv/bin/python scripts/bench_blob_folder.py --items 20000 --parts 4 --runs 1   (a smoke run)

``--items`` generated items (scripts/bench_ingest.py's generator) are written as ``--parts`` stac-geoparquet files
into a folder. tests/_blob_server.py serves that folder as a container of a storage account, addressed
path-style as Azurite does, refusing every request without a SAS token from its token service (as Planetary
Computer's accounts do), listing ``--list-page`` blobs a page. floe ingests the container's folder URL
(``ingest_items``, metadata only: the container is listed with its token, each part read with range requests,
signed) into a fresh repository; the baseline is the same ingest of the local folder. Alternating, ``--runs``
each: items/s, and the ratio remote/local (what reaching the parts over HTTP with tokens costs). Then the
parts' rows are turned into items by floe's converter and by stac-geoparquet's ``stac_table_to_items`` (rows/s,
the ratio). The server listens on 127.0.0.1 and is stopped by its own pid.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ingest import generated_items
from bench_search import REPO_ROOT, free_port

ACCOUNT, CONTAINER, DATASET = "pcstacitems", "items", "bench.parquet"


def log(message: str) -> None:
    print(f"[bench_blob_folder {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def write_parts(folder: Path, count: int, parts: int) -> None:
    """``count`` items as ``parts`` stac-geoparquet files (ids unique across parts), one part in memory at a time."""
    import pyarrow as pa
    from stac_geoparquet.arrow import parse_stac_items_to_arrow, to_parquet

    folder.mkdir(parents=True)
    per_part = -(-count // parts)
    for part in range(parts):
        size = min(per_part, count - part * per_part)
        items = generated_items(size, seed=part)
        for item in items:
            item["id"] = f"p{part:03d}-{item['id']}"
        to_parquet(pa.Table.from_batches(parse_stac_items_to_arrow(items)), folder / f"part-{part:04d}.parquet")


def start_blob_server(root: Path, list_page: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tests._blob_server", str(root), str(port)],
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            with urllib.request.urlopen(f"{url}/__sas__/list-page/{list_page}", timeout=1) as answer:
                answer.read()
            return process, url
        except OSError:
            time.sleep(0.1)
    process.terminate()
    raise RuntimeError("the blob server did not start")


def ingest_once(source: str, target: Path, settings: object, count: int) -> float:
    from ingest import Repository
    from ingest.pipeline import ingest_items

    repository = Repository.create(target, settings)  # type: ignore[arg-type]
    started = time.perf_counter()
    report = ingest_items(repository, [source])
    rate = report.rows_added / (time.perf_counter() - started)
    if report.rows_added != count or report.rejected:
        raise RuntimeError(f"{source}: {report.rows_added} of {count} items ({len(report.rejected)} rejected)")
    shutil.rmtree(target)
    return rate


def conversion_rates(folder: Path) -> tuple[float, float]:
    """Rows turned into items a second over every part, one part at a time: floe's converter
    (``ingest.stac.geoparquet_items``) and stac-geoparquet's ``stac_table_to_items``."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from stac_geoparquet.arrow import stac_table_to_items

    from ingest.stac import geoparquet_items, row_group_batches

    ours = theirs = 0.0
    rows = 0
    for part in sorted(folder.iterdir()):
        batches = list(row_group_batches(pq.ParquetFile(part)))
        rows += sum(batch.num_rows for batch in batches)
        started = time.perf_counter()
        for batch in batches:
            geoparquet_items(batch)
        ours += time.perf_counter() - started
        started = time.perf_counter()
        for batch in batches:
            list(stac_table_to_items(pa.Table.from_batches([batch])))
        theirs += time.perf_counter() - started
    return rows / ours, rows / theirs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--parts", type=int, default=20)
    parser.add_argument("--runs", type=int, default=2, help="ingests of each, alternating")
    parser.add_argument("--list-page", type=int, default=5000, help="blobs a listing page holds at most")
    arguments = parser.parse_args()

    from ingest import Settings
    from ingest.config import RemoteSettings

    workdir = Path(tempfile.mkdtemp(prefix="floe-bench-blob-"))
    process = None
    try:
        local = workdir / "blobs" / ACCOUNT / CONTAINER / DATASET
        started = time.perf_counter()
        write_parts(local, arguments.items, arguments.parts)
        size = sum(path.stat().st_size for path in local.iterdir())
        took = time.perf_counter() - started
        log(f"{arguments.items:,} items in {arguments.parts} parts ({size / 1e6:.0f} MB), written in {took:.0f} s")
        process, url = start_blob_server(workdir / "blobs", arguments.list_page)
        log(f"blob server at {url} (pid {process.pid})")
        remote = Settings(
            remote=RemoteSettings(sas_token_url=f"{url}/__sas__/token", blob_path_style=[url.removeprefix("http://")])
        )
        folder_url = f"{url}/{ACCOUNT}/{CONTAINER}/{DATASET}/"
        ours, baseline = [], []
        for run in range(arguments.runs):
            baseline.append(ingest_once(f"{local}/", workdir / "local-repo", Settings(), arguments.items))
            ours.append(ingest_once(folder_url, workdir / "remote-repo", remote, arguments.items))
            log(f"run {run + 1}: local {baseline[-1]:,.0f} items/s, Azure folder {ours[-1]:,.0f} items/s")
        with urllib.request.urlopen(f"{url}/__sas__/stats", timeout=10) as answer:
            stats = answer.read().decode()
        log(f"blob server: {stats}")
        converted, converted_baseline = conversion_rates(local)
        floe, local_rate = statistics.median(ours), statistics.median(baseline)
        print(f"## bench_blob_folder: {arguments.items:,} items in {arguments.parts} parts ({size / 1e6:.0f} MB)")
        print("| what | items/s | baseline | ratio |")
        print("|---|---|---|---|")
        print(
            f"| stac-geoparquet folder in an Azure container (SAS tokens, listed, range reads) | {floe:,.0f} "
            f"| {local_rate:,.0f} (the same parts on the local disk) | {floe / local_rate:.2f}x "
            f"(runs: {', '.join(f'{o / b:.2f}' for o, b in zip(ours, baseline, strict=True))}) |"
        )
        print(
            f"| rows turned into items (floe's converter) | {converted:,.0f} | {converted_baseline:,.0f} "
            f"(stac-geoparquet's stac_table_to_items) | {converted / converted_baseline:.2f}x |"
        )
    finally:
        if process is not None:
            process.terminate()
            process.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
