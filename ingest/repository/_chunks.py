"""Reading the chunks a selection needs: fetched all at once, decoded on threads, kept in a bounded cache.

:func:`read_chunks` takes a list of :class:`ChunkRead` (a chunk of a stack
array and where its part of the selection goes), fetches each distinct chunk
once with many requests in flight, decodes it with the array's own codecs
(zstd decodes on threads, so both cores work) and copies its part into the
output. Decoded chunks are kept in a process-wide cache bounded in bytes,
keyed by the repository, the snapshot, the array and the chunk, so what is
cached never goes stale. Why and what it gains: docs/pixels.md#reading-pixels.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from zarr.core.array_spec import ArraySpec
from zarr.core.buffer import default_buffer_prototype

#: Chunk requests in flight at once (Icechunk serves them concurrently; on object stores each is a round trip).
CONCURRENT_GETS = 64
#: Bytes of decoded chunks the process keeps, unless :func:`set_chunk_cache_size` says otherwise.
DEFAULT_CACHE_BYTES = 256 * 2**20

Part = int | slice | np.ndarray
"""One axis of a selection: one position, a slice, or the indices along it."""


@dataclass(frozen=True)
class ChunkRead:
    """One chunk of one array, and the part of it a selection takes."""

    path: str
    """The array's path in the store."""
    coords: tuple[int, ...]
    """The chunk's position in the array's chunk grid."""
    source: tuple[Part, ...]
    """What to take from the decoded chunk, per axis."""
    target: tuple[Part, ...]
    """Where it goes in the output, per axis."""


class ChunkCache:
    """Decoded chunks, least recently used dropped first once their bytes pass ``limit``; safe across threads."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._chunks: OrderedDict[Hashable, np.ndarray | None] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> tuple[bool, np.ndarray | None]:
        """``(found, chunk)``; a chunk the store does not have is cached as ``None`` (the fill value)."""
        with self._lock:
            if key not in self._chunks:
                self.misses += 1
                return False, None
            self._chunks.move_to_end(key)
            self.hits += 1
            return True, self._chunks[key]

    def put(self, key: Hashable, chunk: np.ndarray | None) -> None:
        size = 0 if chunk is None else chunk.nbytes
        if size > self.limit:
            return
        with self._lock:
            old = self._chunks.pop(key, None)
            self._bytes -= 0 if old is None else old.nbytes
            self._chunks[key] = chunk
            self._bytes += size
            self._trim()

    def resize(self, limit: int) -> None:
        """Keep at most ``limit`` bytes from now on, dropping the least recently used chunks that are over it."""
        with self._lock:
            self.limit = limit
            self._trim()

    def _trim(self) -> None:
        while self._bytes > self.limit and self._chunks:
            _, dropped = self._chunks.popitem(last=False)
            self._bytes -= 0 if dropped is None else dropped.nbytes

    def clear(self) -> None:
        with self._lock:
            self._chunks.clear()
            self._bytes = 0
            self.hits = self.misses = 0

    @property
    def size(self) -> int:
        """Bytes of decoded chunks held now."""
        return self._bytes


_cache = ChunkCache(DEFAULT_CACHE_BYTES)


def chunk_cache() -> ChunkCache:
    """The process's cache of decoded chunks."""
    return _cache


def set_chunk_cache_size(limit: int) -> None:
    """Bound the process's cache of decoded chunks to ``limit`` bytes (0 turns it off); drops what is over.

    Args:
        limit: bytes of decoded pixels to keep, at least 0.

    Raises:
        ValueError: ``limit`` is negative.
    """
    if limit < 0:
        raise ValueError(f"a chunk cache of {limit} bytes: the size must be at least 0")
    _cache.resize(limit)


def clear_chunk_cache() -> None:
    """Empty the process's cache of decoded chunks (a read after it fetches from the store again)."""
    _cache.clear()


async def read_chunks(
    store: Any, arrays: dict[str, Any], reads: Sequence[ChunkRead], out: np.ndarray, scope: Hashable
) -> None:
    """Fill ``out`` from the chunks ``reads`` name; where a chunk was never written, ``out`` is left as it is.

    ``arrays`` maps each path to its opened zarr ``AsyncArray`` (for the
    chunk keys and codecs); ``scope`` says which immutable state the store
    shows (the repository and the snapshot), and keys the cache; ``None``
    (a store that may change, or one nobody named) reads past the cache.
    """
    wanted: dict[tuple[str, tuple[int, ...]], list[ChunkRead]] = {}
    for read in reads:
        wanted.setdefault((read.path, read.coords), []).append(read)
    gate = asyncio.Semaphore(CONCURRENT_GETS)
    prototype = default_buffer_prototype()

    async def one(path: str, coords: tuple[int, ...], parts: list[ChunkRead]) -> None:
        key = (scope, path, coords)
        found, chunk = _cache.get(key) if scope is not None else (False, None)
        if not found:
            array = arrays[path]
            async with gate:
                encoded = await store.get(f"{path}/{array.metadata.encode_chunk_key(coords)}", prototype=prototype)
            chunk = None if encoded is None else await _decode(array, encoded)
            if scope is not None:
                _cache.put(key, chunk)
        _scatter(chunk, parts, out)

    await asyncio.gather(*(one(path, coords, parts) for (path, coords), parts in wanted.items()))


async def _decode(array: Any, encoded: Any) -> np.ndarray:
    """One chunk decoded by the array's codecs (zarr runs zstd on threads)."""
    metadata = array.metadata
    spec = ArraySpec(
        shape=metadata.chunk_grid.chunk_shape,
        dtype=metadata.dtype,
        fill_value=metadata.fill_value,
        config=array.config,
        prototype=default_buffer_prototype(),
    )
    (decoded,) = await array.codec_pipeline.decode([(encoded, spec)])
    chunk = np.asarray(decoded.as_numpy_array())
    chunk.flags.writeable = False  # shared through the cache: nobody may change it
    return chunk


def _scatter(chunk: np.ndarray | None, parts: list[ChunkRead], out: np.ndarray) -> None:
    if chunk is None:
        return
    for part in parts:
        out[_indexer(part.target)] = chunk[_indexer(part.source)]


def _indexer(parts: tuple[Part, ...]) -> tuple[Any, ...]:
    """Basic indexing where every axis is a slice or a number; numpy's outer indexing (``np.ix_``) otherwise."""
    if all(isinstance(part, slice | int) for part in parts):
        return parts
    return np.ix_(*(np.array([part]) if isinstance(part, int) else _indices(part) for part in parts))


def _indices(part: slice | np.ndarray) -> np.ndarray:
    if isinstance(part, slice):
        return np.arange(part.start, part.stop, part.step or 1)
    return part
