"""AR's token blocks (--read-every N: sampled tokens stay on the device and are read back N at a
time): the tokens, the stopping point and the generator's final state are those of reading each
token, for every N, greedy and sampled, through the model's forward and through the CUDA step
bodies run eagerly on the CPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import OpCount, tiny_hf_model

import longswift
from longswift import GenerationConfig, LongswiftError, SamplingConfig
from longswift.config import READ_EVERY_CUDA, RuntimeConfig
from longswift.generate import ar_steps
from longswift.spec.schedule import KINDS, PLAIN, StepSchedule
from longswift.stats import GenerationStats

PROMPT = [5, 17, 99, 3, 42, 8, 77, 120, 64, 31]
SAMPLINGS = [SamplingConfig(temperature=0, repetition_penalty=1.3, penalty_window=6),
             SamplingConfig(seed=0, temperature=0.9, top_p=0.9, repetition_penalty=1.2, penalty_window=5)]
IDS = ["greedy-penalty", "sampled-top-p-penalty"]


@pytest.fixture(scope="module")
def engine():
    return longswift.load(tiny_hf_model("llama", seed=21), device="cpu", dtype="float32")


def run(engine, sampling: SamplingConfig, gen: GenerationConfig, every: int, eos: frozenset[int] = frozenset(),
        seed: int = 5) -> tuple[list[list[int]], GenerationStats, torch.Tensor | None]:
    """ar_steps' yielded blocks, its stats, and its generator's state once it has finished."""
    generator = None if sampling.greedy else torch.Generator().manual_seed(seed)
    stats = GenerationStats(method="ar", prompt_tokens=len(PROMPT))
    with torch.inference_mode():
        blocks = list(ar_steps(engine.model, PROMPT, sampling, gen, stats, eos, generator, read_every=every))
    return blocks, stats, None if generator is None else generator.get_state()


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=IDS)
@pytest.mark.parametrize("every", [2, 7, 16])
def test_blocks_emit_the_tokens_and_leave_the_generator_where_reading_each_token_does(engine, sampling, every):
    gen = GenerationConfig(max_new_tokens=37, ignore_eos=True)
    one, stats1, state1 = run(engine, sampling, gen, 1)
    blocks, stats, state = run(engine, sampling, gen, every)
    assert [len(b) for b in one] == [1] * 37
    assert [len(b) for b in blocks] == [every] * (37 // every) + ([37 % every] if 37 % every else [])
    assert sum(blocks, []) == sum(one, [])
    assert (stats.new_tokens, stats.steps, stats.finish_reason) == (37, 37, "length")
    if state1 is not None:
        assert torch.equal(state, state1)


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=IDS)
def test_an_end_of_sequence_token_ends_its_block_and_gives_back_the_unused_uniforms(engine, sampling):
    gen = GenerationConfig(max_new_tokens=40, ignore_eos=False)
    free = sum(run(engine, sampling, dataclasses.replace(gen, ignore_eos=True), 1)[0], [])
    stop = free[13]  # a token first emitted mid-block (position 13 of blocks of 8)
    first = free.index(stop)
    assert first % 8 != 7, "the chosen EOS would end a block exactly: pick another position"
    one, stats1, state1 = run(engine, sampling, gen, 1, eos=frozenset({stop}))
    blocks, stats, state = run(engine, sampling, gen, 8, eos=frozenset({stop}))
    assert sum(one, []) == sum(blocks, []) == free[: first + 1]
    assert blocks[-1][-1] == stop and len(blocks[-1]) == first % 8 + 1
    assert (stats.finish_reason, stats.new_tokens) == (stats1.finish_reason, stats1.new_tokens) == ("eos", first + 1)
    if state1 is not None:  # the generator consumed one uniform per emitted token, not the whole block's
        assert torch.equal(state, state1)
        fresh = torch.Generator().manual_seed(5)
        torch.rand(first + 1, generator=fresh, dtype=torch.float64)
        assert torch.equal(state, fresh.get_state())


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=IDS)
def test_blocks_through_the_cuda_step_bodies_emit_the_same_tokens(engine, sampling, monkeypatch):
    """The GPU's loop (decode bodies fed a token tensor, never read by the host) run eagerly on the CPU."""
    gen = GenerationConfig(max_new_tokens=30, ignore_eos=True)
    want = sum(run(engine, sampling, gen, 1)[0], [])
    import longswift.generate as generate_mod
    monkeypatch.setattr(generate_mod, "step_bodies", lambda model: True)
    for every in (1, 4, 16):
        assert sum(run(engine, sampling, gen, every)[0], []) == want, every


def test_the_engine_resolves_read_every_per_device_and_streams_blocks(engine):
    assert RuntimeConfig().token_block(torch.device("cpu")) == 1
    assert RuntimeConfig().token_block(torch.device("cuda")) == READ_EVERY_CUDA
    assert RuntimeConfig(read_every=3).token_block(torch.device("cpu")) == 3
    with pytest.raises(LongswiftError, match="read.every must be 0 .auto. or a positive number"):
        RuntimeConfig(read_every=-1)
    gen, sampling = GenerationConfig(max_new_tokens=10, ignore_eos=True), SamplingConfig(seed=4)
    want = engine.generate(PROMPT, method="ar", sampling=sampling, generation=gen).token_ids
    blocked = longswift.load(tiny_hf_model("llama", seed=21), device="cpu", dtype="float32", read_every=4)
    stream = blocked.stream(PROMPT, method="ar", sampling=sampling, generation=gen)
    assert [len(b) for b in stream] == [4, 4, 2]
    assert stream.result.token_ids == want


