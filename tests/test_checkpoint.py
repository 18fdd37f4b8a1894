"""Checkpoint / resume: a generation stopped at any step boundary and continued in a fresh engine
gives the uninterrupted run's tokens (float64 tiny models, greedy and seeded sampling, AR and both
TokenSwift modes); checkpoints of another model, heads, settings or version, and damaged files,
are refused with one-line errors."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import replace

import pytest
import torch
from conftest import tiny_hf_model

import longswift
from longswift import GenerationConfig, LongswiftError, SamplingConfig, SpecConfig
from longswift.checkpoint import Checkpoint, read_checkpoint

VOCAB = 24
SAMPLINGS = {
    "greedy-penalty": SamplingConfig(temperature=0.0, repetition_penalty=1.3, penalty_window=6),
    "sampled": SamplingConfig(seed=5, temperature=0.9, top_p=0.95, min_p=0.05, repetition_penalty=1.2, penalty_window=8),
}
RUNS = {
    "ar": ("ar", None),
    "tokenswift-paper": ("tokenswift", SpecConfig(tree="2,2,2", ngram_topk=2, draft_kv_budget=40, draft_window=16,
                                                  attention_sinks=4, adaptive=False)),
    "tokenswift-fused": ("tokenswift", SpecConfig(tree="1,2,2,2", ngram_topk=2, draft_mode="fused")),
    "tokenswift-adaptive": ("tokenswift", SpecConfig(tree="1,1,1", ngram_topk=2)),
}
PROMPT = [(3 * i * i + 5) % VOCAB for i in range(20)]
GEN = GenerationConfig(max_new_tokens=90, ignore_eos=True)


def hf_model(seed: int = 31):
    return tiny_hf_model("llama", "default", seed=seed, dtype=torch.float64, vocab=VOCAB)


def engine(seed: int = 31, heads: str = "random"):
    return longswift.load(hf_model(seed), dtype="float64", heads=heads)


@pytest.fixture(scope="module")
def base():
    return engine()


def stop_after(stream, tokens: int) -> Checkpoint:
    """Consume steps until at least `tokens` were generated, then checkpoint (a step boundary)."""
    for _ in stream:
        if len(stream.token_ids) >= tokens:
            return stream.checkpoint()
    raise AssertionError("the generation ended before the stop point")


@pytest.mark.parametrize("sampling", SAMPLINGS.values(), ids=SAMPLINGS.keys())
@pytest.mark.parametrize("run", RUNS.values(), ids=RUNS.keys())
def test_resumed_generation_equals_uninterrupted(base, run, sampling, tmp_path):
    method, spec = run
    full = base.generate(PROMPT, sampling=sampling, generation=GEN, method=method, spec=spec)
    assert len(full.token_ids) == GEN.max_new_tokens
    # Stop twice (checkpoint files in between, fresh engines each time), then finish.
    stream = base.stream(PROMPT, sampling=sampling, generation=GEN, method=method, spec=spec)
    ckpt = stop_after(stream, 17)
    path = tmp_path / "ckpt.json"
    ckpt.save(path)
    second = engine().resume(read_checkpoint(path))
    assert second.token_ids == full.token_ids[: len(ckpt.token_ids)]
    stop_after(second, 55).save(path)
    third = engine().resume(read_checkpoint(path))
    for _ in third:
        pass
    assert third.result is not None
    assert third.result.token_ids == full.token_ids
    stats = third.result.stats
    assert stats.resumes == 2 and stats.new_tokens == GEN.max_new_tokens and stats.method == method
    assert (stats.device, stats.dtype) == ("cpu", str(base.model.dtype).removeprefix("torch."))
    if method == "tokenswift" and not spec.adaptive:
        assert stats.steps < GEN.max_new_tokens and stats.accepted_tokens > 0
    elif method == "tokenswift":
        # Adaptive steps pick by measured speed (on this CPU plain steps may win throughout), but
        # each of the three runs starts by measuring a full step.
        assert stats.steps - stats.plain_steps - stats.lookup_steps >= 3


@pytest.mark.parametrize("run", ["ar", "tokenswift-paper"])
def test_an_interrupt_inside_a_sampled_step_resumes_to_the_uninterrupted_output(base, run, monkeypatch):
    """Ctrl-C inside a step, after the step drew its uniforms (AR: at the drawn token's forward; TokenSwift:
    between the walk and the commit): the checkpoint is the state before that step, the RNG state of that
    boundary included, so the resumed run draws what the uninterrupted one drew."""
    import longswift.runtime.blocks as blocks
    import longswift.spec.tokenswift as tokenswift

    method, spec = RUNS[run]
    sampling = SAMPLINGS["sampled"]
    full = base.generate(PROMPT, sampling=sampling, generation=GEN, method=method, spec=spec)
    module, name = (blocks, "decode") if method == "ar" else (tokenswift, "commit")
    real, calls = getattr(module, name), []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 12:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, interrupted)
    stream = base.stream(PROMPT, sampling=sampling, generation=GEN, method=method, spec=spec)
    with pytest.raises(KeyboardInterrupt):
        for _ in stream:
            pass
    ckpt = stream.checkpoint()
    monkeypatch.undo()
    assert 0 < len(ckpt.token_ids) < GEN.max_new_tokens
    resumed = engine().resume(ckpt)
    for _ in resumed:
        pass
    assert resumed.result.token_ids == full.token_ids


@pytest.mark.parametrize("sampling", SAMPLINGS.values(), ids=SAMPLINGS.keys())
@pytest.mark.parametrize("run", RUNS.values(), ids=RUNS.keys())
def test_a_finished_run_extended_is_the_run_started_with_the_longer_length(base, run, sampling):
    """resume(ckpt, max_new_tokens=N) goes on past a run that ended at its length: the tokens of a run
    started with N, whichever step the first length cut (the last step of a drafting run is capped)."""
    method, spec = run
    whole = base.generate(PROMPT, sampling=sampling, generation=GEN, method=method, spec=spec)
    for first in (23, 61):
        short = base.stream(PROMPT, sampling=sampling, generation=replace(GEN, max_new_tokens=first), method=method,
                            spec=spec)
        for _ in short:
            pass
        assert short.result.stats.finish_reason == "length" and len(short.token_ids) == first
        longer = base.resume(short.checkpoint(), max_new_tokens=GEN.max_new_tokens)
        for _ in longer:
            pass
        assert longer.result.token_ids == whole.token_ids, first
        assert longer.result.stats.resumes == 1 and longer.result.stats.new_tokens == GEN.max_new_tokens
        with pytest.raises(LongswiftError, match=f"^max_new_tokens={first - 1} is below the {first} tokens the "
                                                 "checkpoint holds: give at least that$"):  # the API's words only
            base.resume(short.checkpoint(), max_new_tokens=first - 1)


def test_resume_of_a_finished_generation_yields_nothing_more(base):
    stream = base.stream(PROMPT, sampling=SAMPLINGS["sampled"], generation=GEN, method="ar")
    for _ in stream:
        pass
    again = engine().resume(stream.checkpoint())
    assert list(again) == []
    assert again.result is not None and again.result.token_ids == stream.token_ids


@pytest.mark.parametrize("run", RUNS.values(), ids=RUNS.keys())
def test_a_run_resumed_after_its_eos_step_finishes_for_eos(run):
    """A checkpoint taken after the step that emitted EOS (between steps, as the CLI saves one when
    interrupted there): the resumed run adds nothing and, like the uninterrupted run, ends for "eos"."""
    method, spec = run
    e = engine()
    greedy = SamplingConfig(temperature=0, repetition_penalty=1.0)
    free = e.generate(PROMPT, sampling=greedy, generation=GEN, method="ar").token_ids
    e.eos_ids = frozenset({free[10]})  # the model's EOS, as far as this run knows, first drawn at new token 11
    gen = GenerationConfig(max_new_tokens=GEN.max_new_tokens)
    full = e.generate(PROMPT, sampling=greedy, generation=gen, method=method, spec=spec)
    assert full.stats.finish_reason == "eos" and full.token_ids[-1] in e.eos_ids
    stream = e.stream(PROMPT, sampling=greedy, generation=gen, method=method, spec=spec)
    ckpt = stop_after(stream, len(full.token_ids))
    resumed = e.resume(ckpt)  # (a fresh engine would not know this EOS)
    assert list(resumed) == []
    assert resumed.result.token_ids == full.token_ids and resumed.result.stats.finish_reason == "eos"
    longer = e.resume(ckpt, max_new_tokens=2 * GEN.max_new_tokens)  # a new length does not reopen an EOS
    assert list(longer) == [] and longer.result.stats.finish_reason == "eos"


def test_refuses_another_model_other_heads_or_settings(base):
    stream = base.stream(PROMPT, sampling=SAMPLINGS["sampled"], generation=GEN, method="tokenswift",
                         spec=RUNS["tokenswift-fused"][1])
    ckpt = stop_after(stream, 10)
    with pytest.raises(LongswiftError, match="made with another model") as info:
        engine(seed=32).resume(ckpt)
    assert str(info.value).endswith(": resume with that model (load(model) with it)")  # (a model object's)
    assert info.value.cli_message.endswith(": resume with that model (--model: where it is saved)")
    for source, api, cli in (
            ("<embedded>", "(longswift.load() without a model)", "(without --model: the embedded one)"),
            ("/m/my model", "(load('/m/my model'))", "(--model '/m/my model')")):
        with pytest.raises(LongswiftError) as info:  # ("(--model)" alone: no --model names the embedded one)
            engine(seed=32).resume(dataclasses.replace(ckpt, model_source=source))
        assert str(info.value) == f"the checkpoint was made with another model ({source}): resume with that model {api}"
        assert info.value.cli_message.endswith(f"resume with that model {cli}")
    other_heads = engine()
    other_heads.set_heads(other_heads.heads.randomize(seed=1))
    # which heads they were, not only what set_heads was given ("auto" resolves otherwise on another engine)
    with pytest.raises(LongswiftError, match=r"other draft heads \(random: \d heads random \(seeded, for testing\)\): "
                                             "resume with the same heads"):
        other_heads.resume(ckpt)
    with pytest.raises(LongswiftError, match=r"this engine has no draft heads: load the checkpoint's heads, \d heads "
                                             r"random \(seeded, for testing\) \(random; heads= or set_heads\)"):
        engine(heads=None).resume(ckpt)
    old = dataclasses.replace(ckpt, heads_origin=None)  # (a checkpoint from before the field)
    with pytest.raises(LongswiftError, match=r"other draft heads \(random\): resume with the same heads"):
        other_heads.resume(old)
    as_float32 = longswift.load(hf_model(), dtype="float32", heads="random")
    with pytest.raises(LongswiftError, match="made with another model|dtype float64"):
        as_float32.resume(ckpt)


def test_a_model_with_the_same_embeddings_but_other_weights_is_refused(base):
    """The fingerprint is a corner of the embedding, which a fine-tune keeps: the checkpoint also keeps the
    model's answer to a fixed input (runtime.probe), so a model that shares the embeddings but not the other
    weights is refused (it resumed and wrote other tokens); a checkpoint made before the probe still resumes."""
    stream = base.stream(PROMPT, sampling=SAMPLINGS["sampled"], generation=GEN, method="ar")
    ckpt = stop_after(stream, 10)
    from longswift.runtime.probe import PROBE_LOGITS

    values = ckpt.model_probe["values"]
    assert ckpt.model_probe["dtype"] == "float64" and len(values) == base.cfg.hidden_size + PROBE_LOGITS
    for part in ("layer", "lm_head"):  # (an untied LM head tuned alone left the hidden states as they were)
        tuned = hf_model()
        with torch.no_grad():  # (5%: a fine-tune's size of change)
            (tuned.model.layers[1].mlp.down_proj if part == "layer" else tuned.lm_head).weight.mul_(1.05)
        other = longswift.load(tuned, dtype="float64", heads="random")
        assert other.fingerprint == base.fingerprint
        with pytest.raises(LongswiftError, match=r"made with another model \(<LlamaForCausalLM>\), whose embeddings "
                                                 r"this one shares but whose other weights differ"):
            other.resume(ckpt)
    assert list(engine().resume(ckpt)) is not None  # the same weights, loaded again
    older = dataclasses.replace(ckpt, model_probe=None)
    assert other.resume(older) is not None  # (no probe to compare: as before)
    hidden_only = dataclasses.replace(ckpt, model_probe={"dtype": "float64", "values": values[:-PROBE_LOGITS]})
    assert list(engine().resume(hidden_only)) is not None  # (a probe kept before the logits: its hidden state)


def test_a_tokenswift_checkpoint_of_a_bfloat16_run_resumes_in_float32_with_the_same_heads(tmp_path):
    """A GPU run's dtype 'auto' is bfloat16; continued on a CPU, 'auto' is float32. The heads are then the same
    file in another precision: the checkpoint hashes them rounded to bfloat16, so they are taken (they were
    called 'other draft heads'), other heads are still refused, and a checkpoint that hashed them as they ran
    (before session 52) still resumes on the same precision."""
    from longswift.checkpoint import heads_fingerprint

    hf = tiny_hf_model("llama", "default", seed=31, vocab=VOCAB)
    heads = tmp_path / "heads.safetensors"
    from longswift.spec.heads import save_heads

    made = longswift.load(hf, dtype="float32", heads="random")
    save_heads(made.heads, made.cfg, made.fingerprint, heads)  # float32 values, which bfloat16 rounds
    bf16 = longswift.load(hf, dtype="bfloat16", heads=str(heads))
    ckpt = stop_after(bf16.stream(PROMPT, generation=GEN, method="tokenswift"), 10)
    ckpt = dataclasses.replace(ckpt, runtime={**ckpt.runtime, "dtype": "auto"})  # as a GPU run's default writes it
    f32 = longswift.load(hf, dtype="auto", heads=str(heads))
    assert f32.model.dtype == torch.float32
    assert heads_fingerprint(f32.heads) != heads_fingerprint(bf16.heads)  # as they run: other values
    assert f32.resume(ckpt) is not None
    f32.set_heads(f32.heads.randomize(seed=3))
    with pytest.raises(LongswiftError, match="other draft heads"):
        f32.resume(ckpt)
    legacy = dataclasses.replace(ckpt, heads_fingerprint=heads_fingerprint(bf16.heads),
                                 runtime={**ckpt.runtime, "dtype": "bfloat16"})
    assert bf16.resume(legacy) is not None


def test_a_checkpoint_of_dtype_auto_resumes_on_the_dtype_auto_names():
    """The CLI's default, --dtype auto, is float32 on the CPU: its checkpoint resumes on an engine loaded with
    dtype='float32' (it was refused for naming 'auto'), to the uninterrupted tokens, and not on bfloat16."""
    auto = longswift.load(tiny_hf_model("llama", "default", seed=31, vocab=VOCAB), heads="random")
    assert auto.runtime.dtype == "auto" and auto.model.dtype == torch.float32
    whole = auto.generate(PROMPT, sampling=SAMPLINGS["sampled"], generation=GEN, method="tokenswift")
    ckpt = stop_after(auto.stream(PROMPT, sampling=SAMPLINGS["sampled"], generation=GEN, method="tokenswift"), 10)
    as_float32 = longswift.load(tiny_hf_model("llama", "default", seed=31, vocab=VOCAB), dtype="float32",
                                heads="random")
    stream = as_float32.resume(ckpt)
    list(stream)
    assert stream.result.token_ids == whole.token_ids
    as_bf16 = longswift.load(tiny_hf_model("llama", "default", seed=31, vocab=VOCAB), dtype="bfloat16",
                             heads="random")
    with pytest.raises(LongswiftError, match=r"made with dtype auto \(float32 here\) and this engine has bfloat16"):
        as_bf16.resume(ckpt)


def rewrite(path, edit) -> None:
    """Edit a checkpoint's body and re-sign it (a well-formed file with other contents)."""
    import hashlib

    outer = json.loads(path.read_text())
    edit(outer["checkpoint"])
    canonical = json.dumps(outer["checkpoint"], sort_keys=True, separators=(",", ":"))
    outer["sha256"] = hashlib.sha256(canonical.encode()).hexdigest()
    path.write_text(json.dumps(outer))


