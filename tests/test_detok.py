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


def sentencepiece_tokenizer():
    """Llama 2's kind of tokenizer: words with a leading "▁", byte fallback, and a decoder that strips
    the first space of what it decodes, so that a word decoded without the token before it loses its space."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"<0x{b:02X}>": 3 + b for b in range(256)}
    for word in ["▁hello", "▁world", "▁the", "▁end", "▁"]:
        vocab[word] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", bos_token="<s>", unk_token="<unk>")


@pytest.mark.parametrize("cuts", [[1], [2], [1, 3]])
def test_a_sentencepiece_words_leading_space_survives_streaming(cuts):
    """The decoder keeps the token before each delta as left context: decoded alone, "▁world" is "world"
    (SentencePiece decoders strip the first space), so a decoder that moved its context offset up to the
    read offset streamed "helloworld", and one that moved both past a token with no text (</s>, which
    decodes to "" like the text before it) lost the space of the word after it."""
    tokenizer = sentencepiece_tokenizer()
    words = ["▁hello", "▁world", "</s>", "▁the", "▁end", "<0xF0>", "<0x9F>", "<0x99>", "<0x82>", "▁hello"]
    ids = tokenizer.convert_tokens_to_ids(words)
    assert decode_text(tokenizer, ids) == "hello world the end🙂 hello"
    assert decode_text(tokenizer, ids[1:2]) == "world"  # the strip the left context is there for
    assert "".join(stream_text(tokenizer, ids, cuts)) == "hello world the end🙂 hello"


def test_a_character_split_by_a_token_without_text_is_held_back_whole():
    """After a long held run the text up to FINAL_AFTER tokens back is emitted as final. An <eos> inside a
    4-byte character (its bytes join when the special token is left out) makes its incomplete head span 4
    tokens, so keeping back only 3 emitted the head as "\\ufffd" and then the whole character after it. Two
    <eos> there cut it even with 4 kept back: tokens of no text are not counted among them."""
    lone = TOKENIZER.convert_tokens_to_ids(TOKENIZER.convert_ids_to_tokens(TOKENIZER.encode("東"))[1])
    emoji, eos = TOKENIZER.encode("🙂"), TOKENIZER.convert_tokens_to_ids("<eos>")
    assert decode_text(TOKENIZER, [lone]) == "\ufffd" and len(emoji) == 4
    for held in range(MAX_HELD - 6, 3 * MAX_HELD):  # (the held-back run moves on every MAX_HELD + 1 tokens)
        for split in range(1, 4):
            for eoses in (1, 2, 5):
                ids = TOKENIZER.encode("a ") + [lone] * held + emoji[:split] + [eos] * eoses + emoji[split:]
                assert "".join(stream_text(TOKENIZER, ids, [1])) == decode_text(TOKENIZER, ids), (held, split, eoses)


@pytest.mark.parametrize("bytes_", [[175, 234, 185, 106, 104], [167, 226, 119, 172, 100, 234, 211, 98],
                                    [149, 243, 168, 243, 236, 173, 106, 231, 88, 116]])
@pytest.mark.parametrize("cuts", [[1], [3], [1, 4, 2]])
def test_bytes_that_are_no_utf8_before_a_long_run_of_eos_stream_their_text(bytes_, cuts):
    """A long run of <eos> after bytes that are no UTF-8: the text up to 4 tokens of text back went out as final
    where those 4 cut a byte sequence, and from there on the rest decoded to one "\ufffd" more (5 for 4; a
    review's fuzz found 4 such cases in 3,000)."""
    eos = TOKENIZER.convert_tokens_to_ids("<eos>")
    ids = bytes_ + [eos] * 13
    assert "".join(stream_text(TOKENIZER, ids, cuts)) == decode_text(TOKENIZER, ids)
    ids = bytes_ + [eos] * 30 + TOKENIZER.encode("é")
    assert "".join(stream_text(TOKENIZER, ids, cuts)) == decode_text(TOKENIZER, ids)


def fake_stream(tokenizer, steps: list[list[int]], previous: list[int] | None = None, stop=None) -> GenerationStream:
    """A GenerationStream over given steps (each counted in the stats as the loops count them), no model."""
    from longswift.stop_strings import StopStrings

    stats = GenerationStats("ar", 1)

    def run():
        for ids in steps:
            stats.new_tokens += len(ids)
            yield ids

    checker = None if stop is None else StopStrings(tokenizer, stop, previous)
    return GenerationStream(SimpleNamespace(tokenizer=tokenizer), SimpleNamespace(generator=None), run(), stats,
                            previous=previous, stop=checker)


def test_a_streams_text_ends_with_what_its_last_token_left_incomplete_and_begins_with_a_resumes_text():
    """stream.text() flushes at the end (a run that ends inside a character yields its "\\ufffd", as
    result.text holds it), and a resumed stream's first piece is the text so far, decoded before the new
    tokens as their left context."""
    emoji = TOKENIZER.encode("🙂")
    steps = [TOKENIZER.encode("ab "), TOKENIZER.encode("東") + emoji[:2]]
    stream = fake_stream(TOKENIZER, steps)
    pieces = list(stream.text())
    assert pieces == ["ab ", "東\ufffd"] and "".join(pieces) == stream.result.text  # (held back whole, then flushed)
    resumed = fake_stream(TOKENIZER, [emoji, TOKENIZER.encode("!")], previous=TOKENIZER.encode("ab 東"))
    pieces = list(resumed.text())
    assert pieces[0] == "ab 東" and "".join(pieces) == resumed.result.text == "ab 東🙂!"


def test_a_stop_string_counts_only_the_tokens_it_keeps():
    """The step whose tokens complete a stop string is cut after the completing token, and the stats count
    the tokens kept (new_tokens equals the output's length), not one more or the whole step."""
    step = TOKENIZER.encode("xy STOP and more")
    stream = fake_stream(TOKENIZER, [TOKENIZER.encode("ab "), step, TOKENIZER.encode("never")], stop=("STOP",))
    assert [len(ids) for ids in stream] == [3, 7]
    assert stream.result.text == "ab xy STOP"
    assert stream.stats.new_tokens == len(stream.result.token_ids) == 10 and stream.stats.finish_reason == "stop"


SP = sentencepiece_tokenizer()
SP_BYTES = [SP.convert_tokens_to_ids(f"<0x{b:02X}>") for b in range(256)]
SP_WORDS = SP.convert_tokens_to_ids(["▁hello", "▁world", "▁the", "▁end", "▁", "</s>"])
SP_PIECES = st.one_of(
    st.sampled_from(["你好世界，", "测试。", "🙂", "é", "東京"]).map(lambda s: [SP_BYTES[b] for b in s.encode()]),
    st.lists(st.sampled_from(SP_BYTES), min_size=1, max_size=3),  # stray bytes: a run that is no UTF-8
    st.lists(st.sampled_from(SP_WORDS), min_size=1, max_size=3),  # words, </s> (which joins the runs beside it)
)


@settings(max_examples=300, deadline=None)
@given(st.lists(SP_PIECES, min_size=1, max_size=12).map(lambda parts: [t for p in parts for t in p]),
       st.lists(st.sampled_from([1, 2, 3, 5, 16]), min_size=1, max_size=4))
def test_a_byte_fallback_tokenizers_stream_adds_up_to_the_text_at_every_block(ids, cuts):
    """Byte fallback (Llama 2, Mistral, SentencePiece GGUFs) decodes a run of byte tokens as a whole, as U+FFFD a
    byte where the run is no UTF-8: blocks of 16 (CUDA's default token block) cut runs of Chinese and streamed
    U+FFFD where the text held the characters, and a stray byte after a character streamed that character
    where the text holds U+FFFD. A run's text now goes out when a token of text ends it."""
    assert "".join(stream_text(SP, ids, cuts)) == decode_text(SP, ids)


def test_a_model_stuck_on_a_stray_byte_of_a_byte_fallback_tokenizer_decodes_nothing_until_it_ends(monkeypatch):
    """An open byte run has no final text: pushing 3,000 stray bytes decodes nothing (no push decodes it whole
    again), and the word after it brings the run's U+FFFD with it."""
    ids = SP.convert_tokens_to_ids(["▁hello"]) + [SP_BYTES[0xA8]] * 3000 + SP.convert_tokens_to_ids(["▁end"])
    decoder, decoded = IncrementalDecoder(SP), []
    decode = decoder._decode
    monkeypatch.setattr(decoder, "_decode", lambda part: decoded.append(len(part)) or decode(part))
    pieces = [decoder.push([t]) for t in ids] + [decoder.flush()]
    assert "".join(pieces) == decode_text(SP, ids) == "hello" + "\ufffd" * 3000 + " end"
    assert len(decoded) <= 6 and pieces[-2] == "\ufffd" * 3000 + " end"


def test_added_special_tokens_count_as_special(embedded):
    """The embedded tokenizer names 3 special ids, but 17 added tokens are flagged special, and decoding leaves
    all of them out: the others were counted as text (a stop string split by them was missed)."""
    from longswift.detok import special_ids

    tokenizer = embedded.tokenizer
    assert set(tokenizer.all_special_ids) == {0, 1, 2}
    assert set(range(17)) <= special_ids(tokenizer)
    assert decode_text(tokenizer, list(range(3, 17))) == ""


@pytest.mark.parametrize("eoses", [MAX_HELD, MAX_HELD + 1, 40])
@pytest.mark.parametrize("split", [1, 2, 3])
@pytest.mark.parametrize("cuts", [[1], [3], [16]])
def test_a_character_whose_bytes_a_long_run_of_eos_splits_streams_whole(eoses, split, cuts):
    """A character's first bytes, then more than MAX_HELD <eos>, then its last bytes: the held run counted too few
    tokens of text, fell back to keeping only the last FINAL_AFTER tokens (all <eos>), and streamed the head of
    the character as "\\ufffd"; from there on the stream decoded its tail alone and lost the character."""
    emoji, eos = TOKENIZER.encode("🙂"), TOKENIZER.convert_tokens_to_ids("<eos>")
    ids = emoji[:split] + [eos] * eoses + emoji[split:] + TOKENIZER.encode(" ok")
    assert decode_text(TOKENIZER, ids) == "🙂 ok"
    assert "".join(stream_text(TOKENIZER, ids, cuts)) == "🙂 ok"


def test_a_sentencepiece_words_space_survives_a_long_run_of_eos_before_it():
    """"▁", then more than MAX_HELD </s>, then "▁world": the held run moved on with the lone "▁" as the
    left context it stripped, and the stream lost the space the text holds."""
    ids = SP.convert_tokens_to_ids(["▁"] + ["</s>"] * 30 + ["▁world"])
    assert decode_text(SP, ids) == " world"
    for cuts in ([1], [1, 5], [16]):
        assert "".join(stream_text(SP, ids, cuts)) == " world", cuts


class Counting(frozenset):
    checks = 0

    def __contains__(self, x):
        Counting.checks += 1
        return frozenset.__contains__(self, x)


def test_an_open_byte_run_costs_each_push_a_bounded_amount():
    """A byte-fallback model writing a long run of byte tokens (text outside the vocabulary): each push walked
    the whole open run back to its start, so 40K byte tokens took 18 s (quadratic)."""
    ids = [SP_BYTES[b] for b in ("東京" * 2000).encode()]  # 12,000 byte tokens, one run
    decoder = IncrementalDecoder(SP)
    decoder.bytes = Counting(decoder.bytes)
    Counting.checks = 0
    assert all(decoder.push(ids[i:i + 4]) == "" for i in range(0, len(ids), 4))
    assert Counting.checks <= 4 * len(ids)
    assert decoder.push(SP.convert_tokens_to_ids(["▁end"])) + decoder.flush() == "東京" * 2000 + " end"


def test_plain_text_streamed_a_token_at_a_time_decodes_a_bounded_tail_each_push(monkeypatch):
    """Each push decodes a short tail, not the text from its start: with the tail's start left where it was, the
    text came out the same and 3,000 pushes decoded 9 million ids (quadratic; a mutation audit, no test failed)."""
    ids = TOKENIZER.encode("the quick brown fox jumps over the lazy dog. " * 80)
    assert len(ids) > 2000
    decoder = IncrementalDecoder(TOKENIZER)
    decoded: list[int] = []
    decode = decoder._decode
    monkeypatch.setattr(decoder, "_decode", lambda part: decoded.append(len(part)) or decode(part))
    text = "".join(decoder.push([t]) for t in ids) + decoder.flush()
    assert text == decode_text(TOKENIZER, ids)
    assert max(decoded) <= 4 * FINAL_AFTER and sum(decoded) <= 4 * FINAL_AFTER * len(ids), (max(decoded), len(ids))


def test_a_named_special_token_that_decoding_keeps_is_streamed():
    """A tokenizer object whose pad token was set to an ordinary entry (`tok.pad_token = "a"`, not registered as
    special) names it among all_special_ids, and decoding keeps its text: the stream dropped it ("bnn" for
    "banana"; found by review)."""
    tokenizer = byte_tokenizer()
    tokenizer.pad_token = "a"
    ids = tokenizer.encode("banana")
    assert tokenizer.convert_tokens_to_ids("a") in tokenizer.all_special_ids  # (the premise)
    assert decode_text(tokenizer, ids) == "banana"
    for cuts in ([1], [2], [6]):
        assert "".join(stream_text(tokenizer, ids, cuts)) == "banana", cuts
