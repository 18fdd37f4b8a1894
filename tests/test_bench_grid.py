"""The benchmark suite on a tiny random model: files written, resumption, metric definitions
(Distinct-n by hand, speedup arithmetic, checkpoints), and peers reported as skipped."""

from __future__ import annotations

import csv
import importlib.util
import json
import re
import sys

import pytest
import torch
from conftest import tiny_hf_model

from longswift.bench.metrics import Timeline, checkpoint_targets, curve_speedup, distinct_n, speedup
from longswift.bench.peers import missing
from longswift.bench.machine import software_versions, versions_lines
from longswift.bench.prompts import read_bench_prompt_file
from longswift.cli import main
from longswift.config import SpecConfig
from longswift.errors import LongswiftError
from longswift.spec.budget import draft_cache_tokens, held_logit_rows, tree_budget, walk_rows


def test_distinct_n_matches_a_hand_count():
    ids = [1, 2, 1, 2, 3]
    # unigrams {1,2,3} of 5; bigrams 12 21 12 23 -> 3 of 4; trigrams 121 212 123 -> 3 of 3; 4-grams 2 of 2
    assert [distinct_n(ids, n) for n in (1, 2, 3, 4)] == [3 / 5, 3 / 4, 1.0, 1.0]
    assert distinct_n([7] * 6, 1) == 1 / 6 and distinct_n([7] * 6, 2) == 1 / 5
    assert distinct_n([4, 5], 3) == 0.0


def test_speedup_arithmetic():
    assert speedup(50.0, 25.0) == 2.0  # twice the tokens/s = half the time per token
    assert speedup(20.0, 40.0) == 0.5
    with pytest.raises(ValueError):
        speedup(10.0, 0.0)
    # baseline: prefill 1 s, then 2 s to 2 tokens and 4 s to 4; other: prefill 0.5 s, then 1 s to 3 tokens, 1.6 s to 4
    base = [(2, 3.0), (4, 5.0)]
    other = [(3, 1.5), (4, 2.1)]
    curve = curve_speedup(base, other, base_prefill=1.0, other_prefill=0.5)
    assert [n for n, _ in curve] == [3, 4]
    assert curve[0][1] == pytest.approx(3.0 / 1.0)  # baseline interpolated to 3 s at 3 tokens
    assert curve[1][1] == pytest.approx(4.0 / 1.6)
    # Both at one token a second after the prefill's first token; the baseline's first checkpoint at 5 tokens
    # (a step of 4 after the first): to 2 tokens each took 1 s, not the baseline 4 * 2 / 5 s (from 0 tokens)
    assert curve_speedup([(5, 1.0 + 4.0)], [(2, 0.5 + 1.0)], 1.0, 0.5) == [(2, pytest.approx(1.0))]


def test_timeline_checkpoints_every_eighth():
    assert checkpoint_targets(16) == [2, 4, 6, 8, 10, 12, 14, 16]
    assert checkpoint_targets(4) == [1, 2, 3, 4]  # short runs: no duplicate targets
    seen = []
    t = Timeline(16, start=0.0, progress=lambda n, s: seen.append(n))
    for count, when in ((1, 1.0), (5, 2.0), (6, 2.5), (16, 4.0)):  # a step may emit several tokens
        t.record(count, when=when, alpha=count / 16)
    assert t.checkpoints == [(5, 2.0), (6, 2.5), (16, 4.0)]  # 2 and 4 crossed at once by the jump to 5
    assert t.checkpoint_alpha == [5 / 16, 6 / 16, 1.0] and seen == [5, 6, 16]
    assert t.prefill_seconds == 1.0 and t.decode_seconds == 3.0


def test_decode_rate_leaves_out_a_first_block():
    """AR under --read-every N (16 on CUDA by default) yields its first N tokens at once: N-1 of them
    were decoded before the first arrival, so only the tokens after it count over the decode time."""
    t = Timeline(12, start=0.0)
    for count, when in ((4, 1.0), (8, 2.0), (12, 3.0)):
        t.record(count, when=when)
    assert t.first_tokens == 4 and t.decode_rate(12) == 8 / 2.0  # not (12 - 1) / 2.0
    one = Timeline(4, start=0.0)
    one.record(4, when=1.0)  # every token in one block: nothing to time
    assert one.decode_rate(4) == 0.0
    assert curve_speedup([(4, 1.0), (8, 2.0)], [(2, 1.5), (8, 2.0)], 1.0, 1.0) == [(8, 1.0)]  # none inside the block


def read_instructions(path):
    """A JSONL prompt set's (id, prompt) pairs as bench reads them."""
    return list(read_bench_prompt_file(path).instructions)


def test_prompt_set_parses_and_bad_lines_are_named(tmp_path):
    from pathlib import Path

    pairs = read_instructions(Path(__file__).resolve().parents[1] / "docs" / "prompts" / "instructions.jsonl")
    assert len(pairs) >= 5 and len({name for name, _ in pairs}) == len(pairs)
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"id": "a", "prompt": "ok"}\n{"id": "b"}\n')
    from longswift.errors import LongswiftError

    with pytest.raises(LongswiftError, match="p.jsonl' line 2 has no \"prompt\" field"):
        read_instructions(bad)
    # two prompts of one id (of the same length) were one cell of the report, their runs counted together
    bad.write_text('{"id": "a", "prompt": "one"}\n{"prompt": "two"}\n{"id": "a", "prompt": "three"}\n')
    with pytest.raises(LongswiftError, match='p.jsonl\' line 3: id "a" is used by an earlier line'):
        read_instructions(bad)
    # JSON writers leave U+2028, U+2029 and U+0085 unescaped in strings, where str.splitlines split the record
    # (refused as no JSON object); CRLF line ends stay line ends
    import json

    rows = [{"id": "a", "prompt": "one\u2028two"}, {"id": "b", "prompt": "three\x85four\u2029"}]
    bad.write_text("\r\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\r\n", encoding="utf-8")
    assert read_instructions(bad) == [("a", "one\u2028two"), ("b", "three\x85four\u2029")]


@pytest.mark.parametrize("line, match", [
    ('{"id": "a", "prompt": "ok",}', r"p.jsonl' line 1 is not JSON \(Expecting property name enclosed in double "
                                     r"quotes at column 28\)"),  # (its prompt field was said to be missing)
    ('{"id": ' + "9" * 5000 + ', "prompt": "ok"}', "p.jsonl' line 1 holds an integer of more than"),  # (a ValueError)
    ('{"prompt": "ok", "x": ' + "[" * 100_000 + "]" * 100_000 + "}", "p.jsonl' line 1 nests arrays or objects too "
                                                                     "deeply"),
    ('["prompt"]', 'p.jsonl\' line 1 has no "prompt" field: a prompt set holds one {"id": ..., "prompt": ...} '),
    ('{"id": "", "prompt": "ok"}', 'p.jsonl\' line 1: "id" must be a non-empty name on one line .*; got ""'),
    ('{"id": "a", "prompt": "ok \\ud800"}', r"line 1 holds an unpaired surrogate escape \(\\ud800\) in its 'prompt'"),
    ('{"id": "a\\n## b", "prompt": "ok"}', '"id" must be a non-empty name on one line'),  # (broke the report)
    ('{"id": null, "prompt": "ok"}', '"id" must be .*; got null'),  # (was the cell "None")
    ('{"id": true, "prompt": "ok"}', '"id" must be .*; got true'),
    ('{"id": ["a"], "prompt": "ok"}', '"id" must be'),
])
def test_a_prompt_set_line_that_cannot_be_a_cell_says_why(tmp_path, line, match):
    """Valid JSON that Python cannot read was a traceback, a syntax error was called a missing field, and an id of
    a newline, of nothing or of null named a cell of the report."""
    from longswift.errors import LongswiftError

    bad = tmp_path / "p.jsonl"
    bad.write_text(line + "\n")
    with pytest.raises(LongswiftError, match=match) as info:
        read_instructions(bad)
    assert "\n" not in str(info.value)


def test_a_prompt_sets_ids_may_be_numbers_and_its_suffix_any_case(tmp_path):
    from pathlib import Path

    from longswift.bench.prompts import holds_instructions

    good = tmp_path / "p.jsonl"
    good.write_text('{"id": 7, "prompt": "one"}\n{"id": "b|c", "prompt": "two"}\n{"prompt": "three"}\n')
    assert read_instructions(good) == [("7", "one"), ("b|c", "two"), ("line3", "three")]
    assert [holds_instructions(Path(n)) for n in ("a.JSONL", "a.ndjson", "a.txt", "a.json")] == [True, True, False,
                                                                                                 False]


def test_a_prompt_file_bench_cannot_use_is_refused_before_loading(tmp_path, capsys):
    """A missing, empty or bad prompt file was found after the model loaded (20 s); a pipe was read twice, its
    second read empty, and the results named by the digest of nothing. (No model exists here: a refusal that came
    after loading would name the model.)"""
    import os

    from conftest import assert_one_line_error, run_cli

    base = ["bench", "--model", str(tmp_path / "no-model"), "--prompt-file"]
    code, _, err = run_cli(capsys, *base, str(tmp_path / "nope.txt"))
    assert_one_line_error(code, err, f"prompt file '{tmp_path / 'nope.txt'}' does not exist")
    (tmp_path / "empty.txt").write_text(" \n")
    code, _, err = run_cli(capsys, *base, str(tmp_path / "empty.txt"))
    assert_one_line_error(code, err, f"prompt file '{tmp_path / 'empty.txt'}' is empty: give a file of prose text")
    (tmp_path / "bad.ndjson").write_text('{"id": "a"}\n')
    code, _, err = run_cli(capsys, *base, str(tmp_path / "bad.ndjson"))
    assert_one_line_error(code, err, 'bad.ndjson\' line 1 has no "prompt" field')
    os.mkfifo(tmp_path / "fifo")
    code, _, err = run_cli(capsys, *base, str(tmp_path / "fifo"))
    assert_one_line_error(code, err, f"--prompt-file '{tmp_path / 'fifo'}' is a pipe")
    assert "which bench reads more than once" in err
    (tmp_path / "set.ndjson").write_text('{"id": "a", "prompt": "one"}\n')  # a prompt set: sent whole
    code, _, err = run_cli(capsys, *base, str(tmp_path / "set.ndjson"), "--prefix", "12")
    assert_one_line_error(code, err, "--prefix sets prompt lengths, but a .ndjson file's prompts are sent whole")


def test_prompts_prose_to_each_prefix_and_instructions_as_they_are(tmp_path):
    from types import SimpleNamespace

    from longswift.bench.prompts import build_prompts, read_bench_prompt_file

    def encode(text, chat=False):  # one id per character; chat adds a 2-id wrapper
        return ([900, 901] if chat else []) + [ord(c) for c in text]

    engine = SimpleNamespace(encode=encode, cfg=SimpleNamespace(vocab_size=50),
                             tokenizer=SimpleNamespace(encode=lambda text, add_special_tokens: encode(text)))
    prose = tmp_path / "p.txt"
    prose.write_text("abc")
    cells = build_prompts(engine, read_bench_prompt_file(prose), False, (4, 7), seed=0)
    assert [(n, p.ids, p.fixed) for n, p in cells] == [(4, (97, 98, 99, 97), False), (7, (97, 98, 99) * 2 + (97,), False)]
    jsonl = tmp_path / "i.jsonl"
    jsonl.write_text('{"id": "one", "prompt": "hi"}\n\n{"id": "two", "prompt": "yo"}\n')
    cells = build_prompts(engine, read_bench_prompt_file(jsonl), True, (4, 7), seed=0)  # prefix lengths do not apply
    assert [(n, p.name, p.ids) for n, p in cells] == [(None, "one", (900, 901, 104, 105)), (None, "two", (900, 901, 121, 111))]
    rand = build_prompts(engine, None, False, (3, 5), seed=1)
    assert rand[0][1].ids == rand[1][1].ids[:3] and all(0 <= t < 50 for t in rand[1][1].ids)  # nested prefixes


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    tiny_hf_model(max_position_embeddings=256).save_pretrained(path)
    return path