FIXED_RATES = {"full": 1.0, "narrow": 1.5, "lookup": 2.0, "plain": 3.0}  # plain steps lead; the others are probed on schedule


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=IDS)
@pytest.mark.parametrize("bodies", [False, True], ids=["forward", "step-bodies"])
def test_tokenswift_plain_steps_in_blocks_still_emit_ar_output(sampling, bodies, monkeypatch):
    """Where plain steps lead, TokenSwift runs them as token blocks between its probes of full and
    lookup steps; the output is still AR's, through the model's forward and the CUDA step bodies."""
    import longswift.generate as generate_mod
    import longswift.spec.tokenswift as ts

    hf = tiny_hf_model("llama", seed=22, vocab=32)
    prompt = [5, 9, 17, 3, 5, 9, 17, 4, 5, 9, 17, 3] * 3
    gen = GenerationConfig(max_new_tokens=90, ignore_eos=True)
    want = longswift.load(hf, device="cpu", dtype="float64").generate(
        prompt, method="ar", sampling=sampling, generation=gen).token_ids
    if bodies:
        monkeypatch.setattr(generate_mod, "step_bodies", lambda model: True)
        monkeypatch.setattr(ts, "step_bodies", lambda model: True)
    monkeypatch.setattr(StepSchedule, "rate", lambda self, kind: FIXED_RATES[kind])  # no timing: deterministic
    engine = longswift.load(hf, device="cpu", dtype="float64", heads="random", read_every=8)
    real_block, blocks = ts.plain_block, []
    monkeypatch.setattr(ts, "plain_block", lambda s, k: blocks.append(len(out := real_block(s, k))) or out)
    for spec in (longswift.SpecConfig(tree="1,2,2", ngram_topk=2),
                 longswift.SpecConfig(tree="1,2,2", ngram_topk=2, draft_mode="fused"),
                 longswift.SpecConfig(tree="2,2,2", ngram_topk=2, draft_kv_budget=30, draft_window=6,
                                      attention_sinks=4, walk="batched")):
        stream = engine.stream(prompt, method="tokenswift", sampling=sampling, generation=gen, spec=spec)
        blocks.clear()
        sizes = [len(b) for b in stream]
        assert stream.result.token_ids == want, spec
        stats = stream.result.stats
        # blocks ran (a lookup step's copy may emit more tokens than a block: sizes are not only blocks')
        assert "plain" in stats.stage_seconds and max(blocks) == 8 and 8 in sizes, (blocks, sizes)
        assert stats.lookup_steps + (stats.steps - stats.plain_steps - stats.lookup_steps) >= 2  # and probes


def test_plain_blocks_keep_the_probe_schedule_of_single_steps():
    def schedule(read_every: int, steps: int = 1500) -> tuple[list[str], int]:
        s = StepSchedule(step_tokens=dict.fromkeys(KINDS, 1.0),
                         step_seconds={k: 1 / r for k, r in FIXED_RATES.items()})
        kinds, blocks = [], 0
        while len(kinds) < steps:
            kind = s.choose()
            k = s.plain_run(read_every, tokens_left=10**6) if kind == PLAIN else 1
            s.skip(k - 1)
            blocks += k > 1
            kinds += [kind] * k
            for _ in range(k):
                s.record(kind, 1, 1 / FIXED_RATES[kind])
        return kinds[:steps], blocks

    single, none = schedule(1)
    blocked, blocks = schedule(16)
    assert none == 0 and blocks > 50
    assert blocked == single
    assert sum(k != PLAIN for k in single) >= 8  # the schedule probes the other kinds


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=IDS)
@pytest.mark.parametrize("bodies", [False, True], ids=["forward", "step-bodies"])
def test_a_plain_step_runs_the_ops_of_an_ar_step(sampling, bodies, monkeypatch):
    """A plain step is AR's step through AR's code: per token it runs no more aten ops than AR
    does (a view of the root's slot aside), so where no draft pays TokenSwift's host cost per
    token, and its kernel launches on a GPU, are AR's. Counted per extra token between two run
    lengths, which leaves out each method's setup and prefill. Before plain steps went through
    AR's code, a plain step ran the trie's verify, walk and compaction: 12-30 more ops a token."""
    import longswift.generate as generate_mod
    import longswift.spec.tokenswift as ts

    if bodies:  # the CUDA path's step bodies and batched walk, run eagerly
        monkeypatch.setattr(generate_mod, "step_bodies", lambda model: True)
        monkeypatch.setattr(ts, "step_bodies", lambda model: True)
    monkeypatch.setattr(StepSchedule, "choose", lambda self: self._run(PLAIN))
    engine = longswift.load(tiny_hf_model("llama", seed=21), device="cpu", dtype="float32", heads="random")

    def ops(method: str, new: int) -> int:
        spec = longswift.SpecConfig(walk="batched" if bodies else "rows") if method == "tokenswift" else None
        with OpCount() as count:
            result = engine.generate(PROMPT, method=method, sampling=sampling, spec=spec,
                                     generation=GenerationConfig(max_new_tokens=new, ignore_eos=True))
        assert len(result.token_ids) == new
        return count.ops

    per_token = {m: (ops(m, 41) - ops(m, 9)) / 32 for m in ("ar", "tokenswift")}
    assert per_token["tokenswift"] <= per_token["ar"] + 1, per_token


