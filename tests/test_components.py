"""TokenSwift's parts against brute-force definitions: trie, mask, positions; n-gram table;
partial KV cache; draft heads (save/load, identity checks)."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter

import pytest
import torch
from conftest import Calls, OpCount, needs_fused_rms_norm, tiny_hf_model, ulps

import longswift
from longswift import GenerationConfig, SamplingConfig
from longswift.config import SpecConfig
from longswift.errors import ConfigError, LongswiftError
from longswift.runtime.cache import FullKVCache, PartialKVCache
from longswift.spec.heads import DraftHeads, load_heads, model_fingerprint, new_heads, save_heads
from longswift.spec.ngram import NGramTable, NGramTracker, path_scores
from longswift.spec.tokenswift import TokenSwiftState, draft
from longswift.spec.tree import HEADS, NGRAM, Trie
from longswift.stats import GenerationStats

# ---- trie ------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(20))
def test_trie_matches_brute_force(seed):
    r = random.Random(seed)
    levels = [[r.randrange(6) for _ in range(r.randrange(1, 4))] for _ in range(r.randrange(1, 4))]
    levels = [list(dict.fromkeys(level)) for level in levels]  # distinct per depth, as top-k gives
    ngrams = [tuple(r.randrange(6) for _ in range(4)) for _ in range(r.randrange(0, 6))]
    trie = Trie.with_root(9)
    trie.add_levels(levels)
    for g in ngrams:
        trie.add_path(g, NGRAM)
    candidates = [tuple(p) for p in itertools.product(*levels)] + ngrams
    prefixes = {c[:i] for c in candidates for i in range(1, len(c) + 1)}
    paths = [tuple(trie.tokens[j] for j in trie.path(i)) for i in range(len(trie))]
    assert paths[0] == () and len(paths) == len(set(paths))  # shared prefixes are merged
    assert set(paths[1:]) == prefixes
    mask = trie.mask()
    for i, j in itertools.product(range(len(trie)), repeat=2):
        assert bool(mask[i, j]) == (paths[i][: len(paths[j])] == paths[j]), (i, j)
    assert trie.positions(100).tolist() == [100 + len(p) for p in paths]
    head_paths = {c[:i] for c in itertools.product(*levels) for i in range(1, len(c) + 1)}
    gram_paths = {g[:i] for g in ngrams for i in range(1, 5)}
    for i in range(1, len(trie)):
        assert bool(trie.sources[i] & HEADS) == (paths[i] in head_paths)
        assert bool(trie.sources[i] & NGRAM) == (paths[i] in gram_paths)


@pytest.mark.parametrize("seed", range(10))
def test_missing_counts_the_nodes_a_path_adds(seed):
    """Trie.missing(path) is how much add_path(path) grows the trie: a lookup step without pruning leaves out an
    n-gram path that would pass --lookup-nodes by it, so one off let that trie grow a node past the budget the
    buffers and the cache slack are sized by (a mutation audit: no test failed)."""
    r = random.Random(seed)
    trie = Trie.with_root(9)
    for _ in range(12):
        path = [r.randrange(4) for _ in range(r.randrange(0, 5))]
        before = len(trie)
        expected = trie.missing(path)
        trie.add_path(path, NGRAM)
        assert len(trie) - before == expected, (path, expected)
        assert trie.missing(path) == 0


@pytest.mark.parametrize("seed", range(30))
def test_a_pruned_trie_keeps_its_highest_scoring_nodes(seed):
    """Scored like the loop scores (heads: summed log-probabilities; n-grams: log shares of
    counts, so no child outscores its parent), the pruned trie is exactly the `max_nodes`
    highest-scoring nodes, ties to the shallower and earlier, with every path, source and score kept."""
    r = random.Random(seed)
    levels = [list(dict.fromkeys(r.randrange(8) for _ in range(r.randrange(1, 4)))) for _ in range(r.randrange(1, 4))]
    logprobs = [[math.log(r.random()) if r.random() < 0.8 else -1.0 for _ in level] for level in levels]
    trie = Trie.with_root(9)
    trie.add_levels(levels, logprobs)
    for _ in range(r.randrange(0, 5)):
        first = r.randrange(len(levels[0]))
        share = [math.log(r.random()) for _ in range(3)]
        scores = [logprobs[0][first]] + [logprobs[0][first] + min(share[: j + 1]) for j in range(3)]
        trie.add_path([levels[0][first]] + [r.randrange(8) for _ in range(3)], NGRAM, scores)
    paths = [tuple(trie.tokens[j] for j in trie.path(i)) for i in range(len(trie))]
    for i in range(1, len(trie)):  # the heads' score of a path is the sum of its tokens' log-probabilities
        if trie.sources[i] == HEADS:
            assert trie.scores[i] == pytest.approx(sum(logprobs[d][levels[d].index(t)] for d, t in enumerate(paths[i])))
        assert trie.scores[i] <= trie.scores[trie.parents[i]] + 1e-12
    for budget in range(2, len(trie) + 2):
        pruned = trie.pruned(budget)
        best = sorted(range(1, len(trie)), key=lambda i: (-trie.scores[i], trie.depths[i], i))[: budget - 1]
        kept = [tuple(pruned.tokens[j] for j in pruned.path(i)) for i in range(len(pruned))]
        assert len(pruned) == min(budget, len(trie)) and pruned.tokens[0] == 9
        assert set(kept[1:]) == {paths[i] for i in best}
        for i in range(1, len(pruned)):
            old = paths.index(kept[i])
            assert (pruned.sources[i], pruned.scores[i], pruned.depths[i]) == (
                trie.sources[old], trie.scores[old], trie.depths[old])
        for leaf in range(len(trie)):  # of every path, the nodes the budget keeps: the prefix whose tokens it holds
            path = trie.path(leaf)
            held = next((d for d in range(len(path)) if paths[path[d]] not in kept), len(path))
            assert trie.held(path, budget) == held, (budget, leaf)
    assert trie.pruned(len(trie)) is trie


@pytest.mark.parametrize("seed", range(30))
def test_heads_levels_grown_to_a_budget_prune_to_the_whole_trees_nodes(seed):
    """add_levels(keep=B-1) makes and grows only each depth's B-1 best nodes (a 64,64,64,64 tree made 16.8 M nodes
    to keep 32): with the n-gram paths added after, as build_tree adds them, the trie pruned to B holds the same
    paths with the same scores as the whole tree pruned to B; a node the n-grams alone brought back may lack the
    heads' mark (the heads' score it would have had ranked below the budget)."""
    r = random.Random(seed)
    levels = [list(dict.fromkeys(r.randrange(8) for _ in range(r.randrange(1, 6)))) for _ in range(r.randrange(1, 5))]
    logprobs = [[math.log(r.random()) if r.random() < 0.8 else -1.0 for _ in level] for level in levels]
    grams = []
    for _ in range(r.randrange(0, 6)):
        first = r.randrange(len(levels[0]))
        share = [math.log(r.random()) for _ in range(3)]
        grams.append(([levels[0][first]] + [r.randrange(8) for _ in range(3)],
                      [logprobs[0][first]] + [logprobs[0][first] + min(share[: j + 1]) for j in range(3)]))

    def built(keep):
        trie = Trie.with_root(9)
        trie.add_levels(levels, logprobs, keep=keep)
        for tokens, scores in grams:
            trie.add_path(tokens, NGRAM, scores)
        return trie

    whole = built(None)
    for budget in range(2, len(whole) + 2):
        grown = built(budget - 1)
        assert len(grown) <= 1 + (budget - 1) * len(levels) + 4 * len(grams)
        want, got = whole.pruned(budget), grown.pruned(budget)
        nodes = [{tuple(t.tokens[j] for j in t.path(i)): (t.scores[i], t.sources[i]) for i in range(len(t))}
                 for t in (want, got)]
        assert {k: v[0] for k, v in nodes[0].items()} == {k: v[0] for k, v in nodes[1].items()}, budget
        assert all(nodes[1][k][1] | HEADS == v[1] | HEADS and nodes[1][k][1] & v[1] for k, v in nodes[0].items()
                   if k), budget


def test_pruning_keeps_ancestors_even_where_a_child_outscores_its_parent():
    trie = Trie.with_root(0)
    trie.add_path([1, 2, 3], NGRAM, [-5.0, -0.1, -0.1])
    trie.add_path([4], NGRAM, [-1.0])
    pruned = trie.pruned(3)
    assert [tuple(pruned.tokens[j] for j in pruned.path(i)) for i in range(1, len(pruned))] == [(1,), (4,)]
    assert all(p < i for i, p in enumerate(pruned.parents) if i)


def test_pruning_breaks_score_ties_toward_shallower_nodes():
    """Equal scores: the documented order is shallower first, then earlier (the random trie above rarely ties)."""
    trie = Trie.with_root(0)
    trie.add_path([1, 2], NGRAM, [0.0, 0.0])  # a (depth 1) -> b (depth 2)
    trie.add_path([3], NGRAM, [0.0])  # c (depth 1), added after b
    pruned = trie.pruned(3)
    assert [tuple(pruned.tokens[j] for j in pruned.path(i)) for i in range(1, len(pruned))] == [(1,), (3,)]


def test_ngram_path_scores_are_log_shares_of_prefixes():
    table = NGramTable(4)
    for g in [(1, 2, 3, 4)] * 3 + [(1, 2, 3, 5), (1, 2, 6, 7), (1, 8, 8, 8), (1, 9, 9, 9)]:
        table.add(g)
    assert table.total_of(1) == 7 and table.total_of(2) == 0
    conts = table.top(1, 3)  # (2,3,4) x3, then two of the count-1 ones
    scores = path_scores(conts, table.total_of(1), base=-0.5)
    listed = {c[:j]: sum(n for d, n in conts if d[:j] == c[:j]) for c, _ in conts for j in (1, 2, 3)}
    for (cont, _), row in zip(conts, scores):
        assert row == pytest.approx([-0.5 + math.log(listed[cont[:j]] / 7) for j in (1, 2, 3)])
        assert row == sorted(row, reverse=True)


@pytest.mark.parametrize("tree,topk,mode", [("1,1,1", 1, "paper"), ("1,3,3,3", 20, "paper"), ("1,3,3,3", 6, "fused"),
                                             ("2,2", 3, "fused"), ("1,2", 4, "fused"), ("3", 0, "paper")])
def test_the_node_budget_is_the_largest_trie_a_step_builds(tree, topk, mode):
    """unpruned_budget (buffers, memory plans, `longswift info`) is reached by a step whose drafted
    and n-gram tokens are all distinct, and never passed: the heads' cartesian tree, then topk n-gram
    paths after each depth-1 token, each the lead and its n-gram's NGRAM_N - 1 following tokens. (A fused
    tree of one depth, which drafts nothing, is refused by SpecConfig.)"""
    from longswift.spec.budget import draft_levels, unpruned_budget
    from longswift.spec.ngram import NGRAM_N

    spec = SpecConfig(tree=tree, ngram_topk=topk, draft_mode=mode).for_device(torch.device("cpu"))
    fresh = itertools.count(1)
    levels = [[next(fresh) for _ in range(k)] for k in draft_levels(spec)]
    trie = Trie.with_root(0)
    trie.add_levels(levels)
    for lead in (levels[0] if levels else [None]):
        for _ in range(topk):
            path = [next(fresh) for _ in range(NGRAM_N - 1)]
            trie.add_path(path if lead is None else [lead, *path], NGRAM)
    assert len(trie) == unpruned_budget(spec)


def test_the_trie_mask_costs_ops_by_depth_not_by_nodes():
    """Every full or lookup step builds its trie's mask on the host. Built a depth at a time, it
    runs the same few ops for a 5-node chain and a 100-node trie of the same depth (the GPU's
    default trie with n-gram paths); set entry by entry, as before, it ran ~3 ops per node and
    ancestor: 1,517 ops, ~2 ms of host time, for the 100-node trie."""

    def ops(levels, paths):
        trie = Trie.with_root(0)
        trie.add_levels(levels)
        for p in paths:
            trie.add_path(p, NGRAM)
        with OpCount() as count:
            trie.mask()
        return len(trie), max(trie.depths), count.ops

    r = random.Random(0)
    chain = ops([[1], [2], [3], [4]], [])
    wide = ops([[1, 2, 3]] * 3, [(1, *(r.randrange(10, 1000) for _ in range(3))) for _ in range(20)])
    assert chain[:2] == (5, 4) and wide[1] == 4 and wide[0] >= 90
    assert wide[2] == chain[2] <= 25, (chain, wide)


@pytest.mark.parametrize("bad", ["", "1,0,3", "a,b", "1,,2", "-1"])
def test_bad_tree_specs(bad):
    with pytest.raises(LongswiftError, match="tree must be"):
        SpecConfig(tree=bad)


# ---- n-grams ---------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(30))
def test_ngram_counts_and_topk_match_counter(seed):
    r = random.Random(seed)
    tokens = [r.randrange(5) for _ in range(r.randrange(4, 300))]
    table = NGramTable(4)
    table.add_all(tokens, 0, len(tokens) - 3)
    truth = Counter(tuple(tokens[i : i + 4]) for i in range(len(tokens) - 3))
    assert table.total == sum(truth.values())
    for g, c in truth.items():
        assert table.count(g) == c
    for first in range(5):
        ranked = sorted((c for g, c in truth.items() if g[0] == first), reverse=True)
        for k in (1, 3, 20):
            top = table.top(first, k)
            assert [c for _, c in top] == ranked[:k]
            assert all(truth[(first, *cont)] == c for cont, c in top)


def test_equal_counts_never_overwrite_each_other():
    table = NGramTable(2)
    for cont in range(10):
        table.add([1, cont])
    assert sorted(c for c, _ in table.top(1, 20)) == [(c,) for c in range(10)]
    assert all(n == 1 for _, n in table.top(1, 20))


def test_tracker_keeps_the_penalty_window_out():
    tracker = NGramTracker(4, exclude_recent=5)
    tokens = list(range(20))
    tracker.update(tokens, 12)  # n-grams must end before index 12 - 5 = 7
    assert tracker.table.total == 4  # starts 0..3 end at 3..6
    tracker.update(tokens, 20)
    assert tracker.table.total == 12 and tracker.table.count([11, 12, 13, 14]) == 1
    assert tracker.table.count([12, 13, 14, 15]) == 0


# ---- partial cache ---------------------------------------------------------------------------

def test_partial_cache_selection_matches_its_definition():
    engine = longswift.load(tiny_hf_model("llama", seed=61), dtype="float64")
    cfg, model = engine.cfg, engine.model
    ids = torch.randint(0, 128, (60,), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        full = FullKVCache(cfg, 80, torch.float64, torch.device("cpu"))
        model.prefill(ids[:-1], full, 16)
        queries: list[torch.Tensor] = []
        model.forward(ids[-1:], torch.tensor([59]), full, queries=queries)
        full.truncate(59)
        part = PartialKVCache(cfg, budget=30, sinks=4, window=6, dtype=torch.float64, device=torch.device("cpu"))
        part.select(full, queries)
    assert part.length == part.window_start == 24 and not part.window_full
    g = cfg.group_size
    for layer in range(cfg.num_layers):
        for h in range(cfg.num_kv_heads):
            q = queries[layer][h * g : (h + 1) * g]  # [G, D]: the query heads of this KV head
            scores = [float((q @ full.k[layer, h, slot]).sum()) for slot in range(4, 59)]
            best = sorted(sorted(range(len(scores)), key=lambda i: -scores[i])[:20])
            slots = [0, 1, 2, 3] + [4 + i for i in best]
            assert part.positions[layer, h].tolist() == slots
            assert torch.equal(part.k[layer, h, :24], full.k[layer, h, slots])
            assert torch.equal(part.v[layer, h, :24], full.v[layer, h, slots])
    with torch.inference_mode():
        model.forward(ids[-1:], torch.tensor([59]), full)
        part.append(full, 59, 60)
    assert part.length == 25 and torch.equal(part.k[:, :, 24], full.k[:, :, 59])
    part.length = 30
    assert part.window_full


def wiring_state(spec: SpecConfig, prompt: list[int], sampling: SamplingConfig | None = None,
                 heads_seed: int = 61) -> TokenSwiftState:
    """A TokenSwift state over a tiny float64 model with its context prefilled (history[n-1] is the root)."""
    engine = longswift.load(tiny_hf_model("llama", seed=heads_seed), dtype="float64", heads="random")
    sampling = sampling or SamplingConfig(temperature=0, repetition_penalty=1.0)
    s = TokenSwiftState(engine.model, engine.heads, prompt, [], sampling, GenerationConfig(max_new_tokens=40,
                        ignore_eos=True), spec.for_device("cpu"), GenerationStats("tokenswift", len(prompt)),
                        frozenset(), None)
    _, s.prev_hidden = s.model.prefill(s.history[: s.n - 1], s.full, 16)
    return s


@pytest.mark.parametrize("mode", ["dynamic", "static", "full"])
def test_draft_cache_modes_select_as_specified(mode):
    """Past the budget the draft pass drafts on the partial cache; a full window is re-selected
    (dynamic) or slid on to its newest half with the first selection kept (static); `full` never builds one."""
    spec = SpecConfig(tree="1,1", ngram_topk=0, draft_kv_budget=30, draft_window=6, attention_sinks=4,
                      draft_cache=mode, adaptive=False)
    prompt = torch.randint(0, 128, (40,), generator=torch.Generator().manual_seed(5)).tolist()
    with torch.inference_mode():
        s = wiring_state(spec, prompt)  # the committed context prefilled; history[n-1] is the root
        if mode == "full":
            assert s.partial is None
            draft(s)
            assert s.full.length == s.n - 1
            return
        draft(s)  # context 39 >= budget 30: selects
        first = s.partial.positions.clone()
        assert s.partial.selected and s.partial.length == s.partial.window_start == 24
        s.partial.append(s.full, 0, 6)  # fill the window (any entries will do)
        assert s.partial.window_full
        s.n -= 1  # draft at another root so a re-selection would score other queries
        s.full.truncate(s.n - 1)
        draft(s)
        if mode == "static":
            assert torch.equal(s.partial.positions, first) and s.partial.length == 24 + 3
        else:
            assert s.partial.length == 24 and not torch.equal(s.partial.positions, first)


def test_the_partial_cache_is_made_only_for_runs_that_draft_on_it(monkeypatch):
    """The last draft pass of a run of `total` tokens sees total - 2 cached entries: a run of budget + 1 tokens
    never reaches the budget, so it gets no partial cache (it had one, a budget's worth of keys, unused); one
    of budget + 2 drafts its last step on it."""
    import longswift.spec.tokenswift as ts

    engine = longswift.load(tiny_hf_model("llama", seed=61), dtype="float64", heads="random")
    spec = SpecConfig(tree="1,1", ngram_topk=0, draft_kv_budget=30, draft_window=6, attention_sinks=4,
                      adaptive=False)
    made, selected = [], []
    real_init, real_select = ts.PartialKVCache.__init__, ts.PartialKVCache.select
    monkeypatch.setattr(ts.PartialKVCache, "__init__",
                        lambda self, *a, **k: made.append(a[1]) or real_init(self, *a, **k))
    monkeypatch.setattr(ts.PartialKVCache, "select", lambda self, *a: selected.append(self) or real_select(self, *a))
    for total, budget in ((31, None), (32, 30)):
        made.clear(), selected.clear()
        stream = engine.stream(list(range(3, 25)), method="tokenswift", spec=spec, max_new_tokens=total - 22,
                               ignore_eos=True, temperature=0)
        for _ in stream:
            pass
        assert made == ([] if budget is None else [budget]) and bool(selected) == (budget is not None)


def test_drafts_are_transformed_with_the_roots_penalty_window(monkeypatch):
    """The draft's candidates are the target's top tokens after the same transform, penalty included (these
    wiring tests guard speed, not output: every trie's tokens are verified)."""
    import longswift.spec.tokenswift as ts

    sampling = SamplingConfig(temperature=0, repetition_penalty=5.0, penalty_window=8)
    prompt = torch.randint(0, 128, (20,), generator=torch.Generator().manual_seed(3)).tolist()
    with torch.inference_mode():
        s = wiring_state(SpecConfig(tree="2,2", ngram_topk=0, adaptive=False), prompt, sampling)
        seen = []
        real = ts.transform
        monkeypatch.setattr(ts, "transform", lambda x, w, cfg: seen.append((w, cfg)) or real(x, w, cfg))
        draft(s)
    (window, cfg), = seen
    assert cfg == sampling and torch.equal(window, s.window().expand(window.shape[0], -1))
    assert window.shape[1] == 8


def test_a_pruned_drafts_scores_are_the_transformed_depths_log_probabilities(monkeypatch):
    """Where the trie is cut to the node budget, each candidate scores its log-probability under the depth's
    transformed distribution (log_softmax at the chosen id), so that summed along a path they rank the paths
    by how likely the target draws them. Scores from the raw logits (or the untransformed ones) rank the
    nodes otherwise: the output stays the target's (every node is verified), only fewer tokens are accepted,
    which no output test sees."""
    import longswift.spec.tokenswift as ts
    from longswift.spec.tokenswift import build_tree

    sampling = SamplingConfig(seed=1, temperature=0.7, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.3,
                              penalty_window=8)
    prompt = torch.randint(0, 128, (20,), generator=torch.Generator().manual_seed(8)).tolist()
    with torch.inference_mode():
        s = wiring_state(SpecConfig(tree="3,3", ngram_topk=0, max_nodes=6, adaptive=False), prompt, sampling)
        assert s.pruning  # 13 nodes for a budget of 6
        seen = []
        real = ts.transform
        monkeypatch.setattr(ts, "transform", lambda x, w, cfg: seen.append(real(x, w, cfg)) or seen[-1])
        d = draft(s)
        trie = build_tree(s, d)
    (x,) = seen  # [depths, V]: the transformed depth logits
    assert d.logprobs is not None and [len(level) for level in d.levels] == [3, 3]
    expect = torch.log_softmax(x.double(), dim=-1)
    for depth, (ids, scores) in enumerate(zip(d.levels, d.logprobs)):
        assert ids == torch.topk(x[depth], 3).indices.tolist()
        assert all(score <= 0 for score in scores)
        assert scores == pytest.approx(expect[depth, ids].tolist(), rel=1e-9, abs=1e-12)
    assert len(trie) == 6


@pytest.mark.parametrize("penalty,excluded", [(1.2, 7), (1.0, 0)])
def test_the_ngram_table_leaves_out_the_penalty_window(penalty, excluded):
    prompt = torch.randint(0, 128, (20,), generator=torch.Generator().manual_seed(4)).tolist()
    sampling = SamplingConfig(temperature=0, repetition_penalty=penalty, penalty_window=7)
    with torch.inference_mode():
        s = wiring_state(SpecConfig(tree="1,1", ngram_topk=2), prompt, sampling)
    assert s.ngrams.exclude_recent == excluded
    assert s.ngrams.next_start == len(prompt) - excluded - 3  # every 4-gram that ends before the window


def test_a_lookup_step_proposes_the_roots_top_k_continuations():
    from longswift.spec.tokenswift import lookup_tree

    prompt = [7, 1, 1, 1, 9, 7, 2, 2, 2, 9, 7, 3, 3, 3, 9, 7, 4, 4, 4, 9, 7]  # the root 7: four continuations
    with torch.inference_mode():
        s = wiring_state(SpecConfig(tree="1,1", ngram_topk=3, max_nodes=0, suffix_lookup=False), prompt)
        trie = lookup_tree(s)
    assert sorted(trie.tokens[c] for c in trie.children[0].values()) == [1, 2, 3]
    assert len(trie) == 1 + 3 * 3


def test_ngram_paths_score_from_the_heads_candidate_they_follow():
    """Where the trie is pruned, an n-gram path after depth-1 candidate i scores that candidate's log-probability
    plus its log share, so that paths after an unlikely candidate are cut first."""
    from longswift.spec.tokenswift import Draft, build_tree

    prompt = [5, 1, 1, 1, 5, 1, 1, 1, 5, 2, 2, 2, 8, 3, 3, 3, 7]
    with torch.inference_mode():
        s = wiring_state(SpecConfig(tree="2", ngram_topk=2, max_nodes=64), prompt)
    s.pruning = True  # (this trie is within the budget: pruned() keeps it whole, scores as computed)
    trie = build_tree(s, Draft([[5, 8]], [[-0.5, -2.0]]))
    for first, base in ((5, -0.5), (8, -2.0)):
        node = trie.children[0][first]
        conts = s.ngrams.table.top(first, 2)
        expect = path_scores(conts, s.ngrams.table.total_of(first), base)
        for cont, scores in zip((c for c, _ in conts), expect):
            child = node
            for t, score in zip(cont, scores):
                child = trie.children[child][t]
                assert trie.scores[child] == pytest.approx(score)
    assert trie.scores[trie.children[trie.children[0][5]][1]] == pytest.approx(-0.5 + math.log(2 / 3))


def test_a_plain_block_leaves_the_fused_heads_state_where_single_steps_do():
    from longswift.spec.tokenswift import plain_block

    prompt = torch.randint(0, 128, (20,), generator=torch.Generator().manual_seed(6)).tolist()
    spec = SpecConfig(tree="1,1,1", ngram_topk=0, draft_mode="fused")
    with torch.inference_mode():
        block, single = wiring_state(spec, prompt), wiring_state(spec, prompt)
        tokens = plain_block(block, 3)
        singles = [t for _ in range(3) for t in plain_block(single, 1)]
    assert tokens == singles and block.n == single.n
    assert torch.equal(block.prev_hidden, single.prev_hidden)


def test_the_partial_caches_window_holds_the_full_caches_entries_since_its_selection(monkeypatch):
    """Plain steps leave the window behind and the next drafting step's catch_up brings it up to date: it
    then holds the full cache's slots from the selection on, each once, none skipped, and partial_from is the
    first slot it does not hold (drafts, not outputs, depend on it)."""
    from longswift.spec import schedule
    from longswift.spec.tokenswift import tokenswift_steps

    kinds = itertools.cycle([schedule.FULL, schedule.PLAIN, schedule.PLAIN, schedule.FULL, schedule.PLAIN])
    monkeypatch.setattr(schedule.StepSchedule, "choose", lambda self: self._run(next(kinds)))
    states, selections = [], []
    init, select = TokenSwiftState.__init__, PartialKVCache.select
    monkeypatch.setattr(TokenSwiftState, "__init__", lambda self, *a, **k: states.append(self) or init(self, *a, **k))
    monkeypatch.setattr(PartialKVCache, "select",
                        lambda self, full, queries: selections.append(full.length) or select(self, full, queries))
    engine = longswift.load(tiny_hf_model("llama", seed=61), dtype="float64", heads="random")
    spec = SpecConfig(tree="1,1", ngram_topk=0, draft_kv_budget=30, draft_window=8, attention_sinks=4).for_device("cpu")
    prompt = torch.randint(0, 128, (40,), generator=torch.Generator().manual_seed(5)).tolist()
    stats = GenerationStats("tokenswift", len(prompt))
    checked = 0
    with torch.inference_mode():
        steps = tokenswift_steps(engine.model, engine.heads, prompt, SamplingConfig(temperature=0, repetition_penalty=1.0),
                                 GenerationConfig(max_new_tokens=60, ignore_eos=True), spec, stats, frozenset(), None)
        plain = 0
        for _ in steps:
            s = states[0]
            drafted, plain = stats.plain_steps == plain, stats.plain_steps
            if not (drafted and s.partial.selected):
                continue
            start, part = selections[-1], s.partial
            filled = part.length - part.window_start
            assert filled == min(part.budget - part.window_start, s.full.length - start)
            assert s.partial_from == start + filled  # (where the window is full, the first slot it has not seen)
            assert torch.equal(part.k[:, :, part.window_start : part.length], s.full.k[:, :, start : start + filled])
            checked += 1
    assert checked >= 3 and len(selections) >= 2


def test_verified_nodes_count_every_node_of_every_verified_trie(monkeypatch):
    """stats.verified_nodes is the sum of the verified tries' sizes, the root included, and verify_steps the
    number of verify passes (the nodes a step pays for, which the reports divide by; an off-by-one per step
    changes no output, so only a count of the tries themselves can see it)."""
    import longswift.spec.tokenswift as ts
    from longswift.spec.tokenswift import tokenswift_steps

    sizes = []
    real = ts.verify
    monkeypatch.setattr(ts, "verify", lambda s, trie: sizes.append(len(trie)) or real(s, trie))
    engine = longswift.load(tiny_hf_model("llama", seed=61), dtype="float64", heads="random")
    spec = SpecConfig(tree="2,2", ngram_topk=2, max_nodes=0, adaptive=False).for_device("cpu")
    prompt = [7, 1, 1, 1, 9, 7, 2, 2, 2, 9, 7, 3, 3, 3, 9, 7] * 2
    stats = GenerationStats("tokenswift", len(prompt))
    greedy = SamplingConfig(temperature=0, repetition_penalty=1.0)
    with torch.inference_mode():
        for _ in tokenswift_steps(engine.model, engine.heads, prompt, greedy,
                                  GenerationConfig(max_new_tokens=40, ignore_eos=True), spec, stats, frozenset(), None):
            pass
    assert len(sizes) == stats.verify_steps >= 3
    assert sum(sizes) == stats.verified_nodes
    assert max(sizes) > 1


# ---- heads -----------------------------------------------------------------------------------

def test_heads_save_load_round_trip_and_identity(tmp_path):
    engine = longswift.load(tiny_hf_model("llama", seed=71), dtype="float32")
    heads = new_heads(engine.cfg, engine.model.state).randomize(seed=2)
    path = tmp_path / "heads.safetensors"
    save_heads(heads, engine.cfg, heads.base_fingerprint, path)
    loaded = load_heads(path, engine.cfg, engine.model.embed)
    h0 = torch.randn(5, engine.cfg.hidden_size)
    with torch.no_grad():
        assert torch.equal(heads(h0), loaded(h0))
    assert loaded(h0).shape == (3, 5, engine.cfg.hidden_size)
    # Same weights in another dtype are the same model.
    engine64 = longswift.load(tiny_hf_model("llama", seed=71), dtype="float64")
    load_heads(path, engine64.cfg, engine64.model.embed)
    # Another model of the same shape is refused.
    other = longswift.load(tiny_hf_model("llama", seed=72), dtype="float32")
    with pytest.raises(LongswiftError, match="made for another model"):
        load_heads(path, other.cfg, other.model.embed)
    bigger = longswift.load(tiny_hf_model("llama", seed=71, vocab=130), dtype="float32")
    with pytest.raises(LongswiftError, match="vocab_size 128 vs 130"):
        load_heads(path, bigger.cfg, bigger.model.embed)


def test_the_default_tree_is_cut_to_the_depths_the_heads_draft():
    """Heads trained with --gamma 1 draft two depths: the default tree (1,1,1 on a CPU) is cut to them
    (it was refused, after eval-heads' accuracy pass, naming a --tree nobody gave); a tree given
    explicitly is still refused when it is deeper than the heads."""
    engine = longswift.load(tiny_hf_model("llama", seed=71), dtype="float64")
    engine.set_heads(new_heads(engine.cfg, engine.model.state, gamma=1).randomize(seed=3))
    prompt, gen = [5, 9, 17, 3, 5, 9, 17, 4] * 3, GenerationConfig(max_new_tokens=24, ignore_eos=True)
    greedy = SamplingConfig(temperature=0)
    want = engine.generate(prompt, method="ar", sampling=greedy, generation=gen).token_ids
    for mode in ("paper", "fused"):
        got = engine.generate(prompt, method="tokenswift", sampling=greedy, generation=gen,
                              spec=SpecConfig(draft_mode=mode, adaptive=False))
        assert got.token_ids == want and got.stats.draft_positions > 0, mode
    with pytest.raises(ConfigError, match="SpecConfig.tree='1,1,1' has 3 depths but the heads draft only 2") as info:
        engine.generate(prompt, method="tokenswift", sampling=greedy, generation=gen, spec=SpecConfig(tree="1,1,1"))
    assert info.value.cli_message.startswith("--tree 1,1,1 has 3 depths but the heads draft only 2: give at most")
    assert SpecConfig().for_device(torch.device("cuda"), depths=2).tree == "1,3"


def test_heads_fit_their_model_loaded_in_float16(tmp_path):
    """The fingerprint is taken from the embedding as stored, before the load's cast: float16 rounds
    some values across a bfloat16 rounding boundary, so the cast table's fingerprint differed and a
    float16 load silently dropped the shipped heads (found by review). Both loaders that cast (an HF
    directory, a transformers object) and a resumed checkpoint's check see one model."""
    hf = tiny_hf_model("llama", seed=71)
    hf.save_pretrained(tmp_path / "model")
    engine = longswift.load(hf, dtype="float32", heads="random")
    path = tmp_path / "heads.safetensors"
    save_heads(engine.heads, engine.cfg, engine.fingerprint, path)
    for source in (hf, str(tmp_path / "model")):
        half = longswift.load(source, dtype="float16", heads=str(path))
        assert half.model.embed.dtype == torch.float16 and half.heads is not None
        assert half.fingerprint == engine.fingerprint
        assert model_fingerprint(half.cfg, half.model.embed) != engine.fingerprint  # what the cast table gave
    stream = half.stream([5, 9, 17, 3], generation=GenerationConfig(max_new_tokens=4))
    next(iter(stream))
    resumed = half.resume(stream.checkpoint())  # the checkpoint's model check takes the same fingerprint
    assert len(resumed.result_so_far().token_ids) >= 1


def test_damaged_heads_files(tmp_path):
    engine = longswift.load(tiny_hf_model("llama", seed=73), dtype="float32")
    with pytest.raises(LongswiftError, match="does not exist"):
        engine.set_heads(str(tmp_path / "none.safetensors"))
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage")
    with pytest.raises(LongswiftError, match="cannot read heads file"):
        engine.set_heads(str(bad))
    from safetensors.torch import save_file

    plain = tmp_path / "plain.safetensors"
    save_file({"x": torch.zeros(2)}, str(plain))
    with pytest.raises(LongswiftError, match="not a longswift heads file"):
        engine.set_heads(str(plain))


def test_zero_initialised_heads_repeat_the_base_prediction():
    engine = longswift.load(tiny_hf_model("llama", seed=74), dtype="float32")
    heads = new_heads(engine.cfg, engine.model.state)
    h0 = torch.randn(4, engine.cfg.hidden_size)
    with torch.no_grad():
        out = heads(h0)
        base = engine.model.norm(h0, engine.model.final_norm)
    assert torch.allclose(out, base.expand_as(out), atol=1e-6)


def test_bfloat16_heads_norm_in_one_op_where_fused():
    """Draft heads in a reduced dtype: with fused_norm (the default on CUDA) each of a head's two
    norms is one call with the weight, 3 calls fewer per norm (3 kernels on CUDA), and its output
    moves by rounding only (draft numerics never touch losslessness: verification decides)."""
    needs_fused_rms_norm()
    engine = longswift.load(tiny_hf_model("llama", seed=75), dtype="bfloat16")
    heads = new_heads(engine.cfg, engine.model.state).randomize(3)
    assert heads.fused_norm is None  # on the CPU: the reference's rounding
    h0 = torch.randn(4, engine.cfg.hidden_size).to(torch.bfloat16)
    outs, calls = {}, {}
    for fused in (False, True):
        heads.fused_norm = fused
        with torch.no_grad(), Calls() as count:
            outs[fused] = heads(h0)
        calls[fused] = sum(count.names.values())
    assert calls[False] - calls[True] == 3 * 2 * heads.gamma
    assert not torch.equal(outs[True], outs[False])
    assert (ulps(outs[True], outs[False]) <= 2).all()  # rounding (1 unit here), compounded through the heads


def test_spec_defaults_per_device():
    from longswift.config import SpecConfig

    auto = SpecConfig()
    assert (auto.for_device(torch.device("cpu")).tree, auto.for_device(torch.device("cpu")).ngram_topk) == ("1,1,1", 1)
    assert (auto.for_device(torch.device("cuda")).tree, auto.for_device(torch.device("cuda")).ngram_topk) == ("1,3,3,3", 20)
    explicit = SpecConfig(tree="2,2", ngram_topk=0).for_device(torch.device("cuda"))
    assert (explicit.tree, explicit.ngram_topk) == ("2,2", 0)
    assert (auto.for_device(torch.device("cpu")).max_nodes, auto.for_device(torch.device("cuda")).max_nodes) == (0, 32)
    assert SpecConfig(max_nodes=5).for_device(torch.device("cuda")).max_nodes == 5
    for bad in (1, -1):
        with pytest.raises(LongswiftError, match="max_nodes must be 0"):
            SpecConfig(max_nodes=bad)
    with pytest.raises(ValueError, match="for_device"):
        auto.levels


def test_commit_keeps_the_root_and_the_accepted_path_in_the_cache_in_order():
    """The verify pass wrote the trie's node i at slot root + i; commit keeps the root's entry and the
    accepted nodes' (the keep list), moved up behind the root in path order, and drops the rest."""
    from types import SimpleNamespace

    from longswift.spec.tokenswift import Verified, commit
    from longswift.spec.verify import Walk

    layers, hkv, d = 2, 2, 4
    cache = FullKVCache(SimpleNamespace(num_layers=layers, num_kv_heads=hkv, head_dim=d), 32, torch.float32,
                        torch.device("cpu"))
    base, nodes = 10, 7  # the root's slot; a trie of 7 nodes verified at slots 10..16
    cache.length = base + nodes
    slots = torch.arange(32, dtype=torch.float32)[None, None, :, None]
    cache.k[:] = slots
    cache.v[:] = -slots
    trie = Trie.with_root(5)
    for path in ([6, 8], [7, 9, 10], [7, 9, 11]):  # nodes 1: 6, 2: 8, 3: 7, 4: 9, 5: 10, 6: 11
        trie.add_path(path, HEADS)
    assert len(trie) == nodes and trie.tokens == [5, 6, 8, 7, 9, 10, 11]
    walk = Walk(nodes=[3, 4, 6], tokens=[7, 9, 11], next_root=3, ngram=(False, True, False))
    hidden = torch.arange(nodes, dtype=torch.float32)[:, None].expand(nodes, 3)
    emitted = []
    s = SimpleNamespace(n=base + 1, full=cache, prev_hidden=None, stats=GenerationStats("tokenswift", base),
                        emit=emitted.extend)
    assert commit(s, trie, Verified(None, hidden, {}), walk) == [7, 9, 11, 3] == emitted
    assert cache.length == base + 4
    kept = [base, base + 3, base + 4, base + 6]
    assert cache.k[:, :, base : base + 4].eq(torch.tensor(kept, dtype=torch.float32)[None, None, :, None]).all()
    assert cache.v[:, :, base : base + 4].eq(-torch.tensor(kept, dtype=torch.float32)[None, None, :, None]).all()
    assert cache.k[:, :, :base].eq(slots[:, :, :base]).all()  # the context before the root is untouched
    assert torch.equal(s.prev_hidden, hidden[6])  # the last accepted node's state predicted the new root
    assert (s.stats.accepted_tokens, s.stats.ngram_accepted, s.stats.draft_positions) == (3, 1, 3)


def test_heads_are_sequential_residual_blocks_read_out_through_their_own_norms():
    """Each head is h_i = h_{i-1} + W_i RMSNorm_i(h_{i-1}), read out as RMSNorm'_i(h_i) (arXiv 2502.18890),
    computed by hand here in float64 with every norm and weight random: a head normalising h_0 instead of
    the previous head's state drafted (and trained) another architecture, which no output would show."""
    hidden, gamma, eps = 16, 3, 1e-5
    heads = DraftHeads(hidden, gamma, eps, dtype=torch.float64).randomize(seed=4, scale=3.0)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        heads.in_norms.copy_(1 + 0.3 * torch.randn(gamma, hidden, generator=g, dtype=torch.float64))
        heads.out_norms.copy_(1 + 0.3 * torch.randn(gamma, hidden, generator=g, dtype=torch.float64))
        h0 = torch.randn(4, hidden, generator=g, dtype=torch.float64)

        def norm(x, w):
            return w * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)

        h, want = h0, []
        for i in range(gamma):
            h = h + norm(h, heads.in_norms[i]) @ heads.weights[i].T
            want.append(norm(h, heads.out_norms[i]))
        assert torch.allclose(heads(h0), torch.stack(want), rtol=1e-12, atol=1e-12)


def test_loaded_heads_keep_the_epsilon_their_file_names(tmp_path):
    """A heads file records its norms' epsilon; loading it keeps that one, not the base model's (the two
    differ when heads were made with another eps), so the loaded heads compute what the saved ones did."""
    engine = longswift.load(tiny_hf_model("llama", seed=71), dtype="float32")
    heads = new_heads(engine.cfg, engine.model.state).randomize(seed=2)
    heads.eps = 1e-2  # the model's is 1e-6
    path = tmp_path / "heads.safetensors"
    save_heads(heads, engine.cfg, heads.base_fingerprint, path)
    loaded = load_heads(path, engine.cfg, engine.model.embed)
    h0 = 0.01 * torch.randn(5, engine.cfg.hidden_size)  # small states, where eps weighs
    with torch.no_grad():
        assert loaded.eps == 1e-2 and torch.equal(loaded(h0), heads(h0))


@pytest.mark.parametrize("position", [20, 40])  # below and past the trained context (32: dynamic NTK scales)
def test_the_paper_drafts_first_depth_is_the_base_models_own_next_token_logits(position, monkeypatch):
    """In paper mode the draft pass forwards the root at its position (n - 1) and its first depth is the base
    model's own next-token logits there (the final norm, then the LM head): exactly the logits an AR decode
    step of the root computes. The root forwarded one position on, or read out without the final norm,
    still verified to AR's tokens, but drafted worse."""
    import longswift.spec.tokenswift as ts

    engine = longswift.load(tiny_hf_model("llama", "dynamic", seed=61, max_position_embeddings=32),
                            dtype="float64", heads="random")
    prompt = torch.randint(0, 128, (position,), generator=torch.Generator().manual_seed(3)).tolist()
    spec = SpecConfig(tree="2,2", ngram_topk=0, adaptive=False).for_device("cpu")
    with torch.inference_mode():
        s = TokenSwiftState(engine.model, engine.heads, prompt, [], SamplingConfig(temperature=0, repetition_penalty=1.0),
                            GenerationConfig(max_new_tokens=8, ignore_eos=True), spec,
                            GenerationStats("tokenswift", len(prompt)), frozenset(), None)
        s.model.prefill(s.history[: s.n - 1], s.full, 16)
        seen = []
        real = ts.transform
        monkeypatch.setattr(ts, "transform", lambda x, w, cfg: seen.append(x) or real(x, w, cfg))
        draft(s)
        assert s.full.length == s.n - 1  # the draft's entry is dropped
        ar, _ = s.model.forward(torch.tensor([prompt[-1]]), torch.tensor([s.n - 1]), s.full)
    (depth_logits,) = seen
    assert depth_logits.shape[0] == 2 and torch.allclose(depth_logits[0], ar[0], rtol=0, atol=1e-12)


def test_a_lookup_step_that_finds_no_continuation_runs_and_counts_as_a_plain_step(monkeypatch):
    """A lookup step whose root continues no n-gram has a trie of the root alone: it runs as a plain step
    (AR's code, no verify pass), is counted as one, and is timed through record_empty_lookup: as a plain step, and
    as a lookup step while lookups lead (tests/test_schedule.py: a leader whose lookups stop finding n-grams)."""
    import longswift.spec.tokenswift as ts
    from longswift.spec import schedule
    from longswift.spec.tokenswift import tokenswift_steps

    monkeypatch.setattr(schedule.StepSchedule, "choose", lambda self: self._run(schedule.LOOKUP))
    recorded, verified = [], []
    record, empty = schedule.StepSchedule.record, schedule.StepSchedule.record_empty_lookup
    monkeypatch.setattr(schedule.StepSchedule, "record",
                        lambda self, kind, tokens, seconds: recorded.append(kind) or record(self, kind, tokens, seconds))
    monkeypatch.setattr(schedule.StepSchedule, "record_empty_lookup",
                        lambda self, seconds: recorded.append("empty lookup") or empty(self, seconds))
    real = ts.verify
    monkeypatch.setattr(ts, "verify", lambda s, trie: verified.append(len(trie)) or real(s, trie))
    engine = longswift.load(tiny_hf_model("llama", seed=61), dtype="float64", heads="random")
    prompt = list(range(3, 23))  # no token repeats: no n-gram continues any root at first
    stats = GenerationStats("tokenswift", len(prompt))
    with torch.inference_mode():
        for _ in tokenswift_steps(engine.model, engine.heads, prompt, SamplingConfig(temperature=0, repetition_penalty=1.0),
                                  GenerationConfig(max_new_tokens=12, ignore_eos=True),
                                  SpecConfig(tree="1,1", ngram_topk=0).for_device("cpu"), stats, frozenset(), None):
            pass
    assert stats.new_tokens == 12 and stats.plain_steps == 11 and stats.lookup_steps == 0 and stats.verify_steps == 0
    assert verified == [] and recorded == ["empty lookup", schedule.PLAIN] * 11
