"""stac-geoparquet files: items read a record batch at a time (one row group), labelled ``file#rowN``, so a file of
millions of rows is never whole in memory, on disk or at a URL (through a seekable reader: range requests).

A batch that cannot be read ends the file with the reason, after the rows before it; where the bytes stopped
arriving (a file object that kept its ``failure``), the reason says it was the transfer, not the file.

With ``as_rows``, the rows of a batch that :func:`~ingest.stac.geoparquet_rows` vouches for travel as
floe's rows (:class:`SourcedRows`), never made into items; the others become items as before, in the file's order.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ingest._stages import moved
from ingest.errors import InvalidSource
from ingest.pipeline._ahead import prefetched
from ingest.pipeline.sources._documents import absolute_hrefs
from ingest.pipeline.sources._types import SourcedItem, SourcedRows
from ingest.remote import describe
from ingest.stac import ARRAYS_ASSET, geoparquet_items, geoparquet_rows, row_group_batches

if TYPE_CHECKING:
    import pyarrow as pa

    from ingest.stac import MappedRows


def geoparquet_file_items(
    file: Path | Any,
    label: str,
    *,
    path: Path | None = None,
    base: str | None = None,
    rows: range | None = None,
    as_rows: bool = False,
) -> Iterator[SourcedItem]:
    """The items of the stac-geoparquet ``file`` (a local path, or a seekable file object read from ``base``, a
    URL: its batches are then read on a thread ahead, and the items' relative asset hrefs made absolute).

    ``rows``: only these rows of the file (a part of it), labelled with their numbers in the file. ``as_rows``:
    the rows :func:`~ingest.stac.geoparquet_rows` vouches for come as rows (from a URL, only a batch whose asset
    hrefs are all absolute: relative ones are made absolute item by item).
    """
    import pyarrow.parquet as pq

    def batches() -> Iterator[pa.RecordBatch]:
        with pq.ParquetFile(file) as opened:
            yield from row_group_batches(opened, rows)

    row = rows.start if rows is not None else 0
    try:
        # From a URL: read and decoded on a thread ahead (Ctrl-C reaches a stalled transfer), while the last
        # batch becomes items here.
        for batch in batches() if base is None else prefetched(batches(), 2, name="floe-stream"):
            mapped = geoparquet_rows(batch) if as_rows and (base is None or not _relative_hrefs(batch)) else None
            if mapped is not None:
                # Read while the pipeline waits ("parse"), but checks and a conversion, as for items.
                moved(mapped.checking, out_of="parse", into="validate")
                moved(mapped.laying_out, out_of="parse", into="to Arrow")
                yield from _mapped_runs(batch, mapped, label, row, path)
                row += batch.num_rows
                continue
            for item in geoparquet_items(batch):
                if base is not None:
                    absolute_hrefs(item, base)
                yield SourcedItem(f"{label}#row{row}", item=item, path=path)
                row += 1
    except Exception as error:  # noqa: BLE001 - any failure means the file is not stac-geoparquet
        failure = getattr(file, "failure", None)
        if failure is not None:
            reason = f"the transfer broke off after row {row} ({describe(failure)})"
        else:
            reason = f"not a readable stac-geoparquet file ({error})"
        yield SourcedItem(label, error=InvalidSource(reason))


def _mapped_runs(
    batch: pa.RecordBatch, mapped: MappedRows, label: str, first: int, path: Path | None
) -> Iterator[SourcedItem]:
    """The batch in the file's order: each run of rows vouched for as one :class:`SourcedRows`, each row between
    them as an item (whose problem, if any, the item path names)."""
    import numpy as np
    import pyarrow as pa

    vouched = np.zeros(batch.num_rows, dtype=bool)
    vouched[mapped.rows] = True
    if not batch.num_rows:
        return
    bounds = [0, *(np.flatnonzero(vouched[1:] != vouched[:-1]) + 1).tolist(), batch.num_rows]
    taken = 0  # rows of mapped.table given so far (it holds the vouched rows in order)
    for start, stop in itertools.pairwise(bounds):
        if vouched[start]:
            numbers = np.arange(first + start, first + stop, dtype=np.int64)
            rows = SourcedRows(mapped.table.slice(taken, stop - start), f"{label}#row", numbers)
            yield SourcedItem(f"{label}#row{first + start}", rows=rows)
            taken += stop - start
            continue
        others = batch.take(pa.array(range(start, stop), type=pa.int64()))
        for offset, item in enumerate(geoparquet_items(others)):
            yield SourcedItem(f"{label}#row{first + start + offset}", item=item, path=path)


_ABSOLUTE = r"^[A-Za-z][A-Za-z0-9+.-]+://"
"""An href with a URL scheme (``ingest.remote.url_scheme``'s pattern), which :func:`absolute_hrefs` leaves."""


def _relative_hrefs(batch: pa.RecordBatch) -> bool:
    """Whether an asset of the batch (other than floe's arrays) has an href that :func:`absolute_hrefs` would make
    absolute against the file's URL."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if "assets" not in batch.schema.names or not pa.types.is_struct(batch.schema.field("assets").type):
        return False
    assets = batch.column("assets")
    for asset in assets.type:
        if asset.name == ARRAYS_ASSET or not pa.types.is_struct(asset.type) or asset.type.get_field_index("href") < 0:
            continue
        href = pc.struct_field(assets, [asset.name, "href"])
        if not (pa.types.is_string(href.type) or pa.types.is_large_string(href.type)):
            return True  # not text: the item path says what it is
        relative = pc.and_(pc.not_equal(href, ""), pc.invert(pc.match_substring_regex(href, _ABSOLUTE)))
        if pc.any(relative).as_py():
            return True
    return False
