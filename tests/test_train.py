"""Head training: the loss goes down, only the heads change, resume equals an uninterrupted run,
bad data fails clearly; self-distillation samples what our own AR would."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest
import torch
from conftest import tiny_hf_model

import longswift
from longswift.config import GenerationConfig, SamplingConfig
from longswift.errors import LongswiftError
from longswift.spec.heads import load_heads, new_heads
from longswift.train.data import cut_windows, read_texts
from longswift.train.distill import self_distill
from longswift.train.eval import head_accuracy, held_out_alpha
from longswift.train.train import (
    HEADS_FILE,
    HeadTrainer,
    TrainConfig,
    base_hidden,
    claimed_out_dir,
    head_losses,
    head_targets,
    learning_rate,
    not_converged,
    train_heads,
)


@pytest.fixture(scope="module")
def tiny():
    return longswift.load(tiny_hf_model("llama", seed=3, vocab=96), pack_weights=False)


def _windows(engine, n=6, length=24, seed=0):
    """Text the tiny model writes itself (greedy from random starts): learnable for the heads."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        start = torch.randint(3, 96, (2,), generator=g).tolist()
        out = engine.generate(start, method="ar", sampling=SamplingConfig(temperature=0, repetition_penalty=1.0),
                              generation=GenerationConfig(max_new_tokens=length - 2, ignore_eos=True))
        rows.append(start + out.token_ids)
    return torch.tensor(rows)


def _mean_loss(trainer: HeadTrainer) -> float:
    with torch.no_grad():
        h0 = trainer.hidden.flatten(0, 1).to(trainer.heads.weights.dtype)
        t = trainer.targets.flatten(1, 2)
        ce, _, n = head_losses(trainer.heads, trainer.lm_head, h0, t, bf16=False)
    return float((ce / n).sum())


def test_head_targets_by_hand():
    w = torch.arange(10, 16)[None]  # one window: 10 11 12 13 14 15
    t = head_targets(w, 3)
    assert t[0, 0].tolist() == [12, 13, 14, 15, -100, -100]  # head 1: t + 2
    assert t[1, 0].tolist() == [13, 14, 15, -100, -100, -100]  # head 2: t + 3
    assert t[2, 0].tolist() == [14, 15, -100, -100, -100, -100]  # head 3: t + 4


def test_head_targets_of_a_window_shorter_than_the_heads_reach():
    t = head_targets(torch.arange(10, 13)[None], 3)  # 10 11 12: only head 1 (t + 2) has a target
    assert t[:, 0].tolist() == [[12, -100, -100], [-100, -100, -100], [-100, -100, -100]]


def test_head_accuracy_refuses_windows_too_short_for_a_head(tiny):
    """Windows of gamma + 1 tokens or fewer leave the deepest head nothing to predict: its accuracy was
    reported as 0.000 over no positions (gamma + 1), or a shape error was raised (fewer)."""
    heads = new_heads(tiny.cfg, tiny.model.state, 3)
    windows = torch.arange(3, 27).view(2, 12)
    for length in (3, 4):
        with pytest.raises(LongswiftError, match=f"--seq-len {length} leaves head 3 no token to predict: these 3 "
                                                 "heads need windows of at least 5 tokens"):
            head_accuracy(tiny, heads, windows[:, :length])
    assert head_accuracy(tiny, heads, windows[:, :5]).positions == 2 * 3


def test_learning_rate_schedule():
    cfg = TrainConfig(steps=110, lr=2e-3, warmup=10)
    assert learning_rate(cfg, 0) == pytest.approx(2e-4)
    assert learning_rate(cfg, 9) == pytest.approx(2e-3)
    assert learning_rate(cfg, 60) == pytest.approx(1e-3)  # half-way through the cosine
    assert learning_rate(cfg, 109) == pytest.approx(2e-3 * 0.5 * (1 + math.cos(0.99 * math.pi)))


def test_training_lowers_loss_and_touches_only_the_heads(tiny, tmp_path):
    windows = _windows(tiny)
    before = {k: v.clone() for k, v in tiny.model.state.items()}
    cfg = TrainConfig(steps=30, lr=1e-2, seq_len=24, batch_size=2, warmup=3, checkpoint_every=10, bf16_lm_head=False)
    hidden = base_hidden(tiny.model, windows)
    fresh = HeadTrainer(tiny, windows, hidden, cfg)
    initial = _mean_loss(fresh)
    trainer = train_heads(tiny, windows, cfg, tmp_path, progress=False)
    assert _mean_loss(trainer) < 0.8 * initial
    for k, v in tiny.model.state.items():
        assert torch.equal(v, before[k]), k  # base weights bit-identical
        assert v.grad is None and not v.requires_grad
    assert set(trainer.optimizer.state) <= set(trainer.heads.parameters())  # no optimizer state for the base
    assert all(p.grad is not None for p in trainer.heads.parameters())
    # the result loads as heads for this model, and generation with them stays lossless
    heads = load_heads(tmp_path / HEADS_FILE, tiny.cfg, tiny.model.embed)
    tiny.set_heads(heads)
    try:
        greedy = SamplingConfig(temperature=0, repetition_penalty=1.1, penalty_window=8)
        gen = GenerationConfig(max_new_tokens=20, ignore_eos=True)
        ts = tiny.generate([5, 6, 7], sampling=greedy, generation=gen, method="tokenswift")
        ar = tiny.generate([5, 6, 7], sampling=greedy, generation=gen, method="ar")
        assert ts.token_ids == ar.token_ids
        acc = head_accuracy(tiny, heads, windows)
        assert acc.positions == 6 * 22 and all(0 <= a <= b <= 1 for a, b in zip(acc.top1, acc.top3))
        assert acc.top1[0] > 0.3  # learned: head 1 predicts t+2 of greedy text well above chance (1/96)
    finally:
        tiny.set_heads(None)
    log = json.loads((tmp_path / "train_log.json").read_text())
    assert [m["step"] for m in log] == list(range(1, 31))


def test_head_accuracy_a_window_at_a_time_counts_what_all_windows_at_once_do(tiny):
    """eval-heads takes the base's hidden states a window at a time now (all at once did not fit for large data):
    the same counts as heads applied to every window's hidden states at once, in chunks across windows."""
    windows = _windows(tiny, n=4, length=20, seed=5)
    heads = new_heads(tiny.cfg, tiny.model.state, 3)
    with torch.no_grad():
        heads.weights.normal_(0, 0.05, generator=torch.Generator().manual_seed(0))
        states = heads(base_hidden(tiny.model, windows).flatten(0, 1))  # [gamma, N*L, hidden]
        best3 = torch.topk(tiny.model.lm_head(states), 3, dim=-1).indices
    targets = head_targets(windows, 3).flatten(1, 2)  # [gamma, N*L]
    valid = targets != -100
    hit = best3 == targets[..., None]
    acc = head_accuracy(tiny, heads, windows, chunk=7)  # (chunks that do not divide a window)
    assert acc.positions == int(valid[0].sum())
    assert acc.top1 == ((hit[..., 0] & valid).sum(1) / valid.sum(1).double()).tolist()
    assert acc.top3 == ((hit.any(-1) & valid).sum(1) / valid.sum(1).double()).tolist()
    assert acc.top1[0] > 0