@pytest.mark.parametrize("run", ["ar", "tokenswift-paper"])
def test_checkpoints_keep_the_eos_semantics_they_were_written_with(run, tmp_path):
    """A checkpoint records the --ignore-eos ban (sampling.banned_ids) and a resumed run bans exactly
    that, whatever the resuming engine's EOS ids. One written before the ban existed has no
    banned_ids: it resumes with the semantics it was written with, EOS emitted and generation going on."""
    method, spec = RUNS[run]
    sampling = SAMPLINGS["sampled"]

    def with_eos(eos: frozenset[int]):
        e = engine()
        e.eos_ids = eos
        return e

    old_semantics = with_eos(frozenset()).generate(PROMPT, sampling=sampling, generation=GEN, method=method,
                                                   spec=spec).token_ids  # no ban: what --ignore-eos used to do
    eos = max(set(old_semantics[20:]), key=old_semantics[20:].count)  # a token the unbanned run emits after 17
    # Before the change: the checkpoint's sampling has no banned_ids.
    path = tmp_path / "old.json"
    stop_after(with_eos(frozenset()).stream(PROMPT, sampling=sampling, generation=GEN, method=method, spec=spec),
               17).save(path)
    rewrite(path, lambda body: body["sampling"].pop("banned_ids"))
    resumed = with_eos(frozenset({eos})).resume(read_checkpoint(path))
    for _ in resumed:
        pass
    assert resumed.result is not None and resumed.result.token_ids == old_semantics
    # After: the ban is in the checkpoint and survives a resume by an engine with other EOS ids.
    banned = with_eos(frozenset({eos}))
    full = banned.generate(PROMPT, sampling=sampling, generation=GEN, method=method, spec=spec)
    assert eos not in full.token_ids and full.token_ids != old_semantics
    ckpt = stop_after(banned.stream(PROMPT, sampling=sampling, generation=GEN, method=method, spec=spec), 17)
    assert ckpt.sampling["banned_ids"] == (eos,)
    ckpt.save(path)
    resumed = with_eos(frozenset({(eos + 1) % VOCAB})).resume(read_checkpoint(path))
    for _ in resumed:
        pass
    assert resumed.result is not None and resumed.result.token_ids == full.token_ids


