"""The embedded SmolLM2-135M-Instruct: greedy AR equals transformers' generate, chat template
and streaming text."""

from __future__ import annotations

import pytest
import torch

from longswift import GenerationConfig, SamplingConfig
from longswift.detok import IncrementalDecoder

PROMPTS = [
    "Write a long story about a lighthouse keeper who finds a message in a bottle.",
    "Explain, step by step, how a refrigerator keeps food cold.",
    "List ten facts about the history of mathematics.",
]


@pytest.mark.slow
@pytest.mark.parametrize("prompt", PROMPTS, ids=["story", "explain", "list"])
def test_greedy_ar_equals_transformers_generate(embedded, embedded_hf, prompt):
    ids = embedded.encode(prompt, chat=True)
    n = 128
    with torch.no_grad():
        ref = embedded_hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                   max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None,
                                   pad_token_id=2)[0, len(ids):].tolist()
    out = embedded.generate(ids, method="ar", sampling=SamplingConfig(temperature=0, repetition_penalty=1.0),
                            generation=GenerationConfig(max_new_tokens=n, ignore_eos=True))
    assert embedded.model.packed  # the fast path is what is being proven equal
    assert out.token_ids == ref


def test_chat_encoding_uses_the_gguf_chat_template(embedded):
    ids = embedded.encode("hello", chat=True)
    text = embedded.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")
    assert "hello" in text
    assert embedded.encode("hello") == embedded.tokenizer.encode("hello")


def test_streamed_text_equals_final_text(embedded):
    stream = embedded.stream("Tell me about café culture in Paris — and émigré writers.", chat=True,
                             sampling=SamplingConfig(seed=4), generation=GenerationConfig(max_new_tokens=60))
    decoder = IncrementalDecoder(embedded.tokenizer)
    pieces = [decoder.push(ids) for ids in stream]
    pieces.append(decoder.flush())
    assert "".join(pieces) == stream.result.text
    assert len(stream.result.token_ids) == stream.result.stats.new_tokens


def test_incremental_decoder_holds_back_partial_characters(embedded):
    tok = embedded.tokenizer
    ids = tok.encode("naïve 🙂 façade")
    decoder = IncrementalDecoder(tok)
    out = "".join(decoder.push([i]) for i in ids) + decoder.flush()
    assert out == tok.decode(ids, skip_special_tokens=True)
    assert "\ufffd" not in out