@pytest.mark.parametrize("every", [2, 3])
def test_an_end_of_sequence_token_at_any_place_in_a_block_gives_back_the_rest_of_its_uniforms(engine, every):
    """Wherever an EOS falls in a sampled block (the first token of a block of 2, the next-to-last of any),
    the generator is left having drawn one uniform per emitted token, as reading each token leaves it:
    a rewind skipped for blocks of 2, or for an EOS one before a block's end, left it a draw ahead."""
    sampling = SAMPLINGS[1]
    free = sum(run(engine, sampling, GenerationConfig(max_new_tokens=40, ignore_eos=True), 1)[0], [])
    firsts = {}
    for i, t in enumerate(free):
        firsts.setdefault(t, i)
    offsets = set()
    for stop, first in firsts.items():
        if first % every == every - 1 or first % every in offsets:
            continue  # an EOS that ends its block exactly gives nothing back
        offsets.add(first % every)
        blocks, stats, state = run(engine, sampling, GenerationConfig(max_new_tokens=40), every, eos=frozenset({stop}))
        assert sum(blocks, []) == free[: first + 1] and stats.finish_reason == "eos"
        fresh = torch.Generator().manual_seed(5)
        torch.rand(first + 1, generator=fresh, dtype=torch.float64)
        assert torch.equal(state, fresh.get_state()), (every, first)
    assert offsets == set(range(every - 1))


@pytest.mark.parametrize("every", [1, 4])
def test_ar_runs_no_forward_after_the_runs_last_token(engine, every, monkeypatch):
    """AR forwards each drawn token to get the next one's logits, except the run's last, which nothing
    follows: a block that forwarded it too (forward_last at the run's end) cost one decode forward a run."""
    from longswift.runtime.model import Transformer

    calls = []
    forward = Transformer.forward
    monkeypatch.setattr(Transformer, "forward", lambda self, tokens, *a, **k: calls.append(int(tokens.shape[0]))
                        or forward(self, tokens, *a, **k))
    blocks, stats, _ = run(engine, SAMPLINGS[1], GenerationConfig(max_new_tokens=10, ignore_eos=True), every)
    assert sum(len(b) for b in blocks) == 10
    assert calls == [len(PROMPT)] + [1] * 9  # the prompt's prefill, then one forward per token but the last


def test_tokenswift_plain_blocks_keep_the_loops_probe_schedule_and_time_each_step_as_its_share(monkeypatch):
    """In the loop, a plain block of k tokens counts as k plain steps: the kinds of step chosen, token by
    token, are those of reading each token (a block that counted k steps on the probe schedule for its
    k - 1 extra tokens brought probes on early), and each of its k steps is recorded at the block's time
    divided by k (recording the whole block's time for each made plain steps look k times slower).
    Without the suffix index: where the text repeats an earlier passage it runs a lookup step whatever
    the schedule picks, a hint a block sees only at its end (the output is the same either way)."""
    hf = tiny_hf_model("llama", seed=22, vocab=32)
    prompt = [5, 9, 17, 3, 5, 9, 17, 4, 5, 9, 17, 3] * 3
    gen = GenerationConfig(max_new_tokens=90, ignore_eos=True)
    spec = longswift.SpecConfig(tree="1,2,2", ngram_topk=2, suffix_lookup=False)
    monkeypatch.setattr(StepSchedule, "rate", lambda self, kind: FIXED_RATES[kind])  # no timing: deterministic
    record, kinds, plain_seconds = StepSchedule.record, [], []

    def logged(self, kind, tokens, seconds):
        kinds.append(kind)
        if kind == PLAIN:
            plain_seconds.append(seconds)
        return record(self, kind, tokens, seconds)

    monkeypatch.setattr(StepSchedule, "record", logged)
    runs = {}
    for every in (1, 8):
        kinds.clear(), plain_seconds.clear()
        engine = longswift.load(hf, device="cpu", dtype="float64", heads="random", read_every=every)
        result = engine.generate(prompt, method="tokenswift", sampling=SAMPLINGS[0], generation=gen, spec=spec)
        runs[every] = list(kinds), result.token_ids
        assert sum(plain_seconds) == pytest.approx(result.stats.stage_seconds["plain"])
    assert runs[8] == runs[1]
    assert runs[8][0].count(PLAIN) >= 10 and len(set(runs[8][0])) > 1  # plain blocks ran between probes
