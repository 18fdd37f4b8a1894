"""Suffix lookup: where the text's last few tokens were seen before, and what followed them there.

The n-gram table (ngram.py) keys continuations by one token, so where a token recurs with several
continuations it proposes the most frequent one, whatever the context. Text that repeats itself (a
greedy run in a loop, a document quoting its prompt) is better predicted by matching the last m
tokens (m = 8, else 4, else 2) at their latest earlier occurrence and copying what followed, as
prompt-lookup decoding does. Where that copy reaches the present, it goes on with the tokens it
has just proposed (the text repeats with the match's period).

A copy is trusted for as far as its match has held: it is at most COPY_PER_MATCH times as long as
the run of tokens that agree at both occurrences (counted back from the text's end). A chance match
of two tokens proposes six; a loop that has gone round once is copied as far as the lookup step's
node budget allows (--lookup-nodes). Replayed along AR runs, this kept the long copies' tokens in
loops and left out most of the verify rows that failed elsewhere (docs/benchmarks.md, session 46).

The index keeps, per order m, the latest end position of every m tokens seen (keyed by their
tuple's hash, the match checked against the tokens; output never depends on a proposal anyway:
verification keeps only what the model draws). Like the n-gram table, it leaves out the matches
in the last `exclude_recent` tokens (the repetition penalty's window: under a penalty the tokens
that followed a recent match are the ones made unlikely)."""

from __future__ import annotations

from collections.abc import Sequence

SUFFIX_ORDERS = (8, 4, 2)  # match lengths tried, longest first (docs/benchmarks.md, session 45)
COPY_PER_MATCH = 3  # a copy's most tokens per token of its match (docs/benchmarks.md, session 46)
# Adaptive steps run a lookup step, whatever kind leads, where this many tokens agree with an earlier passage
# (a copy of 24+ tokens): the text is repeating itself. After a copy the text left, the match starts over.
REPEAT_HELD = 8


class SuffixIndex:
    """Latest end positions of the m-token runs of a growing token sequence, for m in `orders`."""

    def __init__(self, exclude_recent: int = 0, orders: Sequence[int] = SUFFIX_ORDERS) -> None:
        if not orders or any(m < 1 for m in orders):
            raise ValueError("suffix orders must be positive")
        self.orders = tuple(sorted(set(orders), reverse=True))
        self.exclude_recent = exclude_recent
        self.latest: dict[int, dict[int, int]] = {m: {} for m in self.orders}  # m -> hash of run -> end index
        self.next_end = 0  # first end index not yet indexed

    def update(self, tokens: Sequence[int], length: int) -> None:
        """`tokens[:length]` is the sequence so far: index every run ending before its last token (so
        that the run ending there finds an earlier one) and before the excluded recent window."""
        stop = length - 1 - self.exclude_recent
        for end in range(self.next_end, stop):
            for m, table in self.latest.items():
                if end + 1 >= m:
                    table[hash(tuple(tokens[end + 1 - m : end + 1]))] = end
        self.next_end = max(self.next_end, stop)

    def propose(self, tokens: Sequence[int], length: int, count: int) -> list[int]:
        """Up to `count` tokens to follow `tokens[:length]`: those that followed the latest earlier
        occurrence of its longest indexed suffix (empty where none matches), at most COPY_PER_MATCH
        times as many as the tokens that agree before both occurrences' ends. Call update first."""
        if count <= 0:
            return []
        found = self._match(tokens, length)
        if found is None:
            return []
        end, m = found
        last = length - 1
        held = self._held(tokens, end, last, m, -(-count // COPY_PER_MATCH))  # enough for the whole count
        return [int(tokens[end + 1 + j % (last - end)]) for j in range(min(count, COPY_PER_MATCH * held))]

    def held(self, tokens: Sequence[int], length: int, cap: int) -> int:
        """How many tokens agree before the ends of the text and of the match propose would copy from
        (0 where none matches), counted up to `cap`. Call update first."""
        found = self._match(tokens, length)
        return 0 if found is None else self._held(tokens, found[0], length - 1, found[1], cap)

    def _match(self, tokens: Sequence[int], length: int) -> tuple[int, int] | None:
        """(end, m): the latest earlier end of the text's longest indexed m-token suffix, or None."""
        if length < 2:
            return None
        last = length - 1
        for m, table in self.latest.items():
            if length < m:
                continue
            run = tuple(tokens[length - m : length])
            end = table.get(hash(run))
            if end is None or end >= last or tuple(tokens[end + 1 - m : end + 1]) != run:  # (a hash collision)
                continue
            return end, m
        return None

    @staticmethod
    def _held(tokens: Sequence[int], end: int, last: int, m: int, cap: int) -> int:
        """The m matched tokens and those before them that agree at `end` and at `last`, up to `cap`."""
        held = m
        while held < cap and held <= end and tokens[end - held] == tokens[last - held]:
            held += 1
        return held
