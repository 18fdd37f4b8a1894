"""The decode step's draw in Triton kernels (runtime.triton_sampling, --triton-kernels), under Triton's interpreter on
CPU tensors: every token the torch transform and draw_rows can draw, it draws for the same uniform (each kept
token's interval of the inverse CDF probed at its middle, and its ends), and none they drop; greedy takes the
first of the largest logits; the token goes to the history at its position. A SAMPLED step body with the kernels
draws what the torch body draws, with none of its aten ops. Compiled here for sm_80 and sm_90; tests/test_cuda.py
runs it on a GPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import OpCount, tiny_hf_model

import longswift
from longswift import SamplingConfig
from longswift.runtime.cache import FullKVCache
from longswift.runtime.cuda_graphs import StepGraphs
from longswift.runtime.model import Transformer
from longswift.sampling import banned_index, draw_rows, transform

triton = pytest.importorskip("triton")
from triton_compile import compile_for  # noqa: E402

from longswift.runtime import triton_sampling  # noqa: E402
from longswift.runtime.triton_sampling import sample, sample_params, sampling_fits  # noqa: E402

CPU = torch.device("cpu")
V, POSITION = 300, 40  # 5 chunks of 64 below, the last one partial


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(triton_sampling, "SAMPLE_CHUNK", 64)
    monkeypatch.setattr(triton_sampling, "WINDOW_BLOCK", 16)  # windows of several blocks


def case(dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits [V] and a history [64] whose last tokens before POSITION hold the likeliest tokens (so that the
    penalty reorders them), some with negative logits (the penalty's other branch)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(V, generator=g, dtype=torch.float64) * 1.2
    history = torch.randint(0, V, (64,), generator=g)
    recent = history[POSITION - 12 : POSITION]
    logits[recent[:8]] += 1.5
    logits[recent[8:]] = -logits[recent[8:]].abs() - 1.0
    # the history's first entry: the likeliest token found nowhere else before POSITION (a window that reaches
    # the history's start penalizes it there only)
    elsewhere = torch.zeros(V, dtype=torch.bool)
    elsewhere[history[1:POSITION]] = True
    history[0] = int(logits.masked_fill(elsewhere, -torch.inf).argmax())
    return logits.to(dtype), history


def transformed(logits: torch.Tensor, history: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """The torch transform of logits [V] with the penalty window before POSITION -> [1, V]."""
    w = sampling.penalized_window
    at = POSITION - w + torch.arange(w)
    window = torch.where(at >= 0, history[at.clamp(min=0)], -1)
    return transform(logits[None], window[None], sampling)


def torch_draw(logits: torch.Tensor, history: torch.Tensor, sampling: SamplingConfig, u: float | None) -> int:
    x = transformed(logits, history, sampling)
    return int(draw_rows(x, sampling, None if u is None else torch.tensor([u], dtype=torch.float64))[0])


def torch_cdf(logits: torch.Tensor, history: torch.Tensor,
              sampling: SamplingConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The draw's CDF [V] (float64, as draw_rows sums it), the mass before each token [V], the kept tokens."""
    cdf = torch.cumsum(torch.softmax(transformed(logits, history, sampling)[0].double(), -1), -1)
    before = torch.cat([torch.zeros(1, dtype=torch.float64), cdf[:-1]])
    return cdf, before, torch.nonzero(cdf > before).flatten()


def kernel_draw(logits: torch.Tensor, history: torch.Tensor, sampling: SamplingConfig, u: float | None) -> int:
    history = history.clone()
    banned = banned_index(sampling.banned_ids, CPU) if sampling.banned_ids else None
    out = torch.full((1,), -1, dtype=torch.long)
    got = sample(logits, history, torch.tensor([POSITION]), sampling, sample_params(sampling, logits.dtype, CPU),
                 banned, None if u is None else torch.tensor([u], dtype=torch.float64), out)
    assert got is out and int(history[POSITION]) == int(out[0])  # the history holds it at its position
    return int(out[0])


