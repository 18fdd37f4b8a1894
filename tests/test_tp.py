"""Tensor parallelism: 2 gloo processes on tiny random models give the single process's logits
(float64, 1e-10) and its tokens, greedy and sampled, AR and TokenSwift; shapes that cannot be split
are refused in one line. One spawn runs every case (each process pays the imports once)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import tiny_hf_model

import longswift
from longswift import GenerationConfig, LongswiftError, SamplingConfig, SpecConfig
from longswift.runtime.cache import FullKVCache, PartialKVCache
from longswift.runtime.loading import load_config
from longswift.runtime.parallel import plan_shards, working_world_sizes

WORLD = 2
GREEDY = SamplingConfig(temperature=0, repetition_penalty=1.0)
SAMPLED = SamplingConfig(seed=12, top_p=0.85, min_p=0.05, repetition_penalty=1.2, penalty_window=8)
SPECS = {  # full steps only, except "adaptive" (timings differ per rank: rank 0 decides)
    "paper": SpecConfig(tree="1,3,3,3", ngram_topk=20, adaptive=False),
    "partial": SpecConfig(tree="3,2,2,2", ngram_topk=4, draft_kv_budget=40, draft_window=8, attention_sinks=4,
                          adaptive=False),
    "fused": SpecConfig(tree="1,4,2", draft_mode="fused", adaptive=False),
    "adaptive": SpecConfig(tree="1,2,2", ngram_topk=2),
}
# name -> (tiny_hf_model arguments, what to run). GQA 4:2 splits the KV heads; 4:1 replicates the one.
MODELS = {
    "gqa": dict(arch="llama", rope="yarn", seed=31, vocab=24),
    "mqa": dict(arch="llama", rope="default", seed=5, vocab=24, num_key_value_heads=1),
    "bias": dict(arch="llama", seed=7, vocab=50, attention_bias=True, mlp_bias=True),  # o/down bias after all_reduce
    "qwen3": dict(arch="qwen3", seed=9, vocab=51),  # qk-norm; odd vocab: the LM head's last block is padded
    "tied": dict(arch="qwen2", seed=13, vocab=49, tie=True),  # qkv bias; the LM head is a block of the embedding
}
GENERATIONS = [  # (model, method, spec, sampling)
    ("gqa", "ar", None, "greedy"), ("gqa", "ar", None, "sampled"),
    ("gqa", "tokenswift", "paper", "greedy"), ("gqa", "tokenswift", "paper", "sampled"),
    ("gqa", "tokenswift", "partial", "greedy"), ("gqa", "tokenswift", "partial", "sampled"),
    ("gqa", "tokenswift", "fused", "greedy"), ("gqa", "tokenswift", "adaptive", "sampled"),
    ("mqa", "tokenswift", "partial", "greedy"), ("mqa", "ar", None, "sampled"),
]


def prompt(seed: int, vocab: int, length: int = 44) -> list[int]:
    """Repeats in the prompt give the n-gram table something to offer."""
    g = torch.Generator().manual_seed(seed)
    motif = torch.randint(3, vocab, (5,), generator=g).tolist()
    noise = torch.randint(3, vocab, (length,), generator=g).tolist()
    return [motif[i % 5] if i % 7 else noise[i] for i in range(length)]


def engine(name: str, tensor_parallel: bool, dtype: str = "float64", **kwargs) -> longswift.Engine:
    args = dict(MODELS[name])
    torch_dtype = getattr(torch, dtype)
    hf = tiny_hf_model(args.pop("arch"), args.pop("rope", "default"), dtype=torch_dtype, **args)
    return longswift.load(hf, dtype=dtype, heads="random", tensor_parallel=tensor_parallel, **kwargs)


def forward_logits(e: longswift.Engine) -> torch.Tensor:
    """Prefill 20 tokens, then 6 tree nodes under a tree mask on the cache: logits [26, V]."""
    model = e.model
    ids = torch.tensor(prompt(1, e.cfg.vocab_size, 26))
    cache = FullKVCache(model.cfg, 32, model.dtype, model.device)
    first, _ = model.forward(ids[:20], torch.arange(20), cache)
    mask = torch.tensor([[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 0, 1, 0, 0, 0], [1, 1, 0, 1, 0, 0],
                         [1, 0, 1, 0, 1, 0], [1, 1, 0, 1, 0, 1]], dtype=torch.bool)
    depth = torch.tensor([0, 1, 1, 2, 2, 3])
    tree, _ = model.forward(ids[20:], 20 + depth, cache, tree_mask=mask)
    return torch.cat([first, tree])


def partial_selection(e: longswift.Engine) -> torch.Tensor:
    """The slots a partial cache selects after a 40-token prefill: [L, Hkv on this rank, 4 + 12]."""
    model = e.model
    ids = torch.tensor(prompt(2, e.cfg.vocab_size, 41))
    full = FullKVCache(model.cfg, 48, model.dtype, model.device)
    model.forward(ids[:40], torch.arange(40), full)
    queries: list[torch.Tensor] = []
    model.forward(ids[40:], torch.tensor([40]), full, queries=queries)
    partial = PartialKVCache(model.cfg, 24, 4, 8, model.dtype, model.device,
                             reduce_scores=model.tp.kv_score_reduce() if model.tp else None)
    partial.select(full, queries)
    return partial.positions


def save_models(saved: Path) -> Path:
    """MODELS saved in float64 as HF directories of several weights files each; `saved`."""
    for name in MODELS:
        args = dict(MODELS[name])
        hf = tiny_hf_model(args.pop("arch"), args.pop("rope", "default"), dtype=torch.float64, **args)
        hf.save_pretrained(saved / name, max_shard_size="40KB")
    return saved


def run_cases(tensor_parallel: bool, saved: Path) -> dict:
    """Everything the test compares; the same calls in one process and on every rank (`saved`: save_models')."""
    out: dict = {}
    for name in MODELS:
        out[f"logits/{name}"] = forward_logits(engine(name, tensor_parallel))
    for name in MODELS:  # from a directory, in shards (save_models): cut to each rank's part as read
        e = longswift.load(saved / name, dtype="float64", heads=None, tensor_parallel=tensor_parallel)
        out[f"logits/dir-{name}"] = forward_logits(e)
    out["logits/packed-float32"] = forward_logits(engine("gqa", tensor_parallel, "float32", pack_weights=True))
    engines = {name: engine(name, tensor_parallel) for name in ("gqa", "mqa")}
    # Rank 0 alone draws: the other ranks get another seed, and must still emit rank 0's tokens.
    sampled = SAMPLED if not tensor_parallel else dataclasses.replace(SAMPLED, seed=SAMPLED.seed + 1000 * dist.get_rank())
    for name, e in engines.items():  # what this rank holds: its heads and their KV cache only
        cache = FullKVCache(e.model.cfg, 8, e.model.dtype, e.model.device)
        out[f"shard/{name}"] = (e.model.cfg.num_heads, tuple(cache.k.shape), e.model.cfg.intermediate_size,
                                tuple(e.model.state["lm_head.weight"].shape))
        out[f"select/{name}"] = partial_selection(e)
    if tensor_parallel:  # rank 1 asked for another generation: refused on both ranks, the group still usable
        e, ids = engines["gqa"], prompt(3, engines["gqa"].cfg.vocab_size, 12)
        for name, other, method in (("tokens", [ids[1], *ids[1:]], "tokenswift"), ("length", [*ids, 5], "tokenswift"),
                                    ("method", ids, "ar")):
            try:
                e.generate(other if dist.get_rank() == 1 else ids, sampling=GREEDY, spec=SPECS["paper"],
                           generation=GenerationConfig(max_new_tokens=8),
                           method=method if dist.get_rank() == 1 else "tokenswift")
            except LongswiftError as exc:
                out[f"differ/{name}"] = f"{type(exc).__name__}: {exc}"  # (Agreed: the CLI says it once)
        # rank 1 loaded another model, dtype or rope scaling: refused on both ranks, before any of the model's
        # collectives (another dtype's size aborted gloo; the others wrote other tokens with exit 0)
        other = dist.get_rank() == 1
        for name, kwargs in (("model", {"seed": 1 if other else 0}),
                             ("dtype", {"dtype": "float32" if other else "float64"}),
                             ("rope", {"rope_scaling": "linear:2" if other else None})):
            hf = tiny_hf_model("llama", seed=kwargs.pop("seed", 0))
            try:
                longswift.load(hf, heads=None, tensor_parallel=True, **{"dtype": "float64", **kwargs})
            except LongswiftError as exc:
                out[f"load-differ/{name}"] = f"{type(exc).__name__}: {exc}"
    for model, method, spec, sampling in GENERATIONS:
        e = engines[model]
        r = e.generate(prompt(3, e.cfg.vocab_size), sampling=GREEDY if sampling == "greedy" else sampled,
                       generation=GenerationConfig(max_new_tokens=60, ignore_eos=True), method=method,
                       spec=SPECS.get(spec))
        out[f"gen/{model}/{method}/{spec}/{sampling}"] = (r.token_ids, r.stats.steps, r.stats.accepted_tokens)
    if tensor_parallel:
        try:
            _refused()
        except LongswiftError as exc:
            out["refusal"] = str(exc)
    return out


def _refused() -> None:
    """6 heads / 3 KV heads cannot be split across 2 ranks."""
    hf = tiny_hf_model("llama", num_attention_heads=6, num_key_value_heads=3, head_dim=8, hidden_size=48)
    longswift.load(hf, dtype="float64", heads=None, tensor_parallel=True)


def _worker(rank: int, store: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    # A rank that left the common control flow would wait in a collective: fail after a minute instead.
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=60))
    try:
        out = run_cases(tensor_parallel=True, saved=Path(out_dir) / "saved")
        out["stopped"] = _stop_on_rank_0(Path(out_dir))
        out["stopped-rank-1"] = _stop_on(1, Path(out_dir) / "by-rank-1", max_new_tokens=30)
        out["stopped-last-step"] = _stop_on(0, Path(out_dir) / "last-step", max_new_tokens=1)
        torch.save(out, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _stop_on_rank_0(tmp: Path) -> int:
    """The CLI's loop when rank 0 alone got SIGTERM (before its first token): its exit status on this rank."""
    from longswift.cli.outputs import Outputs, write_run
    from longswift.cli.stop import StopRequest

    e = engine("gqa", tensor_parallel=True)
    stop = StopRequest()  # not entered: no handlers; the signal is set by hand
    stop.signum = signal.SIGTERM if dist.get_rank() == 0 else None
    stream = e.stream(prompt(3, e.cfg.vocab_size), sampling=GREEDY, spec=SPECS["paper"],
                      generation=GenerationConfig(max_new_tokens=30, ignore_eos=True))
    return write_run(e, stream, Outputs(None, tmp / "stopped.json", tmp / "stopped.ckpt", 1024), stop, no_progress=True)


def _stop_on(signalled: int, tmp: Path, max_new_tokens: int) -> tuple[int, int | None]:
    """The CLI's loop when only rank `signalled` got SIGTERM (a kill of one process's pid), before its first
    token: this rank's exit status, and the tokens of the checkpoint rank 0 saved (None: none)."""
    from longswift.checkpoint import read_checkpoint
    from longswift.cli.outputs import Outputs, write_run
    from longswift.cli.stop import StopRequest

    tmp.mkdir(exist_ok=True)
    e = engine("gqa", tensor_parallel=True)
    stop = StopRequest()  # not entered: no handlers; the signal is set by hand
    stop.signum = signal.SIGTERM if dist.get_rank() == signalled else None
    stream = e.stream(prompt(3, e.cfg.vocab_size), sampling=GREEDY, spec=SPECS["paper"],
                      generation=GenerationConfig(max_new_tokens=max_new_tokens, ignore_eos=True))
    code = write_run(e, stream, Outputs(None, tmp / "run.json", None, 1024), stop, no_progress=True)
    dist.barrier()
    saved = tmp / "run.json.checkpoint.json"
    return code, len(read_checkpoint(saved).token_ids) if saved.exists() else None


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("tp")
    save_models(tmp / "saved")
    mp.spawn(_worker, args=(str(tmp / "store"), str(tmp)), nprocs=WORLD, join=True)
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> dict:
    return run_cases(tensor_parallel=False, saved=save_models(tmp_path_factory.mktemp("single")))


@pytest.mark.parametrize("name", [*MODELS, "packed-float32", *(f"dir-{name}" for name in MODELS)])
def test_logits_match_one_process(ranks, single, name):
    tol = dict(rtol=1e-5, atol=1e-5) if name == "packed-float32" else dict(rtol=1e-10, atol=1e-10)
    for r in ranks:
        torch.testing.assert_close(r[f"logits/{name}"], single[f"logits/{name}"], **tol)
        if name.startswith("dir-"):  # (the model as saved and read back: the same weights)
            torch.testing.assert_close(r[f"logits/{name}"], single[f"logits/{name[4:]}"], **tol)


@pytest.mark.parametrize("key", [f"gen/{m}/{a}/{s}/{p}" for m, a, s, p in GENERATIONS])
def test_tokens_match_one_process(ranks, single, key):
    tokens, steps, accepted = single[key]
    assert len(tokens) == 60
    for r in ranks:
        assert r[key][0] == tokens  # same tokens on every rank (rank 0 drew them) and as one process
        if "adaptive" not in key:  # same drafts too: same trie, same accepted path, same steps
            assert r[key][1:] == (steps, accepted)
    if "tokenswift" in key and "greedy" in key:
        assert accepted > 0  # the trie was exercised


def test_each_rank_holds_its_heads_and_their_kv_cache(ranks, single):
    # 4 heads, 2 KV heads (gqa) or 1 (mqa), 2 layers, head_dim 16, intermediate 96, vocabulary 24, hidden 64
    assert single["shard/gqa"] == (4, (2, 2, 8, 16), 96, (24, 64))
    assert single["shard/mqa"] == (4, (2, 1, 8, 16), 96, (24, 64))
    for r in ranks:
        assert r["shard/gqa"] == (2, (2, 1, 8, 16), 48, (12, 64))  # KV heads split
        assert r["shard/mqa"] == (2, (2, 1, 8, 16), 48, (12, 64))  # the one KV head replicated


def test_partial_cache_selects_what_one_process_selects(ranks, single):
    # Split KV heads: rank r holds KV head r. The replicated head pools the scores of both ranks' queries.
    for r, rank in enumerate(ranks):
        assert torch.equal(rank["select/gqa"], single["select/gqa"][:, r : r + 1])
        assert torch.equal(rank["select/mqa"], single["select/mqa"])


@pytest.mark.parametrize("name", ["tokens", "length", "method"])
def test_ranks_given_different_generations_are_refused_together(ranks, name):
    # Before: other tokens gave every rank the same wrong output, another length aborted gloo, another method hung.
    for r in ranks:  # and the generations after these ran (test_tokens_match_one_process)
        assert r[f"differ/{name}"] == ("AgreedError: the processes of this run were given different prompts, methods or "
                                       "settings (rank 1's differ from rank 0's): every rank must make the same calls with the "
                                       "same arguments")


@pytest.mark.parametrize("name", ["model", "dtype", "rope"])
def test_ranks_that_loaded_different_models_or_settings_are_refused_together(ranks, name):
    # Before: another model or rope scaling wrote other tokens with exit 0; another dtype aborted gloo.
    for r in ranks:
        assert r[f"load-differ/{name}"] == ("AgreedError: the processes of this run were given different models, dtypes or "
                                            "rope scalings (rank 1's differ from rank 0's): every rank must make the same "
                                            "calls with the same arguments")


def test_every_rank_stops_with_rank_0s_exit_status(ranks):
    # Rank 0 stops at its SIGTERM after one step and saves; rank 1, told to stop, exits as it does (it said 128).
    assert [r["stopped"] for r in ranks] == [128 + signal.SIGTERM] * WORLD


def test_a_signal_that_reaches_one_process_stops_every_rank(ranks):
    """A SIGTERM sent to rank 1's pid alone was ignored (rank 0 alone decided, and rank 1 broadcast nothing): every
    rank now stops after the same step, at a signal any of them got, and rank 0 saves the run's state."""
    assert [r["stopped-rank-1"] for r in ranks] == [(128 + signal.SIGTERM, 1)] * WORLD


def test_a_signal_during_the_last_step_ends_every_rank_with_status_0(ranks):
    """A signal in the run's last step: rank 0 finishes the run (complete, nothing to save) and exits 0; rank 1
    exited 143, which torchrun reports as a failed process of a run that finished."""
    assert [r["stopped-last-step"] for r in ranks] == [(0, None)] * WORLD


def test_unsplittable_gqa_is_refused_in_one_line(ranks):
    for r in ranks:
        assert r["refusal"] == ("cannot run this model on 2 processes: its 3 KV heads neither split into 2 parts "
                                "nor divide 2; world sizes that work: 1, 3, 6")


def _engine_whose_rank_1_fails(rank: int, store: str):
    """This rank's engine in a group of WORLD (a 60 s timeout); on rank 1 its fifth draw raises."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=60))
    e = engine("gqa", tensor_parallel=True)
    if rank == 1:
        draws = iter(range(4))
        real = e.model.tp.draw
        e.model.tp.draw = lambda *args: real(*args) if next(draws, None) is not None else 1 / 0
    return e


def _lose_rank_1(rank: int, store: str, out_dir: str) -> None:
    """Rank 1 fails inside a step (its fifth draw raises) and leaves; rank 0, waiting in a collective
    for it, records what it raised (it would wait out the 60 s timeout if the failure went unnoticed)."""
    e = _engine_whose_rank_1_fails(rank, store)
    try:
        e.generate(prompt(3, e.cfg.vocab_size), sampling=GREEDY, spec=SPECS["paper"],
                   generation=GenerationConfig(max_new_tokens=20, ignore_eos=True))
    except Exception as exc:
        (Path(out_dir) / f"rank{rank}.txt").write_text(f"{type(exc).__name__}: {exc}")
    if rank == 1:
        dist.destroy_process_group()  # closes its connections; rank 0 leaves its broken group as it is


def test_a_rank_that_fails_stops_the_others_in_one_line(tmp_path):
    """A rank that fails mid-generation stops the others at their next collective with one line
    (gloo's own error is a RuntimeError whose text names a C++ source file), not a hang."""
    ctx = mp.spawn(_lose_rank_1, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD, join=False)
    for p in ctx.processes:  # exit codes are not checked: gloo may abort a process whose peer left at its exit
        p.join(timeout=240)
    assert (tmp_path / "rank1.txt").read_text() == "ZeroDivisionError: division by zero"
    lost = (tmp_path / "rank0.txt").read_text()
    assert lost.startswith("LostContact: lost contact with the other processes of this run (Connection closed")
    assert lost.endswith("): one of them failed or stopped (an error it printed, a stop, its output closed, or it "
                         "was killed)") and "\n" not in lost


def _short_of_memory_on_rank_1(rank: int, store: str, out_dir: str) -> None:
    """Rank 1 alone sees too little free memory for the run's cache (another job on its GPU): what each rank raised,
    and the tokens of the run each then makes with enough memory."""
    import longswift.runtime.memory as memory

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=30))
    e = engine("gqa", tensor_parallel=True)
    out: dict = {}
    real = memory.available_bytes
    if rank == 1:
        memory.available_bytes = lambda device: 1024
    try:
        e.generate(prompt(3, e.cfg.vocab_size), sampling=GREEDY, generation=GenerationConfig(max_new_tokens=20))
    except LongswiftError as exc:
        out["refused"] = f"{type(exc).__name__}: {exc}"
    memory.available_bytes = real
    try:
        out["after"] = e.generate(prompt(3, e.cfg.vocab_size), sampling=GREEDY,
                                  generation=GenerationConfig(max_new_tokens=8, ignore_eos=True)).token_ids
    except LongswiftError as exc:
        out["after"] = f"{type(exc).__name__}: {exc}"
    torch.save(out, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


def test_a_run_one_rank_has_no_memory_for_is_refused_on_every_rank(tmp_path):
    """Each rank checks its own free memory before its cache is made: rank 1 refused while rank 0 went on into the
    prefill's collectives and waited there until the group's timeout (30 min by default), which broke the group."""
    ctx = mp.spawn(_short_of_memory_on_rank_1, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD,
                   join=False)
    for p in ctx.processes:
        p.join(timeout=240)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    assert ranks[0]["refused"] == ranks[1]["refused"], ranks  # one message, the same on every rank
    assert re.fullmatch(r"AgreedError: on rank 1 of this run's processes: not enough memory: this run needs .* but "
                        r"1\.0 KiB is free; lower max_new_tokens or the prompt length, or use a smaller dtype.*",
                        ranks[0]["refused"]), ranks[0]
    assert ranks[0]["after"] == ranks[1]["after"] and len(ranks[0]["after"]) == 8, ranks  # the group still works


def _lose_rank_1_in_the_cli(rank: int, store: str, out_dir: str) -> None:
    """As _lose_rank_1, with the CLI's loop writing rank 0's outputs: what rank 0 raised, and the checkpoint's
    tokens."""
    from longswift.checkpoint import read_checkpoint
    from longswift.cli.outputs import Outputs, write_run
    from longswift.cli.stop import StopRequest

    e = _engine_whose_rank_1_fails(rank, store)
    out = Path(out_dir)
    stream = e.stream(prompt(3, e.cfg.vocab_size), sampling=SAMPLED, spec=SPECS["paper"],
                      generation=GenerationConfig(max_new_tokens=20, ignore_eos=True))
    try:
        write_run(e, stream, Outputs(out / "run.txt", None, None, 1024), StopRequest(), no_progress=True)
    except Exception as exc:
        (out / f"rank{rank}.txt").write_text(f"{type(exc).__name__}: {exc}")
    if rank == 0:
        torch.save(read_checkpoint(out / "run.txt.checkpoint.json").token_ids, out / "saved.pt")
    if rank == 1:
        dist.destroy_process_group()


def test_a_run_that_loses_a_process_saves_its_state_on_rank_0(tmp_path, monkeypatch):
    """A process of the run dies (an OOM kill, a failed GPU): rank 0 holds the tokens and the generator's state of
    the last whole step, and saves them as an interrupted run's, which one process resumes to the uninterrupted
    run's tokens. Before, the run's state was lost with the error."""
    monkeypatch.chdir(tmp_path)
    ctx = mp.spawn(_lose_rank_1_in_the_cli, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD, join=False)
    for p in ctx.processes:
        p.join(timeout=240)
    assert (tmp_path / "rank1.txt").read_text() == "ZeroDivisionError: division by zero"
    lost = (tmp_path / "rank0.txt").read_text()
    saved = torch.load(tmp_path / "saved.pt")
    assert 1 <= len(saved) < 20, saved
    assert lost.startswith("LongswiftError: lost contact with the other processes of this run ("), lost
    assert lost.endswith(f"; state saved at {len(saved)} of 20 tokens to 'run.txt.checkpoint.json': continue with: "
                         "longswift generate --resume run.txt.checkpoint.json") and "\n" not in lost, lost
    assert not (tmp_path / "run.txt").exists()
    e = engine("gqa", tensor_parallel=False)
    whole = e.generate(prompt(3, e.cfg.vocab_size), sampling=SAMPLED, spec=SPECS["paper"],
                       generation=GenerationConfig(max_new_tokens=20, ignore_eos=True))
    assert saved == whole.token_ids[:len(saved)]
    resumed = e.resume(tmp_path / "run.txt.checkpoint.json")
    for _ in resumed:
        pass
    assert resumed.result.token_ids == whole.token_ids


def _cfg(**fields) -> longswift.ModelConfig:
    base = longswift.ModelConfig(
        architecture="llama", vocab_size=100, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=8,
        num_kv_heads=2, head_dim=8, rms_norm_eps=1e-6, max_position_embeddings=32, tie_word_embeddings=False,
        qkv_bias=False, o_bias=False, mlp_bias=False, qk_norm=False, sliding_window=None, rope_type="default",
        eos_token_ids=(2,))
    return dataclasses.replace(base, **fields)


@pytest.mark.parametrize("fields,world", [({}, 2), ({}, 4), ({}, 8), ({"num_kv_heads": 8}, 4),
                                          ({"num_kv_heads": 1}, 8), ({"vocab_size": 101}, 4)])
def test_plans_partition_the_model(fields, world):
    cfg = _cfg(**fields)
    plans = [plan_shards(cfg, r, world) for r in range(world)]
    g = cfg.group_size
    assert [p.heads for p in plans] == [(r * cfg.num_heads // world, (r + 1) * cfg.num_heads // world)
                                        for r in range(world)]
    for p in plans:  # every query head of the block reads a KV head the rank holds
        assert p.kv_heads[0] <= p.heads[0] // g and (p.heads[1] - 1) // g < p.kv_heads[1]
        assert p.kv_replicas == max(1, world // cfg.num_kv_heads)
    assert {k for p in plans for k in range(*p.kv_heads)} == set(range(cfg.num_kv_heads))
    assert [i for p in plans for i in range(*p.intermediate)] == list(range(cfg.intermediate_size))
    assert [v for p in plans for v in range(*p.vocab)] == list(range(cfg.vocab_size))
    assert all(p.vocab[1] - p.vocab[0] <= p.vocab_per_rank for p in plans)


@pytest.mark.parametrize("fields,world,why", [
    ({"num_heads": 6, "num_kv_heads": 3}, 4, "its 6 attention heads do not split into 4 equal parts"),
    ({"intermediate_size": 90}, 4, "its intermediate size 90 does not split into 4 equal parts"),
    ({"num_heads": 6, "num_kv_heads": 3}, 2, "its 3 KV heads neither split into 2 parts nor divide 2"),
])
def test_refusals_name_the_world_sizes_that_work(fields, world, why):
    cfg = _cfg(**fields)
    with pytest.raises(LongswiftError) as info:
        plan_shards(cfg, 0, world)
    sizes = ", ".join(map(str, working_world_sizes(cfg)))
    assert str(info.value) == f"cannot run this model on {world} processes: {why}; world sizes that work: {sizes}"
    assert "\n" not in str(info.value) and world not in working_world_sizes(cfg)


def _config_dir(path: Path, **fields) -> str:
    """A model directory holding config.json (what generate plans from before loading) and an empty weights
    file (load_config checks that a directory's weight files are there, not what they hold)."""
    from transformers import AutoConfig

    shape = dict(vocab_size=1000, hidden_size=512, intermediate_size=2048, num_hidden_layers=4, num_attention_heads=8,
                 num_key_value_heads=2, head_dim=64, max_position_embeddings=256)
    AutoConfig.for_model("llama", **{**shape, **fields}).save_pretrained(path)
    (path / "model.safetensors").touch()
    return str(path)


def test_torchrun_refuses_a_model_that_does_not_split_before_loading(tmp_path, monkeypatch):
    # It was refused by TensorParallel, once every process had read the whole checkpoint.
    from longswift.cli.generate import _plan_before_loading

    monkeypatch.setenv("WORLD_SIZE", "4")
    model = _config_dir(tmp_path, hidden_size=384, num_attention_heads=6, num_key_value_heads=3, intermediate_size=1536)
    with pytest.raises(LongswiftError, match="^cannot run this model on 4 processes: its 6 attention heads do not "
                                             "split into 4 equal parts; world sizes that work: 1, 3, 6$"):
        _plan_before_loading(load_config(model), longswift.RuntimeConfig(device="cpu"),
                             GenerationConfig(max_new_tokens=8), 9)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_torchrun_plans_one_processs_shard_on_cuda(tmp_path, monkeypatch, device):
    """A GPU holds its process's shard: the plan counted the whole model, refusing the models that
    need several GPUs. On a CPU the processes share the host's memory: the whole model is counted."""
    from longswift.cli.generate import _plan_before_loading
    from longswift.config import RuntimeConfig
    from longswift.runtime.parallel import shard_config

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr("longswift.runtime.memory.available_bytes", lambda _device: 1)
    monkeypatch.setattr(RuntimeConfig, "torch_device",
                        lambda self: torch.device(device if self.device in ("auto", "cuda") else self.device))
    monkeypatch.setattr("longswift.config.runtime._cuda", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    model = _config_dir(tmp_path)
    cfg = load_config(model)
    held = shard_config(cfg, plan_shards(cfg, 0, 2)) if device == "cuda" else cfg
    if device == "cuda":
        assert held.parameter_count() < 0.6 * cfg.parameter_count()  # the two figures differ at 0.01 GiB
    with pytest.raises(LongswiftError) as info:
        _plan_before_loading(cfg, RuntimeConfig(dtype="float32"), GenerationConfig(max_new_tokens=8), 9)
    assert f"(weights {held.parameter_count() * 4 / 1024**3:.2f} GiB + " in str(info.value)


def test_torchrun_plans_each_process_on_its_own_gpu(tmp_path, monkeypatch):
    """Before the model loads, each process's memory check read the current GPU, cuda:0 for every process (and set
    up CUDA there): K-1 extra contexts on GPU 0, and each process judged by GPU 0's free memory, not its own."""
    from longswift.cli.generate import _plan_before_loading
    from longswift.config import RuntimeConfig

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    asked = []
    monkeypatch.setattr("longswift.runtime.memory.available_bytes", lambda device: asked.append(device) or 1)
    monkeypatch.setattr(RuntimeConfig, "torch_device",
                        lambda self: torch.device("cuda" if self.device in ("auto", "cuda") else self.device))
    monkeypatch.setattr("longswift.config.runtime._cuda", lambda: True)
    monkeypatch.setattr("longswift.config.runtime._cuda_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(LongswiftError, match="not enough memory"):
        _plan_before_loading(load_config(_config_dir(tmp_path)), RuntimeConfig(dtype="float32", device="cuda"),
                             GenerationConfig(max_new_tokens=8), 9)
    assert asked and all(device == torch.device("cuda:1") for device in asked), asked


def test_torchrun_refuses_float32_logits_before_loading(tmp_path, monkeypatch):
    """--float32-logits, which tensor parallelism does not run, was refused once every process had read the whole
    checkpoint."""
    from longswift.cli.generate import _plan_before_loading
    from longswift.config import RuntimeConfig

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(LongswiftError, match="^--float32-logits is not supported with tensor parallelism"):
        _plan_before_loading(load_config(_config_dir(tmp_path)), RuntimeConfig(dtype="bfloat16", float32_logits=True),
                             GenerationConfig(max_new_tokens=8), 9)
    _plan_before_loading(load_config(_config_dir(tmp_path)), RuntimeConfig(dtype="float32", float32_logits=True),
                         GenerationConfig(max_new_tokens=8), 9)  # (float32 logits of a float32 model: nothing to do)


def test_tensor_parallel_outside_torchrun_is_refused_before_the_checkpoint_is_read(monkeypatch):
    """load(..., tensor_parallel=True) without a process group read the whole checkpoint, then refused."""
    assert not dist.is_initialized()
    monkeypatch.setattr("longswift.engine.load_model", lambda *a, **k: pytest.fail("the checkpoint was read"))
    with pytest.raises(LongswiftError, match="^tensor parallelism needs torch.distributed's default process group: "
                                             "start the processes with torchrun and call torch.distributed."
                                             "init_process_group\\(\\) in each before loading$"):
        longswift.load("any/model", tensor_parallel=True)
    monkeypatch.setenv("WORLD_SIZE", "1")  # (torchrun --nproc-per-node 1 was told to start with torchrun)
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(LongswiftError, match="call torch.distributed.init_process_group"):
        longswift.load("any/model", tensor_parallel=True)


def test_generate_help_and_readme_show_torchrun():
    """`generate --help` had no word of running across processes; its example and the README's parse."""
    import shlex

    from longswift.cli import build_parser

    parser = build_parser()
    help_text = parser._subparsers._group_actions[0].choices["generate"].format_help()
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## Multiple processes (tensor parallel)", 1)[1].split("\n## ", 1)[0]
    commands = [re.search(r"^ *torchrun --nproc-per-node 2 -m longswift (generate .*)$", text, flags=re.M)
                for text in (help_text.split("examples:", 1)[1], section)]
    for command in commands:
        assert command is not None
        args = parser.parse_args(shlex.split(command[1]))
        assert args.model == "hf_dir/" and args.prompt == "Write a story." and str(args.json) == "out.json"


def test_torchrun_cli_matches_one_process(tmp_path, capsys):
    """`torchrun --nproc-per-node 2 -m longswift generate` writes (rank 0 only) the tokens of one process."""
    from longswift.cli import main

    model = tmp_path / "model"
    tiny_hf_model("llama", seed=3, vocab=64, dtype=torch.float64).save_pretrained(model)
    ids = ",".join(map(str, prompt(4, 64, 20)))
    common = ["generate", "--model", str(model), "--prompt-ids", ids, "--greedy", "--max-new-tokens", "16",
              "--ignore-eos", "--no-progress", "--heads", "random", "--tree", "1,2,2", "--no-adaptive", "--dtype", "float64"]
    assert main([*common, "--method", "ar", "--json", str(tmp_path / "ar.json")]) == 0
    assert main([*common, "--json", str(tmp_path / "one.json")]) == 0
    capsys.readouterr()
    src = Path(longswift.__file__).resolve().parents[1]  # the longswift under test, wherever it is installed
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "longswift", *common, "--json", str(tmp_path / "tp.json")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    ar, one, tp = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("ar", "one", "tp"))
    assert len(tp["token_ids"]) == 16 and tp["stats"]["method"] == "tokenswift"
    assert (tp["stats"]["processes"], one["stats"]["processes"]) == (2, 1)
    assert tp["token_ids"] == one["token_ids"] == ar["token_ids"]
    assert (tp["stats"]["steps"], tp["stats"]["accepted_tokens"]) == (one["stats"]["steps"], one["stats"]["accepted_tokens"])
    assert proc.stdout.split() == [str(t) for t in tp["token_ids"]]  # no tokenizer: ids; rank 1 wrote nothing
    assert "on 2 processes" in proc.stderr and proc.stderr.count("16 tokens in") == 1


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])  # (the checkpoint's: float64; the GGUF's: float32)
@pytest.mark.parametrize("layout", ["hf directory", "gguf", "gguf in blocks of rows"])
def test_a_sharded_read_holds_one_weights_file_whole_at_a_time(tmp_path, monkeypatch, layout, dtype):
    """Under tensor parallelism a process whose run's dtype differed from the checkpoint's converted the whole model
    before cutting its part (a GGUF's was dequantized whole in any dtype). Each tensor is now cut as it is read (an
    HF directory's file by file), and each process keeps copies of its parts alone; they equal the cut of the whole,
    and the digest the ranks compare is still the whole model's."""
    import safetensors.torch
    from safetensors import safe_open
    from test_loading import write_gguf

    from longswift.runtime import loading
    from longswift.runtime.parallel import ShardedRead, shard_state, shard_tensor, state_digest

    hf = tiny_hf_model("llama", seed=4, dtype=torch.float64, vocab=40)
    blocks, dequantized = layout == "gguf in blocks of rows", []
    if blocks:  # (a large matrix is read a block of rows at a time: cut as a whole)
        import longswift.runtime.loading.gguf as gguf_module

        monkeypatch.setattr(gguf_module, "DEQUANTIZE_BLOCK", 64)
        real_dequantize = gguf_module.gguf_dequantize
        monkeypatch.setattr(gguf_module, "gguf_dequantize",
                            lambda t: dequantized.append(t.n_elements) or real_dequantize(t))
        layout = "gguf"
    if layout == "gguf":
        path = tmp_path / "model.gguf"
        write_gguf(path, hf)
    else:
        path = tmp_path
        hf.save_pretrained(tmp_path, max_shard_size="40KB")
    files = sorted(tmp_path.glob("*.safetensors"))
    assert len(files) >= 3 or layout == "gguf", files
    held = {f.name: set(safe_open(str(f), "pt").keys()) for f in files}
    cfg = loading.load_config(path)
    cpu = torch.device("cpu")
    whole = loading.load_model(path, dtype, cpu)
    events: list[tuple[str, str]] = []
    real = safetensors.torch.load_file
    monkeypatch.setattr(safetensors.torch, "load_file", lambda f, *a, **k: events.append(("file", Path(f).name))
                        or real(f, *a, **k))

    class Recorded(ShardedRead):
        def __call__(self, name, full):
            events.append(("tensor", name))
            return super().__call__(name, full)

    for rank in range(2):
        plan = plan_shards(cfg, rank, 2)
        events.clear()
        cut = loading.load_model(path, dtype, cpu, shard=Recorded(plan, cfg.head_dim, dtype))
        # file by file: each file's tensors are cut before the next file is read
        order = [name for kind, name in events if kind == "file"]
        assert sorted(order) == sorted(held) and (layout == "gguf") == (not order)
        for i, f in enumerate(order):
            start = events.index(("file", f)) + 1
            end = events.index(("file", order[i + 1])) if i + 1 < len(order) else len(events)
            assert {name for _, name in events[start:end]} == held[f]
        weights = {n for n in whole.state if n.startswith("model.layers.") and n.split(".")[-2].endswith("_proj")}
        assert set(cut.cut) == weights
        for name in weights:  # a copy of the part: not a view that keeps the whole tensor's memory
            part = shard_tensor(name, whole.state[name], plan, cfg.head_dim)
            assert torch.equal(cut.state[name], part)
            size = dtype.itemsize
            assert cut.state[name].untyped_storage().nbytes() == part.numel() * size < whole.state[name].numel() * size
        ours = shard_state(cfg, cut.state, plan, cpu, cut=cut.cut)
        assert ours.keys() == shard_state(cfg, whole.state, plan, cpu).keys()
        for name, t in shard_state(cfg, whole.state, plan, cpu).items():
            assert torch.equal(ours[name], t), name
        assert state_digest(cut.state, cut.cut) == state_digest(whole.state)  # (of the tensors in the run's dtype)
    if blocks:  # no matrix dequantized whole (q's 4,096 values), a head's rows at most
        assert dequantized and max(dequantized) == 16 * 64, sorted(set(dequantized))


@pytest.mark.parametrize("rank", range(4))
def test_a_rank_pools_scores_with_the_copies_of_its_own_kv_head(monkeypatch, rank):
    from longswift.runtime.parallel import TensorParallel

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: rank)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 4)
    monkeypatch.setattr(dist, "new_group", lambda ranks: tuple(ranks))
    tp = TensorParallel(_cfg(num_kv_heads=2), torch.device("cpu"))  # 2 KV heads on 4 ranks: each held by 2
    assert tp.kv_group == ((0, 1) if rank < 2 else (2, 3))


def test_a_vocabulary_smaller_than_the_blocks_gives_every_rank_an_equal_block():
    from longswift.runtime.parallel import vocab_block

    cfg = _cfg(vocab_size=5)
    for r in range(4):
        plan = plan_shards(cfg, r, 4)
        assert plan.vocab[0] <= plan.vocab[1]
        assert vocab_block(torch.ones(5, 3), plan).shape == (plan.vocab_per_rank, 3)


def test_local_rank_equal_to_the_gpu_count_is_refused_in_one_line(monkeypatch):
    from longswift.config import RuntimeConfig
    from longswift.runtime.parallel import init_from_env

    monkeypatch.setattr(RuntimeConfig, "torch_device", lambda self: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: pytest.fail("set_device reached"))
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(LongswiftError, match="wants cuda:2 but only 2 CUDA devices"):
        init_from_env(RuntimeConfig())
