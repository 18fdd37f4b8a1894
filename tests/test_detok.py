"""Streaming detokenization: the deltas IncrementalDecoder emits add up, at every step, to a prefix
of the text of all the ids, and at the end to that text (what --json and the Python result hold),
on a small byte-level BPE tokenizer whose tokens can end inside a UTF-8 character."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
from conftest import byte_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st

from longswift.detok import FINAL_AFTER, MAX_HELD, IncrementalDecoder, decode_text
from longswift.stream import GenerationStream
from longswift.stats import GenerationStats

TOKENIZER = byte_tokenizer()
TEXTS = ["naïve café", "🙂👍🏽", "東京の天気", "\x00\x07\t\r\n", "  ab ab", "𝔘𝔫𝔦", "don't .", "\ufffd"]
PIECES = st.one_of(
    st.sampled_from(TEXTS).map(lambda s: TOKENIZER.encode(s)),  # whole texts
    st.lists(st.integers(0, len(TOKENIZER) - 1), min_size=1, max_size=4),  # any tokens: bytes cut anywhere, <eos>
)


def stream_text(tokenizer, ids: list[int], cuts: list[int]) -> list[str]:
    """What a stream emits for `ids` pushed in blocks of the sizes in `cuts` (cycled), then flushed;
    checks at every push that nothing emitted is ever taken back."""
    full = decode_text(tokenizer, ids)
    decoder, pieces, i = IncrementalDecoder(tokenizer), [], 0
    while i < len(ids):
        k = cuts[len(pieces) % len(cuts)]
        pieces.append(decoder.push(ids[i:i + k]))
        i += k
        assert full.startswith("".join(pieces)), (ids[:i], pieces)
        ended_here = copy.deepcopy(decoder)  # the stream, had the run ended after this block
        assert "".join(pieces) + ended_here.flush() == decode_text(tokenizer, ids[:i])
    pieces.append(decoder.flush())
    return pieces


@settings(max_examples=300, deadline=None)
@given(st.lists(PIECES, min_size=1, max_size=10).map(lambda parts: [t for p in parts for t in p]),
       st.lists(st.integers(1, 5), min_size=1, max_size=4))
def test_the_stream_adds_up_to_the_text_at_every_block(ids, cuts):
    assert "".join(stream_text(TOKENIZER, ids, cuts)) == decode_text(TOKENIZER, ids)


NO_TEXT = [i for i in range(len(TOKENIZER)) if decode_text(TOKENIZER, [i]) in ("\ufffd", "")]  # lone bytes, <eos>
RUNS = st.lists(st.sampled_from(NO_TEXT), min_size=1, max_size=3).flatmap(  # a model stuck on a few of them
    lambda few: st.integers(17, 60).map(lambda n: [few[k % len(few)] for k in range(n)]))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(PIECES, RUNS), min_size=1, max_size=6).map(lambda parts: [t for p in parts for t in p]),
       st.lists(st.integers(1, 5), min_size=1, max_size=4))
def test_long_runs_of_tokens_without_text_stream_the_same_text(ids, cuts):
    """Runs longer than MAX_HELD of tokens that complete no text (bytes that are no UTF-8, <eos>)
    between and inside real text: the stream still adds up to the text at every block."""
    assert "".join(stream_text(TOKENIZER, ids, cuts)) == decode_text(TOKENIZER, ids)


@pytest.mark.parametrize("stuck", ["lone byte", "eos"])
def test_a_model_stuck_on_a_token_without_text_is_decoded_in_bounded_pieces(stuck, monkeypatch):
    """Each push decoded the whole run again while it completed no text: 10K such tokens took about
    a second a 1K. Now no push decodes more than a few dozen tokens."""
    token = TOKENIZER.encode("東")[0] if stuck == "lone byte" else TOKENIZER.convert_tokens_to_ids("<eos>")
    assert decode_text(TOKENIZER, [token]) == ("\ufffd" if stuck == "lone byte" else "")
    ids = TOKENIZER.encode("start ") + [token] * 3000 + TOKENIZER.encode(" end 東京")
    decoder, longest = IncrementalDecoder(TOKENIZER), [0]
    decode = decoder._decode
    monkeypatch.setattr(decoder, "_decode", lambda part: longest.append(len(part)) or decode(part))
    text = "".join(decoder.push([t]) for t in ids) + decoder.flush()
    assert text == decode_text(TOKENIZER, ids)
    assert max(longest[:-2]) <= 2 * MAX_HELD + FINAL_AFTER  # (flush decodes what is left)


def test_a_resumed_stream_goes_on_with_the_same_text():
    """A resumed run pushes the checkpoint's ids in one block, then the new ones."""
    ids = TOKENIZER.encode("café 🙂 東京")
    for cut in range(1, len(ids)):
        decoder = IncrementalDecoder(TOKENIZER)
        text = decoder.push(ids[:cut]) + "".join(decoder.push([t]) for t in ids[cut:]) + decoder.flush()
        assert text == "café 🙂 東京"


@pytest.mark.parametrize("text", ["Hello . Next", "I said \" hi \" , don 't you ?", "a ! b"])
def test_the_text_is_the_models_whatever_the_tokenizers_clean_up_setting(text):
    """clean_up_tokenization_spaces rewrites " ." as "." across token boundaries: the stream (which
    had emitted "Hello " before the "." came) lost the ".", and --output differed from --json's text."""
    tokenizer = byte_tokenizer(cleanup=True)
    ids = tokenizer.encode(text)
    assert "".join(stream_text(tokenizer, ids, [1])) == text
    result = GenerationStream(SimpleNamespace(tokenizer=tokenizer), None, iter([]),
                              GenerationStats("ar", 1), previous=ids).result_so_far()
    assert result.text == text
