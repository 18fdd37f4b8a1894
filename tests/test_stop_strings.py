"""Stop strings: a run ends after the generated token that completes one; TokenSwift, whose steps
commit several tokens, ends after the same token as AR (lossless), and a resumed run stays ended."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from conftest import assert_one_line_error, byte_tokenizer, run_cli
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_detok import SP, SP_BYTES, SP_PIECES  # (imported inside a @given test, its own @given tests nested)

from longswift import GenerationConfig, SamplingConfig, SpecConfig
from longswift.detok import decode_text
from longswift.errors import ConfigTypeError, LongswiftError
from longswift.stats import GenerationStats, StepTokens
from longswift.stop_strings import StopStrings

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."
GREEDY, SAMPLED = SamplingConfig(temperature=0), SamplingConfig(seed=11)


def record_steps(monkeypatch, steps):
    """Append each drafting step's StepTokens to `steps` as TokenSwift makes it."""
    init = StepTokens.__init__
    monkeypatch.setattr(StepTokens, "__init__", lambda self, t, f: steps.append(self) or init(self, t, f))


def first_stop(tokenizer, ids, stop):
    """The number of tokens up to the first whose text completes `stop`, decoding every prefix."""
    return next(k for k in range(1, len(ids) + 1) if stop in decode_text(tokenizer, ids[:k]))


def transformers_stop(tokenizer, ids, stop):
    """The number of tokens after which transformers' StopStringCriteria ends a run on `stop` (None: never)."""
    from transformers import StopStringCriteria

    criteria = StopStringCriteria(tokenizer, [stop])
    return next((n for n in range(1, len(ids) + 1) if criteria(torch.tensor([ids[:n]]), None).item()), None)


BYTES = byte_tokenizer()  # every byte a token: a character of 4 UTF-8 bytes spans 4 tokens
TEXTS = ["🙂👍🏽 ", "東京の天気", "naïve café ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "ab ab", "x"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(TEXTS), min_size=1, max_size=8), st.integers(0, 10**6), st.integers(1, 8),
       st.lists(st.integers(1, 5), min_size=1, max_size=6))