def probes(logits: torch.Tensor, history: torch.Tensor, sampling: SamplingConfig, most: int = 24) -> dict[float, int]:
    """Uniforms -> the token the torch draw gives: the middle of each kept token's interval of the CDF (at most
    `most` of them, the first and last kept among them), and the CDF's two ends (u within 2^-53 of 1 among them:
    the last kept token, never the banned last token of the vocabulary)."""
    cdf, before, kept = torch_cdf(logits, history, sampling)
    chosen = kept if len(kept) <= most else kept[torch.linspace(0, len(kept) - 1, most).round().long()]
    out = {float((before[t] + cdf[t]) / 2 / cdf[-1]): int(t) for t in chosen}
    out[0.0] = int(kept[0])
    for ulps in (40, 52, 53):  # within ulps of 1 the sums' rounding may leave u * total unpassed: the last kept
        out[1.0 - 2.0 ** -ulps] = int(kept[-1])
    for u, token in out.items():
        assert torch_draw(logits, history, sampling, u) == token  # (the probes' own check)
    return out


SAMPLED = {
    "paper": SamplingConfig(seed=1),  # min-p 0.1, penalty 1.2 over 1,024 tokens (more than the history holds)
    "temperature-min-p-penalty-ban": SamplingConfig(temperature=0.7, min_p=0.02, repetition_penalty=1.4,
                                                    penalty_window=40, banned_ids=(5, 130, 299)),
    "temperature-only": SamplingConfig(temperature=1.6, min_p=0.0, repetition_penalty=1.0),
    "plain": SamplingConfig(temperature=1.0, min_p=0.0, repetition_penalty=1.0),  # the logits as they are
    # every logit negative (the case's shifted by -6): the penalty multiplies the likeliest tokens' by theta
    "penalty-negative-logits": SamplingConfig(temperature=1.0, min_p=0.0, repetition_penalty=1.3, penalty_window=12),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(SAMPLED))
def test_the_kernels_draw_what_transform_and_draw_rows_draw(name, dtype):
    """For uniforms inside each kept token's interval of the inverse CDF, and at its ends, the kernels draw the
    torch draw's token: the same tokens kept, in the same order, with the same weights (to rounding)."""
    sampling = SAMPLED[name]
    logits, history = case(dtype)
    if name == "penalty-negative-logits":
        logits -= 6
        assert logits.max() < 0
    if sampling.banned_ids:  # a banned token the likeliest, and one among the penalized
        logits[sampling.banned_ids[0]] = logits.max() + 1
        history[POSITION - 3] = sampling.banned_ids[1]
    wanted = probes(logits, history, sampling)
    assert len(set(wanted.values())) >= 10
    assert {u: kernel_draw(logits, history, sampling, u) for u in wanted} == wanted
    # u = 1, which no generator gives, passes no cumulative weight (as rounding may leave a u within ulps of 1):
    # the last kept token, where torch's clamp gives the vocabulary's last (banned in one preset)
    assert kernel_draw(logits, history, sampling, 1.0) == wanted[1.0 - 2.0 ** -53]
    if sampling.min_p > 0:  # the last chunk all dropped by min-p: the last chunk with a kept token is another
        low = logits.clone()
        low[-(V % 64 or 64) :] = logits.min() - 30
        assert kernel_draw(low, history, sampling, 1.0) == probes(low, history, sampling)[1.0 - 2.0 ** -53]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_draws_weights_are_float64(dtype):
    """Uniforms 1e-11 (relative) either side of the boundaries between kept tokens draw torch's token on each side:
    the kernels weigh the tokens in float64, as draw_rows does (float32 weights would be 1e-7 off). Without the
    penalty: the kernels multiply by its reciprocal, as CUDA divides, where the CPU divides (1e-7 apart in float32)."""
    sampling = SamplingConfig(temperature=1.0, min_p=0.1, repetition_penalty=1.0)
    logits, history = case(dtype)
    cdf, before, kept = torch_cdf(logits, history, sampling)
    wanted = {}
    for k in torch.linspace(0, len(kept) - 2, 8).round().long().tolist():
        edge = float(cdf[kept[k]] / cdf[-1])
        below, above = edge * (1 - 1e-11), edge * (1 + 1e-11)
        wanted[below], wanted[above] = int(kept[k]), int(kept[k + 1])
        assert torch_draw(logits, history, sampling, below) == wanted[below]  # (the probes' own check)
        assert torch_draw(logits, history, sampling, above) == wanted[above]
    assert {u: kernel_draw(logits, history, sampling, u) for u in wanted} == wanted


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_greedy_takes_the_first_of_the_largest_transformed_logits(dtype):
    """Greedy: argmax after the ban and the penalty (the first of equal largest logits, across chunks and within
    one), whatever the temperature; the penalty and the ban decide it here."""
    logits, history = case(dtype, seed=3)
    sampling = SamplingConfig(temperature=0, repetition_penalty=1.3, penalty_window=12)
    assert kernel_draw(logits, history, sampling, None) == torch_draw(logits, history, sampling, None)
    plain = SamplingConfig(temperature=0, repetition_penalty=1.0)
    top = int(logits.argmax())
    assert kernel_draw(logits, history, plain, None) == top  # the penalty decided the case above
    for tie in ([200, 70], [70, 71], [299, 3]):  # another chunk, the same chunk, the last (partial) chunk
        tied = logits.clone()
        tied[tie] = logits.max() + 1
        assert kernel_draw(tied, history, plain, None) == min(tie) == torch_draw(tied, history, plain, None)
    banned = dataclasses.replace(plain, banned_ids=(top,))
    assert kernel_draw(logits, history, banned, None) == torch_draw(logits, history, banned, None) != top
    # The window is the 12 entries before the position: its oldest is penalized, the position's own entry is not.
    oldest, second = int(history[POSITION - 12]), int(logits.argsort()[-2])
    history[POSITION] = second
    edged = logits.clone()
    edged[oldest] = logits.max() + 0.1
    edged[second] = logits.max() + 0.05
    assert oldest not in history[POSITION - 11 : POSITION] and second not in history[POSITION - 12 : POSITION]
    want = torch_draw(edged, history, sampling, None)
    assert want == second and kernel_draw(edged, history, sampling, None) == want


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=0, repetition_penalty=1.0), SAMPLED["paper"]],
                         ids=["greedy", "paper"])
