"""Lookup steps' node budget and copy length on the CPU (session 46): what a verify pass costs by its
rows, and lookup steps replayed along an AR run as a run takes them.

    python docs/scripts/lookup_budget_sim.py rows
    python docs/scripts/lookup_budget_sim.py replay clockmaker|lighthouse NEW_TOKENS [PRESET]

rows: the embedded model at 3,000 cached tokens, one thread, a chain of N tokens under a tree mask
(hidden states only, and with every row's logits), seven rounds; medians in ms and in decoding steps.

replay: an AR run (docs/scripts/suffix_replay.py's prompts, PRESET default greedy, seed 0), then lookup
steps taken from its start as a run takes them (each step's position is the last one's plus the tokens
it emitted): the suffix index's copy (spec/suffix.py, with COPY_PER_MATCH set per policy) and the
n-gram table's top continuation where it fits, ROOM drafted nodes at most. A step emits 1 + the
longest trie path along the run's next tokens (greedy: what the walk accepts; sampled: a proxy) and
costs the verify pass of its rows plus the LM head of the rows it emits, from ROWS_MS below (the
`rows` mode's output on session 46's Intel Xeon, with a benchmark on the other core). It prints
tokens a lookup step and AR's time for those tokens over the lookup steps' time. Only lookup
steps: a real run mixes in plain and full steps as adaptive steps choose them.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import replace

import numpy as np
import torch

import longswift
from longswift.bench.grid import PRESETS
from longswift.runtime.cache import FullKVCache
from longswift.spec import suffix
from longswift.spec.ngram import NGRAM_N, NGramTracker
from longswift.spec.suffix import SuffixIndex
from longswift.spec.tree import NGRAM, Trie
from suffix_replay import PROMPTS, ar_run, emitted

# rows -> ms of a verify pass returning hidden states only (the `rows` mode, session 46)
ROWS_MS = {1: 63.3, 7: 90.6, 8: 92.9, 12: 110.0, 16: 119.4, 24: 143.4, 32: 174.9}
LM_HEAD_MS, LM_ROW_MS = 6.5, 0.37  # the first row's logits, and each further row's
# policy -> (drafted nodes at most, copy tokens per token of the match; None: no limit)
POLICIES = {"room 6 (session 45)": (6, None), "room 31": (31, None), "room 31, copy <= match": (31, 1),
            "room 31, copy <= 2 x match": (31, 2), "room 31, copy <= 3 x match": (31, 3),
            "room 31, copy <= 4 x match": (31, 4), "room 23, copy <= 3 x match": (23, 3)}


def rows() -> None:
    torch.set_num_threads(1)
    engine = longswift.load(threads=1)
    m, ids = engine.model, engine.encode((PROMPTS / "clockmaker.txt").read_text())
    while len(ids) < 3100:
        ids += ids
    cache = FullKVCache(m.cfg, 3200, m.dtype, m.device)
    for i in range(0, 3000, 500):
        m.forward(torch.tensor(ids[i : i + 500]), torch.arange(i, i + 500), cache, logits_rows=slice(0, 0))
    counts = list(ROWS_MS)
    times: dict[tuple[int, bool], list[float]] = {(n, lg): [] for n in counts for lg in (False, True)}
    for _ in range(7):
        for n in counts:
            for lg in (False, True):
                mask = torch.tril(torch.ones(n, n, dtype=torch.bool)) if n > 1 else None
                t = time.perf_counter()
                m.forward(torch.tensor(ids[100 : 100 + n]), torch.arange(3000, 3000 + n), cache, tree_mask=mask,
                          logits_rows=None if lg else slice(0, 0))
                times[(n, lg)].append(time.perf_counter() - t)
                cache.truncate(3000)
    step = statistics.median(times[(1, True)])
    for n in counts:
        h, lg = statistics.median(times[(n, False)]), statistics.median(times[(n, True)])
        print(f"rows {n:3d}: hidden only {h * 1e3:6.1f} ms, every row's logits {lg * 1e3:6.1f} ms "
              f"({h / step:.2f}x / {lg / step:.2f}x a decoding step)")


def cost(nodes: int, tokens: int) -> float:
    return float(np.interp(nodes, list(ROWS_MS), list(ROWS_MS.values()))) + LM_HEAD_MS + LM_ROW_MS * (tokens - 1)


def replay(kind: str, new: int, preset: str) -> None:
    sampling = replace(PRESETS[preset], seed=0)
    torch.set_num_threads(1)
    tokens, start = ar_run(kind, new, sampling)
    exclude = sampling.penalized_window
    for name, (room, per_match) in POLICIES.items():
        suffix.COPY_PER_MATCH = per_match or 1 << 30
        ngrams, index = NGramTracker(NGRAM_N, exclude), SuffixIndex(exclude)
        i, made, ms, steps = start, 0, 0.0, 0
        while i < len(tokens) - 1:
            ngrams.update(tokens, i + 1)
            index.update(tokens, i + 1)
            trie = Trie.with_root(tokens[i])
            trie.add_path(index.propose(tokens, i + 1, room), NGRAM)
            top = ngrams.table.top(tokens[i], 1)
            gram = top[0][0] if top else ()
            if len(trie) + trie.missing(gram) <= room + 1:  # as lookup_tree's room
                trie.add_path(gram, NGRAM)
            e = min(emitted(trie, tokens, i), len(tokens) - 1 - i)
            made, ms, steps, i = made + e, ms + cost(len(trie), e), steps + 1, i + e
        print(f"{kind} {new} {preset} | {name:26s}: {made / steps:5.2f} tokens a lookup step, "
              f"{made * cost(1, 1) / ms:5.2f}x AR")


if __name__ == "__main__":
    if sys.argv[1] == "rows":
        rows()
    else:
        replay(sys.argv[2], int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else "greedy")