@example(["x", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢"], 1, 6, [3])  # 6 characters of 4 bytes: 24 tokens
@example(["🙂👍🏽 ", "東京の天気"], 2, 5, [1])
def test_stop_strings_of_multibyte_characters_end_at_the_completing_token(pieces, start, length, blocks):
    """A stop string of emoji, CJK or other 4-byte characters (as many tokens as bytes) is found
    after the token that completes it, with the tokens pushed in blocks of any size: what a decode
    of every prefix finds (first_stop). A window of 3 tokens a character misses the first example."""
    text = "".join(pieces)
    ids = BYTES.encode(text)
    start %= len(text)
    stop = text[start:start + length]
    want = first_stop(BYTES, ids, stop)
    checker = StopStrings(BYTES, ("\x01", stop))  # (a second string, short: the longest sets the window)
    pushed = 0
    for i in range(len(ids)):
        block = ids[pushed:pushed + blocks[i % len(blocks)]]
        kept = checker.cut(block)
        if kept is not None:
            assert pushed + kept == want
            return
        pushed += len(block)
        if pushed >= len(ids):
            break
    pytest.fail(f"stop string {stop!r} never found; expected after token {want}")


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_tokenswift_stops_after_the_token_ar_stops_after(embedded, sampling, monkeypatch):
    """TokenSwift drafting at every step (adaptive off: several tokens a step) ends after AR's token,
    the step's later tokens dropped; greedy, some of these stops fall inside a step (checked)."""
    cuts, steps = [], []
    cut = StopStrings.cut
    monkeypatch.setattr(StopStrings, "cut", lambda self, ids: cuts.append((cut(self, ids), len(ids))) or cuts[-1][0])
    record_steps(monkeypatch, steps)
    free = embedded.generate(PROMPT, chat=True, method="ar", sampling=sampling,
                             generation=GenerationConfig(max_new_tokens=60, ignore_eos=True))
    words = [w for w in free.text.split() if len(w) >= 4 and w.isalpha()][:5]
    for word in words:
        k = first_stop(embedded.tokenizer, free.token_ids, word)
        gen = GenerationConfig(max_new_tokens=60, ignore_eos=True, stop=("@@never@@", word))
        for method in ("ar", "tokenswift"):
            steps.clear()
            result = embedded.generate(PROMPT, chat=True, method=method, sampling=sampling, generation=gen,
                                       spec=SpecConfig(adaptive=False))
            assert result.token_ids == free.token_ids[:k], (method, word)
            assert result.stats.finish_reason == "stop" and result.stats.new_tokens == k and word in result.text
        # the drafts accepted past the stop string are not the run's: each step emits its accepted drafts (n-gram
        # only or not), then a root (None). (These cuts drop at most a step's root: the test below cuts drafts.)
        flags = [f for step in steps for f in step.ngram + (None,)][: k - 1]  # (token 1 is the prefill's draw)
        assert result.stats.accepted_tokens == sum(f is not None for f in flags), word
        assert result.stats.ngram_accepted == sum(f is True for f in flags), word
    if sampling is GREEDY:  # (sampled, these heads' drafts are seldom accepted: the stops fall on 1-token steps)
        assert any(keep is not None and keep < n for keep, n in cuts)  # a stop inside a multi-token step
    never = embedded.generate(PROMPT, chat=True, method="tokenswift", sampling=sampling,
                              generation=GenerationConfig(max_new_tokens=60, ignore_eos=True, stop=("@@never@@",)))
    assert never.token_ids == free.token_ids and never.stats.finish_reason == "length"


def test_a_stop_string_inside_a_drafting_step_takes_back_the_drafts_it_drops():
    """Of a step that emitted 4 accepted drafts (the 2nd and 4th only the n-gram table proposed) and its new root,
    a cut after `keep` tokens leaves the accepted drafts before it: the root goes first, then the drafts from
    the last."""
    step = StepTokens([5, 6, 7, 8, 9], (False, True, False, True))
    for keep, accepted, ngram in [(5, 4, 2), (4, 4, 2), (3, 3, 1), (2, 2, 1), (1, 1, 0)]:
        before = GenerationStats("tokenswift", 3, new_tokens=10, steps=6, accepted_tokens=4, ngram_accepted=1)
        stats = replace(before, new_tokens=15, steps=7, accepted_tokens=8, ngram_accepted=3)
        stats.drop(step, keep, before)
        assert (stats.new_tokens, stats.steps) == (10 + keep, 7), keep
        assert (stats.accepted_tokens - 4, stats.ngram_accepted - 1) == (accepted, ngram), keep
    with pytest.raises(ValueError, match="new root"):
        StepTokens([5, 6], (False, True))


@pytest.mark.slow
def test_a_stop_string_inside_a_drafting_step_keeps_only_the_drafts_before_it(embedded, monkeypatch):
    """A stop string completed by the first token of a step of 3+ tokens (accepted drafts, then the new root)
    ends the run there, and the run's stats count only the accepted drafts before it (here 0 of that step's)."""
    steps = []
    record_steps(monkeypatch, steps)
    run = {"chat": True, "method": "tokenswift", "sampling": GREEDY, "spec": SpecConfig(adaptive=False)}
    whole = embedded.generate(PROMPT, generation=GenerationConfig(max_new_tokens=80, ignore_eos=True), **run)
    flags = [f for step in steps for f in step.ngram + (None,)]  # token 2 on (token 1 is the prefill's draw)
    starts = [1 + sum(len(st) for st in steps[:i]) for i, st in enumerate(steps) if len(st) >= 3]
    assert starts, [len(st) for st in steps]  # (these heads make 3-token steps: 5 of the first 40 here)
    k = starts[-1] + 1  # the run ends at that step's first token
    text = decode_text(embedded.tokenizer, whole.token_ids[:k])
    stop = next(text[-n:] for n in range(1, len(text) + 1)
                if first_stop(embedded.tokenizer, whole.token_ids, text[-n:]) == k)  # the shortest that ends there
    steps.clear()
    result = embedded.generate(PROMPT, generation=GenerationConfig(max_new_tokens=80, ignore_eos=True, stop=(stop,)),
                               **run)
    assert result.token_ids == whole.token_ids[:k] and result.stats.finish_reason == "stop"
    assert result.stats.accepted_tokens == sum(f is not None for f in flags[: k - 1])
    assert result.stats.ngram_accepted == sum(f is True for f in flags[: k - 1])
    assert result.stats.steps == len(steps) + 1


@pytest.mark.slow
def test_a_run_a_stop_string_ended_resumes_to_nothing_more(embedded, tmp_path):
    free = embedded.generate(PROMPT, chat=True, method="ar", sampling=SAMPLED,
                             generation=GenerationConfig(max_new_tokens=40, ignore_eos=True))
    word = next(w for w in free.text[len(free.text) // 2 :].split() if len(w) >= 3)
    gen = GenerationConfig(max_new_tokens=40, ignore_eos=True, stop=(word,))
    stream = embedded.stream(PROMPT, chat=True, method="tokenswift", sampling=SAMPLED, generation=gen)
    for _ in stream:
        pass
    stream.checkpoint().save(tmp_path / "ck.json")
    again = embedded.resume(tmp_path / "ck.json")
    assert list(again) == [] and again.result.token_ids == stream.result.token_ids
    assert again.result.stats.finish_reason == "stop"
    # interrupted before the stop string: the resumed run stops where the whole one did
    stream = embedded.stream(PROMPT, chat=True, method="tokenswift", sampling=SAMPLED, generation=gen)
    next(iter(stream))
    resumed = embedded.resume(stream.checkpoint())
    for _ in resumed:
        pass
    assert resumed.result.token_ids == again.result.token_ids and resumed.result.stats.finish_reason == "stop"


def test_bad_stop_strings_are_refused(embedded, capsys):
    with pytest.raises(LongswiftError, match="GenerationConfig.stop strings must be non-empty text"):
        GenerationConfig(stop=("",))
    with pytest.raises(ConfigTypeError, match="GenerationConfig.stop must be a string, or a tuple or list of strings"):
        GenerationConfig(stop=5)
    assert GenerationConfig(stop="end").stop == ("end",)  # one string: one stop string
    assert GenerationConfig(stop=["a", "b"]).stop == ("a", "b")  # a checkpoint's JSON list
    code, _, err = run_cli(capsys, "generate", "--prompt", "Hi", "--stop", "")
    assert_one_line_error(code, err, "--stop strings must be non-empty text")


@pytest.mark.slow
def test_the_command_line_stops_at_stop(embedded, tmp_path, capsys):
    free_json, json_file = tmp_path / "free.json", tmp_path / "o.json"
    common = ["generate", "--prompt", PROMPT, "--greedy", "--max-new-tokens", "40", "--ignore-eos", "--no-progress"]
    assert run_cli(capsys, *common, "--json", str(free_json))[0] == 0
    free = json.loads(free_json.read_text())
    word = next(w for w in free["text"][len(free["text"]) // 2 :].split() if len(w) >= 4 and w.isalpha())
    code, out, err = run_cli(capsys, *common, "--stop", "@@never@@", "--stop", word, "--json", str(json_file))
    data = json.loads(json_file.read_text())
    assert code == 0, err
    k = first_stop(embedded.tokenizer, free["token_ids"], word)
    assert data["token_ids"] == free["token_ids"][:k] and data["stats"]["finish_reason"] == "stop"
    assert word in data["text"] and out == data["text"] + "\n" and "stop: stop" in err


@pytest.mark.parametrize("stop", ["STOP", "🙂👍🏽"])
def test_a_stop_string_begun_before_a_resume_ends_the_resumed_run(stop):
    """A resumed run's checker starts from the last tokens generated before (`previous`): a stop string whose
    first tokens came before the checkpoint and whose last come after it ends the run at its completing
    token, as the uninterrupted run ends; a checker that forgot them let the run go on."""
    ids = BYTES.encode("ab " + stop + " more")
    want = first_stop(BYTES, ids, stop)
    for cut in range(4, want):  # every checkpoint inside the stop string
        checker = StopStrings(BYTES, (stop,), previous=ids[:cut])
        assert cut + checker.cut(ids[cut:]) == want, cut


@pytest.mark.parametrize("eoses", [1, 11, 40])
def test_special_tokens_inside_a_stop_string_do_not_hide_it(eoses):
    """Special tokens are no part of the text, but they filled the checker's window of tokens: 11 <eos> between
    "a" and "b" hid the stop string "ab" that the output's text holds. Also across a resume."""
    eos = BYTES.convert_tokens_to_ids("<eos>")
    ids = BYTES.encode("x a") + [eos] * eoses + BYTES.encode("b y")
    want = first_stop(BYTES, ids, "ab")
    assert decode_text(BYTES, ids[:want]).endswith("ab") and StopStrings(BYTES, ("ab",)).cut(ids) == want
    for cut in range(3, want):  # a checkpoint anywhere in the run of <eos>
        assert cut + StopStrings(BYTES, ("ab",), previous=ids[:cut]).cut(ids[cut:]) == want, cut


@pytest.mark.parametrize("method", ["ar", "tokenswift"])
def test_a_stop_string_inside_a_token_block_leaves_the_steps_that_ran(method, monkeypatch):
    """Tokens drawn past a stop string within a token block (read_every > 1; 16 on CUDA) are dropped, and so are
    their steps: the stats counted them (11 tokens in 16 steps), AR's and TokenSwift's plain blocks alike."""
    from conftest import tiny_hf_model

    import longswift
    from longswift.spec.schedule import FULL, LOOKUP, NARROW, PLAIN, StepSchedule

    rates = {FULL: 1.0, NARROW: 1.5, LOOKUP: 2.0, PLAIN: 3.0}  # plain steps lead: TokenSwift runs plain blocks
    monkeypatch.setattr(StepSchedule, "rate", lambda self, kind: rates[kind])
    engine = longswift.load(tiny_hf_model("llama", seed=5, vocab=260), dtype="float32", heads="random", read_every=8)
    engine.tokenizer = BYTES
    run = {"max_new_tokens": 40, "ignore_eos": True, "temperature": 0, "method": method}
    whole = engine.generate([72, 105], **run).token_ids
    # the text up to a token inside the second block, whose last characters end the run there
    cut = next(n for n in range(11, 16) if BYTES.decode(whole[:n]) != BYTES.decode(whole[:n - 1]))
    result = engine.generate([72, 105], stop=BYTES.decode(whole[:cut])[-3:], **run)
    n = len(result.token_ids)
    assert result.stats.finish_reason == "stop" and n == result.stats.new_tokens and n % 8, n
    if method == "ar":
        assert result.stats.steps == n
    else:
        assert result.stats.plain_steps == result.stats.steps - 1 == n - 1  # (the first token is the prefill's)


@pytest.mark.parametrize("stop", ["。", "测试", "界，这"])
@pytest.mark.parametrize("block", [1, 16])
def test_a_byte_fallback_tokenizers_stop_strings_end_at_the_completing_token(stop, block):
    """Byte-fallback tokenizers decode a run of byte tokens as a whole: a window of tokens that began inside
    the run decoded to U+FFFD, and "。" at the end of a long Chinese run was missed."""
    ids = SP.convert_tokens_to_ids(["▁hello"]) + [SP_BYTES[b] for b in "你好世界，这是一个测试。你好".encode()]
    want = first_stop(SP, ids, stop)
    checker, pushed = StopStrings(SP, (stop,)), 0
    while pushed < len(ids):
        kept = checker.cut(ids[pushed:pushed + block])
        if kept is not None:
            assert pushed + kept == want
            return
        pushed += block
    pytest.fail(f"{stop!r} never found; expected after token {want}")


@pytest.mark.parametrize("after", [0, 50])
def test_a_stop_string_in_a_byte_run_longer_than_the_kept_tail_is_found_where_it_ends(after):
    """A run of byte tokens longer than the tail kept (then 1,024 tokens) widened the window back to the tail's
    start, in the middle of a character: the whole run decoded to U+FFFD, and the stop string was found only once
    the run ended (or one token late), with text past it in the output."""
    run = "東" * 400 + "京京" + "東" * after  # (3 bytes a character)
    ids = [*SP.convert_tokens_to_ids(["▁hello"]), *(SP_BYTES[b] for b in run.encode()),
           *SP.convert_tokens_to_ids(["▁x"])]
    want = first_stop(SP, ids, "京京")
    checker = StopStrings(SP, ("京京",))
    assert next(i for i, t in enumerate(ids) if checker.cut([t])) + 1 == want


def test_a_long_byte_run_is_checked_in_a_window_of_its_last_tokens(monkeypatch):
    """Inside a run of byte tokens each check decoded the run back to its start, up to 1,024 tokens a token
    (0.65 ms a token in a model's long byte runs): now the window's tokens, and a character before them."""
    decoded = []
    checker = StopStrings(SP, ("京京",))
    monkeypatch.setattr(checker, "_decode", lambda ids, marked: decoded.append(len(ids)) or decode_text(SP, ids))
    ids = [SP_BYTES[b] for b in ("東" * 700).encode()]
    assert checker.cut(ids) is None
    assert max(decoded) <= checker.window + 3, max(decoded)
    checker.cut([SP_BYTES[0xE4]])  # a character begun: the run is no UTF-8 until it ends, one U+FFFD a byte
    assert max(decoded) <= checker.window + 3, max(decoded)


def test_a_stop_string_in_the_text_read_with_a_special_token_that_split_a_byte_run_long_before_is_found():
    """A stray byte, </s>, then a run longer than the window: without the special tokens the two are one run, no
    UTF-8, all U+FFFD; read with them, the second run is its characters and holds "aaaa". That text was checked only
    while a special token was within the window, and the run went on past the stop string (found by review)."""
    ids = [SP_BYTES[0xA4], SP.convert_tokens_to_ids("</s>"), *(SP_BYTES[b] for b in ("京" * 10 + "aaaa").encode()),
           SP.convert_tokens_to_ids("▁end")]
    checker = StopStrings(SP, ("aaaa",))
    assert next((i + 1 for i, t in enumerate(ids) if checker.cut([t]) is not None), None) == 36 == \
        first_stop_either(SP, ids, "aaaa")


def first_stop_either(tokenizer, ids, stop):
    """The number of tokens up to the first whose text, read without or with the special tokens' text, holds
    `stop`; None where none does."""
    return next((k for k in range(1, len(ids) + 1) if stop in decode_text(tokenizer, ids[:k])
                 or stop in tokenizer.decode(ids[:k], skip_special_tokens=False, clean_up_tokenization_spaces=False)),
                None)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_byte_fallback_tokenizers_stop_strings_end_where_a_decode_of_every_prefix_finds_them(data):
    """Byte runs long and short, UTF-8 or not (stray bytes: one U+FFFD a byte, the whole run's), unfinished,
    split by </s> (one run in the text, two in the text read with it: a stray byte before it turns the text's run
    to U+FFFDs, and runs longer than the window after it were checked in the text alone), and a resumed run whose
    byte run began before its tail: the checker ends after the token a decode of every prefix finds."""
    long_run = st.sampled_from(["京" * 10 + "aaaa", "🙂" * 8]).map(lambda s: [SP_BYTES[b] for b in s.encode()])
    pieces = st.one_of(SP_PIECES, long_run)
    ids = [t for piece in data.draw(st.lists(pieces, min_size=1, max_size=30)) for t in piece]
    # a stop string of the text, or of the text read with the special tokens (which a split run can make differ)
    text = SP.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) if data.draw(st.booleans()) \
        else decode_text(SP, ids)
    if not text:
        return
    start = data.draw(st.integers(0, len(text) - 1))
    stop = text[start:start + data.draw(st.integers(1, 6))]
    want = first_stop_either(SP, ids, stop)
    resumed = data.draw(st.integers(0, want - 1))  # tokens generated before a resume
    checker = StopStrings(SP, (stop,), previous=ids[:resumed])
    got = next((resumed + i + 1 for i, t in enumerate(ids[resumed:]) if checker.cut([t]) is not None), None)
    assert got == want, (stop, resumed)


def test_a_stop_string_split_by_added_special_tokens_is_found(embedded):
    """SmolLM2's tokenizer flags 17 added tokens special but names 3: 11 of the others between "a" and "b" hid
    the stop string "ab" the text holds."""
    tokenizer = embedded.tokenizer
    ids = tokenizer.encode("x a", add_special_tokens=False) + [3] * 11 + tokenizer.encode("b", add_special_tokens=False)
    assert decode_text(tokenizer, ids).endswith("ab")
    assert StopStrings(tokenizer, ("ab",)).cut(ids) == len(ids)


@pytest.mark.parametrize("stop", ["<|im_start|>", "\n<|im_start|>", "end", "<|im_", "<|im_start|>user",
                                  "<|im_end|>\n", "?<|im_end|>\n<|im_start|>user\nThe"])
def test_a_stop_string_ending_with_a_special_tokens_text_ends_after_that_token(embedded, stop):
    """`--stop "<|im_start|>"` (a raw chat prompt, the model going on to write the user's turn) never ended a run:
    special tokens were left out of the checked text, so no stop string could name one. It ends where
    transformers' StopStringCriteria ends (which reads every token's string): after the special token whose text
    completes the stop string, which may end inside it, as inside any token ("end" and "<|im_" at "<|im_end|>"),
    or after the token that completes one that goes on past a special token ("<|im_start|>user", missed when
    only a stop string's end could be a special token's text)."""
    tokenizer = embedded.tokenizer
    start, end = (tokenizer.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>"))
    ids = (tokenizer.encode("Hello! How can I help?", add_special_tokens=False) + [end]
           + tokenizer.encode("\n", add_special_tokens=False) + [start]
           + tokenizer.encode("user\nThe end is near.", add_special_tokens=False))
    want = transformers_stop(tokenizer, ids, stop)
    after = {"end": ids.index(end), "<|im_": ids.index(end), "<|im_end|>\n": ids.index(end) + 1,
             "<|im_start|>user": ids.index(start) + 1, "?<|im_end|>\n<|im_start|>user\nThe": ids.index(start) + 3}
    assert want == after.get(stop, ids.index(start)) + 1, want
    assert StopStrings(tokenizer, (stop,)).cut(ids) == want
    checker = StopStrings(tokenizer, (stop,))  # a token at a time
    assert next((n + 1 for n, t in enumerate(ids) if checker.cut([t])), None) == want


@pytest.mark.parametrize("stop", ["</s> hello", "</s>hello", "hello</s>", "</s> hello你"])
def test_a_byte_fallback_tokenizers_stop_strings_across_a_special_token_end_where_transformers_ends(stop):
    """With a SentencePiece byte-fallback tokenizer, whose decoder puts the space of '▁hello' after a special token
    ('</s> hello', not '</s>hello'), and a stop string ending in a run of byte tokens: where StopStringCriteria ends."""
    hello, eos = SP.convert_tokens_to_ids("▁hello"), SP.convert_tokens_to_ids("</s>")
    ids = [hello, eos, hello, *(SP_BYTES[b] for b in "你好".encode())]
    want = transformers_stop(SP, ids, stop)
    assert want == {"</s> hello": 3, "</s>hello": None, "hello</s>": 2, "</s> hello你": 6}[stop]
    assert StopStrings(SP, (stop,)).cut(ids) == want


@pytest.mark.parametrize("text, stop", [
    ("東東東東東x", "\ufffd東"),  # no U+FFFD in the text: a window begun inside a 東 decoded one
    ("🙂🙂🙂🙂🙂x", "\ufffd\ufffd🙂"),  # (a window of 16 tokens begins at the 2nd 🙂's second byte)
    ("東東\ufffd東東x", "\ufffd東"),  # one the model wrote (EF BF BD): found where it is completed
    ("東東東\ufffd東x", "\ufffd東東x"),
    ("東\x80東東東x", "\ufffd東"),  # and a stray byte's
])
def test_a_stop_string_holding_u_fffd_is_found_where_the_text_holds_it(text, stop):
    """A review's fuzz: the checker decodes a window of the last tokens, which on a byte-level BPE tokenizer may
    begin inside a character; that character's cut bytes decoded to U+FFFD, and a stop string holding one was
    found in text that held none. A U+FFFD of the text itself (a model's stray byte, or the character) still ends
    the run after the token that completes it, as a decode of every prefix finds."""
    stray = BYTES.convert_tokens_to_ids("Ģ")  # the byte 0x80 alone (GPT-2's alphabet spells it so)
    ids = [t for i, part in enumerate(text.split("\x80")) for t in [stray] * (i > 0) + BYTES.encode(part)]
    want = next((k for k in range(1, len(ids) + 1) if stop in decode_text(BYTES, ids[:k])), None)
    checker = StopStrings(BYTES, (stop,))
    assert next((i + 1 for i, t in enumerate(ids) if checker.cut([t]) is not None), None) == want


def test_stop_escapes_on_the_command_line_are_read(tmp_path, capsys):
    """A shell passes `--stop "\\n"` as a backslash and an n, which never matched the newline meant, and nothing
    said so (found by review): the command line reads \\n, \\t, \\r and \\\\; other backslashes stay."""
    from conftest import tiny_hf_model

    from longswift.checkpoint import read_checkpoint
    from longswift.cli.generate import stop_text

    assert stop_text("\\n") == "\n" and stop_text("a\\tb\\r") == "a\tb\r"
    assert stop_text("\\\\n") == "\\n" and stop_text("\\x\\") == "\\x\\" and stop_text("END") == "END"
    model = tmp_path / "m"
    tiny_hf_model("llama", seed=5, vocab=300).save_pretrained(model)
    byte_tokenizer().save_pretrained(model)
    code, _, err = run_cli(capsys, "generate", "--model", str(model), "--prompt-ids", "3,4,5", "--method", "ar",
                           "--max-new-tokens", "4", "--no-progress", "--stop", "\\n", "--stop", "a\\\\b",
                           "--checkpoint", str(tmp_path / "c.json"), "--output", str(tmp_path / "o.txt"))
    assert code == 0, err
    assert read_checkpoint(tmp_path / "c.json").generation["stop"] == ["\n", "a\\b"]
