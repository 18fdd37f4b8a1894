"""Issue #18, what a new user meets first: outputs that cannot be lost (distinct paths, unique
temp files, a lock against a second writer), one-line errors from every entry point and before
the model loads, the chat template by default, a typed Python API, and checkpoints that write
where the user asked from any directory."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, replace

import pytest
import torch
from conftest import assert_one_line_error, run_cli, tiny_hf_model

import longswift
from longswift import GenerationConfig, LongswiftError, RuntimeConfig, SamplingConfig, SpecConfig
from longswift.atomic import AtomicFile, OutputLock
from longswift.checkpoint import Checkpoint, heads_fingerprint, read_checkpoint

# ---- 2. distinct outputs ------------------------------------------------------------------------

@pytest.mark.parametrize("flags", [("--output", "--json"), ("--output", "--checkpoint"), ("--json", "--checkpoint")])
def test_outputs_on_the_same_file_are_refused_before_loading(tmp_path, capsys, no_loading, flags, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "generate", "--prompt", "hi", flags[0], "same.txt", flags[1], "./same.txt")
    assert_one_line_error(code, err, f"{flags[0]} and {flags[1]} are the same file")
    assert not list(tmp_path.iterdir())


def test_an_output_through_a_symlink_or_over_the_prompt_is_refused(tmp_path, capsys, no_loading):
    (tmp_path / "real.txt").write_text("")
    (tmp_path / "link.txt").symlink_to(tmp_path / "real.txt")
    code, _, err = run_cli(capsys, "generate", "--prompt", "hi", "--output", str(tmp_path / "real.txt"),
                           "--json", str(tmp_path / "link.txt"))
    assert_one_line_error(code, err, "--output and --json are the same file")
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Write a story.")
    code, _, err = run_cli(capsys, "generate", "--prompt-file", str(prompt), "--output", str(prompt))
    assert_one_line_error(code, err, "--output and --prompt-file are the same file")
    assert prompt.read_text() == "Write a story."


# ---- 3. unique temp files, one writer per file ----------------------------------------------------

def test_atomic_files_of_two_writers_never_share_a_temp_file(tmp_path):
    path = tmp_path / "out.txt"
    a, b = AtomicFile(path), AtomicFile(path)
    assert a.tmp != b.tmp and a.tmp.parent == b.tmp.parent == tmp_path
    a.write("first run")
    b.write("second run")
    a.commit()
    assert path.read_text() == "first run"
    b.discard()
    assert path.read_text() == "first run" and sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]
    umask = os.umask(0o022)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # the mode open() would have given, not mkstemp's 0600


def test_output_lock_refuses_a_second_holder_and_is_released(tmp_path):
    out = tmp_path / "out.txt"
    with OutputLock([("--output", out)]):
        with pytest.raises(LongswiftError, match=rf"'{out}' is being written by another longswift run \(pid "
                                                 rf"{os.getpid()}\): wait for it to finish, or give another --output"):
            OutputLock([("--output", out)]).__enter__()
    assert not (tmp_path / "out.txt.longswift-lock").exists()
    with OutputLock([("--output", out)]):  # free again
        pass


def test_a_lock_whose_pid_cannot_be_written_is_still_released(tmp_path, monkeypatch):
    """Held from the flock on: a full disk while writing the pid into it releases and removes it."""
    real = os.write
    pid = str(os.getpid()).encode()

    def full(fd, data):
        if data == pid:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)

    out, other = tmp_path / "out.txt", tmp_path / "other.txt"
    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError, match="No space left"):
        OutputLock([("--json", other), ("--output", out)]).__enter__()
    monkeypatch.setattr(os, "write", real)
    assert list(tmp_path.iterdir()) == []  # both lock files released and removed
    with OutputLock([("--output", out)]):  # and free
        pass


def test_the_lock_holder_removes_temp_files_that_killed_runs_left(tmp_path):
    """A run killed by SIGKILL leaves `out.txt.<random>.partial`; the next run on out.txt removes it,
    and nothing that is not such a temp file of a locked path."""
    out = tmp_path / "out.txt"
    stale = [tmp_path / "out.txt.k3_9abcd.partial", tmp_path / "out.txt.0000zzzz.partial"]
    kept = [tmp_path / "out.txt.notes.partial", tmp_path / "other.txt.k3_9abcd.partial", tmp_path / "out.txt.partial",
            tmp_path / "out.txt"]
    for f in stale + kept:
        f.write_text("x")
    seen = []
    with OutputLock([("--output", out)], seen.append):
        assert seen == sorted(stale)
    assert sorted(tmp_path.iterdir()) == sorted(kept)


@pytest.mark.parametrize("flag", ["--output", "--json"])
def test_the_checkpoint_an_interrupt_saves_beside_the_outputs_is_locked_too(tmp_path, capsys, flag):
    """A run with --output (or --json) and no --checkpoint saves an interrupt's state to <output>.checkpoint.json,
    which it did not lock: another run given that file as its --checkpoint had its state replaced. Refused before
    loading, and told to give a --checkpoint of its own."""
    tiny_hf_model("llama", seed=3, vocab=40).save_pretrained(tmp_path / "m")
    capsys.readouterr()  # (transformers' progress bar as it saves)
    out = tmp_path / "out.txt"
    held = tmp_path / "out.txt.checkpoint.json"
    with OutputLock([("--checkpoint", held)]):
        code, _, err = run_cli(capsys, "generate", "--model", str(tmp_path / "m"), "--prompt-ids", "1,2",
                               "--heads", "none", "--max-new-tokens", "4", flag, str(out))
    assert_one_line_error(code, err, f"'{held}' is being written by another longswift run (pid {os.getpid()}): "
                                     "wait for it to finish, or give another --checkpoint")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
    code, _, err = run_cli(capsys, "generate", "--model", str(tmp_path / "m"), "--prompt-ids", "1,2", "--heads",
                           "none", "--max-new-tokens", "4", "--ignore-eos", flag, str(out))
    assert code == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["m", "out.txt"], err  # (its lock removed)


@pytest.mark.slow
def test_a_second_run_on_the_same_output_is_refused_and_the_first_is_intact(tmp_path, capsys):
    first = subprocess.Popen([sys.executable, "-m", "longswift", "generate", "--prompt", "Tell a story.", "--raw",
                              "--heads", "none", "--seed", "1", "--max-new-tokens", "24", "--ignore-eos",
                              "--output", "out.txt", "--json", "first.json"],
                             cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not (tmp_path / "out.txt.longswift-lock").exists() and first.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert first.poll() is None, first.communicate()
    code, _, err = run_cli(capsys, "generate", "--prompt", "Another.", "--output", str(tmp_path / "out.txt"),
                           "--json", str(tmp_path / "second.json"))
    assert_one_line_error(code, err, "out.txt' is being written by another longswift run (pid ")
    _, first_err = first.communicate(timeout=600)
    assert first.returncode == 0, first_err
    result = json.loads((tmp_path / "first.json").read_text())
    assert len(result["token_ids"]) == 24
    assert (tmp_path / "out.txt").read_text() == result["text"]
    assert not (tmp_path / "second.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first.json", "out.txt"]  # no temp or lock files left


# ---- 4. one-line errors everywhere ---------------------------------------------------------------

@pytest.mark.parametrize("argv,match", [
    (["generate", "--prompt", "hi", "--max-new-tokens", "1e9"], "argument --max-new-tokens: expected a whole number, got '1e9'"),
    (["generate", "--prompt", "hi", "--max-new-tokens", "abc"], "argument --max-new-tokens: expected a whole number"),
    (["bench", "--runs", "abc"], "argument --runs: expected a whole number, got 'abc'"),  # as generate says it
    (["bench-steps", "--layers", "2.5"], "argument --layers: expected a whole number, got '2.5'"),
    (["eval-heads", "--heads", "x", "--seq-len", "1e3"], "argument --seq-len: expected a whole number, got '1e3'"),
    (["generate", "--prompt", "hi", "--temperature", "warm"], "argument --temperature: expected a number, got 'warm'"),
    (["generate", "--prompt", "hi", "--no-such-flag"],
     "unrecognized arguments: --no-such-flag (see `longswift generate --help`)"),
    # flags of the decoding loop only where a command decodes: elsewhere they would be accepted and do nothing
    (["info", "--read-every", "2"], "unrecognized arguments: --read-every 2 (see `longswift info --help`)"),
    (["export-heads", "--out", "x.safetensors", "--cuda-graphs", "on"], "unrecognized arguments: --cuda-graphs on"),
    (["train-heads", "--out", "d", "--read-every", "4"], "unrecognized arguments: --read-every 4"),
    (["generate", "--prompt", "hi", "--method", "beam"], "argument --method: invalid choice: 'beam'"),
    (["generate", "--prompt", "a", "--prompt-ids", "1"], "not allowed with argument"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    ([], "the following arguments are required: COMMAND"),
])
def test_argparse_errors_are_one_line(capsys, argv, match):
    code, out, err = run_cli(capsys, *argv)
    assert_one_line_error(code, err, match)
    assert out == ""


def test_argparse_error_from_the_console_script():
    proc = subprocess.run([sys.executable, "-m", "longswift", "generate", "--max-new-tokens", "1e9"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("longswift: error: argument --max-new-tokens")


def test_version(capsys):
    code, out, err = run_cli(capsys, "--version")
    assert code == 0 and out.strip() == f"longswift {longswift.__version__}" and err == ""


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_anywhere_shows_the_traceback(capsys, where):
    argv = ["generate", "--prompt", "hi", "--top-k", "-1"]
    argv = ["--debug", *argv] if where == "before" else [*argv, "--debug"]
    with pytest.raises(LongswiftError, match="top_k must be >= 0"):
        run_cli(capsys, *argv)


def test_token_ids_past_the_context_are_refused_before_loading(capsys, no_loading):
    """--prompt-ids are counted before the weights are read (text needs the tokenizer, which comes with them): a
    prompt of 100 ids and 8,100 new tokens overflows the embedded model's 8,192 before the load, not after it."""
    ids = ",".join(["42"] * 100)
    code, out, err = run_cli(capsys, "generate", "--prompt-ids", ids, "--max-new-tokens", "8100", "--method", "ar")
    assert_one_line_error(code, err, "prompt (100 tokens) + --max-new-tokens 8100 = 8200 exceeds this model's "
                                     "context of 8192 tokens")
    assert out == ""