def test_the_checkpoint_file_is_the_format_a_resume_reads(base, tmp_path):
    """The body written once, in canonical form (no deep copy, one serialisation), is the dataclass's
    fields under the checksum the reader checks; a file in the earlier layout (the body in field
    order, as dataclasses.asdict wrote it) still reads."""
    stream = base.stream(PROMPT, sampling=SAMPLINGS["sampled"], generation=GEN, method="ar")
    ckpt = stop_after(stream, 5)
    outer = json.loads(ckpt.to_json())
    assert list(outer) == ["format", "format_version", "sha256", "checkpoint"]
    assert outer["checkpoint"] == json.loads(json.dumps(dataclasses.asdict(ckpt)))  # (tuples as lists)
    canonical = json.dumps(dataclasses.asdict(ckpt), sort_keys=True, separators=(",", ":"))
    assert outer["sha256"] == hashlib.sha256(canonical.encode()).hexdigest()
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({**outer, "checkpoint": dataclasses.asdict(ckpt)}, separators=(",", ":")))
    ckpt.save(tmp_path / "now.json")
    assert read_checkpoint(earlier) == read_checkpoint(tmp_path / "now.json")


def test_a_run_hashes_its_heads_once_for_all_its_checkpoints(base, monkeypatch):
    import longswift.stream as stream_module

    calls = []
    real = stream_module.heads_fingerprint
    monkeypatch.setattr(stream_module, "heads_fingerprint", lambda heads, **kw: calls.append(1) or real(heads, **kw))
    stream = base.stream(PROMPT, sampling=SAMPLINGS["sampled"], generation=GEN, method="tokenswift")
    saved = [stream.checkpoint() for _ in zip(stream, range(4))]
    assert len(calls) == 1
    assert {c.heads_fingerprint for c in saved} == {real(base.heads, any_precision=True)}


