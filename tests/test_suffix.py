"""The suffix index of lookup steps (spec/suffix.py) against a brute-force search, and its tries."""

from __future__ import annotations

import random

import pytest
import torch

from longswift import SamplingConfig, SpecConfig
from longswift.spec.suffix import COPY_PER_MATCH, SUFFIX_ORDERS, SuffixIndex


def brute_force(tokens: list[int], length: int, count: int, exclude: int, orders=SUFFIX_ORDERS) -> list[int]:
    """The latest earlier end e (e <= length - 2 - exclude) of the longest order's run equal to the
    text's last m tokens, and the periodic copy of what followed it, at most COPY_PER_MATCH tokens for
    each of the tokens that agree before both ends."""
    last = length - 1
    for m in sorted(orders, reverse=True):
        if length < m:
            continue
        run = tokens[length - m : length]
        ends = [e for e in range(m - 1, length - 1 - exclude) if tokens[e + 1 - m : e + 1] == run]
        if ends:
            e = max(ends)
            held = next((k for k in range(e + 1) if tokens[e - k] != tokens[last - k]), e + 1)
            return [tokens[e + 1 + j % (last - e)] for j in range(min(count, COPY_PER_MATCH * held))]
    return []


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("exclude", [0, 5])
def test_proposals_match_a_brute_force_search_as_the_text_grows(seed, exclude):
    r = random.Random(seed)
    alphabet = r.choice([2, 3, 5])  # small: runs of every order recur, with periods of every size
    tokens = [r.randrange(alphabet) for _ in range(160)]
    index = SuffixIndex(exclude)
    proposed = 0
    for length in range(1, len(tokens) + 1):
        if r.random() < 0.5:  # updated at irregular intervals, as the loop's steps of several tokens do
            continue
        index.update(tokens, length)
        count = r.choice([1, 3, 6, 20, 40])
        got = index.propose(tokens, length, count)
        assert got == brute_force(tokens, length, count, exclude)
        proposed += bool(got)
    assert proposed > 20


def test_a_copy_is_as_long_as_its_match_has_held_times_three():
    """A chance match of two tokens proposes six; a loop that has gone round is copied to the count."""
    tokens = [5, 1, 2, 7, 8, 9, 10, 11, 12, 13, 14, 6, 1, 2]  # "1 2" seen once before, after 5, now after 6
    index = SuffixIndex()
    index.update(tokens, len(tokens))
    assert index.propose(tokens, len(tokens), 20) == [7, 8, 9, 10, 11, 12]
    assert index.propose(tokens, len(tokens), 4) == [7, 8, 9, 10]
    loop = [3, 4, 5, 6, 7] * 4
    index = SuffixIndex()
    index.update(loop, len(loop))
    assert index.propose(loop, len(loop), 31) == (loop * 3)[:31]  # 15 tokens agree: 45 allowed
    grown = [20, 21, 22, 3, 4, 5, 6, 7, 8, 3, 4, 5, 6]  # "3 4 5 6" agree after 22 and after 8: four tokens
    index = SuffixIndex()
    index.update(grown, len(grown))
    assert index.propose(grown, len(grown), 31) == ([7, 8, 3, 4, 5, 6] * 2)[:12]


def test_a_copy_that_reaches_the_present_goes_on_with_the_period():
    tokens = [9, 1, 2, 3, 1, 2, 3, 1, 2, 3]
    index = SuffixIndex()
    index.update(tokens, len(tokens))
    assert index.propose(tokens, len(tokens), 7) == [1, 2, 3, 1, 2, 3, 1]  # "2 3 1 2 3" ends 3 tokens back
    assert index.propose(tokens, len(tokens), 0) == []
    lone = [4, 5, 6, 7]
    index = SuffixIndex()
    index.update(lone, len(lone))
    assert index.propose(lone, len(lone), 5) == []  # nothing recurs