def test_memory_refusal_for_a_huge_tree_names_the_flags_before_loading(capsys, no_loading):
    code, out, err = run_cli(capsys, "generate", "--prompt", "hi", "--heads", "random", "--tree", "64,64,64,64")
    assert_one_line_error(code, err, "not enough memory")
    assert "--tree, --ngram-topk or --lookup-nodes, or a smaller --max-nodes" in err and "%|" not in err and out == ""


@pytest.mark.parametrize("command", ["generate", "info"])
@pytest.mark.parametrize("heads, tree, depths", [("auto", "1,1,1,1,1", 4), ("random", "1,3,3,3,3,3", 4)])
def test_a_tree_deeper_than_the_heads_draft_is_refused_before_loading(capsys, no_loading, command, heads, tree,
                                                                      depths):
    """generate refused --tree 1,1,1,1,1 for the shipped heads (3: 4 depths) only once the model had loaded, and
    info planned it as if it could run (found by review). The heads' count is read from their file's header."""
    argv = ["--prompt", "hi"] if command == "generate" else []
    code, out, err = run_cli(capsys, command, *argv, "--heads", heads, "--tree", tree)
    assert_one_line_error(code, err, f"--tree {tree} has {len(tree.split(','))} depths but the heads draft only "
                                     f"{depths}: give at most that many")


