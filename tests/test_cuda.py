"""GPU checks (marker `cuda`; skipped without CUDA). Run on a GPU machine with nothing but the
project: `pip install -e ".[dev]" && python -m pytest -q -m cuda tests/test_cuda.py` (without a network,
the machine's own pytest and `PYTHONPATH=src` do: see docs/scripts/gpu_session.sh).

- CUDA-graph replay equals the eager body, and the eager CUDA decode, exactly, with both ways of
  attending (--graph-attention bucketed, and length: one graph per doubling span); so does the draft
  pass's graph, which captures the heads and the LM head with the forward; in bfloat16 the bodies'
  fused kernels stay as close to the float32 model as the eager forward does;
- the CUDA kernels (flash decode by buckets, the cascade for masked forwards, flash's variable-length
  kernel reading the cached length from device memory) equal explicit float32 attention to rounding,
  on a tiny model and on the Llama-3.1-8B shape with 2 layers;
- float32 tokens on CUDA equal float32 tokens on the CPU for AR and both TokenSwift modes;
- seeded sampled TokenSwift equals AR in float32 with the batched walk (the GPU default) and the row walk;
- a whole generation with --cuda-graphs on equals --cuda-graphs off, its tokens and what its drafts made of
  them (the walk keeps the tokens AR's whatever a draft graph replays), and its stats count the captures
  (also for a model on a second device, where there is one);
- AR reading tokens back in blocks (--read-every, auto 16 on CUDA) emits what reading each token does,
  and so does TokenSwift running its plain steps as such blocks;
- narrow full steps (a wide trie's chain and one n-gram path) keep float32 tokens AR's, graphs on == off;
- --float32-logits in bfloat16 gives the float32 product of the bf16 inputs, and graphs on == off with it;
- colocated q/k/v and gate/up weights (pack_weights on CUDA) give the separate weights' float32 tokens,
  and graphs on == off with them;
- a bfloat16 RMSNorm is one kernel (fused_norm), within one unit in the last place of transformers' order,
  o_proj/down_proj add the residual in their product (fused_residual) in fewer kernels, and rope
  fuses its sum (fused_rope); float32 keeps the CPU's ops;
- the Triton kernels (--triton-kernels: rope with the cache writes, SwiGLU) compute what the eager ops do to
  one unit in the last place; their bodies replay exactly, stay as close to float32 as the eager bfloat16
  forward, and a generation with them and graphs on equals graphs off; their draw (runtime.triton_sampling) draws
  torch's token for uniforms inside its CDF's intervals over a real vocabulary;
- the batched walk's device memory stays within the bytes per logit the memory plan counts;
- `bench --lockstep`'s generations, held at once with their graphs, generate what each does alone."""

from __future__ import annotations

import dataclasses
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_hf_model, ulps

import longswift
from longswift import GenerationConfig, SamplingConfig, SpecConfig
from longswift.bench.shapes import random_state, shape_config
from longswift.runtime.attention import (
    additive_mask,
    by_length,
    cascade,
    explicit_with_lse,
    key_span,
    length_unsupported,
    masked_with_lse,
    prefix_attention,
    prefix_with_lse,
)
from longswift.runtime.cache import FullKVCache
from longswift.runtime.cuda_graphs import StepGraphs
from longswift.runtime.model import Transformer, fused_rms_norm_available
from longswift.spec.schedule import FULL, HALF, LOOKUP, NARROW, PLAIN, StepSchedule
from longswift.spec.tokenswift import draft_logits

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CUDA = torch.device("cuda")
GREEDY = SamplingConfig(temperature=0, repetition_penalty=1.0)


def needs_length(attention: str = "length") -> None:
    """--graph-attention length needs a flash kernel that takes seqused_k (torch on the GPU machine
    may be older than the pinned one); where it is refused, its tests have nothing to run."""
    if attention == "length" and (why := length_unsupported(CUDA)) is not None:
        pytest.skip(why)


def assert_bf16_close(got: torch.Tensor, want: torch.Tensor, past_rounding: float = 1e-3) -> None:
    """A bf16 kernel's output against float32 attention of the same inputs: each element within bf16's
    rounding of it (2^-7 of its size) plus `past_rounding`. Random inputs spread attention over thousands of
    keys, so outputs are ~0.1 and an absolute 2e-2 let a dropped mask, new entries left out or one cached slot
    too few pass (0.002-0.02 off on the CPU's kernels, where the correct bf16 cascade is 1.5e-4 past rounding)."""
    excess = ((got.float() - want).abs() - 2**-7 * want.abs()).max().item()
    assert excess < past_rounding, excess


def random_trie(t: int, seed: int) -> torch.Tensor:
    """[T, T] bool: a random trie's visibility, each node seeing itself and its parent's ancestors."""
    new = torch.eye(t, dtype=torch.bool)
    parents = torch.Generator().manual_seed(seed)
    for i in range(1, t):
        new[i] |= new[int(torch.randint(0, i, (1,), generator=parents))]
    return new


