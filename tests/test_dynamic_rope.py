"""Dynamic NTK rope past the trained context: its frequencies follow the sequence length, so AR's
decode step rotates each token with those of its own position. A verify pass (many positions in one
forward) and a resumed run's prefill (the output fed again in chunks) must rotate those rows the same
way: TokenSwift stays AR and a resumed run stays the uninterrupted one (float64, greedy: exact)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_hf_model

import longswift
from longswift import GenerationConfig, SamplingConfig, SpecConfig
from longswift.runtime.cache import FullKVCache

PROMPT = [3, 4, 5, 6, 7] * 4  # 20 tokens; the trained context is 32, the run goes to 60
GREEDY = SamplingConfig(temperature=0, repetition_penalty=1.0)
SAMPLED = SamplingConfig(seed=3, temperature=0.9, top_p=0.95, repetition_penalty=1.2, penalty_window=8)
GEN = GenerationConfig(max_new_tokens=40, ignore_eos=True)
SPEC = SpecConfig(tree="1,3,3,3", ngram_topk=4, adaptive=False)


@pytest.fixture(scope="module")
def dynamic_hf():
    return tiny_hf_model("llama", "dynamic", seed=31, dtype=torch.float64, vocab=24, max_position_embeddings=32)


@pytest.fixture(scope="module")
def dynamic(dynamic_hf):
    return longswift.load(dynamic_hf, dtype="float64", heads="random")


def test_a_prompt_past_the_trained_context_read_in_chunks_is_one_forward(dynamic, dynamic_hf):
    """transformers reads a prompt in one forward: every row with the frequencies of the whole prompt's length.
    Chunks of it are rotated with those too (each chunk's own length gave 0.4 relative error)."""
    prompt = torch.randint(3, 24, (45,), generator=torch.Generator().manual_seed(5))  # past the trained 32
    with torch.no_grad():
        ref = dynamic_hf(prompt[None]).logits[0, -1]
    last = {}
    for chunk in (16, 45):
        cache = FullKVCache(dynamic.cfg, 45, torch.float64, torch.device("cpu"))
        with torch.inference_mode():
            last[chunk], _ = dynamic.model.prefill(prompt, cache, chunk=chunk)
    assert torch.allclose(last[16], last[45], rtol=0, atol=1e-12)
    assert (last[16] - ref).abs().max() / ref.abs().max() < 1e-5  # (transformers' norms round in float32)


def test_a_row_of_a_many_row_forward_is_rotated_as_its_decode_step(dynamic):
    rope = dynamic.model.rope
    positions = torch.tensor([30, 31, 33, 33, 40])
    cos, sin = rope.cos_sin(positions, None, torch.float64)  # [T, 1, D]
    for i, p in enumerate(positions.tolist()):
        one_cos, one_sin = rope.cos_sin(positions[i : i + 1], p, torch.float64)  # AR's decode step at p
        assert torch.equal(cos[i], one_cos[0]) and torch.equal(sin[i], one_sin[0])
    chunk_cos, _ = rope.cos_sin(positions, 40, torch.float64)  # a prefill chunk: the longest length for all
    assert not torch.equal(chunk_cos[0], cos[0])


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("mode", ["paper", "fused"])
def test_tokenswift_equals_ar_past_the_trained_context(dynamic, sampling, mode):
    ar = dynamic.generate(PROMPT, sampling=sampling, generation=GEN, method="ar")
    spec = SpecConfig(tree=SPEC.tree, ngram_topk=SPEC.ngram_topk, adaptive=False, draft_mode=mode)
    ts = dynamic.generate(PROMPT, sampling=sampling, generation=GEN, method="tokenswift", spec=spec)
    assert ts.token_ids == ar.token_ids
    assert ts.stats.accepted_tokens > 0  # trie rows past the trained context were verified and kept


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("method", ["ar", "tokenswift"])
def test_a_resumed_run_equals_the_uninterrupted_one(dynamic, method, sampling):
    spec = SPEC if method == "tokenswift" else None
    full = dynamic.generate(PROMPT, sampling=sampling, generation=GEN, method=method, spec=spec).token_ids
    stream = dynamic.stream(PROMPT, sampling=sampling, generation=GEN, method=method, spec=spec)
    for _ in stream:
        if len(stream.token_ids) >= 20:  # context 40: past the trained 32
            ckpt = stream.checkpoint()
            break
    resumed = dynamic.resume(ckpt)
    for _ in resumed:
        pass
    assert resumed.result.token_ids == full