def test_info_plans_the_default_tree_cut_to_heads_of_fewer_depths(tmp_path, capsys):
    """info resolved the default tree before cutting it to the heads' depths, and refused one head (2 depths)
    with a --tree never given, where generate runs them (found by review)."""
    from longswift.spec.heads import new_heads, save_heads

    tiny_hf_model("llama", seed=3, vocab=40).save_pretrained(tmp_path / "m")
    engine = longswift.load(str(tmp_path / "m"), dtype="float32", heads=None)
    save_heads(new_heads(engine.cfg, engine.model.state, gamma=1), engine.cfg, engine.fingerprint, tmp_path / "h1")
    capsys.readouterr()
    code, out, err = run_cli(capsys, "info", "--model", str(tmp_path / "m"), "--heads", str(tmp_path / "h1"))
    assert code == 0 and "with TokenSwift (tree 1,1 + " in out, err


@pytest.mark.parametrize("flags,match", [
    (["--lookup-nodes", "1000000"], "--lookup-nodes must be 2 (the root and one copied token) to 4096; got 1000000"),
    (["--ngram-topk", "100000000000"], "--ngram-topk must be 0 to 1024; got 100000000000"),
    (["--ngram-topk", "-1"], "--ngram-topk must be 0 to 1024; got -1"),
])
def test_trie_sizes_past_any_use_are_refused_by_their_flag(capsys, no_loading, flags, match):
    """They were refused by the memory plan, at 7,454 GiB (or 39 digits), with advice that did not name them."""
    code, _, err = run_cli(capsys, "generate", "--prompt", "hi", "--heads", "random", *flags)
    assert_one_line_error(code, err, match)


def fake_checkpoint(**changes) -> Checkpoint:
    fields = dict(model_source="<embedded>", model_fingerprint="0" * 32, runtime=asdict(RuntimeConfig()),
                  heads_source=None, heads_fingerprint=None, method="ar", sampling=asdict(SamplingConfig()),
                  generation=asdict(GenerationConfig(max_new_tokens=8)), spec=asdict(SpecConfig()),
                  prompt_ids=[1, 2, 3], token_ids=[4, 5], rng_state=None, stats={})
    return Checkpoint(**{**fields, **changes})


def rehash(path, edit) -> None:
    """Edit a checkpoint's body and recompute its SHA-256, as a determined hand-editor would."""
    outer = json.loads(path.read_text())
    edit(outer["checkpoint"])
    canonical = json.dumps(outer["checkpoint"], sort_keys=True, separators=(",", ":"))
    outer["sha256"] = hashlib.sha256(canonical.encode()).hexdigest()
    path.write_text(json.dumps(outer))


@pytest.mark.parametrize("edit,match", [
    (lambda b: b["token_ids"].__setitem__(0, "abc"), "token_ids must be a list of token ids"),
    (lambda b: b["prompt_ids"].__setitem__(1, 2.5), "prompt_ids must be a list of token ids"),
    (lambda b: b.__setitem__("sampling", [1]), "sampling must be an object"),
    (lambda b: b.__setitem__("method", 7), "method must be a string"),
    (lambda b: b["generation"].__setitem__("max_new_tokens", "9"), "holds damaged settings"),
    (lambda b: b["sampling"].pop("repetition_penalty"), "is not valid: sampling lacks repetition_penalty;"),
])
def test_hand_edited_checkpoint_with_wrong_types_is_refused_in_one_line(tmp_path, capsys, no_loading, edit, match):
    path = tmp_path / "c.json"
    fake_checkpoint().save(path)
    rehash(path, edit)
    code, _, err = run_cli(capsys, "generate", "--resume", str(path))
    assert_one_line_error(code, err, match)


# ---- 5. every argument is checked before the model loads ------------------------------------------

@pytest.mark.parametrize("args,match", [
    (["--top-p", "0"], "--top-p must be in (0, 1]"),
    (["--seed", "-1", "--min-p", "1"], "--min-p must be in [0, 1)"),
    (["--tree", "1,0"], "--tree must be"),
    (["--draft-mode", "eager"], "--draft-mode must be paper or fused"),
    (["--draft-kv-budget", "10"], "--draft-kv-budget (10) must exceed"),
    (["--heads", "/nonexistent/heads.safetensors"], "does not exist"),
    (["--heads", "none", "--method", "tokenswift"], "needs draft heads"),
    (["--prompt-ids", "1,x"], "--prompt-ids must be token ids"),
    (["--prompt-ids", "1,99999999"], "--prompt-ids must be in [0, 49152)"),
    (["--prompt-ids", "1,2", "--chat"], "--chat wraps prompt text"),
    (["--output", "/nonexistent-dir/x.txt"], "does not exist"),
])
def test_arguments_are_checked_before_the_model_loads(capsys, no_loading, args, match):
    argv = ["generate", *args] if any(a.startswith("--prompt") for a in args) else ["generate", "--prompt", "hi", *args]
    code, _, err = run_cli(capsys, *argv)
    assert_one_line_error(code, err, match)


# ---- 6. the chat template by default --------------------------------------------------------------

