"""The memory plan counts the batched walk: transforming and drawing every row of a trie at once
allocates [N, V]-sized temporaries (a float32 copy, top-p's sort and order, the draw's float64 cdf),
which on an 8B model's 128K vocabulary and the paper's 128-row budget are about a GiB.

The peak is that of the live bytes the profiler records: each op's own allocations and each free,
summed in time order (what the CUDA allocator's peak counts on a GPU, tests/test_cuda.py)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_hf_model
from torch.profiler import ProfilerActivity, profile

from longswift.bench.grid import PRESETS
from longswift.config import SpecConfig
from longswift.runtime.memory import SAMPLING_BYTES_PER_LOGIT, plan_memory, sampling_bytes
from longswift.spec.tokenswift import tree_budget, walk_rows
from longswift.spec.tree import Trie
from longswift.spec.verify import batched_walk

N, V = 128, 49152  # the paper trie's padded budget, the embedded model's vocabulary


def trie_of(nodes: int) -> Trie:
    """A trie of exactly `nodes` nodes: a cartesian tree of threes, cut."""
    trie = Trie.with_root(7)
    trie.add_levels([[1, 2, 3]] * 5)
    for name in ("tokens", "parents", "depths", "children", "sources"):
        setattr(trie, name, getattr(trie, name)[:nodes])
    trie.children = [{t: c for t, c in ch.items() if c < nodes} for ch in trie.children]
    return trie


def measured_peak(preset: str, dtype: torch.dtype) -> int:
    """Peak live bytes allocated by a batched walk over [N, V] logits of `dtype` (beyond its inputs)."""
    history = torch.randint(0, V, (4096,), generator=torch.Generator().manual_seed(1))
    logits = (torch.randn(N, V, generator=torch.Generator().manual_seed(3)) * 4).to(dtype)
    trie, gen = trie_of(N), torch.Generator().manual_seed(2)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        batched_walk(trie, logits, history, 4000, PRESETS[preset], gen)
    live = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += event.self_cpu_memory_usage  # an op's own allocations; frees are events of their own
        peak = max(peak, live)
    assert abs(live) < 2**20, "the walk's allocations and frees should balance"
    return peak


@pytest.mark.parametrize("preset", ["paper", "top-p", "eta"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_batched_walks_peak_is_within_the_plans_bytes_per_logit(preset, dtype):
    peak = measured_peak(preset, dtype)
    assert peak > 8 * N * V, f"the measurement saw {peak / (N * V):.1f} bytes per logit: too little to be the walk's"
    assert peak <= SAMPLING_BYTES_PER_LOGIT * N * V, f"{peak / (N * V):.1f} bytes per logit"


def test_the_plan_grows_by_the_batched_walks_rows():
    from longswift.bench.shapes import shape_config

    cfg = shape_config("llama-3.1-8b")
    spec = SpecConfig(max_nodes=0).for_device(torch.device("cuda"))  # the paper's whole trie, walked batched
    nodes = tree_budget(spec)
    assert spec.walk == "batched" and walk_rows(spec) == 128 and nodes <= 128
    default = SpecConfig().for_device(torch.device("cuda"))  # the GPU's default: cut to 32 nodes
    assert walk_rows(default) == tree_budget(default) == 32

    def workspace(rows: int, float32_logits: bool = False) -> int:
        return plan_memory(cfg, torch.bfloat16, torch.device("cuda"), 104_096, 512, False, 4096, nodes,
                           float32_logits, rows).workspace

    assert workspace(128) - workspace(1) == sampling_bytes(cfg.vocab_size, 124, 2)  # rows 4 -> 128 in bf16
    assert sampling_bytes(cfg.vocab_size, 128, 2) > 2**30  # why it matters: a GiB on an 8B model
    assert workspace(128, True) - workspace(128) == 128 * cfg.vocab_size * 2  # float32 logits are wider
    assert walk_rows(SpecConfig(walk="rows").for_device(torch.device("cuda"))) == 1


def test_a_tokenswift_run_plans_its_batched_walk(monkeypatch):
    """The state hands the walk's rows to the plan it checks before allocating the cache."""
    import longswift
    import longswift.runtime.memory as memory

    seen = []
    real = memory.plan_memory

    def spy(*args, **kwargs):
        seen.append(args[9] if len(args) > 9 else kwargs.get("sampled_rows", 1))
        return real(*args, **kwargs)

    monkeypatch.setattr(memory, "plan_memory", spy)
    engine = longswift.load(tiny_hf_model(), dtype="float32", heads="random")
    # The CPU's tries: a full step's 1,1,1 and one n-gram path (7 nodes, padded to 8), a lookup step's up to 32
    for walk, suffix, rows in (("batched", True, 32), ("batched", False, 8), ("rows", True, 1)):
        seen.clear()
        engine.generate([1, 2, 3], method="tokenswift", spec=SpecConfig(walk=walk, suffix_lookup=suffix),
                        generation=longswift.GenerationConfig(max_new_tokens=4))
        assert seen[-1] == rows, (walk, suffix, seen)


if __name__ == "__main__":  # the table in docs/benchmarks.md: python tests/test_walk_memory.py
    for preset in ("paper", "top-p", "eta", "min-p", "greedy"):
        print(preset, *(f"{dtype} {measured_peak(preset, dtype) / (N * V):.1f}" for dtype in (torch.float32,
                                                                                             torch.bfloat16)), sep=" | ")


def test_the_rows_walk_plans_the_spine_the_verify_pass_computes_at_once(monkeypatch):
    """A review: once steps average 1.5 tokens the verify pass computes a large trie's spine in one LM-head pass
    (a lookup trie's copy: up to --lookup-nodes rows), while the plan counted the rows walk's logits as 4 rows (at
    --lookup-nodes 4096 about 768 MiB on the embedded model that the fits-or-refuse check did not see)."""
    import longswift
    from longswift.runtime.model import Transformer
    from longswift.spec.budget import held_logit_rows, run_plan

    engine = longswift.load(tiny_hf_model("llama", seed=0, max_position_embeddings=2048), dtype="float32",
                            heads="random", threads=1)
    most, logits = [0], Transformer.logits

    def counted(self, hidden):
        most[0] = max(most[0], hidden.shape[0])
        return logits(self, hidden)

    monkeypatch.setattr(Transformer, "logits", counted)
    spec = SpecConfig(tree="1,1,1", lookup_nodes=256, walk="rows")
    result = engine.generate([5, 6, 7, 8, 9, 10, 11, 12] * 40, spec=spec, max_new_tokens=300, ignore_eos=True,
                             temperature=0.0, repetition_penalty=1.0)
    assert result.stats.lookup_steps > 0
    resolved = spec.for_device(torch.device("cpu"))
    assert 16 < most[0] <= held_logit_rows(resolved) == 256  # a copy's spine, in one pass
    cfg, cpu = engine.cfg, torch.device("cpu")
    plan = run_plan(cfg, torch.float32, cpu, 700, 512, False, False, resolved)
    before = plan_memory(cfg, torch.float32, cpu, 700 + tree_budget(resolved), 512, False,
                         tree_nodes=tree_budget(resolved))  # what the plan counted before
    assert plan.workspace - before.workspace == 256 * cfg.vocab_size * 4
    assert held_logit_rows(SpecConfig(walk="batched").for_device(torch.device("cpu"))) == 0  # (walk_rows counts those)