def bench(capsys, tiny_dir, out_dir, *extra):
    argv = ["bench", "--model", str(tiny_dir), "--heads", "random", "--threads", "1", "--no-warmup",
            "--methods", "ar,tokenswift,hf,llamacpp", "--prefix", "12", "--lengths", "8,6",
            "--presets", "greedy,paper", "--out-dir", str(out_dir), *extra]
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    return out, err


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_suite_writes_files_and_resumes(tmp_path, tiny_dir, capsys):
    out_dir = tmp_path / "bench"
    report, err = bench(capsys, tiny_dir, out_dir)
    records = lines(out_dir / "results.jsonl")
    # 2 lengths x 2 presets x 3 methods (llamacpp cannot run an HF directory) x 1 run
    assert len(records) == 12
    assert {(r["method"], r["preset"], r["length"]) for r in records} == {
        (m, p, n) for m in ("ar", "tokenswift", "hf") for p in ("greedy", "paper") for n in (6, 8)}
    by = {(r["method"], r["preset"], r["length"]): r for r in records}
    for r in records:
        ids = r["token_ids"]
        assert len(ids) == r["length"] == r["new_tokens"] and r["prompt_tokens"] == 12
        assert [r[f"distinct_{n}"] for n in (1, 2, 3, 4)] == [distinct_n(ids, n) for n in (1, 2, 3, 4)]
        counts = [n for n, _ in r["checkpoints"]]
        assert counts[-1] == r["length"] and counts == sorted(set(counts))
        if r["method"] == "ar":  # one token per step: every target is hit exactly
            assert counts == checkpoint_targets(r["length"])
        assert r["decode_tokens_per_second"] == pytest.approx((r["length"] - 1) / r["decode_seconds"])
        assert r["peak_memory_bytes"] >= r["memory_at_start_bytes"] > 10 * 2**20
        assert (r["alpha"] is None) == (r["method"] != "tokenswift")
        assert r["versions"] == software_versions()  # what measured it, for a later report of the directory
    for preset in ("greedy", "paper"):  # lossless: same seed, same tokens
        assert by[("tokenswift", preset, 8)]["token_ids"] == by[("ar", preset, 8)]["token_ids"]
    assert by[("hf", "greedy", 8)]["token_ids"] == by[("ar", "greedy", 8)]["token_ids"]
    rows = list(csv.DictReader((out_dir / "results.csv").open()))
    assert len(rows) == 12 and "token_ids" not in rows[0]
    for row in rows:
        ar_rate = by[("ar", row["preset"], int(row["length"]))]["decode_tokens_per_second"]
        ratio = float(row["decode_tokens_per_second"]) / ar_rate  # (the CSV rounds it to 4 decimals)
        assert float(row["speedup_vs_ar"]) == pytest.approx(ratio, rel=1e-3, abs=5e-5)
    md = (out_dir / "report.md").read_text()
    assert md.strip() == report.strip()
    assert "llamacpp: skipped (" in md and "--lengths 8,6" in md and "torch " in md
    assert md.count("### random-ids-seed0: 12-token prompt") == 4
    assert "tokenswift identical; hf identical" in md
    for preset in ("greedy", "paper"):  # alpha's sample: the steps that drafted, of the steps after the first token
        ts = by[("tokenswift", preset, 8)]
        assert 0 < ts["steps"] <= 8 and ts["verify_steps"] + ts["plain_steps"] + 1 == ts["steps"]  # + the first draw
        assert f"| {ts['alpha']:.2f} ({ts['verify_steps']} of {ts['steps'] - 1}) |" in md
    assert "tokenswift outputs equal ar's token for token in float64; in float32 the verify pass's" in md
    png = sorted(p.name for p in out_dir.glob("*.png"))
    if importlib.util.find_spec("matplotlib"):
        assert png == ["alpha_vs_length.png", "speedup_vs_length.png", "time_to_n_tokens.png"]
    else:  # said in the report, not silently left out
        assert png == [] and "No plots: matplotlib is not installed" in md

    # the same command again: nothing to do, nothing appended; plots an earlier report drew and this one does not
    # (matplotlib gone since) are removed, other files kept
    for name in ("alpha_vs_length.png", "speedup_vs_length.png", "time_to_n_tokens.png", "mine.png"):
        (out_dir / name).write_bytes(b"an earlier report's plot")
    report, err = bench(capsys, tiny_dir, out_dir)
    assert "resuming: 12 runs" in err and "0 runs to do" in err
    stale = {p.name for p in out_dir.glob("*.png") if p.read_bytes() == b"an earlier report's plot"}
    assert stale == {"mine.png"} and {p.name for p in out_dir.glob("*.png")} == {*png, "mine.png"}
    assert "resumed: 12 of the 12 runs below were measured by earlier invocations" in report
    assert len(lines(out_dir / "results.jsonl")) == 12
    # a run cut off mid-line is dropped and run again; a longer grid only runs the new cells
    with open(out_dir / "results.jsonl", "a") as f:
        f.write('{"key": "trunc')
    (out_dir / "results.jsonl").write_text("\n".join((out_dir / "results.jsonl").read_text().splitlines()[1:]) + "\n")
    _, err = bench(capsys, tiny_dir, out_dir, "--lengths", "8,6,4")
    after = lines(out_dir / "results.jsonl")
    assert "7 runs to do" in err  # the dropped first run + 2 presets x 3 methods at length 4
    assert len(after) == 18 and sorted(r["key"] for r in after) == sorted(set(r["key"] for r in after))


def test_the_report_names_the_software_each_run_was_measured_with():
    now = software_versions()
    older = {**now, "torch": "0.0.1", "commit": "abc1234"}
    assert versions_lines([{"versions": now}] * 2) == versions_lines(None)  # one invocation: one line, as before
    assert versions_lines(None)[0].startswith("- versions: torch ")
    mixed = versions_lines([{"versions": now}, {"versions": older}, {"versions": older}, {}])
    assert mixed[0] == "- versions the runs were measured with:"
    assert "  - torch 0.0.1, " in "\n".join(mixed) and "(commit abc1234): 2 runs" in "\n".join(mixed)
    assert "  - not recorded (runs measured before bench kept versions): 1 run" in mixed
    assert mixed[-1].startswith("  - this report was written with: torch ")


def test_different_config_is_refused_unless_fresh(tmp_path, tiny_dir, capsys):
    out_dir = tmp_path / "bench"
    bench(capsys, tiny_dir, out_dir, "--methods", "ar", "--lengths", "4", "--presets", "greedy")
    code = main(["bench", "--model", str(tiny_dir), "--heads", "random", "--threads", "1", "--no-warmup", "--methods", "ar", "--prefix", "12",
                 "--lengths", "4", "--presets", "greedy", "--seed", "1", "--out-dir", str(out_dir)])
    err = capsys.readouterr().err
    assert code == 2 and "holds results of a different configuration (differs in: seed)" in err
    bench(capsys, tiny_dir, out_dir, "--methods", "ar", "--lengths", "4", "--presets", "greedy", "--seed", "1", "--fresh")
    assert [r["run"] for r in lines(out_dir / "results.jsonl")] == [0]


def test_a_directory_stopped_before_its_first_run_takes_other_settings(tmp_path, tiny_dir, capsys):
    """A Ctrl-C during the first run left config.json and an empty results.jsonl, and the directory then refused
    any other settings ("holds results of a different configuration") though it held no result."""
    out_dir = tmp_path / "bench"
    bench(capsys, tiny_dir, out_dir, "--methods", "ar", "--lengths", "4", "--presets", "greedy")
    (out_dir / "results.jsonl").write_text("")  # as the interrupted first run left it
    bench(capsys, tiny_dir, out_dir, "--methods", "ar", "--lengths", "4", "--presets", "greedy", "--seed", "1")
    assert json.loads((out_dir / "config.json").read_text())["identity"]["seed"] == 1
    assert [r["run"] for r in lines(out_dir / "results.jsonl")] == [0]


def test_a_relative_and_an_absolute_path_to_one_model_resume_into_the_same_results(tmp_path, tiny_dir, capsys,
                                                                                     monkeypatch):
    out_dir = tmp_path / "bench"
    monkeypatch.chdir(tiny_dir.parent)
    grid = ("--methods", "ar", "--lengths", "4", "--presets", "greedy")
    argv = ["bench", "--model", tiny_dir.name, "--heads", "random", "--threads", "1", "--no-warmup", "--prefix", "12",
            *grid, "--out-dir", str(out_dir)]
    assert main(argv) == 0, capsys.readouterr().err
    config = json.loads((out_dir / "config.json").read_text())
    assert config["identity"]["model"] == str(tiny_dir.resolve())
    _, err = bench(capsys, tiny_dir.resolve(), out_dir, *grid)
    assert "0 runs to do" in err
    # a directory made when bench kept the path as typed (relative) resumes too, and keeps it absolute from then on
    config["identity"]["model"] = tiny_dir.name
    (out_dir / "config.json").write_text(json.dumps(config))
    _, err = bench(capsys, tiny_dir, out_dir, *grid)
    assert "0 runs to do" in err
    assert json.loads((out_dir / "config.json").read_text()) == {**config, "identity": {
        **config["identity"], "model": str(tiny_dir.resolve())}}


def test_hf_peer_bans_eos_like_our_ignore_eos():
    """The hf peer runs what `--ignore-eos` means for us: EOS masked (min_new_tokens = n), never
    emitted, so its greedy tokens are our AR's even where the model's argmax is EOS."""
    import longswift
    from longswift import GenerationConfig, SamplingConfig
    from longswift.bench.peers import HFRunner
    from longswift.runtime.twin import hf_twin

    engine = longswift.load(tiny_hf_model(seed=3, vocab=24), dtype="float32", heads=None)
    greedy = SamplingConfig(temperature=0, repetition_penalty=1.0)
    gen = GenerationConfig(max_new_tokens=30, ignore_eos=True)
    prompt = [5, 9, 4, 11, 7, 3]
    engine.eos_ids = frozenset()
    free = engine.generate(prompt, sampling=greedy, generation=gen).token_ids
    eos = max(set(free), key=free.count)  # the token the unbanned run emits most, as EOS
    engine.eos_ids = frozenset({eos})
    ours = engine.generate(prompt, sampling=greedy, generation=gen).token_ids
    peer = HFRunner(hf_twin(engine), eos_ids=(eos,)).run(prompt, 30, greedy).token_ids
    assert eos not in peer and peer == ours and ours != free


def test_the_peers_sampler_notes_say_where_their_penalty_window_differs():
    """llama.cpp's penalty sampler is given only the tokens it draws, so its window never holds the prompt, where
    ours holds the last W tokens of prompt and output alike; transformers' holds the whole sequence."""
    from dataclasses import replace

    from longswift.bench.grid import PRESETS
    from longswift.bench.peers import sampler_note

    paper = PRESETS["paper"]
    assert paper.repetition_penalty != 1.0
    assert sampler_note("llamacpp", paper).endswith(f"the repetition penalty's window holds the last "
                                                    f"{paper.penalty_window} generated tokens, never the prompt's")
    assert sampler_note("llamacpp", PRESETS["greedy"]) is None
    assert sampler_note("llamacpp", replace(PRESETS["greedy"], repetition_penalty=1.2)).startswith("the repetition")
    assert "prompt included" in sampler_note("hf", paper) and sampler_note("tokenswift", paper) is None