@pytest.mark.slow
def test_chat_template_is_the_default_and_raw_sends_the_text_as_is(embedded, tmp_path, capsys):
    prompt = "Write a long story."
    assert embedded.encode(prompt, chat=None) == embedded.encode(prompt, chat=True) != embedded.encode(prompt)
    js = tmp_path / "o.json"
    code, _, err = run_cli(capsys, "generate", "--prompt", prompt, "--greedy", "--max-new-tokens", "8",
                           "--no-progress", "--json", str(js))
    assert code == 0, err
    result = json.loads(js.read_text())
    assert result["stats"]["prompt_tokens"] == len(embedded.encode(prompt, chat=True))
    assert len(result["token_ids"]) == 8 and result["text"].strip()  # not an immediate end of text
    raw = embedded.generate(prompt, chat=False, sampling=SamplingConfig(temperature=0.0),
                            generation=GenerationConfig(max_new_tokens=8))
    assert raw.stats.prompt_tokens == len(embedded.encode(prompt))  # the API sends text as given by default


# ---- 7. a typed Python API ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny():
    return longswift.load(tiny_hf_model("llama", seed=3, dtype=torch.float64, vocab=40), dtype="float64", heads=None)


@pytest.mark.parametrize("call,match", [
    (lambda e: e.generate(42), "prompt must be text (str) or a list of token ids (ints); got int"),
    (lambda e: e.generate([1.7, 2]), "prompt token ids must be whole numbers; got 1.7 (float) at position 0"),
    (lambda e: e.generate([1, True]), "prompt token ids must be whole numbers; got True (bool) at position 1"),
    (lambda e: e.generate([1, 2], sampling={"seed": 1}), "sampling must be a longswift.SamplingConfig; got dict"),
    (lambda e: e.generate([1, 2], chat="yes"), "chat must be True, False or None"),
    (lambda e: e.generate([1, 2], colour=1), "unexpected keyword argument 'colour': generate and stream take "
                                            "sampling=, generation=, chat=, method=, spec=, system= and the fields of "
                                            "SamplingConfig, GenerationConfig and SpecConfig"),
    (lambda e: e.stream([1, 2], max_new_tokens=2.5), "GenerationConfig.max_new_tokens must be a whole number"),
    (lambda e: e.generate([1, 2], threads=1), "threads is a RuntimeConfig setting of the loaded model: give it to "
                                             "longswift.load()"),
    (lambda e: e.generate(["Hi", "Hello"]), "prompt is a list of several prompts: a call takes one prompt"),
    (lambda e: e.generate([[1, 2], [3]]), "prompt is a list of several prompts: a call takes one prompt"),
    (lambda e: e.generate(torch.tensor([[1, 2], [3, 4]])), "prompt token ids must be one row (a 1-D tensor or array"),
    (lambda e: e.generate([{"role": "user", "content": "Hi"}]), "prompt is a list of chat messages: a call takes "
                                                               "one prompt, as text or a list of token ids (a chat"),
    (lambda e: longswift.load(colour=1), "unexpected keyword argument 'colour': load takes model, runtime=, heads=, "
                                         "tensor_parallel=, tokenizer= and the fields of RuntimeConfig (device, dtype"),
    (lambda e: longswift.load(max_new_tokens=5), "max_new_tokens is a generation setting: give it to generate"),
    (lambda e: e.resume(42), "resume() takes a Checkpoint or the path of a checkpoint file; got int"),
    (lambda e: GenerationConfig(max_new_tokens=2.5), "GenerationConfig.max_new_tokens must be a whole number; got 2.5"),
    (lambda e: SamplingConfig(seed="abc"), "SamplingConfig.seed must be a whole number or None; got 'abc' (str)"),
    (lambda e: longswift.SpecConfig(tree=[1, 3]), "SpecConfig.tree must be a string; got [1, 3] (list)"),
    (lambda e: SamplingConfig(banned_ids=5), "SamplingConfig.banned_ids must be a tuple or list of token ids; got 5"),
    (lambda e: e.set_heads(42), "heads must be a DraftHeads, a path or hub id, 'auto', 'default', 'random', 'none' "
                                "or None; got int"),
    (lambda e: longswift.load(heads=True), "heads must be a DraftHeads"),  # refused before the weights load
])
def test_wrong_types_say_what_was_expected(tiny, call, match):
    with pytest.raises(TypeError) as info:
        call(tiny)
    assert isinstance(info.value, LongswiftError) and match in str(info.value)


def test_token_ids_come_as_a_list_a_tensor_or_an_array(tiny):
    import numpy as np

    want = tiny.generate([1, 5, 9], max_new_tokens=4, seed=1).token_ids
    assert tiny.generate(torch.tensor([1, 5, 9]), max_new_tokens=4, seed=1).token_ids == want
    assert tiny.generate(np.array([1, 5, 9], dtype=np.int64), max_new_tokens=4, seed=1).token_ids == want


