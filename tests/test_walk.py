"""The batched walk (every trie row transformed and drawn at once, one device read) against the
row-by-row walk, whose emitted sequences test_lossless.py enumerates against AR's probabilities:
same nodes, same tokens, same generator state after, for every sampling and stopping rule. And
the pieces it rests on: the per-node penalty windows, batched draws, blocks of uniforms."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_hf_model

import longswift
from longswift import GenerationConfig, SamplingConfig, SpecConfig
from longswift.sampling import draw, draw_rows, transform, uniforms
from longswift.spec.tokenswift import TokenSwiftState, build_tree, draft, verify
from longswift.spec.tree import Trie
from longswift.spec.verify import batched_walk, lossless_walk, node_windows
from longswift.stats import GenerationStats

VOCAB = 10
SAMPLINGS = {
    "greedy": SamplingConfig(temperature=0, repetition_penalty=1.0),
    "greedy-penalty": SamplingConfig(temperature=0, repetition_penalty=1.5, penalty_window=3),
    "sampled": SamplingConfig(min_p=0.0, repetition_penalty=1.0),
    "filters-penalty": SamplingConfig(top_p=0.8, min_p=0.05, repetition_penalty=1.3, penalty_window=4),
    "penalty-long-window": SamplingConfig(temperature=0.7, top_k=6, repetition_penalty=1.6, penalty_window=40),
    "banned": SamplingConfig(eta=0.01, repetition_penalty=1.2, penalty_window=2, banned_ids=(1, 4)),
}


def test_a_block_of_uniforms_is_the_same_stream_as_single_draws():
    """The batched walk draws a step's uniforms at once and rewinds to consume one per emitted
    token; AR draws one per token. Both must read one stream: k at once == k single draws, and the
    generator ends in the same state."""
    for k in (1, 2, 3, 7, 16, 33, 300):
        a = torch.Generator().manual_seed(k)
        single = torch.cat([uniforms(a, 1) for _ in range(k)])
        b = torch.Generator().manual_seed(k)
        block = uniforms(b, k)
        assert torch.equal(single, block)
        assert torch.equal(a.get_state(), b.get_state())


@pytest.mark.parametrize("sampling", SAMPLINGS.values(), ids=SAMPLINGS.keys())
def test_draw_rows_draws_each_row_as_draw_does(sampling):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(9, 50, generator=g, dtype=torch.float64) * 2
    x = transform(logits, torch.empty(9, 0, dtype=torch.long), sampling)
    one = torch.Generator().manual_seed(5)
    singles = [draw(x[i], sampling, one) for i in range(9)]
    block = torch.Generator().manual_seed(5)
    u = None if sampling.greedy else uniforms(block, 9)
    assert draw_rows(x, sampling, u).tolist() == singles


def path_tokens(trie: Trie, node: int) -> list[int]:
    return [trie.tokens[i] for i in trie.path(node)]


@pytest.mark.parametrize("window", [0, 1, 2, 3, 5, 40])
@pytest.mark.parametrize("length", [1, 2, 4, 12])
def test_node_windows_hold_what_the_row_walk_would_see(window, length):
    """Row i: the last `window` tokens of history[:length] + node i's path — the row walk's window
    at that node — as a multiset (the penalty reads presence only), padding -1."""
    trie = Trie.with_root(7)
    trie.add_levels([[1, 2], [3], [4, 5]])
    trie.add_path([2, 9, 9, 8, 6, 6], 2)
    history = torch.arange(100, 100 + length)
    rows = node_windows(trie, history, length, window)
    assert rows.shape[0] == len(trie)
    for i in range(len(trie)):
        d, path = trie.depths[i], path_tokens(trie, i)
        expected = history[max(0, length + d - window) : length].tolist() + (path[max(0, d - window) :] if window else [])
        got = [t for t in rows[i].tolist() if t >= 0]
        assert sorted(got) == sorted(expected), (i, got, expected)


@pytest.fixture(scope="module")
def verified():
    """A real verify pass over a wide trie on a tiny float64 model: (state, trie, Verified)."""
    hf = tiny_hf_model("llama", "default", seed=61, dtype=torch.float64, vocab=VOCAB)
    engine = longswift.load(hf, dtype="float64", heads="random")
    prompt = [3, 4, 5, 3, 4, 5, 6, 3, 4, 5, 2, 3, 4]
    spec = SpecConfig(tree="3,3,2,2", ngram_topk=3)
    sampling = SamplingConfig(temperature=0, repetition_penalty=1.0)
    with torch.inference_mode():
        s = TokenSwiftState(engine.model, engine.heads, prompt, [], sampling,
                            GenerationConfig(max_new_tokens=30, ignore_eos=True), spec,
                            GenerationStats("tokenswift", len(prompt)), frozenset(), None)
        _, s.prev_hidden = engine.model.prefill(s.history[: s.n], s.full, 8)
        s.emit([4])  # a root, as if drawn
        trie = build_tree(s, draft(s))
        v = verify(s, trie)
        logits = engine.model.logits(v.hidden)  # [N, V]
    assert len(trie) > 20
    return s, trie, v, logits


@pytest.mark.parametrize("sampling", SAMPLINGS.values(), ids=SAMPLINGS.keys())
def test_batched_walk_equals_the_row_walk(verified, sampling):
    """Over 300 seeds, with stop tokens and token limits: same accepted nodes, tokens, new root and
    n-gram count, and the generator left in the same state (the next step's draws are the same)."""
    s, trie, v, logits = verified
    accepted = 0
    for seed in range(300 if not sampling.greedy else 1):
        for stop_ids, max_tokens in ((frozenset(), None), (frozenset({3}), None), (frozenset(), 2)):
            a = torch.Generator().manual_seed(seed)
            b = torch.Generator().manual_seed(seed)
            rows = lossless_walk(trie, lambda i: logits[i], s.history, s.n, sampling, a, stop_ids, max_tokens)
            batch = batched_walk(trie, logits, s.history, s.n, sampling, b, stop_ids, max_tokens)
            assert (batch.nodes, batch.tokens, batch.next_root, batch.ngram_only) == \
                   (rows.nodes, rows.tokens, rows.next_root, rows.ngram_only), (seed, stop_ids, max_tokens)
            assert torch.equal(a.get_state(), b.get_state())
            accepted += len(rows.tokens)
    assert accepted > 0  # paths below the root were walked


def test_batched_walk_with_the_default_generator_consumes_one_uniform_per_token(verified):
    s, trie, v, logits = verified
    sampling = SamplingConfig(min_p=0.0, repetition_penalty=1.0)
    torch.manual_seed(9)
    walk = batched_walk(trie, logits, s.history, s.n, sampling, None)
    after = torch.rand(3, dtype=torch.float64)
    torch.manual_seed(9)
    torch.rand(len(walk.tokens) + 1, dtype=torch.float64)
    assert torch.equal(after, torch.rand(3, dtype=torch.float64))


def test_a_root_alone_walks_like_a_plain_step():
    """A plain step under the batched walk: one row, no path; the root's window and AR's draw."""
    trie, history = Trie.with_root(3), torch.arange(10)
    assert node_windows(trie, history, 10, 4).tolist() == [[6, 7, 8, 9]]
    logits = torch.randn(1, 20, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    sampling = SamplingConfig(repetition_penalty=1.3, penalty_window=4)
    for seed in range(20):
        a, b = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        walk = batched_walk(trie, logits, history, 10, sampling, a)
        assert walk.nodes == [] and walk.tokens == []
        assert walk.next_root == lossless_walk(trie, lambda i: logits[i], history, 10, sampling, b).next_root
        assert torch.equal(a.get_state(), b.get_state())


@pytest.mark.parametrize("penalty", [1.3, 1.0])
def test_the_batched_walk_refuses_logits_that_are_not_a_row_per_node(penalty):
    """Fewer rows than nodes used to fail deep in the penalty's scatter (or, without a penalty, walk
    off the rows); more rows than nodes would be a budget's padding left unsliced."""
    trie, history = Trie.with_root(3), torch.arange(10)
    trie.add_levels([[1, 2], [4]])
    sampling = SamplingConfig(repetition_penalty=penalty, penalty_window=4)
    for rows in (len(trie) - 1, len(trie) + 1):
        logits = torch.randn(rows, 20, dtype=torch.float64)
        with pytest.raises(ValueError, match=f"a row of logits per trie node: got {rows} rows for {len(trie)} nodes"):
            batched_walk(trie, logits, history, 10, sampling, torch.Generator().manual_seed(0))
    assert batched_walk(trie, torch.randn(len(trie), 20, dtype=torch.float64), history, 10, sampling,
                        torch.Generator().manual_seed(0)).next_root is not None
