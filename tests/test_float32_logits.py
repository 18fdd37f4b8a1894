"""--float32-logits: a bfloat16/float16 model's LM head keeps its logits in float32 (float32 sums of the
same bf16 inputs, no rounding of the result to bf16). The CPU path (a float32 copy of the head's
weight) is checked here against a float64 product; the CUDA path (a matmul with a float32 output)
in tests/test_cuda.py."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch
from conftest import tiny_hf_model

import longswift
from longswift import GenerationConfig, LongswiftError, SamplingConfig, SpecConfig
from longswift.runtime.model import Transformer

PROMPT = [5, 17, 99, 3, 42, 8, 77, 120, 64, 31, 5, 17, 99, 3]


def load(dtype: str, on: bool, pack: bool = True, tie: bool = False):
    return longswift.load(tiny_hf_model("llama", seed=23, tie=tie), device="cpu", dtype=dtype, heads="random",
                          float32_logits=on, pack_weights=pack)


def head_weight(model: Transformer) -> torch.Tensor:
    return model.embed if model.cfg.tie_word_embeddings else model.state["lm_head.weight"]


@pytest.mark.parametrize("pack", [True, False], ids=["packed", "unpacked"])
@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_bfloat16_logits_are_the_float32_product_of_the_bf16_inputs(pack, tie):
    on, off = load("bfloat16", True, pack, tie).model, load("bfloat16", False, pack, tie).model
    hidden = torch.randn(5, on.cfg.hidden_size).to(torch.bfloat16)  # [T, hidden]
    exact = on.norm(hidden, on.final_norm).double() @ head_weight(on).double().T  # [T, V]
    logits = on.logits(hidden)
    assert on.float32_logits and logits.dtype == torch.float32
    torch.testing.assert_close(logits.double(), exact, rtol=1e-5, atol=1e-5)
    rounded = off.logits(hidden)  # the default: the bf16 product, cast afterwards
    assert not off.float32_logits
    assert torch.equal(rounded, rounded.to(torch.bfloat16).float())
    assert not torch.equal(logits, logits.to(torch.bfloat16).float())  # these are not bf16 values
    assert (logits.double() - exact).abs().max() < (rounded.double() - exact).abs().max() / 10


def test_a_float32_model_is_unchanged():
    on, off = load("float32", True).model, load("float32", False).model
    hidden = torch.randn(3, on.cfg.hidden_size)
    assert not on.float32_logits
    assert torch.equal(on.logits(hidden), off.logits(hidden))


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=0, repetition_penalty=1.2, penalty_window=6),
                                      SamplingConfig(seed=3, temperature=0.8, top_p=0.9)], ids=["greedy", "sampled"])
def test_bfloat16_tokenswift_with_float32_logits_equals_ar(sampling):
    e = load("bfloat16", True)
    gen = GenerationConfig(max_new_tokens=48, ignore_eos=True)
    ar = e.generate(PROMPT, sampling=sampling, generation=gen, method="ar").token_ids
    for spec in (SpecConfig(tree="1,2,2", ngram_topk=2, adaptive=False),
                 SpecConfig(tree="1,2,2", ngram_topk=2, draft_mode="fused", adaptive=False)):
        out = e.generate(PROMPT, sampling=sampling, generation=gen, method="tokenswift", spec=spec)
        assert out.token_ids == ar, spec


def test_the_option_is_recorded_in_checkpoints_and_checked_on_resume():
    off = load("bfloat16", False)
    stream = off.stream(PROMPT, generation=GenerationConfig(max_new_tokens=20, ignore_eos=True), method="ar")
    steps = iter(stream)
    for _ in range(5):
        next(steps)
    ckpt = stream.checkpoint()
    assert ckpt.runtime["float32_logits"] is False
    with pytest.raises(LongswiftError, match="float32_logits False"):
        load("bfloat16", True).resume(ckpt)
    older = dataclasses.replace(ckpt, runtime={k: v for k, v in ckpt.runtime.items() if k != "float32_logits"})
    assert off.resume(older) is not None  # a checkpoint from before the option resumes as off
    with pytest.raises(LongswiftError, match="float32_logits False"):
        load("bfloat16", True).resume(older)


def test_tensor_parallel_refuses_the_option():
    e = load("bfloat16", False)
    tp = types.SimpleNamespace(plan=types.SimpleNamespace(vocab_per_rank=e.cfg.vocab_size))
    with pytest.raises(LongswiftError, match="not supported with tensor parallelism"):
        Transformer(e.cfg, e.model.full_state(), tp=tp, float32_logits=True)


def test_the_cli_flag_reaches_the_memory_plan(capsys):
    """Off CUDA the float32 head is a copy of the LM head's weight: `info` plans for it."""
    from conftest import run_cli

    def plan_line(*flags):
        code, out, err = run_cli(capsys, "info", "--dtype", "bfloat16", *flags)
        assert code == 0, err
        return next(line for line in out.splitlines() if line.startswith("memory plan"))

    copies = {flag: float(plan_line(*flag).split("weight copies ")[1].split(" GiB")[0])
              for flag in ((), ("--float32-logits",))}
    from longswift.runtime.linear import packing_supported
    from longswift.runtime.loading import load_config

    cfg = load_config(None, None)
    assert cfg.tie_word_embeddings  # the head's copies are of the embedding table; every other weight's replaces it
    head = cfg.vocab_size * cfg.hidden_size / 2**30
    packed = 2 if packing_supported(torch.bfloat16, torch.device("cpu")) else 0  # the bf16 head's packed copy
    assert copies[()] == pytest.approx(round(head * packed, 2), abs=1e-9)  # as printed: GiB to 2 decimals
    assert copies[("--float32-logits",)] == pytest.approx(round(head * 4, 2), abs=1e-9)  # the float32 copy instead
