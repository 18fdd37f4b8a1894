"""Property tests (hypothesis) for the pieces the lossless promise rests on: the trie, the n-gram
table, the verifier's walk and the sampling transform."""

from __future__ import annotations

import math
import random
from collections import Counter

import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from longswift.config import SamplingConfig
from longswift.sampling import apply_penalty, draw, transform
from longswift.spec.ngram import NGramTable, NGramTracker
from longswift.spec.tree import HEADS, NGRAM, Trie
from longswift.spec.verify import lossless_walk

V = 12
tokens_st = st.lists(st.integers(0, V - 1), min_size=0, max_size=60)
paths_st = st.lists(st.lists(st.integers(0, V - 1), min_size=1, max_size=5), min_size=0, max_size=12)
levels_st = st.lists(st.lists(st.integers(0, V - 1), min_size=1, max_size=3, unique=True), min_size=0, max_size=3)
FAST = settings(max_examples=150, deadline=None)


def build(root: int, levels: list[list[int]], paths: list[list[int]]) -> Trie:
    trie = Trie.with_root(root)
    trie.add_levels(levels)
    for p in paths:
        trie.add_path(p, NGRAM)
    return trie


@FAST
@given(st.integers(0, V - 1), levels_st, paths_st, st.integers(0, 1000))
def test_trie_invariants(root, levels, paths, base):
    trie = build(root, levels, paths)
    n = len(trie)
    # Every inserted candidate is a root-to-node chain with the same tokens.
    candidates = {tuple(p) for p in paths}
    for depth in range(1, len(levels) + 1):  # the cartesian paths of the heads
        chains = [()]
        for level in levels[:depth]:
            chains = [c + (t,) for c in chains for t in level]
        candidates |= set(chains)
    prefixes = {c[:k] for c in candidates for k in range(1, len(c) + 1)}
    stored = {tuple(trie.tokens[i] for i in trie.path(node)) for node in range(1, n)}
    assert stored == prefixes  # every candidate and its prefixes present, nothing else
    assert n == 1 + len(stored)
    mask, pos = trie.mask(), trie.positions(base)
    for i in range(n):
        # a token at most once per parent: its children are the nodes whose parent it is, one per token
        assert sorted(trie.children[i].values()) == [j for j in range(1, n) if trie.parents[j] == i]
        assert all(trie.tokens[child] == token for token, child in trie.children[i].items())
        ancestors = {0, i, *trie.path(i)}
        assert {j for j in range(n) if mask[i, j]} == ancestors
        assert int(pos[i]) == base + trie.depths[i] == base + len(trie.path(i))
        if i:
            assert trie.depths[trie.parents[i]] == trie.depths[i] - 1
            assert trie.sources[i] & (HEADS | NGRAM)


@FAST
@given(tokens_st, st.integers(2, 5), st.integers(0, V - 1), st.integers(0, 8))
def test_ngram_counts_and_top_k(tokens, n, first, k):
    table = NGramTable(n)
    table.add_all(tokens, 0, max(0, len(tokens) - n + 1))
    truth = Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))
    assert table.total == sum(truth.values())
    for gram, c in truth.items():
        assert table.count(gram) == c
    top = table.top(first, k)
    conts = {g[1:]: c for g, c in truth.items() if g[0] == first}
    assert len(top) == min(k, len(conts))
    counts = [c for _, c in top]
    assert counts == sorted(counts, reverse=True)
    assert all(conts[cont] == c for cont, c in top)
    if top:  # the k most frequent: nothing left out is more frequent than the last kept
        kept = {cont for cont, _ in top}
        assert all(c <= counts[-1] for cont, c in conts.items() if cont not in kept)