def test_a_row_of_nans_draws_a_token_of_the_vocabulary(sampling, monkeypatch):
    """Logits all NaN (a model gone wrong) match no chunk's maximum: greedy read the chunks' argmax one entry past
    the last chunk (on a GPU, whatever memory lies there), an id that an embedding then fails a device assert on.
    The chunks' argmax entries here sit in a buffer whose next entry is 10**9, so such a read shows."""
    real_empty = torch.empty

    def empty(*shape, **kwargs):  # the chunks' argmax: the head of a longer buffer
        if kwargs.get("dtype") == torch.long:
            return torch.full((shape[0] + 8,), 10**9, dtype=torch.long)[: shape[0]]
        return real_empty(*shape, **kwargs)

    monkeypatch.setattr(triton_sampling.torch, "empty", empty)
    _, history = case(torch.float32)
    token = kernel_draw(torch.full((V,), float("nan")), history, sampling, None if sampling.greedy else 0.5)
    assert 0 <= token < V


def test_a_penalty_window_past_the_history_reads_the_history_once(monkeypatch):
    """A penalty window longer than the whole history (--penalty-window 10**12, meant as 'all the text') draws what a
    window of the history's length draws, and the prepare kernel loops over no more than the history: given the
    window as it was, each program ran 10**12 / WINDOW_BLOCK iterations a token (on a GPU, a run that never ends)."""
    import types

    import longswift.runtime.triton_kernels as tk

    real = tk.kernels()
    windows = []

    class Prepare:  # the prepare kernel, its `window` (args[9]) checked before the launch, which would not end
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                windows.append(args[9])
                assert args[9] <= args[1].numel()  # (args[1]: the history)
                return real.sample_prepare_kernel[grid](*args, **kwargs)
            return launch

    proxy = types.SimpleNamespace(**{**vars(real), "sample_prepare_kernel": Prepare()})
    monkeypatch.setattr(tk, "kernels", lambda: proxy)
    logits, history = case(torch.float32)
    for temperature, u in ((0, None), (0.7, 0.1), (0.7, 0.5), (0.7, 0.9)):
        sampling = SamplingConfig(temperature=temperature, min_p=0.02, repetition_penalty=1.4, penalty_window=10**12)
        whole = dataclasses.replace(sampling, penalty_window=history.numel())
        assert kernel_draw(logits, history, sampling, u) == kernel_draw(logits, history, whole, u)
    assert max(windows) == history.numel()