def test_a_hash_collision_proposes_nothing_wrong(monkeypatch):
    """Runs are keyed by their hash; a key that another run shares is checked against the tokens."""
    index = SuffixIndex(orders=(2,))
    tokens = [1, 2, 8, 3, 4]
    index.update(tokens, len(tokens))
    index.latest[2][hash((3, 4))] = 1  # as if (1, 2), which ends at 1, hashed like (3, 4)
    assert index.propose(tokens, len(tokens), 3) == []


def test_orders_must_be_positive():
    with pytest.raises(ValueError):
        SuffixIndex(orders=(4, 0))
    with pytest.raises(ValueError):
        SuffixIndex(orders=())


def lookup_state(spec: SpecConfig, prompt: list[int], penalty: float = 1.0):
    from test_components import wiring_state

    sampling = SamplingConfig(temperature=0, repetition_penalty=penalty, penalty_window=7)
    with torch.inference_mode():
        return wiring_state(spec, prompt, sampling)


def test_a_lookup_trie_holds_the_copy_then_the_ngram_paths_that_fit():
    from longswift.spec.tokenswift import lookup_tree

    motif = [11, 12, 13, 14, 15]
    prompt = [3, 4] + motif * 4 + [11, 21, 22, 23, 30, 31, 11]  # the root 11; "31 11" was never seen before
    s = lookup_state(SpecConfig(tree="1,1", ngram_topk=2, max_nodes=0, lookup_nodes=9), prompt)
    assert s.lookup_budget == 9
    trie = lookup_tree(s)  # no suffix matches: the n-gram table's two continuations of 11
    assert len(trie) == 1 + 2 * 3 and sorted(trie.tokens[c] for c in trie.children[0].values()) == [12, 21]

    prompt = [3, 4] + motif * 4 + [20, 21] + motif[:3]  # ends "21 11 12 13": only its last 2 tokens were seen before
    s = lookup_state(SpecConfig(tree="1,1", ngram_topk=2, max_nodes=0, lookup_nodes=9), prompt)
    trie = lookup_tree(s)
    copy = [14, 15, 20, 21, 11, 12, 13, 14]  # the budget's 8 drafted nodes: what followed the last "11 12 13", period 7
    node = 0
    for t in copy:
        node = trie.children[node][t]
    assert len(trie) == s.lookup_budget  # n-gram paths of 13 that need new nodes no longer fit
    off = lookup_state(SpecConfig(tree="1,1", ngram_topk=2, max_nodes=0, suffix_lookup=False), prompt)
    assert off.suffixes is None and len(lookup_tree(off)) == 1 + 4  # 13's continuations: 14 15 11 and 14 15 20


@pytest.mark.parametrize("max_nodes", [0, 5])
def test_a_lookup_trie_ends_its_copies_before_a_banned_token(max_nodes):
    """The suffix index's copy and the n-gram paths proposed banned tokens (a chat template's '<|im_start|>', banned
    as README shows, is in every chat prompt), verify rows the walk always rejects. (The heads' candidates never
    were: their logits are -inf.) build_tree's n-gram paths are add_ngram_paths' too."""
    from test_components import wiring_state

    from longswift.spec.tokenswift import lookup_tree

    motif = [11, 12, 13, 14, 15]
    prompt = [3, 4] + motif * 4 + [20, 21] + motif[:3]  # the copy: 14 15 20 21 11 12 13 14; 13's n-grams 14 15 11/20
    sampling = SamplingConfig(temperature=0, repetition_penalty=1.0, banned_ids=(20,))
    with torch.inference_mode():
        s = wiring_state(SpecConfig(tree="1,1", ngram_topk=2, max_nodes=max_nodes, lookup_nodes=9), prompt, sampling)
    trie = lookup_tree(s)
    assert 20 not in trie.tokens and sorted(trie.tokens[1:]) == [11, 14, 15]  # 14 -> 15 -> 11: the path left


def test_a_pruned_lookup_trie_keeps_the_copy_first():
    from longswift.spec.tokenswift import lookup_tree

    motif = [11, 12, 13, 14, 15]
    prompt = [3, 4] + motif * 3 + [11, 19, 18, 17, 11, 16, 16, 16] + motif[:3]
    s = lookup_state(SpecConfig(tree="1,1", ngram_topk=3, max_nodes=5), prompt)
    assert s.pruning and s.lookup_budget == 5
    trie = lookup_tree(s)
    assert len(trie) == 5
    node = 0
    for t in (14, 15, 11, 19):  # what followed the last "12 13"; the n-gram paths share its first three nodes
        node = trie.children[node][t]