@FAST
@given(tokens_st, st.lists(st.integers(0, 60), max_size=6), st.integers(0, 10))
def test_ngram_tracker_incremental_equals_one_shot(tokens, cuts, exclude):
    """What resume relies on: feeding the sequence in any pieces builds the same table."""
    step = NGramTracker(4, exclude)
    for cut in sorted(c for c in cuts if c <= len(tokens)) + [len(tokens)]:
        step.update(tokens, cut)
    once = NGramTracker(4, exclude)
    once.update(tokens, len(tokens))
    assert step.next_start == once.next_start
    for first in range(V):
        assert step.table.top(first, 100) == once.table.top(first, 100)


sampling_st = st.builds(
    SamplingConfig,
    temperature=st.sampled_from([0.0, 0.5, 1.0, 1.7]),
    top_k=st.integers(0, V + 2),
    top_p=st.sampled_from([1.0, 0.95, 0.5, 0.1]),
    min_p=st.sampled_from([0.0, 0.05, 0.3]),
    eta=st.sampled_from([0.0, 0.01, 0.3]),
    repetition_penalty=st.sampled_from([1.0, 1.2, 2.0, 0.8]),
    penalty_window=st.integers(0, 8),
)
logits_st = st.lists(st.floats(-20, 20, allow_nan=False), min_size=V, max_size=V)


@FAST
@given(logits_st, st.lists(st.integers(0, V - 1), max_size=8), sampling_st)
@example([0.0] * (V - 1) + [1.0], [], SamplingConfig(temperature=0.5, top_k=2, min_p=0.0, repetition_penalty=1.0,
                                                     penalty_window=0))  # ties at the k-th value are kept
def test_transform_keeps_the_penalised_argmax_and_a_distribution(logits, window, cfg):
    x = torch.tensor(logits, dtype=torch.float64)[None]
    w = torch.tensor(window[-cfg.penalty_window:] if cfg.penalty_window else [], dtype=torch.long)[None]
    penalised = apply_penalty(x, w, cfg.repetition_penalty)[0]
    # Tokens outside the window are untouched; those inside move away from being chosen (theta > 1).
    inside = set(w[0].tolist())
    for t in range(V):
        if t not in inside:
            assert penalised[t] == x[0, t]
        elif cfg.repetition_penalty > 1:
            assert penalised[t] <= x[0, t]
    out = transform(x, w, cfg)[0]
    best = int(torch.argmax(penalised))
    assert math.isfinite(float(out[best])) and int(torch.argmax(out)) == best
    probs = torch.softmax(out, -1)
    assert abs(float(probs.sum()) - 1) < 1e-9
    if cfg.top_k and not cfg.greedy:  # top-k keeps the k largest and, like transformers, ties with the k-th
        kth = torch.sort(penalised, descending=True).values[min(cfg.top_k, V) - 1]
        assert int(torch.isfinite(out).sum()) <= int((penalised >= kth).sum())
        assert int((penalised >= kth).sum()) == min(cfg.top_k, V) or int((penalised == kth).sum()) > 1
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        assert math.isfinite(float(out[draw(out, cfg, g)]))  # never a filtered token


