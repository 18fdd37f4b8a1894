"""The CUDA paths on a machine without CUDA (tests/fake_cuda.py: device tensors fake, host code real),
at the real shapes of the 7-8B models and the embedded one (two layers each): the forwards and step
bodies the loops run on CUDA take the CUDA kernels (flash, memory-efficient, colocated linears, fused
norms) with consistent shapes, dtypes and devices, and never read the device; the generation loops
read it only where the design says: once a token block, once for the draft's candidates, once for the
batched walk. tests/test_cuda.py checks values and graphs on a real GPU."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections import Counter
from functools import partial
from pathlib import Path

import pytest
import torch
from conftest import OpCount, run_cli, tiny_hf_model
from fake_cuda import fake_cuda, fake_heads, fake_state

import longswift
from longswift.bench.shapes import shape_config
from longswift.config import GenerationConfig, SamplingConfig, SpecConfig
from longswift.generate import ar_steps
from longswift.runtime.cache import FullKVCache, PartialKVCache
from longswift.runtime.cuda_graphs import StepGraphs, step_bodies
from longswift.runtime.model import Transformer
from longswift.sampling import banned_index
from longswift.spec.tokenswift import draft_logits, tokenswift_steps
from longswift.stats import GenerationStats

# runtime.linear.row_blocks tells colocated weights by their storages' data pointers, which fake tensors
# still give (one per storage), with a deprecation warning.
pytestmark = pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")

SHAPES = ["llama-3.1-8b", "qwen2.5-7b", "smollm2-135m"]
PAPER = SamplingConfig(temperature=1.0, min_p=0.1, repetition_penalty=1.2, penalty_window=1024)
FLASH_OPS = {"aten._flash_attention_forward", "aten._scaled_dot_product_flash_attention",
             "aten._scaled_dot_product_efficient_attention"}


def fake_model(shape: str, dtype: torch.dtype, float32_logits: bool = False):
    cfg = shape_config(shape, 2)
    return Transformer(cfg, fake_state(cfg.state_shapes(), dtype), pack=True, float32_logits=float32_logits)


@pytest.mark.parametrize("attention", ["length", "bucketed"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", SHAPES)
def test_the_cuda_forwards_run_at_real_shapes_without_reading_the_device(shape, dtype, attention, monkeypatch):
    with fake_cuda(monkeypatch) as fake:
        model = fake_model(shape, dtype)
        cfg, v = model.cfg, model.cfg.vocab_size
        assert model.device.type == "cuda" and model.colocated and step_bodies(model)
        heads = fake_heads(cfg.hidden_size, 3, cfg.rms_norm_eps, dtype)
        cache = FullKVCache(cfg, 2048, dtype, model.device)
        ops = OpCount()
        with ops:
            logits, hidden = model.prefill(torch.arange(300) % v, cache, 128)  # chunks of 128, 128, 44
            graphs = StepGraphs(model, cache, capture=False, attention=attention,
                                draft=partial(draft_logits, model, heads, 4))
            decoded, _ = graphs.decode(7, 300)
            tree = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 0, 1, 0, 1]],
                                dtype=torch.bool)
            verified, verified_hidden = graphs.forward([3, 4, 5, 6, 7], torch.arange(301, 306), tree, logits=True)
            cache.truncate(301)
            no_logits, hidden_only = graphs.forward([3, 4, 5, 6, 7], torch.arange(301, 306), tree, logits=False)
            cache.truncate(301)
            drafted, _ = graphs.draft(5, 301)
            cache.truncate(301)
            history = torch.zeros(2048, dtype=torch.long, device=model.device)
            graphs.bind_sampling(history, PAPER)
            sampled, _ = graphs.sample_decode(decoded, torch.rand(1, dtype=torch.float64).to(model.device), 301)
        acc = torch.promote_types(dtype, torch.float32)
        assert logits.shape == (v,) and logits.dtype == acc and logits.device.type == "cuda"
        assert hidden.shape == (cfg.hidden_size,) and decoded.shape == (v,)
        assert verified.shape == (8, v) and verified_hidden.shape == (8, cfg.hidden_size)  # padded to 8 nodes
        assert no_logits.shape == (0, cfg.hidden_size) and hidden_only.shape == (8, cfg.hidden_size)
        assert drafted.shape == (4, v) and sampled.shape == (v,)
        assert cache.length == 302
    assert fake.reads == [], fake.reads  # no body, and no prefill, reads the device
    flash = FLASH_OPS & set(ops.names)
    if dtype == torch.float32:  # CUDA's flash kernels take half types only: explicit products
        assert not flash, ops.names
    elif attention == "length":  # flash's variable-length kernel by the length in device memory
        assert {"aten._flash_attention_forward", "aten._scaled_dot_product_efficient_attention"} <= flash, flash
    else:
        assert {"aten._scaled_dot_product_flash_attention", "aten._scaled_dot_product_efficient_attention"} <= flash


def run_loop(fake, method: str, sampling: SamplingConfig, spec: SpecConfig, generated: list[int] | None = None,
             float32_logits: bool = False):
    """40 new tokens after a 300-token prompt on the 8B shape (two layers), blocks of 16, `generated`
    the tokens of a resumed run -> (stats, reads per package function, tokens per block read)."""
    model = fake_model("llama-3.1-8b", torch.bfloat16, float32_logits)
    cfg = model.cfg
    prompt, generated = list(range(5, 305)), generated or []
    stats = GenerationStats(method, len(prompt))
    gen, g, eos = GenerationConfig(max_new_tokens=40), torch.Generator().manual_seed(0), frozenset({2})
    if method == "ar":
        steps = ar_steps(model, prompt, sampling, gen, stats, eos, g, generated, read_every=16,
                         graph_attention="length")
    else:
        heads = fake_heads(cfg.hidden_size, 3, cfg.rms_norm_eps, torch.bfloat16)
        steps = tokenswift_steps(model, heads, prompt, sampling, gen, spec, stats, eos, g, generated, read_every=16,
                                 graph_attention="length")
    emitted = [t for block in steps for t in block]
    assert len(emitted) == 40 - len(generated) and stats.new_tokens == 40 - len(generated)
    sites = Counter(r.where.split(":")[0] for r in fake.reads)
    blocks = [r.shape[0] for r in fake.reads if r.where.startswith("sample_block:")]
    return stats, sites, blocks


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=0), PAPER], ids=["greedy", "paper"])
def test_ar_on_fake_cuda_reads_the_device_once_a_token_block(sampling, monkeypatch):
    with fake_cuda(monkeypatch) as fake:
        stats, sites, blocks = run_loop(fake, "ar", sampling, SpecConfig())
    assert sites == {"sample_block": 3} and blocks == [16, 16, 8], fake.reads


def test_a_resumed_ar_run_with_float32_logits_on_fake_cuda(monkeypatch):
    """A resume's prefill (the generated tokens fed as decoded rows) and the float32 LM head."""
    with fake_cuda(monkeypatch) as fake:
        stats, sites, blocks = run_loop(fake, "ar", PAPER, SpecConfig(), generated=[9] * 10, float32_logits=True)
    assert sites == {"sample_block": 2} and blocks == [16, 14], fake.reads


