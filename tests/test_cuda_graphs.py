"""The CUDA step bodies (runtime.cuda_graphs: fixed shapes per bucket and node budget, slot and
tree mask read from device buffers, verify passes padded) run eagerly on CPU, with both ways of
attending (--graph-attention bucketed / length): decode and padded tree forwards equal the model's
own forward across bucket and span boundaries in float64; unwritten slots are never read; the
generation loops through them stay AR's output; --cuda-graphs resolves as documented."""

from __future__ import annotations

import dataclasses
from functools import partial

import pytest
import torch
from conftest import tiny_hf_model

import longswift
from longswift import GenerationConfig, SamplingConfig, SpecConfig
from longswift.config import RuntimeConfig
from longswift.errors import LongswiftError
from longswift.runtime.cache import FullKVCache
from longswift.runtime.cuda_graphs import StepGraphs, graphs_supported, padded_nodes, span_for, use_graphs
from longswift.spec.tokenswift import draft_logits

CPU = torch.device("cpu")
ATTENTIONS = ["bucketed", "length"]


def engine64(family: str = "llama", seed: int = 4, graph_attention: str = "bucketed", **kwargs):
    return longswift.load(tiny_hf_model(family, "default", seed=seed, **kwargs), device="cpu", dtype="float64",
                          heads="random", graph_attention=graph_attention)


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_decode_body_equals_the_eager_decode_across_buckets(family, attention):
    engine = engine64(family)
    model, cfg = engine.model, engine.cfg
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, 128, (13,), generator=g)
    steps = torch.randint(0, 128, (30,), generator=g)
    eager, bodies = FullKVCache(cfg, 64, torch.float64, CPU), FullKVCache(cfg, 64, torch.float64, CPU)
    model.prefill(prompt, eager, chunk=8)
    model.prefill(prompt, bodies, chunk=8)
    body = StepGraphs(model, bodies, capture=False, bucket=8, attention=attention)  # 13..43: five bucket
    # boundaries, or the spans 16, 32 and 64
    for i, token in enumerate(steps.tolist()):
        want, want_hidden = model.forward(torch.tensor([token]), torch.tensor([13 + i]), eager)
        got, got_hidden = body.decode(token, 13 + i)
        torch.testing.assert_close(got, want[0], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(got_hidden, want_hidden[0], rtol=1e-10, atol=1e-10)
    assert bodies.length == eager.length == 43
    torch.testing.assert_close(bodies.k[:, :, :43], eager.k[:, :, :43], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_draft_body_equals_the_eager_draft_pass(attention):
    """The draft step body runs the heads and the LM head with the forward (one graph on CUDA): its
    depth logits are the eager forward's root state through draft_logits, across bucket boundaries."""
    engine = engine64()
    model, cfg, heads = engine.model, engine.cfg, engine.heads
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, 128, (13,), generator=g)
    steps = torch.randint(0, 128, (20,), generator=g).tolist()
    eager, bodies = FullKVCache(cfg, 64, torch.float64, CPU), FullKVCache(cfg, 64, torch.float64, CPU)
    model.prefill(prompt, eager, chunk=8)
    model.prefill(prompt, bodies, chunk=8)
    depths = heads.gamma + 1  # the base model's next token, then each head's
    body = StepGraphs(model, bodies, capture=False, bucket=8, attention=attention,
                      draft=partial(draft_logits, model, heads, depths))
    for i, token in enumerate(steps):
        where = (torch.tensor([token]), torch.tensor([13 + i]))
        got, got_hidden = body.draft(token, 13 + i)
        bodies.truncate(13 + i)  # a draft pass leaves nothing in the cache (tokenswift.draft truncates)
        _, h = model.forward(*where, eager, logits_rows=slice(0, 0))
        eager.truncate(13 + i)
        assert got.shape == (depths, cfg.vocab_size)
        torch.testing.assert_close(got, draft_logits(model, heads, depths, h), rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(got_hidden, h[0], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(got[0], model.logits(h)[0], rtol=1e-10, atol=1e-10)  # depth 1 is the model's own
        body.decode(token, 13 + i)  # then the root is committed: the next step drafts one slot further
        model.forward(*where, eager)


def test_the_draft_pass_runs_its_heads_inside_the_step_body(monkeypatch):
    """Where the loop runs step bodies (CUDA), a paper-mode draft pass computes the heads and the LM
    head inside the body that a graph captures, not as 52 eager ops after it; fused mode has no
    draft forward, so its heads run eagerly on the verify pass's state."""
    import longswift.generate as generate_mod
    import longswift.spec.tokenswift as ts

    monkeypatch.setattr(generate_mod, "step_bodies", lambda model: True)
    monkeypatch.setattr(ts, "step_bodies", lambda model: True)
    engine = engine64()
    depth, inside = [0], []
    body, heads_forward = StepGraphs.body, type(engine.heads).forward

    def spy_body(self, *args):
        depth[0] += 1
        try:
            return body(self, *args)
        finally:
            depth[0] -= 1

    def spy_heads(self, h):
        inside.append(depth[0] > 0)
        return heads_forward(self, h)

    monkeypatch.setattr(StepGraphs, "body", spy_body)
    monkeypatch.setattr(type(engine.heads), "forward", spy_heads)
    for mode, where in (("paper", True), ("fused", False)):
        inside.clear()
        engine.generate([5, 9, 17, 33, 5, 9], method="tokenswift", sampling=SamplingConfig(temperature=0),
                        spec=SpecConfig(tree="1,3,3,3", ngram_topk=2, draft_mode=mode, adaptive=False),
                        generation=GenerationConfig(max_new_tokens=16, ignore_eos=True))
        assert inside and all(x == where for x in inside), (mode, inside)


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("start", [5, 7, 8, 15, 16, 22])
def test_padded_tree_forward_equals_the_eager_tree_forward(start, attention):
    """A 6-node trie padded to its node budget (8), at cache lengths on both sides of bucket edges."""
    engine = engine64()
    model, cfg = engine.model, engine.cfg
    parents = [-1, 0, 0, 1, 1, 3]
    mask = torch.eye(6, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            mask[i] |= mask[p]
    tokens = [7, 3, 9, 11, 4, 20]
    positions = torch.tensor([0, 1, 1, 2, 2, 3]) + start
    prompt = torch.arange(start) % 100 + 3
    eager, bodies = FullKVCache(cfg, 64, torch.float64, CPU), FullKVCache(cfg, 64, torch.float64, CPU)
    model.prefill(prompt, eager, chunk=4)
    model.prefill(prompt, bodies, chunk=4)
    bodies.k[:, :, start:] = 1e3  # stale entries past the end must not matter
    _, want = model.forward(torch.tensor(tokens), positions, eager, tree_mask=mask)
    body = StepGraphs(model, bodies, capture=False, bucket=8, attention=attention)
    logits, got = body.forward(tokens, positions, mask, logits=True)
    assert padded_nodes(6) == 8 and got.shape[0] == 8 and logits.shape[0] == 8
    torch.testing.assert_close(got[:6], want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(logits[:6], model.logits(want), rtol=1e-10, atol=1e-10)
    assert bodies.length == eager.length == start + 6


def test_a_step_on_a_spans_last_slot_takes_the_span_of_the_steps_after_it():
    """--graph-attention length: the first step after a prompt as long as a span (2,048 tokens) starts on
    that span's last slot. It takes the next span, as the steps after it do, rather than a graph of its
    own for that one step (docs/scripts/graph_keys.py 128 paper: TokenSwift's captures 5 -> 4)."""
    engine = engine64()
    model, cfg = engine.model, engine.cfg
    cache = FullKVCache(cfg, 64, torch.float64, CPU)
    model.prefill(torch.arange(16) % 100 + 3, cache, chunk=4)  # slots 0..15: the span of 16 is full
    graphs = StepGraphs(model, cache, capture=False, bucket=8, attention="length")
    keys = []
    body = graphs.body
    graphs.body = lambda *key: keys.append(key) or body(*key)
    mask = torch.ones(3, 3, dtype=torch.bool).tril()
    graphs.forward([7, 3, 9], torch.arange(16, 19), mask, logits=False)  # a verify pass from slot 16
    graphs.forward([4, 5, 6], torch.arange(19, 22), mask, logits=False)
    graphs.decode(8, 22)
    assert keys == [(32, 8, "hidden"), (32, 8, "hidden"), (32, 1, "logits")]


def test_a_trie_is_padded_by_less_than_twice_its_nodes():
    """Padded rows cost compute at long contexts, so budgets double (the GPU tries: 41 heads-only,
    121 with n-grams, up to 280 in fused mode)."""
    assert [padded_nodes(n) for n in (1, 6, 41, 121, 146, 280)] == [1, 8, 64, 128, 256, 512]
    assert all(padded_nodes(n) < 2 * n for n in range(9, 5000))
    # past the last budget they go on doubling: left unpadded, each trie size had a graph of its own
    assert [padded_nodes(n) for n in (513, 600, 1024, 1025, 4096)] == [1024, 1024, 1024, 2048, 4096]


def test_tries_past_the_last_budget_share_a_graph(monkeypatch):
    """Tries of 513 to 600 nodes (--lookup-nodes or --max-nodes past 512) each had a graph, a warm-up and buffers
    of their own, within one span (on the fake device: no GPU here)."""
    from fake_cuda import fake_cuda, fake_state

    from longswift.bench.shapes import shape_config
    from longswift.runtime.model import Transformer

    with fake_cuda(monkeypatch):
        cfg = shape_config("smollm2-135m", 1)
        model = Transformer(cfg, fake_state(cfg.state_shapes(), torch.bfloat16), pack=True)
        cache = FullKVCache(cfg, 4096, torch.bfloat16, model.device)
        graphs = StepGraphs(model, cache, capture=True, attention="bucketed")
        for n in (40, 60, 513, 540, 600):  # one slot and bucket: only the trie's size changes
            cache.length = 3000
            graphs.forward(list(range(n)), torch.arange(3000, 3000 + n), torch.ones(n, n, dtype=torch.bool).tril(),
                           logits=True)
        assert graphs.captures == 2 and len(graphs.graphs) == 2 and len(graphs.buffers) == 2


def test_stats_count_each_capture_once_and_keep_a_resumed_runs_earlier_counts():
    from longswift.stats import GenerationStats

    engine = engine64()
    graphs = StepGraphs(engine.model, FullKVCache(engine.cfg, 64, torch.float64, CPU), capture=False)
    stats = GenerationStats("ar", 3, graph_captures=2, graph_capture_seconds=1.0)  # as restored from a checkpoint
    stats.add_captures([graphs])
    assert (stats.graph_captures, stats.graph_capture_seconds) == (2, 1.0)  # the CPU captures nothing
    graphs.captures, graphs.capture_seconds = 3, 0.5  # as three captures would leave it
    stats.add_captures([graphs])
    stats.add_captures([graphs])  # nothing new since
    assert (stats.graph_captures, stats.graph_capture_seconds) == (5, 1.5)


def test_a_length_span_doubles_from_one_bucket_to_the_capacity():
    """--graph-attention length captures a graph per span (and node budget): five for 100K tokens
    after a 4K prompt, where the buckets take about a hundred."""
    assert [span_for(s, 1024, 200_000) for s in (0, 1, 1024, 1025, 3000, 5000, 100_000)] == [
        1024, 1024, 1024, 2048, 4096, 8192, 131072]
    assert span_for(100_000, 1024, 104_448) == 104_448  # never past the cache
    assert span_for(3000, 1024, 4097) == 4096  # a partial cache (budget + 1 slots)
    assert span_for(4097, 1024, 4097) == 4097  # its last slot
    assert len({span_for(s + 1, 1024, 104_448) for s in range(4096, 104_096)}) == 5  # steps from slot 4096 on
    assert len({s - s % 1024 for s in range(4096, 104_096)}) == 98  # the buckets' keys over the same run
    with pytest.raises(LongswiftError, match="graph_attention must be one of bucketed, length"):
        engine = engine64()
        StepGraphs(engine.model, FullKVCache(engine.cfg, 8, torch.float64, CPU), capture=False, attention="paged")
    with pytest.raises(LongswiftError, match="graph.attention must be one of auto, bucketed, length; got 'paged'"):
        RuntimeConfig(graph_attention="paged")


def test_length_attention_is_refused_where_torch_lacks_seqused_k(monkeypatch):
    """The GPU machine has had an older torch than this one: a flash kernel without `seqused_k`
    cannot read the cached length from device memory, and the error says what to use instead."""
    import longswift.runtime.attention as attention

    if torch.__version__.startswith("2.13."):  # the pinned build has it; a GPU machine's older torch may not
        assert "seqused_k" in attention.varlen_features()
    monkeypatch.setattr(attention, "varlen_features", lambda: frozenset({"seqused_k"}))
    assert attention.length_unsupported(torch.device("cuda")) is None
    monkeypatch.setattr(attention, "varlen_features", lambda: frozenset())
    assert attention.length_unsupported(CPU) is None  # the CPU runs the masked explicit form
    why = attention.length_unsupported(torch.device("cuda"))
    assert why is not None and "lacks" in why and "use --graph-attention bucketed" in why


@pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")
@pytest.mark.parametrize("triton", [False, True])
def test_length_attention_runs_with_the_triton_attention_where_flash_lacks_seqused_k(monkeypatch, triton):
    """--triton-kernels' attention reads the cached length from device memory itself, so a torch whose flash
    kernel lacks seqused_k runs --graph-attention length with it (on the fake device: no GPU here), and
    refuses length without it."""
    pytest.importorskip("triton")
    import longswift.runtime.attention as attention
    from fake_cuda import fake_cuda, fake_state

    from longswift.bench.shapes import shape_config
    from longswift.runtime.model import Transformer

    monkeypatch.setattr(attention, "varlen_features", lambda: frozenset())
    with fake_cuda(monkeypatch):
        cfg = shape_config("smollm2-135m", 2)
        model = Transformer(cfg, fake_state(cfg.state_shapes(), torch.bfloat16), triton_kernels=triton)
        cache = FullKVCache(cfg, 64, torch.bfloat16, model.device)
        if triton:
            graphs = StepGraphs(model, cache, capture=False, attention="length")
            assert graphs.triton_attention and graphs.attention == "length"
        else:
            with pytest.raises(LongswiftError, match="lacks: use --graph-attention bucketed, or --triton-kernels"):
                StepGraphs(model, cache, capture=False, attention="length")


def test_auto_graph_attention_is_length_where_torch_can_and_bucketed_elsewhere(monkeypatch):
    """--graph-attention auto (the default): length on CUDA with a flash kernel that takes seqused_k
    (measured faster on an H100: docs/benchmarks.md), bucketed without it and on the CPU (where no step
    bodies run, so a CPU bench's results directory keeps its identity)."""
    import longswift.runtime.attention as attention
    from longswift.runtime.cuda_graphs import resolve_attention

    assert RuntimeConfig().graph_attention == "auto"
    monkeypatch.setattr(attention, "varlen_features", lambda: frozenset({"seqused_k"}))
    assert resolve_attention("auto", torch.device("cuda")) == "length"
    assert resolve_attention("auto", CPU) == "bucketed"
    assert resolve_attention("bucketed", torch.device("cuda")) == "bucketed"
    monkeypatch.setattr(attention, "varlen_features", lambda: frozenset())
    assert resolve_attention("auto", torch.device("cuda")) == "bucketed"
    assert resolve_attention("length", CPU) == "length"  # an explicit choice stays (StepGraphs checks it)


def test_a_single_token_attends_by_length_in_one_call(monkeypatch):
    """--graph-attention length: a decoding token's key is in the cache before it attends, so its
    attention is one variable-length call over the slots up to its own, output only (no masked part
    over the new entries, no merge, no log-sum-exp to fix); a tree step of several tokens merges both."""
    import longswift.runtime.cuda_graphs as cg

    calls = {"by_length": 0, "prefix": 0}
    by_length, prefix = cg.by_length, cg.prefix_attention

    def count(name, fn):
        def counted(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return counted

    monkeypatch.setattr(cg, "by_length", count("by_length", by_length))
    monkeypatch.setattr(cg, "prefix_attention", count("prefix", prefix))
    engine = engine64(graph_attention="length")
    cache = FullKVCache(engine.cfg, 64, torch.float64, CPU)
    engine.model.prefill(torch.arange(15), cache, chunk=8)
    body = StepGraphs(engine.model, cache, capture=False, bucket=8, attention="length")
    layers = engine.cfg.num_layers
    body.decode(3, 15)  # slot 15: its span (16) holds slots 0..15, its own included
    assert calls == {"by_length": 0, "prefix": layers}
    body.forward([4, 5], torch.tensor([16, 17]), torch.ones(2, 2, dtype=torch.bool).tril_(), logits=True)
    assert calls == {"by_length": layers, "prefix": layers}


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_decode_body_never_attends_to_unwritten_slots(attention):
    engine = engine64()
    model, cfg = engine.model, engine.cfg
    clean, dirty = FullKVCache(cfg, 32, torch.float64, CPU), FullKVCache(cfg, 32, torch.float64, CPU)
    for cache in (clean, dirty):
        model.prefill(torch.arange(10), cache, chunk=4)
    dirty.k[:, :, 11:] = 1e4
    dirty.v[:, :, 11:] = -1e4
    a, _ = StepGraphs(model, clean, capture=False, bucket=16, attention=attention).decode(3, 10)
    b, _ = StepGraphs(model, dirty, capture=False, bucket=16, attention=attention).decode(3, 10)
    torch.testing.assert_close(a, b, rtol=0, atol=0)


DRAWS = [SamplingConfig(temperature=0, repetition_penalty=1.3, penalty_window=6, banned_ids=(7, 11)),
         SamplingConfig(temperature=0.8, top_k=40, top_p=0.9, repetition_penalty=1.15, penalty_window=9),
         SamplingConfig(temperature=1.1, min_p=0.05, eta=0.002, repetition_penalty=1.0, banned_ids=(3,))]


@pytest.mark.parametrize("sampling", DRAWS, ids=["greedy-penalty-ban", "top-k-top-p-penalty", "min-p-eta-ban"])
@pytest.mark.parametrize("attention", ATTENTIONS)
def test_a_draw_inside_the_decode_body_is_the_draw_between_bodies(sampling, attention):
    """Token blocks through StepGraphs.sample_decode (the draw, its penalty window gathered on the
    device and its history write inside the decode body that a graph captures) give the tokens,
    logits, hidden states, history and generator state of the eager draws between decode bodies,
    across bucket (span) boundaries, in blocks that end with and without a forward."""
    from longswift.runtime.blocks import sample_block

    engine = engine64(seed=6)
    model, cfg = engine.model, engine.cfg
    prompt = torch.tensor([5, 9, 17, 3, 5, 9, 17, 4, 5, 9, 17])
    results = []
    for in_body in (True, False):
        cache = FullKVCache(cfg, 64, torch.float64, CPU)
        logits, _ = model.prefill(prompt, cache, chunk=8)
        history = torch.zeros(64, dtype=torch.long)
        history[:11] = prompt
        graphs = StepGraphs(model, cache, capture=False, bucket=8, attention=attention, sample_in_body=in_body)
        generator = torch.Generator().manual_seed(8)
        n, seen = 11, []
        for k, last in ((5, True), (7, True), (1, True), (9, False)):  # 11..33: bucket and span boundaries
            block = sample_block(model, cache, graphs, logits, history, n, k, sampling, generator, frozenset(),
                                 forward_last=last)
            seen.append((block.tokens, block.logits.clone(), None if block.hidden is None else block.hidden.clone()))
            n, logits = n + k, block.logits
        results.append((seen, history.clone(), generator.get_state(), cache.length))
    (fused, h1, g1, l1), (eager, h2, g2, l2) = results
    assert torch.equal(h1, h2) and torch.equal(g1, g2) and l1 == l2 == 32
    for (t1, x1, y1), (t2, x2, y2) in zip(fused, eager):
        assert t1 == t2
        assert torch.equal(x1, x2)
        assert (y1 is None and y2 is None) or torch.equal(y1, y2)


def test_binding_sampling_keeps_a_copy_of_the_settings_its_graphs_draw_with():
    """The SAMPLED graphs bake in the bound settings: a change the caller makes to its own config object
    afterwards must not pass for them (it would compare equal and keep the stale graphs); binding the changed
    config again takes it."""
    engine = engine64()
    model = engine.model
    history = torch.zeros(16, dtype=torch.long)
    graphs = StepGraphs(model, FullKVCache(engine.cfg, 16, torch.float64, CPU), capture=False)
    mine = SamplingConfig(seed=1, temperature=0.7)
    graphs.bind_sampling(history, mine)
    mine.temperature = 1.3
    assert graphs.sampling is not mine and graphs.sampling.temperature == 0.7
    graphs.bind_sampling(history, mine)
    assert graphs.sampling.temperature == 1.3


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=0, repetition_penalty=1.3, penalty_window=6),
                                      SamplingConfig(seed=3, min_p=0.05, repetition_penalty=1.0)],
                         ids=["greedy-penalty", "sampled"])
@pytest.mark.parametrize("attention", ATTENTIONS)
def test_loops_through_the_step_bodies_still_emit_ar_output(sampling, attention, monkeypatch):
    """Route the CPU loops through the CUDA step bodies (eagerly): AR and both TokenSwift modes,
    on the full and the partial draft cache, with a trie cut to a node budget, emit the plain CPU AR tokens,
    and draft what the CPU loop drafts (the same accepted tokens, steps and verified nodes). Tokens alone
    cannot show a draft pass gone wrong: the walk keeps them AR's whatever the drafts (a draft body returning its
    depths in the wrong order still emitted AR's tokens on the partial-cache spec, accepting 22 drafted tokens
    where the loop accepts 24)."""
    engine = engine64(seed=9, vocab=32, graph_attention=attention)
    prompt = [5, 9, 17, 3, 5, 9, 17, 4, 5, 9, 17, 3] * 3
    gen = GenerationConfig(max_new_tokens=40, ignore_eos=True)
    want = engine.generate(prompt, method="ar", sampling=sampling, generation=gen).token_ids

    def drafted(spec):
        stats = engine.generate(prompt, method="tokenswift", sampling=sampling, generation=gen, spec=spec).stats
        return stats.accepted_tokens, stats.steps, stats.verified_nodes

    import longswift.generate as generate_mod
    import longswift.spec.tokenswift as tokenswift_mod
    specs = [SpecConfig(tree="1,3,3,3", ngram_topk=4, adaptive=False),
             SpecConfig(tree="1,2,2", ngram_topk=2, draft_mode="fused", adaptive=False),
             SpecConfig(tree="2,2,2", ngram_topk=2, draft_kv_budget=30, draft_window=6, attention_sinks=4,
                        adaptive=False),
             # a node budget below the trie's (the GPU's default cuts to 32): padded to the budget's bodies
             SpecConfig(tree="1,3,3,3", ngram_topk=4, max_nodes=9, adaptive=False)]
    # The GPU's walk: every row's logits from the padded verify body, transformed and drawn at once.
    specs += [dataclasses.replace(spec, walk="batched") for spec in specs]
    eager = [drafted(spec) for spec in specs]  # the CPU loop's own forwards
    monkeypatch.setattr(generate_mod, "step_bodies", lambda model: True)
    monkeypatch.setattr(tokenswift_mod, "step_bodies", lambda model: True)
    assert engine.generate(prompt, method="ar", sampling=sampling, generation=gen).token_ids == want
    for spec, drafts in zip(specs, eager):
        got = engine.generate(prompt, method="tokenswift", sampling=sampling, generation=gen, spec=spec)
        assert got.token_ids == want, spec
        assert (got.stats.accepted_tokens, got.stats.steps, got.stats.verified_nodes) == drafts, spec


def test_cuda_graphs_setting_resolves_per_model():
    engine = longswift.load(tiny_hf_model("llama", "default", seed=1), device="cpu", dtype="float32")
    assert graphs_supported(engine.model) is not None  # a CPU model
    assert use_graphs("auto", engine.model) is False
    assert use_graphs("off", engine.model) is False
    with pytest.raises(LongswiftError, match=r"cuda_graphs='on' \(--cuda-graphs on\): CUDA graphs need a CUDA device"):
        use_graphs("on", engine.model)
    with pytest.raises(LongswiftError, match="cuda.graphs must be auto, on or off"):
        RuntimeConfig(cuda_graphs="sometimes")


def test_cuda_graphs_on_without_cuda_is_refused_before_loading():
    with pytest.raises(LongswiftError, match="cuda_graphs.*needs a CUDA device"):
        longswift.load(tiny_hf_model("llama", "default", seed=1), device="cpu", dtype="float32", cuda_graphs="on")


def test_a_bucketed_body_past_the_first_bucket_has_a_warm_up_of_its_own():
    """The first bucket's body attends without a flash part (nothing before the bucket), so a later bucket's
    body, whose capture would launch flash for the first time, is warmed up on its own; by length a body is
    the same at every span, and one warm-up serves them all."""
    model = longswift.load(tiny_hf_model("llama", seed=3), dtype="float32").model
    cache = FullKVCache(model.cfg, 64, model.dtype, model.device)
    bucketed = StepGraphs(model, cache, capture=False, bucket=16, attention="bucketed")
    assert bucketed._warm_key((0, 1, "logits")) != bucketed._warm_key((16, 1, "logits"))
    assert bucketed._warm_key((16, 1, "logits")) == bucketed._warm_key((32, 1, "logits"))
    assert bucketed._warm_key((16, 1, "logits")) != bucketed._warm_key((16, 8, "logits"))
    by_length = StepGraphs(model, cache, capture=False, bucket=16, attention="length")
    assert by_length._warm_key((16, 1, "logits")) == by_length._warm_key((32, 1, "logits"))


@pytest.mark.parametrize("attention", ["bucketed", "length"])
def test_padded_tree_rows_that_do_not_see_the_first_node(attention):
    """A row of the trie's mask that does not see node 0 (every real trie's rows do) still reads the mask."""
    e = engine64()
    model, cfg = e.model, e.cfg
    mask = torch.tensor([[1, 0, 0], [0, 1, 0], [0, 1, 1]], dtype=torch.bool)  # rows 1, 2 do not see node 0
    tokens, positions = [7, 3, 9], torch.tensor([10, 10, 11])
    eager, bodies = FullKVCache(cfg, 64, torch.float64, CPU), FullKVCache(cfg, 64, torch.float64, CPU)
    for c in (eager, bodies):
        model.prefill(torch.arange(10) + 3, c, chunk=4)
    _, want = model.forward(torch.tensor(tokens), positions, eager, tree_mask=mask)
    graphs = StepGraphs(model, bodies, capture=False, bucket=8, attention=attention)
    _, got = graphs.forward(tokens, positions, mask, False)
    torch.testing.assert_close(got[:3], want, rtol=1e-10, atol=1e-10)


def test_the_draw_penalizes_the_first_history_token():
    """The in-body draw's penalty window reaches the history's slot 0."""
    e = engine64()
    g = StepGraphs(e.model, FullKVCache(e.cfg, 16, torch.float64, CPU), capture=False)
    history = torch.zeros(16, dtype=torch.long)
    history[:3] = torch.tensor([7, 1, 2])
    g.bind_sampling(history, SamplingConfig(temperature=0, repetition_penalty=50.0, penalty_window=8))
    g.drawn_from = torch.zeros(e.cfg.vocab_size, dtype=torch.float64)
    g.drawn_from[7], g.drawn_from[3] = 10.0, 9.0  # 7, the history's first token, is penalized to 0.2
    tokens = torch.zeros(1, dtype=torch.long)
    g._draw(torch.tensor([3]), tokens)
    assert tokens.tolist() == [3] and history[3] == 3


def test_a_penalty_window_past_the_history_draws_as_one_of_the_historys_length():
    """A penalty window longer than the whole history (--penalty-window 10**12, meant as 'all the text') penalizes
    what a window of the history's length does: the in-body draw gathered a window of its full size (an index of
    10**12 entries, 8 TB: the allocator refused it at the first token), where the eager draw slices the history."""
    e = engine64()
    drawn = []
    for window in (16, 10**12):
        g = StepGraphs(e.model, FullKVCache(e.cfg, 16, torch.float64, CPU), capture=False)
        history = torch.zeros(16, dtype=torch.long)
        history[:3] = torch.tensor([7, 1, 2])
        g.bind_sampling(history, SamplingConfig(temperature=0, repetition_penalty=50.0, penalty_window=window))
        g.drawn_from = torch.zeros(e.cfg.vocab_size, dtype=torch.float64)
        g.drawn_from[7], g.drawn_from[3] = 10.0, 9.0  # 7, the history's first token, is penalized to 0.2
        tokens = torch.zeros(1, dtype=torch.long)
        g._draw(torch.tensor([3]), tokens)
        drawn.append((tokens.tolist(), history.tolist()))
    assert drawn[0] == drawn[1] and drawn[1][0] == [3]


def test_rebinding_drops_the_sampled_graphs_only():
    """New sampling settings drop the graphs that draw in the body (they hold the old ones), not the others."""
    e = engine64()
    g = StepGraphs(e.model, FullKVCache(e.cfg, 16, torch.float64, CPU), capture=False)
    history = torch.zeros(16, dtype=torch.long)
    g.bind_sampling(history, SamplingConfig(temperature=0.7))
    g.graphs = {(0, 1, "sampled"): None, (0, 1, "logits"): None}
    g.bind_sampling(history, SamplingConfig(temperature=1.3))
    assert list(g.graphs) == [(0, 1, "logits")]


def test_off_means_off_where_graphs_are_supported(monkeypatch):
    """--cuda-graphs off is off on a device that could capture."""
    import longswift.runtime.cuda_graphs as cuda_graphs

    monkeypatch.setattr(cuda_graphs, "graphs_supported", lambda model: None)
    assert cuda_graphs.use_graphs("off", None) is False and cuda_graphs.use_graphs("auto", None) is True
