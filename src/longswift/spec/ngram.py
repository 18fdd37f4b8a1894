"""N-gram table for token reutilization: exact counts of every n-gram seen, and the k most
frequent continuations of a token in O(k).

Each first token keeps its continuations in an array sorted by count (descending) plus the index
where each count's run begins; an increment swaps the item to the front of its run, so equal
counts never overwrite one another (the reference implementation's sorted set did)."""

from __future__ import annotations

import math
from collections.abc import Sequence

NGRAM_N = 4  # the order of TokenSwift's n-grams (TokenSwift: every 4-gram of the prompt and the output)


class _Continuations:
    """Continuations of one first token, sorted by count, with O(1) increments."""

    __slots__ = ("order", "count", "index", "run_start", "total")

    def __init__(self) -> None:
        self.total = 0  # n-grams counted, all continuations together
        self.order: list[tuple[int, ...]] = []  # continuations, counts non-increasing
        self.count: dict[tuple[int, ...], int] = {}
        self.index: dict[tuple[int, ...], int] = {}  # position of each continuation in `order`
        self.run_start: dict[int, int] = {}  # count -> first index holding that count

    def add(self, cont: tuple[int, ...]) -> None:
        self.total += 1
        c = self.count.get(cont, 0)
        if c == 0:
            self.order.append(cont)
            i = len(self.order) - 1
            self.index[cont] = i
            self.count[cont] = 1
            self.run_start.setdefault(1, i)
            return
        i, j = self.index[cont], self.run_start[c]
        other = self.order[j]  # swap to the front of the run of count c
        self.order[i], self.order[j] = other, cont
        self.index[other], self.index[cont] = i, j
        self.count[cont] = c + 1
        self.run_start.setdefault(c + 1, j)
        if j + 1 < len(self.order) and self.count[self.order[j + 1]] == c:
            self.run_start[c] = j + 1
        else:
            del self.run_start[c]

    def top(self, k: int) -> list[tuple[tuple[int, ...], int]]:
        return [(cont, self.count[cont]) for cont in self.order[:k]]


class NGramTable:
    """Counts of n-grams (default 4) keyed by their first token."""

    def __init__(self, n: int = 4) -> None:
        if n < 2:
            raise ValueError("n-grams need n >= 2")
        self.n = n
        self.table: dict[int, _Continuations] = {}
        self.total = 0

    def add(self, ngram: Sequence[int]) -> None:
        if len(ngram) != self.n:
            raise ValueError(f"expected {self.n} tokens, got {len(ngram)}")
        first = int(ngram[0])
        entry = self.table.get(first)
        if entry is None:
            entry = self.table[first] = _Continuations()
        entry.add(tuple(int(t) for t in ngram[1:]))
        self.total += 1

    def add_all(self, tokens: Sequence[int], start: int, stop: int) -> None:
        """Add the n-grams beginning at indices [start, stop) of `tokens`."""
        for i in range(start, stop):
            self.add(tokens[i : i + self.n])

    def count(self, ngram: Sequence[int]) -> int:
        entry = self.table.get(int(ngram[0]))
        return 0 if entry is None else entry.count.get(tuple(int(t) for t in ngram[1:]), 0)

    def top(self, first: int, k: int) -> list[tuple[tuple[int, ...], int]]:
        """Up to k (continuation, count) pairs of `first`, most frequent first."""
        entry = self.table.get(first)
        return [] if entry is None or k <= 0 else entry.top(k)

    def total_of(self, first: int) -> int:
        """How many of the counted n-grams begin with `first`."""
        entry = self.table.get(first)
        return 0 if entry is None else entry.total


def path_scores(conts: Sequence[tuple[tuple[int, ...], int]], total: int, base: float = 0.0) -> list[list[float]]:
    """For continuations with their counts (`top`'s pairs) of a first token seen `total` times: each
    continuation's prefixes scored base + log(share of the n-grams that begin with that prefix),
    counting the listed continuations only (a lower bound), so a longer prefix never scores higher."""
    shares: dict[tuple[int, ...], int] = {}
    for cont, count in conts:
        for j in range(1, len(cont) + 1):
            shares[cont[:j]] = shares.get(cont[:j], 0) + count
    return [[base + math.log(shares[cont[:j]] / total) for j in range(1, len(cont) + 1)] for cont, _ in conts]


class NGramTracker:
    """Keeps a table filled with the n-grams of a growing token sequence, except those that
    reach into its last `exclude_recent` tokens (the penalty window: the paper keeps n-grams of
    recent, penalised tokens out of the table)."""

    def __init__(self, n: int, exclude_recent: int) -> None:
        self.table = NGramTable(n)
        self.exclude_recent = exclude_recent
        self.next_start = 0  # first n-gram start index not yet added

    def update(self, tokens: Sequence[int], length: int) -> None:
        """`tokens[:length]` is the sequence so far; add every n-gram now old enough."""
        stop = length - self.exclude_recent - self.table.n + 1
        if stop > self.next_start:
            self.table.add_all(tokens, self.next_start, stop)
            self.next_start = stop