@pytest.mark.parametrize("draft_mode", ["paper", "fused"])
@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=0), PAPER], ids=["greedy", "paper"])
def test_tokenswift_on_fake_cuda_reads_the_device_once_a_block_or_stage(sampling, draft_mode, monkeypatch):
    """Every read is one of: the first token's draw, a plain token block's tokens, a draft pass's
    candidates (values and ids in one copy), the batched walk's draws (one per verify pass). The
    stand-in zeros make the steps' kinds arbitrary; each kind below must have run."""
    spec = SpecConfig(draft_mode=draft_mode, adaptive=False) if draft_mode == "fused" else SpecConfig()
    with fake_cuda(monkeypatch) as fake:
        stats, sites, blocks = run_loop(fake, "tokenswift", sampling, spec)
    drafted = stats.verify_steps - stats.lookup_steps
    assert stats.verify_steps > 0 and drafted > 0, vars(stats)
    assert set(sites) <= {"draw", "sample_block", "candidates", "batched_walk"}, fake.reads
    assert sites["draw"] == 1  # the first token, after the prefill
    assert sites["batched_walk"] == stats.verify_steps
    assert sites["candidates"] == drafted
    assert sum(blocks) == stats.plain_steps and all(1 <= b <= 16 for b in blocks)


def test_a_resumed_tokenswift_run_with_float32_logits_on_fake_cuda(monkeypatch):
    with fake_cuda(monkeypatch) as fake:
        stats, sites, blocks = run_loop(fake, "tokenswift", PAPER, SpecConfig(), generated=[9] * 10,
                                        float32_logits=True)
    assert "draw" not in sites  # the resumed run's root is its last generated token: no first draw
    assert sites["batched_walk"] == stats.verify_steps > 0 and sum(blocks) == stats.plain_steps


