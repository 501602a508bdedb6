"""The search engine: plan through Iceberg (partition and column-bound pruning), then filter exactly, file by file.

:class:`SearchEngine` checks and plans a request (``_request``, ``_plan``), takes candidate files (``_candidates``),
reads their decoded columns through a byte-bounded cache (``_cache``) and makes pages in file order or by ids (here:
the two share the engine's row tests and readers; the rows of ids are ``_ids``'s) or sorted (``_sorted``). How a
search reads, caches and pages: docs/design.md §6.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from typing import Any

import cql2
import numpy as np
import pyarrow as pa
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.manifest import DataFile

from ingest.api._cache import (
    DEFAULT_CACHE_MB,
    FILE_INDEX,
    ROW_NUMBER,
    ColumnCache,
    SnapshotCache,
    SnapshotState,
    read_windows,
)
from ingest.api._candidates import Candidates
from ingest.api._collections import collection_documents, extents, queryables
from ingest.api._ids import IdIndexes
from ingest.api._manifests import ManifestFiles
from ingest.api._plan import (
    RowTest,
    RowTests,
    SearchPlan,
    held,
    plan_search,
    request_filter,
    residual_matches,
    unknown_properties,
)
from ingest.api._request import MAX_LIMIT, PageToken, SearchPage, SearchRequest
from ingest.api._rows import FileRows, runs_of_one_schema
from ingest.api._sorted import sorted_page
from ingest.api._turns import Turns
from ingest.errors import CollectionNotFound, InvalidSearch, RefNotFound
from ingest.repository import READS_AT_ONCE, Repository, data_manifests
from ingest.stac import ServedArrays, s3_storage_scheme
from ingest.storage import ARRAYS_DIR

# Items of a file with a residual are built (and matched) this many rows at a time: a page that fills early
# converts little.
_RESIDUAL_CHUNK = 256
_IDS_CHUNK_FILES = 64
"""Files a search by ids gathers rows from before it filters them together."""


def served_arrays(repository: Repository) -> ServedArrays:
    """Where ``repository``'s arrays are, as its served items say: the Icechunk repository, its bucket's storage
    scheme on object storage, and the stacks' tile."""
    location = repository.location
    url = location.join(ARRAYS_DIR)
    scheme = None
    if not location.is_local:
        s3 = location.s3
        scheme = s3_storage_scheme(location.bucket, s3.region, s3.endpoint_url, anonymous=bool(s3.anonymous))
    return ServedArrays(url, scheme, repository.settings.arrays.tile)


