"""The keys a run has read, kept outside Python's object heap: de-duplication and ``--prune`` at any size.

:class:`SeenKeys` remembers every ``(collection, id)`` an ingest read, with where it was first seen, to reject an id
read twice and to tell which stored items the sources no longer hold. Its place in the granule stream:
docs/design.md §5 (one granule stream).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

_NO_LINE = -1


def _digests(keys: Sequence[tuple[str, str]]) -> tuple[np.ndarray, np.ndarray]:
    """Two 64-bit halves per key: Python's string hash (SipHash, keyed at random per process, so ids cannot be chosen
    to collide) of two spellings of it. Two different keys share both with probability about 2^-128 per pair: never,
    in practice."""
    joined = [f"{collection}\x00{item_id}" for collection, item_id in keys]
    first = np.fromiter((hash(text) for text in joined), dtype=np.int64, count=len(joined))
    second = np.fromiter((hash(text + "\x01") for text in joined), dtype=np.int64, count=len(joined))
    return first.view(np.uint64), second.view(np.uint64)


@dataclass
class _Run:
    """Keys sorted by their first half, with their second half and label alongside."""

    first: np.ndarray
    second: np.ndarray
    prefix: np.ndarray
    line: np.ndarray

    def __len__(self) -> int:
        return len(self.first)

    def find(self, first: np.ndarray, second: np.ndarray) -> np.ndarray:
        """For each key, its position in this run, or -1."""
        found = np.full(len(first), -1, dtype=np.int64)
        if not len(self):
            return found
        start = np.searchsorted(self.first, first, side="left")
        end = np.searchsorted(self.first, first, side="right")
        for index in np.flatnonzero(end > start):
            # Nearly always one candidate; equal first halves of different keys are checked one by one.
            for position in range(int(start[index]), int(end[index])):
                if self.second[position] == second[index]:
                    found[index] = position
                    break
        return found

    @classmethod
    def merged(cls, runs: Sequence[_Run]) -> _Run:
        first = np.concatenate([run.first for run in runs])
        order = np.argsort(first, kind="stable")  # sorted runs: a merge, not a full sort
        return cls(
            first[order],
            np.concatenate([run.second for run in runs])[order],
            np.concatenate([run.prefix for run in runs])[order],
            np.concatenate([run.line for run in runs])[order],
        )


class SeenKeys:
    """A set of ``(collection, id)`` keys, each with the source label it was first read from.

    A key is two 64-bit hashes (:func:`_digests`) and its label a prefix number and a line number (``items.ndjson:``
    and ``17``): about 28 bytes a key, in numpy arrays. A dict of tuples took about 450 bytes a key: 4.6 GB of Python
    objects at ten million items, which the cyclic collector walked on every collection (0.3 s at 250,000 keys,
    growing with every batch) and which scattered the batches' own objects over a growing heap. Keys are kept in
    sorted runs (:class:`_Run`), merged when a run grows as large as the one before it (a log-structured set): a
    lookup is a binary search per run, and a key is merged about log2(keys / chunk) times.
    """

    def __init__(self) -> None:
        self._runs: list[_Run] = []
        self._prefixes: list[str] = []
        self._prefix_numbers: dict[str, int] = {}
        self.collections: set[str] = set()
        """Every collection a key names."""

    def __len__(self) -> int:
        return sum(len(run) for run in self._runs)

    def add_new(self, keys: Sequence[tuple[str, str]], sources: Sequence[str]) -> list[str | None]:
        """Add the keys not seen before (in order, so a key twice in ``keys`` is new once); for each key, None
        if it was new, else the source it was first seen in."""
        return self._add_new(keys, sources.__getitem__, lambda keep: self._labels([sources[index] for index in keep]))

    def add_new_numbered(self, keys: Sequence[tuple[str, str]], prefix: str, numbers: np.ndarray) -> list[str | None]:
        """:meth:`add_new` for keys whose labels are ``prefix`` and a number each (a file's rows), without a
        label string per key."""
        number = self._prefix_number(prefix)

        def labels(keep: list[int]) -> tuple[np.ndarray, np.ndarray]:
            return np.full(len(keep), number, dtype=np.int32), np.asarray(numbers, dtype=np.int64)[keep]

        return self._add_new(keys, lambda index: f"{prefix}{numbers[index]}", labels)

    def _add_new(
        self,
        keys: Sequence[tuple[str, str]],
        source: Callable[[int], str],
        labels: Callable[[list[int]], tuple[np.ndarray, np.ndarray]],
    ) -> list[str | None]:
        first, second = _digests(keys)
        answers = self._lookup(first, second)
        # Repeats within the chunk: their first hashes sit side by side once sorted (rare; checked one by one).
        ordered_first = np.sort(first)
        if len(first) > 1 and bool((ordered_first[1:] == ordered_first[:-1]).any()):
            earliest: dict[tuple[int, int], int] = {}
            for index in range(len(keys)):
                digest = (int(first[index]), int(second[index]))
                if digest not in earliest:
                    earliest[digest] = index
                elif answers[index] is None:
                    answers[index] = answers[earliest[digest]] or source(earliest[digest])
        keep = [index for index in range(len(keys)) if answers[index] is None]
        if keep:
            chosen = np.asarray(keep, dtype=np.int64)
            prefix, line = labels(keep)
            ordered = np.argsort(first[chosen], kind="stable")
            picked = chosen[ordered]
            self._runs.append(_Run(first[picked], second[picked], prefix[ordered], line[ordered]))
            self.collections.update({keys[index][0] for index in keep})
            self._compact()
        return answers

    def contains(self, keys: Sequence[tuple[str, str]]) -> np.ndarray:
        """Whether each key was seen (a boolean array)."""
        first, second = _digests(keys)
        seen = np.zeros(len(keys), dtype=bool)
        for run in self._runs:
            seen |= run.find(first, second) >= 0
        return seen

    def __contains__(self, key: object) -> bool:
        return isinstance(key, tuple) and bool(self.contains([key])[0])

    def _lookup(self, first: np.ndarray, second: np.ndarray) -> list[str | None]:
        answers: list[str | None] = [None] * len(first)
        for run in self._runs:
            found = run.find(first, second)
            for index in np.flatnonzero(found >= 0):  # hits only: rare outside re-reads
                if answers[index] is None:
                    position = int(found[index])
                    answers[index] = self._label(int(run.prefix[position]), int(run.line[position]))
        return answers

    def _labels(self, sources: Iterable[str]) -> tuple[np.ndarray, np.ndarray]:
        """Each label as a prefix number and a line number (``items.ndjson:17`` -> ``items.ndjson:``, 17;
        ``items.parquet#row3`` -> ``items.parquet#row``, 3)."""
        prefixes, lines = [], []
        numbers = self._prefix_numbers
        for source in sources:
            head, separator, tail = source.rpartition(":")
            if not (separator and tail.isdigit() and len(tail) <= 18):
                head, separator, tail = source.rpartition("#")
            if separator and tail.startswith("row"):  # a stac-geoparquet row: ``file#row17``
                head, separator, tail = source.rpartition("#row")
            if separator and tail.isdigit() and len(tail) <= 18:
                prefix, line = head + separator, int(tail)
            else:
                prefix, line = source, _NO_LINE
            number = numbers.get(prefix)
            if number is None:
                number = self._prefix_number(prefix)
            prefixes.append(number)
            lines.append(line)
        return np.asarray(prefixes, dtype=np.int32), np.asarray(lines, dtype=np.int64)

    def _prefix_number(self, prefix: str) -> int:
        number = self._prefix_numbers.get(prefix)
        if number is None:
            number = self._prefix_numbers[prefix] = len(self._prefixes)
            self._prefixes.append(prefix)
        return number

    def _label(self, prefix: int, line: int) -> str:
        return self._prefixes[prefix] + (str(line) if line != _NO_LINE else "")

    def _compact(self) -> None:
        """Merge the newest runs while a run is at least as large as the one before it (sizes halve down)."""
        while len(self._runs) >= 2 and len(self._runs[-1]) >= len(self._runs[-2]):
            newer = self._runs.pop()
            older = self._runs.pop()
            self._runs.append(_Run.merged([older, newer]))
