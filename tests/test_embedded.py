"""The embedded SmolLM2-135M-Instruct: greedy AR equals transformers' generate, chat template
and streaming text."""

from __future__ import annotations

import pytest
import torch

from longswift import GenerationConfig, SamplingConfig, SpecConfig
from longswift.detok import IncrementalDecoder
from longswift.errors import ConfigTypeError, LongswiftError

PROMPTS = [
    "Write a long story about a lighthouse keeper who finds a message in a bottle.",
    "Explain, step by step, how a refrigerator keeps food cold.",
    "List ten facts about the history of mathematics.",
]


def hf_greedy_min_new_tokens(hf, ids: list[int], n: int) -> list[int]:
    """transformers' plain greedy with EOS masked until n tokens exist (min_new_tokens), as
    llama.cpp's --ignore-eos does: the oracle for `--ignore-eos --greedy --repetition-penalty 1`."""
    out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                      max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=hf.config.eos_token_id)
    return out[0, len(ids):].tolist()


@pytest.mark.slow
@pytest.mark.parametrize("prompt", PROMPTS, ids=["story", "explain", "list"])
def test_greedy_ar_equals_transformers_generate(embedded, embedded_hf, prompt):
    ids = embedded.encode(prompt, chat=True)
    n = 128
    with torch.no_grad():
        ref = hf_greedy_min_new_tokens(embedded_hf, ids, n)
    out = embedded.generate(ids, method="ar", sampling=SamplingConfig(temperature=0, repetition_penalty=1.0),
                            generation=GenerationConfig(max_new_tokens=n, ignore_eos=True))
    assert embedded.model.packed  # the fast path is what is being proven equal
    assert out.token_ids == ref


EOS_PROMPTS = ["Reply with one word: yes or no.", "Say hi.", "What is 2+2?", "Name a colour.", "Count to three."]


@pytest.mark.slow
def test_ignore_eos_equals_transformers_min_new_tokens_where_the_argmax_is_eos(embedded, embedded_hf):
    """A prompt whose greedy continuation reaches EOS within n tokens (found by a short search):
    `--ignore-eos --greedy --repetition-penalty 1` must mask EOS as transformers' min_new_tokens
    does, not emit it and go on; TokenSwift (both draft modes) gives the same tokens."""
    greedy = SamplingConfig(temperature=0, repetition_penalty=1.0)
    n = 40
    for prompt in EOS_PROMPTS:
        ids = embedded.encode(prompt, chat=True)
        free = embedded.generate(ids, method="ar", sampling=greedy, generation=GenerationConfig(max_new_tokens=n))
        if free.stats.finish_reason == "eos":
            break
    else:
        pytest.fail(f"no prompt of {EOS_PROMPTS} reaches EOS within {n} greedy tokens")
    eos_ids = embedded.eos_ids
    assert free.token_ids[-1] in eos_ids
    ref = hf_greedy_min_new_tokens(embedded_hf, ids, n)
    assert len(ref) == n and not eos_ids & set(ref)
    gen = GenerationConfig(max_new_tokens=n, ignore_eos=True)
    ar = embedded.generate(ids, method="ar", sampling=greedy, generation=gen)
    assert ar.token_ids == ref
    assert ar.token_ids[: len(free.token_ids) - 1] == free.token_ids[:-1]  # the same text up to the banned EOS
    shipped = embedded.heads
    embedded.set_heads("random")  # seeded: the drafts do not matter to the output, only the walk does
    try:
        for mode in ("paper", "fused"):
            ts = embedded.generate(ids, method="tokenswift", sampling=greedy, generation=gen,
                                   spec=SpecConfig(draft_mode=mode))
            assert ts.token_ids == ref, mode
    finally:
        embedded.set_heads(shipped)


def test_chat_encoding_uses_the_gguf_chat_template(embedded):
    ids = embedded.encode("hello", chat=True)
    text = embedded.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")
    assert "hello" in text
    assert embedded.encode("hello") == embedded.tokenizer.encode("hello")


def test_a_system_message_replaces_the_templates_default_one(embedded):
    """system= (--system) is the chat's system message, encoded as transformers' own template call does."""
    msgs = [{"role": "system", "content": "You write only haiku."}, {"role": "user", "content": "Rain."}]
    expected = embedded.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    ids = embedded.encode("Rain.", chat=True, system="You write only haiku.")
    assert embedded.tokenizer.decode(ids) == expected and "SmolLM" not in expected
    assert embedded.encode("Rain.", chat=None, system="You write only haiku.") == ids  # the CLI's default
    for prompt, chat, system, match in (("Rain.", False, "Be brief.", "chat template: pass chat=True with it"),
                                        ([5, 6], None, "Be brief.", "chat template, which takes prompt text, not"),
                                        ("Rain.", True, "  ", "system message is empty")):
        with pytest.raises(LongswiftError, match=match):
            embedded.encode(prompt, chat=chat, system=system)
    with pytest.raises(ConfigTypeError, match="system must be text"):
        embedded.stream("Rain.", chat=True, system=3)
    result = embedded.generate("Rain.", chat=True, system="You write only haiku.",
                               sampling=SamplingConfig(temperature=0), generation=GenerationConfig(max_new_tokens=3))
    assert result.stats.prompt_tokens == len(ids)


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