@pytest.mark.parametrize("draft_cache", ["dynamic", "static"])
def test_the_partial_cache_on_fake_cuda(draft_cache, monkeypatch):
    """Past the draft KV budget the paper mode drafts on the partial cache: selected by the root's
    queries on the full cache, then a window of recent entries refilled or restarted (its own step
    bodies, whose graphs it keeps). No read of the device beyond the draft's and the walk's."""
    spec = SpecConfig(draft_kv_budget=96, draft_window=8, attention_sinks=4, draft_cache=draft_cache, adaptive=False)
    selections, select = [], PartialKVCache.select
    monkeypatch.setattr(PartialKVCache, "select", lambda self, *a: selections.append(1) or select(self, *a))
    with fake_cuda(monkeypatch) as fake:
        stats, sites, blocks = run_loop(fake, "tokenswift", PAPER, spec)
    # 40 tokens through a window of 8: the dynamic cache selects again each time the window fills, the static once
    assert len(selections) > 1 if draft_cache == "dynamic" else len(selections) == 1, len(selections)
    assert stats.verify_steps == stats.steps - 1  # every step after the first token drafts (adaptive off)
    assert set(sites) == {"draw", "candidates", "batched_walk"}
    assert sites["candidates"] == sites["batched_walk"] == stats.verify_steps


@pytest.mark.parametrize("method", ["ar", "tokenswift"])
def test_a_model_file_loaded_onto_fake_cuda_generates_through_the_engine(method, monkeypatch, tmp_path):
    """The Python API as a GPU user calls it: a model directory loaded with device='cuda' (weights moved
    from the host, q/k/v colocated), random heads made on the device, the CUDA defaults (tokens read in
    blocks of 16), a whole generation; graphs off, which fake tensors cannot capture."""
    tiny_hf_model("llama", seed=3).save_pretrained(tmp_path / "m")
    with fake_cuda(monkeypatch) as fake:
        engine = longswift.load(tmp_path / "m", device="cuda", dtype="bfloat16", heads="random", cuda_graphs="off")
        assert engine.model.device.type == "cuda" and engine.model.colocated
        assert engine.heads.weights.device.type == "cuda" and engine.heads.weights.dtype == torch.bfloat16
        result = engine.generate([3, 4, 5], max_new_tokens=20, method=method, temperature=1.0, seed=1)
    assert result.token_ids == [0] * 20 and result.stats.new_tokens == 20  # read from the fake device: zeros
    sites = Counter(r.where.split(":")[0] for r in fake.reads)
    if method == "ar":
        assert sites == {"sample_block": 2}, fake.reads  # 16 tokens, then 4
    else:
        assert set(sites) <= {"draw", "sample_block", "candidates", "batched_walk"} and result.stats.verify_steps > 0


