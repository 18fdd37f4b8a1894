"""AR generation on tiny random models: against transformers' generate, a direct windowed-penalty
reference, seeding, stopping, stats and memory refusal."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_hf_model

import longswift
from longswift import GenerationConfig, LongswiftError, SamplingConfig

PROMPT = [5, 17, 99, 3, 42, 8, 77, 120, 64, 31]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_greedy_with_penalty_equals_transformers_generate(arch):
    hf = tiny_hf_model(arch, "default", seed=11)
    engine = longswift.load(hf, dtype="float32")
    n = 40
    with torch.no_grad():
        ref = hf.generate(torch.tensor([PROMPT]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                          repetition_penalty=1.3, eos_token_id=None, pad_token_id=0)[0, len(PROMPT):].tolist()
    sampling = SamplingConfig(temperature=0, repetition_penalty=1.3, penalty_window=4096)
    out = engine.generate(PROMPT, sampling=sampling, generation=GenerationConfig(max_new_tokens=n, ignore_eos=True))
    assert out.token_ids == ref


def test_windowed_penalty_equals_direct_reference():
    """The penalty sees only the last W tokens: a direct loop over full forwards agrees."""
    hf = tiny_hf_model("llama", "default", seed=12)
    engine = longswift.load(hf, dtype="float32")
    w, theta, n = 3, 3.0, 30
    ids = list(PROMPT)
    with torch.no_grad():
        for _ in range(n):
            logits = hf(torch.tensor([ids])).logits[0, -1]
            for tok in set(ids[-w:]):
                logits[tok] = logits[tok] / theta if logits[tok] > 0 else logits[tok] * theta
            ids.append(int(logits.argmax()))
    sampling = SamplingConfig(temperature=0, repetition_penalty=theta, penalty_window=w)
    out = engine.generate(PROMPT, sampling=sampling, generation=GenerationConfig(max_new_tokens=n, ignore_eos=True))
    assert out.token_ids == ids[len(PROMPT):]
    # The window matters: the whole-context penalty gives another sequence here.
    whole = engine.generate(PROMPT, sampling=SamplingConfig(temperature=0, repetition_penalty=theta),
                            generation=GenerationConfig(max_new_tokens=n, ignore_eos=True))
    assert whole.token_ids != out.token_ids


def test_same_seed_same_output_and_seed_is_reported():
    engine = longswift.load(tiny_hf_model("qwen2", seed=13), dtype="float32")
    gen = GenerationConfig(max_new_tokens=50, ignore_eos=True)
    a = engine.generate(PROMPT, sampling=SamplingConfig(seed=7, min_p=0.0), generation=gen)
    b = engine.generate(PROMPT, sampling=SamplingConfig(seed=7, min_p=0.0), generation=gen)
    c = engine.generate(PROMPT, sampling=SamplingConfig(seed=8, min_p=0.0), generation=gen)
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids
    assert a.stats.seed == 7
    unseeded = engine.generate(PROMPT, sampling=SamplingConfig(min_p=0.0), generation=gen)
    again = engine.generate(PROMPT, sampling=SamplingConfig(seed=unseeded.stats.seed, min_p=0.0), generation=gen)
    assert again.token_ids == unseeded.token_ids


def test_stops_at_eos_unless_ignored():
    """Without --ignore-eos the run ends with the EOS it drew; with it, EOS is banned: the same
    tokens up to where the free run drew EOS, then others, to the full length."""
    engine = longswift.load(tiny_hf_model("llama", seed=14), dtype="float32")
    greedy = SamplingConfig(temperature=0, repetition_penalty=1.0)
    engine.eos_ids = frozenset()
    free = engine.generate(PROMPT, sampling=greedy, generation=GenerationConfig(max_new_tokens=12, ignore_eos=True))
    eos = free.token_ids[3]
    first = free.token_ids.index(eos)
    engine.eos_ids = frozenset({eos})
    stopped = engine.generate(PROMPT, sampling=greedy, generation=GenerationConfig(max_new_tokens=12))
    assert stopped.token_ids == free.token_ids[: first + 1]
    assert stopped.stats.finish_reason == "eos"
    ignored = engine.generate(PROMPT, sampling=greedy, generation=GenerationConfig(max_new_tokens=12, ignore_eos=True))
    assert ignored.token_ids[:first] == free.token_ids[:first] and eos not in ignored.token_ids
    assert len(ignored.token_ids) == 12 and ignored.stats.finish_reason == "length"


def test_stream_yields_tokens_and_result_has_stats():
    engine = longswift.load(tiny_hf_model("mistral", seed=15), dtype="float32")
    stream = engine.stream(PROMPT, sampling=SamplingConfig(seed=1), generation=GenerationConfig(max_new_tokens=9, ignore_eos=True))
    steps = list(stream)
    assert [len(s) for s in steps] == [1] * 9
    r = stream.result
    assert r.token_ids == [t for s in steps for t in s]
    assert r.stats.new_tokens == 9 and r.stats.steps == 9 and r.stats.prompt_tokens == len(PROMPT)
    assert r.stats.decode_seconds > 0 and r.stats.tokens_per_second > 0
    d = r.to_dict()
    assert set(d) == {"token_ids", "text", "stats"} and d["stats"]["method"] == "ar"
    assert d["stats"]["alpha"] is None and d["stats"]["tokens_per_step"] == 1  # AR drafts nothing: no rate, not 0
    assert d["stats"]["tokens_per_second"] > 0
    one = engine.generate(PROMPT, sampling=SamplingConfig(seed=1), max_new_tokens=1)
    assert one.to_dict()["stats"]["tokens_per_second"] is None  # one token is the prefill's draw: no rate (as the
    assert one.stats.tokens_per_second == 0.0  # summary says), and the attribute agrees (it said thousands of tok/s)


def test_tokens_per_second_counts_the_tokens_after_the_prefills_draw():
    """A review: the first token is the prefill's draw (one token: no rate), so a rate counts the tokens after it,
    as bench's decode tok/s does; tokens_per_second counted it too, over decode time that holds the other tokens'
    work alone (AR: n-1 forwards for n tokens), so a run of 2 tokens said twice its rate, one of 200 0.5% high."""
    from longswift.stats import GenerationStats

    two = GenerationStats("ar", 4, new_tokens=2, steps=2, decode_seconds=0.5)  # one forward, for the second token
    assert two.tokens_per_second == 2.0 and two.to_dict()["tokens_per_second"] == 2.0  # not 4.0
    engine = longswift.load(tiny_hf_model("llama", seed=3), dtype="float32", heads="random")
    for method in ("ar", "tokenswift"):
        r = engine.generate(PROMPT, sampling=SamplingConfig(seed=1), method=method,
                            generation=GenerationConfig(max_new_tokens=5, ignore_eos=True))
        assert r.stats.tokens_per_second == pytest.approx(4 / r.stats.decode_seconds)


@pytest.mark.parametrize("method", ["ar", "tokenswift"])
def test_on_prefill_follows_the_reading_of_the_context_and_of_a_resumes_context(method):
    engine = longswift.load(tiny_hf_model("llama", seed=3), dtype="float32", heads="random")
    gen = GenerationConfig(max_new_tokens=12, ignore_eos=True, prefill_chunk=16)
    prompt = list(range(3, 43))  # 40 tokens: chunks of 16, 16 and 8
    stream = engine.stream(prompt, generation=gen, sampling=SamplingConfig(temperature=0), method=method)
    calls = []
    stream.on_prefill = lambda read, total: calls.append((read, total))
    assert stream.on_prefill is not None
    for _ in stream:
        if len(stream.token_ids) >= 5:
            break
    assert calls == [(16, 40), (32, 40), (40, 40)]
    resumed = engine.resume(stream.checkpoint())
    again = []
    resumed.on_prefill = lambda read, total: again.append((read, total))
    for _ in resumed:
        pass
    context = 40 + len(stream.token_ids) - (method == "tokenswift")  # (TokenSwift's last token is the root)
    assert again[-1] == (context, context) and len(again) >= 3 and again == sorted(again)


@pytest.mark.parametrize("method", ["ar", "tokenswift"])
def test_a_resume_that_does_not_fit_is_told_to_lower_its_length_alone(method, tmp_path, capsys):
    """A resume refused for memory was advised a smaller dtype, draft budget, tree, prefill chunk or prompt: a
    resume keeps its checkpoint's (--resume refuses those flags). Its length alone can change; the API and the
    command line (before loading, and after) say so."""
    from conftest import run_cli

    model = tiny_hf_model(seed=16, max_position_embeddings=10**12)
    engine = longswift.load(model, dtype="float32", heads="random")
    stream = engine.stream(PROMPT, max_new_tokens=8, temperature=0, method=method)
    next(iter(stream))
    checkpoint = stream.checkpoint()
    with pytest.raises(LongswiftError) as info:
        engine.resume(checkpoint, max_new_tokens=10**11)
    assert "not enough memory" in str(info.value) and str(info.value).endswith(
        "lower max_new_tokens (a resumed run keeps its checkpoint's prompt and settings), or free some memory")
    assert info.value.cli_message.endswith("lower --max-new-tokens (a resumed run keeps its checkpoint's prompt and "
                                           "settings), or free some memory")
    model.save_pretrained(tmp_path / "m")
    capsys.readouterr()  # (transformers' progress bar as it saves)
    code, _, err = run_cli(capsys, "generate", "--model", str(tmp_path / "m"), "--prompt-ids", "1,2,3", "--heads",
                           "random" if method == "tokenswift" else "none", "--max-new-tokens", "8", "--checkpoint",
                           str(tmp_path / "c.json"), "--output", str(tmp_path / "o.txt"), "--no-progress")
    assert code == 0, err
    code, _, err = run_cli(capsys, "generate", "--resume", str(tmp_path / "c.json"), "--max-new-tokens",
                           str(10**11))
    assert code == 2 and err.strip().endswith("lower --max-new-tokens (a resumed run keeps its checkpoint's prompt "
                                              "and settings), or free some memory"), err


@pytest.mark.parametrize("method", ["ar", "tokenswift"])
def test_a_runs_prefill_is_planned_no_longer_than_what_it_reads(method, monkeypatch):
    """The plan sized the prefill's forward by prefill_chunk capped at the whole run: a 10-token prompt with a chunk of
    8K and 8,000 new tokens planned 1.1 GiB of mask and activations on the embedded model (found by review). A new
    run's prefill reads its prompt, a resumed one's the tokens it holds too."""
    import longswift.runtime.memory as memory

    chunks = []
    plan = memory.plan_memory
    monkeypatch.setattr(memory, "plan_memory", lambda cfg, dtype, device, capacity, chunk, *a, **k:
                        chunks.append(chunk) or plan(cfg, dtype, device, capacity, chunk, *a, **k))
    engine = longswift.load(tiny_hf_model(seed=16, max_position_embeddings=4096), dtype="float32", heads="random")
    stream = engine.stream(PROMPT, max_new_tokens=3000, prefill_chunk=4096, temperature=0, method=method)
    assert chunks == [len(PROMPT)]
    next(iter(stream))
    checkpoint = stream.checkpoint()
    engine.resume(checkpoint)
    assert chunks[1] == len(PROMPT) + len(checkpoint.token_ids)


def test_bad_requests_are_refused():
    engine = longswift.load(tiny_hf_model(seed=16), dtype="float32")
    with pytest.raises(LongswiftError, match=r"= 260 exceeds this model's context of 256 tokens.*rope_scaling='yarn:2'"):
        engine.generate(PROMPT, generation=GenerationConfig(max_new_tokens=250))
    huge = longswift.load(tiny_hf_model(seed=16, max_position_embeddings=10**12), dtype="float32")
    with pytest.raises(LongswiftError, match="not enough memory.*free; lower max_new_tokens or the prompt length") as info:
        huge.generate(PROMPT, generation=GenerationConfig(max_new_tokens=10**11))
    assert "--" not in str(info.value) and "lower --max-new-tokens" in info.value.cli_message  # the API's names
    # A prefill chunk larger than the run was planned at its own size: 74.8 GiB of workspace for 5 tokens.
    assert len(engine.generate(PROMPT, max_new_tokens=5, prefill_chunk=100_000, temperature=0).token_ids) == 5
    with pytest.raises(LongswiftError) as info:  # past what any rope factor (at most 1024) reaches
        engine.generate(PROMPT, generation=GenerationConfig(max_new_tokens=10**6))
    assert str(info.value).endswith("exceeds this model's context of 256 tokens: lower max_new_tokens")
    vocab = engine.cfg.vocab_size
    with pytest.raises(LongswiftError, match=f"every one of this model's {vocab} token ids is banned"):
        engine.generate(PROMPT, sampling=SamplingConfig(banned_ids=tuple(range(vocab))))
    eos = sorted(engine.eos_ids)
    with pytest.raises(LongswiftError, match="with ignore_eos banning the EOS ids"):
        engine.generate(PROMPT, sampling=SamplingConfig(banned_ids=tuple(t for t in range(vocab) if t not in eos)),
                        generation=GenerationConfig(max_new_tokens=2, ignore_eos=True))
    with pytest.raises(LongswiftError, match="token ids must be in"):
        engine.generate([5, 128])
    with pytest.raises(LongswiftError, match="empty"):
        engine.generate([])
    with pytest.raises(LongswiftError, match="no tokenizer"):
        engine.generate("some text")
    with pytest.raises(LongswiftError, match="unknown method"):
        engine.generate(PROMPT, method="beam")
    with pytest.raises(LongswiftError, match="max.new.tokens"):
        GenerationConfig(max_new_tokens=0)