def test_settings_that_would_be_ignored_are_refused(tiny):
    """chat=True with token ids (the template wraps text only), and TokenSwift's drafting settings in a run
    that is AR: each would otherwise change nothing without a word."""
    with pytest.raises(LongswiftError, match="chat=True wraps prompt text in the chat template, and token ids are "
                                             "sent as they are: pass the text, or drop chat=True"):
        tiny.generate([1, 2], chat=True)
    with pytest.raises(LongswiftError, match="tree sets how TokenSwift drafts and this engine has no draft heads, so "
                                             "it runs AR: drop it"):
        tiny.generate([1, 2], tree="1,2", max_new_tokens=2)
    drafting = longswift.load(tiny_hf_model("llama", seed=3, dtype=torch.float64, vocab=40), dtype="float64",
                              heads="random")
    with pytest.raises(LongswiftError, match="draft_kv_budget, tree set how TokenSwift drafts and method='ar': drop them"):
        drafting.generate([1, 2], method="ar", tree="1,2", draft_kv_budget=4096)
    # (unseeded sampling by default: an EOS drawn early would end a run short, so EOS is ignored)
    assert len(drafting.generate([1, 2], tree="1,2", max_new_tokens=3, ignore_eos=True).token_ids) == 3  # TokenSwift
    assert len(drafting.generate([1, 2], method="ar", max_new_tokens=3, ignore_eos=True).token_ids) == 3  # takes them
    # TokenSwift's own settings that another of its settings leaves unused: the draft pass's cache in fused mode
    with pytest.raises(LongswiftError, match="^attention_sinks, draft_kv_budget set nothing here: draft_mode='fused' "
                                             "has no draft pass, whose cache they set; drop them$"):
        drafting.generate([1, 2], draft_mode="fused", tree="1,1", draft_kv_budget=2048, attention_sinks=4)
    with pytest.raises(LongswiftError, match="^lookup_nodes sets nothing here: ngram_topk=0 turns off"):
        drafting.generate([1, 2], ngram_topk=0, lookup_nodes=12)
    fused = SpecConfig(draft_mode="fused", tree="1,1", draft_kv_budget=2048, attention_sinks=4)  # (an object: bench's)
    assert len(drafting.generate([1, 2], spec=fused, max_new_tokens=3, ignore_eos=True).token_ids) == 3


def test_api_messages_name_fields_and_cli_messages_name_flags(capsys):
    with pytest.raises(LongswiftError) as info:
        SamplingConfig(top_k=-1)
    assert str(info.value) == "SamplingConfig.top_k must be >= 0"
    code, _, err = run_cli(capsys, "generate", "--prompt", "hi", "--top-k", "-1")
    assert err.strip() == "longswift: error: --top-k must be >= 0"


def test_resume_takes_a_path_or_a_checkpoint(tiny, tmp_path):
    kwargs = dict(sampling=SamplingConfig(seed=2), generation=GenerationConfig(max_new_tokens=12, ignore_eos=True))
    whole = tiny.generate([1, 2, 3], **kwargs)
    stream = tiny.stream([1, 2, 3], **kwargs)
    for _ in stream:
        if len(stream.token_ids) >= 5:
            break
    stream.checkpoint().save(tmp_path / "run.ckpt.json")
    for source in (str(tmp_path / "run.ckpt.json"), tmp_path / "run.ckpt.json",
                   read_checkpoint(tmp_path / "run.ckpt.json")):
        rest = tiny.resume(source)
        for _ in rest:
            pass
        assert rest.result.token_ids == whole.token_ids
    with pytest.raises(LongswiftError, match="does not exist"):
        tiny.resume(tmp_path / "missing.json")


# ---- 9. checkpoints remember absolute output paths ------------------------------------------------

@pytest.mark.slow
def test_resume_from_another_directory_writes_where_the_first_run_did(tmp_path, capsys, monkeypatch):
    first, elsewhere = tmp_path / "first", tmp_path / "elsewhere"
    first.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(first)
    code, _, err = run_cli(capsys, "generate", "--prompt-ids", "1,2,3", "--heads", "none", "--greedy",
                           "--max-new-tokens", "6", "--ignore-eos", "--no-progress", "--output", "same.txt",
                           "--checkpoint", "run.ckpt")
    assert code == 0, err
    assert read_checkpoint(first / "run.ckpt").outputs["output"] == str(first / "same.txt")
    (first / "same.txt").unlink()
    monkeypatch.chdir(elsewhere)
    code, _, err = run_cli(capsys, "generate", "--resume", "../first/run.ckpt", "--no-progress")
    assert code == 0, err
    assert (first / "same.txt").is_file() and not list(elsewhere.iterdir())


@pytest.mark.slow
def test_an_output_given_again_on_resume_moves_that_file_alone(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "generate", "--prompt-ids", "1,2,3", "--heads", "none", "--greedy",
                           "--max-new-tokens", "6", "--ignore-eos", "--no-progress", "--output", "o.txt",
                           "--json", "o.json", "--checkpoint", "run.ckpt")
    assert code == 0, err
    first = (tmp_path / "o.txt").read_text()
    (tmp_path / "o.json").unlink()
    code, _, err = run_cli(capsys, "generate", "--resume", "run.ckpt", "--no-progress", "--output", "new.txt")
    assert code == 0, err
    assert (tmp_path / "new.txt").read_text() == first
    assert json.loads((tmp_path / "o.json").read_text())["text"] == first  # the recorded --json still written


# ---- 8. help that teaches -------------------------------------------------------------------------

def test_generate_help_has_plain_groups_choices_single_defaults_and_examples():
    from longswift.cli import build_parser

    text = build_parser()._subparsers._group_actions[0].choices["generate"].format_help()
    assert "Config:" not in text and "sampling:" in text and "device and precision:" in text
    assert "{paper,fused}" in text and "{dynamic,static,full}" in text and "{auto,float32," in text
    import re

    options = re.split(r"\n  (?=-)", text.split("examples:")[0])
    assert len(options) > 30
    for option in options:
        flat = " ".join(option.split())
        assert "(default: None)" not in flat and flat.count("(default:") + flat.count("default:") <= 2, flat
        assert flat.count("(default:") <= 1 and not ("(default:" in flat and "; default:" in flat), flat
    examples = text.split("examples:", 1)[1]
    assert examples.count("\n  longswift generate ") == 4  # (and the torchrun one)