def test_generate_on_the_command_line_on_fake_cuda(monkeypatch, tmp_path, capsys):
    """`longswift generate --device cuda`, from the flags to the JSON written: what a GPU machine's first
    command runs, checked for the CUDA branches of the CLI and the memory plan (graphs off)."""
    tiny_hf_model("llama", seed=3).save_pretrained(tmp_path / "m")
    capsys.readouterr()
    with fake_cuda(monkeypatch) as fake:
        code, _, err = run_cli(capsys, "generate", "--model", str(tmp_path / "m"), "--device", "cuda", "--dtype",
                               "bfloat16", "--cuda-graphs", "off", "--heads", "random", "--prompt-ids", "3,4,5",
                               "--max-new-tokens", "20", "--json", str(tmp_path / "out.json"), "--no-progress")
    assert code == 0, err
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["stats"]["method"] == "tokenswift"
    # The tokens came from the fake device (whose reads answer zeros), not from a run that fell back to the CPU.
    assert result["token_ids"] == [0] * 20 and fake.reads


@pytest.mark.parametrize("attention", ["length", "bucketed"])
def test_bench_steps_rig_runs_its_cuda_steps_at_100k_tokens_on_fake_cuda(attention, monkeypatch):
    """bench-steps, the first measurement a lent GPU runs: its rig's AR step (eager and as the replayed
    body), draft pass, partial-cache refill, verify passes and walks on the 8B shape at 2K and 100K
    cached tokens, in the GPU's defaults (paper tree cut to 32 nodes, batched walk); fake tensors hold
    a 100K-token cache in no memory. (Timings here mean nothing; the GPU's are in docs/benchmarks.md.)"""
    from longswift.bench.steps import StepBenchConfig, StepRig, random_trie

    bench = StepBenchConfig(shape="llama-3.1-8b", layers=2, contexts=(2048, 100_000), tree_nodes=(1, 8, 32), reps=1,
                            warmup=0).for_device(torch.device("cuda"))
    with fake_cuda(monkeypatch) as fake:
        model = fake_model("llama-3.1-8b", torch.bfloat16)
        heads = fake_heads(model.cfg.hidden_size, 3, model.cfg.rms_norm_eps, torch.bfloat16)
        rig = StepRig(model, heads, bench, graphs=False, graph_attention=attention)
        gen = torch.Generator().manual_seed(0)
        tries = {n: random_trie(n, bench.depth, rig.root, gen) for n in bench.measured_nodes()}
        costs = [rig.measure(c, tries, lambda: None) for c in (2048, 100_000)]
    assert [c.context for c in costs] == [2048, 100_000]
    assert costs[0].reselect is None and costs[1].reselect is not None  # past the draft KV budget (4,096) at 100K
    assert all(c.ar_eager is not None and set(c.verify) == {1, 8, 32} and set(c.walk_batched) == {1, 8, 32}
               for c in costs)
    assert {r.where.split(":")[0] for r in fake.reads} <= {"draw", "candidates", "batched_walk", "lossless_walk"}


@pytest.mark.parametrize("method", ["ar", "tokenswift"])
def test_generation_with_cuda_graphs_on_captures_without_reading_the_device(method, monkeypatch, tmp_path):
    """--cuda-graphs on, as a GPU runs it by default: the step bodies are captured (FakeGraph runs the
    body once) and replayed; no capture reads the device (on a GPU that is an error), the generation's
    stats count every capture, and every replayed graph was captured first."""
    tiny_hf_model("llama", seed=3).save_pretrained(tmp_path / "m")
    with fake_cuda(monkeypatch) as fake:
        engine = longswift.load(tmp_path / "m", device="cuda", dtype="bfloat16", heads="random", cuda_graphs="on")
        result = engine.generate([3, 4, 5], max_new_tokens=40, method=method, temperature=1.0, seed=1,
                                 ignore_eos=True)  # (the ban's index tensor is made on the device, before a capture)
    assert result.token_ids == [0] * 40
    assert banned_index.held() == 0  # no fake tensor outlives the block
    assert fake.captured and fake.replays > 0
    assert result.stats.graph_captures == len(fake.captured)
    assert not [r for r in fake.reads if r.capturing], fake.reads