def test_damaged_and_foreign_checkpoint_files(base, tmp_path):
    stream = base.stream(PROMPT, sampling=SAMPLINGS["sampled"], generation=GEN, method="ar")
    good = tmp_path / "good.json"
    stop_after(stream, 5).save(good)
    data = good.read_bytes()
    cases = {
        "truncated.json": (data[: len(data) // 2], "truncated or corrupt"),
        "empty.json": (b"", "truncated or corrupt"),
        "binary.json": (b"{\xff\xfe\x00garbage", "truncated or corrupt"),
        "text.txt": (b"Once upon a time", "'.*text.txt' is not a longswift generation checkpoint \\(a checkpoint is a "
                     "JSON object\\): pass the file written by --checkpoint"),  # (an output named by mistake)
        "list.json": (b"  [1, 2]", "not a longswift generation checkpoint"),
        "zeros.json": (b"\0" * 3000, "truncated or corrupt"),  # (damage, not another file)
        "latin1.json": (b"caf\xe9", "truncated or corrupt"),
        "flipped.json": (data.replace(b'"token_ids":[', b'"token_ids":[1,', 1), "checksum mismatch"),
        "foreign.json": (b'{"hello": 1}', "not a longswift generation checkpoint: pass the file written by "
                                          "--checkpoint"),  # (it said what was wrong, not what to do)
        # --json's result, the file most likely mixed up with the checkpoint
        "result.json": (b'{"token_ids": [1], "text": "a", "stats": {}}', r"not a longswift generation checkpoint "
                        r"\(it is a --json result\): pass the file written by --checkpoint"),
        # past the parser's recursion
        "deep.json": (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "truncated or corrupt"),
        "huge-int.json": (b'{"format": ' + b"7" * 5000 + b"}", "truncated or corrupt"),  # past int's digit limit
    }
    for name, (content, message) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(LongswiftError, match=message):
            read_checkpoint(tmp_path / name)
    # A flipped byte anywhere in the file is caught (JSON error or checksum).
    for offset in range(0, len(data), max(1, len(data) // 23)):
        damaged = bytearray(data)
        damaged[offset] ^= 0x04
        (tmp_path / "bit.json").write_bytes(bytes(damaged))
        try:
            read_checkpoint(tmp_path / "bit.json")
        except LongswiftError as exc:
            assert "corrupt" in str(exc) or "not a longswift" in str(exc) or "format version" in str(exc), exc
        else:
            raise AssertionError(f"a flipped bit at byte {offset} went unnoticed")
    with pytest.raises(LongswiftError, match="does not exist"):
        read_checkpoint(tmp_path / "missing.json")
    (tmp_path / "bom.json").write_bytes(b"\xef\xbb\xbf" + data)  # a byte order mark an editor added: no damage
    assert read_checkpoint(tmp_path / "bom.json") == read_checkpoint(good)
    old = tmp_path / "old.json"
    old.write_bytes(data)
    rewrite(old, lambda c: c.update(version="0.0.1"))
    with pytest.raises(LongswiftError, match="written by longswift 0.0.1"):
        read_checkpoint(old)
    big = tmp_path / "big.json"
    big.write_bytes(data)
    rewrite(big, lambda c: c.update(token_ids=c["token_ids"] + [VOCAB + 5]))
    with pytest.raises(LongswiftError, match="vocabulary"):
        engine().resume(read_checkpoint(big))


def test_hand_edited_checkpoints_are_refused_in_one_line(base, tmp_path):
    """Edits with a recomputed checksum: stats that are missing or of the wrong type, and more tokens
    than the run's length or no prompt, are refused as damaged (before: a TypeError from the stats,
    "resuming at 13 of 5 tokens", and a message about the vocabulary)."""
    good = tmp_path / "good.json"
    stop_after(base.stream(PROMPT, sampling=SAMPLINGS["sampled"], generation=GEN, method="ar"), 13).save(good)
    edits = {
        "no stats": (lambda c: c.update(stats={}), r"settings are damaged \(.*missing .*'method'"),
        "stats of the wrong type": (lambda c: c["stats"].update(new_tokens="abc"),
                                    r"settings are damaged \(GenerationStats.new_tokens must be a whole number"),
        "more tokens than the run": (lambda c: c["generation"].update(max_new_tokens=5),
                                     r"tokens are damaged \(20 prompt tokens, 13 generated of at most 5\)"),
        "no prompt": (lambda c: c.update(prompt_ids=[]), r"tokens are damaged \(0 prompt tokens"),
    }
    for what, (edit, message) in edits.items():
        path = tmp_path / "edited.json"
        path.write_bytes(good.read_bytes())
        rewrite(path, edit)
        with pytest.raises(LongswiftError, match=message):
            base.resume(read_checkpoint(path))


def test_a_checkpoint_of_another_version_is_named_as_such_whatever_its_fields(base, tmp_path):
    """Another longswift's checkpoint whose fields differ from this one's (one added or dropped, one of
    another type) is refused for its version, not called truncated or corrupt (it was: the fields were
    checked first)."""
    good = tmp_path / "good.json"
    stop_after(base.stream(PROMPT, sampling=SAMPLINGS["sampled"], generation=GEN, method="ar"), 5).save(good)
    edits = {"a field added": lambda c: c.update(version="9.9.9", cache_layout="paged"),
             "a field dropped": lambda c: (c.update(version="9.9.9"), c.pop("spec")),
             "a field of another type": lambda c: c.update(version="9.9.9", rng_state=[1, 2])}
    for what, edit in edits.items():
        path = tmp_path / "other.json"
        path.write_bytes(good.read_bytes())
        rewrite(path, edit)
        with pytest.raises(LongswiftError, match="written by longswift 9.9.9 and this is"):
            read_checkpoint(path)


@pytest.mark.parametrize("value, message", [
    ('"1"', r'truncated or corrupt \(it has format version "1", where a checkpoint has a whole number\)'),
    ("true", r"truncated or corrupt \(it has format version true, where"),
    (None, r"truncated or corrupt \(it has no format version, where"),
    ("2", r"has format version 2; this longswift reads version 1: resume with the longswift that wrote it"),
])
def test_a_format_version_that_is_not_this_ones_says_which_it_is(base, tmp_path, value, message):
    """The outer format_version, which the checksum does not cover: a string "1" (an edit) was refused as
    "format version 1; this longswift reads version 1"."""
    path = tmp_path / "ckpt.json"
    stop_after(base.stream(PROMPT, sampling=SAMPLINGS["sampled"], generation=GEN, method="ar"), 3).save(path)
    outer = json.loads(path.read_text())
    if value is None:
        del outer["format_version"]
    else:
        outer["format_version"] = json.loads(value)
    path.write_text(json.dumps(outer))
    with pytest.raises(LongswiftError, match=message):
        read_checkpoint(path)


def test_save_never_replaces_a_file_that_is_not_json_and_an_empty_path_is_named(base, tmp_path):
    """Checkpoint.save replaced any file (a notes file named by mistake), which --checkpoint refuses; an empty path
    was refused as "output path '.' is a directory"."""
    ckpt = stop_after(base.stream(PROMPT, sampling=SAMPLINGS["sampled"], generation=GEN, method="ar"), 3)
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    with pytest.raises(LongswiftError, match="notes.txt' exists and is not a JSON file, which Checkpoint.save would "
                                             "replace: choose another file name"):
        ckpt.save(notes)
    assert notes.read_text() == "my notes\n"
    with pytest.raises(LongswiftError, match="^Checkpoint.save got an empty path: give a file name$"):
        ckpt.save("")
    ckpt.save(tmp_path / "run.json")
    ckpt.save(tmp_path / "run.json")  # (a checkpoint is JSON: replaced, as each periodic save does)
    assert read_checkpoint(tmp_path / "run.json").token_ids == ckpt.token_ids


# The config fields the first version of the format wrote, which every checkpoint must hold (written out here,
# not read from the module, so that a field dropped from checkpoint.ALWAYS_HELD fails the test below).
FIRST_VERSION_FIELDS = {
    "runtime": ("device", "dtype", "threads", "rope_scaling", "pack_weights"),
    "sampling": ("temperature", "top_k", "top_p", "min_p", "eta", "repetition_penalty", "penalty_window", "seed"),
    "generation": ("max_new_tokens", "ignore_eos", "prefill_chunk"),
    "spec": ("tree", "ngram_topk", "draft_mode", "draft_kv_budget", "draft_window", "attention_sinks", "adaptive"),
}


def test_a_checkpoint_lacking_any_first_version_config_field_is_refused(base, tmp_path):
    """Each field the format has always held, removed (checksum recomputed), is refused, naming the group and
    the field: one that resumed at its default (penalty_window's 64 for the run's 8, say) would be another run,
    silently. Fields added since may be absent (an older checkpoint; see the banned_ids test above)."""
    from longswift.checkpoint import ALWAYS_HELD

    assert {group: set(keys) for group, keys in ALWAYS_HELD.items()} == {
        group: set(keys) for group, keys in FIRST_VERSION_FIELDS.items()}
    good = tmp_path / "good.json"
    spec = RUNS["tokenswift-paper"][1]
    stop_after(base.stream(PROMPT, sampling=SAMPLINGS["sampled"], generation=GEN, method="tokenswift", spec=spec),
               5).save(good)
    read_checkpoint(good)  # whole, it reads
    path = tmp_path / "edited.json"
    for group, keys in FIRST_VERSION_FIELDS.items():
        for key in keys:
            path.write_bytes(good.read_bytes())
            rewrite(path, lambda c: c[group].pop(key))
            with pytest.raises(LongswiftError, match=rf"is not valid: {group} lacks {key}; resume from an unedited"):
                read_checkpoint(path)


def test_a_new_length_equal_to_the_tokens_held_is_taken_and_finishes_at_once(base):
    """with_length(n) for a checkpoint holding exactly n tokens is a finished run of length n, not a refusal
    (only a length below the tokens held is): its resume adds nothing and ends for "length"."""
    ckpt = stop_after(base.stream(PROMPT, sampling=SAMPLINGS["sampled"], generation=GEN, method="ar"), 5)
    assert len(ckpt.token_ids) == 5
    same = ckpt.with_length(5)
    assert same.generation["max_new_tokens"] == 5 and same.token_ids == ckpt.token_ids
    resumed = base.resume(ckpt, max_new_tokens=5)
    assert list(resumed) == []
    assert resumed.result.token_ids == ckpt.token_ids and resumed.result.stats.finish_reason == "length"
    with pytest.raises(LongswiftError, match="max_new_tokens=4 is below the 5 tokens"):
        ckpt.with_length(4)


def test_checkpoint_every_must_be_a_positive_whole_number_of_tokens(base, tmp_path):
    """outputs.checkpoint_every (--checkpoint-every, which a resume saves as often as) of 0, below 0, a
    boolean or a fraction is refused on reading (0 would save after every step, or never); null and a
    positive count read."""
    good = tmp_path / "good.json"
    stop_after(base.stream(PROMPT, sampling=SAMPLINGS["sampled"], generation=GEN, method="ar"), 5).save(good)
    path = tmp_path / "edited.json"
    for every, ok in ((64, True), (1, True), (None, True), (0, False), (-1, False), (True, False), (2.5, False)):
        path.write_bytes(good.read_bytes())
        rewrite(path, lambda c: c["outputs"].update(checkpoint_every=every))
        if ok:
            assert read_checkpoint(path).outputs["checkpoint_every"] == every
        else:
            with pytest.raises(LongswiftError, match=r"is not valid: outputs.checkpoint_every must be a positive "
                                                     r"number of tokens; resume from an unedited copy$"):
                read_checkpoint(path)


def test_the_checkpoint_after_an_interrupted_step_holds_the_stats_of_the_boundary_before_it(base, monkeypatch):
    """A TokenSwift step interrupted in its commit has already counted its trie (verified nodes, verify steps,
    stage times): the checkpoint holds the stats of the step boundary before it, as its tokens and RNG state
    are, or the resumed run's stats count the interrupted step twice."""
    import longswift.spec.tokenswift as tokenswift

    method, spec = RUNS["tokenswift-paper"]
    real, calls = tokenswift.commit, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 8:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(tokenswift, "commit", interrupted)
    stream = base.stream(PROMPT, sampling=SAMPLINGS["sampled"], generation=GEN, method=method, spec=spec)
    boundary = None
    with pytest.raises(KeyboardInterrupt):
        for _ in stream:
            boundary = stream.checkpoint()
    ckpt = stream.checkpoint()
    assert stream.stats.verify_steps == boundary.stats["verify_steps"] + 1  # the live stats: mid-step
    assert ckpt.stats == boundary.stats and ckpt.token_ids == boundary.token_ids


def test_resuming_leaves_the_checkpoint_as_it_was(base):
    """The resumed run's stats shared the checkpoint's stage_seconds dict: the run changed the caller's Checkpoint,
    and two resumes of it added to one dict (session 49's review)."""
    c = stop_after(base.stream(PROMPT, sampling=SAMPLINGS["sampled"], generation=GEN, **dict(zip(
        ("method", "spec"), RUNS["tokenswift-adaptive"]))), 20)
    before = c.to_json()
    first, second = base.resume(c), base.resume(c)
    for stream in (first, second):
        list(stream)
    assert c.to_json() == before
    assert first.result.stats.stage_seconds is not second.result.stats.stage_seconds


@pytest.mark.parametrize("edit, message", [
    (lambda c: replace(c, sampling={**c.sampling, "banned_ids": [500]}), "banned token ids are damaged"),
    (lambda c: replace(c, sampling={**c.sampling, "banned_ids": list(range(VOCAB))}), "banned token ids are damaged"),
    (lambda c: replace(c, stats={**c.stats, "stage_seconds": {"draft": "x"}}),
     r"settings are damaged \(GenerationStats.stage_seconds must map stage names to seconds\)"),
    (lambda c: replace(c, stats={**c.stats, "stage_seconds": "x"}), "stage_seconds must map stage names to seconds"),
    (lambda c: replace(c, stats={**c.stats, "finish_reason": "bogus"}),
     r"settings are damaged \(GenerationStats.finish_reason must be null or one of length, eos, stop, interrupted; "
     r"got 'bogus'\)"),
    (lambda c: replace(c, stats={**c.stats, "resumes": -1}), r"GenerationStats.resumes must be 0 or more; got -1"),
    (lambda c: replace(c, stats={**c.stats, "decode_seconds": float("inf")}),
     r"GenerationStats.decode_seconds must be finite seconds of 0 or more; got inf"),
    (lambda c: replace(c, stats={**c.stats, "stage_seconds": {"plain": -0.5}}),
     r"GenerationStats.stage_seconds must be finite seconds of 0 or more"),
    (lambda c: replace(c, stats={**c.stats, "processes": 0}), r"GenerationStats.processes must be 1 or more; got 0"),
])
def test_checkpoint_values_a_run_refuses_are_refused_on_resume(base, edit, message):
    """A banned id past the vocabulary was an IndexError in the first step, every id banned ran, and stage seconds
    that are not numbers a TypeError (a Checkpoint built in Python, or a file edited with its checksum redone).
    Stats no run writes (a finish reason of none, a negative count or time) were read, and went on counting."""
    c = stop_after(base.stream(PROMPT, sampling=SAMPLINGS["sampled"], generation=GEN, method="ar"), 13)
    with pytest.raises(LongswiftError, match=message) as info:
        list(base.resume(edit(c)))
    assert "\n" not in str(info.value)


def test_a_rope_scaling_spelt_otherwise_is_the_same_setting():
    """'yarn:2' and 'yarn:2.0' are one setting: a checkpoint made with either resumes on an engine given the other
    (it was refused as 'made with yarn:2 ... this engine has yarn:2.0'); another factor is still refused."""
    hf = tiny_hf_model("llama", "default", seed=31, vocab=VOCAB)
    made = longswift.load(hf, dtype="float64", rope_scaling="yarn:2")
    ckpt = stop_after(made.stream(PROMPT, sampling=SAMPLINGS["sampled"], generation=GEN, method="ar"), 5)
    assert longswift.load(hf, dtype="float64", rope_scaling="yarn:2.0").resume(ckpt) is not None
    with pytest.raises(LongswiftError, match="made with rope_scaling yarn:2 and this engine has yarn:3"):
        longswift.load(hf, dtype="float64", rope_scaling="yarn:3").resume(ckpt)


def every_boundary(e, run, sampling, gen):
    """The uninterrupted result and a checkpoint at each step boundary of the same run (`run`: method, spec)."""
    method, spec = run
    full = e.generate(PROMPT, sampling=sampling, generation=gen, method=method, spec=spec)
    stream = e.stream(PROMPT, sampling=sampling, generation=gen, method=method, spec=spec)
    ckpts = [stream.checkpoint() for _ in stream]
    assert stream.result.token_ids == full.token_ids
    return full, ckpts


def finish(stream):
    for _ in stream:
        pass
    return stream.result


@pytest.mark.parametrize("run", ["ar", "tokenswift-adaptive"])
def test_token_blocks_resume_at_every_boundary_whatever_the_block_size_of_the_resuming_engine(base, run, monkeypatch):
    """--read-every 4: AR's blocks draw their uniforms four at once, and TokenSwift's plain steps (made to lead here)
    run as such blocks; no test resumed one. A checkpoint after any block resumes to the uninterrupted run's tokens
    on an engine of the same block size and on one reading every token (a GPU run, read_every 16, continued on a
    CPU), and the reverse."""
    from longswift.spec.schedule import PLAIN, StepSchedule

    monkeypatch.setattr(StepSchedule, "rate", lambda self, kind: 3.0 if kind == PLAIN else 1.0)
    blocks = longswift.load(hf_model(), dtype="float64", heads="random", read_every=4)
    gen = replace(GEN, max_new_tokens=30)
    for first, then in ((blocks, base), (blocks, blocks), (base, blocks)):
        full, ckpts = every_boundary(first, RUNS[run], SAMPLINGS["sampled"], gen)
        assert len(ckpts) < gen.max_new_tokens or first is base  # (blocks of several tokens were yielded)
        for ckpt in ckpts:
            result = finish(then.resume(ckpt))
            assert result.token_ids == full.token_ids, len(ckpt.token_ids)
            assert result.stats.new_tokens == gen.max_new_tokens and result.stats.finish_reason == "length"


@pytest.mark.parametrize("run", ["ar", "tokenswift-paper", "tokenswift-fused"])
def test_a_new_length_given_to_an_unfinished_run_gives_the_run_started_with_it(base, run):
    """resume(ckpt, max_new_tokens=N) of a run still going (tests above extend finished ones): shorter or longer
    than the length it was started with, down to the tokens it holds, the tokens are the first N of the longer run."""
    method, spec = RUNS[run]
    sampling = SAMPLINGS["sampled"]
    whole = base.generate(PROMPT, sampling=sampling, generation=replace(GEN, max_new_tokens=50), method=method,
                          spec=spec).token_ids
    stream = base.stream(PROMPT, sampling=sampling, generation=replace(GEN, max_new_tokens=30), method=method,
                         spec=spec)
    for _ in stream:
        if len(stream.token_ids) < 12:
            continue
        ckpt, held = stream.checkpoint(), len(stream.token_ids)
        for length in sorted({held, held + 1, 29, 31, 50} - set(range(held))):
            result = finish(base.resume(ckpt, max_new_tokens=length))
            assert result.token_ids == whole[:length], (held, length)
            assert result.stats.finish_reason == "length" and result.stats.new_tokens == length
        if held >= 20:
            break


SPECS_AT_EVERY_BOUNDARY = {
    # a static draft cache selected once, past a budget the prompt alone nearly fills
    "static-cache": SpecConfig(tree="2,2,2", ngram_topk=3, draft_kv_budget=22, draft_window=4, attention_sinks=3,
                               draft_cache="static", adaptive=False),
    # tries cut to a node budget (pruned by score), lookup steps, a dynamic cache past a small budget
    "pruned-adaptive": SpecConfig(tree="2,3,3", ngram_topk=4, max_nodes=6, lookup_nodes=5, draft_kv_budget=24,
                                  draft_window=5, attention_sinks=2),
    "batched-walk": SpecConfig(tree="1,2,2", ngram_topk=2, walk="batched", adaptive=False),
}


@pytest.mark.parametrize("sampling", SAMPLINGS.values(), ids=SAMPLINGS.keys())
@pytest.mark.parametrize("spec", SPECS_AT_EVERY_BOUNDARY.values(), ids=SPECS_AT_EVERY_BOUNDARY.keys())
def test_drafting_settings_of_no_other_test_resume_at_every_step_boundary(base, spec, sampling):
    """A static draft cache, pruned tries with lookup steps and the batched walk (none of them in RUNS): a checkpoint
    after any step, the many-token ones included, resumes to the uninterrupted run's tokens."""
    gen = replace(GEN, max_new_tokens=40)
    full, ckpts = every_boundary(base, ("tokenswift", spec), sampling, gen)
    assert len(ckpts) < gen.max_new_tokens  # some steps committed several tokens
    for ckpt in ckpts:
        assert finish(base.resume(ckpt)).token_ids == full.token_ids, len(ckpt.token_ids)