def test_hidden_states_that_do_not_fit_in_memory_are_refused_in_a_line(tiny, monkeypatch):
    """They were a traceback from the allocator (and train-heads left the --out it had made)."""
    import longswift.train.train as train_module

    windows = _windows(tiny, n=3, length=20)
    monkeypatch.setattr(train_module, "available_bytes", lambda device: 1000)
    with pytest.raises(LongswiftError, match=r"hidden states of 3 windows of 20 tokens need 15.0 KiB, and 1.0 KiB is "
                                             r"free: give less data \(--data, --self-distill\) or a smaller --seq-len"):
        base_hidden(tiny.model, windows)

    def no_memory(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(train_module, "available_bytes", lambda device: None)
    monkeypatch.setattr(train_module.torch, "empty", no_memory)  # (a ulimit -v that free memory does not show)
    with pytest.raises(LongswiftError, match=r"need 15.0 KiB, which this process could not allocate \(a limit"):
        base_hidden(tiny.model, windows)


def test_loss_logits_that_do_not_fit_in_memory_are_refused_before_the_hidden_states(tiny, tmp_path, monkeypatch):
    """A step's [gamma, chunk, vocab] logits and their autograd copies were never checked: --gamma 400 --seq-len
    1024 --batch-size 2 --chunk 4096 died at the first step, after the hidden states' minutes, in an allocation's
    traceback. Now refused before the hidden states, with the --chunk that fits beside them."""
    import longswift.train.train as train_module
    from longswift.errors import ConfigError

    windows = _windows(tiny, n=3)  # hidden states 3 x 24 x 64 float32: 18 KiB
    cfg = TrainConfig(steps=2, seq_len=24, batch_size=2, warmup=1, chunk=64, bf16_lm_head=False)
    # a chunk of 64 holds a batch's 48 positions: 3 x 48 x 96 float32 logits, 3 times over (162 KiB, 0.2 MiB)
    monkeypatch.setattr(train_module, "available_bytes", lambda device: 100 * 1024)
    monkeypatch.setattr(train_module, "base_hidden", lambda *a, **k: pytest.fail("hidden states before refusing"))
    said = ("makes each loss chunk's logits 3 heads x 48 positions x 96 tokens of vocabulary, which need 0.2 MiB "
            "with their autograd copies, and 0.1 MiB is free besides the base's hidden states (18.0 KiB)")
    with pytest.raises(ConfigError, match=re.escape(f"TrainConfig.chunk=64 {said}: lower it to at most 24")) as refused:
        train_heads(tiny, windows, cfg, tmp_path / "a", progress=False)
    assert refused.value.cli_message == f"--chunk 64 {said}: lower --chunk to at most 24"
    monkeypatch.setattr(train_module, "base_hidden", base_hidden)
    trainer = train_heads(tiny, windows, dataclasses.replace(cfg, chunk=24), tmp_path / "b", progress=False)
    assert trainer.step == 2  # (the chunk it named fits)


def test_resume_equals_uninterrupted(tiny, tmp_path):
    windows = _windows(tiny, n=5, seed=1)
    cfg = TrainConfig(steps=6, lr=5e-3, seq_len=24, batch_size=2, grad_accum=2, warmup=2, checkpoint_every=3)
    whole = train_heads(tiny, windows, cfg, tmp_path / "a", progress=False)
    # an interrupted run: 3 steps, a checkpoint, then a new process state resumes
    part = HeadTrainer(tiny, windows, base_hidden(tiny.model, windows), cfg)
    (tmp_path / "b").mkdir()
    for _ in range(3):
        part.run_step()
    part.save_checkpoint(tmp_path / "b" / "checkpoint.pt")
    lines: list[str] = []  # what a log file under nohup reads, where no bar is drawn
    resumed = train_heads(tiny, windows, cfg, tmp_path / "b", resume=True, progress=False, log=lines.append)
    assert lines[:2] == ["base model's hidden states of 5 windows",
                         "training 6 steps, from step 3; a line at each checkpoint (every 3 steps and the last)"]
    assert len(lines) == 3 and lines[2].startswith("step 6/6: loss ") and "checkpoint saved" in lines[2]
    for k, v in whole.heads.state_dict().items():
        assert torch.equal(v, resumed.heads.state_dict()[k]), k
    assert [m["loss"] for m in whole.log] == [m["loss"] for m in resumed.log]


def test_weight_decay_leaves_the_norm_gains_alone(tiny):
    """--weight-decay decayed the heads' RMSNorm gains with their matrices (one AdamW group), pulling them towards
    0 and not towards the base model's final norm. After one step from the same start (the matrices start at 0,
    so a decay leaves them as they are there) the gains must be what a run without decay makes."""
    windows = _windows(tiny, n=3, seed=2)
    runs = {}
    for decay in (0.0, 5.0):
        cfg = TrainConfig(steps=3, lr=3e-2, seq_len=24, batch_size=1, warmup=1, weight_decay=decay)
        trainer = HeadTrainer(tiny, windows, base_hidden(tiny.model, windows), cfg)
        trainer.run_step()
        runs[decay] = {k: v.detach().clone() for k, v in trainer.heads.state_dict().items()}
        trainer.run_step()  # (the matrices are no longer 0: the decay shrinks them)
        runs[decay, 2] = trainer.heads.weights.detach().clone()
    for name in ("in_norms", "out_norms", "weights"):
        assert torch.equal(runs[0.0][name], runs[5.0][name]), name
    assert not torch.allclose(runs[0.0, 2], runs[5.0, 2])  # (the decay does reach the matrices)


def test_a_checkpoint_with_one_optimizer_group_resumes_as_the_uninterrupted_run(tiny, tmp_path):
    """Checkpoints before session 70 hold AdamW's state in one group of all the heads' parameters; they resume
    into the group a parameter that training uses now, to the heads an uninterrupted run makes."""
    windows = _windows(tiny, n=5, seed=1)
    cfg = TrainConfig(steps=4, lr=5e-3, seq_len=24, batch_size=2, warmup=1, checkpoint_every=2)
    whole = train_heads(tiny, windows, cfg, tmp_path / "a", progress=False)
    part = HeadTrainer(tiny, windows, base_hidden(tiny.model, windows), cfg)
    for _ in range(2):
        part.run_step()
    ck = part.checkpoint_state()
    groups = ck["optimizer"]["param_groups"]
    assert [g["params"] for g in groups] == [[0], [1], [2]]
    ck["optimizer"]["param_groups"] = [{**groups[0], "params": [0, 1, 2]}]  # the old layout
    (tmp_path / "b").mkdir()
    torch.save(ck, tmp_path / "b" / "checkpoint.pt")
    resumed = train_heads(tiny, windows, cfg, tmp_path / "b", resume=True, progress=False)
    for k, v in whole.heads.state_dict().items():
        assert torch.equal(v, resumed.heads.state_dict()[k]), k


def test_bf16_lm_head_follows_the_device_and_a_resume_goes_on_as_its_checkpoint_did(tiny, tmp_path, monkeypatch):
    """Not given, --bf16-lm-head is on where the device multiplies bfloat16 in hardware (bf16_lm_head_default: on
    an AVX2-only CPU autocast made a train-heads step 35x slower, ~3x on AVX-512 without BF16) and the checkpoint
    records what ran; a resume not
    given it goes on as its checkpoint did, on a machine whose default differs, to an uninterrupted run's heads."""
    import longswift.train.train as train_module
    from longswift.runtime import linear
    from longswift.runtime.linear import bfloat16_products_native, packing_supported

    cpu = torch.device("cpu")
    assert train_module.bf16_lm_head_default(cpu) == (packing_supported(torch.bfloat16, cpu)
                                                      and bfloat16_products_native())
    assert train_module.bf16_lm_head_default(torch.device("cuda")) is True
    # AVX-512 without BF16: oneDNN runs bfloat16 by converting, ~3x slower than float32 for the head's many rows
    monkeypatch.setattr(linear, "onednn_computes", lambda dtype: True)
    for native in (False, True):
        monkeypatch.setattr(linear, "bfloat16_products_native", lambda native=native: native)
        assert train_module.bf16_lm_head_default(cpu) is native
    monkeypatch.undo()
    windows = _windows(tiny, n=3, seed=2)
    cfg = TrainConfig(steps=4, seq_len=24, batch_size=1, warmup=1, checkpoint_every=2)
    assert cfg.bf16_lm_head is None
    whole = {}
    for native in (True, False):
        monkeypatch.setattr(train_module, "bf16_lm_head_default", lambda device, native=native: native)
        whole[native] = train_heads(tiny, windows, cfg, tmp_path / f"whole-{native}", progress=False)
        assert whole[native].cfg.bf16_lm_head is native
        ck = torch.load(tmp_path / f"whole-{native}" / "checkpoint.pt", weights_only=True)
        assert ck["config"]["bf16_lm_head"] is native
    bf16, f32 = whole[True].heads.state_dict(), whole[False].heads.state_dict()
    assert not all(torch.equal(v, f32[k]) for k, v in bf16.items())  # (the two differ: the resume shows which ran)
    monkeypatch.setattr(train_module, "bf16_lm_head_default", lambda device: True)  # started where it is native
    part = HeadTrainer(tiny, windows, base_hidden(tiny.model, windows), cfg)
    assert part.cfg.bf16_lm_head is True
    (tmp_path / "cut").mkdir()
    for _ in range(2):
        part.run_step()
    part.save_checkpoint(tmp_path / "cut" / "checkpoint.pt")
    monkeypatch.setattr(train_module, "bf16_lm_head_default", lambda device: False)  # resumed where it is not
    resumed = train_heads(tiny, windows, cfg, tmp_path / "cut", resume=True, progress=False)
    assert resumed.cfg.bf16_lm_head is True
    assert all(torch.equal(v, resumed.heads.state_dict()[k]) for k, v in bf16.items())


def test_checkpoint_refusals(tiny, tmp_path):
    windows = _windows(tiny, n=3, seed=2)
    cfg = TrainConfig(steps=2, seq_len=24, batch_size=1, warmup=1, checkpoint_every=1, bf16_lm_head=True)
    train_heads(tiny, windows, cfg, tmp_path, progress=False)
    with pytest.raises(LongswiftError, match="holds a finished run .heads.safetensors and its checkpoint.pt."):
        train_heads(tiny, windows, cfg, tmp_path, progress=False)
    with pytest.raises(LongswiftError, match="finished run .*--resume has nothing left to do"):  # (it redid the
        train_heads(tiny, windows, cfg, tmp_path, resume=True, progress=False)  # hidden states and rewrote the heads)
    (tmp_path / HEADS_FILE).rename(tmp_path / "kept.safetensors")  # an unfinished run's state: continue it
    (tmp_path / "train_log.json").rename(tmp_path / "kept.json")
    with pytest.raises(LongswiftError, match="pass --resume"):
        train_heads(tiny, windows, cfg, tmp_path, progress=False)
    with pytest.raises(LongswiftError, match="used --bf16-lm-head, not --no-bf16-lm-head: resume with the same"):
        train_heads(tiny, windows, dataclasses.replace(cfg, bf16_lm_head=False), tmp_path, resume=True, progress=False)
    # every difference at once (one at a time, a resume without the flags was refused four times over)
    with pytest.raises(LongswiftError, match=r"used --steps 2, not 3; --lr 0.03, not 0.5; --batch-size 1, not 2; "
                                             r"--warmup 1, not 2: resume with the same settings"):
        train_heads(tiny, windows, TrainConfig(steps=3, seq_len=24, batch_size=2, warmup=2, lr=0.5), tmp_path,
                    resume=True, progress=False)
    with pytest.raises(LongswiftError, match="other data"):
        train_heads(tiny, windows.flip(0), cfg, tmp_path, resume=True, progress=False)
    with pytest.raises(LongswiftError, match="nothing to resume"):
        train_heads(tiny, windows, cfg, tmp_path / "new", resume=True, progress=False)
    ck = tmp_path / "checkpoint.pt"
    ck.write_bytes(ck.read_bytes()[:1000])
    with pytest.raises(LongswiftError, match="damaged"):
        train_heads(tiny, windows, cfg, tmp_path, resume=True, progress=False)
    (tmp_path / "other").mkdir()  # a directory that holds someone's train_log.json: never written over
    (tmp_path / "other" / "train_log.json").write_text('{"my": "log"}')
    with pytest.raises(LongswiftError, match="train_log.json' exists, which a run writes at its end"):
        train_heads(tiny, windows, cfg, tmp_path / "other", progress=False)
    assert (tmp_path / "other" / "train_log.json").read_text() == '{"my": "log"}'


def test_an_edited_training_checkpoint_is_refused_as_damaged(tiny, tmp_path):
    """A valid torch file whose parts were edited (a part removed, of another type, heads of another shape, a
    negative step, another optimizer's state) was a KeyError, AttributeError, RuntimeError, ZeroDivisionError or
    ValueError traceback on --resume."""
    windows = _windows(tiny, n=3, seed=2)
    cfg = TrainConfig(steps=4, seq_len=24, batch_size=1, warmup=1, checkpoint_every=2)
    part = HeadTrainer(tiny, windows, base_hidden(tiny.model, windows), cfg)
    part.run_step()
    good = part.checkpoint_state()
    heads = good["heads"]
    edits = {
        "it lacks 'config'": lambda ck: ck.pop("config"),
        "its 'config' is NoneType, not dict": lambda ck: ck.update(config=None),
        "it lacks 'heads'": lambda ck: ck.pop("heads"),
        "its 'step' is str, not int": lambda ck: ck.update(step="x"),
        "its step is -5": lambda ck: ck.update(step=-5),
        "size mismatch for weights": lambda ck: ck.update(heads={**heads, "weights": heads["weights"][:, :2]}),
        "parameter group": lambda ck: ck["optimizer"].update(param_groups=[]),
    }
    for match, edit in edits.items():
        ck = {**good, "optimizer": {**good["optimizer"]}}
        edit(ck)
        path = tmp_path / match.replace(" ", "_").replace("'", "")
        path.mkdir()
        torch.save(ck, path / "checkpoint.pt")
        with pytest.raises(LongswiftError, match=re.escape(match)) as info:
            train_heads(tiny, windows, cfg, path, resume=True, progress=False)
        assert "is damaged (" in str(info.value) and str(info.value).endswith("delete it to start over"), match


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_half_precision_model_trains_without_bf16_autocast(tmp_path, dtype):
    """--no-bf16-lm-head on a bfloat16/float16 model multiplied the float32 heads' states by the model's
    half-precision LM head and crashed ("expected m1 and m2 to have the same dtype"): the products now
    take a copy of the head in the heads' precision."""
    half = longswift.load(tiny_hf_model("llama", seed=3, vocab=96), dtype=dtype, pack_weights=False)
    windows = _windows(half, n=3, seed=4)
    cfg = TrainConfig(steps=2, seq_len=24, batch_size=1, warmup=1, checkpoint_every=2, bf16_lm_head=False)
    trainer = train_heads(half, windows, cfg, tmp_path, progress=False)
    assert trainer.lm_head.dtype == torch.float32 and half.model.dtype == getattr(torch, dtype)
    assert all(math.isfinite(m["loss"]) for m in trainer.log) and len(trainer.log) == 2


def test_resume_refuses_another_base_or_other_data_before_the_hidden_states(tiny, tmp_path, monkeypatch):
    """The base's hidden states of every window take minutes (80 s for the shipped heads' 192 windows):
    a checkpoint of another base model or other data is refused before them, not after."""
    import longswift.train.train as train_module

    windows = _windows(tiny, n=3, seed=2)
    cfg = TrainConfig(steps=2, seq_len=24, batch_size=1, warmup=1, checkpoint_every=1)
    train_heads(tiny, windows, cfg, tmp_path, progress=False)
    (tmp_path / HEADS_FILE).rename(tmp_path / "finished.safetensors")  # the checkpoint alone: a run to continue
    (tmp_path / "train_log.json").unlink()
    monkeypatch.setattr(train_module, "base_hidden", lambda *a, **k: pytest.fail("hidden states before refusing"))
    with pytest.raises(LongswiftError, match="was trained on other data"):
        train_heads(tiny, windows.flip(0), cfg, tmp_path, resume=True, progress=False)
    other = longswift.load(tiny_hf_model("llama", seed=4, vocab=96), pack_weights=False)
    with pytest.raises(LongswiftError, match="was trained on another base model: resume with the --model it was "
                                             "started with, or train this model into a new --out"):
        train_heads(other, windows, cfg, tmp_path, resume=True, progress=False)
    # The same model in another dtype gives other hidden states, so other heads: a resume that mixed the
    # two was neither the first run nor a new one (the checkpoint and the heads file record the settings).
    wider = longswift.load(tiny_hf_model("llama", seed=3, vocab=96), pack_weights=False, dtype="float64")
    with pytest.raises(LongswiftError, match="used --dtype float32, not float64: resume with the same settings"):
        train_heads(wider, windows, cfg, tmp_path, resume=True, progress=False)
    from longswift.spec.heads import training_record

    assert training_record(tmp_path / "finished.safetensors")["settings"] == {"dtype": "float32", "rope_scaling": None}


def test_a_diverged_step_stops_training_before_it_updates_the_heads(tiny, tmp_path, monkeypatch):
    """A NaN loss (a too high --lr) would turn the heads to NaN and save them: training stops at that
    step, before the update, and the checkpoint of the step before stays finite."""
    import longswift.train.train as train_module

    real, calls = train_module.head_losses, []

    def nan_on_the_second_step(*args, **kwargs):
        ce, c, v = real(*args, **kwargs)
        calls.append(1)
        return (ce * float("nan"), c, v) if len(calls) > 1 else (ce, c, v)

    monkeypatch.setattr(train_module, "head_losses", nan_on_the_second_step)
    cfg = TrainConfig(steps=3, seq_len=24, batch_size=1, warmup=1, checkpoint_every=1, chunk=10**6)
    with pytest.raises(LongswiftError, match=r"training diverged at step 2 \(loss nan\): the checkpoints so far are "
                                             r"intact; train again into a new --out with a lower --lr \(now 0.03\)$"):
        train_heads(tiny, _windows(tiny, n=3, seed=2), cfg, tmp_path, progress=False)
    calls.clear()  # with a weight decay, the message names it too
    cfg = TrainConfig(steps=3, seq_len=24, batch_size=1, warmup=1, checkpoint_every=1, chunk=10**6, weight_decay=5.0)
    with pytest.raises(LongswiftError, match=r"lower --lr \(now 0.03\) or --weight-decay \(now 5\)$"):
        train_heads(tiny, _windows(tiny, n=3, seed=2), cfg, tmp_path / "decay", progress=False)
    ck = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert ck["step"] == 1 and all(torch.isfinite(t).all() for t in ck["heads"].values())
    assert not (tmp_path / "heads.safetensors").exists()


def test_one_training_run_per_out_dir(tiny, tmp_path):
    """A second train-heads on the same --out while the first runs is refused (it would overwrite the
    first's checkpoint and heads); a temp file a killed run left there is removed."""
    from longswift.atomic import OutputLock

    windows = _windows(tiny, n=3, seed=2)
    cfg = TrainConfig(steps=2, seq_len=24, batch_size=1, warmup=1, checkpoint_every=1)
    with OutputLock([("--out", tmp_path / "checkpoint.pt")]):  # the first run, still training
        with pytest.raises(LongswiftError, match="being written by another longswift run"):
            train_heads(tiny, windows, cfg, tmp_path, progress=False)
    assert not (tmp_path / "heads.safetensors").exists()
    stale = tmp_path / "checkpoint.pt.k1ll3d00.partial"  # torch.save's temp file of a run killed while saving
    stale.write_bytes(b"half a checkpoint")
    heard: list = []
    with claimed_out_dir(tmp_path, False, heard.append):  # (train-heads says what it removed)
        train_heads(tiny, windows, cfg, tmp_path, progress=False, claimed=True)
    assert heard == [stale]
    assert not stale.exists() and (tmp_path / "heads.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt", "heads.safetensors", "train_log.json"]


def test_data_reading(tmp_path):
    (tmp_path / "a.txt").write_text("one document")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "two"}) + "\n\n" + json.dumps({"text": "three"}) + "\n")
    (tmp_path / "skip.bin").write_bytes(b"\x00\x01")
    assert sorted(read_texts([tmp_path])) == ["one document", "three", "two"]
    assert cut_windows([[1, 2, 3, 4, 5], [6, 7], [8]], 2).tolist() == [[1, 2], [3, 4], [6, 7]]