class SearchEngine:
    """STAC search over a floe repository at any ref; one serves a repository.

    What a snapshot resolves to (table metadata, its data files, collections and their extents) never changes, so it
    is cached per snapshot id; only branch names are resolved per request.
    """

    def __init__(
        self,
        repository: Repository,
        *,
        max_limit: int = MAX_LIMIT,
        refuse_over_limit: bool = False,
        refuse_unknown_properties: bool = False,
        cache_mb: int = DEFAULT_CACHE_MB,
        long_searches: int = 0,
    ) -> None:
        self.repository = repository
        self.turns = Turns(long_searches)
        """Where long searches take turns (``_turns.py``); ``long_searches`` 0: they all run at once."""
        self.max_limit = max_limit
        self.refuse_over_limit = refuse_over_limit
        self.refuse_unknown_properties = refuse_unknown_properties
        self.arrays = served_arrays(repository)
        """Where the arrays are, as served items say (``floe:arrays`` and the stacks' assets)."""
        # Files read at once: on object storage each read is a round trip, worth overlapping; on a local disk a
        # read takes microseconds once cached, and threads would only add their cost and contend for the GIL.
        self.reads_at_once = 1 if repository.location.is_local else READS_AT_ONCE
        self.columns = ColumnCache(repository.io, cache_mb * 1_000_000)
        self.manifests = ManifestFiles(repository.io)
        """The files each manifest lists, kept across versions: a new version costs only its new manifests."""
        self.id_indexes = IdIndexes(repository.io, self.columns, self.manifests)
        self._snapshots = SnapshotCache(self._load_state)
        self._tags: dict[str, str] = {}
        self.rows = FileRows(self.columns, self.id_indexes, self.reads_at_once, self.arrays)
        """The rows of the data files a search reads, and the items they make (``_rows.py``)."""
        self.candidates = Candidates(
            self.columns, self.rows.overlapped, self.reads_at_once, self.rows.rows_of_ids_by_file
        )

    @classmethod
    def in_process(cls, repository: Repository) -> SearchEngine:
        """An engine for a search made in this process (``floe search``, ``open_search``): the repository's
        ``api`` settings, and a limit above ``api.max_limit`` refused rather than cut (a caller asking for more
        items than it gets would not know)."""
        api = repository.settings.api
        return cls(
            repository,
            max_limit=api.max_limit,
            refuse_over_limit=True,
            refuse_unknown_properties=api.refuse_unknown_properties,
        )

    # -- refs and snapshots ------------------------------------------------------------------
    def resolve(self, ref: str | None = None) -> str:
        """The snapshot a ref names now (tags and snapshot ids are cached: they never change)."""
        ref = ref or self.repository.settings.branch
        cached = self._tags.get(ref)
        if cached is not None:
            return cached
        kind, snapshot_id = self.repository.resolve_ref(ref)
        if kind != "branch":
            self._tags[ref] = snapshot_id
        return snapshot_id

    def state(self, snapshot_id: str) -> SnapshotState:
        """What ``snapshot_id`` resolves to (cached); RefNotFound if no such snapshot exists."""
        return self._snapshots.get(snapshot_id)

    def _load_state(self, snapshot_id: str) -> SnapshotState:
        location = self.repository.metadata_location_of(snapshot_id)
        table = self.repository.catalog.load_at(location)
        schema = table.schema()
        version = table.current_snapshot()  # the table as loaded at its version: that version's snapshot
        manifests = [] if version is None else self.manifests.manifests(version)
        listed = self.manifests.live_files(data_manifests(manifests))
        files = sorted(listed, key=lambda data_file: data_file.file_path)
        self.columns.know(files)
        return SnapshotState(
            snapshot_id=snapshot_id,
            table=table,
            schema=schema,
            arrow_schema=schema_to_pyarrow(schema, include_field_ids=False),
            files=files,
        )

    # -- collections -------------------------------------------------------------------------
    def collections(self, snapshot_id: str) -> dict[str, dict[str, Any]]:
        """Collection JSON by id at a snapshot: the stored collections, and any collection with items in the table."""
        state = self.state(snapshot_id)
        with state.lock:
            if state.collections is None:
                # Named as a snapshot: one look-up, not a branch's and a tag's first (each a request on S3).
                groups = self.repository.collection_groups(f"snapshot:{snapshot_id}")
                state.stacked = groups.stacked
                state.collections = collection_documents(groups.documents, extents(state, self.columns))
            return state.collections

    def has_stacks(self, snapshot_id: str, collection_id: str) -> bool:
        """Whether arrays were written to the collection at the snapshot (it has stacks)."""
        self.collections(snapshot_id)
        return collection_id in self.state(snapshot_id).stacked

    def collection(self, snapshot_id: str, collection_id: str) -> dict[str, Any]:
        """One collection's JSON at a snapshot; CollectionNotFound if it has neither a document nor items."""
        found = self.collections(snapshot_id).get(collection_id)
        if found is None:
            raise CollectionNotFound(
                f"no collection {collection_id!r} at this ref ({held(self.collections(snapshot_id))})"
            )
        return found

    def queryables(self, snapshot_id: str, collection_id: str | None = None) -> dict[str, Any]:
        """JSON Schema of the properties a filter can use (the table's typed columns)."""
        if collection_id is not None:
            self.collection(snapshot_id, collection_id)
        return queryables(self.state(snapshot_id).schema, closed=self.refuse_unknown_properties)

    # -- planning ----------------------------------------------------------------------------
    def plan(self, state: SnapshotState, request: SearchRequest) -> SearchPlan:
        """Check and plan ``request`` at a snapshot, with this engine's page-size maximum."""
        # Collections are made from every file's bounds on first use at a snapshot: only a search naming some
        # needs them to check the names.
        known = self.collections(state.snapshot_id) if request.collections else {}
        return plan_search(
            state.schema,
            request,
            known,
            max_limit=self.max_limit,
            refuse_over_limit=self.refuse_over_limit,
            refuse_unknown_properties=self.refuse_unknown_properties,
            overflow_properties=lambda: self.candidates.snapshot_overflow_keys(state),
        )

    def unknown_properties(self, request: SearchRequest, ref: str | None = None) -> list[str]:
        """The properties the filter of ``request`` names that no item at ``ref`` has (a search answers them as
        null in every row; ``floe search`` warns)."""
        state = self.state(self.resolve(ref))
        expression = request_filter(request, state.schema)
        return unknown_properties(expression, state.schema, lambda: self.candidates.snapshot_overflow_keys(state))

    # -- searching ---------------------------------------------------------------------------
    def pins(self, ref: str | None) -> bool:
        """Whether ``ref`` (resolved before) always names one snapshot: a tag or a snapshot id, not a branch."""
        return ref is not None and ref in self._tags

    def search(
        self,
        request: SearchRequest,
        ref: str | None = None,
        snapshot_id: str | None = None,
        *,
        pinned: bool = False,
    ) -> SearchPage:
        """One page of ``request`` at ``ref`` (or at the snapshot its token pins).

        A token continues the search that issued it at the snapshot it was
        issued at, also on a branch that has moved since. With ``pinned``
        (``snapshot_id`` is a tag's or a snapshot's, which never moves) a token
        of another snapshot is refused rather than answered from that snapshot.
        """
        with self.turns.search():
            return self._search(request, ref, snapshot_id, pinned=pinned)

    def _search(self, request: SearchRequest, ref: str | None, snapshot_id: str | None, *, pinned: bool) -> SearchPage:
        token = PageToken.decode(request.token) if request.token else None
        if token is not None:
            if pinned and snapshot_id is not None and token.snapshot_id != snapshot_id:
                raise InvalidSearch(
                    f"this token pages snapshot {token.snapshot_id}, not {snapshot_id} (this ref's): send it to "
                    "the ref that issued it, or start again without a token"
                )
            snapshot_id = token.snapshot_id
        elif snapshot_id is None:
            snapshot_id = self.resolve(ref)
        try:
            state = self.state(snapshot_id)
        except RefNotFound as error:
            raise InvalidSearch(
                f"the token's snapshot {snapshot_id} no longer exists: start the search again"
            ) from error
        plan = self.plan(state, request)
        if token is not None:
            token.check_continues(plan.fingerprint, plan.sortby)
            if token.file_index > len(state.files):
                raise InvalidSearch("this token points past the end of its snapshot: start again without a token")
        if plan.sortby:
            offset = (token.offset or 0) if token else 0
            page = sorted_page(self, state, plan, offset)
        else:
            position = (token.file_index, token.row) if token else (0, 0)
            page = self._page(state, plan, position)
        page.number_matched = self.number_matched(state, plan)
        return page

    def number_matched(self, state: SnapshotState, plan: SearchPlan) -> int | None:
        """How many items match, when the data files' metadata decides it for every file; None otherwise.

        Exact, and free of reads, when each file that may match is known to
        match in every row from its partition and column bounds (no filter, a
        collection, a time window that files fall inside). A geometry, a filter
        cql2 must evaluate, or a file only partly inside would need rows: then
        the count is left out (OGC API Features makes it optional) rather than
        paid for on every page.
        """
        if plan.geometries or plan.residual is not None:
            return None
        tests = self.rows.row_tests(state, plan)
        maybe = self.candidates.maybe_matching(state, plan, tests, 0)
        total = 0
        for index in maybe.indexes:
            data_file = state.files[index]
            if plan.filtered_properties and not self.candidates.overflow_known(data_file):
                return None  # which test the file needs is known only from its overflow: a read
            test = self.candidates.test_of(state, plan, tests, maybe, index)
            if test is None:
                continue
            if test.needs_rows_test and not (test.all_rows_match is not None and test.all_rows_match(data_file)):
                return None
            total += data_file.record_count
        return total

    def _page(self, state: SnapshotState, plan: SearchPlan, position: tuple[int, int]) -> SearchPage:
        """The next page of an unsorted search, in file order from ``position`` (a file index and a row).

        Candidates are taken in windows, 2 files, then twice as many each time up to ``READS_AT_ONCE``: their
        footers, then their filter columns, then the rows the page takes of them are read together (on object
        storage each is a round trip; one after another, a page crossing many files waits for each), then used
        in file order as one file at a time would be. A page that fills in its first file reads one more.
        """
        tests = self.rows.row_tests(state, plan)
        if plan.id_hashes is not None and plan.residual is None and not plan.filtered_properties:
            return self._ids_page(state, plan, tests, position)
        found: list[dict[str, Any]] = []
        # Rows of several files are turned into items together (a conversion has a fixed cost of ~0.2 ms).
        pending: list[pa.Table] = []
        held = 0
        start_file, start_row = position
        for window in read_windows(self.candidates.of(state, plan, tests, start_file), self.reads_at_once):
            takes: list[tuple[int, str, np.ndarray]] = []
            for index, data_file, test, rows in self._matched_in(state, plan, window, start_file, start_row):
                if len(rows) == 0:
                    continue
                path = data_file.file_path
                if test.residual is not None:
                    pending.extend(table for _, table in self.rows.rows_of_files(takes, numbered=False))
                    found.extend(self.rows.items_of(state.snapshot_id, pending))
                    takes, pending, held = [], [], 0
                    next_row = self._add_residual_matches(
                        state, test.residual, path, rows, found=found, limit=plan.limit
                    )
                    if next_row is not None:
                        return self._finish(state, plan, tests, found, index, next_row, None)
                    continue
                wanted = plan.limit - len(found) - held
                taken = rows[:wanted]
                takes.append((index, path, taken))
                held += len(taken)
                if len(found) + held >= plan.limit:
                    pending.extend(table for _, table in self.rows.rows_of_files(takes, numbered=False))
                    found.extend(self.rows.items_of(state.snapshot_id, pending))
                    return self._finish(state, plan, tests, found, index, int(taken[-1]) + 1, len(rows) > wanted)
            pending.extend(table for _, table in self.rows.rows_of_files(takes, numbered=False))
        found.extend(self.rows.items_of(state.snapshot_id, pending))
        return SearchPage(found, state.snapshot_id)

    def _matched_in(
        self,
        state: SnapshotState,
        plan: SearchPlan,
        window: list[tuple[int, DataFile, RowTest]],
        start_file: int,
        start_row: int,
    ) -> list[tuple[int, DataFile, RowTest, np.ndarray]]:
        """Each candidate of ``window`` with the numbers of its rows that pass its test, the files read together."""
        if self.reads_at_once > 1:
            self.columns.prefetch([data_file.file_path for _, data_file, _ in window])

        def matched(candidate: tuple[int, DataFile, RowTest]) -> tuple[int, DataFile, RowTest, np.ndarray]:
            index, data_file, test = candidate
            first_row = start_row if index == start_file else 0
            return index, data_file, test, self.rows.matching_row_numbers(state, plan, test, index, first_row)

        return self.rows.overlapped(matched, window)

    def _ids_page(
        self, state: SnapshotState, plan: SearchPlan, tests: RowTests, position: tuple[int, int]
    ) -> SearchPage:
        """The next page of a search by ids: the key index names the rows; they are tested and converted together.

        Ids are scattered over many files (a file holds a place and a month,
        ids follow neither), so the cost that matters is per file: each
        candidate file contributes just the rows whose id hash is wanted (their
        row groups, cached), and the filter and the conversion to items run
        once over a chunk of files rather than once a file.
        """
        assert plan.id_hashes is not None
        test = tests.translated
        start_file, start_row = position
        candidates = self.candidates.of(state, plan, tests, start_file)
        matched: list[pa.Table] = []
        held = 0
        while held < plan.limit:
            chunk = list(itertools.islice(candidates, _IDS_CHUNK_FILES))
            if not chunk:
                break
            wanted: list[tuple[int, str, np.ndarray]] = []
            for index, data_file, _ in chunk:
                rows = self.rows.rows_of_ids_in_file(state, plan, index)
                if index == start_file:
                    rows = rows[rows >= start_row]
                if len(rows):
                    wanted.append((index, data_file.file_path, rows))
            gathered = [
                table.append_column(FILE_INDEX, pa.array(np.full(table.num_rows, index, dtype=np.int64)))
                for index, table in self.rows.rows_of_files(wanted)
            ]
            for table in runs_of_one_schema(gathered):
                passed = self.rows.passing(test, table)
                matched.append(passed)
                held += passed.num_rows
        if held < plan.limit:
            return SearchPage(self.rows.items_of(state.snapshot_id, matched), state.snapshot_id)
        page: list[pa.Table] = []
        for table in matched:
            page.append(table.slice(0, plan.limit - sum(part.num_rows for part in page)))
        last_file = int(page[-1].column(FILE_INDEX)[-1].as_py())
        last_row = int(page[-1].column(ROW_NUMBER)[-1].as_py())
        found = self.rows.items_of(state.snapshot_id, page)
        # Rows matched beyond the page go next; else later candidate files may hold some (_finish looks).
        return self._finish(state, plan, tests, found, last_file, last_row + 1, held > plan.limit or False)

    def _add_residual_matches(
        self,
        state: SnapshotState,
        residual: cql2.Expr,
        path: str,
        rows: np.ndarray,
        *,
        found: list[dict[str, Any]],
        limit: int,
    ) -> int | None:
        """Add the items at ``rows`` of one file that match ``residual`` to ``found``, up to ``limit`` in all.

        Returns the row to resume at once ``found`` is full, else None.
        """
        # Items are built (and matched) a chunk at a time, so a page that fills early converts little.
        for start in range(0, len(rows), _RESIDUAL_CHUNK):
            chunk = rows[start : start + _RESIDUAL_CHUNK]
            items = self.rows.items(state.snapshot_id, self.rows.rows(path, chunk))
            for row, item in zip(chunk, items, strict=True):
                if residual_matches(residual, item):
                    found.append(item)
                    if len(found) >= limit:
                        return int(row) + 1
        return None

    def _finish(  # noqa: PLR0917
        self,
        state: SnapshotState,
        plan: SearchPlan,
        tests: RowTests,
        found: list[dict[str, Any]],
        index: int,
        next_row: int,
        more: bool | None,
    ) -> SearchPage:
        """The page, with a next token unless nothing can follow (known in the common cases, else assumed)."""
        if more is False and not any(True for _ in self.candidates.of(state, plan, tests, index + 1)):
            return SearchPage(found, state.snapshot_id)
        token = PageToken(state.snapshot_id, index, next_row, search=plan.fingerprint)
        return SearchPage(found, state.snapshot_id, token.encode())

    def iter_items(
        self, request: SearchRequest, ref: str | None = None, max_items: int | None = None
    ) -> Iterator[dict[str, Any]]:
        """Every item matching ``request`` (page after page at one snapshot), at most ``max_items``."""
        count = 0
        snapshot_id = self.resolve(ref)
        while True:
            page = self.search(request, snapshot_id=snapshot_id)
            for item in page.items:
                yield item
                count += 1
                if max_items is not None and count >= max_items:
                    return
            if page.next_token is None:
                return
            request = dataclasses.replace(request, token=page.next_token)