def walk_against_ar(root, levels, paths, seed, cfg, history, max_tokens, boost, stop_ids=frozenset()):
    """Walk a trie under a toy model and check it emits what AR would with the same seed, up to and including
    the first of `stop_ids` (an EOS: AR stops after it); the walk. The toy model's logits are a function of the
    sequence so far: seeded noise, plus `boost` on the tokens of the trie's children where the sequence follows
    a trie path (so that walks go deep)."""
    trie = build(root, levels, paths)
    gen_w = torch.Generator().manual_seed(seed)
    ctx = history + [root]

    def node_of(seq: list[int]) -> int | None:  # the trie node `seq` reaches past the context, if any
        node = 0
        for t in seq[len(ctx):]:
            node = trie.children[node].get(t)  # (token -> child)
            if node is None:
                return None
        return node

    def model(seq: list[int]) -> torch.Tensor:  # a deterministic toy LM over the whole sequence
        h = torch.Generator().manual_seed(hash(tuple(seq)) % 2**31)
        x = torch.randn(V, generator=h, dtype=torch.float64) * 3
        node = node_of(seq) if seq[:len(ctx)] == ctx else None
        if node is not None and boost:
            x[list(trie.children[node])] += boost
        return x

    hist = torch.tensor(ctx, dtype=torch.long)

    def row_logits(node: int) -> torch.Tensor:
        return model(ctx + [trie.tokens[i] for i in trie.path(node)])

    walk = lossless_walk(trie, row_logits, hist, len(ctx), cfg, gen_w if not cfg.greedy else None, stop_ids,
                         max_tokens=max_tokens)
    # AR with the same generator state.
    gen_a = torch.Generator().manual_seed(seed)
    seq = list(ctx)
    emitted = []
    for _ in range(len(walk.tokens) + 1):
        window = torch.tensor(seq[max(0, len(seq) - cfg.penalty_window):] if cfg.penalty_window else [],
                              dtype=torch.long)
        x = transform(model(seq)[None], window[None], cfg)[0]
        t = draw(x, cfg, gen_a if not cfg.greedy else None)
        emitted.append(t)
        seq.append(t)
    assert walk.tokens + [walk.next_root] == emitted
    assert [trie.tokens[n] for n in walk.nodes] == walk.tokens
    assert all(trie.parents[b] == a for a, b in zip([0] + walk.nodes, walk.nodes))
    assert len(walk.tokens) + 1 <= max_tokens
    assert not stop_ids & set(walk.tokens)  # (AR stops after the first: it is the last emitted)
    if len(walk.tokens) + 1 < max_tokens and walk.next_root not in stop_ids:
        last = walk.nodes[-1] if walk.nodes else 0
        assert walk.next_root not in trie.children[last]
    return walk


@FAST
@given(st.integers(0, V - 1), levels_st, paths_st, st.integers(0, 2**31), sampling_st,
       st.lists(st.integers(0, V - 1), min_size=1, max_size=10), st.integers(1, 6), st.sampled_from([0.0, 12.0]),
       st.frozensets(st.integers(0, V - 1), max_size=3))
def test_walk_emits_exactly_the_ar_chain(root, levels, paths, seed, cfg, history, max_tokens, boost, stop_ids):
    """With logits a function of the sequence so far, the walk over any trie emits what AR
    would with the same seed: each token one draw from AR's transform, descending only into
    children, stopping at the first draw that is not one, at the first stop id (an EOS, which a review found
    the walk could ignore and still pass here), or at max_tokens."""
    walk_against_ar(root, levels, paths, seed, cfg, history, max_tokens, boost, stop_ids)


def test_deep_walks_see_the_penalty_window_ar_sees():
    """Walks that accept several tokens under a repetition penalty whose window is shorter than the
    walk (its oldest tokens leave the window inside the trie), under greedy and sampled decoding:
    the property test above reaches such walks only when hypothesis draws them, so here they are
    made on purpose, and counted."""
    rng = random.Random(7)
    deep = 0
    for i in range(120):
        root = rng.randrange(V)
        paths = [[rng.randrange(V) for _ in range(5)] for _ in range(rng.randint(1, 4))]
        levels = [rng.sample(range(V), 2) for _ in range(rng.randint(0, 3))]
        cfg = SamplingConfig(temperature=0.0 if i % 3 == 0 else 1.0, top_k=0, top_p=1.0, min_p=0.0,
                             repetition_penalty=rng.choice([1.3, 2.0, 0.7]), penalty_window=rng.randint(1, 3))
        history = [rng.randrange(V) for _ in range(rng.randint(1, 6))]
        walk = walk_against_ar(root, levels, paths, rng.randrange(2**31), cfg, history, 6, boost=12.0)
        deep += len(walk.tokens) > cfg.penalty_window
    assert deep >= 40, deep  # walks deeper than their penalty window