@pytest.mark.parametrize("attention", ["length", "bucketed"])
def test_decode_graphs_over_100k_tokens_on_the_8b_shape(attention, monkeypatch):
    """A 100K-token run after a 4K prompt on the 8B shape, a decode step every 512 slots: length captures
    one graph per doubling span (five: 8K, 16K, 32K, 64K, then the cache's capacity), bucketed one per
    1,024-slot bucket; a growing cache keeps only its current graph (the others are freed)."""
    from longswift.runtime.cuda_graphs import BUCKET, span_for

    slots = range(4096, 104_096, 512)
    with fake_cuda(monkeypatch) as fake:
        model = fake_model("llama-3.1-8b", torch.bfloat16)
        cache = FullKVCache(model.cfg, 104_096 + 8, torch.bfloat16, model.device)
        graphs = StepGraphs(model, cache, capture=True, attention=attention)
        for slot in slots:
            cache.length = slot
            graphs.decode(7, slot)
    expected = ({span_for(s + 1, BUCKET, cache.capacity) for s in slots} if attention == "length"
                else {s - s % BUCKET for s in slots})
    assert graphs.captures == len(fake.captured) == len(expected) == (5 if attention == "length" else 98)
    assert fake.replays == len(slots) and len(graphs.graphs) == 1
    assert fake.reads == []


def test_the_memory_plan_asks_the_planned_gpu_whether_flash_runs(monkeypatch):
    """A plan for cuda:1 asked the current GPU (cuda:0) for flash support: on a machine mixing an Ampere and
    an older GPU it counted the other one's attention transient."""
    import longswift.runtime.attention as attention
    from longswift.runtime.memory import plan_memory

    asked: list[int | None] = []
    monkeypatch.setattr(attention, "_flash_capable", lambda index: asked.append(index) or index != 1)
    cfg = shape_config("llama-3.1-8b", layers=2)
    on_1 = plan_memory(cfg, torch.bfloat16, torch.device("cuda:1"), 4096, 512, False, 0, 32)
    on_0 = plan_memory(cfg, torch.bfloat16, torch.device("cuda:0"), 4096, 512, False, 0, 32)
    assert asked == [1, 0]
    assert on_1.workspace > on_0.workspace  # no flash on cuda:1: its cached part is explicit


def test_a_refused_plan_names_the_rows_a_cuda_step_verifies(monkeypatch):
    """On CUDA the step bodies verify the trie padded to a node budget, which the plan counts: the refusal's
    advice named the unpadded count (101 nodes where 128 rows are verified)."""
    import longswift.runtime.memory as memory
    from longswift.spec.budget import run_plan

    cfg = shape_config("llama-3.1-8b", layers=2)
    spec = SpecConfig(max_nodes=0).for_device(torch.device("cuda"), 4)
    plan = run_plan(cfg, torch.bfloat16, torch.device("cuda"), 104_096, 512, False, False, spec)
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1 << 20)
    with pytest.raises(longswift.LongswiftError) as refused:
        plan.check(weights_loaded=True)
    assert f"a step verifies {plan.tree_nodes} nodes, padded to 128 rows on CUDA" in str(refused.value)
    assert plan.capacity_tokens == 104_096 + 128  # (what the plan counted)
    cpu = run_plan(cfg, torch.bfloat16, torch.device("cpu"), 104_096, 512, False, False, spec)
    with pytest.raises(longswift.LongswiftError, match=rf"a step verifies {cpu.tree_nodes} nodes\)"):
        cpu.check(weights_loaded=True)