@pytest.mark.slow
def test_llamacpp_peer_bans_eos_like_our_ignore_eos():
    """llama.cpp's generate() emitted EOS and went on (the embedded model's greedy answer to a greeting, at its 33rd
    token), where ours and hf's ban it. (llama-cpp-python is an optional extra: skipped where it is not installed.)"""
    pytest.importorskip("llama_cpp")
    import longswift
    from longswift import SamplingConfig
    from longswift.bench.peers import LlamaCppRunner
    from longswift.runtime.loading import resolve_path

    engine = longswift.load(None, dtype="float32", heads=None, threads=1)
    prompt = engine.encode("Say hi.", chat=True)
    greedy = SamplingConfig(temperature=0, repetition_penalty=1.0)
    eos = tuple(sorted(engine.eos_ids))
    free = LlamaCppRunner(resolve_path(None), 512, 1, 0).run(prompt, 60, greedy).token_ids
    banned = LlamaCppRunner(resolve_path(None), 512, 1, 0, eos_ids=eos).run(prompt, 60, greedy).token_ids
    first = min(free.index(e) for e in eos if e in free)  # (the test's premise: the free run emits one)
    assert len(banned) == 60 and not set(eos) & set(banned) and banned[:first] == free[:first]


def test_missing_peers_are_skipped_not_failed(tmp_path, tiny_dir, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp now raises ImportError
    assert missing("llamacpp") == "not installed: pip install llama-cpp-python"
    assert missing("hf") is None
    out_dir = tmp_path / "bench"
    report, err = bench(capsys, tiny_dir, out_dir, "--methods", "ar,llamacpp,llamacpp-pld", "--lengths", "4",
                        "--presets", "greedy")
    assert "llamacpp: skipped (not installed: pip install llama-cpp-python)" in report
    assert "llamacpp-pld: skipped (not installed: pip install llama-cpp-python)" in err
    assert [r["method"] for r in lines(out_dir / "results.jsonl")] == ["ar"]


def test_a_peer_that_fails_as_it_loads_is_skipped_with_why(tmp_path, tiny_dir, capsys, monkeypatch):
    """llama-cpp-python whose native library will not load raises a RuntimeError on import: every bench, even of
    ar alone, stopped with a traceback (the versions line asks every peer's version)."""
    fake = tmp_path / "site" / "llama_cpp"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise RuntimeError(\"Failed to load shared library 'libllama.so'\")\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "llama_cpp", raising=False)
    assert missing("llamacpp") == ("installed but fails to import (RuntimeError: Failed to load shared library "
                                   "'libllama.so'); reinstall it: pip install --force-reinstall llama-cpp-python")
    report, err = bench(capsys, tiny_dir, tmp_path / "bench", "--methods", "ar,llamacpp", "--lengths", "4",
                        "--presets", "greedy")
    assert "llamacpp: skipped (installed but fails to import" in report


def test_a_peer_that_cannot_load_stops_the_grid_before_its_first_run(tmp_path, tiny_dir, capsys, monkeypatch):
    """A peer's model is loaded as it is first run: a GGUF llama.cpp refused stopped the grid after the runs of the
    methods before it (with --no-warmup, which loaded it no earlier), minutes in at real lengths."""
    import longswift.bench.grid as grid

    class Refusing(grid.HFRunner):
        def __init__(self, *args, **kwargs):
            raise LongswiftError("transformers cannot load this model: leave hf out of --methods")

    monkeypatch.setattr(grid, "HFRunner", Refusing)
    out_dir = tmp_path / "bench"
    code = main(["bench", "--model", str(tiny_dir), "--threads", "1", "--no-warmup", "--methods", "ar,hf",
                 "--prefix", "12", "--lengths", "4", "--presets", "greedy", "--out-dir", str(out_dir)])
    err = capsys.readouterr().err
    assert code != 0 and "transformers cannot load this model" in err, err
    assert "ar: 4 tokens" not in err and not (out_dir / "results.jsonl").read_text().strip(), err


def test_a_prompt_file_is_read_once(tmp_path, capsys, monkeypatch):
    """bench read its --prompt-file three times (its check before loading, the prompts, the digest that names the
    results): a file rewritten in between named one text's results with another's digest."""
    from conftest import byte_tokenizer

    import longswift.bench.prompts as prompts_mod

    model = tmp_path / "m"
    tiny_hf_model("llama", seed=5, vocab=300).save_pretrained(model)
    byte_tokenizer().save_pretrained(model)

    reads = []
    read = prompts_mod.read_prompt_bytes
    monkeypatch.setattr(prompts_mod, "read_prompt_bytes", lambda path: reads.append(path) or read(path))
    prose = tmp_path / "p.txt"
    prose.write_text("The keeper climbed the stairs.")
    code = main(["bench", "--model", str(model), "--threads", "1", "--no-warmup", "--methods", "ar", "--prefix",
                 "12", "--lengths", "4", "--presets", "greedy", "--prompt-file", str(prose), "--out-dir",
                 str(tmp_path / "bench")])
    err = capsys.readouterr().err
    assert code == 0 and reads == [prose], (reads, err)
    [record] = lines(tmp_path / "bench" / "results.jsonl")
    config = json.loads((tmp_path / "bench" / "config.json").read_text())
    import hashlib

    assert config["identity"]["prompt_digest"] == hashlib.sha256(prose.read_bytes()).hexdigest()[:16], config
    assert record["prefix"] == 12


def test_a_grid_that_would_measure_nothing_is_refused_before_any_file(tmp_path, tiny_dir, capsys, monkeypatch):
    """Every method skipped for every preset (llamacpp for the eta preset) planned 0 runs, wrote an empty report and
    a results directory, and exited 0."""
    from longswift.bench.grid import Methods

    monkeypatch.setattr(Methods, "skip_reason", lambda self, m, sampling=None: None if sampling is None else "no eta")
    code = main(["bench", "--model", str(tiny_dir), "--heads", "random", "--threads", "1", "--no-warmup", "--methods",
                 "ar", "--prefix", "12", "--lengths", "4", "--presets", "eta", "--out-dir", str(tmp_path / "b")])
    _, err = capsys.readouterr()
    assert code == 2 and err.strip().endswith("no method can run any preset of this grid: ar (eta): no eta: choose "
                                              "other --methods or --presets"), err
    assert not (tmp_path / "b").exists()


def test_the_files_are_written_before_the_report_is_printed(tmp_path, tiny_dir, capsys, monkeypatch):
    """A reader of stdout that stops (`| head -3`) ended the command at the report's print, before --json and --out
    were written: the grid's results went without a word (its --out-dir, if given, kept them)."""
    import builtins

    real_print = builtins.print

    def closed_pipe(*args, **kwargs):  # stdout's reader is gone; stderr still takes the log
        if kwargs.get("file") in (None, sys.stdout):
            raise BrokenPipeError(32, "Broken pipe")
        real_print(*args, **kwargs)

    monkeypatch.setattr(builtins, "print", closed_pipe)
    code = main(["bench", "--model", str(tiny_dir), "--heads", "random", "--threads", "1", "--no-warmup", "--methods",
                 "ar", "--prefix", "12", "--lengths", "4", "--presets", "greedy", "--json", str(tmp_path / "r.json"),
                 "--out", str(tmp_path / "r.md")])
    monkeypatch.undo()
    assert code == 141  # (the shell's status for a closed pipe)
    assert json.loads((tmp_path / "r.json").read_text())["runs"][0]["method"] == "ar"
    assert "| ar |" in (tmp_path / "r.md").read_text()


def test_results_recorded_before_a_sampling_field_was_added_resume_as_done(tmp_path, tiny_dir, capsys):
    """A run's key hashes its sampling settings: banned_ids, added later, changed every key, so a directory made
    before it re-ran every run on resume and its report counted each twice. Such records are found by their
    earlier key (the added field at its default left out)."""
    from longswift.bench.grid import KEYED_SAMPLING, _key

    out_dir = tmp_path / "bench"
    bench(capsys, tiny_dir, out_dir, "--methods", "ar,tokenswift", "--lengths", "4")
    pool = tuple(torch.randint(0, 128, (12,), generator=torch.Generator().manual_seed(0)).tolist())
    records = lines(out_dir / "results.jsonl")
    for r in records:  # as a bench from before banned_ids wrote them
        assert r["key"] == _key(r["prompt"], pool, r["length"], r["sampling"], r["method"], r["variant"], r["run"])
        r["sampling"] = {k: v for k, v in r["sampling"].items() if k in KEYED_SAMPLING}
        r["key"] = _key(r["prompt"], pool, r["length"], r["sampling"], r["method"], r["variant"], r["run"])
    (out_dir / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    report, err = bench(capsys, tiny_dir, out_dir, "--methods", "ar,tokenswift", "--lengths", "4")
    assert f"resuming: {len(records)} runs already in" in err and "0 runs to do" in err
    assert len(lines(out_dir / "results.jsonl")) == len(records)


def test_ablation_rerun_adds_a_variant_next_to_the_existing_runs(tmp_path, tiny_dir, capsys):
    out_dir = tmp_path / "bench"
    bench(capsys, tiny_dir, out_dir, "--methods", "ar,tokenswift", "--lengths", "6", "--presets", "greedy")
    report, err = bench(capsys, tiny_dir, out_dir, "--methods", "ar,tokenswift", "--lengths", "6", "--presets", "greedy",
                        "--tree", "1,2", "--ngram-topk", "0")
    assert "1 runs to do" in err  # ar is unchanged; only the new TokenSwift variant runs
    records = lines(out_dir / "results.jsonl")
    assert [r["method"] for r in records] == ["ar", "tokenswift", "tokenswift"]
    assert records[1]["variant"].startswith("tree 1,1,1, n-gram top-k 1") and records[2]["variant"].startswith("tree 1,2, n-gram top-k 0")
    assert records[2]["token_ids"] == records[0]["token_ids"]
    assert "| tokenswift | tree 1,2, n-gram top-k 0" in report and "| tokenswift | tree 1,1,1, n-gram top-k 1" in report
    # the report says which rows were measured apart, and that its options line is this invocation's
    assert "- tokenswift options of this invocation: 1,2 tree, n-gram top-k 0" in report
    assert "rows measured with other options name theirs in the variant column" in report
    first, second = records[1]["variant"], records[2]["variant"]
    assert f"different invocations (1 = earliest): ar 1, tokenswift ({first}) 1, tokenswift ({second}) 2;" in report
    # records of a version that kept no invocation count as one earlier invocation; one invocation: no line
    old = [{k: v for k, v in r.items() if k != "invocation"} for r in records]
    (out_dir / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old[:2]))
    report, _ = bench(capsys, tiny_dir, out_dir, "--methods", "ar,tokenswift", "--lengths", "6", "--presets", "greedy")
    assert "different invocations" not in report and "- tokenswift options: 1,1,1 tree" in report
    report, _ = bench(capsys, tiny_dir, out_dir, "--methods", "ar,tokenswift", "--lengths", "6", "--presets", "greedy",
                      "--runs", "2")
    assert "different invocations (1 = earliest): ar 1+2, tokenswift 1+2;" in report


def test_spec_label_names_the_walk_only_against_the_device_default():
    import dataclasses

    import torch

    from longswift import SpecConfig
    from longswift.bench.grid import spec_label

    cpu = SpecConfig().for_device(torch.device("cpu"))
    assert "walk" not in spec_label(cpu, "tokenswift", "rows")  # earlier CPU results keep their keys
    batched = dataclasses.replace(cpu, walk="batched")
    assert spec_label(batched, "tokenswift", "rows").endswith(", batched walk, paper draft, adaptive on")
    assert "walk" not in spec_label(batched, "tokenswift", "batched")  # the GPU default


def test_spec_label_names_the_suffix_lookup_only_away_from_its_defaults():
    import dataclasses

    import torch

    from longswift import SpecConfig
    from longswift.bench.grid import spec_label

    cpu = SpecConfig().for_device(torch.device("cpu"))
    assert "lookup" not in spec_label(cpu, "tokenswift")
    assert ", lookup steps of at most 16 nodes," in spec_label(dataclasses.replace(cpu, lookup_nodes=16), "tokenswift")
    off = dataclasses.replace(cpu, suffix_lookup=False, lookup_nodes=16)  # no copy: its budget means nothing
    assert ", no suffix lookup," in spec_label(off, "tokenswift") and "at most 16" not in spec_label(off, "tokenswift")


def test_spec_label_names_the_node_budget_only_where_it_cuts_the_trie():
    import torch

    from longswift import SpecConfig
    from longswift.bench.grid import spec_label

    cpu = SpecConfig().for_device(torch.device("cpu"))  # no budget: CPU results keep their keys
    assert "nodes" not in spec_label(cpu, "tokenswift", "rows")
    assert "nodes" not in spec_label(SpecConfig(max_nodes=8).for_device(torch.device("cpu")), "tokenswift", "rows")
    gpu = SpecConfig().for_device(torch.device("cuda"))  # the paper's trie (up to 121 nodes) cut to 32
    assert ", at most 32 nodes" in spec_label(gpu, "tokenswift", "batched")


def test_our_methods_decode_from_the_end_of_their_prefill_blocks_included(tmp_path, tiny_dir, capsys):
    """Our methods' decode time starts where their prefill ends. With --read-every 4, AR's first arrival is a
    block of 4 whose steps were left out of its decode time (and its 4 tokens out of the count); a 4-token run
    had no decode time at all. Without blocks, AR's first arrival came after it had forwarded that token: its
    rate counted n-1 tokens over n-2 forwards."""
    out_dir = tmp_path / "bench"
    report, _ = bench(capsys, tiny_dir, out_dir, "--methods", "ar,tokenswift", "--lengths", "4,8",
                      "--presets", "greedy", "--read-every", "4")
    records = lines(out_dir / "results.jsonl")
    for r in records:
        assert r["first_tokens"] == 1
        assert r["decode_tokens_per_second"] == pytest.approx((r["length"] - 1) / r["decode_seconds"])
        assert r["prefill_seconds"] < r["checkpoints"][0][1]  # the first arrival came after the prefill ended
    ar = {r["length"]: r for r in records if r["method"] == "ar"}
    assert ar[4]["decode_tokens_per_second"] > 0  # the block's 3 tokens after the first, over its steps
    assert "| ar | - | 1 | " in report and "| - | - | - | - | - | - | - |" not in report


@pytest.mark.parametrize("flags, field", [(["--rope-scaling", "yarn:2"], "rope_scaling"),
                                          (["--read-every", "2"], "read_every")])
def test_a_rerun_with_another_rope_scaling_or_token_block_is_refused(flags, field, tmp_path, tiny_dir, capsys):
    """Rope scaling changes the tokens and --read-every the speed: a rerun with either found the runs
    'already done' and reported the old numbers under the new command."""
    out_dir = tmp_path / "bench"
    bench(capsys, tiny_dir, out_dir, "--methods", "ar", "--lengths", "4", "--presets", "greedy")
    code = main(["bench", "--model", str(tiny_dir), "--heads", "random", "--threads", "1", "--no-warmup",
                 "--methods", "ar", "--prefix", "12", "--lengths", "4", "--presets", "greedy",
                 "--out-dir", str(out_dir), *flags])
    err = capsys.readouterr().err
    assert code == 2 and f"holds results of a different configuration (differs in: {field})" in err
    report, _ = bench(capsys, tiny_dir, out_dir, "--methods", "ar", "--lengths", "4", "--presets", "greedy",
                      "--fresh", *flags)
    assert ("rope scaling yarn:2" if field == "rope_scaling" else "AR reads its tokens 2 at a time") in report


@pytest.mark.parametrize("flags, advice", [(["--prefix", "300", "--lengths", "8"], "--rope-scaling yarn:2"),
                                           (["--prefix", "300000", "--lengths", "8"], None),  # past yarn's 1024
                                           # past the run's own yarn:2: a factor that reaches (608 / 256)
                                           (["--prefix", "600", "--lengths", "8", "--rope-scaling", "yarn:2"],
                                            "lower --lengths or --prefix, or extend the context with --rope-scaling "
                                            "yarn:3"),
                                           (["--prefix", "100000000000", "--lengths", "8"], None)])  # 800 GB of ids
def test_a_grid_past_the_context_is_told_to_extend_it_only_where_it_can(flags, advice, tiny_dir, capsys):
    """The advice was always --rope-scaling yarn:F: also for F past the 1024 that --rope-scaling takes,
    and for a model already extended by its own config (generate's check_context says neither; one extended by
    the run's --rope-scaling is told the factor that reaches). A --prefix of 10**11 is
    refused before its random ids are made (that allocation was a traceback)."""
    code = main(["bench", "--model", str(tiny_dir), "--heads", "random", "--threads", "1", "--methods", "ar", *flags])
    err = capsys.readouterr().err
    assert code == 2 and "exceeds this model's context of " in err and err.count("\n") == 1, err
    assert (advice in err) if advice else ("--rope-scaling" not in err), err


def test_a_grid_past_the_context_names_the_length_flags_as_given(tmp_path, tiny_dir, capsys):
    """The refusal said "lower --lengths/--prefix" also to a user who gave the aliases --new-tokens and
    --prompt-tokens, and also where the prompts are sent whole (a .jsonl file's), which have no prefix to lower."""
    from conftest import byte_tokenizer

    code = main(["bench", "--model", str(tiny_dir), "--heads", "random", "--threads", "1", "--methods", "ar",
                 "--prompt-tokens", "250", "--new-tokens", "8"])
    err = capsys.readouterr().err
    assert code == 2 and "context of 256: lower --new-tokens or --prompt-tokens" in err, err

    model = tmp_path / "m"
    tiny_hf_model("llama", seed=5, vocab=300, max_position_embeddings=64).save_pretrained(model)
    byte_tokenizer().save_pretrained(model)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "' + "x" * 60 + '"}\n')
    code = main(["bench", "--model", str(model), "--heads", "random", "--threads", "1", "--methods", "ar",
                 "--lengths", "8", "--prompt-file", str(prompts)])
    err = capsys.readouterr().err
    assert code == 2 and "context of 64: lower --lengths or shorten the prompts" in err, err


def test_a_grid_past_a_sliding_window_is_refused_before_any_run(tmp_path, capsys):
    """A sliding-window model's window was found by the first run's cache, mid-grid, in the API's words."""
    tiny_hf_model("mistral", "default", seed=31, sliding_window=16).save_pretrained(tmp_path / "m")
    capsys.readouterr()  # (transformers' progress bar as it saves)
    code = main(["bench", "--model", str(tmp_path / "m"), "--heads", "random", "--threads", "1", "--methods", "ar",
                 "--prefix", "12", "--lengths", "8", "--no-warmup"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert ("the grid's longest cell (prefix 12 + 8 new = 20 tokens) exceeds this model's sliding window of 16, "
            "which longswift does not implement: lower --lengths or --prefix") in err


def test_default_lengths_are_those_that_fit_the_context(tmp_path, tiny_dir, capsys, monkeypatch):
    """`longswift bench` without --lengths runs the default lengths that fit the model's context after the
    prompt (the embedded model's 8,192 tokens hold 2048 + 4096, not 2048 + 8192), and says which it left out;
    given lengths that do not fit are still refused."""
    import longswift.bench.grid as grid

    monkeypatch.setattr(grid, "DEFAULT_LENGTHS", (4, 6, 250))  # the tiny model's context is 256
    out_dir = tmp_path / "bench"
    code = main(["bench", "--model", str(tiny_dir), "--heads", "auto", "--threads", "1", "--no-warmup",
                 "--methods", "ar", "--prefix", "12", "--out-dir", str(out_dir)])
    _, err = capsys.readouterr()
    assert code == 0, err
    assert "default lengths: 250 left out (a 12-token prompt leaves 244 of the model's 256-token context)" in err
    assert sorted(r["new_tokens"] for r in lines(out_dir / "results.jsonl")) == [4, 6]
    code = main(["bench", "--model", str(tiny_dir), "--threads", "1", "--methods", "ar", "--prefix", "12",
                 "--lengths", "4,250"])
    assert code == 2 and "exceeds this model's context of 256" in capsys.readouterr().err


def test_heads_auto_resumes_results_of_heads_default(tmp_path, tiny_dir, capsys):
    """bench's --heads default is 'auto' (a released checkpoint's own heads first, as generate's); on a model
    without heads of its own that is what 'default' took, recorded the same, so older directories resume.
    'default' itself takes only shipped heads: refused on a model that has none, as by every command."""
    out_dir = tmp_path / "bench"
    bench_args = ["bench", "--model", str(tiny_dir), "--threads", "1", "--no-warmup", "--methods", "ar",
                  "--prefix", "12", "--lengths", "4", "--out-dir", str(out_dir)]
    assert main([*bench_args, "--heads", "auto"]) == 0
    assert json.loads((out_dir / "config.json").read_text())["identity"]["heads"] == "default"
    capsys.readouterr()
    for heads in (["--heads", "auto"], []):  # given, and as the default
        assert main([*bench_args, *heads]) == 0
        assert "0 runs to do" in capsys.readouterr().err
    assert json.loads((out_dir / "config.json").read_text())["identity"]["heads"] == "default"
    assert main([*bench_args, "--heads", "default"]) == 2
    assert "no draft heads are shipped with longswift for this model, and --heads default" in capsys.readouterr().err


def test_lockstep_takes_turns_and_times_each_run_on_its_own_clock(monkeypatch):
    """The method with the fewest tokens steps next, so that all pass each token count together
    (b commits 2 tokens in one step, and a catches up); each method's clock advances only while its
    own step runs: a fake clock that each step advances by its method's cost gives each timeline
    exactly its own steps' sum."""
    import longswift.bench.lockstep as lockstep

    now = [0.0]
    monkeypatch.setattr(lockstep.time, "perf_counter", lambda: now[0])
    order = []

    def steps(method, cost, sizes):
        for size in sizes:
            now[0] += cost
            order.append(method)
            yield [7] * size
        now[0] += 100.0  # what ending costs (the iterator's last call) is after the last arrival: not decode time

    timelines = {m: Timeline(4, start=0.0) for m in ("a", "b")}
    counts = lockstep.run_lockstep({"a": steps("a", 1.0, [1, 1, 1, 1]), "b": steps("b", 3.0, [1, 2, 1])}, timelines,
                                   torch.device("cpu"), {"a": lambda: None, "b": lambda: 0.5})
    assert counts == {"a": 4, "b": 4}
    assert order == ["a", "b", "a", "b", "a", "a", "b"]
    a, b = timelines["a"], timelines["b"]
    assert (a.prefill_seconds, a.decode_seconds) == (1.0, 3.0)  # its four steps of 1 s, the first as prefill
    assert (b.prefill_seconds, b.decode_seconds) == (3.0, 6.0)
    assert b.checkpoints[-1] == (4, 9.0) and b.checkpoint_alpha[-1] == 0.5


def test_lockstep_runs_equal_the_runs_made_one_at_a_time(tmp_path, tiny_dir, capsys):
    """--lockstep changes how runs are timed, never what they generate; all of our methods of a cell
    and run go together wherever --methods puts a peer; the report says so, and says which runs
    ran alone; a results directory holds runs timed one way only."""
    flags = ("--methods", "ar,hf,tokenswift,tokenswift-fused", "--lengths", "8", "--presets", "paper", "--runs", "2")
    bench(capsys, tiny_dir, tmp_path / "apart", *flags)
    report, err = bench(capsys, tiny_dir, tmp_path / "lockstep", *flags, "--lockstep")
    apart, together = lines(tmp_path / "apart" / "results.jsonl"), lines(tmp_path / "lockstep" / "results.jsonl")
    assert [(r["method"], r["run"]) for r in together] == [  # each run's batch where its first method stood
        ("ar", 0), ("tokenswift", 0), ("tokenswift-fused", 0), ("hf", 0),
        ("ar", 1), ("tokenswift", 1), ("tokenswift-fused", 1), ("hf", 1)]
    assert ({(r["method"], r["run"]): r["token_ids"] for r in together}
            == {(r["method"], r["run"]): r["token_ids"] for r in apart})
    assert err.count("start (in lockstep)") == 6 and "hf: start\n" in err  # the peer runs on its own
    assert "s of its own" in err and "runs alone" not in err
    ours = ["ar", "tokenswift", "tokenswift-fused"]
    for r in together:
        assert r["decode_tokens_per_second"] > 0 and [n for n, _ in r["checkpoints"]][-1] == 8
        assert r.get("lockstep_with") == (None if r["method"] == "hf" else [m for m in ours if m != r["method"]])
    rows = list(csv.DictReader((tmp_path / "lockstep" / "results.csv").open()))
    assert [row["lockstep_with"] for row in rows[:4]] == ["tokenswift+tokenswift-fused", "ar+tokenswift-fused",
                                                          "ar+tokenswift", ""]
    assert "- lockstep (--lockstep): our methods' runs of a cell and run ran together, a step at a time" in report
    assert "not in lockstep" not in report
    code = main(["bench", "--model", str(tiny_dir), "--heads", "random", "--threads", "1", "--no-warmup", "--prefix", "12",
                 *flags, "--out-dir", str(tmp_path / "lockstep")])
    assert code == 2 and "differs in: lockstep" in capsys.readouterr().err
    # an ablation rerun into the same directory: AR's runs are there, so the new variant runs alone, and says so
    report, err = bench(capsys, tiny_dir, tmp_path / "lockstep", *flags, "--lockstep", "--methods", "ar,tokenswift",
                        "--tree", "1,2")
    assert err.count("runs alone") == 2 and "start (in lockstep)" not in err
    assert [r["lockstep_with"] for r in lines(tmp_path / "lockstep" / "results.jsonl")[-2:]] == [[], []]
    assert "- not in lockstep (no other method of ours was left to run with it in its cell and run): tokenswift (" in report


def test_lockstep_batches_gather_our_methods_of_a_cell_and_run_around_peers():
    from longswift.bench.grid import batches

    one, two = object(), object()
    plan = [(c, r, m, f"{m}{r}") for c in (one, two) for r in (0, 1) for m in ("hf", "ar", "llamacpp", "tokenswift")]
    grouped = [[(c is two, r, m) for c, r, m, _ in b] for b in batches(plan, lockstep=True)]
    assert grouped[:3] == [[(False, 0, "hf")], [(False, 0, "ar"), (False, 0, "tokenswift")], [(False, 0, "llamacpp")]]
    assert len(grouped) == 12 and grouped[-2] == [(True, 1, "ar"), (True, 1, "tokenswift")]
    assert batches(plan, lockstep=False) == [[e] for e in plan]


def test_lockstep_refuses_before_any_run_when_the_caches_together_do_not_fit(tmp_path, tiny_dir, capsys, monkeypatch):
    """Each cache alone fits (the engine checks it when allocating), both at once do not: said before any run."""
    import longswift.runtime.memory as memory
    from longswift.bench.grid import BenchConfig, Cell, check_grid_memory
    from longswift.bench.prompts import Prompt
    from longswift.engine import load

    engine = load(str(tiny_dir), heads="random", threads=1)
    cell = Cell(Prompt("p", tuple(range(12)), False), 12, "paper", 200)
    cfg = BenchConfig(lockstep=True)
    spec = SpecConfig().for_device(engine.model.device)
    one = memory.plan_memory(engine.cfg, engine.model.dtype, engine.model.device, 212 + tree_budget(spec),
                             12, engine.model.packed, draft_cache_tokens(spec, 212),  # (the 12-token prompt's prefill)
                             tree_budget(spec), sampled_rows=walk_rows(spec), held_rows=held_logit_rows(spec))
    free = one.kv_cache + one.draft_cache + one.workspace + 1  # TokenSwift's run alone fits
    monkeypatch.setattr(memory, "available_bytes", lambda device: free)
    check_grid_memory(engine, cfg, cell, ["tokenswift"])  # one method: nothing held beside it
    with pytest.raises(LongswiftError, match=r"--lockstep holds the KV caches of ar, tokenswift at once: .* "
                                             r"[GMK]iB for the 212-token cell, but .* [GMK]iB is free; drop "
                                             r"--lockstep"):
        check_grid_memory(engine, cfg, cell, ["ar", "tokenswift"])
    check_grid_memory(engine, BenchConfig(), cell, ["ar", "tokenswift"])  # one at a time: each fits
    code = main(["bench", "--model", str(tiny_dir), "--heads", "random", "--threads", "1", "--no-warmup", "--methods",
                 "ar,tokenswift", "--prefix", "12", "--lengths", "200", "--presets", "paper", "--lockstep",
                 "--out-dir", str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert code == 2 and "--lockstep holds the KV caches of ar, tokenswift at once" in err and "start" not in err
    assert not (tmp_path / "b" / "results.jsonl").exists()


def test_lockstep_bytes_add_up_the_graph_pools_only_with_cuda_graphs():
    """Without graphs a step's transients are freed before the next method steps (the largest counts); each
    generation's CUDA graph pool keeps its transients for the whole run, so with graphs they add up."""
    from longswift.bench.grid import lockstep_bytes
    from longswift.runtime.memory import MemoryPlan

    def plan(kv: int, draft: int, work: int) -> MemoryPlan:
        return MemoryPlan(weights=0, packed_weights=0, kv_cache=kv, workspace=work, capacity_tokens=1, device="cpu",
                          draft_cache=draft, draft_tokens=0, tree_nodes=0)

    plans = [plan(100, 0, 7), plan(100, 30, 11)]
    assert lockstep_bytes(plans, graph_pools=False) == 230 + 11
    assert lockstep_bytes(plans, graph_pools=True) == 230 + 18


def run_record(key: str, **more) -> dict:
    """A run's record with the fields every record has (store.RECORD_FIELDS, and the others the report reads:
    store.RECORD_TYPES), for the store's own tests."""
    return {"key": key, "prompt": "p", "prompt_tokens": 8, "preset": "greedy", "length": 4, "method": "ar",
            "variant": "", "run": 0, "decode_tokens_per_second": 1.0, "token_ids": [1, 2, 3, 4],
            "finished_at": "2026-12-01T04:00:00", "peak_memory_bytes": 2**30, "decode_seconds": 3.0,
            "prefill_seconds": 0.5, "sampling": {"temperature": 0.0}, "checkpoints": [[1, 0.5], [4, 3.5]],
            **{f"distinct_{n}": 1.0 for n in (1, 2, 3, 4)}, **more}


def test_a_results_directory_takes_one_invocation_at_a_time_and_a_batch_at_once(tmp_path):
    """Two invocations writing one --out-dir ran every run twice (the report took medians over the copies):
    the second is refused while the first holds it. A batch's records go in one write."""
    from longswift.bench.store import ResultStore

    first = ResultStore(tmp_path / "d", {"model": "m"})
    try:
        with pytest.raises(LongswiftError, match="is being written by another longswift run"):
            ResultStore(tmp_path / "d", {"model": "m"})
        first.extend([run_record("a", x=1), run_record("b", x=2)])
    finally:
        first.close()
    again = ResultStore(tmp_path / "d", {"model": "m"})  # released: the next invocation resumes
    try:
        assert [r["key"] for r in again.records] == ["a", "b"] and again.has("b")
    finally:
        again.close()


def test_a_results_directory_drops_the_temporary_files_a_killed_invocation_left(tmp_path):
    """kill -9 while the report or a plot was being written left `report.md.<random>.partial` and the like;
    the next invocation, holding the directory, removes them (and nothing else)."""
    from longswift.bench.store import OUTPUT_FILES, ResultStore

    tmp_path.joinpath("d").mkdir()
    left = [tmp_path / "d" / f"{name}.k1ll3d_x.partial" for name in OUTPUT_FILES]
    kept = [tmp_path / "d" / "notes.txt.k1ll3d_x.partial", tmp_path / "d" / "report.md.partial"]
    for f in left + kept:
        f.write_text("half")
    heard: list = []
    ResultStore(tmp_path / "d", {"model": "m"}, on_stale=heard.append).close()
    assert not any(f.exists() for f in left) and all(f.exists() for f in kept)
    assert sorted(heard) == sorted(left)  # (bench says each, as the other commands do)


def test_a_last_record_without_its_newline_is_not_joined_by_the_next(tmp_path):
    """A whole last line missing only its newline loaded fine, and the next run's record was appended onto
    it: the resume after that failed on a line of two records."""
    from longswift.bench.store import ResultStore

    store = ResultStore(tmp_path, {"model": "m"})
    store.extend([run_record("a"), run_record("b")])
    store.close()
    path = tmp_path / "results.jsonl"
    path.write_bytes(path.read_bytes()[:-1])  # cut the final newline
    store = ResultStore(tmp_path, {"model": "m"})
    store.append(run_record("c"))
    store.close()
    assert [json.loads(line)["key"] for line in path.read_text().splitlines()] == ["a", "b", "c"]


def test_fresh_discards_only_a_bench_directorys_files(tmp_path):
    """--fresh deleted any config.json in --out-dir, a model's included, before checking it was bench's."""
    from longswift.bench.store import ResultStore

    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(LongswiftError, match="is not a longswift bench config, and --fresh discards only a bench"):
        ResultStore(tmp_path, {"model": "m"}, fresh=True)
    assert (tmp_path / "config.json").read_text() == '{"model_type": "llama"}'
    assert not (tmp_path / "results.jsonl.longswift-lock").exists()  # the refusal released the lock


def test_bench_outputs_never_replace_the_model_or_heads_it_reads(tmp_path, capsys, no_loading):
    """bench --json MODEL/config.json replaced the model's config (exit 0); --out-dir MODEL --fresh deleted it."""
    from conftest import assert_one_line_error, run_cli, tiny_hf_model

    tiny_hf_model("llama", seed=5).save_pretrained(tmp_path / "m")
    model = tmp_path / "m"
    before = (model / "config.json").read_bytes()
    capsys.readouterr()
    heads = tmp_path / "h"  # a --heads directory: its heads.safetensors is what is read
    heads.mkdir()
    (heads / "heads.safetensors").write_bytes(b"heads")
    for args, match in ((["--json", str(model / "config.json")], "--json and --model are the same file"),
                        (["--out-dir", str(model), "--fresh"], "--out-dir's config.json and --model are the same"),
                        (["--heads", str(heads), "--json", str(heads / "heads.safetensors")],
                         "--json and --heads are the same file")):
        code, _, err = run_cli(capsys, "bench", "--model", str(model), "--methods", "ar", "--lengths", "4", *args)
        assert_one_line_error(code, err, match)
    assert (model / "config.json").read_bytes() == before and (heads / "heads.safetensors").read_bytes() == b"heads"


def test_another_model_at_the_same_path_does_not_resume_into_its_results(tmp_path):
    """The identity names the model by its path: a different model saved there resumed into the old runs.
    Its fingerprint now tells them apart; a directory made before it was kept resumes and gets it."""
    from longswift.bench.store import ResultStore

    ResultStore(tmp_path, {"model": "m"}, model_fingerprint="aaa").close()
    ResultStore(tmp_path, {"model": "m"}, model_fingerprint="aaa").close()
    with pytest.raises(LongswiftError, match="holds results of another model at the path 'm'"):
        ResultStore(tmp_path / ".", {"model": "m"}, model_fingerprint="bbb")
    old = tmp_path / "old"
    ResultStore(old, {"model": "m"}).close()  # as made before the fingerprint was kept
    assert "model_fingerprint" not in json.loads((old / "config.json").read_text())
    ResultStore(old, {"model": "m"}, model_fingerprint="ccc").close()
    assert json.loads((old / "config.json").read_text()) == {"identity": {"model": "m"}, "model_fingerprint": "ccc"}


def test_a_fine_tune_with_its_bases_embeddings_does_not_resume_into_the_bases_results(tmp_path):
    """The fingerprint (shapes and a corner of the embedding) is a fine-tune's base's when it kept the embeddings:
    its probe (runtime.probe, equal up to rounding) differs. A probe within rounding resumes; a directory made
    before the probe was kept resumes and gets it."""
    from longswift.bench.store import ResultStore

    probe = [1.0, -2.0, 0.5]
    ResultStore(tmp_path, {"model": "m"}, model_fingerprint="aaa", model_probe=(probe, torch.float32)).close()
    near = [x * (1 + 1e-6) for x in probe]  # another thread count's rounding
    ResultStore(tmp_path, {"model": "m"}, model_fingerprint="aaa", model_probe=(near, torch.float32)).close()
    with pytest.raises(LongswiftError, match="holds results of another model at the path 'm' \\(its config or weights"):
        ResultStore(tmp_path, {"model": "m"}, model_fingerprint="aaa", model_probe=([1.0, -2.0, 0.6], torch.float32))
    old = tmp_path / "old"
    ResultStore(old, {"model": "m"}, model_fingerprint="aaa").close()
    ResultStore(old, {"model": "m"}, model_fingerprint="aaa", model_probe=(probe, torch.float32)).close()
    assert json.loads((old / "config.json").read_text())["model_probe"] == probe


def test_bench_refuses_a_model_whose_layers_changed_at_the_same_path(tmp_path, capsys):
    """A model rewritten in place with other layer weights, its embedding and config.json kept (a fine-tune):
    the rerun resumed the old runs and mixed both models' tokens in one report."""
    from conftest import assert_one_line_error, run_cli, tiny_hf_model
    from safetensors.torch import load_file, save_file

    model = tmp_path / "m"
    tiny_hf_model("llama", seed=5).save_pretrained(model)
    run = ["bench", "--model", str(model), "--methods", "ar", "--prompt-tokens", "8", "--runs", "1", "--no-warmup",
           "--out-dir", str(tmp_path / "b"), "--no-progress"]
    code, _, err = run_cli(capsys, *run, "--lengths", "4")
    assert code == 0, err
    weights = load_file(model / "model.safetensors")
    weights = {k: (v * 1.5 if ".mlp." in k else v) for k, v in weights.items()}  # embedding and config as they were
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    code, _, err = run_cli(capsys, *run, "--lengths", "4,8")
    assert_one_line_error(code, err, "holds results of another model at the path")


def test_bench_never_replaces_files_it_did_not_write(tmp_path):
    """A report.md or results.csv of the user's in --out-dir, without bench's config.json, was replaced by the
    run's (results.jsonl alone was refused)."""
    from longswift.bench.store import ResultStore

    for name in ("report.md", "results.csv", "speedup_vs_length.png"):
        folder = tmp_path / name.replace(".", "_")
        folder.mkdir()
        (folder / name).write_text("my notes")
        with pytest.raises(LongswiftError, match=f"holds {name} without bench's config.json: use another --out-dir"):
            ResultStore(folder, {"model": "m"})
        assert (folder / name).read_text() == "my notes" and not (folder / "config.json").exists()


@pytest.mark.parametrize("flags,lines", [([], True), (["--no-progress"], False)])
def test_bench_no_progress_logs_each_runs_start_only(tmp_path, capsys, flags, lines):
    """--no-progress, as generate, train-heads and eval-heads take it: the runs' token counts are not logged."""
    from conftest import run_cli, tiny_hf_model

    tiny_hf_model("llama", seed=5).save_pretrained(tmp_path / "m")
    code, _, err = run_cli(capsys, "bench", "--model", str(tmp_path / "m"), "--methods", "ar", "--prompt-tokens", "8",
                           "--new-tokens", "16", "--runs", "1", "--no-warmup", "--out-dir", str(tmp_path / "b"),
                           *flags)
    assert code == 0, err
    assert "run 1 ar: start" in err
    assert ("run 1 ar: 16/16 tokens" in err) == lines, err


def test_bench_writes_its_report_into_the_out_dir_it_makes(tmp_path, capsys):
    """`--out-dir b --out b/r.md` with b not there yet was refused ("directory 'b' does not exist"), though
    --out-dir makes it."""
    from conftest import run_cli, tiny_hf_model

    tiny_hf_model("llama", seed=5).save_pretrained(tmp_path / "m")
    out_dir = tmp_path / "new" / "b"
    code, _, err = run_cli(capsys, "bench", "--model", str(tmp_path / "m"), "--methods", "ar", "--prompt-tokens", "8",
                           "--new-tokens", "4", "--runs", "1", "--no-warmup", "--out-dir", str(out_dir),
                           "--out", str(out_dir / "r.md"), "--json", str(out_dir / "r.json"))
    assert code == 0, err
    assert "| ar |" in (out_dir / "r.md").read_text() and (out_dir / "r.json").is_file()


def test_output_directories_are_made_with_their_parents_and_files_need_theirs(tmp_path, tiny_dir, capsys):
    """README's rule: bench's --out-dir is made with its parents; its --out and --json files need their directory."""
    base = ["bench", "--model", str(tiny_dir), "--threads", "1", "--no-warmup", "--methods", "ar", "--prefix", "12",
            "--lengths", "4"]
    code = main([*base, "--out", str(tmp_path / "missing" / "r.md")])
    assert code == 2 and "directory" in capsys.readouterr().err and not (tmp_path / "missing").exists()
    assert main([*base, "--out-dir", str(tmp_path / "a" / "b" / "run")]) == 0
    assert (tmp_path / "a" / "b" / "run" / "results.jsonl").is_file()


def test_a_heads_file_given_relative_or_absolute_is_one_identity_and_records_alphas_parts(tmp_path, tiny_dir, capsys,
                                                                                           monkeypatch):
    """The same heads file given as h.safetensors and then by its absolute path was refused ("differs in: heads");
    records keep accepted_tokens and draft_positions, alpha's parts, so tokens per drafting step can be computed."""
    import longswift
    from longswift.spec.heads import save_heads

    engine = longswift.load(str(tiny_dir), heads="random")
    save_heads(engine.heads, engine.cfg, engine.fingerprint, tmp_path / "h.safetensors")
    monkeypatch.chdir(tmp_path)
    out_dir = tmp_path / "bench"
    args = ["bench", "--model", str(tiny_dir), "--threads", "1", "--no-warmup", "--methods", "ar,tokenswift",
            "--prefix", "12", "--lengths", "8", "--out-dir", str(out_dir)]
    assert main([*args, "--heads", "h.safetensors"]) == 0
    capsys.readouterr()
    assert main([*args, "--heads", str(tmp_path / "h.safetensors")]) == 0
    assert "0 runs to do" in capsys.readouterr().err
    record = next(r for r in lines(out_dir / "results.jsonl") if r["method"] == "tokenswift")
    assert record["draft_positions"] > 0 and 0 <= record["accepted_tokens"] <= record["draft_positions"]
    assert record["alpha"] == pytest.approx(record["accepted_tokens"] / record["draft_positions"])


def test_lockstep_ratios_pair_each_run_with_the_run_it_was_timed_with():
    """In lockstep a method's run and ar's run of the same index met the same drift: "vs ar" is the median of
    those paired ratios (it was the ratio of the medians, which pairs nothing), and the CSV's per-run speedup
    divides by its own partner; runs timed apart keep the ratio of medians."""
    from longswift.bench.report import vs

    def run(method, i, rate, together=True):
        return {"method": method, "run": i, "decode_tokens_per_second": rate,
                "lockstep_with": (["ar"] if method != "ar" else ["tokenswift"]) if together else None}

    ar = [run("ar", 0, 10.0), run("ar", 1, 20.0), run("ar", 2, 12.0)]
    ts = [run("tokenswift", 0, 21.0), run("tokenswift", 1, 30.0), run("tokenswift", 2, 30.0)]
    assert vs(ts, ar) == pytest.approx(2.1)  # ratios 2.1, 1.5, 2.5; the medians' ratio is 30/12 = 2.5
    apart = [run("tokenswift", i, r["decode_tokens_per_second"], together=False) for i, r in enumerate(ts)]
    assert vs(apart, ar) == pytest.approx(2.5)
    assert vs(ar, ar) == pytest.approx(1.0) and vs(ts, None) is None


def test_a_rerun_with_warm_ups_into_a_directory_made_without_is_refused(tmp_path, tiny_dir, capsys):
    """--no-warmup changes how a first run is timed (its one-off costs): one way per directory, as --lockstep."""
    base = ["bench", "--model", str(tiny_dir), "--threads", "1", "--methods", "ar", "--prefix", "12", "--lengths", "4",
            "--out-dir", str(tmp_path / "b")]
    assert main([*base, "--no-warmup"]) == 0
    capsys.readouterr()
    assert main(base) == 2
    assert "holds results of a different configuration (differs in: warmup)" in capsys.readouterr().err


def test_a_resumed_report_keeps_the_notes_of_rows_measured_earlier(tmp_path, tiny_dir, capsys):
    """A rerun into the same --out-dir with fewer methods dropped the notes of the rows still shown: hf's
    sampler under the paper preset, and TokenSwift's float32 rounding."""
    base = ["bench", "--model", str(tiny_dir), "--heads", "random", "--threads", "1", "--no-warmup", "--prefix", "12",
            "--lengths", "4", "--presets", "paper", "--out-dir", str(tmp_path / "b")]
    assert main([*base, "--methods", "ar,tokenswift,hf"]) == 0
    first = (tmp_path / "b" / "report.md").read_text()
    assert main([*base, "--methods", "ar"]) == 0
    again = (tmp_path / "b" / "report.md").read_text()
    for line in ("- sampler of hf, paper:", "- tokenswift outputs equal ar's token for token in float64"):
        assert line in first and line in again, line


def test_a_cell_that_does_not_fit_is_refused_before_any_run_without_lockstep(tmp_path, tiny_dir, capsys, monkeypatch):
    """Without --lockstep the grid ran its smaller cells first, and the run that did not fit said to lower
    --max-new-tokens, a flag bench does not have."""
    import longswift.runtime.memory as memory

    monkeypatch.setattr(memory, "available_bytes", lambda device: 1 << 10)  # no run's caches fit
    code = main(["bench", "--model", str(tiny_dir), "--heads", "random", "--threads", "1", "--no-warmup", "--methods",
                 "ar,tokenswift", "--prefix", "12", "--lengths", "8,200", "--presets", "greedy",
                 "--out-dir", str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert code == 2 and "start" not in err, err
    assert "longswift: error: ar needs " in err and "for the 212-token cell" in err
    assert "lower --lengths or --prefix" in err
    assert "--max-new-tokens" not in err
    assert not (tmp_path / "b" / "results.jsonl").exists()


def test_lockstep_plans_the_fused_mode_without_a_partial_draft_cache(tiny_dir, monkeypatch):
    """tokenswift-fused drafts without a draft pass, so without the paper mode's partial cache; the lockstep
    memory check planned it with one, and could refuse grids that fit."""
    import longswift.bench.grid as grid
    import longswift.runtime.memory as memory
    from longswift.bench.prompts import Prompt
    from longswift.engine import load

    engine = load(str(tiny_dir), heads="random", threads=1)
    cell = grid.Cell(Prompt("p", tuple(range(12)), False), 12, "paper", 200)
    cfg = grid.BenchConfig(spec=SpecConfig(draft_kv_budget=48, draft_window=16, attention_sinks=4), lockstep=True)
    planned = []
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1 << 40)
    monkeypatch.setattr(grid, "lockstep_bytes", lambda plans, graphs: planned.extend(plans) or 0)
    grid.check_grid_memory(engine, cfg, cell, ["ar", "tokenswift", "tokenswift-fused"])
    assert [p.draft_tokens for p in planned] == [0, 48, 0]


def test_metrics_cpu_peak_keeps_a_sampled_peak():
    import time
    from longswift.bench.metrics import PeakMemory

    with PeakMemory(torch.device("cpu"), interval=0.005) as peak:
        big = torch.ones(64 * 2**20 // 4)  # 64 MiB, freed before the block ends
        time.sleep(0.1)
        del big
    assert peak.peak_bytes - peak.start_bytes >= 48 * 2**20


def test_metrics_cuda_peak_is_the_allocators_peak(monkeypatch):
    from longswift.bench.metrics import PeakMemory

    for name, value in (("synchronize", None), ("reset_peak_memory_stats", None), ("memory_allocated", 10),
                        ("max_memory_allocated", 99)):
        monkeypatch.setattr(torch.cuda, name, lambda device=None, v=value: v)
    with PeakMemory(torch.device("cuda")) as peak:
        pass
    assert (peak.start_bytes, peak.peak_bytes) == (10, 99)


@pytest.mark.parametrize("native", [False, True])
def test_the_reports_machine_line_names_the_cpus_vector_instructions_and_its_bfloat16(monkeypatch, native):
    """Two CPUs of one model name ("AMD EPYC": AVX512-BF16 in sessions 32-37, AVX2 alone in session 48, where
    bfloat16 ran 5x slower than float32) are told apart in a report by what torch's kernels use."""
    import longswift.runtime.linear as linear
    from longswift.bench.machine import machine_lines

    monkeypatch.setattr(linear, "onednn_computes", lambda dtype: native)
    line = machine_lines({"threads": 1, "model": "m", "dtype": "float32", "device": "cpu", "packed_linears": True,
                          "heads": "none"})[0]
    assert f"({torch.backends.cpu.get_cpu_capability()}" in line
    assert ("no native bfloat16" in line) is (not native), line


# ---- session 49's review of bench -----------------------------------------------------------------------------

def test_an_out_file_that_is_not_utf8_text_is_refused_before_any_run(tmp_path, tiny_dir, capsys):
    """A UTF-16 notes file as --out was a UnicodeDecodeError traceback after the whole grid, and --json was lost."""
    notes = tmp_path / "notes.md"
    notes.write_bytes("old notes\n".encode("utf-16"))
    code = main(["bench", "--model", str(tiny_dir), "--heads", "random", "--threads", "1", "--no-warmup", "--methods",
                 "ar", "--prefix", "12", "--lengths", "4", "--presets", "greedy", "--out", str(notes),
                 "--json", str(tmp_path / "j.json"), "--out-dir", str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().splitlines() == [
        f"longswift: error: --out '{notes}' exists and is not UTF-8 text, and the report is appended to it: choose "
        "another file name"], err
    assert notes.read_bytes() == "old notes\n".encode("utf-16") and not (tmp_path / "b" / "results.jsonl").exists()


@pytest.mark.parametrize("content", ['{"a": 1}\n', "  [1, 2]", '{"a": 1}\n{"b": 2}\n', "\0\0\0"])
def test_an_out_file_holding_json_is_refused_before_any_run(tmp_path, tiny_dir, capsys, content):
    """--out named an earlier --json result (bench-steps too): the markdown report was appended to it, exit 0,
    and the JSON broken. A file of NUL bytes is valid UTF-8 and was taken too."""
    j = tmp_path / "earlier.json"
    j.write_text(content)
    code = main(["bench", "--model", str(tiny_dir), "--heads", "random", "--threads", "1", "--no-warmup", "--methods",
                 "ar", "--prefix", "12", "--lengths", "4", "--presets", "greedy", "--out", str(j),
                 "--out-dir", str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().splitlines() == [
        f"longswift: error: --out '{j}' exists and holds JSON or binary data, and the markdown report is appended "
        "to it: choose another file name"], err
    assert j.read_text() == content and not (tmp_path / "b" / "results.jsonl").exists()
    code = main(["bench-steps", "--shape", "smollm2-135m", "--layers", "1", "--out", str(j)])
    assert code == 2 and j.read_text() == content


def test_a_markdown_out_file_that_begins_with_a_bracket_is_appended_to(tmp_path):
    from longswift.atomic import append_atomic, check_appendable

    notes = tmp_path / "notes.md"
    notes.write_text("[TOC]\n\n# Runs\n")
    check_appendable(notes, "--out")
    append_atomic(notes, "| a |\n")
    assert notes.read_text() == "[TOC]\n\n# Runs\n| a |\n"


def test_two_reports_appended_to_one_file_at_once_are_both_kept(tmp_path, monkeypatch):
    """Each append rewrites the file from what it read: a second bench's append between the first's read and
    its rename was lost (the first wrote the file as it had read it, plus its own report)."""
    import threading

    import longswift.atomic as atomic

    notes = tmp_path / "notes.md"
    notes.write_text("# Runs\n")
    read = atomic._text_to_append_to
    other = threading.Thread(target=atomic.append_atomic, args=(notes, "| second |\n"))

    def read_then_let_the_other_run(path, flag):
        text = read(path, flag)
        if not other.is_alive() and other.ident is None:  # the first append, once: the second starts now
            other.start()
            other.join(timeout=1.0)  # (it finishes within this without a turn; with one it waits for ours)
        return text

    monkeypatch.setattr(atomic, "_text_to_append_to", read_then_let_the_other_run)
    atomic.append_atomic(notes, "| first |\n")
    other.join()
    assert notes.read_text() == "# Runs\n| first |\n| second |\n"


class _BosTokenizer:
    """Characters as ids, with a BOS (id 1) in front unless asked not to add special tokens, as Llama's adds one."""

    def encode(self, text, add_special_tokens=True):
        return [1] * add_special_tokens + [ord(c) for c in text]


class _TextEngine:
    tokenizer = _BosTokenizer()

    def encode(self, text, chat=False):
        return self.tokenizer.encode(text)


def test_a_prose_prompt_repeated_to_its_prefix_has_one_bos(tmp_path):
    """Repeating the whole encoding put the tokenizer's BOS at the start of every repeat."""
    from longswift.bench.prompts import build_prompts, read_bench_prompt_file

    (tmp_path / "p.txt").write_text("abc")
    [(prefix, prompt)] = build_prompts(_TextEngine(), read_bench_prompt_file(tmp_path / "p.txt"), False, (8,), 0)
    assert prefix == 8 and list(prompt.ids) == [1, 97, 98, 99, 97, 98, 99, 97]


def test_a_prompt_file_on_a_model_without_a_tokenizer_says_what_to_do(tmp_path, tiny_dir, capsys):
    """encode's advice, to pass token ids, was no option bench has."""
    (tmp_path / "p.txt").write_text("Some prose to repeat.")
    code = main(["bench", "--model", str(tiny_dir), "--heads", "random", "--threads", "1", "--no-warmup", "--methods",
                 "ar", "--prefix", "12", "--lengths", "4", "--presets", "greedy", "--prompt-file",
                 str(tmp_path / "p.txt"), "--out-dir", str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert code == 2 and "this model has no tokenizer: put its tokenizer files" in err and "token ids" in err
    assert len(err.strip().splitlines()) == 1 and "list of token ids" not in err


@pytest.mark.parametrize("field, value, match", [
    ("runs", 10**20, "--runs 100000000000000000000 is more than a grid runs"),
    ("pld_tokens", 10**20, "--pld-tokens 100000000000000000000 is more than")])
def test_run_and_lookup_counts_past_any_use_are_refused(field, value, match):
    """--runs 10**20 hung building the plan; --pld-tokens 10**20 was an OverflowError traceback in transformers."""
    from longswift.bench.grid import BenchConfig

    with pytest.raises(LongswiftError, match=match):
        BenchConfig(**{field: value})


def test_a_results_directory_keeps_the_processor_its_runs_ran_on(tmp_path, tiny_dir, capsys):
    """The identity named the device ("cuda:0"), not which one: an H100's directory resumed on an H200 mixed the
    two machines' speeds, and a report named the machine that wrote it. A directory made before the identity kept
    the processor resumes and gets it."""
    from conftest import assert_one_line_error, run_cli

    from longswift.bench.machine import machine_lines, processor_name

    out_dir = tmp_path / "bench"
    grid = ("--methods", "ar", "--lengths", "4", "--presets", "greedy")
    bench(capsys, tiny_dir, out_dir, *grid)
    config = json.loads((out_dir / "config.json").read_text())
    assert config["identity"]["processor"] == processor_name(torch.device("cpu"))
    old = {**config, "identity": {k: v for k, v in config["identity"].items() if k != "processor"}}
    (out_dir / "config.json").write_text(json.dumps(old))
    _, err = bench(capsys, tiny_dir, out_dir, *grid)
    assert "0 runs to do" in err and json.loads((out_dir / "config.json").read_text()) == config
    other = {**config, "identity": {**config["identity"], "processor": "NVIDIA H100 80GB HBM3, 79 GiB"}}
    (out_dir / "config.json").write_text(json.dumps(other))
    code, _, err = run_cli(capsys, "bench", "--model", str(tiny_dir), "--heads", "random", "--threads", "1",
                           "--no-warmup", "--prefix", "12", *grid, "--out-dir", str(out_dir))
    assert_one_line_error(code, err, "holds results of a different configuration (differs in: processor)")
    gpu = {"threads": 1, "model": "m", "dtype": "bfloat16", "device": "cuda:0", "packed_linears": False,
           "heads": "default", "processor": "NVIDIA H200, 139 GiB"}
    line = machine_lines(gpu)[0]
    assert line.startswith("- machine: NVIDIA H200, 139 GiB; host ") and "logical CPUs" in line


def test_runs_of_one_prompt_name_tokenized_otherwise_are_another_cell(tmp_path, tiny_dir, capsys):
    """Cells were grouped by the prompt's name and length: runs of one prompt file tokenized otherwise (another
    tokenizer or chat template), all redone under new keys, were merged with the old ones into one cell
    ("runs 2" for --runs 1, medians over two prompts). A record made before the ids' digest was kept joins the
    cell of the one digest its title has."""
    from longswift.bench.report import _cell_section, group

    out_dir = tmp_path / "bench"
    bench(capsys, tiny_dir, out_dir, "--methods", "ar", "--lengths", "4", "--presets", "greedy", "--runs", "1")
    (record,) = [json.loads(line) for line in (out_dir / "results.jsonl").read_text().splitlines()]
    assert len(record["prompt_digest"]) == 12
    other = {**record, "prompt_digest": "bbbbbbbbbbbb", "key": "other"}
    cells = group([record, other])
    assert len(cells) == 2 and all(len(rows[("ar", "")]) == 1 for rows in cells.values())
    cid, rows = next(iter(cells.items()))
    title = _cell_section(cid, rows, digest=True)[1]
    assert title.startswith(f"### {record['prompt']} (prompt ids {record['prompt_digest'][:8]}): "), title
    older = {k: v for k, v in record.items() if k != "prompt_digest"}  # a directory made before, resumed
    joined = group([older, {**record, "run": 1, "key": "new"}])
    assert len(joined) == 1 and len(next(iter(joined.values()))[("ar", "")]) == 2


@pytest.mark.parametrize("damage, said", [
    (b"\xff\xfe\n", ":2 is not UTF-8 text"),
    (b"42\n", ":2 is not a bench run's record"),
    (b'{"key": "k", "prompt": "p"}\n', ":2 is not a bench run's record (a JSON object with decode_tokens_per_second"),
    (json.dumps({k: v for k, v in run_record("b").items() if k != "sampling"}).encode() + b"\n",
     ":2 is a damaged bench record (it has no 'sampling'): fix or remove the line, or use --fresh"),
    (json.dumps(run_record("b", run="x")).encode() + b"\n", ":2 is a damaged bench record (its 'run' is 'x', not a "
                                                              "whole number)"),
    (json.dumps(run_record("b", decode_tokens_per_second="fast")).encode() + b"\n",
     ":2 is a damaged bench record (its 'decode_tokens_per_second' is 'fast', not a number)"),
    (json.dumps(run_record("b", token_ids=None)).encode() + b"\n", ":2 is a damaged bench record (its 'token_ids' "
                                                                     "is None, not a list)"),
    (json.dumps(run_record("b", checkpoints=[[1]])).encode() + b"\n",
     ":2 is a damaged bench record (its 'checkpoints' are not all [tokens, seconds] pairs)"),
    # a review: a file merged by hand with a run twice was read as two runs (a row of 3 runs, the median moved)
    (json.dumps(run_record("a")).encode() + b"\n", ":2 repeats the run of an earlier line (key a): remove one"),
])
def test_a_damaged_results_file_is_a_one_line_error(tmp_path, damage, said):
    """A byte that is not UTF-8 was a UnicodeDecodeError; a line of JSON that is not a run (42) a TypeError; a
    record without its fields ran the whole grid, then failed in the report with a KeyError; one without a field
    only the report reads (sampling), or of another type, the same (session 59's review)."""
    from longswift.bench.store import ResultStore

    ResultStore(tmp_path, {"model": "m"}).close()
    good = run_record("a")
    (tmp_path / "results.jsonl").write_bytes(json.dumps(good).encode() + b"\n" + damage)
    with pytest.raises(LongswiftError, match=re.escape(f"results.jsonl{said}")):
        ResultStore(tmp_path, {"model": "m"})
    assert not (tmp_path / "results.jsonl.longswift-lock").exists()
    (tmp_path / "results.jsonl").write_bytes(json.dumps(good).encode() + b"\n")
    store = ResultStore(tmp_path, {"model": "m"})
    assert len(store.records) == 1
    store.close()


def test_an_out_dir_under_home_is_expanded(tmp_path, tiny_dir, capsys, monkeypatch):
    """--out-dir '~/runs' (quoted, so the shell leaves it) made a folder named '~' in the working directory, then
    failed writing the expanded path: 'directory .../home/runs does not exist'."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(tmp_path)
    bench(capsys, tiny_dir, "~/runs", "--methods", "ar", "--lengths", "4", "--presets", "greedy", "--runs", "1")
    assert (tmp_path / "home" / "runs" / "report.md").is_file() and not (tmp_path / "~").exists()


def test_a_full_disk_keeps_the_finished_runs_and_releases_the_directory(tmp_path):
    """A write of results.jsonl that failed (a full disk) was written again when the file closed, which failed
    again before the lock was released: the lock file stayed, and the error named no file."""
    import errno

    from longswift.bench.store import ResultStore

    store = ResultStore(tmp_path, {"model": "m"})
    first = run_record("a")
    store.append(first)
    kept = (tmp_path / "results.jsonl").read_bytes()

    class Full:  # writes a few bytes, then the disk is full
        def __init__(self, f):
            self.f, self.calls = f, 0

        def write(self, data):
            self.calls += 1
            if self.calls > 1:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.f.write(bytes(data[:10]))

        def __getattr__(self, name):
            return getattr(self.f, name)

    store._file = Full(store._file)
    with pytest.raises(LongswiftError, match=f"cannot write '{tmp_path / 'results.jsonl'}': No space left on device; "
                                             "the runs finished before are kept"):
        store.append({**first, "key": "b"})
    store.close()
    assert (tmp_path / "results.jsonl").read_bytes() == kept
    assert not (tmp_path / "results.jsonl.longswift-lock").exists()
    again = ResultStore(tmp_path, {"model": "m"})
    assert [r["key"] for r in again.records] == ["a"]
    again.close()


def test_the_report_says_decode_time_includes_graph_captures():
    """Decode tok/s includes capturing CUDA graphs (on session 51's H200, 0.12 s of a greedy TokenSwift run's
    0.76 s), which the report did not say. Re-rendered from that run's records."""
    from pathlib import Path

    from longswift.bench.report import RunContext, render

    folder = Path(__file__).parents[1] / "docs" / "bench" / "gpu" / "session51-h200" / "embedded"
    records = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
    config = json.loads((folder / "config.json").read_text())
    ctx = RunContext(identity=config["identity"], command="longswift bench", skipped={}, notes={}, spec=None,
                     methods=("ar", "tokenswift", "tokenswift-fused"), versions={"torch": "x"})
    captured = [r for r in records if r["graph_capture_seconds"]]
    share = sum(r["graph_capture_seconds"] for r in captured) / sum(r["decode_seconds"] for r in captured)
    assert f"- decode time includes capturing CUDA graphs: {100 * share:.1f}% of the decode time" in \
        render(records, ctx, [])


def _record(method: str, run: int, ids: list[int], checkpoints: list[tuple[int, float]], prefill: float) -> dict:
    return {"prompt": "p", "prompt_tokens": 4, "preset": "greedy", "length": 16, "prompt_digest": "d",
            "method": method, "variant": "", "run": run, "token_ids": ids, "checkpoints": checkpoints,
            "prefill_seconds": prefill, "decode_tokens_per_second": 15 / (checkpoints[-1][1] - prefill),
            "alpha": None, "ngram_alpha": None, "tokens_per_step": None, "peak_memory_bytes": 2**30,
            "memory_at_start_bytes": 2**29, "lockstep_with": None, "finished_at": run, "invocation": "one",
            **{f"distinct_{n}": 1.0 for n in (1, 2, 3, 4)}}


def test_the_report_compares_every_run_and_times_each_method_to_each_count():
    """A review: the table along the generation drew a line between a drafting method's checkpoints, putting it
    at a count earlier than its steps reached it (1.15x where its recorded times gave 1.03x); and the outputs
    line compared the first run alone, up to the shorter record's end."""
    from longswift.bench.report import _cell_section, group

    ids = list(range(16))
    ar = [(n, 1.0 + 0.1 * (n - 1)) for n in checkpoint_targets(16)]  # one token a step: 0.1 s a token
    # a drafting method: 1 token at 1.0 s, then one step to 11 tokens at 1.5 s, one to 16 at 1.8 s
    drafted = [(11, 1.5), (12, 1.8), (14, 1.8), (16, 1.8)]
    records = [_record("ar", 0, ids, ar, 1.0), _record("tokenswift", 0, ids, drafted, 1.0),
               _record("ar", 1, ids, ar, 1.0), _record("tokenswift", 1, ids, drafted, 1.0)]
    (cid, rows), = group(records).items()
    text = "\n".join(_cell_section(cid, rows))
    assert "tokenswift identical in all 2 runs" in text
    along = text.split("Speedup vs ar along the generation")[1].splitlines()
    assert along[2] == "| method | 2 | 4 | 6 | 8 | 10 | 12 | 14 | 16 |"
    # at 10 tokens ar took 0.9 s and tokenswift 0.5 s (its step to 11): 1.80x, where the line from (1, 0 s) to
    # (11, 0.5 s) put it at 0.45 s, 2.00x; at 12 tokens 1.1 s against 0.8 s (its step to 12)
    assert along[4] == "| tokenswift | 0.20x | 0.60x | 1.00x | 1.40x | 1.80x | 1.38x | 1.62x | 1.88x |"
    def section() -> str:
        return "\n".join(_cell_section(*next(iter(group(records).items()))))

    records[3] = _record("tokenswift", 1, ids[:9] + [99] + ids[10:], drafted, 1.0)
    assert "tokenswift run 2 first differs at new token 9" in section()
    records[3] = _record("tokenswift", 1, ids[:12], drafted, 1.0)
    assert "tokenswift run 2 holds 12 tokens where ar's holds 16 (the same up to there)" in section()


def test_the_report_times_no_method_to_its_first_token():
    """At lengths under 12 the table along the generation had a column for 1 token, the prefill's: AR hands it
    over after one more forward, a drafting method with its first step, and the column compared those."""
    from longswift.bench.report import _cell_section, group

    ids = list(range(8))
    ar = [(n, 1.0 + 0.1 * n) for n in checkpoint_targets(8)]  # the first token after one forward
    drafted = [(1, 1.0), (5, 1.2), (8, 1.4)]
    records = [{**_record("ar", 0, ids, ar, 1.0), "length": 8}, {**_record("tokenswift", 0, ids, drafted, 1.0),
                                                                 "length": 8}]
    along = "\n".join(_cell_section(*next(iter(group(records).items())))).split("along the generation")[1]
    assert along.splitlines()[2] == "| method | 2 | 3 | 4 | 5 | 6 | 7 | 8 |"
    assert along.splitlines()[4] == "| tokenswift | 1.00x | 1.50x | 2.00x | 2.50x | 1.50x | 1.75x | 2.00x |"


def test_a_report_of_uncommitted_code_says_so(tmp_path):
    """The report named the commit alone while the package's files held uncommitted changes (a review found a
    published report's commit line wrong that way)."""
    import subprocess

    from longswift.bench.machine import _git_commit

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    package = tmp_path / "pkg"
    package.mkdir()
    (package / "a.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "one")
    commit = _git_commit(package)
    assert commit and not commit.endswith("-dirty")
    (tmp_path / "notes.txt").write_text("outside the package")
    assert _git_commit(package) == commit
    (package / "b.py").write_text("y = 2\n")
    assert _git_commit(package) == f"{commit}-dirty"
    (package / "b.py").unlink()
    (package / "a.py").write_text("x = 2\n")
    assert _git_commit(package) == f"{commit}-dirty"
    assert _git_commit(tmp_path.parent / "nowhere") is None


def test_a_run_that_drafted_nothing_has_no_alpha_and_the_median_leaves_it_out():
    """A review: a TokenSwift run whose steps were all plain (a short sampled run) drafted nothing, and its
    acceptance rate is undefined (null in generate's --json, "nothing drafted" in its summary line); its record said
    0.0, which the report's median counted as a rate of 0 (0.50 for runs of 0.5 and 0.7 beside it)."""
    from types import SimpleNamespace

    from longswift.bench.grid import Cell, make_record
    from longswift.bench.metrics import Timeline
    from longswift.bench.prompts import Prompt
    from longswift.bench.report import _cell_section, group
    from longswift.config import SamplingConfig
    from longswift.stats import GenerationStats

    timeline = Timeline(4, start=0.0)
    for n in range(1, 5):
        timeline.record(n, when=float(n))
    plain = GenerationStats("tokenswift", 3, new_tokens=4, steps=4, plain_steps=3)
    cell = Cell(Prompt("p", (1, 2, 3), False), 3, "paper", 4)
    record = make_record("k", cell, "tokenswift", "", 0, [5, 6, 7, 8], timeline, plain,
                         SimpleNamespace(peak_bytes=2**30, start_bytes=2**29), SamplingConfig())
    assert record["alpha"] is None and record["ngram_alpha"] is None and record["tokens_per_step"] == 1.0

    ids = list(range(16))
    checkpoints = [(n, 1.0 + 0.1 * (n - 1)) for n in checkpoint_targets(16)]
    drafted = [{**_record("tokenswift", k, ids, checkpoints, 1.0), "alpha": a, "ngram_alpha": a / 2,
                "tokens_per_step": 1.5, "draft_positions": 8, "accepted_tokens": int(8 * a)}
               for k, a in ((1, 0.5), (2, 0.7))]
    undrafted = {**_record("tokenswift", 0, ids, checkpoints, 1.0), "alpha": 0.0, "ngram_alpha": 0.0,
                 "tokens_per_step": 1.0, "draft_positions": 0, "accepted_tokens": 0}  # as recorded before
    for first in (undrafted, {**undrafted, "alpha": None, "ngram_alpha": None}):
        records = [_record("ar", 0, ids, checkpoints, 1.0), first, *drafted]
        row = next(line for line in _cell_section(*next(iter(group(records).items()))) if line.startswith("| tokenswift"))
        assert "| 0.60 | 0.30 | 1.50 |" in row  # alpha, n-gram alpha: the medians of the two runs that drafted
    alone = [_record("ar", 0, ids, checkpoints, 1.0), {**undrafted, "alpha": None, "ngram_alpha": None}]
    row = next(line for line in _cell_section(*next(iter(group(alone).items()))) if line.startswith("| tokenswift"))
    assert "| - | - | 1.00 |" in row