def test_data_with_a_byte_order_mark(tmp_path):
    """UTF-8 files saved with a BOM (Windows editors): a JSONL file's first line was refused as 'not JSON'
    and a text file's document began with U+FEFF."""
    (tmp_path / "a.jsonl").write_bytes("\ufeff".encode() + b'{"text": "one"}\n{"text": "two"}\n')
    (tmp_path / "b.txt").write_bytes("\ufeff".encode() + b"three")
    assert read_texts([tmp_path / "a.jsonl", tmp_path / "b.txt"]) == ["one", "two", "three"]


def test_jsonl_lines_end_at_newlines_only_and_ndjson_is_jsonl(tmp_path):
    """json.dumps(ensure_ascii=False) leaves U+2028, U+2029 and U+0085 inside strings: splitlines() cut the
    lines there and refused the file as 'not JSON'. A .ndjson file was read as one text document."""
    texts = ["one\u2028two", "three\u2029four\u0085five", "six\r"]
    lines = "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts)
    (tmp_path / "a.jsonl").write_text(lines, encoding="utf-8", newline="")
    (tmp_path / "b.ndjson").write_text(lines.replace("\n", "\r\n"), encoding="utf-8", newline="")
    assert read_texts([tmp_path / "a.jsonl"]) == texts
    assert read_texts([tmp_path / "b.ndjson"]) == texts
    assert read_texts([tmp_path]) == texts + texts  # (a directory's .ndjson files are read too)