@pytest.mark.parametrize("penalty,excluded", [(1.2, 7), (1.0, 0)])
def test_the_index_leaves_out_the_penalty_window(penalty, excluded):
    prompt = torch.randint(0, 128, (30,), generator=torch.Generator().manual_seed(4)).tolist()
    s = lookup_state(SpecConfig(tree="1,1", ngram_topk=2), prompt, penalty)
    assert s.suffixes.exclude_recent == excluded
    assert s.suffixes.next_end == len(prompt) - 1 - excluded
    assert lookup_state(SpecConfig(tree="1,1", ngram_topk=0), prompt).suffixes is None  # n-gram reuse off: off too


def test_lookup_steps_have_a_node_budget_of_their_own():
    from longswift.errors import LongswiftError
    from longswift.spec.budget import lookup_budget, step_budget, tree_budget

    cpu = SpecConfig().for_device("cpu")
    assert (step_budget(cpu), lookup_budget(cpu), tree_budget(cpu)) == (7, 32, 32)  # 1,1,1 + one n-gram path
    gpu = SpecConfig().for_device("cuda")
    assert (step_budget(gpu), lookup_budget(gpu), tree_budget(gpu)) == (32, 32, 32)
    assert lookup_budget(SpecConfig(max_nodes=12).for_device("cpu")) == 12  # --max-nodes bounds every trie
    small = SpecConfig(lookup_nodes=5).for_device("cuda")
    assert (lookup_budget(small), tree_budget(small)) == (5, 32)
    off = SpecConfig(suffix_lookup=False).for_device("cpu")  # no copy: a lookup trie is a full step's size
    assert (lookup_budget(off), tree_budget(off)) == (7, 7)
    assert lookup_budget(SpecConfig(ngram_topk=0).for_device("cpu")) == 4
    with pytest.raises(LongswiftError, match=r"lookup_nodes must be 2 \(the root and one copied token\) to 4096; "
                                             r"got 1"):
        SpecConfig(lookup_nodes=1)


def test_a_loop_fills_the_default_lookup_budget_on_the_cpu():
    """The CPU's default spec: a lookup trie in a loop that has gone round is the 31-token copy."""
    from longswift.spec.tokenswift import lookup_tree

    loop = list(range(40, 53))  # 13 tokens
    s = lookup_state(SpecConfig(), [3] + loop * 4)
    assert s.lookup_budget == 32
    trie = lookup_tree(s)
    assert trie.tokens == [loop[-1]] + (loop * 3)[:31]  # a chain: the root, then the copy


def test_a_long_copy_gets_its_logits_in_one_pass_where_steps_emit_several_tokens():
    """A lookup trie past BATCHED_LOGITS_NODES: the verify pass computes its spine's (the copy's) rows at
    once while steps emit 1.5+ tokens on average, none where they emit one (the walk then computes each
    row it visits); the rows equal the LM head's one by one."""
    from longswift.spec.tokenswift import BATCHED_LOGITS_NODES, lookup_tree, verify

    loop = list(range(40, 53))
    s = lookup_state(SpecConfig(), [3] + loop * 4)
    trie = lookup_tree(s)
    trie.add_path([7, 8], 2)  # a branch off the spine
    assert len(trie) > BATCHED_LOGITS_NODES and trie.spine() == list(range(32))
    with torch.inference_mode():
        s.schedule.tokens_per_step = 2.0
        v = verify(s, trie)
        assert sorted(v.cached) == trie.spine()
        for i in (0, 17, 31):
            torch.testing.assert_close(v.cached[i], s.model.logits(v.hidden[i : i + 1])[0], rtol=1e-5, atol=1e-5)
        s.full.truncate(s.n - 1)
        s.schedule.tokens_per_step = 1.0
        assert verify(s, trie).cached == {}