def replay_and_body(model: Transformer, prompt: torch.Tensor, steps: list[int], bucket: int, capacity: int,
                    tree: int = 0, attention: str = "bucketed", mask: torch.Tensor | None = None):
    """Decode `steps` after `prompt` (then, if `tree`, one `tree`-node forward under `mask`, default causal)
    through captured graphs, through the same bodies run eagerly, and through the model's eager forward."""
    caches = [FullKVCache(model.cfg, capacity, model.dtype, CUDA) for _ in range(3)]
    for c in caches:
        model.prefill(prompt.to(CUDA), c, chunk=64)
    graph = StepGraphs(model, caches[0], capture=True, bucket=bucket, attention=attention)
    body = StepGraphs(model, caches[1], capture=False, bucket=bucket, attention=attention)
    out: tuple[list, list, list] = ([], [], [])
    n = len(prompt)
    for i, token in enumerate(steps):
        out[0].append(graph.decode(token, n + i)[0].clone())
        out[1].append(body.decode(token, n + i)[0].clone())
        logits, _ = model.forward(torch.tensor([token], device=CUDA), torch.tensor([n + i], device=CUDA), caches[2])
        out[2].append(logits[0])
    if tree:
        mask = torch.ones(tree, tree, dtype=torch.bool).tril_() if mask is None else mask
        tokens, positions = list(range(3, 3 + tree)), torch.arange(tree) + n + len(steps)
        out[0].append(graph.forward(tokens, positions, mask, logits=True)[0][:tree].clone())
        out[1].append(body.forward(tokens, positions, mask, logits=True)[0][:tree].clone())
        out[2].append(model.forward(torch.tensor(tokens, device=CUDA), positions.to(CUDA), caches[2],
                                    tree_mask=mask)[0])
    return out, graph


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graph_replay_equals_the_eager_body_on_a_tiny_model(dtype):
    engine = longswift.load(tiny_hf_model("llama", "default", seed=3), device="cuda",
                            dtype=str(dtype).removeprefix("torch."))
    prompt = torch.randint(0, 128, (37,), generator=torch.Generator().manual_seed(0))
    steps = torch.randint(0, 128, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    (replay, body, eager), graph = replay_and_body(engine.model, prompt, steps, bucket=16, capacity=160, tree=6)
    assert graph.captures >= 4  # 37..77 crosses bucket boundaries, and the tree is a graph of its own
    assert len(graph.warmed) == 2  # one warm-up per body (decode, tree): later buckets capture without one
    for a, b, c in zip(replay, body, eager):
        assert torch.equal(a, b)
        if dtype == torch.float32:  # the eager forward splits attention elsewhere: equal up to rounding
            torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_length_graphs_replay_equals_their_eager_body_and_capture_once_per_span(dtype):
    needs_length()
    engine = longswift.load(tiny_hf_model("llama", "default", seed=3), device="cuda",
                            dtype=str(dtype).removeprefix("torch."))
    prompt = torch.randint(0, 128, (37,), generator=torch.Generator().manual_seed(0))
    steps = torch.randint(0, 128, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    (replay, body, eager), graph = replay_and_body(engine.model, prompt, steps, bucket=16, capacity=160, tree=6,
                                                   attention="length")
    assert graph.captures == 3  # decoding at slots 37..63 (span 64: its own slot included) and 64..76 (span
    # 128); the tree at span 128
    assert len(graph.warmed) == 2  # decoding's second span was captured without a warm-up, and replays the same
    for a, b, c in zip(replay, body, eager):
        assert torch.equal(a, b)
        if dtype == torch.float32:  # the eager forward splits attention elsewhere: equal up to rounding
            torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("attention", ["bucketed", "length"])
def test_bfloat16_bodies_are_as_close_to_float32_as_the_eager_forward(attention):
    """In bfloat16 the step bodies run the fused kernels that float32 leaves to explicit attention (flash
    by bucket or by length, the memory-efficient masked kernel), so the float32 checks above do not reach
    those branches inside a body: their logits must be about as close to the float32 model's as the eager
    bfloat16 forward's are (a visibility or span slip in a fused branch would be far off, not rounding)."""
    needs_length(attention)
    hf = tiny_hf_model("llama", "default", seed=3)
    prompt = torch.randint(0, 128, (37,), generator=torch.Generator().manual_seed(0))
    steps = torch.randint(0, 128, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    outs = {}
    for dtype in ("float32", "bfloat16"):
        model = longswift.load(hf, device="cuda", dtype=dtype).model
        outs[dtype] = replay_and_body(model, prompt, steps, bucket=16, capacity=160, tree=6, attention=attention,
                                      mask=random_trie(6, 1))[0]  # (a trie, not a chain: a mask slip shows)
    reference = outs["float32"][2]  # the float32 model's eager forward
    replay, body, eager = outs["bfloat16"]

    def error(rows: list[torch.Tensor]) -> float:
        return max((x.float() - r).abs().max().item() for x, r in zip(rows, reference))

    assert error(body) == error(replay) <= 4 * error(eager) + 1e-3


@pytest.mark.parametrize("attention", ["bucketed", "length"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_draft_graph_replay_equals_its_eager_body(dtype, attention):
    """The draft pass replays the forward, the heads and the LM head as one graph per bucket (span)."""
    needs_length(attention)
    engine = longswift.load(tiny_hf_model("llama", "default", seed=3), device="cuda",
                            dtype=str(dtype).removeprefix("torch."), heads="random")
    model, heads = engine.model, engine.heads
    out = partial(draft_logits, model, heads, heads.gamma + 1)
    prompt = torch.randint(0, 128, (37,), generator=torch.Generator().manual_seed(0)).to(CUDA)
    steps = torch.randint(0, 128, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    caches = [FullKVCache(model.cfg, 160, model.dtype, CUDA) for _ in range(2)]
    for c in caches:
        model.prefill(prompt, c, chunk=64)
    graph = StepGraphs(model, caches[0], capture=True, bucket=16, draft=out, attention=attention)
    body = StepGraphs(model, caches[1], capture=False, bucket=16, draft=out, attention=attention)
    for i, token in enumerate(steps):
        replayed = graph.draft(token, 37 + i)[0].clone()
        eager = body.draft(token, 37 + i)[0]
        assert replayed.shape == (heads.gamma + 1, 128) and torch.equal(replayed, eager)
        for c in caches:
            c.truncate(37 + i)
        graph.decode(token, 37 + i)
        body.decode(token, 37 + i)
    # draft and decode graphs for each of the buckets 32, 48, 64 (bucketed) or of the spans 64, 128 (length)
    assert graph.captures >= (6 if attention == "bucketed" else 4)


@pytest.mark.parametrize("attention", ["bucketed", "length"])
def test_graph_replay_equals_the_eager_body_on_the_8b_shape(attention):
    needs_length(attention)
    cfg = shape_config("llama-3.1-8b", layers=2)
    model = Transformer(cfg, random_state(cfg, torch.bfloat16, CUDA))
    prompt = torch.randint(0, cfg.vocab_size, (3000,), generator=torch.Generator().manual_seed(0))
    (replay, body, _), graph = replay_and_body(model, prompt, list(range(100, 140)), bucket=1024, capacity=4608,
                                               tree=121, attention=attention)
    # one decode bucket (2048: slots 3000..3039) or span (4096), and the 121-node pass padded to 128
    assert graph.captures == 2
    for a, b in zip(replay, body):
        assert torch.equal(a, b)


@pytest.mark.parametrize("t,prefix", [(1, 3000), (8, 3000), (121, 20000)])
def test_cuda_kernels_match_explicit_attention_on_the_8b_shape(t, prefix):
    """Flash decode and the cascade vs explicit float32 attention (bf16 inputs): 8 KV heads of a
    4-query group, head_dim 128, as in Llama-3.1-8B."""
    g = torch.Generator(device="cuda").manual_seed(0)
    hkv, grp, d = 8, 4, 128
    q = torch.randn(hkv, grp * t, d, device=CUDA, dtype=torch.bfloat16, generator=g)
    keys = torch.randn(hkv, prefix + t, d, device=CUDA, dtype=torch.bfloat16, generator=g)
    values = torch.randn(hkv, prefix + t, d, device=CUDA, dtype=torch.bfloat16, generator=g)
    new = torch.ones(t, t, dtype=torch.bool, device=CUDA).tril_()
    rows = new.repeat(grp, 1)  # [G*T, T]
    allowed = torch.cat([torch.ones(grp * t, prefix, dtype=torch.bool, device=CUDA), rows], dim=1)
    want, _ = explicit_with_lse(q.float(), keys.float(), values.float(), d**-0.5, allowed)
    got = cascade(q, keys, values, prefix, additive_mask(rows, q.dtype), d**-0.5)
    assert_bf16_close(got, want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("t,grp", [(1, 4), (8, 4), (121, 4), (128, 4), (37, 1)])
def test_the_masked_kernel_matches_explicit_attention_on_the_8b_shape(t, grp, dtype):
    """The verify pass's attention over its T new entries under the trie's mask: one memory-efficient
    kernel with an additive mask (rows padded to its alignment) and its log-sum-exp, no matmul
    kernels, the result explicit float32 attention's. The new keys come as the step bodies pass
    them: [Hkv, T, D] views of the projection's [T, Hkv, D]."""
    g = torch.Generator(device="cuda").manual_seed(t)
    hkv, d = 8, 128
    q = torch.randn(hkv, grp * t, d, device=CUDA, dtype=dtype, generator=g)
    keys = torch.randn(t, hkv, d, device=CUDA, dtype=dtype, generator=g).transpose(0, 1)
    values = torch.randn(t, hkv, d, device=CUDA, dtype=dtype, generator=g).transpose(0, 1)
    rows = random_trie(t, t).to(CUDA).repeat(grp, 1)  # [G*T, T]
    bias = additive_mask(rows, dtype)
    masked_with_lse(q, keys, values, bias, d**-0.5)  # warm-up
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out, lse = masked_with_lse(q, keys, values, bias, d**-0.5)
        torch.cuda.synchronize()
    want, want_lse = explicit_with_lse(q.float(), keys.float(), values.float(), d**-0.5, rows)
    assert out.shape == q.shape and out.dtype == dtype and lse.shape == (hkv, grp * t)
    assert (out.float() - want).abs().max().item() < 2e-2  # (outputs ~1 over at most 128 entries: a slip is ~1 off)
    assert (lse.float() - want_lse).abs().max().item() < 1e-2
    names = [e.name for e in prof.events()]
    assert any("fmha" in n or "MemEff" in n for n in names), names
    assert not any("gemm" in n.lower() for n in names), names


class Recording:
    """An op packet that records each call's arguments in `calls` and runs the op; its overloads (`.default`)
    stay the real ones, which torch's dispatch may look up by name while the packet is replaced (the fake
    device's function mode did, and recursed into a plain recording function)."""

    def __init__(self, op, calls: list) -> None:
        self.op, self.calls = op, calls

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return self.op(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.op, name)


@pytest.mark.parametrize("span", [32768, 30001])
@pytest.mark.parametrize("t,used,grp", [(1, 3000, 4), (8, 3000, 4), (121, 20000, 4), (1, 20000, 4), (8, 0, 4),
                                        (1, 20000, 1), (3, 3000, 1)])
def test_the_length_kernel_matches_explicit_attention_on_the_8b_shape(t, used, grp, span, monkeypatch):
    """Flash's variable-length kernel stops at the cached length it reads from device memory: slots
    past it hold huge stale values that must not show; the result is explicit float32 attention's.
    The rows go as one query token of Hkv*R heads (so the kernel splits the keys); a lone row
    (one decoding token of a model without GQA, grp 1) goes twice."""
    needs_length()
    calls = []
    monkeypatch.setattr(torch.ops.aten, "_flash_attention_forward",
                        Recording(torch.ops.aten._flash_attention_forward, calls))
    g = torch.Generator(device="cuda").manual_seed(0)
    hkv, d = 8, 128
    q = torch.randn(hkv, grp * t, d, device=CUDA, dtype=torch.bfloat16, generator=g)
    keys = torch.randn(hkv, span, d, device=CUDA, dtype=torch.bfloat16, generator=g)
    values = torch.randn(hkv, span, d, device=CUDA, dtype=torch.bfloat16, generator=g)
    keys[:, used:], values[:, used:] = 30.0, 1e4  # stale
    new_k = torch.randn(hkv, t, d, device=CUDA, dtype=torch.bfloat16, generator=g)
    new_v = torch.randn(hkv, t, d, device=CUDA, dtype=torch.bfloat16, generator=g)
    rows = torch.ones(t, t, dtype=torch.bool, device=CUDA).tril_().repeat(grp, 1)  # [G*T, T]
    length = key_span(torch.tensor([used], device=CUDA), span)
    out, lse = prefix_with_lse(q, keys, values, length, d**-0.5)
    assert torch.equal(prefix_attention(q, keys, values, length, d**-0.5), out)  # the decode step's call
    want, want_lse = explicit_with_lse(q.float(), keys[:, :used].float(), values[:, :used].float(), d**-0.5, None)
    assert calls and "seqused_k" in calls[0][1], "bf16 on CUDA should take flash's variable-length kernel"
    assert calls[0][0][0].shape == (1, hkv * max(grp * t, 2), d)  # one query token, a head per row
    assert out.shape == q.shape and lse.shape == q.shape[:2]
    assert_bf16_close(out, want)
    if used == 0:  # nothing cached: no weight in the merge (flash itself says +inf), and no NaN below
        assert torch.isneginf(lse).all()
    else:
        assert (lse - want_lse).abs().max().item() < 1e-2
    got = by_length(q, keys, values, length, new_k, new_v, additive_mask(rows, q.dtype), d**-0.5)
    allowed = torch.cat([torch.ones(grp * t, used, dtype=torch.bool, device=CUDA), rows], dim=1)
    want, _ = explicit_with_lse(q.float(), torch.cat([keys[:, :used], new_k], 1).float(),
                                torch.cat([values[:, :used], new_v], 1).float(), d**-0.5, allowed)
    # With nothing cached a row averages at most T values, so nothing evens out the bf16 rounding of each
    # probability (2^-8 of it) times its value: up to 2^-8 of the largest value (H200: 0.0024 past 2^-7 of
    # the output at T 8, over the 1e-3 that thousands of keys allow). A dropped mask is ~0.3 off here.
    assert_bf16_close(got, want, 1e-3 if used else 2**-8 * new_v.abs().max().item())


@pytest.mark.parametrize("grp,t", [(4, 1), (4, 32), (1, 1)])
def test_the_length_kernel_splits_the_keys_at_long_contexts(grp, t):
    """The variable-length kernel plans a split of the keys across thread blocks only for one query
    token of grouped heads; without it a step ran one thread block per KV head over the whole cache
    (H100, 8B shape at 100K: 89 ms of attention a step where the split kernel takes 4.5)."""
    needs_length()
    hkv, d, span = 8, 128, 65536
    q = torch.randn(hkv, grp * t, d, device=CUDA, dtype=torch.bfloat16)
    keys = torch.randn(hkv, span, d, device=CUDA, dtype=torch.bfloat16)
    length = key_span(torch.tensor([50000], device=CUDA), span)
    prefix_with_lse(q, keys, keys, length, d**-0.5)  # warm-up
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        prefix_with_lse(q, keys, keys, length, d**-0.5)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if "flash" in e.name]
    assert names and all("splitkv" in n for n in names), names


def generate(engine, method: str, spec: SpecConfig | None = None) -> list[int]:
    return run(engine, method, spec).token_ids


def run(engine, method: str, spec: SpecConfig | None = None):
    kwargs = {"spec": spec} if spec is not None else {}
    return engine.generate([5, 9, 17, 33, 5, 9, 17, 40, 5, 9], method=method, sampling=GREEDY,
                           generation=GenerationConfig(max_new_tokens=48, ignore_eos=True), **kwargs)


def drafted(engine, spec: SpecConfig) -> tuple[list[int], int, int, int]:
    """A TokenSwift run's tokens and what its drafts made of them (accepted tokens, steps, verified nodes). The
    walk keeps the tokens AR's whatever the draft pass computes, so a draft graph that replays anything other than
    its eager body (the partial cache's, the heads captured with the forward) shows only in these counts."""
    result = run(engine, "tokenswift", spec)
    return result.token_ids, result.stats.accepted_tokens, result.stats.steps, result.stats.verified_nodes


@pytest.mark.parametrize("method,spec", [
    ("ar", None),
    ("tokenswift", SpecConfig(tree="1,3,3,3", ngram_topk=4, adaptive=False)),
    ("tokenswift", SpecConfig(tree="1,3,3,3", ngram_topk=4, draft_mode="fused", adaptive=False)),
    ("tokenswift", SpecConfig(tree="1,3,3,3", ngram_topk=4, max_nodes=9, adaptive=False)),
], ids=["ar", "tokenswift-paper", "tokenswift-fused", "tokenswift-pruned"])
@pytest.mark.parametrize("attention", ["bucketed", "length"])
def test_float32_tokens_on_cuda_equal_the_cpu_tokens(method, spec, attention):
    """(The paper and fused specs' tries, up to 57 nodes, are cut to the GPU's default budget of 32 on
    CUDA and not on the CPU; the pruned spec cuts both to 9.)"""
    needs_length(attention)
    hf = tiny_hf_model("llama", "default", seed=5)
    cpu = longswift.load(hf, device="cpu", dtype="float32", heads="random")
    gpu = longswift.load(hf, device="cuda", dtype="float32", heads="random", graph_attention=attention)
    assert generate(gpu, method, spec) == generate(cpu, method, spec)


SPECS = {"paper": SpecConfig(tree="1,3,3,3", ngram_topk=4, adaptive=False),
         "fused": SpecConfig(tree="1,3,3,3", ngram_topk=4, draft_mode="fused", adaptive=False),
         "partial": SpecConfig(tree="2,2,2", ngram_topk=2, draft_kv_budget=24, draft_window=6, attention_sinks=4,
                               adaptive=False),
         "pruned": SpecConfig(tree="1,3,3,3", ngram_topk=4, max_nodes=9, adaptive=False)}


@pytest.mark.parametrize("attention", ["bucketed", "length"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_generation_with_cuda_graphs_equals_without(dtype, attention):
    needs_length(attention)
    hf = tiny_hf_model("llama", "default", seed=6)
    on = longswift.load(hf, device="cuda", dtype=dtype, cuda_graphs="on", heads="random", graph_attention=attention)
    off = longswift.load(hf, device="cuda", dtype=dtype, cuda_graphs="off", heads="random", graph_attention=attention)
    assert generate(on, "ar") == generate(off, "ar")
    for spec in SPECS.values():
        assert drafted(on, spec) == drafted(off, spec)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a second CUDA device")
@pytest.mark.parametrize("triton", [False, True], ids=["", "triton-kernels"])
def test_graphs_of_a_model_on_a_second_device_equal_eager_steps(triton):
    """A model on cuda:1 while cuda:0 is current: its graphs are captured on its own device (torch's
    capture stream is the current device's otherwise), so a generation with graphs on equals graphs off,
    and the current device is left as it was; so do the Triton kernels' launches (Triton launches on the current
    device), eagerly and captured."""
    if triton:
        needs_triton()
    hf = tiny_hf_model("llama", "default", seed=6)
    torch.cuda.set_device(0)
    on = longswift.load(hf, device="cuda:1", dtype="float32", cuda_graphs="on", heads="random", triton_kernels=triton)
    off = longswift.load(hf, device="cuda:1", dtype="float32", cuda_graphs="off", heads="random",
                         triton_kernels=triton)
    assert generate(on, "ar") == generate(off, "ar")
    assert drafted(on, SPECS["pruned"]) == drafted(off, SPECS["pruned"])
    assert torch.cuda.current_device() == 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_colocated_linears_on_cuda(dtype):
    """pack_weights on CUDA (the default for a model loaded from a file) colocates q/k/v and gate/up:
    in float32 its tokens are the separate weights' tokens, and TokenSwift's are AR's; in both
    precisions graphs on == off with them."""
    hf = tiny_hf_model("llama", "default", seed=6)
    engines = {(pack, graphs): longswift.load(hf, device="cuda", dtype=dtype, heads="random", pack_weights=pack,
                                              cuda_graphs=graphs)
               for pack in (False, True) for graphs in ("on", "off")}
    assert all(e.model.colocated == pack for (pack, _), e in engines.items())
    colocated = engines[True, "on"]
    assert generate(colocated, "ar") == generate(engines[True, "off"], "ar")
    for spec in SPECS.values():
        assert generate(colocated, "tokenswift", spec) == generate(engines[True, "off"], "tokenswift", spec)
    if dtype == "float32":
        want = generate(engines[False, "on"], "ar")
        assert generate(colocated, "ar") == want
        for spec in SPECS.values():
            assert generate(colocated, "tokenswift", spec) == want


def cuda_kernels(fn) -> int:
    """How many CUDA kernels (and device copies) fn() runs, by the profiler."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def test_the_fused_kernels_on_cuda():
    """On CUDA a bfloat16 RMSNorm is aten's fused kernel with the weight (fused_norm, the default
    there) instead of four kernels, within one unit in the last place of transformers' op order;
    o_proj and down_proj add the residual inside their product (fused_residual) in fewer kernels
    than a product and an add, to bfloat16 rounding; rope runs an addcmul (fused_rope); in bfloat16
    graphs on == off with them all, and float32 keeps the CPU's ops."""
    cfg = shape_config("llama-3.1-8b", layers=1)
    state = random_state(cfg, torch.bfloat16, CUDA)
    model = Transformer(cfg, state)
    assert model.fused_residual and model.fused_rope
    assert model.fused_norm == fused_rms_norm_available(), torch.__version__  # (an older torch: no fused kernel)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (3 * torch.randn(8, cfg.hidden_size, device=CUDA, generator=g)).to(torch.bfloat16)
    w = (1 + 0.2 * torch.randn(cfg.hidden_size, device=CUDA, generator=g)).to(torch.bfloat16)
    if model.fused_norm:
        assert cuda_kernels(lambda: model.norm(x, w)) == 1
        once = model.norm(x, w)
        model.fused_norm = False
        assert cuda_kernels(lambda: model.norm(x, w)) == 4
        assert (ulps(once, model.norm(x, w)) <= 1).all()
    a = torch.randn(8, cfg.num_heads * cfg.head_dim, device=CUDA, generator=g).to(torch.bfloat16)
    separate = Transformer(cfg, state, fused_residual=False)
    fused_o, separate_o = model.layers[0].o, separate.layers[0].o
    # the fused projection adds into its residual in place: one GEMM, no copy (a fresh residual each call)
    assert cuda_kernels(lambda: fused_o(a, x.clone())) < cuda_kernels(lambda: separate_o(a, x.clone()))
    torch.testing.assert_close(fused_o(a, x.clone()).float(), separate_o(a, x).float(), rtol=2e-2, atol=2e-2)
    hf = tiny_hf_model("llama", "default", seed=7)
    engines = [longswift.load(hf, device="cuda", dtype="bfloat16", heads="random", cuda_graphs=graphs)
               for graphs in ("on", "off")]
    assert all(e.model.fused_residual and e.model.fused_rope for e in engines)
    f32 = longswift.load(hf, device="cuda", dtype="float32", heads="random").model
    assert not (f32.fused_norm or f32.fused_residual or f32.fused_rope)  # float32 keeps the CPU's ops
    assert generate(engines[0], "ar") == generate(engines[1], "ar")
    for spec in SPECS.values():
        assert generate(engines[0], "tokenswift", spec) == generate(engines[1], "tokenswift", spec)


def test_a_generation_counts_its_graph_captures():
    """Stats carry the captures and their seconds (what the node budgets and buckets cost a run)."""
    hf = tiny_hf_model("llama", "default", seed=6)
    gen = GenerationConfig(max_new_tokens=48, ignore_eos=True)
    for setting, captured in (("on", True), ("off", False)):
        engine = longswift.load(hf, device="cuda", dtype="float32", cuda_graphs=setting, heads="random")
        for method, spec in (("ar", None), ("tokenswift", SPECS["paper"])):
            s = engine.generate([5, 9, 17], method=method, sampling=GREEDY, generation=gen, spec=spec).stats
            assert (s.graph_captures > 0 and s.graph_capture_seconds > 0) == captured, (setting, method, s)
            assert s.graph_capture_seconds < s.decode_seconds or not captured


@pytest.mark.parametrize("walk", ["batched", "rows"])
def test_sampled_tokenswift_equals_ar_on_cuda_in_float32(walk):
    """Seeded sampling with the penalty: the batched walk (the GPU default: every trie row drawn at
    once, one device read per step) and the row walk both emit AR's tokens."""
    engine = longswift.load(tiny_hf_model("llama", "default", seed=8), device="cuda", dtype="float32",
                            heads="random")
    sampling = SamplingConfig(seed=4, min_p=0.05, repetition_penalty=1.2, penalty_window=16)
    gen = GenerationConfig(max_new_tokens=48, ignore_eos=True)
    prompt = [5, 9, 17, 33, 5, 9, 17, 40, 5, 9]
    want = engine.generate(prompt, method="ar", sampling=sampling, generation=gen).token_ids
    for spec in SPECS.values():
        spec = dataclasses.replace(spec, walk=walk)
        assert engine.generate(prompt, method="tokenswift", sampling=sampling, generation=gen,
                               spec=spec).token_ids == want, spec


def test_tokenswift_equals_ar_on_cuda_in_float32():
    """The lossless claim on the GPU path (graphs, padded verify, partial-cache drafting), float32."""
    engine = longswift.load(tiny_hf_model("llama", "default", seed=7), device="cuda", dtype="float32",
                            heads="random")
    want = generate(engine, "ar")
    for spec in SPECS.values():
        assert generate(engine, "tokenswift", spec) == want


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("attention", ["bucketed", "length"])
@pytest.mark.parametrize("vocab", [128, 65536])
def test_a_draw_captured_in_the_decode_graph_equals_the_eager_draws(dtype, attention, vocab):
    """StepGraphs.sample_decode: the draw (penalty window gathered on the device, ban, temperature,
    top-k/top-p/min-p, the inverse-CDF draw) and its history write, captured with the decode forward
    and replayed, give the tokens, logits and history of eager draws between eagerly run bodies,
    across buckets (spans), greedy and sampled. A real vocabulary's size takes sort and top-k to
    their large-input kernels (cub's radix sort past 4,096 entries)."""
    from longswift.runtime.blocks import sample_block

    needs_length(attention)
    model = longswift.load(tiny_hf_model("llama", "default", seed=12, vocab=vocab), device="cuda",
                           dtype=str(dtype).removeprefix("torch.")).model
    prompt = torch.randint(0, 128, (37,), generator=torch.Generator().manual_seed(2))
    for sampling in (SamplingConfig(temperature=0, repetition_penalty=1.3, penalty_window=16, banned_ids=(7,)),
                     SamplingConfig(temperature=0.8, top_k=50, top_p=0.9, repetition_penalty=1.15, penalty_window=24),
                     SamplingConfig(temperature=1.1, min_p=0.05, banned_ids=(3, 4))):
        results = []
        for in_body in (True, False):
            cache = FullKVCache(model.cfg, 160, model.dtype, CUDA)
            logits, _ = model.prefill(prompt.to(CUDA), cache, chunk=64)
            history = torch.zeros(160, dtype=torch.long, device=CUDA)
            history[:37] = prompt.to(CUDA)
            graphs = StepGraphs(model, cache, capture=in_body, bucket=16, attention=attention, sample_in_body=in_body)
            generator = torch.Generator().manual_seed(8)
            n, seen = 37, []
            for k in (16, 16, 9, 16):
                block = sample_block(model, cache, graphs, logits, history, n, k, sampling, generator, frozenset(),
                                     forward_last=True)
                seen.append((block.tokens, block.logits.clone()))
                n, logits = n + k, block.logits
            results.append((seen, history.clone()))
            if in_body:  # decode slots 37..93: buckets 32, 48, 64, 80; spans 64, 128 (span_for(slot + 1))
                assert graphs.captures == {"bucketed": 4, "length": 2}[attention], graphs.captures
                assert {key[2] for key in graphs.graphs} == {"sampled"}, list(graphs.graphs)  # drawn in the body
        (fused, h1), (eager, h2) = results
        assert torch.equal(h1, h2), sampling
        for (t1, x1), (t2, x2) in zip(fused, eager):
            assert t1 == t2 and torch.equal(x1, x2), sampling


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_ar_token_blocks_on_cuda_equal_reading_each_token(dtype):
    """--read-every (auto 16 on CUDA: tokens stay on the device, read back a block at a time) emits
    exactly what reading each token emits, greedy and seeded-sampled, in both precisions (the same
    kernels run either way)."""
    hf = tiny_hf_model("llama", "default", seed=10)
    prompt = [5, 9, 17, 33, 5, 9, 17, 40, 5, 9]
    gen = GenerationConfig(max_new_tokens=45, ignore_eos=True)
    for sampling in (GREEDY, SamplingConfig(seed=4, top_p=0.9, repetition_penalty=1.2, penalty_window=16)):
        got = {every: longswift.load(hf, device="cuda", dtype=dtype, read_every=every).generate(
            prompt, method="ar", sampling=sampling, generation=gen).token_ids for every in (1, 0, 7)}
        assert got[0] == got[1] and got[7] == got[1], sampling


def test_tokenswift_plain_blocks_on_cuda_equal_ar_in_float32(monkeypatch):
    """Where plain steps lead (rates fixed so, no timing), TokenSwift runs them as token blocks of
    --read-every (auto 16 on CUDA) between its probes; seeded-sampled output is still AR's."""
    monkeypatch.setattr(StepSchedule, "rate",
                        lambda self, kind: {FULL: 1.0, HALF: 1.25, NARROW: 1.5, LOOKUP: 2.0, PLAIN: 3.0}[kind])
    engine = longswift.load(tiny_hf_model("llama", "default", seed=9), device="cuda", dtype="float32",
                            heads="random")
    sampling = SamplingConfig(seed=4, top_p=0.9, repetition_penalty=1.2, penalty_window=16)
    gen = GenerationConfig(max_new_tokens=80, ignore_eos=True)
    prompt = [5, 9, 17, 33, 5, 9, 17, 40, 5, 9]
    want = engine.generate(prompt, method="ar", sampling=sampling, generation=gen).token_ids
    for spec in SPECS.values():
        stream = engine.stream(prompt, method="tokenswift", sampling=sampling, generation=gen,
                               spec=dataclasses.replace(spec, adaptive=True))
        sizes = [len(b) for b in stream]
        assert stream.result.token_ids == want, spec
        assert max(sizes) > 1, (spec, sizes)  # blocks ran


@pytest.mark.parametrize("mode", ["paper", "fused"])
def test_narrow_steps_on_cuda_equal_ar_in_float32_and_replay_equals_eager(mode, monkeypatch):
    """Adaptive steps on the GPU's wide default trie may run a full step on a narrow trie (a chain and
    one n-gram path, padded to the smallest node budget) or on the likeliest half of the 32-node budget:
    mixed with the other kinds in a fixed pattern, greedy and seeded-sampled tokens are AR's in float32,
    and graphs on == off in bfloat16."""

    def pattern_choose():
        kinds = iter([FULL, HALF, NARROW, NARROW, LOOKUP, PLAIN] * 100)
        monkeypatch.setattr(StepSchedule, "choose", lambda self: next(kinds))

    hf = tiny_hf_model("llama", "default", seed=9)
    spec = SpecConfig(tree="1,3,3,3", ngram_topk=4, draft_mode=mode)
    gen = GenerationConfig(max_new_tokens=60, ignore_eos=True)
    prompt = [5, 9, 17, 33, 5, 9, 17, 40, 5, 9]
    sampled = SamplingConfig(seed=4, top_p=0.9, repetition_penalty=1.2, penalty_window=16)
    f32 = longswift.load(hf, device="cuda", dtype="float32", heads="random")
    for sampling in (GREEDY, sampled):
        want = f32.generate(prompt, method="ar", sampling=sampling, generation=gen).token_ids
        pattern_choose()
        got = f32.generate(prompt, method="tokenswift", sampling=sampling, generation=gen, spec=spec)
        assert got.token_ids == want, sampling
        assert got.stats.narrow_steps > 0 and got.stats.half_steps > 0
        assert sampling is not GREEDY or got.stats.accepted_tokens > 0  # drafts, not only roots (10-28 on the CPU)
    out = []
    for graphs in ("on", "off"):
        pattern_choose()
        engine = longswift.load(hf, device="cuda", dtype="bfloat16", heads="random", cuda_graphs=graphs)
        result = engine.generate(prompt, method="tokenswift", sampling=sampled, generation=gen, spec=spec)
        assert result.stats.narrow_steps > 0
        out.append(result.token_ids)
    assert out[0] == out[1]


def test_float32_logits_on_cuda_are_the_float32_product_and_replay_equals_eager():
    """--float32-logits in bfloat16 on CUDA (a matmul with a float32 output, or the float32 copy
    where that op is missing): the float32 product of the bf16 inputs, not bf16-rounded logits, and
    a generation with graphs on emits what it does with graphs off."""
    hf = tiny_hf_model("llama", "default", seed=11)
    engine = longswift.load(hf, device="cuda", dtype="bfloat16", float32_logits=True, heads="random")
    m = engine.model
    hidden = torch.randn(6, m.cfg.hidden_size, device=CUDA).to(torch.bfloat16)
    weight = m.embed if m.cfg.tie_word_embeddings else m.state["lm_head.weight"]
    exact = m.norm(hidden, m.final_norm).double() @ weight.double().T
    logits = m.logits(hidden)
    assert logits.dtype == torch.float32 and not torch.equal(logits, logits.to(torch.bfloat16).float())
    torch.testing.assert_close(logits.double(), exact, rtol=1e-4, atol=1e-4)
    off = longswift.load(hf, device="cuda", dtype="bfloat16", float32_logits=True, cuda_graphs="off",
                         heads="random")
    assert generate(engine, "ar") == generate(off, "ar")
    for spec in SPECS.values():
        assert generate(engine, "tokenswift", spec) == generate(off, "tokenswift", spec)


def test_memory_torch_keeps_after_freeing_counts_as_available():
    """What a finished run freed stays reserved by torch's allocator, and the driver counts it as used: the memory
    check of the next run on the same engine counts it as free."""
    from longswift.runtime.memory import available_bytes

    torch.cuda.synchronize()
    before = available_bytes(CUDA)
    block = torch.empty(1 << 30, dtype=torch.uint8, device=CUDA)
    del block  # (kept by the caching allocator)
    assert torch.cuda.mem_get_info(CUDA)[0] < before - (1 << 29)  # the driver's figure left it out
    assert available_bytes(CUDA) >= before - (64 << 20)


@pytest.mark.parametrize("preset", ["paper", "top-p", "eta"])
def test_the_batched_walks_device_memory_is_within_the_plan(preset):
    """The CUDA allocator's peak over a batched walk of the paper's padded budget (128 rows) on an
    8B-sized vocabulary stays within memory.SAMPLING_BYTES_PER_LOGIT (the CPU measures it with its
    resident memory, tests/test_walk_memory.py; here the sort's device workspace counts too)."""
    from longswift.bench.grid import PRESETS
    from longswift.runtime.memory import SAMPLING_BYTES_PER_LOGIT
    from longswift.spec.tree import Trie
    from longswift.spec.verify import batched_walk

    n, v = 128, 128_256
    trie = Trie.with_root(7)
    trie.add_levels([[1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 2, 3]])  # 121 nodes
    trie.add_path([9, 9, 9, 9, 9, 9, 9], 2)  # 128
    assert len(trie) == n
    history = torch.randint(0, v, (4096,), device=CUDA)
    logits = (torch.randn(n, v, device=CUDA) * 4).to(torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    batched_walk(trie, logits.clone(), history, 4000, PRESETS[preset], gen)  # lazy inits (a row per node)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    batched_walk(trie, logits, history, 4000, PRESETS[preset], gen)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - start
    assert 8 * n * v < peak <= SAMPLING_BYTES_PER_LOGIT * n * v, f"{peak / (n * v):.1f} bytes per logit"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_bench_lockstep_on_cuda_generates_what_runs_made_apart_do(dtype):
    """`bench --lockstep` holds every method's generation (its cache and CUDA graphs) at once and
    steps them in turn: each must generate what it generates alone, graphs on, sampled."""
    from longswift.bench.grid import PRESETS, BenchConfig, Methods

    hf = tiny_hf_model("llama", "default", seed=8)
    engine = longswift.load(hf, device="cuda", dtype=dtype, cuda_graphs="on", heads="random")
    cfg = BenchConfig(spec=SpecConfig().for_device(CUDA))
    methods = Methods(engine, hf, cfg, 256)  # (a model object: no GGUF path is looked up)
    prompt, sampling = [5, 9, 17, 33, 5, 9, 17, 40, 5, 9], dataclasses.replace(PRESETS["paper"], seed=3)
    ours = ["ar", "tokenswift", "tokenswift-fused"]
    apart = {m: methods.run(m, prompt, 40, sampling, None)[0] for m in ours}
    together = methods.run_lockstep(ours, prompt, 40, sampling, dict.fromkeys(ours))
    assert {m: ids for m, (ids, _, _) in together.items()} == apart
    assert all(timeline.decode_seconds > 0 for _, timeline, _ in together.values())


def needs_triton() -> None:
    """--triton-kernels needs the triton package, which CUDA builds of torch bring; a machine without it has
    nothing to run here."""
    pytest.importorskip("triton")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_triton_kernels_compute_what_the_eager_ops_do(dtype):
    """Compiled for the GPU (CPU tests run them interpreted): rope_store rotates as apply_rope in both of
    its orders and writes the keys and values at the given slots only; silu_mul is F.silu(gate) * up; rms_norm
    is the model's RMSNorm in both of its roundings; each within one unit in the last place (Triton's exp and
    its fused multiply-adds, another order of the norm's sum), most elements equal."""
    needs_triton()
    from longswift.runtime.model import rms_norm
    from longswift.runtime.rope import apply_rope
    from longswift.runtime.triton_kernels import rms_norm as triton_rms_norm
    from longswift.runtime.triton_kernels import rope_store, silu_mul

    h, hkv, d, t = 32, 8, 128, 5  # the 8B shape's heads
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(t, (h + 2 * hkv) * d, generator=g).to(dtype).to(CUDA)
    angles = torch.randn(t, 1, d // 2, generator=g, dtype=torch.float64) * 3
    cos = torch.cat([angles.cos()] * 2, -1).to(dtype).to(CUDA)
    sin = torch.cat([angles.sin()] * 2, -1).to(dtype).to(CUDA)
    sin[..., : d // 2].neg_()
    slots = torch.tensor([3, 7, 8, 9, 15], device=CUDA)
    equal = []
    for fused in (False, True):
        ck = torch.full((hkv, 20, d), 7.0, dtype=dtype, device=CUDA)
        cv = torch.full((hkv, 20, d), -7.0, dtype=dtype, device=CUDA)
        q, k, v = rope_store(qkv, cos, sin, slots, ck, cv, h, hkv, fused)
        want = apply_rope(qkv[:, : (h + hkv) * d].view(t, h + hkv, d), cos, sin, fused)
        got = torch.cat([q, k], dim=1)
        assert ulps(got, want).max() <= 1, (fused, ulps(got, want).max())
        equal.append((got == want).float().mean().item())
        assert torch.equal(ck[:, slots], k.transpose(0, 1)) and torch.equal(cv[:, slots], v.transpose(0, 1))
        assert torch.equal(v, qkv[:, (h + hkv) * d :].view(t, hkv, d))
        rest = torch.ones(20, dtype=torch.bool)
        rest[slots.cpu()] = False
        assert (ck[:, rest.to(CUDA)] == 7).all() and (cv[:, rest.to(CUDA)] == -7).all()
    gate_up = (torch.randn(3, 2 * 14336, generator=g) * 4).to(dtype).to(CUDA)
    gate, up = gate_up.chunk(2, dim=-1)
    want = F.silu(gate) * up
    got = silu_mul(gate_up)
    assert ulps(got, want).max() <= 1
    equal.append((got == want).float().mean().item())
    x = (torch.randn(3, 4096, generator=g) * 3).to(dtype).to(CUDA)
    weight = (torch.rand(4096, generator=g) + 0.5).to(dtype).to(CUDA)
    for fused in (True,) if dtype == torch.float32 else (False, True):  # (float32: one op, one rounding)
        want = rms_norm(x, weight, 1e-5, fused)
        got = triton_rms_norm(x, weight, 1e-5, fused or dtype == torch.float32)
        assert ulps(got, want).max() <= 1, (fused, ulps(got, want).max())
        equal.append((got == want).float().mean().item())
    assert min(equal) > 0.9, equal


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_triton_attention_is_attention_over_the_used_slots_and_the_tree(dtype):
    """Compiled for the GPU (CPU tests run it interpreted), on the 8B shape's heads: decoding over 4,097 and
    70,001 cached slots split as the device's part count splits them, a 32-node verify pass (128 rows a KV head,
    one row block) and a 121-node one (484 rows) under random tries, against float64 attention; float32 to its
    rounding (IEEE products, no TF32), float16 and bfloat16 no further from it than flash attention in the same
    dtype, give or take rounding the weights (which flash does too)."""
    needs_triton()
    from longswift.runtime.attention import flash_with_lse
    from longswift.runtime.triton_kernels import attention, attention_parts

    hkv, group, d = 8, 4, 128
    g = torch.Generator().manual_seed(0)
    for used, nodes in ((4097, 0), (70001, 0), (4096, 32), (70000, 32), (70000, 121)):
        rows = group * max(nodes, 1)
        keys = torch.randn(hkv, used + nodes + 64, d, generator=g).to(dtype).to(CUDA)
        values = torch.randn(hkv, used + nodes + 64, d, generator=g).to(dtype).to(CUDA)
        qg = torch.randn(hkv, rows, d, generator=g).to(dtype).to(CUDA)
        tree = random_trie(nodes, 1).to(CUDA) if nodes else None
        seen = torch.ones(rows, used + nodes, dtype=torch.bool, device=CUDA)
        if nodes:
            seen[:, used:] = tree[torch.arange(rows, device=CUDA) % nodes]
        scores = qg.double() @ keys[:, : used + nodes].double().transpose(1, 2) * d ** -0.5
        want = torch.softmax(scores.masked_fill(~seen, float("-inf")), -1) @ values[:, : used + nodes].double()
        parts = attention_parts(CUDA, hkv, rows, used + 1000)
        got = attention(qg, keys, values, torch.tensor([used], device=CUDA), d ** -0.5, tree, parts)
        error = (got.double() - want).abs().max().item()
        if dtype == torch.float32:
            assert error < 1e-5, (used, nodes, error)
            continue
        # flash has no tree mask: with a tree, its error over the cached slots alone, for the same rows
        flash = flash_with_lse(qg, keys[:, :used], values[:, :used], d ** -0.5)[0]
        plain = torch.softmax(scores[..., :used], -1) @ values[:, :used].double() if nodes else want
        assert error <= 2 * (flash.double() - plain).abs().max().item() + torch.finfo(dtype).eps, (used, nodes)


@pytest.mark.parametrize("attention", ["bucketed", "length"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_kernel_graphs_replay_their_eager_body(dtype, attention):
    """--triton-kernels: the step bodies with rope_store and silu_mul, captured, equal their eager runs exactly,
    on the tiny model and the 8B shape (2 layers); in float32 they stay within rounding of the model's forward
    without the kernels."""
    needs_triton()
    needs_length(attention)
    hf = tiny_hf_model("llama", "default", seed=3)
    plain = longswift.load(hf, device="cuda", dtype=str(dtype).removeprefix("torch.")).model
    model = Transformer(plain.cfg, plain.state, triton_kernels=True)
    prompt = torch.randint(0, 128, (37,), generator=torch.Generator().manual_seed(0))
    steps = torch.randint(0, 128, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    (replay, body, _), _ = replay_and_body(model, prompt, steps, bucket=16, capacity=160, tree=6,
                                          attention=attention, mask=random_trie(6, 1))
    (_, _, without), _ = replay_and_body(plain, prompt, steps, bucket=16, capacity=160, tree=6,
                                         attention=attention, mask=random_trie(6, 1))
    for a, b, c in zip(replay, body, without):
        assert torch.equal(a, b)
        if dtype == torch.float32:
            torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-4)
    cfg = shape_config("llama-3.1-8b", layers=2)
    big = Transformer(cfg, random_state(cfg, torch.bfloat16, CUDA), pack=True, triton_kernels=True)
    prompt = torch.randint(0, cfg.vocab_size, (3000,), generator=torch.Generator().manual_seed(0))
    (replay, body, _), _ = replay_and_body(big, prompt, list(range(100, 120)), bucket=1024, capacity=4608,
                                          tree=41, attention=attention)
    for a, b in zip(replay, body):
        assert torch.equal(a, b)


@pytest.mark.parametrize("attention", ["bucketed", "length"])
def test_bfloat16_triton_kernel_bodies_are_as_close_to_float32_as_the_eager_forward(attention):
    needs_triton()
    needs_length(attention)
    hf = tiny_hf_model("llama", "default", seed=3)
    prompt = torch.randint(0, 128, (37,), generator=torch.Generator().manual_seed(0))
    steps = torch.randint(0, 128, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    reference = replay_and_body(longswift.load(hf, device="cuda", dtype="float32").model, prompt, steps, bucket=16,
                                capacity=160, tree=6, attention=attention, mask=random_trie(6, 1))[0][2]
    plain = longswift.load(hf, device="cuda", dtype="bfloat16").model
    model = Transformer(plain.cfg, plain.state, triton_kernels=True)
    replay, body, eager = replay_and_body(model, prompt, steps, bucket=16, capacity=160, tree=6, attention=attention,
                                          mask=random_trie(6, 1))[0]

    def error(rows: list[torch.Tensor]) -> float:
        return max((x.float() - r).abs().max().item() for x, r in zip(rows, reference))

    assert error(body) == error(replay) <= 4 * error(eager) + 1e-3


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_generation_with_triton_kernels_and_graphs_equals_without_graphs(dtype):
    needs_triton()
    hf = tiny_hf_model("llama", "default", seed=6)
    on = longswift.load(hf, device="cuda", dtype=dtype, cuda_graphs="on", heads="random", triton_kernels=True)
    off = longswift.load(hf, device="cuda", dtype=dtype, cuda_graphs="off", heads="random", triton_kernels=True)
    assert on.model.triton_kernels and off.model.triton_kernels
    assert generate(on, "ar") == generate(off, "ar")
    for spec in SPECS.values():
        assert drafted(on, spec) == drafted(off, spec)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_triton_draw_draws_what_the_torch_draw_draws(dtype):
    """The decode body's draw in Triton kernels (runtime.triton_sampling), compiled for the GPU over a real
    vocabulary (128,256 tokens, 126 chunks), against the torch transform and draw_rows on the same GPU: greedy with
    a penalty and a ban; the paper's sampling (min-p 0.1, penalty 1.2 over 1,024 tokens); a temperature, min-p
    and a ban. For uniforms in the middle of kept tokens' intervals of torch's CDF (64 of them, and its ends) the
    token is torch's. The case keeps every token's probability clear of min-p's threshold by more than float32's
    sums can differ (1e-5 relative), and the probed intervals wider than float64's (1e-9). A banned token in the
    penalty window, the likeliest, is never drawn (300 greedy draws)."""
    needs_triton()
    from longswift.runtime.triton_sampling import sample, sample_params
    from longswift.sampling import banned_index, draw_rows, transform

    vocab, position = 128256, 3000
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(vocab, generator=g, dtype=torch.float64) * 2.5
    history = torch.randint(0, vocab, (4096,), generator=g)
    logits[history[position - 1024 : position][:50]] += 4.0  # likely tokens the penalty sees
    logits, history = logits.to(dtype).to(CUDA), history.to(CUDA)
    at = torch.tensor([position], device=CUDA)
    for sampling in (SamplingConfig(temperature=0, repetition_penalty=1.3, penalty_window=64, banned_ids=(17, 99)),
                     SamplingConfig(seed=1),
                     SamplingConfig(temperature=0.8, min_p=0.05, repetition_penalty=1.0, banned_ids=(5,))):
        w = sampling.penalized_window
        window = history[position - w : position][None]
        banned = banned_index(sampling.banned_ids, CUDA) if sampling.banned_ids else None
        params = sample_params(sampling, dtype, CUDA)

        def kernels(u: float | None) -> int:
            mine = history.clone()
            out = torch.zeros(1, dtype=torch.long, device=CUDA)
            sample(logits, mine, at, sampling, params, banned,
                   None if u is None else torch.tensor([u], dtype=torch.float64, device=CUDA), out)
            assert int(mine[position]) == int(out[0])
            return int(out[0])

        x = transform(logits[None], window, sampling)
        if sampling.greedy:
            assert kernels(None) == int(x.argmax())
            continue
        unfiltered = transform(logits[None], window, dataclasses.replace(sampling, min_p=0.0))
        probs = torch.softmax(unfiltered, -1)
        threshold = sampling.min_p * probs.max()
        assert ((probs - threshold).abs() / threshold).min() > 1e-5  # (the case's, not the kernels')
        cdf = torch.cumsum(torch.softmax(x.double(), -1), -1)[0]
        before = torch.cat([cdf.new_zeros(1), cdf[:-1]])
        kept = torch.nonzero(cdf - before > 1e-9).flatten()
        probed = kept[torch.linspace(0, len(kept) - 1, 64).round().long()].tolist()
        uniforms = {float((before[t] + cdf[t]) / 2 / cdf[-1]): t for t in probed}
        uniforms.update({0.0: int(kept[0]), 1.0 - 2 ** -40: int(torch.nonzero(cdf > before).flatten()[-1])})
        for u, token in uniforms.items():
            assert int(draw_rows(x, sampling, torch.tensor([u], dtype=torch.float64))[0]) == token
            assert kernels(u) == token, (sampling, u)
    # A banned token in the penalty window, the likeliest: two threads of the prepare kernel write its penalized
    # value and its -inf, which a barrier orders (the interpreter runs a program's loops in order); 300 greedy draws
    hot = torch.arange(1000, 1008, device=CUDA)
    history[position - 8 : position] = hot
    logits[hot] = logits.max() + 5
    sampling = SamplingConfig(temperature=0, repetition_penalty=1.3, penalty_window=64, banned_ids=tuple(hot.tolist()))
    params, banned = sample_params(sampling, dtype, CUDA), banned_index(sampling.banned_ids, CUDA)
    want = int(transform(logits[None], history[position - 64 : position][None], sampling).argmax())
    assert want not in sampling.banned_ids
    out = torch.zeros(1, dtype=torch.long, device=CUDA)
    drawn = {int(sample(logits, history, at, sampling, params, banned, None, out)[0]) for _ in range(300)}
    assert drawn == {want}, drawn