@pytest.mark.parametrize("content, message", [
    (b"", "the --data is empty"),
    (b"   \n", "the --data is empty"),
    (b"\x7fELF\x00\x00\x01", "looks binary"),
    (b"caf\xe9", "not UTF-8"),
])
def test_bad_text_data(tmp_path, content, message):
    f = tmp_path / "data.txt"
    f.write_bytes(content)
    with pytest.raises(LongswiftError, match=message):
        read_texts([f])


def test_bad_jsonl_and_paths(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(LongswiftError, match="line 2 has no string field 'text'"):
        read_texts([f])
    f.write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(LongswiftError, match="line 2 is not JSON"):
        read_texts([f])
    log = tmp_path / "logs" / "train_log.json"  # a pretty-printed log in a --data folder
    log.parent.mkdir()
    log.write_text('{\n "steps": [\n  1\n ]\n}\n')
    with pytest.raises(LongswiftError, match="train_log.json' is one JSON document, not JSON Lines"):
        read_texts([log.parent])
    with pytest.raises(LongswiftError, match="does not exist"):
        read_texts([tmp_path / "missing.txt"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(LongswiftError, match="holds no"):
        read_texts([tmp_path / "empty"])
    with pytest.raises(LongswiftError, match="no document reaches --seq-len 8 tokens \\(the longest has 3\\)"):
        cut_windows([[1, 2, 3]], 8)


def test_jsonl_text_with_an_unpaired_surrogate_is_refused_before_loading(tmp_path, capsys):
    """JSON's "\\ud800" escape reads as a lone surrogate, which no tokenizer encodes: a TypeError traceback from
    tokenize once the model had loaded. Now refused as the data is read, naming the file and line."""
    from conftest import assert_one_line_error, run_cli

    f = tmp_path / "d.jsonl"
    f.write_text('{"text": "fine"}\n{"text": "hello \\ud800 world"}\n')
    with pytest.raises(LongswiftError, match=r"d.jsonl' line 2 holds an unpaired surrogate escape \(\\ud800\) in its "
                                             r"'text'"):
        read_texts([f])
    code, _, err = run_cli(capsys, "train-heads", "--model", str(tmp_path / "no-model"), "--data", str(f),
                           "--out", str(tmp_path / "o"))  # (no model to load: the data is refused first)
    assert_one_line_error(code, err, "line 2 holds an unpaired surrogate escape")
    assert not (tmp_path / "o").exists()
    f.write_text('{"text": "a pair \\ud83d\\ude00 is one character"}\n')  # (a pair is one character: read)
    assert read_texts([f]) == ["a pair \U0001f600 is one character"]


@pytest.mark.parametrize("command", ["train-heads", "eval-heads"])
def test_data_the_tokenizer_encodes_past_the_models_logits_is_refused_in_a_line(tmp_path, capsys, command):
    """A model directory holding another model's tokenizer (260 tokens for 128 logits): the --data ids reached the
    embedding, an IndexError traceback after the hidden states had begun (on CUDA, a device-side assert)."""
    from conftest import assert_one_line_error, byte_tokenizer, run_cli

    tiny_hf_model("llama", seed=3, vocab=128).save_pretrained(tmp_path / "m")
    byte_tokenizer().save_pretrained(tmp_path / "m")
    capsys.readouterr()  # (transformers' progress bar as it saves)
    data = tmp_path / "d.txt"
    data.write_text("The keeper climbed the stairs. " * 40)
    flags = (["--out", str(tmp_path / "o"), "--steps", "4", "--warmup", "1"] if command == "train-heads"
             else ["--heads", "random", "--alpha-tokens", "0"])
    code, _, err = run_cli(capsys, command, "--model", str(tmp_path / "m"), "--data", str(data), "--seq-len", "64",
                           "--threads", "1", "--no-progress", *flags)
    assert_one_line_error(code, err, "the --data text encodes to token 2")
    assert "past this model's 128 logits: the tokenizer is not this model's" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("line, message", [
    ("[" * 100000 + "]" * 100000, "line 2 nests arrays or objects too deeply to be read"),
    ('{"text": "ok", "id": ' + "7" * 5000 + "}", "line 2 holds an integer of more than 4300 digits"),
])
def test_jsonl_lines_python_cannot_read_are_refused_in_a_line(tmp_path, line, message):
    """json.loads raises RecursionError on deep nesting and ValueError on an integer past Python's digit limit, and
    only JSONDecodeError was caught: a traceback. Also where the whole file is tried as one document."""
    f = tmp_path / "d.jsonl"
    f.write_text('{"text": "fine"}\n' + line + "\n")
    with pytest.raises(LongswiftError, match=f"d.jsonl' {message}"):
        read_texts([f])
    f.write_text("[\n" * 100000 + "]\n" * 100000)  # line 1 is not JSON, and the file as one document nests too deeply
    with pytest.raises(LongswiftError, match="d.jsonl' line 1 is not JSON"):
        read_texts([f])


def test_train_config_errors():
    with pytest.raises(LongswiftError, match="--steps must be positive"):
        TrainConfig(steps=0)
    for bad in (-1.0, 0.0, float("nan"), float("inf"), 1e38):  # 1e38: a traceback from inside AdamW before
        with pytest.raises(LongswiftError, match="--lr must be a positive number up to 10 "):
            TrainConfig(lr=bad)
    with pytest.raises(LongswiftError, match="--seq-len must be at least"):
        TrainConfig(seq_len=3)
    with pytest.raises(LongswiftError, match=r"--warmup \(500 steps\) must be below --steps \(300\): lower --warmup"):
        TrainConfig(warmup=500)  # the learning rate would never reach its peak nor decay
    with pytest.raises(LongswiftError, match="must be below --steps"):
        TrainConfig(steps=20)  # the default warmup of 50: say so rather than train at a rising rate throughout
    for bad in (float("nan"), float("inf"), -0.1):  # nan: torch's ValueError after loading; inf: NaN heads saved
        with pytest.raises(LongswiftError, match="--weight-decay must be a number >= 0"):
            TrainConfig(weight_decay=bad)
    # 1e30 is finite and was taken: AdamW's 1 - lr x decay scaled the heads by -3e28 and training diverged
    with pytest.raises(LongswiftError, match=r"^--weight-decay 1e\+30 at --lr 0.03 scales the "
                                             r"heads by -3e\+28 a step"):
        TrainConfig(weight_decay=1e30)
    assert TrainConfig(weight_decay=33.0).weight_decay == 33.0  # (0.01 of the heads kept a step: harsh, not broken)


def test_self_distill_greedy_matches_our_ar(tiny, tmp_path):
    """The batched transformers twin with our transform as logits processor writes what our own AR
    writes (greedy, windowed penalty, prompts of different lengths padded on the left)."""
    sampling = SamplingConfig(temperature=0, repetition_penalty=1.3, penalty_window=6, seed=0)
    prompts = [[5, 9, 11, 4], [17, 3], [40, 41, 42, 43, 44, 45]]
    docs = self_distill(tiny, 3 * 12, new_tokens=12, batch_size=3, sampling=sampling, cache_dir=tmp_path,
                        progress=False, prompts=prompts)
    for prompt, doc in zip(prompts, docs):
        ours = tiny.generate(prompt, method="ar", sampling=sampling,
                             generation=GenerationConfig(max_new_tokens=12, ignore_eos=True))
        assert doc == prompt + ours.token_ids
    cached = list(tmp_path.glob("*.json"))
    assert len(cached) == 1
    again = self_distill(tiny, 3 * 12, new_tokens=12, batch_size=3, sampling=sampling, cache_dir=tmp_path,
                         progress=False, prompts=prompts)
    assert again == docs


def test_self_distill_past_the_machines_memory_is_refused_at_once(tiny, tmp_path, monkeypatch):
    """--self-distill 100000000000 built a list of 10^9 prompts for minutes, gigabytes deep, without a word."""
    import longswift.train.distill as distill
    from longswift.runtime import memory

    monkeypatch.setattr(distill, "_sampler", lambda engine: pytest.fail("sampled before refusing"))
    monkeypatch.setattr(memory, "available_bytes", lambda device: 8 * memory.GiB)
    with pytest.raises(LongswiftError, match=r"^--self-distill 100,000,000,000 tokens would hold ~5,215.4 GiB of "
                                             r"documents in memory, more than the 8.0 GiB available: lower it"):
        self_distill(tiny, 10**11, new_tokens=100, cache_dir=tmp_path, progress=False)
    distill.check_distill_memory(10**8)  # 5.2 GiB: taken


def test_self_distill_refuses_documents_shorter_than_a_window_before_sampling(tiny, tmp_path, monkeypatch):
    """eval-heads' default --seq-len 1024 with the default --distill-new-tokens 512 sampled for minutes and
    then found no document long enough: now refused before sampling, with the numbers that would work."""
    import longswift.train.distill as distill

    monkeypatch.setattr(distill, "_sampler", lambda engine: pytest.fail("sampled before refusing"))
    sampling = SamplingConfig(temperature=0, seed=0)
    prompts = [[5, 9, 11, 4], [17, 3], [40, 41, 42, 43, 44, 45]]  # 16 tokens in documents of 8: the first two
    with pytest.raises(LongswiftError, match=r"a prompt of at most 4 tokens \+ --distill-new-tokens 8\) are shorter "
                                             r"than --seq-len 16, so none would make a window: raise "
                                             r"--distill-new-tokens to 12 or lower --seq-len to 12"):
        self_distill(tiny, 16, new_tokens=8, batch_size=2, sampling=sampling, cache_dir=tmp_path, progress=False,
                     prompts=prompts, window=16)
    monkeypatch.undo()
    docs = self_distill(tiny, 16, new_tokens=8, batch_size=2, sampling=sampling, cache_dir=tmp_path, progress=False,
                        prompts=prompts, window=12)
    assert cut_windows(docs, 12).shape == (1, 12)  # the longest prompt's document fills one


def test_heads_commands_pass_their_window_to_self_distill(tiny, monkeypatch):
    """train-heads / eval-heads (prepare_windows) have self_distill refuse a --seq-len no document reaches."""
    from argparse import Namespace

    import longswift.train.distill as distill
    from longswift.cli.heads import prepare_windows

    class Tokenizer:  # the tiny model has none; the built-in prompts only need encoding
        chat_template = None

        def encode(self, text, add_special_tokens=True):
            return [3 + ord(c) % 90 for c in text[:10]]

    monkeypatch.setattr(tiny, "tokenizer", Tokenizer())
    monkeypatch.setattr(distill, "_sampler", lambda engine: pytest.fail("sampled before refusing"))
    args = Namespace(data=[], self_distill=64, distill_new_tokens=8, distill_batch=8, no_progress=True)
    with pytest.raises(LongswiftError, match=r"at most 10 tokens \+ --distill-new-tokens 8\) are shorter than "
                                             r"--seq-len 24"):
        prepare_windows(tiny, args, [], 24, seed=1)


def test_self_distill_caches_where_the_tokenizer_cache_does(tiny, tmp_path, monkeypatch):
    """The default cache is `$LONGSWIFT_CACHE_DIR/distill` (the tokenizer cache's root); an empty
    LONGSWIFT_CACHE_DIR turns it off, and a cache that cannot be written is skipped, not an error."""
    sampling = SamplingConfig(temperature=0, seed=0)
    prompts = [[5, 9, 11, 4]]
    monkeypatch.setenv("LONGSWIFT_CACHE_DIR", str(tmp_path / "root"))
    first = self_distill(tiny, 8, new_tokens=8, batch_size=1, sampling=sampling, progress=False, prompts=prompts)
    assert len(list((tmp_path / "root" / "distill").glob("*.json"))) == 1
    monkeypatch.setenv("LONGSWIFT_CACHE_DIR", "")
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "xdg"))
    assert self_distill(tiny, 8, new_tokens=8, batch_size=1, sampling=sampling, progress=False,
                        prompts=prompts) == first
    assert not home.exists()
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    assert self_distill(tiny, 8, new_tokens=8, batch_size=1, sampling=sampling, progress=False, prompts=prompts,
                        cache_dir=blocked / "distill") == first


def fine_tune_of():
    """The tiny model's fine-tune: its decoder layers changed, its embeddings, LM head and final norm kept (as a
    merged LoRA's), so it has the tiny model's fingerprint and other hidden states."""
    hf = tiny_hf_model("llama", seed=3, vocab=96)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.startswith("model.layers.") and "norm" not in name:
                p.add_(0.3 * torch.randn_like(p) * p.std())
    return longswift.load(hf, pack_weights=False)


def test_a_fine_tune_with_its_bases_embeddings_gets_no_cached_text_or_checkpoint_of_the_base(tiny, tmp_path,
                                                                                              monkeypatch):
    """The self-distill cache and a training resume knew a model by its fingerprint (shapes, a corner of the
    embedding table): a fine-tune that keeps its base's embeddings was served the base's text, and a resume
    mixed the two models' hidden states. The rope scaling was not in the cache's key either."""
    import longswift.train.distill as distill
    import longswift.train.train as train_module

    fine = fine_tune_of()
    assert fine.fingerprint == tiny.fingerprint
    run = dict(new_tokens=8, batch_size=2, sampling=SamplingConfig(temperature=0, seed=0), progress=False,
               prompts=[[5, 9, 11, 4], [7, 8]])
    base_docs = self_distill(tiny, 16, cache_dir=tmp_path / "cache", **run)
    fine_docs = self_distill(fine, 16, cache_dir=tmp_path / "cache", **run)
    assert fine_docs == self_distill(fine, 16, cache_dir=None, **run) != base_docs
    assert self_distill(tiny, 16, cache_dir=tmp_path / "cache", **run) == base_docs  # (its own entry, again)
    scaled = longswift.load(tiny_hf_model("llama", seed=3, vocab=96), pack_weights=False, rope_scaling="linear:2")
    sampled = []
    real = distill._sampler
    monkeypatch.setattr(distill, "_sampler", lambda engine: sampled.append(1) or real(engine))
    self_distill(scaled, 16, cache_dir=tmp_path / "cache", **run)
    assert sampled == [1]  # sampled: not the unscaled model's entry

    windows = _windows(tiny, n=3, seed=2)
    cfg = TrainConfig(steps=2, seq_len=24, batch_size=1, warmup=1, checkpoint_every=1)
    train_heads(tiny, windows, cfg, tmp_path / "out", progress=False)
    (tmp_path / "out" / HEADS_FILE).unlink()  # the checkpoint alone: a run to continue
    (tmp_path / "out" / "train_log.json").unlink()
    monkeypatch.setattr(train_module, "base_hidden", lambda *a, **k: pytest.fail("hidden states before refusing"))
    with pytest.raises(LongswiftError, match="was trained on another model with this one's embeddings \\(a fine-tune "
                                             "of it, or its base\\): resume with the --model it was started with"):
        train_heads(fine, windows, cfg, tmp_path / "out", resume=True, progress=False)


def test_self_distill_stopped_between_batches_goes_on_from_the_batches_it_finished(tiny, tmp_path, monkeypatch):
    """Sampling the shipped heads' documents took 8-9 minutes, and a Ctrl-C threw every finished batch
    away (the cache was written at the end only): each batch is now kept as it finishes, and the next run
    with the same settings samples only the rest, to the documents an uninterrupted run writes."""
    import longswift.train.distill as distill

    sampling = SamplingConfig(seed=3)
    prompts = [[5, 9, 11, 4], [7, 8], [20, 21, 22]]
    run = dict(new_tokens=8, batch_size=2, sampling=sampling, progress=False, prompts=prompts)
    whole = self_distill(tiny, 40, cache_dir=None, **run)  # 5 documents: batches of 2, 2, 1
    real, calls = distill._sampler, []

    class Twin:
        def __init__(self, engine, stop_at):
            self.twin, self.stop_at = real(engine), stop_at

        def generate(self, *args, **kwargs):
            calls.append(1)
            if len(calls) == self.stop_at:
                raise KeyboardInterrupt
            return self.twin.generate(*args, **kwargs)

    monkeypatch.setattr(distill, "_sampler", lambda engine: Twin(engine, stop_at=3))
    with pytest.raises(KeyboardInterrupt):
        self_distill(tiny, 40, cache_dir=tmp_path, **run)
    assert [p.name.endswith(".partial.json") for p in tmp_path.iterdir()] == [True]
    calls.clear()
    monkeypatch.setattr(distill, "_sampler", lambda engine: Twin(engine, stop_at=0))
    assert self_distill(tiny, 40, cache_dir=tmp_path, **run) == whole
    assert len(calls) == 1  # the last batch only
    assert [p.name.endswith(".partial.json") for p in tmp_path.iterdir()] == [False]  # the whole entry, alone


def test_self_distill_sampled_rows_follow_the_transform(tiny, tmp_path):
    """Sampled self-distill draws only tokens the transform keeps (min-p here), and is seeded."""
    sampling = SamplingConfig(temperature=1.0, min_p=0.3, repetition_penalty=1.0, seed=4)
    prompts = [[5, 9, 11, 4], [17, 3]]
    a = self_distill(tiny, 2 * 10, new_tokens=10, batch_size=2, sampling=sampling, cache_dir=tmp_path / "a",
                     progress=False, prompts=prompts)
    b = self_distill(tiny, 2 * 10, new_tokens=10, batch_size=2, sampling=sampling, cache_dir=tmp_path / "b",
                     progress=False, prompts=prompts)
    assert a == b
    from longswift.sampling import transform

    for prompt, doc in zip(prompts, a):
        ids = torch.tensor(doc)
        logits, _ = tiny.model.forward(ids, torch.arange(len(doc)), None)
        kept = transform(logits, torch.empty(len(doc), 0, dtype=torch.long), sampling) > float("-inf")  # [T, V]
        for t in range(len(prompt), len(doc)):
            assert kept[t - 1, doc[t]], (t, doc[t])


def test_self_distill_draws_from_every_token_the_transform_keeps(tmp_path):
    """transformers' generate() filled the unset top_k with its default of 50: under plain temperature-1 sampling
    no drawn token ranked past the 50th of the model's logits, where this tiny model of 264 tokens draws about a
    third of its tokens (its probability there, summed over these 80 draws, is about 35)."""
    engine = longswift.load(tiny_hf_model("llama", seed=3, vocab=264), pack_weights=False)
    sampling = SamplingConfig(temperature=1.0, min_p=0.0, repetition_penalty=1.0, seed=4)
    prompts = [[5, 9, 11, 4], [17, 3]]
    docs = self_distill(engine, 2 * 40, new_tokens=40, batch_size=2, sampling=sampling, cache_dir=tmp_path,
                        progress=False, prompts=prompts)
    ranks, expected = [], 0.0
    for prompt, doc in zip(prompts, docs):
        logits, _ = engine.model.forward(torch.tensor(doc), torch.arange(len(doc)), None)  # [T, V]
        for t in range(len(prompt), len(doc)):
            ranks.append(int((logits[t - 1] > logits[t - 1, doc[t]]).sum()))
            expected += float(logits[t - 1].double().softmax(-1).sort(descending=True).values[50:].sum())
    beyond = sum(r >= 50 for r in ranks)
    assert beyond >= 10, (beyond, expected, sorted(ranks))


def test_held_out_alpha_shows_its_progress_and_equals_a_plain_generation(capsys):
    """eval-heads' alpha generation (a minute at its default length on a CPU) shows a bar unless
    --no-progress, and its stats are those of the same generation run without one."""
    engine = longswift.load(tiny_hf_model("llama", seed=3, vocab=96), pack_weights=False, heads="random")
    engine.tokenizer = None
    prompt = [5, 6, 7, 8]
    every_step = longswift.SpecConfig(adaptive=False)  # adaptive choices depend on timings
    stats = held_out_alpha(engine, 12, prompt=prompt, spec=every_step, progress=True)
    assert "alpha generation" in capsys.readouterr().err
    same = engine.generate(prompt, sampling=SamplingConfig(seed=0), method="tokenswift", spec=every_step,
                           generation=GenerationConfig(max_new_tokens=12, ignore_eos=True)).stats
    assert (stats.new_tokens, stats.accepted_tokens, stats.draft_positions) == (
        same.new_tokens, same.accepted_tokens, same.draft_positions)
    held_out_alpha(engine, 4, prompt=prompt)
    assert capsys.readouterr().err == ""


def test_a_run_whose_loss_rose_is_told_its_heads_did_not_learn():
    """--lr 10 on the embedded model ended at loss 1339 from 19, exit 0, with no word: a finite loss is not
    caught as divergence, so a finished run compares its last step's loss with its first's."""
    log = [{"loss": 19.0}] + [{"loss": 40.0}] * 4 + [{"loss": 1339.1}] * 4
    assert not_converged(log, 10.0) == ("the last 8 steps' mean loss (689.550) is above the first step's (19.000): "
                                        "the heads did not learn; train again into a new --out with a lower --lr "
                                        "(now 10)")
    noisy = [{"loss": 19.0}] + [{"loss": 15.0}, {"loss": 21.0}] * 4  # steps above the first, their mean (18) below
    assert not_converged(noisy, 0.03) is None
    assert not_converged([{"loss": 19.0}, {"loss": 1339.1}], 0.03) is None  # too short to judge (a batch's noise)


def test_distill_padding_is_out_of_the_penalty_window_and_real_tokens_in():
    from longswift.sampling import transform
    from longswift.train.distill import _LongswiftTransform

    s = SamplingConfig(temperature=1.0, repetition_penalty=2.0, penalty_window=4)
    ids = torch.tensor([[0, 0, 5, 6], [1, 2, 3, 4]])
    scores = torch.ones(2, 10)
    got = _LongswiftTransform(s, torch.tensor([2, 0]))(ids, scores)
    want = transform(scores, torch.tensor([[-1, -1, 5, 6], [1, 2, 3, 4]]), s)
    assert torch.equal(got, want)


def test_distill_batches_of_the_same_prompts_draw_different_text(tiny, tmp_path):
    docs = self_distill(tiny, 4 * 8, new_tokens=8, batch_size=2, sampling=SamplingConfig(seed=1, temperature=1.0),
                        cache_dir=tmp_path, progress=False, prompts=[[5, 9], [17, 3]])
    assert docs[:2] != docs[2:]


def test_distill_holds_at_least_the_tokens_asked_for(tiny, tmp_path):
    prompts = [[5, 9], [17, 3]]
    docs = self_distill(tiny, 20, new_tokens=8, batch_size=2, sampling=SamplingConfig(temperature=0),
                        cache_dir=tmp_path, progress=False, prompts=prompts)
    assert sum(len(d) - 2 for d in docs) >= 20


def test_distill_a_document_that_exactly_fills_the_context_is_allowed(tiny):
    limit = tiny.cfg.context_limit
    with pytest.raises(LongswiftError, match="shorter than --seq-len"):  # past the context check
        # (refused before the cache is used)
        self_distill(tiny, 1, new_tokens=limit - 4, prompts=[[1, 2, 3, 4]], window=10**6, cache_dir=None)


def test_the_hidden_state_pass_runs_on_the_windows_the_steps_read(tiny, tmp_path, monkeypatch):
    """A review: 1.5 MB of text (9,375 windows) for 2 steps of 2 ran the base over every window, minutes and
    gigabytes for windows no step draws. Now only the ones read, and the heads are bit for bit those of a run
    whose hidden states hold every window; from an epoch on, every window is read."""
    import longswift.train.train as tt

    windows = _windows(tiny, n=12)
    cfg = TrainConfig(steps=3, lr=1e-2, seq_len=24, batch_size=2, warmup=1, checkpoint_every=10, bf16_lm_head=False)
    seen = []
    monkeypatch.setattr(tt, "base_hidden", lambda model, w, progress=False: seen.append(w) or base_hidden(model, w))
    lines: list[str] = []
    trainer = train_heads(tiny, windows, cfg, tmp_path / "a", progress=False, log=lines.append)
    read = sorted({int(i) for step in range(3) for i in trainer.batch_windows(step, 0)})
    assert len(read) == 6 and torch.equal(seen[0], windows[read])
    assert "base model's hidden states of 6 windows (of 12: the ones 3 steps of 2 read)" in lines
    from longswift.spec.heads import training_record

    # the heads' record (and `info`) count the windows trained on, not the data's (it said 12)
    assert trainer.windows_read == 6 and training_record(tmp_path / "a" / "heads.safetensors")["windows"] == 6
    assert trainer.targets.shape == (cfg.gamma, 6, 24)  # (the targets too: those of all 12 were held, a review found)
    everything = HeadTrainer(tiny, windows, base_hidden(tiny.model, windows), cfg)
    for _ in range(3):
        everything.run_step()
    for got, want in zip(trainer.heads.parameters(), everything.heads.parameters()):
        assert torch.equal(got, want)
    seen.clear()
    train_heads(tiny, windows, dataclasses.replace(cfg, steps=7), tmp_path / "b", progress=False)  # 14 reads: all 12
    assert torch.equal(seen[0], windows)


def test_a_batch_larger_than_the_data_is_refused(tiny, tmp_path, capsys, monkeypatch):
    """--batch-size 1000 on 12 windows read each ~83 times a step, for minutes a step, without a word: refused,
    from the API (naming the field) and the command line (the flag, in one line, leaving no --out behind)."""
    from conftest import assert_one_line_error, run_cli, tiny_hf_model

    import longswift.cli.heads as heads_cli
    from longswift.errors import ConfigError

    windows = _windows(tiny, n=3)
    with pytest.raises(ConfigError, match="TrainConfig.batch_size=4 exceeds the 3 windows of the training data: a "
                                          "batch would hold each window 1.3 times on average; give at most 3, or more "
                                          "data"):
        train_heads(tiny, windows, TrainConfig(steps=2, seq_len=24, batch_size=4, warmup=1), tmp_path / "a")
    assert not (tmp_path / "a").exists()
    with pytest.raises(ConfigError, match=r"^TrainConfig.batch_size=2 x grad_accum=2 = 4 windows a step exceeds the 3 "
                                          r"windows of the training data: a step would read each window 1.3 times on "
                                          r"average; give a grad_accum of at most 1, or more data$"):
        train_heads(tiny, windows, TrainConfig(steps=2, seq_len=24, batch_size=2, grad_accum=2, warmup=1),
                    tmp_path / "a")  # (a batch of 300 x 20 on 308 windows read each ~19 times a step)
    assert not (tmp_path / "a").exists()
    tiny_hf_model("llama", seed=3, vocab=96).save_pretrained(tmp_path / "m")
    (tmp_path / "d.txt").write_text("text")
    monkeypatch.setattr(heads_cli, "prepare_windows", lambda *a, **k: (windows, None, {}))  # (no tokenizer: ids given)
    capsys.readouterr()
    code, _, err = run_cli(capsys, "train-heads", "--model", str(tmp_path / "m"), "--data", str(tmp_path / "d.txt"),
                           "--out", str(tmp_path / "o"), "--seq-len", "24", "--batch-size", "50", "--steps", "2",
                           "--warmup", "1", "--no-progress", "--threads", "1")
    assert_one_line_error(code, err, "--batch-size 50 exceeds the 3 windows of the training data: a batch would hold "
                                     "each window 16.7 times on average; give at most 3, or more data")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("failure", [RuntimeError("CUDA out of memory"), KeyboardInterrupt()])
def test_train_heads_failing_before_a_checkpoint_leaves_no_out_behind(tmp_path, capsys, monkeypatch, failure):
    """The --out train-heads made was removed after a LongswiftError only: an allocation's RuntimeError, or a
    KeyboardInterrupt that came from no signal of its StopRequest, left it behind, empty. Once a checkpoint is
    saved, --out stays (it resumes)."""
    from conftest import run_cli, tiny_hf_model

    import longswift.cli.heads as heads_cli
    import longswift.train.train as train_module

    tiny_hf_model("llama", seed=3, vocab=96).save_pretrained(tmp_path / "m")
    (tmp_path / "d.txt").write_text("text")
    capsys.readouterr()

    def fail(*args, **kwargs):
        raise failure

    def train_heads(out):  # (main says a KeyboardInterrupt in a line, exit 130; a RuntimeError is a traceback)
        try:
            code, _, err = run_cli(capsys, "train-heads", "--model", str(tmp_path / "m"), "--data",
                                   str(tmp_path / "d.txt"), "--out", str(out), "--seq-len", "24", "--steps", "2",
                                   "--warmup", "1", "--no-progress", "--threads", "1")
            assert code == 130 and isinstance(failure, KeyboardInterrupt), err
        except RuntimeError as exc:
            assert exc is failure

    monkeypatch.setattr(heads_cli, "prepare_windows", fail)
    train_heads(tmp_path / "o" / "deeper")
    assert not (tmp_path / "o").exists()

    def saved_then_fail(engine, windows, cfg, out, **kwargs):
        (out / "checkpoint.pt").write_bytes(b"a step's")
        raise failure

    monkeypatch.setattr(heads_cli, "prepare_windows", lambda *a, **k: (torch.zeros(3, 24, dtype=torch.long), None, {}))
    monkeypatch.setattr(train_module, "train_heads", saved_then_fail)
    train_heads(tmp_path / "o")
    assert (tmp_path / "o" / "checkpoint.pt").read_bytes() == b"a step's"


def test_a_batch_larger_than_the_self_distilled_windows_is_refused_before_sampling(tiny, tmp_path, capsys,
                                                                                    monkeypatch):
    """--batch-size past the windows was refused after self-distill had sampled (minutes): every self-distilled
    document is its prompt + --distill-new-tokens (EOS is banned: no row ends early), so the windows are counted
    before sampling, exactly: the count equals the windows the sampled documents give."""
    from argparse import Namespace

    from conftest import assert_one_line_error, run_cli, tiny_hf_model

    import longswift.engine
    import longswift.train.distill as distill
    from longswift.cli.heads import prepare_windows

    class Tokenizer:  # the tiny model has none; prompts of 6 to 19 tokens, as the first words of each request
        chat_template = None

        def encode(self, text, add_special_tokens=True):
            return [3 + ord(c) % 90 for c in text[: 6 + len(text) % 14]]

    monkeypatch.setattr(tiny, "tokenizer", Tokenizer())
    (tmp_path / "d.txt").write_text("a document of a window and a half")
    args = Namespace(data=[str(tmp_path / "d.txt")], self_distill=72, distill_new_tokens=6, distill_batch=4,
                     no_progress=True)
    counted: list[int] = []
    windows, _, info = prepare_windows(tiny, args, read_texts(args.data), 12, seed=1, check=counted.append)
    assert counted == [info["windows"]] == [windows.shape[0]] > [0] and info["prompt_only_windows"] > 0

    tiny_hf_model("llama", seed=3, vocab=96).save_pretrained(tmp_path / "m")
    monkeypatch.setattr(longswift.engine, "load", lambda *a, **k: tiny)  # (with the tokenizer above)
    monkeypatch.setattr(distill, "_sampler", lambda engine: pytest.fail("sampled before refusing"))
    monkeypatch.setenv("LONGSWIFT_CACHE_DIR", str(tmp_path / "cache"))  # (not the documents sampled above)
    capsys.readouterr()
    code, _, err = run_cli(capsys, "train-heads", "--model", str(tmp_path / "m"), "--data", str(tmp_path / "d.txt"),
                           "--self-distill", "72", "--distill-new-tokens", "6", "--distill-batch", "4", "--seed", "1",
                           "--out", str(tmp_path / "o"), "--seq-len", "12", "--batch-size", "40", "--steps", "2",
                           "--warmup", "1", "--no-progress", "--threads", "1")
    assert_one_line_error(code, err, f"--batch-size 40 exceeds the {windows.shape[0]} windows of the training data")
    assert not (tmp_path / "o").exists()


def test_a_self_distilled_prompt_is_context_not_a_target(tiny):
    """A self-distilled document is its chat prompt + the model's tokens: windows took the prompt's tokens as
    targets (34 of 50 windows held only prompt at --distill-new-tokens 16 --seq-len 16), teaching the heads 32
    fixed requests. Now a window counts targets from its first token past the prompt, and one of prompt alone
    is dropped; plain documents (prompt 0) keep every target."""
    from longswift.train.data import counted_starts, cut_counted_windows

    doc = list(range(10, 22))  # 12 tokens, the first 8 a prompt: windows of 5 at 0 (all prompt) and 5
    assert counted_starts(12, 8, 5) == [(5, 3)]
    windows, first = cut_counted_windows([doc, doc], [8, 0], 5)
    assert windows.tolist() == [doc[5:10], doc[0:5], doc[5:10]] and first.tolist() == [3, 0, 0]
    targets = head_targets(windows, 3, first)
    assert targets[:, 0].tolist() == [[-100, 18, 19, -100, -100], [18, 19, -100, -100, -100],
                                      [19, -100, -100, -100, -100]]  # (17, the prompt's last token: no target)
    assert torch.equal(targets[:, 1:], head_targets(windows[1:], 3))
    with pytest.raises(LongswiftError, match="every window of --seq-len 5 tokens holds only prompt tokens"):
        cut_counted_windows([doc[:9]], [8], 5)
    with pytest.raises(LongswiftError, match=r"every --seq-len 5 window of the self-distilled documents \(a prompt of "
                                             r"at most 8 tokens \+ --distill-new-tokens 1\) holds only prompt tokens, "
                                             r"which are not trained on: raise --distill-new-tokens to at least 2$"):
        self_distill(tiny, 1, new_tokens=1, prompts=[doc[:8]], window=5, cache_dir=None)  # (before sampling)


def test_prompt_targets_add_nothing_to_the_loss_nor_the_accuracy(tiny):
    """With the same hidden states (the prompt as context), changing the prompt's tokens as targets changes
    neither a training step (its loss, the heads it makes) nor eval-heads' accuracy: they are not counted."""
    from longswift.train.data import cut_counted_windows

    docs = _windows(tiny, n=4, length=24, seed=7).tolist()
    windows, first = cut_counted_windows(docs, [9, 14, 0, 20], 12)  # (the 2nd's and 4th's first: all prompt)
    assert first.tolist() == [9, 0, 2, 0, 0, 8] and windows.shape[0] == 6
    other = windows.clone()
    for k, f in enumerate(first.tolist()):
        other[k, 2:f] = (other[k, 2:f] + 1) % 96  # (tokens 0, 1 are no target of any head)
    hidden = base_hidden(tiny.model, windows)
    cfg = TrainConfig(steps=2, lr=1e-2, seq_len=12, batch_size=6, warmup=0, bf16_lm_head=False)
    a, b = (HeadTrainer(tiny, w, hidden, cfg, first=first) for w in (windows, other))
    for _ in range(2):
        ma, mb = a.run_step(), b.run_step()
        assert ma.head_loss == mb.head_loss and ma.head_acc == mb.head_acc
    assert torch.equal(a.heads.weights, b.heads.weights)
    plain = HeadTrainer(tiny, other, hidden, cfg)  # (without `first`: the prompt's targets count, and differ)
    assert plain.run_step().head_loss != HeadTrainer(tiny, windows, hidden, cfg).run_step().head_loss
    acc = head_accuracy(tiny, a.heads, windows, first=first)  # (eval-heads: the same targets counted)
    with torch.no_grad():
        best = tiny.model.lm_head(a.heads(hidden.flatten(0, 1))).argmax(-1)  # [gamma, N*L]
    targets = head_targets(windows, 3, first).flatten(1, 2)
    assert acc.positions == int((targets[0] != -100).sum()) == 6 * 10 - (9 - 2) - (8 - 2)
    assert acc.top1 == ((best == targets).sum(1) / (targets != -100).sum(1).double()).tolist()


def test_self_distilled_windows_drop_prompt_only_ones_and_are_counted_before_sampling(tiny, tmp_path, monkeypatch):
    """prepare_windows counts, before sampling, the windows cutting gives: the self-distilled documents' windows
    of prompt alone left out; and a cache entry whose documents are not its prompts + new tokens is sampled
    again (its prompt lengths would mask the wrong tokens)."""
    from argparse import Namespace

    from longswift.cli.heads import prepare_windows
    from longswift.train.distill import PROMPTS

    class Tokenizer:  # prompts of 6 to 19 tokens
        chat_template = None

        def encode(self, text, add_special_tokens=True):
            return [3 + ord(c) % 90 for c in text[: 6 + len(text) % 14]]

    monkeypatch.setattr(tiny, "tokenizer", Tokenizer())
    monkeypatch.setenv("LONGSWIFT_CACHE_DIR", str(tmp_path))
    args = Namespace(data=[], self_distill=64, distill_new_tokens=8, distill_batch=8, no_progress=True)
    counted: list[int] = []
    windows, first, info = prepare_windows(tiny, args, [], 8, seed=1, check=counted.append)
    prompts = [len(Tokenizer().encode(p)) for p in PROMPTS[:8]]  # each document: its prompt + 8 tokens
    # windows of 8: each document's last one alone holds a token past the prompt, from index prompt % 8 on
    assert counted == [windows.shape[0]] == [info["windows"]] == [8]
    assert first.tolist() == [p % 8 for p in prompts]
    assert info["prompt_only_windows"] == sum(p // 8 for p in prompts) > 0
    (entry,) = [p for p in (tmp_path / "distill").glob("*.json")]
    stored = json.loads(entry.read_text())
    stored["documents"][0][0] += 1  # not its prompt: sampled again, to the same documents
    entry.write_text(json.dumps(stored))
    again, first_again, _ = prepare_windows(tiny, args, [], 8, seed=1)
    assert torch.equal(again, windows) and torch.equal(first_again, first)