def test_numpy_numbers_in_configs_are_python_numbers(tiny, tmp_path):
    """numpy scalars pass the configs' type checks as numbers; they must then work as Python's do:
    a numpy seed used to fail in torch.Generator.manual_seed ('an integer is required') and a numpy
    temperature or top_k in the checkpoint's JSON ('Object of type float32 is not JSON serializable')."""
    np = pytest.importorskip("numpy")
    sampling = SamplingConfig(seed=np.int64(2), temperature=np.float32(0.5), top_k=np.int64(5),
                              banned_ids=[np.int64(7), 3])
    assert type(sampling.seed) is int and type(sampling.temperature) is float and type(sampling.top_k) is int
    assert sampling.banned_ids == (3, 7) and all(type(t) is int for t in sampling.banned_ids)
    generation = GenerationConfig(max_new_tokens=np.int64(6), ignore_eos=True)
    assert type(generation.max_new_tokens) is int
    plain = SamplingConfig(seed=2, temperature=0.5, top_k=5, banned_ids=(3, 7))
    stream = tiny.stream([1, 2, 3], sampling=sampling, generation=generation)
    for _ in stream:
        stream.checkpoint().save(tmp_path / "run.ckpt.json")
        break
    rest = tiny.resume(tmp_path / "run.ckpt.json")
    for _ in rest:
        pass
    whole = tiny.generate([1, 2, 3], sampling=plain, generation=GenerationConfig(max_new_tokens=6, ignore_eos=True))
    assert rest.result.token_ids == whole.token_ids


@pytest.mark.parametrize("greedy", [False, True], ids=["seeded", "greedy"])
def test_a_stream_interrupted_inside_a_step_checkpoints_the_state_before_it(tiny, monkeypatch, greedy):
    """A KeyboardInterrupt inside a step's forward (after its draw) leaves the generator and stats
    mid-step: checkpoint() used to snapshot that state, so the resumed run drew from a generator one
    draw ahead and differed from the uninterrupted one; iterating the stream again ended it silently
    with finish_reason 'length' after the tokens it had."""
    sampling = SamplingConfig(temperature=0) if greedy else SamplingConfig(seed=4)
    kwargs = dict(sampling=sampling, generation=GenerationConfig(max_new_tokens=12, ignore_eos=True), method="ar")
    whole = tiny.generate([1, 2, 3], **kwargs)
    forward, calls = tiny.model.forward, []

    def interrupted(*args, **kw):
        calls.append(1)
        if len(calls) == 6:  # the prefill, then the forward of the 5th drawn token: after its draw
            raise KeyboardInterrupt
        return forward(*args, **kw)

    monkeypatch.setattr(tiny.model, "forward", interrupted)
    stream = tiny.stream([1, 2, 3], **kwargs)
    with pytest.raises(KeyboardInterrupt):
        for _ in stream:
            pass
    monkeypatch.setattr(tiny.model, "forward", forward)
    assert len(stream.token_ids) == 4 and stream.result is None
    with pytest.raises(LongswiftError, match="cannot go on"):
        for _ in stream:
            pass
    checkpoint = stream.checkpoint()
    assert checkpoint.stats["new_tokens"] == 4
    rest = tiny.resume(checkpoint)
    for _ in rest:
        pass
    assert rest.result.token_ids == whole.token_ids


def test_load_keywords_given_with_a_runtime_config_are_not_dropped():
    """load(runtime=RuntimeConfig(...), threads=1) used to ignore threads=1 without a word."""
    model = tiny_hf_model("llama", seed=3, dtype=torch.float64, vocab=40)
    threads = torch.get_num_threads()
    try:
        engine = longswift.load(model, runtime=longswift.RuntimeConfig(dtype="float64"), heads=None, threads=1)
        assert engine.runtime.threads == 1 and engine.runtime.dtype == "float64" and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    with pytest.raises(LongswiftError, match="RuntimeConfig.threads must be between 1 and"):
        longswift.load(model, runtime=longswift.RuntimeConfig(dtype="float64"), heads=None, threads=0)
    with pytest.raises(TypeError, match="runtime must be a longswift.RuntimeConfig; got dict"):
        longswift.load(model, runtime={"dtype": "float64"}, heads=None)


def test_config_fields_as_keywords_are_the_configs_fields(tiny):
    """generate(prompt, max_new_tokens=12, seed=4, temperature=0.8, tree=...) is the call with the configs
    built from them; a keyword overrides that field of a config given beside it, and leaves its others."""
    sampled = SamplingConfig(seed=4, temperature=0.8, top_k=5)
    configs = tiny.generate([1, 2, 3], sampling=sampled,
                            generation=GenerationConfig(max_new_tokens=12, ignore_eos=True))
    keywords = tiny.generate([1, 2, 3], seed=4, temperature=0.8, top_k=5, max_new_tokens=12, ignore_eos=True)
    assert keywords.token_ids == configs.token_ids and len(keywords.token_ids) == 12
    mixed = tiny.generate([1, 2, 3], sampling=replace(sampled, seed=99, top_k=0), seed=4, top_k=5,
                          generation=GenerationConfig(max_new_tokens=30, ignore_eos=True), max_new_tokens=12)
    assert mixed.token_ids == configs.token_ids and mixed.stats.seed == 4
    tiny.set_heads("random")
    try:
        spec = longswift.SpecConfig(tree="1,2", adaptive=False)
        a = tiny.generate([1, 2, 3], method="tokenswift", spec=spec, max_new_tokens=12, temperature=0, ignore_eos=True)
        b = tiny.generate([1, 2, 3], method="tokenswift", tree="1,2", adaptive=False, max_new_tokens=12, temperature=0,
                          ignore_eos=True)
        assert a.token_ids == b.token_ids and a.stats.steps == b.stats.steps
        assert a.stats.draft_positions == b.stats.draft_positions > 0  # drafted with the given trie
    finally:
        tiny.set_heads(None)
    with pytest.raises(LongswiftError, match="SamplingConfig.top_k must be >= 0"):  # checked as the config checks
        tiny.generate([1, 2, 3], top_k=-1)