def test_only_what_the_kernels_take_is_given_to_them():
    """Top-k, top-p and eta keep the torch transform; float16 logits are refused; a sampled draw needs its
    uniform."""
    assert sampling_fits(SamplingConfig(), torch.float32) and sampling_fits(SamplingConfig(), torch.float64)
    for other in (SamplingConfig(top_k=5), SamplingConfig(top_p=0.9), SamplingConfig(eta=0.01)):
        assert not sampling_fits(other, torch.float32)
    assert not sampling_fits(SamplingConfig(), torch.float16)
    logits, history = case(torch.float32)
    params = sample_params(SamplingConfig(), torch.float32, CPU)
    with pytest.raises(ValueError, match="without top-k, top-p and eta"):
        sample(logits, history, torch.tensor([POSITION]), SamplingConfig(top_k=5), params, None,
               torch.tensor([0.5], dtype=torch.float64), torch.zeros(1, dtype=torch.long))
    with pytest.raises(ValueError, match="needs its uniform"):
        sample(logits, history, torch.tensor([POSITION]), SamplingConfig(), params, None, None,
               torch.zeros(1, dtype=torch.long))


def engine64(seed: int = 6):
    return longswift.load(tiny_hf_model("llama", "default", seed=seed), device="cpu", dtype="float64",
                          heads="random")


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=0, repetition_penalty=1.3, penalty_window=6,
                                                     banned_ids=(7, 11)),
                                      SamplingConfig(temperature=1.1, min_p=0.05, repetition_penalty=1.2,
                                                     penalty_window=9, banned_ids=(3,))],
                         ids=["greedy-penalty-ban", "min-p-penalty-ban"])
def test_a_sampled_body_with_the_kernels_draws_what_the_torch_body_draws(sampling, monkeypatch):
    """Token blocks through StepGraphs.sample_decode with --triton-kernels draw every token in the kernels (none
    of the torch draw's ops run in the body) and give the torch body's tokens and history, and its logits to
    float64's rounding (float64)."""
    import longswift.runtime.cuda_graphs as cg
    from longswift.runtime.blocks import sample_block

    calls = []
    monkeypatch.setattr(cg, "triton_sample", lambda *a: calls.append(1) or sample(*a))
    engine = engine64()
    prompt = torch.tensor([5, 9, 17, 3, 5, 9, 17, 4, 5, 9, 17])
    results = []
    for model in (engine.model, Transformer(engine.cfg, engine.model.state, triton_kernels=True)):
        cache = FullKVCache(engine.cfg, 64, torch.float64, CPU)
        logits, _ = model.prefill(prompt, cache, chunk=8)
        history = torch.zeros(64, dtype=torch.long)
        history[:11] = prompt
        graphs = StepGraphs(model, cache, capture=False, bucket=8, attention="bucketed")
        generator = torch.Generator().manual_seed(8)
        n, seen = 11, []
        for k in (5, 7):
            block = sample_block(model, cache, graphs, logits, history, n, k, sampling, generator, frozenset(),
                                 forward_last=True)
            seen.append((block.tokens, block.logits.clone()))
            n, logits = n + k, block.logits
        results.append((seen, history.clone()))
        if model.triton_kernels:
            assert graphs.sample_params is not None
            graphs.drawn_from.copy_(logits)
            with torch.inference_mode(), OpCount() as ops:
                graphs._draw(graphs._buffers(1)[0][1], graphs._buffers(1)[0][0])
            drawing = {"aten.softmax", "aten._softmax", "aten.cumsum", "aten.searchsorted", "aten.scatter_",
                       "aten.index_fill", "aten.where", "aten.argmax", "aten.index_copy_", "aten.index"}
            assert not drawing & ops.names.keys(), ops.names
    assert len(calls) == 12 + 1
    (plain, h1), (kernels, h2) = results
    assert torch.equal(h1, h2)
    for (t1, x1), (t2, x2) in zip(plain, kernels):
        assert t1 == t2
        torch.testing.assert_close(x1, x2, rtol=1e-12, atol=1e-12)  # (the kernels' norms sum in their own order)