def test_bodies_of_one_bucket_keep_each_others_graphs(monkeypatch):
    """A decode and a verify pass of one bucket keep each other's graphs (an eviction by `<=` re-captured
    both at every step on a GPU)."""
    with fake_cuda(monkeypatch):
        model = fake_model("smollm2-135m", torch.bfloat16)
        cache = FullKVCache(model.cfg, 4096, torch.bfloat16, model.device)
        graphs = StepGraphs(model, cache, capture=True, attention="bucketed")
        mask = torch.ones(3, 3, dtype=torch.bool).tril()
        for slot in (100, 200, 300):  # one bucket: a decode and a verify pass at each
            cache.length = slot
            graphs.decode(7, slot)
            graphs.forward([1, 2, 3], torch.arange(slot + 1, slot + 4), mask, logits=False)
    assert graphs.captures == 2 and len(graphs.graphs) == 2


TESTS = Path(__file__).resolve().parent
# What test_cuda.py's own checks skip for on the fake device (one GPU of compute capability 9.0, this torch).
FAKE_SKIPS = ("needs a second CUDA device", "--graph-attention length needs")


OWN_CODE_PARTS = 4  # one subprocess took 4 minutes, which CI's two workers now share


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU runs tests/test_cuda.py itself")
@pytest.mark.parametrize("part", range(OWN_CODE_PARTS))
def test_the_gpu_tests_own_code_runs_on_the_fake_device(tmp_path, part):
    """tests/test_cuda.py is skipped wherever CI runs, so a change to the package that breaks its code (a
    renamed argument, a moved helper) would first show on a lent GPU, whose minutes are few. Here each of
    its test functions (the first parametrization of each) runs on the fake device (tests/fake_cuda_run.py)
    and must pass or stop at one of its own asserts, whose values the fake device cannot give; any other
    error is code that would fail on the GPU too. In OWN_CODE_PARTS parts: every part's functions run."""
    from fake_cuda_parts import part_of  # not from fake_cuda_run, which fakes CUDA as it is imported

    report = tmp_path / "report.jsonl"
    env = {**os.environ, "FAKE_CUDA_REPORT": str(report), "FAKE_CUDA_ONE_EACH": "1",
           "FAKE_CUDA_PART": f"{part}/{OWN_CODE_PARTS}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "fake_cuda_run", "-p", "no:cacheprovider",
                          "tests/test_cuda.py"], cwd=TESTS.parent, env=env, capture_output=True, text=True, check=False,
                         timeout=1200)
    assert report.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    rows = [json.loads(line) for line in report.read_text().splitlines()]
    module = ast.parse((TESTS / "test_cuda.py").read_text())
    functions = set(part_of([f.name for f in module.body if isinstance(f, ast.FunctionDef)
                             and f.name.startswith("test_")], f"{part}/{OWN_CODE_PARTS}"))
    assert {row["id"].split("::")[1].split("[")[0] for row in rows} == functions, run.stdout[-3000:]
    for row in rows:
        if row["outcome"] == "skipped":
            assert any(reason in row["reason"] for reason in FAKE_SKIPS), row
        elif row["outcome"] == "failed":
            assert row["when"] == "call" and row["error"] == "AssertionError", (row, run.stdout[-6000:])
            assert row["where"].startswith("tests/"), (row, run.stdout[-6000:])  # an assert of the test's own
    assert sum(row["outcome"] == "passed" for row in rows) >= len(functions) // 2, rows


def test_a_test_that_leaves_cuda_faked_fails_by_name_and_the_next_finds_it_as_it_was(tmp_path):
    """conftest's guard: a test that replaces torch.cuda.is_available without restoring it (importing the
    fake-device plugin does) is the one that fails, and the tests after it on its worker see the real one."""
    (tmp_path / "test_leak.py").write_text(
        "import torch\n\n"
        "def test_a_leaks():\n    torch.cuda.is_available = lambda: True\n\n"
        "def test_b_finds_it_as_it_was():\n    assert torch.cuda.is_available.__module__ == 'torch.cuda'\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                          "test_leak.py"], cwd=tmp_path, env=env, capture_output=True, text=True, check=False,
                         timeout=300)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "2 passed, 1 error" in out, out  # test_a_leaks passes its call and errs at teardown
    assert "ERROR test_leak.py::test_a_leaks" in out and "left torch.cuda.is_available replaced" in out, out