def test_a_streams_text_comes_in_pieces_that_add_up_to_its_text():
    """stream.text(): the text as it comes, on a byte-level tokenizer whose tokens end inside characters
    (random weights draw bytes that are no UTF-8 too); a resumed stream's pieces begin with the text so far."""
    from conftest import byte_tokenizer

    engine = longswift.load(tiny_hf_model("llama", seed=5, vocab=260), dtype="float32", heads=None)
    engine.tokenizer = byte_tokenizer()
    run = {"max_new_tokens": 80, "ignore_eos": True, "seed": 3}
    stream = engine.stream([72, 105], **run)
    pieces = list(stream.text())
    assert "".join(pieces) == stream.result.text and len(pieces) > 5
    first = engine.stream([72, 105], **run)
    for _, _ in zip(range(10), first.text()):  # (between steps: the generator waits after a step's piece)
        pass
    rest = engine.resume(first.checkpoint())
    assert "".join(rest.text()) == stream.result.text
    with pytest.raises(LongswiftError, match="no tokenizer"):
        ids_only = longswift.load(tiny_hf_model("llama", seed=5), dtype="float32", heads=None)
        next(ids_only.stream([1], max_new_tokens=4).text())


@pytest.mark.parametrize("template, system, match", [
    ("{% for m in messages %}{{ m.content ", None, "is not a valid template (unexpected end of template"),
    ("{{ raise_exception('nope') }}", None, "refuses this prompt (nope): send the prompt as it is (chat=False)"),
    ("{{ raise_exception('nope') }}", "be brief", "refuses a system message (nope): write it into the prompt"),
    ("{{ messages[0].content / 0 }}", None, "fails ("),
])
def test_a_chat_template_that_fails_is_one_line(template, system, match):
    """A template that does not compile, or whose code fails, was jinja's traceback; one that refused the
    messages was called a refusal of the system message even with none."""
    from conftest import byte_tokenizer

    engine = longswift.load(tiny_hf_model("llama", seed=5, vocab=260), dtype="float32", heads=None)
    engine.tokenizer = byte_tokenizer()
    engine.tokenizer.chat_template = template
    with pytest.raises(LongswiftError, match=re.escape(match)) as info:
        engine.encode("hi", chat=True, system=system)
    assert "\n" not in str(info.value) and (system or "(--raw)" in info.value.cli_message)


def test_a_single_stop_string_and_a_stream_left_unfinished(tiny):
    """stop="." is one stop string (as transformers, vLLM and OpenAI's API take it); result_so_far() of a
    stream left after a `break` has no finish reason (it said "length" for 4 tokens of 50)."""
    assert GenerationConfig(stop=".").stop == (".",) and GenerationConfig(stop=["a", "b"]).stop == ("a", "b")
    stream = tiny.stream([1, 2, 3], max_new_tokens=50, ignore_eos=True)
    for _ in zip(range(4), stream):
        pass
    assert stream.result is None and stream.result_so_far().stats.finish_reason is None
    assert stream.result_so_far("interrupted").stats.finish_reason == "interrupted"
    for _ in stream:
        pass
    assert stream.result.stats.finish_reason == "length" and stream.result_so_far().stats.finish_reason == "length"


def test_a_running_stream_has_no_finish_reason_until_it_ends(tiny):
    """The live stats name no reason while the run goes on (they said "length" from the first token), nor does a
    mid-run checkpoint; a resumed run is running again, also from a file that says "length" (an older file, or a
    finished run's extended), and ends with its own reason."""
    stream = tiny.stream([1, 2, 3], max_new_tokens=6, ignore_eos=True, seed=4)
    ckpt = None
    live = []
    for _ in stream:
        ckpt = ckpt or stream.checkpoint()
        live.append(stream.stats.finish_reason)
    assert live == [None] * len(live) and len(live) >= 2 and stream.result.stats.finish_reason == "length"
    assert ckpt.stats["finish_reason"] is None
    for stats in (ckpt.stats, ckpt.stats | {"finish_reason": "length"}):
        resumed = tiny.resume(replace(ckpt, stats=stats))
        live = [resumed.stats.finish_reason for _ in resumed]
        assert live and live == [None] * len(live) and resumed.result.stats.finish_reason == "length"
        assert resumed.result.token_ids == stream.result.token_ids
    done = tiny.stream([1, 2, 3], max_new_tokens=3, ignore_eos=True)
    for _ in done:
        pass
    longer = tiny.resume(done.checkpoint(), max_new_tokens=5)
    live = [longer.stats.finish_reason for _ in longer]
    assert live and live == [None] * len(live) and len(longer.result.token_ids) == 5
    assert longer.result.stats.finish_reason == "length"


@pytest.mark.parametrize("method", ["ar", "tokenswift"])
def test_streams_of_one_engine_iterated_in_turn_give_their_own_tokens(tiny, method):
    """One prompt a call: several prompts are several streams, which may be iterated a step each in turn
    (each holds its own cache and state)."""
    tiny.set_heads("random")
    try:
        runs = [dict(max_new_tokens=30, ignore_eos=True, seed=s, method=method) for s in (1, 2)]
        alone = [tiny.generate(p, **r).token_ids for p, r in zip(([1, 2, 3], [4, 5]), runs)]
        streams = [tiny.stream(p, **r) for p, r in zip(([1, 2, 3], [4, 5]), runs)]
        active = list(streams)
        while active:
            for stream in list(active):
                if next(iter(stream), None) is None:  # (one step; an ended stream gives nothing)
                    active.remove(stream)
        assert [s.token_ids for s in streams] == alone
    finally:
        tiny.set_heads(None)