def test_binding_a_config_the_kernels_do_not_take_draws_with_torch():
    engine = engine64()
    model = Transformer(engine.cfg, engine.model.state, triton_kernels=True)
    graphs = StepGraphs(model, FullKVCache(engine.cfg, 16, torch.float64, CPU), capture=False)
    graphs.bind_sampling(torch.zeros(16, dtype=torch.long), SamplingConfig(top_p=0.9))
    assert graphs.sample_params is None
    graphs.bind_sampling(torch.zeros(16, dtype=torch.long), SamplingConfig())
    assert graphs.sample_params is not None


@pytest.mark.parametrize("target", [80, 90])
@pytest.mark.parametrize("dtype", ["fp32", "fp64"])
def test_the_draw_compiles_for_ampere_and_hopper(target, dtype, monkeypatch):
    """The three kernels as `sample` launches them for the paper's sampling (penalty, ban, temperature, min-p),
    compiled here: the prepare kernel's barriers (after its copy, between the penalty's and the ban's scatters,
    before its reload; the reductions' own are not counted), and float32's divisions IEEE."""
    import triton.language as tl

    import longswift.runtime.triton_kernels as tk

    monkeypatch.delenv("TRITON_INTERPRET")
    k = tk._kernels(False)
    acc = {"fp32": tl.float32, "fp64": tl.float64}[dtype]
    common = {"CHUNK": 1024, "num_warps": 4, "enable_fp_fusion": False}
    barriers = {}
    for penalty, ban in ((True, True), (True, False), (False, True), (False, False)):
        prepare = compile_for(k.sample_prepare_kernel, target, {
            "logits": f"*{dtype}", "history": "*i64", "position_at": "*i64", "banned": "*i64", "params": f"*{dtype}",
            "scratch": f"*{dtype}", "part_max": f"*{dtype}", "part_arg": "*i64", "vocab": "i32", "window": "i32",
            "n_banned": "i32"}, {"WBLOCK": 256, "PENALTY": penalty, "BAN": ban, "SCALE": True, "ACC": acc, **common})
        ttgir = prepare.asm["ttgir"]  # (Triton 3.6, the lent GPU machine's, names the op gpu.barrier)
        barriers[penalty, ban] = ttgir.count("ttg.barrier") + ttgir.count("gpu.barrier")
    # after the copy, between the penalty's scatter and the ban's (a banned token in the window), before the reload
    assert barriers == {(True, True): 3, (True, False): 2, (False, True): 2, (False, False): 0}, barriers
    ptx = ""
    sums = {"source": f"*{dtype}", "part_max": f"*{dtype}", "part_sum": f"*{dtype}", "part_weight": "*fp64",
            "params": f"*{dtype}", "vocab": "i32", "parts": "i32"}
    for weights in (False, True):
        ptx += compile_for(k.sample_sums_kernel, target, sums, {"P_BLOCK": 128, "WEIGHTS": weights, "MIN_P": True,
                                                                 "ACCURATE": True, **common}).asm["ptx"]
    pick = {"source": f"*{dtype}", "part_max": f"*{dtype}", "part_arg": "*i64", "part_sum": f"*{dtype}",
            "part_weight": "*fp64", "params": f"*{dtype}", "u_at": "*fp64", "history": "*i64", "position_at": "*i64",
            "token_out": "*i64", "vocab": "i32", "parts": "i32"}
    for greedy in (False, True):
        ptx += compile_for(k.sample_pick_kernel, target, pick, {"P_BLOCK": 128, "GREEDY": greedy, "MIN_P": not greedy,
                                                                "ACCURATE": True, **common}).asm["ptx"]
    assert ("div.rn.f32" in ptx) == (dtype == "fp32")
    assert "div.full.f32" not in ptx and "div.approx.f32" not in ptx