def test_a_model_object_takes_a_tokenizer():
    """load(model_object) has no tokenizer: text prompts, stop strings and stream.text() were refused;
    tokenizer= gives it one (and its EOS id)."""
    from conftest import byte_tokenizer

    model = tiny_hf_model("llama", seed=5, vocab=260)
    tok = byte_tokenizer()
    engine = longswift.load(model, dtype="float32", heads=None, tokenizer=tok)
    assert engine.encode("hé") == tok.encode("hé") and tok.convert_tokens_to_ids("<eos>") in engine.eos_ids
    result = engine.generate("hé", max_new_tokens=20, ignore_eos=True, seed=1)
    assert result.text == tok.decode(result.token_ids, skip_special_tokens=True)
    with pytest.raises(LongswiftError, match="this tokenizer has 260 tokens and the model's vocabulary 128"):
        longswift.load(tiny_hf_model("llama", seed=5), dtype="float32", heads=None, tokenizer=tok)
    with pytest.raises(TypeError, match="tokenizer must be a transformers tokenizer"):
        longswift.load(model, dtype="float32", heads=None, tokenizer="gpt2")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a machine without CUDA")
def test_a_cuda_device_without_cuda_is_refused_in_the_apis_words():
    with pytest.raises(LongswiftError, match="RuntimeConfig.device='cuda' but no CUDA device is available: use "
                                             "device='cpu'") as err:
        longswift.RuntimeConfig(device="cuda")
    assert err.value.cli_message == "--device cuda requested but no CUDA device is available; use --device cpu"


def test_a_refused_set_heads_leaves_the_engine_as_it_was(tiny, tmp_path):
    """set_heads('typo.safetensors') raised but had already recorded 'typo.safetensors' as the
    heads' source, which checkpoints then carried next to the fingerprint of the heads in use."""
    tiny.set_heads("random")
    heads, origin = tiny.heads, tiny.heads_origin
    try:
        with pytest.raises(LongswiftError, match="does not exist"):
            tiny.set_heads(str(tmp_path / "typo.safetensors"))
        assert (tiny.heads, tiny.heads_source, tiny.heads_origin) == (heads, "random", origin)
        stream = tiny.stream([1, 2, 3], generation=GenerationConfig(max_new_tokens=2), method="tokenswift")
        assert stream.checkpoint().heads_source == "random"
    finally:
        tiny.set_heads(None)


def test_heads_objects_of_another_model_are_refused_as_their_files_are(tiny):
    """set_heads(DraftHeads) skipped the model check a heads file gets: another model's heads of the same
    width ran silently, and wider ones failed with a shape error in the first draft pass."""
    from longswift.spec.heads import DraftHeads

    other = longswift.load(tiny_hf_model("llama", seed=6, dtype=torch.float64, vocab=40), dtype="float64",
                           heads="random")
    with pytest.raises(LongswiftError, match="these heads were made for another model"):
        tiny.set_heads(other.heads)
    with pytest.raises(LongswiftError, match=f"these heads are 32 wide, this model's hidden size is {tiny.cfg.hidden_size}"):
        tiny.set_heads(DraftHeads(32).double())
    assert tiny.heads is None
    mine = longswift.load(tiny_hf_model("llama", seed=3, dtype=torch.float64, vocab=40), dtype="float64",
                          heads="random").heads  # the same model loaded again: its heads are welcome
    tiny.set_heads(mine)
    try:
        assert tiny.heads is mine
        tiny.set_heads(DraftHeads(tiny.cfg.hidden_size).double())  # made by hand: no model recorded, width fits
    finally:
        tiny.set_heads(None)


def test_a_checkpoint_names_the_heads_its_stream_ran_with(tiny):
    """checkpoint() read the engine's heads when it was called: after set_heads(...) during a stream,
    the checkpoint named and fingerprinted heads the run never used."""
    tiny.set_heads("random")
    try:
        stream = tiny.stream([1, 2, 3], generation=GenerationConfig(max_new_tokens=6), method="tokenswift")
        ran_with = heads_fingerprint(tiny.heads, any_precision=True)  # (as checkpoints hash them)
        for _ in stream:
            tiny.set_heads(None)
            checkpoint = stream.checkpoint()
            break
        assert (checkpoint.heads_source, checkpoint.heads_fingerprint) == ("random", ran_with)
    finally:
        tiny.set_heads(None)


def test_generate_shows_streams_parameters():
    """generate(prompt, **kwargs) hid its options from IDEs and help(): it names stream's, in stream's order."""
    import inspect

    def params(f):
        return [(p.name, p.kind, p.default) for p in inspect.signature(f).parameters.values()]

    assert params(longswift.Engine.generate) == params(longswift.Engine.stream)
    assert [p[0] for p in params(longswift.Engine.generate)][:3] == ["self", "prompt", "sampling"]


@pytest.mark.slow
def test_prompt_text_far_longer_than_the_context_is_refused_before_tokenizing(embedded, monkeypatch):
    """A 20 MB prompt file took 21 s and 4 GB to tokenize before the context refused it (200 MB would run out of
    memory): text longer than the context could hold at the vocabulary's longest entry per token is refused at
    once; text just under that bound is still tokenized and judged by its tokens."""
    longest = max(len(t) for t in embedded.tokenizer.get_vocab())
    limit = embedded.cfg.context_limit
    calls = []
    real = embedded.tokenizer.encode
    monkeypatch.setattr(embedded.tokenizer, "encode", lambda text, *a, **k: calls.append(len(text)) or real(text, *a, **k))
    with pytest.raises(LongswiftError, match=f"the prompt text \\({2 * longest * limit + 1:,} characters\\) is far "
                                             f"longer than this model's context of {limit:,} tokens can hold"):
        embedded.encode("a" * (2 * longest * limit + 1))
    assert calls == []
    assert embedded.encode("word " * 100) and calls == [500]
