"""Bad input that a sweep of every command found ending in a traceback, a crash or a silently
replaced file: each is now refused in one line, before the model loads where it can be, and
nothing is left half-written."""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from conftest import assert_one_line_error, run_cli, tiny_hf_model

import longswift
from longswift import GenerationConfig, LongswiftError, SamplingConfig, SpecConfig
from longswift.atomic import AtomicFile, check_writable, replace_atomically, write_atomic, write_dir_atomically
from longswift.checkpoint import Checkpoint
from longswift.config import SEED_MAX, SEED_MIN, RuntimeConfig, parse_rope_scaling
from longswift.spec.heads import FORMAT, load_heads, new_heads, save_heads
from longswift.train.train import HeadTrainer, TrainConfig, base_hidden

# ---- seeds, threads, rope factors: numbers torch or the context arithmetic cannot take -------------

@pytest.mark.parametrize("seed", [SEED_MAX + 1, SEED_MIN - 1, 10**30])
def test_seeds_a_generator_cannot_take_are_refused(seed, capsys, no_loading):
    with pytest.raises(LongswiftError, match="SamplingConfig.seed must be between"):
        SamplingConfig(seed=seed)
    with pytest.raises(LongswiftError, match="--seed must be between"):
        TrainConfig(seed=seed)
    for command in ("generate", "bench", "bench-steps", "eval-heads", "train-heads"):  # refused as it is parsed
        code, _, err = run_cli(capsys, command, "--seed", str(seed))
        assert_one_line_error(code, err, "argument --seed: must be between")


@pytest.mark.parametrize("seed", [SEED_MIN, -1, SEED_MAX])
def test_seeds_at_the_edges_of_the_range_run(seed):
    """A negative seed is the generator of seed + 2^64; derived seeds (training's per epoch) wrap
    the same way instead of overflowing."""
    assert SamplingConfig(seed=seed).seed == seed
    engine = longswift.load(tiny_hf_model("llama", seed=5), dtype="float32", heads=None)
    windows = torch.randint(3, 100, (6, 12))
    cfg = TrainConfig(seed=seed, seq_len=12, batch_size=4, steps=1, warmup=0, chunk=16)
    trainer = HeadTrainer(engine, windows, base_hidden(engine.model, windows), cfg)
    picked = [trainer.batch_windows(0, 0), trainer.batch_windows(1, 0)]  # the second crosses into epoch 1
    assert all(len(i) == 4 and 0 <= i.min() and i.max() < 6 for i in picked)


def test_thread_counts_past_any_machine_are_refused_before_loading(capsys, no_loading):
    with pytest.raises(LongswiftError, match="RuntimeConfig.threads must be between 1 and 1024"):
        RuntimeConfig(threads=100000)
    code, _, err = run_cli(capsys, "generate", "--prompt", "hi", "--threads", "100000")
    assert_one_line_error(code, err, "--threads must be between 1 and 1024; got 100000")


def test_resume_checks_a_new_thread_count_before_the_checkpoint_records_it(tmp_path, capsys, no_loading):
    path = tmp_path / "c.json"
    Checkpoint(model_source="<embedded>", model_fingerprint="0" * 32, runtime=asdict(RuntimeConfig()),
               heads_source=None, heads_fingerprint=None, method="ar", sampling=asdict(SamplingConfig()),
               generation=asdict(GenerationConfig(max_new_tokens=8)), spec=asdict(SpecConfig()),
               prompt_ids=[1, 2, 3], token_ids=[4, 5], rng_state=None, stats={}).save(path)
    before = path.read_bytes()
    code, _, err = run_cli(capsys, "generate", "--resume", str(path), "--threads", "0")
    assert_one_line_error(code, err, "--threads must be between 1 and 1024; got 0")
    assert path.read_bytes() == before


def test_a_checkpoint_of_a_device_this_machine_lacks_resumes_with_device(tmp_path, capsys):
    """A GPU run's checkpoint on a machine without CUDA: one line saying so and what to pass, and
    --device cpu continues it (refused with --resume before), leaving CUDA's own settings (--cuda-graphs on,
    --triton-kernels) behind."""
    from longswift.checkpoint import read_checkpoint

    tiny_hf_model("llama", seed=9).save_pretrained(tmp_path / "m")
    capsys.readouterr()
    path = tmp_path / "c.json"
    code, _, err = run_cli(capsys, "generate", "--model", str(tmp_path / "m"), "--prompt-ids", "3,4,5", "--heads",
                           "none", "--max-new-tokens", "6", "--greedy", "--ignore-eos", "--no-progress",
                           "--checkpoint", str(path), "--device", "cpu")
    assert code == 0, err
    ckpt = read_checkpoint(path)
    ckpt.runtime |= {"device": "cuda", "cuda_graphs": "on", "triton_kernels": True}  # CUDA's own settings too
    ckpt.token_ids = ckpt.token_ids[:3]
    ckpt.save(path)
    if torch.cuda.is_available():
        pytest.skip("this machine has the checkpoint's device")
    code, _, err = run_cli(capsys, "generate", "--resume", str(path), "--no-progress")
    assert_one_line_error(code, err, f"checkpoint '{path}' ran on another device: --device cuda requested but no "
                                     "CUDA device is available; use --device cpu")
    code, _, err = run_cli(capsys, "generate", "--resume", str(path), "--no-progress", "--device", "cuda")
    assert_one_line_error(code, err, "--device cuda requested but no CUDA device")  # the flag given now, not the run's
    assert "ran on another device" not in err
    code, out, err = run_cli(capsys, "generate", "--resume", str(path), "--no-progress", "--device", "cpu")
    assert code == 0 and len(out.split()) == 6, err
    # the run goes on where it now is, without the settings only CUDA has (they were called damaged)
    assert {k: read_checkpoint(path).runtime[k] for k in ("device", "cuda_graphs", "triton_kernels")} == {
        "device": "cpu", "cuda_graphs": "auto", "triton_kernels": False}


def test_a_resume_after_its_job_directory_moved_says_which_output_to_give(tmp_path, capsys, monkeypatch):
    tiny_hf_model("llama", seed=9).save_pretrained(tmp_path / "m")
    (tmp_path / "Y").mkdir()
    (tmp_path / "W").mkdir()
    capsys.readouterr()
    code, _, err = run_cli(capsys, "generate", "--model", str(tmp_path / "m"), "--prompt-ids", "3,4,5", "--heads",
                           "none", "--max-new-tokens", "6", "--greedy", "--ignore-eos", "--no-progress",
                           "--output", str(tmp_path / "W/t.txt"), "--json", str(tmp_path / "Y/t.json"),
                           "--checkpoint", str(tmp_path / "Y/t.ckpt"))
    assert code == 0, err
    (tmp_path / "Y").rename(tmp_path / "Z")  # the JSON beside the checkpoint follows it; the text's folder is gone
    (tmp_path / "W").rename(tmp_path / "V")
    code, _, err = run_cli(capsys, "generate", "--resume", str(tmp_path / "Z/t.ckpt"), "--no-progress")
    assert_one_line_error(code, err, f"the checkpoint writes --output to '{tmp_path / 'W/t.txt'}', whose directory no "
                                     "longer exists: give --output FILE with --resume to write it elsewhere")
    code, _, err = run_cli(capsys, "generate", "--resume", str(tmp_path / "Z/t.ckpt"), "--no-progress",
                           "--output", str(tmp_path / "V/t.txt"))
    assert code == 0 and f"--json follows it to '{tmp_path / 'Z/t.json'}'" in err, err
    code, _, err = run_cli(capsys, "generate", "--resume", str(tmp_path / "Z/t.ckpt"), "--no-progress",
                           "--output", str(tmp_path / "Z/t.txt"), "--json", str(tmp_path / "Z/t.json"))
    assert code == 0, err
    # an output over the checkpoint being continued names --resume, which named it (it said --checkpoint)
    code, _, err = run_cli(capsys, "generate", "--resume", str(tmp_path / "Z/t.ckpt"), "--output",
                           str(tmp_path / "Z/t.ckpt"))
    assert_one_line_error(code, err, "--output and --resume are the same file")
    # a path the checkpoint recorded is named as its own: this command gave no --json (a review)
    code, _, err = run_cli(capsys, "generate", "--resume", str(tmp_path / "Z/t.ckpt"), "--output",
                           str(tmp_path / "Z/t.txt"), "--checkpoint", str(tmp_path / "Z/t.json"))
    assert_one_line_error(code, err, "the checkpoint's --json and --checkpoint are the same file")
    # a checkpoint in a directory that cannot be written (root writes anywhere: the check is faked for it)
    import os

    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(tmp_path / "Z") else real(p, mode))
    code, _, err = run_cli(capsys, "generate", "--resume", str(tmp_path / "Z/t.ckpt"), "--no-progress",
                           "--output", str(tmp_path / "t.txt"), "--json", str(tmp_path / "t.json"))
    assert_one_line_error(code, err, "its directory is not writable; give --checkpoint FILE with --resume")


@pytest.mark.parametrize("text", ["yarn:1e308", "linear:inf", "dynamic:nan", "yarn:1"])
def test_rope_factors_that_overflow_the_context_are_refused(text, capsys, no_loading):
    with pytest.raises(LongswiftError, match=r"FACTOR in \(1, 1024\]"):
        parse_rope_scaling(text)
    code, _, err = run_cli(capsys, "generate", "--prompt", "hi", "--rope-scaling", text)
    assert_one_line_error(code, err, "--rope-scaling must be TYPE:FACTOR")


def test_a_torchrun_variable_that_is_not_a_number_is_one_line(capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "abc")
    code, _, err = run_cli(capsys, "info", "--tokens", "0")
    assert_one_line_error(code, err, "environment variable WORLD_SIZE='abc' must be a whole number >= 1")
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.setenv("RANK", "abc")  # read only to label an error's line, which must still print as one
    code, _, err = run_cli(capsys, "info", "--tokens", "0")
    assert_one_line_error(code, err, "--tokens must be a positive number of tokens, got 0")


def test_a_rank_set_by_another_launcher_is_not_a_torchrun_rank(capsys, monkeypatch):
    """RANK set by another launcher's job, with no WORLD_SIZE above 1: the single run took itself for rank 1 of a
    torchrun group, so it took no output lock (writing over another run's --output), hid its notes and labelled
    its errors "(rank 1)"; and RANK=x broke it."""
    from longswift.cli.generate import Ranks
    from longswift.config import RuntimeConfig

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    for rank in ("1", "x"):
        monkeypatch.setenv("RANK", rank)
        assert Ranks(RuntimeConfig()).main
        code, _, err = run_cli(capsys, "info", "--tokens", "0")
        assert_one_line_error(code, err, "--tokens must be a positive number of tokens, got 0")
        assert err.startswith("longswift: error:"), err
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert not Ranks(RuntimeConfig()).main


def test_a_torchrun_launch_without_its_rendezvous_is_one_line(capsys, monkeypatch):
    """WORLD_SIZE without torchrun's MASTER_ADDR/MASTER_PORT was a ValueError traceback from torch."""
    monkeypatch.setenv("WORLD_SIZE", "3")  # (the embedded model's 9 heads split in 3)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    code, _, err = run_cli(capsys, "generate", "--prompt-ids", "1,2", "--max-new-tokens", "2", "--heads", "none")
    assert_one_line_error(code, err, "WORLD_SIZE=3 makes this one of several processes, but MASTER_ADDR and "
                                     "MASTER_PORT are not set: launch with torchrun")


@pytest.fixture
def waits(monkeypatch):
    """The seconds the CLI slept (time.sleep recorded, not slept)."""
    import longswift.cli

    slept: list[float] = []
    monkeypatch.setattr(longswift.cli.time, "sleep", slept.append)
    return slept


@pytest.mark.parametrize("local_rank", [0, 1])
def test_an_error_every_rank_meets_is_said_first_by_the_machines_first_process(capsys, monkeypatch, waits,
                                                                                local_rank):
    """Under torchrun every process printed the same error of their common command line: N lines saying one thing.
    The machine's first process (LOCAL_RANK 0) says it at once; the others wait first, and torchrun, which stops a
    run's processes once one has exited with an error, ends them before they say it again. (They exited at once,
    silent, before: torchrun then stopped the first process before it printed, and no line said why.)"""
    from longswift.cli import SAY_AFTER_THE_FIRST_S

    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", str(2 + local_rank))  # the second machine's processes
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    for argv, message in ((["generate", "--prompt", "hi", "--max-new-tokens", "x"], "argument --max-new-tokens"),
                          (["generate", "--prompt", "hi", "--top-p", "1.5"], "--top-p must be in (0, 1]"),
                          (["generate", "--prompt", "hi", "--no-such-flag"], "unrecognized arguments: --no-such-flag")):
        waits.clear()
        code, out, err = run_cli(capsys, *argv)
        assert code == 2 and out == "" and err.count("\n") == 1, err
        assert err.startswith(f"longswift (rank {2 + local_rank}): error: ") and message in err, err
        assert waits == ([] if local_rank == 0 else [SAY_AFTER_THE_FIRST_S])
    if local_rank == 1:  # Ctrl-C during the wait (torchrun relays it to every process): the line, no traceback
        def interrupted(seconds):
            raise KeyboardInterrupt

        monkeypatch.setattr(longswift.cli.time, "sleep", interrupted)
        code, out, err = run_cli(capsys, "generate", "--prompt", "hi", "--no-such-flag")
        assert code == 2 and err.count("\n") == 1 and "unrecognized arguments: --no-such-flag" in err, err
    monkeypatch.delenv("MASTER_ADDR")  # not torchrun's process (its variables inherited): no wait
    waits.clear()
    code, _, err = run_cli(capsys, "generate", "--prompt", "hi", "--no-such-flag")
    assert code == 2 and "unrecognized arguments" in err and waits == []


def test_a_refusal_the_ranks_agreed_on_is_said_first_by_the_machines_first_process(capsys, monkeypatch, waits):
    """A refusal the ranks agreed on (TensorParallel.agree, refuse_together) is said at once by the machine's first
    process, by the others after the wait; an error that a process may meet alone (its own GPU, its own lost
    contact) by every process at once."""
    from longswift.cli import SAY_AFTER_THE_FIRST_S
    from longswift.errors import AgreedError

    def refused(error):
        def cmd_generate(args):
            raise error("on rank 1 of this run's processes: not enough memory")
        return cmd_generate

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    for local_rank in (0, 1):
        monkeypatch.setenv("RANK", str(local_rank))
        monkeypatch.setenv("LOCAL_RANK", str(local_rank))
        said = f"longswift{' (rank 1)' if local_rank else ''}: error: on rank 1 of this run's processes: not enough memory\n"
        for error, waited in ((AgreedError, local_rank == 1), (LongswiftError, False)):
            waits.clear()
            monkeypatch.setattr("longswift.cli.generate.cmd_generate", refused(error))
            code, out, err = run_cli(capsys, "generate", "--prompt", "hi")
            assert (code, out, err) == (2, "", said), (error, local_rank)
            assert waits == ([SAY_AFTER_THE_FIRST_S] if waited else []), (error, local_rank)


@pytest.mark.parametrize("layout", ["file", "directory", "tokenswift directory"])
def test_generate_never_writes_over_the_heads_it_reads(tmp_path, capsys, layout):
    """`--output H.safetensors --heads H.safetensors` replaced trained heads with the generated text (exit 0), and
    with --heads a TokenSwift checkpoint's directory an --output of its model.safetensors destroyed the model;
    eval-heads and bench already refused it."""
    heads = tmp_path / "h"
    heads.mkdir()
    target = heads / ("heads.safetensors" if layout != "tokenswift directory" else "model.safetensors")
    target.write_bytes(b"kept")
    if layout == "tokenswift directory":
        (heads / "config.json").write_text("{}")
    given = str(target) if layout == "file" else str(heads)
    code, _, err = run_cli(capsys, "generate", "--prompt-ids", "1,2", "--max-new-tokens", "2", "--heads", given,
                           "--output", str(target))
    assert_one_line_error(code, err, "--output and --heads are the same file")
    assert target.read_bytes() == b"kept"


@pytest.mark.parametrize("command", ["generate", "bench"])
def test_an_output_named_as_another_outputs_lock_file_is_refused(tmp_path, capsys, no_loading, command):
    """`--output o.txt --json o.txt.lock` wrote the JSON over o.txt's lock file, which the run's end then removed
    (exit 0, the JSON gone); so did bench's --json results.jsonl.lock of its --out-dir's store."""
    if command == "generate":
        name, owner = "o.txt", "--output"
        argv = ["generate", "--prompt", "hi", "--output", str(tmp_path / name)]
    else:
        name, owner = "results.jsonl", "--out-dir's results.jsonl"
        argv = ["bench", "--methods", "ar", "--out-dir", str(tmp_path)]
    code, _, err = run_cli(capsys, *argv, "--json", str(tmp_path / f"{name}.longswift-lock"))
    assert_one_line_error(code, err, f"--json '{name}.longswift-lock' is the name of the lock file that {owner} "
                                     f"'{tmp_path / name}' is written under: give it another name")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_only_an_outputs_lock_file_is_reserved(tmp_path):
    """An input has no lock file: an output named as one's lock name is an ordinary output (it was refused as "the
    lock file that --prompt-file 'p.txt' is written under")."""
    from longswift.atomic import check_distinct

    check_distinct([("--output", tmp_path / "p.txt.longswift-lock"), ("--prompt-file", tmp_path / "p.txt")])
    with pytest.raises(LongswiftError, match="--output and --prompt-file are the same file"):
        check_distinct([("--output", tmp_path / "p.txt"), ("--prompt-file", tmp_path / "p.txt")])
    with pytest.raises(LongswiftError, match="--json 'p.txt.longswift-lock' is the name of the lock file that --out"):
        check_distinct([("--output", tmp_path / "p.txt"), ("--json", tmp_path / "p.txt.longswift-lock")])


@pytest.mark.parametrize("kind", ["text", "digits, then text", "link", "directory", "socket"])
def test_a_file_where_a_lock_would_be_is_never_taken_for_one(tmp_path, kind):
    """A run's lock file was `FILE.lock`, opened through links and truncated, then removed at the run's end:
    `--output Cargo` destroyed Cargo.lock (exit 0). Its name is now longswift's own, and a file there that is not
    a lock (not a regular file, or one holding anything but a pid) is refused and left as it is."""
    from longswift.atomic import OutputLock

    precious = tmp_path / "precious.txt"
    precious.write_text("my data")
    (tmp_path / "Cargo.lock").write_text("kept")
    with OutputLock([("--output", tmp_path / "Cargo")]):
        assert (tmp_path / "Cargo.longswift-lock").read_text() == str(os.getpid())
    assert (tmp_path / "Cargo.lock").read_text() == "kept" and not (tmp_path / "Cargo.longswift-lock").exists()
    lock = tmp_path / "out.txt.longswift-lock"
    if kind == "text":
        lock.write_text("my data")
    elif kind == "digits, then text":  # (a pid is at most 7 digits: 64 of them, then more, are someone's data)
        lock.write_text("1" * 64 + " my data")
    elif kind == "link":
        lock.symlink_to(precious)
    elif kind == "socket":
        import socket

        server = socket.socket(socket.AF_UNIX)
        server.bind(str(lock))
    else:
        lock.mkdir()
    with pytest.raises(LongswiftError, match=r"^'.*out\.txt\.longswift-lock', where a run writing 'out\.txt' takes "
                                             r"its lock, is (a file that is )?not a lock.*: move it away, or give "
                                             r"another --output$"):
        OutputLock([("--output", tmp_path / "out.txt")]).__enter__()
    assert precious.read_text() == "my data" and lock.exists()
    assert kind not in ("text", "digits, then text") or lock.read_text().endswith("my data")
    lock.unlink() if kind != "directory" else lock.rmdir()
    (tmp_path / "out.txt.longswift-lock").write_text("12345")  # a killed run's lock (its pid): taken over
    with OutputLock([("--output", tmp_path / "out.txt")]):
        assert (tmp_path / "out.txt.longswift-lock").read_text() == str(os.getpid())


def test_the_shipped_heads_are_never_an_output(capsys, tmp_path, monkeypatch):
    """--heads auto (the default) reads the heads shipped in the package: no output may replace them. (A copy of
    the package's folder stands in for it: where the check failed, the test would destroy the real file.)"""
    import shutil

    import longswift.spec.heads as heads

    monkeypatch.setattr(heads, "SHIPPED_DIR", shutil.copytree(heads.SHIPPED_DIR, tmp_path / "data"))
    shipped = sorted(heads.SHIPPED_DIR.glob("*.safetensors"))[0]
    before = shipped.read_bytes()
    code, _, err = run_cli(capsys, "generate", "--prompt-ids", "1,2", "--max-new-tokens", "2", "--output", str(shipped))
    assert_one_line_error(code, err, "--output and --heads are the same file")
    assert shipped.read_bytes() == before


def test_a_prompt_from_standard_input_is_refused_under_torchrun(capsys, monkeypatch):
    """Only one of torchrun's processes gets standard input, which one by chance: the others read an empty prompt
    and failed with 'the prompt is empty' (or, with a long prompt, each read a part: 'different prompts')."""
    import io

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr("sys.stdin", io.StringIO("Write a haiku about rain."))
    code, _, err = run_cli(capsys, "generate", "--prompt-file", "-", "--max-new-tokens", "4")
    assert_one_line_error(code, err, "--prompt-file - (standard input) reaches only one of torchrun's processes")


@pytest.mark.parametrize("kind", ["fifo", "process substitution"])
def test_a_prompt_from_a_pipe_is_refused_under_torchrun(capsys, monkeypatch, tmp_path, kind):
    """A FIFO's text went to one of torchrun's processes and the others waited for a writer: a hang. torchrun passes
    no process substitution <(...) on, so each process was told that its /dev/fd/N 'does not exist'."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    path = tmp_path / "fifo"
    if kind == "fifo":
        os.mkfifo(path)  # no writer: opening it to read would block this test
    else:
        path = Path("/dev/fd/987654")  # a descriptor this process does not have, as under torchrun
    code, _, err = run_cli(capsys, "generate", "--prompt-file", str(path), "--max-new-tokens", "4")
    assert_one_line_error(code, err, f"--prompt-file '{path}' is a pipe (a process substitution <(...), a FIFO or a "
                                     "device), which torchrun's processes cannot each read")


# ---- model configs ---------------------------------------------------------------------------------

@pytest.mark.parametrize("edit,match", [
    (lambda c: [c], "holds a JSON list, not the object of a model config"),
    (lambda c: {**c, "max_position_embeddings": 0}, "config field max_position_embeddings must be positive"),
])
def test_a_config_json_of_the_wrong_shape_is_one_line(tmp_path, edit, match):
    tiny_hf_model("llama", seed=6).save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    with pytest.raises(LongswiftError, match=match):
        longswift.load(str(tmp_path), dtype="float32", heads=None)


@pytest.mark.parametrize("command", [["info"], ["generate", "--prompt", "hi", "--max-new-tokens", "2"]])
def test_a_model_directory_without_its_weights_says_so_before_planning_memory(tmp_path, capsys, command):
    """A config.json alone (the default sizes of a 7B model when it is minimal) planned a run that
    did not fit, or one that did ("fits"), for weights that are not there: the missing weights come first."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    code, _, err = run_cli(capsys, *command, "--model", str(tmp_path))
    assert_one_line_error(code, err, "has no .safetensors weights: longswift loads safetensors checkpoints")
    index = {"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    code, _, err = run_cli(capsys, *command, "--model", str(tmp_path))
    assert_one_line_error(code, err, "model-00001-of-00002.safetensors' named in the index is missing")


@pytest.fixture
def model_dir(tmp_path):
    tiny_hf_model("llama", seed=5).save_pretrained(tmp_path / "m")
    return tmp_path / "m"


@pytest.mark.parametrize("argv,match", [
    (["generate", "--model", "{m}", "--prompt-ids", "1,2", "--json", "{m}/config.json"],
     "--json and --model are the same file"),
    (["export-heads", "--model", "{m}", "--heads", "random", "--out", "{m}/model.safetensors"],
     "--model and --out are the same file"),
    (["eval-heads", "--model", "{m}", "--heads", "random", "--data", "{d}", "--json", "{d}/doc.txt"],
     "--data and --json are the same file"),
    (["eval-heads", "--model", "{m}", "--heads", "random", "--data", "{d}", "--json", "{m}/config.json"],
     "--model and --json are the same file"),
    (["train-heads", "--model", "{m}", "--data", "{d}/train_log.json", "--out", "{d}"],
     "train_log.json' exists, which a run writes at its end"),
    (["train-heads", "--model", "{m}", "--data", "{d}", "--out", "{d}"], "train_log.json' exists, which a run writes"),
    (["train-heads", "--model", "{m}", "--data", "{d}", "--out", "{d}/heads"], "--out '{d}/heads' is inside --data"),
])
def test_no_output_replaces_the_model_or_the_data_a_command_reads(tmp_path, model_dir, capsys, no_loading, argv,
                                                                  match):
    """Outputs over inputs: export-heads wrote heads over the model's weights, eval-heads --json over a data file
    in a --data directory or the model's config, train-heads its log over a --data file named train_log.json,
    or its files into a --data directory (the next run read them as documents and failed). Refused before
    loading, and the files are as they were."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "doc.txt").write_text("some text " * 50)
    (data / "train_log.json").write_text('{"text": "more text"}\n')
    before = {p: p.read_bytes() for p in [*model_dir.iterdir(), *data.iterdir()]}
    capsys.readouterr()
    code, _, err = run_cli(capsys, *[a.format(m=model_dir, d=data) for a in argv])
    assert_one_line_error(code, err, match.format(d=data))
    assert {p: p.read_bytes() for p in [*model_dir.iterdir(), *data.iterdir()]} == before


# ---- heads files -----------------------------------------------------------------------------------

@pytest.mark.parametrize("meta,match", [
    ("{not json", "not JSON"),
    ("[3]", "not a JSON object"),
    ('{"base": {}}', "gamma must be a positive whole number, got None"),
    ('{"gamma": "3", "base": {}}', "gamma must be a positive whole number, got '3'"),
    ('{"gamma": 0, "base": {}}', "gamma must be a positive whole number, got 0"),
    ('{"gamma": 3, "eps": "x", "base": {}}', "eps (the norms' epsilon) must be a number from 0 to 1, got 'x'"),
    ('{"gamma": 3, "eps": 1e300, "base": {}}', "must be a number from 0 to 1, got 1e+300"),
    ('{"gamma": 3, "base": [1]}', "base must be an object"),
    ('{"gamma": 3, "base": {"architecture": "llama"}}', "its base model lacks hidden_size, vocab_size, num_layers, "
                                                         "fingerprint"),  # (was: "made for another model")
    (json.dumps({"gamma": 3, "base": dict.fromkeys(("architecture", "hidden_size", "vocab_size", "num_layers",
                                                     "fingerprint"), 1)}),
     "format must be 'longswift-heads', got None"),
    (json.dumps({"gamma": 3, "format": FORMAT, "version": "1", "base": dict.fromkeys(
        ("architecture", "hidden_size", "vocab_size", "num_layers", "fingerprint"), 1)}),
     "version must be a positive whole number, got '1'"),
])
def test_heads_with_damaged_metadata_are_one_line(tmp_path, meta, match):
    from safetensors.torch import save_file

    engine = longswift.load(tiny_hf_model("llama", seed=7), dtype="float32", heads=None)
    path = tmp_path / "heads.safetensors"
    save_file({"w": torch.zeros(2)}, str(path), metadata={FORMAT: meta})
    with pytest.raises(LongswiftError, match=f"heads file '{path}' has damaged '{FORMAT}' metadata") as info:
        load_heads(path, engine.cfg, engine.model.embed)
    assert match in str(info.value)


def test_heads_of_a_newer_format_are_refused(tmp_path):
    """A version-2 heads file was read with version 1's meaning, without a word."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from longswift.spec.heads import save_heads

    engine = longswift.load(tiny_hf_model("llama", seed=7), dtype="float32", heads="random")
    path = tmp_path / "heads.safetensors"
    save_heads(engine.heads, engine.cfg, engine.fingerprint, path)
    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()[FORMAT])
    save_file(load_file(str(path)), str(path), metadata={FORMAT: json.dumps({**meta, "version": 2})})
    with pytest.raises(LongswiftError, match="was written by a newer longswift \\(heads format version 2; this one "
                                             "reads version 1\\): upgrade longswift"):
        load_heads(path, engine.cfg, engine.model.embed)


def test_a_newer_heads_format_laid_out_otherwise_is_refused_as_newer(tmp_path):
    """A version-2 file without version 1's gamma was called damaged ("re-export or retrain the heads"), not newer."""
    from safetensors.torch import save_file

    path = tmp_path / "heads.safetensors"
    meta = {"format": FORMAT, "version": 2, "heads": {"count": 3}}
    save_file({"w": torch.zeros(2)}, str(path), metadata={FORMAT: json.dumps(meta)})
    with pytest.raises(LongswiftError, match="was written by a newer longswift \\(heads format version 2"):
        load_heads(path, None, None)


def test_a_models_weights_or_another_models_heads_are_refused_before_their_values_are_read(tmp_path, monkeypatch):
    """--heads model.safetensors read every tensor of the file (a model's gigabytes) before refusing it as no heads
    file; heads made for another model were read whole too. The header says both."""
    import safetensors

    hf = tiny_hf_model("llama", seed=7)
    hf.save_pretrained(tmp_path / "m")
    engine = longswift.load(str(tmp_path / "m"), dtype="float32", heads=None)
    other = longswift.load(tiny_hf_model("llama", seed=8), dtype="float32", heads="random")
    save_heads(other.heads, other.cfg, other.fingerprint, tmp_path / "other.safetensors")
    read, real = [], safetensors.safe_open

    class Counting:  # safe_open, counting the tensors whose values are read
        def __init__(self, *args, **kwargs):
            self.f = real(*args, **kwargs)

        def __enter__(self):
            self.f.__enter__()
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

        def get_tensor(self, name):
            read.append(name)
            return self.f.get_tensor(name)

        def __getattr__(self, name):
            return getattr(self.f, name)

    monkeypatch.setattr(safetensors, "safe_open", Counting)
    for path, match in ((tmp_path / "m" / "model.safetensors", "is not a longswift heads file"),
                        (tmp_path / "other.safetensors", "were made for another model")):
        with pytest.raises(LongswiftError, match=match):
            engine.set_heads(str(path))
        assert read == [], (path, read)


def test_heads_trained_under_another_rope_scaling_get_a_note(tmp_path, capsys):
    """Heads trained with --rope-scaling and used without it (or the other way) ran without a word: the tokens
    are the same, but the heads learnt other positions' hidden states and fewer of their drafts are accepted."""
    from longswift.spec.heads import save_heads

    tiny_hf_model("llama", seed=5).save_pretrained(tmp_path / "m")
    engine = longswift.load(str(tmp_path / "m"), dtype="float32", heads="random")
    heads = tmp_path / "heads.safetensors"
    save_heads(engine.heads, engine.cfg, engine.fingerprint, heads,
               {"training": {"settings": {"dtype": "float32", "rope_scaling": "yarn:4"}}})
    capsys.readouterr()

    def note(*args):
        code, _, err = run_cli(capsys, "generate", "--model", str(tmp_path / "m"), "--heads", str(heads),
                               "--prompt-ids", "3,4,5", "--max-new-tokens", "3", "--no-progress", *args)
        assert code == 0, err
        return [line for line in err.splitlines() if "rope scaling" in line]

    assert note() == ["longswift: note: these heads were trained with rope scaling yarn:4 and this run has no rope "
                      "scaling: the tokens are the model's either way, but fewer drafts may be accepted; run with the "
                      "heads' rope scaling, or train heads under this one"]
    assert note("--rope-scaling", "yarn:2")[0].startswith("longswift: note: these heads were trained with rope "
                                                            "scaling yarn:4 and this run has rope scaling yarn:2:")
    assert note("--rope-scaling", "yarn:4.0") == []  # the same scaling, spelt otherwise
    assert note("--method", "ar") == []  # (AR does not draft)
    same = longswift.load(str(tmp_path / "m"), dtype="float32", heads=str(heads), rope_scaling="yarn:4")
    assert same.heads_note() is None
    save_heads(engine.heads, engine.cfg, engine.fingerprint, heads)  # no training record: nothing to compare
    assert note() == []



def test_the_rope_note_compares_the_rope_the_model_runs_with_its_own_scaling_included(tmp_path, capsys):
    """The note compared --rope-scaling flags alone: heads trained with --rope-scaling yarn:4 got a note on the same
    model with yarn:4 in its config (which refuses the flag the note advised), and heads trained on that model got
    none on the plain one. Heads record the rope their base ran with (`rope`), and the note compares it."""
    from longswift.spec.heads import save_heads, training_record
    from longswift.train.train import TrainConfig, train_heads

    tiny_hf_model("llama", seed=5).save_pretrained(tmp_path / "plain")
    tiny_hf_model("llama", "yarn", seed=5).save_pretrained(tmp_path / "yarn")  # the same weights, yarn:4 in its config
    plain = longswift.load(str(tmp_path / "plain"), dtype="float32", heads="random")
    assert plain.cfg.rope_setting is None
    scaled = longswift.load(str(tmp_path / "plain"), dtype="float32", heads="random", rope_scaling="yarn:4")
    own = longswift.load(str(tmp_path / "yarn"), dtype="float32", heads="random")
    assert scaled.cfg.rope_setting == own.cfg.rope_setting == "yarn:4.0"
    windows = torch.randint(3, 128, (4, 24), generator=torch.Generator().manual_seed(0))
    train_heads(scaled, windows, TrainConfig(steps=1, seq_len=24, batch_size=2, warmup=0), tmp_path / "t",
                progress=False)
    trained = tmp_path / "t" / "heads.safetensors"
    assert training_record(trained)["rope"] == "yarn:4.0"
    assert training_record(trained)["settings"]["rope_scaling"] == "yarn:4"
    for engine, note in [(own, False), (scaled, False), (plain, True)]:
        engine.set_heads(str(trained))
        assert (engine.heads_note() is not None) == note, engine.heads_note()
    assert plain.heads_note().startswith("these heads were trained with rope scaling yarn:4.0 and this run has no "
                                         "rope scaling:")
    on_own = tmp_path / "on-own.safetensors"  # trained on the model with yarn in its config, no flag
    save_heads(own.heads, own.cfg, own.fingerprint, on_own,
               {"training": {"settings": {"dtype": "float32", "rope_scaling": None}, "rope": "yarn:4.0"}})
    for engine, note in [(own, False), (scaled, False), (plain, True)]:
        engine.set_heads(str(on_own))
        assert (engine.heads_note() is not None) == note, engine.heads_note()


def test_a_heads_count_the_tensors_do_not_hold_is_refused_before_allocating_it(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    engine = longswift.load(tiny_hf_model("llama", seed=7), dtype="float32", heads=None)
    heads = new_heads(engine.cfg, engine.model.state)
    path = tmp_path / "heads.safetensors"
    save_heads(heads, engine.cfg, heads.base_fingerprint, path)
    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()[FORMAT])
    save_file(load_file(str(path)), str(path), metadata={FORMAT: json.dumps({**meta, "gamma": 10**12})})
    with pytest.raises(LongswiftError, match=r"its metadata says 1000000000000 heads, and the model's hidden size is "
                                             r"64, but its 'weights' tensor has shape \[3, 64, 64\]"):
        load_heads(path, engine.cfg, engine.model.embed)
    # tensors of that many heads, each of no size: DraftHeads allocated 200,000 [64, 64] matrices before
    # load_state_dict found them wrong (for the embedded model's hidden size, 265 GB)
    empty = {"weights": torch.zeros(200_000, 0, 0), "in_norms": torch.zeros(200_000, 0),
             "out_norms": torch.zeros(200_000, 0)}
    save_file(empty, str(path), metadata={FORMAT: json.dumps({**meta, "gamma": 200_000})})
    with pytest.raises(LongswiftError, match=r"shape \[200000, 0, 0\]"):
        load_heads(path, engine.cfg, engine.model.embed)


def test_heads_of_float8_values_are_refused_as_another_kind_of_file(tmp_path):
    """float8 tensors failed torch.isfinite with a NotImplementedError traceback."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    engine = longswift.load(tiny_hf_model("llama", seed=7), dtype="float32", heads=None)
    path = tmp_path / "heads.safetensors"
    heads = new_heads(engine.cfg, engine.model.state)
    save_heads(heads, engine.cfg, heads.base_fingerprint, path)
    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata()
    save_file({k: v.to(torch.float8_e4m3fn) for k, v in load_file(str(path)).items()}, str(path), metadata=metadata)
    with pytest.raises(LongswiftError, match="its 'in_norms' tensor holds torch.float8_e4m3fn values, where heads are "
                                             "float32, float16 or bfloat16 weights"):
        load_heads(path, engine.cfg, engine.model.embed)


def test_heads_files_get_the_permissions_open_would_give(tmp_path):
    """safetensors creates its files 0600; an exported heads file is meant to be shared."""
    engine = longswift.load(tiny_hf_model("llama", seed=8), dtype="float32", heads=None)
    heads = new_heads(engine.cfg, engine.model.state)
    old = os.umask(0o022)
    try:
        save_heads(heads, engine.cfg, heads.base_fingerprint, tmp_path / "h.safetensors")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "h.safetensors").stat().st_mode) == 0o644


# ---- outputs ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("flag", ["--output", "--json"])
def test_an_output_on_a_device_or_pipe_is_refused_not_replaced(tmp_path, capsys, no_loading, flag):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for target in (fifo, "/dev/null"):
        code, _, err = run_cli(capsys, "generate", "--prompt", "hi", flag, str(target))
        assert_one_line_error(code, err, f"output path '{target}' is not a regular file")
    assert stat.S_ISFIFO(fifo.stat().st_mode) and stat.S_ISCHR(os.stat("/dev/null").st_mode)


@pytest.mark.slow
@pytest.mark.parametrize("failing", ["out.json", "ck.json"])
def test_a_full_disk_at_the_end_leaves_none_of_the_run_outputs(tmp_path, capsys, monkeypatch, failing):
    """--output and --json are both written before the first is renamed into place: a disk that fills while
    writing the last leaves no --output without its --json. A final checkpoint that cannot be saved leaves both
    outputs (they were discarded with it, and with no periodic checkpoint nothing of the run was left)."""
    real = AtomicFile.write

    def full(self, text):
        if self.path.name == failing:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path))
        real(self, text)

    monkeypatch.setattr(AtomicFile, "write", full)
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "generate", "--prompt", "Hi.", "--greedy", "--max-new-tokens", "4", "--ignore-eos",
                           "--no-progress", "--method", "ar", "--output", "out.txt", "--json", "out.json",
                           "--checkpoint", "ck.json", "--checkpoint-every", "100")
    assert code == 1 and "No space left on device" in err, err
    # no .partial files, no lock files either
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if failing == "out.json" else ["out.json", "out.txt"])
    if failing == "ck.json":
        assert "; the run finished and its outputs were written, but its checkpoint could not be saved" in err, err
        assert len(json.loads((tmp_path / "out.json").read_text())["token_ids"]) == 4
        for name in ("out.json", "out.txt"):
            (tmp_path / name).unlink()
    monkeypatch.setattr(AtomicFile, "write", real)
    (tmp_path / "out.txt.a1b2c3d4.partial").write_text("from a run killed by SIGKILL")
    code, _, err = run_cli(capsys, "generate", "--prompt", "Hi.", "--greedy", "--max-new-tokens", "4", "--ignore-eos",
                           "--no-progress", "--method", "ar", "--output", "out.txt", "--json", "out.json")
    assert code == 0, err
    assert "removed 'out.txt.a1b2c3d4.partial', left by a run that was killed while writing it" in err
    assert (tmp_path / "out.txt").read_text() == json.loads((tmp_path / "out.json").read_text())["text"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "out.txt"]


def test_cleanup_after_a_failure_does_not_hide_it(tmp_path, monkeypatch):
    """A directory made read-only mid-run (a remount): removing the temporary and lock files fails too, and
    those errors used to replace the one that stopped the run (and its resume hint) on the way out."""
    from pathlib import Path

    from longswift.atomic import OutputLock

    f = AtomicFile(tmp_path / "out.txt")
    f.write("text")
    lock = OutputLock([("--output", tmp_path / "out.txt")])
    lock.__enter__()

    def refused(self, missing_ok=False):
        raise PermissionError(errno.EPERM, "Operation not permitted", str(self))

    monkeypatch.setattr(Path, "unlink", refused)
    f.discard()  # best effort: no error of its own
    lock.release()
    monkeypatch.undo()
    assert lock._held == []


def test_an_output_where_no_file_can_be_created_is_refused_before_loading(capsys, no_loading):
    """/proc says it is writable to root: the check creates a file to find out."""
    code, _, err = run_cli(capsys, "generate", "--prompt", "hi", "--output", "/proc/version")
    assert_one_line_error(code, err, "cannot write '/proc/version'")


@pytest.mark.parametrize("args,match", [
    (["--format", "longswift", "--out", "/nonexistent-dir/h.safetensors"], "directory '/nonexistent-dir' does not exist"),
    (["--format", "longswift", "--out", "/proc/h.safetensors"], "cannot write '/proc/h.safetensors'"),
    (["--format", "longswift", "--out", "h.bin"], "must end in .safetensors"),
    (["--format", "tokenswift", "--out", "/proc/released"], "cannot write --out '/proc/released'"),
    (["--format", "tokenswift", "--out", "FILE"], "is a file, and --out here is a new directory"),
    (["--out", "FILE"], "is a file, and --out here is a new directory"),  # no .safetensors: the released layout
    (["--out", "/dev/null"], "'/dev/null' is a device, pipe or socket, and --out here is a new directory"),
    (["--format", "tokenswift", "--out", "x.safetensors"], "--format tokenswift writes a directory, and --out "
                                                           "'x.safetensors' names a file: give a directory name, or "
                                                           "drop --format for one heads file"),
    (["--out", "x.bin"], "--format tokenswift writes a directory, and --out 'x.bin' names a file: give a directory "
                         "name"),  # (made a directory named x.bin)
    (["--format", "tokenswift", "--out", "x.SAFETENSORS"], "names a file: give a directory name, or drop --format "
                                                           "for one heads file"),  # (the suffix in capitals)
    (["--format", "longswift", "--out", "/nonexistent-dir/h.SafeTensors"], "directory '/nonexistent-dir' does not "
                                                                           "exist"),  # (was: "must end in .safetensors")
    (["--heads", "/nonexistent/h.safetensors", "--out", "x.safetensors"], "heads file '/nonexistent/h.safetensors' "
                                                                           "does not exist"),
])
def test_export_heads_checks_its_output_before_loading(capsys, tmp_path, no_loading, args, match):
    (tmp_path / "file").write_text("")
    code, _, err = run_cli(capsys, "export-heads", *[str(tmp_path / "file") if a == "FILE" else a for a in args])
    assert_one_line_error(code, err, match)


@pytest.mark.parametrize("command,name", [("export-heads", "h\xff.safetensors"), ("export-heads", "released\xff"),
                                          ("train-heads", "run\xff")])
def test_heads_outputs_at_paths_safetensors_cannot_open_are_refused(capsys, tmp_path, no_loading, command, name):
    """A name of bytes that are not UTF-8 (Latin-1, as Python hands it over): safetensors writes a heads file there
    but opens none, so the heads could not be read back (they were written, then refused as unreadable); refused
    before loading, nothing made."""
    out = str(tmp_path / name.encode("latin-1").decode("utf-8", "surrogateescape"))
    code, _, err = run_cli(capsys, command, "--heads" if command == "export-heads" else "--data",
                           "random" if command == "export-heads" else str(tmp_path), "--out", out)
    assert_one_line_error(code, err, "is not a UTF-8 path: safetensors files there could be written but not read back")
    assert list(tmp_path.iterdir()) == []


def test_a_heads_file_at_a_path_safetensors_cannot_open_says_so(tmp_path):
    """One already there (renamed by hand): the error names the path as the reason, not the file as damaged."""
    from longswift.spec.heads import load_heads, new_heads, save_heads

    engine = longswift.load(tiny_hf_model("llama", "default"), heads="random")
    path = tmp_path / b"h\xe9.safetensors".decode("utf-8", "surrogateescape")
    save_heads(new_heads(engine.cfg, engine.model.state), engine.cfg, engine.fingerprint, path)
    with pytest.raises(LongswiftError, match=r"safetensors opens no file whose path is not UTF-8; rename the file"):
        load_heads(path, engine.cfg, engine.model.embed)


def test_an_exported_directory_appears_whole_or_not_at_all(tmp_path):
    out = tmp_path / "nested" / "released"

    def write(tmp):
        (tmp / "model.safetensors").write_bytes(b"x" * 10)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        write_dir_atomically(out, write)
    assert list(tmp_path.iterdir()) == []  # nor the parent made for it
    write_dir_atomically(out, lambda tmp: (tmp / "config.json").write_text("{}"))
    assert [p.name for p in out.iterdir()] == ["config.json"]
    with pytest.raises(LongswiftError, match="is a directory that is not empty"):
        write_dir_atomically(out, lambda tmp: None)


def _writer_that_hangs(out: Path, ready: Path) -> subprocess.Popen:
    """A process in the middle of write_dir_atomically(out): it has written a file, and waits."""
    code = ("import sys, time; from pathlib import Path; from longswift.atomic import write_dir_atomically\n"
            "def write(tmp):\n"
            "    (tmp / 'model.safetensors').write_bytes(b'x' * 1000)\n"
            "    Path(sys.argv[2]).write_text('')\n"
            "    time.sleep(120)\n"
            "write_dir_atomically(sys.argv[1], write)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(out), str(ready)])
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the writer did not start"
        time.sleep(0.05)
    return proc


@pytest.mark.skipif(sys.platform == "win32", reason="no flock")
@pytest.mark.parametrize("existing", [False, True])
def test_a_killed_exports_temporary_directory_is_removed_by_the_next_one(tmp_path, existing):
    """kill -9 (or a power cut) during an export leaves its `.longswift-*.partial` directory (gigabytes for a
    large model): the next export in the same place removes it and says so, but never a live writer's
    directory, nor a directory that only looks like one."""
    out = tmp_path / "released"
    if existing:
        out.mkdir()
    where = out if existing else tmp_path

    def partial() -> set[Path]:
        return {d for d in tmp_path.rglob(".longswift-*.partial")}

    alive = _writer_that_hangs(tmp_path / "other", tmp_path / "ready1")  # (writing into `out` would refuse the rest)
    try:
        live = partial()
        killed = _writer_that_hangs(out, tmp_path / "ready2")
        killed.kill()
        killed.wait()
        (stale,) = partial() - live
        assert stale.parent == where and (stale / "model.safetensors").exists()
        lookalike = tmp_path / ".longswift-mine.partial"  # the user's own, without a writer's mark (swept past
        # where out is new; inside an existing out it is an entry of the user's, which refuses the export)
        lookalike.mkdir()
        heard: list[Path] = []
        write_dir_atomically(out, lambda tmp: (tmp / "config.json").write_text("{}"), heard.append)
        assert heard == [stale] and not stale.exists()
        assert sorted(p.name for p in out.iterdir() if p != lookalike) == ["config.json"]  # without the mark
        assert lookalike.is_dir() and partial() == live | {lookalike}
        assert alive.poll() is None
    finally:
        alive.kill()
        alive.wait()


def test_an_export_into_an_existing_empty_directory_keeps_that_directory(tmp_path, monkeypatch):
    """The working directory, a symlink to a directory or a mount point cannot be renamed over:
    their files are moved in one by one, and taken back if a later step fails."""
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)

    def two_files(tmp):
        (tmp / "config.json").write_text("{}")
        (tmp / "tokenizer").mkdir()
        (tmp / "tokenizer" / "vocab.txt").write_text("a")

    write_dir_atomically(tmp_path / "link", two_files)
    assert (tmp_path / "link").is_symlink() and sorted(p.name for p in target.iterdir()) == ["config.json", "tokenizer"]
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    inode = here.stat().st_ino
    real_replace = os.replace

    def fail_on_second(src, dst):
        if Path(dst).name == "tokenizer":
            raise OSError(errno.ENOSPC, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", fail_on_second)
    with pytest.raises(OSError, match="No space left"):
        write_dir_atomically(".", two_files)
    assert list(here.iterdir()) == []  # config.json, moved first, is taken back
    monkeypatch.setattr(os, "replace", real_replace)
    write_dir_atomically(".", two_files)
    assert here.stat().st_ino == inode and sorted(p.name for p in here.iterdir()) == ["config.json", "tokenizer"]


@pytest.mark.parametrize("flag", ["--output", "--json"])
def test_an_output_linked_to_a_stream_is_refused_not_replaced(tmp_path, capsys, no_loading, flag):
    """/dev/stdout is a link to /proc/self/fd/1: renaming a file over such a link (as root) replaced
    the link and wrote nothing to the stream."""
    for name, target in (("out", "/proc/self/fd/1"), ("null", "/dev/null")):
        link = tmp_path / name
        link.symlink_to(target)
        code, _, err = run_cli(capsys, "generate", "--prompt", "hi", flag, str(link))
        assert_one_line_error(code, err, f"output path '{link}' leads to a stream or device")
        assert link.is_symlink() and os.readlink(link) == target


def test_a_linked_output_is_written_through_its_link(tmp_path):
    """A plain open() writes a symbolic link's target; an atomic write must too, keeping the link
    (renaming over the link replaced it with a file and left the target as it was)."""
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "out.txt"
    target.write_text("old")
    link = tmp_path / "out.txt"
    link.symlink_to(Path("real") / "out.txt")
    assert check_writable(link) == target.resolve()
    write_atomic(link, "new text")
    assert link.is_symlink() and target.read_text() == "new text"
    replace_atomically(link, lambda tmp: tmp.write_text("replaced"))
    assert link.is_symlink() and target.read_text() == "replaced"
    dangling = tmp_path / "later.txt"
    dangling.symlink_to(tmp_path / "real" / "new.txt")  # a link to a file not yet there: created, as open() does
    write_atomic(dangling, "x")
    assert dangling.is_symlink() and (tmp_path / "real" / "new.txt").read_text() == "x"
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["new.txt", "out.txt"]  # no temp file left


def test_files_written_through_the_api_never_replace_a_device_or_pipe(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(LongswiftError, match="is not a regular file"):
        replace_atomically(fifo, lambda tmp: tmp.write_text("x"))
    assert stat.S_ISFIFO(fifo.stat().st_mode) and [p.name for p in tmp_path.iterdir()] == ["pipe"]


def test_discarding_a_temp_file_on_a_full_disk_still_removes_it(tmp_path):
    f = AtomicFile(tmp_path / "out.txt")
    f.write("some text")
    real = f.file

    class FullDisk:
        closed = False

        def close(self):
            real.close()
            raise OSError(errno.ENOSPC, "No space left on device")

    f.file = FullDisk()
    f.discard()
    assert list(tmp_path.iterdir()) == []


def test_a_system_error_while_running_is_one_line_with_its_reason(capsys, monkeypatch):
    def full(args):
        raise OSError(errno.ENOSPC, "No space left on device", "/data/story.txt")

    monkeypatch.setattr("longswift.cli.info.cmd_info", full)
    code, _, err = run_cli(capsys, "info")
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, err
    assert lines[0] == ("longswift: error: [Errno 28] No space left on device: '/data/story.txt' "
                        "(--debug shows where)")


def test_text_that_stdout_cannot_take_says_it_was_stdout(tmp_path, capsys, monkeypatch):
    """`longswift generate > /dev/full`: the line named no file ('[Errno 28] No space left on device')."""
    tiny_hf_model("llama", seed=9).save_pretrained(tmp_path / "m")

    class FullStdout:
        encoding = "utf-8"

        def isatty(self):
            return False

        def write(self, text):
            return len(text)

        def flush(self):
            raise OSError(errno.ENOSPC, "No space left on device")

    capsys.readouterr()
    monkeypatch.setattr(sys, "stdout", FullStdout())
    code, _, err = run_cli(capsys, "generate", "--model", str(tmp_path / "m"), "--prompt-ids", "3,4,5",
                           "--max-new-tokens", "4", "--greedy", "--ignore-eos", "--no-progress", "--heads", "none")
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, err
    assert lines[0] == ("longswift: error: [Errno 28] cannot write the text to stdout: No space left on device "
                        "(--debug shows where)"), err


@pytest.mark.parametrize("argv,what", [
    (("bench", "--json", "-"), "output path '-' would write a file"),
    (("bench", "--out", "-"), "output path '-' would write a file"),
    (("bench", "--out-dir", "-"), "--out-dir '-' would write a directory"),
    (("bench-steps", "--shape", "smollm2-135m", "--json", "-"), "output path '-' would write a file"),
    (("eval-heads", "--heads", "random", "--json", "-"), "output path '-' would write a file"),
    (("export-heads", "--heads", "random", "--out", "-"), "--out '-' would write a directory"),
    (("train-heads", "--out", "-"), "--out '-' would write a directory"),
])
def test_a_dash_for_an_output_is_refused_not_written_under_that_name(tmp_path, monkeypatch, capsys, no_loading,
                                                                     argv, what):
    """'-' means stdout to a shell user; only generate refused it, and other commands wrote a file
    (or directory) named '-'."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, *argv)
    assert_one_line_error(code, err, f"{what} named '-'")
    assert list(tmp_path.iterdir()) == []


def test_check_writable_creates_nothing(tmp_path):
    check_writable(tmp_path / "a.txt")
    assert list(tmp_path.iterdir()) == []


# ---- contradictions and refusals that came late or not at all ----------------------------------------

@pytest.mark.parametrize("flags,value", [(["--temperature", "0.7"], "0.7"), (["--temp=1"], "1.0")])
def test_greedy_with_a_sampling_temperature_is_a_contradiction(capsys, no_loading, flags, value):
    code, _, err = run_cli(capsys, "generate", "--prompt", "hi", "--greedy", *flags)
    assert_one_line_error(code, err, f"--greedy means --temperature 0, but --temperature {value} was given")


def test_info_refuses_zero_tokens_and_missing_heads(capsys, tmp_path):
    code, _, err = run_cli(capsys, "info", "--tokens", "0")
    assert_one_line_error(code, err, "--tokens must be a positive number of tokens, got 0")
    tiny_hf_model("llama", seed=9).save_pretrained(tmp_path / "m")
    capsys.readouterr()
    missing = tmp_path / "nothing.safetensors"
    code, out, err = run_cli(capsys, "info", "--model", str(tmp_path / "m"), "--heads", str(missing))
    assert_one_line_error(code, err, f"heads '{missing}' do not exist")
    assert out == ""  # refused before the config is printed


def test_info_without_heads_plans_an_ar_run(capsys, tmp_path):
    tiny_hf_model("llama", seed=9).save_pretrained(tmp_path / "m")
    capsys.readouterr()
    code, out, err = run_cli(capsys, "info", "--model", str(tmp_path / "m"), "--heads", "none", "--tokens", "200")
    assert code == 0, err
    assert "draft heads: none (AR)" in out and "memory plan for 200 tokens with AR in float32" in out
    assert "draft KV cache" not in out and "TokenSwift" not in out
    # The process's own memory is named beside the plan: a figure between 50 MiB and 8 GiB (torch alone is more
    # than the first; this test's process far less than the second).
    held = re.search(r"not in the plan: the process itself .* holds ([0-9.]+) GiB now", out)
    assert held and 0.05 < float(held.group(1)) < 8, out
    code, out, err = run_cli(capsys, "info", "--model", str(tmp_path / "m"), "--heads", "random", "--tokens", "200")
    assert code == 0 and "memory plan for 200 tokens with TokenSwift (tree 1,1,1" in out, err


def test_bench_outputs_that_are_one_file_are_refused_before_loading(tmp_path, capsys, no_loading):
    grid = tmp_path / "grid"
    grid.mkdir()  # (a grid run before: its results would be overwritten)
    same = str(tmp_path / "same")
    for flags, match in ((["--out", str(grid / "results.jsonl")],
                          "--out and --out-dir's results.jsonl are the same file"),
                         (["--json", str(grid / "report.md")], "--json and --out-dir's report.md are the same file"),
                         (["--out", same, "--json", same], "--out and --json are the same file")):
        code, _, err = run_cli(capsys, "bench", "--methods", "ar", "--out-dir", str(grid), *flags)
        assert_one_line_error(code, err, match)
    code, _, err = run_cli(capsys, "bench-steps", "--shape", "smollm2-135m", "--out", same, "--json", same)
    assert_one_line_error(code, err, "--out and --json are the same file")
    assert list(tmp_path.iterdir()) == [grid] and list(grid.iterdir()) == []


def test_a_prompt_that_alone_fills_the_context_is_told_to_shrink(capsys):
    from longswift.runtime.memory import check_context

    cfg = longswift.load(tiny_hf_model("llama", seed=9), dtype="float32", heads=None).cfg  # context 256
    with pytest.raises(LongswiftError, match=r"= 266 exceeds this model's context of 256 tokens: shorten the "
                                             r"prompt, or extend"):
        check_context(cfg, 256, 10)
    with pytest.raises(LongswiftError) as info:
        check_context(cfg, 200, 100)
    assert str(info.value) == ("prompt (200 tokens) + max_new_tokens=100 = 300 exceeds this model's context of 256 "
                               "tokens: lower max_new_tokens, or extend the context on purpose with "
                               "load(..., rope_scaling='yarn:2')")
    assert info.value.cli_message == ("prompt (200 tokens) + --max-new-tokens 100 = 300 exceeds this model's context "
                                      "of 256 tokens: lower --max-new-tokens, or extend the context on purpose with "
                                      "--rope-scaling yarn:2")
    with pytest.raises(LongswiftError) as info:  # a resumed run keeps its checkpoint's rope: no scaling advised
        check_context(cfg, 200, 100, rescalable=False)
    assert str(info.value).endswith("256 tokens: lower max_new_tokens")


def test_a_context_past_the_runs_own_rope_scaling_is_told_a_larger_factor(capsys):
    """A run given --rope-scaling yarn:2 that still does not fit was told only to shorten it: the same kind with a
    factor that reaches, counted from the trained context, is advised; a model's own scaling still gets none."""
    from longswift.runtime.memory import check_context

    engine = longswift.load(tiny_hf_model("llama", seed=9), dtype="float32", heads=None, rope_scaling="yarn:2")
    assert engine.cfg.context_limit == 512  # trained 256
    with pytest.raises(LongswiftError) as info:
        engine.generate([3, 4, 5], max_new_tokens=700, method="ar")
    assert str(info.value) == ("prompt (3 tokens) + max_new_tokens=700 = 703 exceeds this model's context of 512 "
                               "tokens: lower max_new_tokens, or extend the context on purpose with "
                               "load(..., rope_scaling='yarn:3')")
    with pytest.raises(LongswiftError) as info:
        check_context(engine.cfg, 3, 700, applied="linear:2")
    assert info.value.cli_message.endswith("--max-new-tokens, or extend the context on purpose with "
                                           "--rope-scaling linear:3")
    with pytest.raises(LongswiftError) as info:  # the model's own scaling (none given): only shorter
        check_context(engine.cfg, 3, 700)
    assert str(info.value).endswith("512 tokens: lower max_new_tokens or shorten the prompt")


def test_a_run_that_could_not_save_an_interrupt_here_warns_as_it_starts(tmp_path, capsys, monkeypatch):
    """Without --checkpoint, an interrupted run saves its state in the working directory (or beside
    --output/--json). Where that cannot be written, the run still goes on (its text goes to stdout),
    but says so at once and how to make it resumable. (A read-only directory, as root sees it, is
    writable: the check is made to fail for that one path.)"""
    import longswift.atomic as atomic

    tiny_hf_model("llama", seed=9).save_pretrained(tmp_path / "m")
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    real = atomic.check_writable

    def read_only_here(path):
        if Path(path).parent == tmp_path:
            raise LongswiftError(f"cannot write '{path}': directory '{tmp_path}' is not writable")
        return real(path)

    monkeypatch.setattr(atomic, "check_writable", read_only_here)
    code, out, err = run_cli(capsys, "generate", "--model", str(tmp_path / "m"), "--prompt-ids", "3,4,5",
                             "--max-new-tokens", "4", "--greedy", "--ignore-eos", "--no-progress", "--heads", "none")
    assert code == 0 and len(out.split()) == 4, err
    assert (f"longswift: warning: cannot write '{tmp_path / 'longswift.checkpoint.json'}': directory '{tmp_path}' "
            "is not writable, where an interrupted run saves its state: give --checkpoint FILE") in err


def test_a_bench_where_no_method_can_run_is_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # not installed
    tiny_hf_model("llama", seed=10).save_pretrained(tmp_path / "m")
    capsys.readouterr()
    code, _, err = run_cli(capsys, "bench", "--model", str(tmp_path / "m"), "--methods", "llamacpp,llamacpp-pld",
                           "--lengths", "4", "--prefix", "8", "--presets", "greedy")
    assert code == 2 and err.strip().splitlines()[-1].startswith("longswift: error: none of the methods can run here: "
                                                                  "llamacpp: "), err


@pytest.mark.parametrize("case", ["resume", "file", "unwritable", "finished", "done"])
def test_train_heads_checks_its_out_before_loading_and_creates_nothing(capsys, tmp_path, no_loading, case):
    out = Path("/proc/longswift-heads") if case == "unwritable" else tmp_path / "heads"
    if case == "file":
        out.write_text("a file")
    if case in ("finished", "done"):  # a finished run's heads (and, done, its checkpoint): never trained over
        out.mkdir()
        (out / "heads.safetensors").write_text("heads")
    if case == "done":  # not 'pass --resume to continue it': there is nothing left to continue
        (out / "checkpoint.pt").write_text("checkpoint")
    code, _, err = run_cli(capsys, "train-heads", "--out", str(out), "--data", str(tmp_path),
                           *(["--resume"] if case == "resume" else []))
    match = {"resume": "nothing to resume", "file": f"--out '{out}' is a file: give a directory",
             "unwritable": f"cannot write --out '{out}': cannot create entries in '/proc'",
             "finished": f"'{out / 'heads.safetensors'}' exists (the heads of a finished run)",
             "done": f"'{out}' holds a finished run (heads.safetensors and its checkpoint.pt): choose another"}[case]
    assert_one_line_error(code, err, match)
    assert out.exists() == (case in ("file", "finished", "done"))
    assert case != "finished" or [p.name for p in out.iterdir()] == ["heads.safetensors"]


def test_a_second_train_heads_into_a_busy_out_is_refused_before_loading(capsys, tmp_path, no_loading):
    """Another run holding --out: refused at once, not after the model loaded and the data was distilled
    and run through it (minutes); the other run's directory is left as it is."""
    from longswift.atomic import OutputLock

    (tmp_path / "a.txt").write_text("some text " * 50)
    out = tmp_path / "heads"
    out.mkdir()
    with OutputLock([("--out", out / name) for name in ("checkpoint.pt", "heads.safetensors", "train_log.json")]):
        code, _, err = run_cli(capsys, "train-heads", "--out", str(out), "--data", str(tmp_path / "a.txt"))
        assert_one_line_error(code, err, f"'{out / 'checkpoint.pt'}' is being written by another longswift run")
    assert out.is_dir() and list(out.iterdir()) == []


def test_train_heads_that_fails_before_saving_leaves_no_out(capsys, tmp_path, monkeypatch):
    """A run refused after --out was made and claimed (here the weights cannot be read) takes the
    directories it made away again: nothing was saved in them."""
    made = []

    def unreadable(*args, **kwargs):
        made.append((tmp_path / "runs" / "heads").is_dir())
        raise LongswiftError("cannot read the weights")

    monkeypatch.setattr("longswift.engine.load_model", unreadable)
    (tmp_path / "a.txt").write_text("some text " * 50)
    code, _, err = run_cli(capsys, "train-heads", "--out", str(tmp_path / "runs" / "heads"), "--data",
                           str(tmp_path / "a.txt"))
    assert_one_line_error(code, err, "cannot read the weights")
    assert made == [True] and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("case,flags,match", [
    ("settings", ["--lr", "0.1"], "used --lr 0.03, not 0.1: resume with the same settings"),
    ("settings", ["--seq-len", "64"], "used --seq-len 512, not 64: resume with the same settings"),
    ("settings", ["--dtype", "bfloat16"], "used --dtype float32, not bfloat16: resume with the same settings"),
    ("settings", ["--rope-scaling", "linear:4"], "used --rope-scaling none, not linear:4: resume with the same"),
    # a run that self-distilled (session 50: these sampled every document again, then said "other data")
    ("distilled", ["--self-distill", "1000", "--distill-batch", "16"], "used --distill-batch 32, not 16: resume with"),
    ("distilled", [], "used --self-distill 1000, not 0: resume with the same settings"),
    ("damaged", [], "it is damaged; delete it to start over"),
    ("foreign", [], "is not a longswift training checkpoint"),
])
def test_train_heads_resume_checks_its_checkpoint_before_loading(capsys, tmp_path, no_loading, case, flags, match):
    """A --resume that cannot continue (other settings, a damaged or foreign checkpoint.pt) is refused
    before the model loads and the data is distilled and run through it, not minutes later."""
    from dataclasses import asdict

    import torch

    from longswift.train.train import TrainConfig

    (tmp_path / "a.txt").write_text("some text")
    out = tmp_path / "heads"
    out.mkdir()
    state = {"format": "longswift-train", "version": 1, "config": asdict(TrainConfig()), "step": 3,
             "settings": {"dtype": "float32", "rope_scaling": None}, "heads": {}, "optimizer": {}, "data_hash": "d",
             "base": "b", "log": []}
    if case == "distilled":
        state["settings"] |= {"self_distill": 1000, "distill_new_tokens": 512, "distill_batch": 32}
    torch.save(state if case != "foreign" else {"state_dict": {}}, out / "checkpoint.pt")
    if case == "damaged":
        (out / "checkpoint.pt").write_bytes((out / "checkpoint.pt").read_bytes()[:100])
    code, _, err = run_cli(capsys, "train-heads", "--out", str(out), "--data", str(tmp_path / "a.txt"), "--resume",
                           *flags)
    assert_one_line_error(code, err, match)


@pytest.mark.parametrize("command", ["train-heads", "eval-heads"])
@pytest.mark.parametrize("flags,match", [
    ([], "no training data: pass --data FILE_OR_DIR and/or --self-distill N"),
    (["--data", "MISSING"], "--data 'MISSING' does not exist"),
    (["--data", "PIPE"], "--data 'PIPE' is a pipe or device, not a file: save the data to a file"),
    (["--data", "EMPTY"], "no text in EMPTY: the --data is empty"),
    (["--data", "BINARY"], "looks binary (it holds NUL bytes)"),
    (["--self-distill", "-5"], "--self-distill must be a number of tokens >= 0, got -5"),
    (["--self-distill", "100", "--distill-batch", "0"], "--distill-batch must be positive, got 0"),
    (["--self-distill", "100", "--distill-new-tokens", "-1"], "--distill-new-tokens must be positive, got -1"),
])
def test_heads_commands_check_their_data_before_loading(capsys, tmp_path, no_loading, command, flags, match):
    (tmp_path / "empty.txt").write_text("  \n")
    (tmp_path / "binary.txt").write_bytes(b"text\x00more")
    os.mkfifo(tmp_path / "pipe")  # what a shell's <(...) gives: it exists, and is no file (it said "does not exist")
    names = {"MISSING": tmp_path / "missing.txt", "EMPTY": tmp_path / "empty.txt", "BINARY": tmp_path / "binary.txt",
             "PIPE": tmp_path / "pipe"}
    flags = [str(names[f]) if f in names else f for f in flags]
    match = next((match.replace(k, str(v)) for k, v in names.items() if k in match), match)
    if command == "eval-heads":  # (what the data is for: "no training data" was said to eval-heads too)
        match = match.replace("no training data", "no evaluation data")
    where = ["--out", str(tmp_path / "heads")] if command == "train-heads" else ["--heads", "default"]
    code, _, err = run_cli(capsys, command, *where, *flags)
    assert_one_line_error(code, err, match)
    assert not (tmp_path / "heads").exists()


@pytest.mark.parametrize("flags,match", [
    (["--seq-len", "1"], "--seq-len must be at least 2, got 1"),
    (["--heads", "missing.safetensors"], "heads file 'missing.safetensors' does not exist"),
])
def test_eval_heads_checks_its_window_and_heads_before_loading(capsys, tmp_path, no_loading, flags, match):
    (tmp_path / "a.txt").write_text("some text")
    code, _, err = run_cli(capsys, "eval-heads", "--heads", "default", "--data", str(tmp_path / "a.txt"), *flags)
    assert_one_line_error(code, err, match)


@pytest.mark.parametrize("target", ["heads", "heads dir", "data"])
def test_eval_heads_json_never_overwrites_its_inputs(capsys, tmp_path, no_loading, target):
    """--json written over the heads file (or a --data file) would destroy the trained heads."""
    (tmp_path / "a.txt").write_text("some text")
    heads = tmp_path / "run" / "heads.safetensors"
    heads.parent.mkdir()
    heads.write_bytes(b"trained heads")
    json_path = {"heads": heads, "heads dir": heads, "data": tmp_path / "a.txt"}[target]
    given = heads.parent if target == "heads dir" else heads
    code, _, err = run_cli(capsys, "eval-heads", "--heads", str(given), "--data", str(tmp_path / "a.txt"),
                           "--json", str(json_path))
    flag = "--data" if target == "data" else "--heads"
    assert_one_line_error(code, err, f"{flag} and --json are the same file")
    assert heads.read_bytes() == b"trained heads"


@pytest.mark.parametrize("command", ["generate", "eval-heads", "info"])
def test_heads_dir_of_an_unfinished_training_run_says_so(capsys, tmp_path, no_loading, command):
    """--heads at a train-heads --out that was interrupted (checkpoint.pt, no heads.safetensors yet) says
    the training did not finish and how to continue it, before loading; not that it lacks config.json
    (nor, for info, that it is a released checkpoint)."""
    (tmp_path / "a.txt").write_text("some text")
    out = tmp_path / "run"
    out.mkdir()
    (out / "checkpoint.pt").write_bytes(b"a training checkpoint")
    extra = {"generate": ["--prompt", "Hi"], "eval-heads": ["--data", str(tmp_path / "a.txt")], "info": []}[command]
    code, _, err = run_cli(capsys, command, "--heads", str(out), *extra)
    assert_one_line_error(code, err, f"'{out}' holds a train-heads checkpoint.pt but no heads.safetensors: its "
                                     f"training did not finish; continue it with `longswift train-heads --out {out} "
                                     "--resume`")


def test_a_training_checkpoint_given_as_heads_says_what_it_is(tmp_path):
    """--heads DIR/checkpoint.pt said "header too large; it is truncated or not a heads file"."""
    import torch

    from longswift.spec.heads import load_heads

    torch.save({"format": "longswift-train", "step": 3}, tmp_path / "checkpoint.pt")
    with pytest.raises(LongswiftError, match="checkpoint.pt' is a train-heads training checkpoint, not heads: pass "
                                             "the run's heads.safetensors"):
        load_heads(tmp_path / "checkpoint.pt", None, None)
    (tmp_path / "other.pt").write_bytes((tmp_path / "checkpoint.pt").read_bytes())  # renamed: what it may be
    with pytest.raises(LongswiftError, match=r"other.pt' is a torch.save file \(a renamed train-heads "
                                             r"checkpoint.pt\?\), not a safetensors heads file: pass the "
                                             "heads.safetensors"):
        load_heads(tmp_path / "other.pt", None, None)
    (tmp_path / "other.safetensors").write_bytes(b"\x08" + bytes(40))  # not a zip: as before
    with pytest.raises(LongswiftError, match="it is truncated or not a heads file"):
        load_heads(tmp_path / "other.safetensors", None, None)


@pytest.mark.parametrize("command", ["train-heads", "eval-heads"])
def test_heads_commands_refuse_windows_beyond_the_context_before_loading(capsys, tmp_path, no_loading, command):
    """--seq-len beyond the model's context trained (minutes of work) on hidden states generation never
    produces; refused from the config, before the weights load."""
    from conftest import tiny_hf_model

    model = tmp_path / "tiny"
    tiny_hf_model("llama", seed=5).save_pretrained(model)  # context 256
    (tmp_path / "a.txt").write_text("some text")
    where = ["--out", str(tmp_path / "o")] if command == "train-heads" else ["--heads", "random"]
    capsys.readouterr()
    code, _, err = run_cli(capsys, command, "--model", str(model), *where, "--data", str(tmp_path / "a.txt"),
                           "--seq-len", "300")
    assert_one_line_error(code, err, "--seq-len 300 exceeds this model's context of 256 tokens")
    with pytest.raises(AssertionError, match="the model was loaded"):  # extended on purpose: on to loading
        run_cli(capsys, command, "--model", str(model), *where, "--data", str(tmp_path / "a.txt"),
                "--seq-len", "300", "--rope-scaling", "yarn:2")


@pytest.mark.parametrize("command", ["train-heads", "eval-heads"])
def test_heads_commands_refuse_windows_past_a_sliding_attention_window(capsys, tmp_path, monkeypatch, command):
    """A mistral with a 16-token sliding window trained heads on 48-token windows attended in full (98% off the
    model's own hidden states past the window): refused from the config by the command line, and by the
    library's hidden-state pass for API callers."""
    from conftest import tiny_hf_model

    from longswift.train.train import base_hidden, window_hidden

    model = tmp_path / "tiny"
    tiny_hf_model("mistral", seed=5, sliding_window=16).save_pretrained(model)
    (tmp_path / "a.txt").write_text("some text")
    where = ["--out", str(tmp_path / "o")] if command == "train-heads" else ["--heads", "random"]
    engine = longswift.load(str(model), dtype="float32", heads=None)  # (before the loader is stubbed)
    windows = torch.zeros(2, 17, dtype=torch.long)
    for compute in (base_hidden, lambda m, w: next(window_hidden(m, w))):
        with pytest.raises(LongswiftError, match="windows of 17 tokens pass this model's sliding attention window "
                                                 "of 16 tokens, which longswift does not implement"):
            compute(engine.model, windows)
    assert base_hidden(engine.model, windows[:, :16]).shape == (2, 16, 64)
    def loader(*args, **kwargs):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr("longswift.engine.load_model", loader)
    capsys.readouterr()
    code, _, err = run_cli(capsys, command, "--model", str(model), *where, "--data", str(tmp_path / "a.txt"),
                           "--seq-len", "17")
    assert_one_line_error(code, err, "windows of 17 tokens pass this model's sliding attention window of 16 tokens")


def test_bench_checks_its_out_dir_before_loading(capsys, no_loading):
    code, _, err = run_cli(capsys, "bench", "--out-dir", "/proc/longswift-bench", "--methods", "ar")
    assert_one_line_error(code, err, "cannot write --out-dir '/proc/longswift-bench'")


def test_bench_configs_refuse_seeds_through_the_api_too():
    from longswift.bench.grid import BenchConfig
    from longswift.bench.steps import StepBenchConfig

    with pytest.raises(LongswiftError, match="--seed must be between"):
        BenchConfig(seed=SEED_MAX + 1)
    with pytest.raises(LongswiftError, match="--seed must be between"):
        StepBenchConfig(shape="tiny", seed=SEED_MIN - 1)


def test_a_training_checkpoint_on_a_full_disk_is_a_system_error_and_leaves_nothing(tmp_path, monkeypatch):
    engine = longswift.load(tiny_hf_model("llama", seed=11), dtype="float32", heads=None)
    windows = torch.randint(3, 100, (4, 12))
    cfg = TrainConfig(seq_len=12, batch_size=2, steps=1, warmup=0, chunk=16)
    trainer = HeadTrainer(engine, windows, base_hidden(engine.model, windows), cfg)

    def full(obj, f):
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0\nmore")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(OSError, match="cannot write the checkpoint .*: \\[enforce fail"):
        trainer.save_checkpoint(tmp_path / "checkpoint.pt")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_held_out_runs_longer_than_the_context_are_refused_naming_their_flag(embedded):
    from longswift.train.distill import self_distill
    from longswift.train.eval import check_alpha_fits

    limit = embedded.cfg.context_limit
    check_alpha_fits(embedded, 1024)
    with pytest.raises(LongswiftError, match=f"--alpha-tokens {limit} \\+ the held-out prompt's .* exceed this "
                                             f"model's context of {limit}: lower --alpha-tokens"):
        check_alpha_fits(embedded, limit)
    with pytest.raises(LongswiftError, match=f"--distill-new-tokens {limit} \\+ the longest prompt's .* tokens "
                                             f"exceed this model's context of {limit}"):
        self_distill(embedded, 10, new_tokens=limit, cache_dir=None, progress=False)


@pytest.mark.parametrize("flags, match", [(["--lengths", "8,16,8"], "--lengths lists 8 twice"),
                                          (["--new-tokens", "8", "--prefix", "16,16"], "--prefix lists 16 twice"),
                                          (["--presets", "greedy,paper,greedy"], "--presets lists greedy twice")])
def test_a_bench_grid_value_given_twice_is_refused_before_loading(flags, match, capsys, no_loading):
    """A repeated --lengths/--prefix/--presets value made the same cells run twice under one key,
    reported as two runs of a `--runs 1` grid."""
    code, _, err = run_cli(capsys, "bench", "--methods", "ar", *flags)
    assert_one_line_error(code, err, match)


@pytest.mark.parametrize("flags, match", [
    (["--prompt-file", "P.jsonl", "--prefix", "32,64"], "--prefix sets prompt lengths, but a .jsonl file's prompts are"),
    (["--prompt-file", "P.txt", "--chat", "--prompt-tokens", "32"], "--prompt-tokens sets prompt lengths, but a chat"),
    (["--chat"], "--chat sends a prompt file through the chat template: give --prompt-file"),
    (["--fresh"], "--fresh discards the results in --out-dir: give --out-dir"),
    (["--prompt-file", "P.JSONL", "--prefix", "32"], "--prefix sets prompt lengths, but a .jsonl file's prompts are"),
    (["--sampling", "greedy,paper"], "--sampling takes a single preset; got 'greedy,paper': give several with "
                                     "--presets"),
])
def test_bench_flags_that_would_be_dropped_are_refused(flags, match, capsys, no_loading, tmp_path):
    """They ran, recorded (--chat in config.json) or were ignored without a word (found by review)."""
    (tmp_path / "P.jsonl").write_text('{"id": "a", "prompt": "hi"}\n')
    (tmp_path / "P.JSONL").write_text('{"id": "a", "prompt": "hi"}\n')  # (read as one text prompt, its suffix upper)
    (tmp_path / "P.txt").write_text("hi")
    flags = [str(tmp_path / f) if f.startswith("P.") else f for f in flags]
    code, _, err = run_cli(capsys, "bench", "--methods", "ar", *flags)
    assert_one_line_error(code, err, match)


@pytest.mark.parametrize("flags, match", [(["--methods", ","], "--methods is empty: choose from ar, "),
                                          (["--methods", "ar", "--presets", ","], "--presets is empty: choose from "),
                                          (["--methods", "ar", "--sampling", " "], "--presets is empty: choose from ")])
def test_an_empty_bench_list_is_refused_naming_it(flags, match, capsys, no_loading):
    """--presets ',' ran the default greedy preset silently; --methods ',' said "unknown bench method(s) []"."""
    code, _, err = run_cli(capsys, "bench", *flags)
    assert_one_line_error(code, err, match)


@pytest.mark.parametrize("argv", [["generate", "--prompt-file", ""], ["generate", "--resume", " "],
                                  ["export-heads", "--out", ""], ["train-heads", "--data", "d.txt", "--out", ""],
                                  ["bench", "--out-dir", ""], ["bench", "--prompt-file", ""]])
def test_an_empty_path_is_refused_not_taken_for_the_current_directory(argv, capsys, no_loading):
    """Path("") is ".": train-heads --out "" (an unset variable) trained into the current directory, bench --out-dir ""
    wrote its results there, --prompt-file "" read '.' and said it was a directory."""
    code, _, err = run_cli(capsys, *argv)
    flag = next(a for a in argv if a.startswith("--") and argv[argv.index(a) + 1].strip() == "")
    assert_one_line_error(code, err, f"argument {flag}: is empty (an unset variable?): give a path")


def test_a_tree_is_written_one_way():
    """'1, 1,1' and '1,1,1' were two bench ablations of one configuration (the label held the text as given)."""
    assert SpecConfig(tree=" 1, 1,1").tree == "1,1,1" and SpecConfig(tree="auto").tree == "auto"


def test_a_disk_that_fills_mid_run_says_which_checkpoint_is_intact(tmp_path, capsys, monkeypatch):
    """A periodic checkpoint that cannot be written (the disk filled hours into a run) stops the run
    with one line that names the file and says which checkpoint is intact and how to continue; the
    earlier --output stays, no temp file is left, and that continuation gives the uninterrupted tokens.
    (The line used to be '[Errno 28] No space left on device', naming neither.)"""
    tiny_hf_model("llama", seed=9).save_pretrained(tmp_path / "m")
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    run = ["generate", "--model", str(tmp_path / "m"), "--prompt-ids", "3,4,5", "--max-new-tokens", "40", "--greedy",
           "--ignore-eos", "--no-progress", "--heads", "none"]
    code, _, err = run_cli(capsys, *run, "--json", "whole.json")
    assert code == 0, err
    whole = json.loads((tmp_path / "whole.json").read_text())["token_ids"]
    (tmp_path / "out.txt").write_text("an earlier run's text")
    real, saves, failing = AtomicFile.write, [], [4]

    class FullDisk:
        def __init__(self, file):
            self.file, self.write, self.close = file, file.write, file.close

        def flush(self):
            raise OSError(errno.ENOSPC, "No space left on device")  # as a flush says it: no file name

    def full_from_a_checkpoint_on(self, text):
        if self.path.name == "ck.json":
            saves.append(self.path)
            if len(saves) >= failing[0]:
                self.file = FullDisk(self.file)
        real(self, text)

    monkeypatch.setattr(AtomicFile, "write", full_from_a_checkpoint_on)
    code, _, err = run_cli(capsys, *run, "--output", "out.txt", "--json", "out.json", "--checkpoint", "ck.json",
                           "--checkpoint-every", "5")
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, err
    assert lines[0] == (f"longswift: error: [Errno 28] No space left on device: '{tmp_path / 'ck.json'}'; the "
                        "checkpoint saved at 15 tokens is intact: continue with: longswift generate --resume ck.json "
                        "(--debug shows where)")
    assert (tmp_path / "out.txt").read_text() == "an earlier run's text"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck.json", "m", "out.txt", "whole.json"]
    saves.clear()  # a continuation that fails at its first checkpoint: the one it resumed is the intact one
    failing[0] = 1
    code, _, err = run_cli(capsys, "generate", "--resume", "ck.json", "--no-progress", "--checkpoint-every", "1")
    assert code == 1 and err.strip().splitlines()[-1].endswith(
        "; the checkpoint saved at 15 tokens is intact: continue with: longswift generate --resume ck.json "
        "(--debug shows where)"), err
    monkeypatch.setattr(AtomicFile, "write", real)
    code, _, err = run_cli(capsys, "generate", "--resume", "ck.json", "--no-progress")
    assert code == 0, err
    assert json.loads((tmp_path / "out.json").read_text())["token_ids"] == whole


def test_a_checkpoint_directory_made_read_only_mid_run_is_a_system_error(tmp_path, capsys, monkeypatch):
    """A review of atomic.py: a periodic checkpoint refused by the checks the run's start had passed (its directory
    made read-only since) exited with status 2, a bad input's, where README says status 1 (a full disk's)."""
    import longswift.atomic as atomic

    tiny_hf_model("llama", seed=9).save_pretrained(tmp_path / "m")
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    real, saves = atomic.check_writable, []

    def read_only_from_the_third_save(path, flag=None):
        if Path(path).name == "ck.json":
            saves.append(path)
            if len(saves) >= 4:  # (the first: the start's check)
                raise LongswiftError(f"cannot write '{path}': directory '{tmp_path}' is not writable")
        return real(path, flag)

    monkeypatch.setattr(atomic, "check_writable", read_only_from_the_third_save)
    code, _, err = run_cli(capsys, "generate", "--model", str(tmp_path / "m"), "--prompt-ids", "3,4,5",
                           "--max-new-tokens", "40", "--greedy", "--ignore-eos", "--no-progress", "--heads", "none",
                           "--checkpoint", "ck.json", "--checkpoint-every", "5")
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, err
    assert lines[0] == (f"longswift: error: cannot write '{tmp_path / 'ck.json'}': directory '{tmp_path}' is not "
                        "writable; the checkpoint saved at 10 tokens is intact: continue with: longswift generate "
                        "--resume ck.json (--debug shows where)")



def test_a_checkpoint_saved_between_a_resumes_read_and_its_lock_is_not_resumed_stale(tmp_path, capsys, monkeypatch):
    """A review of atomic.py: --resume read the checkpoint before it took the checkpoint's lock, so a run holding
    the lock that saved and ended in between was overwritten by this one continuing from the older state."""
    import longswift.atomic as atomic

    tiny_hf_model("llama", seed=9).save_pretrained(tmp_path / "m")
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "generate", "--model", str(tmp_path / "m"), "--prompt-ids", "3,4,5",
                           "--max-new-tokens", "10", "--greedy", "--ignore-eos", "--no-progress", "--heads", "none",
                           "--checkpoint", "ck.json")
    assert code == 0, err
    ck = tmp_path / "ck.json"
    real, others = atomic.OutputLock.__enter__, []

    def another_run_saves_first(self):  # (what the other run, done with its lock, left: saved anew)
        (tmp_path / "other").write_bytes(ck.read_bytes())
        os.replace(tmp_path / "other", ck)
        others.append(ck.stat().st_ino)
        return real(self)

    monkeypatch.setattr(atomic.OutputLock, "__enter__", another_run_saves_first)
    code, _, err = run_cli(capsys, "generate", "--resume", "ck.json", "--max-new-tokens", "20")
    assert_one_line_error(code, err, "the checkpoint 'ck.json' changed while this resume started")
    assert [ck.stat().st_ino] == others  # (the other run's save stands)
    code, _, err = run_cli(capsys, "generate", "--resume", "ck.json", "--max-new-tokens", "20", "--no-progress",
                           "--checkpoint", "fork.json")
    assert code == 0, err  # (saving elsewhere, it read the file whole and writes nothing of it: not refused)
    monkeypatch.setattr(atomic.OutputLock, "__enter__", real)  # and with nothing saved in between, it resumes
    code, _, err = run_cli(capsys, "generate", "--resume", "ck.json", "--max-new-tokens", "20", "--no-progress")
    assert code == 0, err


def test_a_full_disk_at_the_lock_and_a_refused_rename_name_the_file_the_user_gave(tmp_path, monkeypatch):
    """A review of atomic.py: a lock whose pid could not be written (a full disk) raised an error naming no file,
    and a refused rename named the '.partial' the run then deleted, not the output it could not place."""
    from longswift.atomic import OutputLock, lock_path
    from longswift.cli.outputs import os_error_with

    out = tmp_path / "out.txt"

    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as m:
        m.setattr(os, "write", full)
        with pytest.raises(OSError) as info:
            OutputLock([("--output", out)]).__enter__()
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(lock_path(out))
    assert not lock_path(out).exists()  # (released, and removed)
    refused = OSError(errno.EACCES, os.strerror(errno.EACCES), f"{out}.partial", None, str(out))
    said = str(os_error_with(refused, "the checkpoint is intact"))
    assert f"'{out}'; the checkpoint is intact" in said and ".partial" not in said, said


@pytest.mark.skipif(sys.platform == "darwin", reason="macOS refuses file names that are not UTF-8")
def test_the_resume_command_said_for_a_name_that_is_not_utf8_gives_that_name_back_in_bash(tmp_path):
    """A review of atomic.py: the command said to continue a run whose checkpoint's name is not UTF-8 printed
    the name's surrogates ('\\udcff'), which no shell turns back into the file's bytes."""
    import shutil

    from longswift.cli.outputs import shell_word

    name = os.fsdecode(b"ck-\xff'.json")
    (tmp_path / name).write_text("x")
    assert shell_word("a b.json") == "'a b.json'"
    word = shell_word(name)
    assert word.isascii() and word.startswith("$'"), word
    if shutil.which("bash"):  # (the $'...' form is bash's, zsh's and ksh's)
        got = subprocess.run(["bash", "-c", f"cat {word}"], cwd=tmp_path, capture_output=True)
        assert got.returncode == 0 and got.stdout == b"x", got

# ---- the Python API's configs (a report-only audit of the API, session 38) ------------------------

@pytest.mark.parametrize("fields,match", [
    ({"temperature": 1e-45}, "SamplingConfig.temperature must be 0 (greedy) or a finite number >= 1e-30"),
    ({"repetition_penalty": 1e-300}, "SamplingConfig.repetition_penalty must be in [1e-06, 1e+06]"),
    ({"repetition_penalty": 1e300}, "SamplingConfig.repetition_penalty must be in [1e-06, 1e+06]"),
])
def test_temperatures_and_penalties_that_overflow_the_logits_are_refused(fields, match):
    """logits / 1e-45 overflowed to inf, the softmax gave NaN and the draw returned the vocabulary's last
    id at every step (a penalty of 1e-300 is 0 in float32: a division by zero). The extremes allowed, the
    smallest temperature with the strongest penalties, still draw what a temperature near 0 approaches: the
    argmax of the penalized logits, which greedy decoding with the same penalty draws."""
    with pytest.raises(LongswiftError, match=re.escape(match)):
        SamplingConfig(**fields)
    engine = longswift.load(tiny_hf_model("llama", seed=5), dtype="float32", heads=None)
    for penalty in (1e-6, 1.0, 1e6):
        greedy = engine.generate([1, 5, 9, 7, 3], max_new_tokens=8, temperature=0, repetition_penalty=penalty)
        cold = engine.generate([1, 5, 9, 7, 3], max_new_tokens=8, temperature=1e-30, repetition_penalty=penalty, seed=1)
        assert cold.token_ids == greedy.token_ids, penalty


def test_a_config_changed_after_a_run_began_does_not_reach_it():
    """A run takes its own checked copies of its configs: reusing (changing) one for the next request left
    the first run shorter, greedy while its stats said seed 5, and its checkpoint unresumable; a field set
    to a wrong type after construction reached torch as a raw TypeError."""
    from longswift import GenerationConfig

    engine = longswift.load(tiny_hf_model("llama", seed=5), dtype="float32", heads="random")
    gen, sampling = GenerationConfig(max_new_tokens=40, ignore_eos=True), SamplingConfig(seed=5)
    alone = engine.generate([1, 5, 9, 7, 3], sampling=sampling, generation=gen).token_ids
    first = engine.stream([1, 5, 9, 7, 3], sampling=sampling, generation=gen)
    gen.max_new_tokens, sampling.temperature = 8, 0.0
    engine.generate([4, 4, 4], sampling=sampling, generation=gen)
    assert list(first) and first.result.token_ids == alone
    assert engine.resume(first.checkpoint()).token_ids == alone
    sampling.top_k = 2.5
    with pytest.raises(LongswiftError, match="SamplingConfig.top_k must be"):
        engine.stream([1, 5, 9], sampling=sampling)


def test_the_apis_smaller_refusals(tmp_path):
    """From the same audit: a heads path as a pathlib.Path, a stream's on_prefill, a Checkpoint object
    changed in memory and checkpoint(outputs=...) are checked as their string / file forms are; a bad
    value is a ValueError as Python code expects; result_so_far's stats are a copy."""
    from dataclasses import replace

    engine = longswift.load(tiny_hf_model("llama", seed=5), dtype="float32", heads="random")
    with pytest.raises(LongswiftError, match="does not exist"):  # was: TypeError: expected string or bytes-like
        engine.set_heads(tmp_path / "missing.safetensors")
    with pytest.raises(ValueError, match="SamplingConfig.top_p"):
        SamplingConfig(top_p=5.0)
    stream = engine.stream([1, 5, 9, 7, 3], max_new_tokens=12, seed=3)
    with pytest.raises(TypeError, match="on_prefill must be a function"):
        stream.on_prefill = 5
    taken = []
    for ids in stream:
        taken.append(ids)
        if len(taken) == 2:
            break
    so_far = stream.result_so_far()
    seen = dict(so_far.stats.stage_seconds)
    ckpt = stream.checkpoint()
    for bad, match in ((replace(ckpt, token_ids=[1.5]), "token_ids must be a list of token ids"),
                       (replace(ckpt, runtime=None), "runtime must be an object"),
                       # a config with fields left out resumed at their defaults (another sampling, silently)
                       (replace(ckpt, sampling={}), "sampling lacks temperature, top_k"),
                       (replace(ckpt, runtime={k: v for k, v in ckpt.runtime.items() if k != "dtype"}), "runtime lacks dtype$"),
                       (replace(ckpt, spec={k: v for k, v in ckpt.spec.items() if k != "tree"}), "spec lacks tree$")):
        with pytest.raises(LongswiftError, match=f"the checkpoint is not valid: {match}"):
            engine.resume(bad)
    with pytest.raises(TypeError, match="outputs must be a dict"):
        stream.checkpoint(outputs=5)
    with pytest.raises(TypeError, match="outputs must map names to paths"):
        stream.checkpoint(outputs={"output": 5})
    list(stream)
    assert so_far.stats.stage_seconds == seen and stream.result.stats.stage_seconds != seen
    resumed = engine.resume(ckpt)  # what the checks let through still resumes to the uninterrupted run
    assert list(resumed) and resumed.result.token_ids == stream.result.token_ids


def test_the_fields_every_checkpoint_holds_are_config_fields():
    """ALWAYS_HELD names fields of the configs (a rename must be seen here), and a checkpoint written now holds
    every field of each config, those added since the format's first version too."""
    from dataclasses import fields

    from longswift.checkpoint import ALWAYS_HELD

    configs = {"runtime": RuntimeConfig, "sampling": SamplingConfig, "generation": GenerationConfig, "spec": SpecConfig}
    assert set(ALWAYS_HELD) == set(configs)
    for name, held in ALWAYS_HELD.items():
        assert set(held) <= {f.name for f in fields(configs[name])}, name


def test_a_run_that_cannot_be_is_refused_by_stream_itself():
    """A tree deeper than the heads, or a run too big for memory, was refused at the stream's first token,
    which then marked the stream broken and advised a resume that would fail the same way."""
    engine = longswift.load(tiny_hf_model("llama", seed=5), dtype="float32", heads="random")
    with pytest.raises(LongswiftError, match="has 6 depths but the heads draft only 4"):
        engine.stream([1, 5, 9, 7, 3], max_new_tokens=5, tree="1,1,1,1,1,1")
    huge = longswift.load(tiny_hf_model(seed=16, max_position_embeddings=10**12), dtype="float32", heads="random")
    for method in ("ar", "tokenswift"):
        with pytest.raises(LongswiftError, match="not enough memory"):
            huge.stream([1, 5, 9, 7, 3], max_new_tokens=10**11, method=method)
    stream = engine.stream([1, 5, 9, 7, 3], max_new_tokens=5, tree="1,1,1")  # the engine is as it was
    assert len(list(stream)) >= 1 and len(stream.result.token_ids) == 5


@pytest.mark.parametrize("args,note", [
    (["--method", "ar", "--tree", "1,3"], "--tree sets how TokenSwift drafts, and --method ar runs AR"),
    (["--heads", "none", "--ngram-topk", "3", "--max-nodes", "9"],
     "--ngram-topk, --max-nodes set how TokenSwift drafts, and --heads none runs AR, which does not draft"),
    (["--tree", "1,3"], "--tree sets how TokenSwift drafts, and this model has no draft heads, so the run is AR"),
    (["--method", "ar", "--heads", "random"], "--heads sets how TokenSwift drafts, and --method ar runs AR"),
    (["--method", "ar", "--heads", "random", "--tree", "1,3"],
     "--heads, --tree set how TokenSwift drafts, and --method ar runs AR"),
    (["--heads", "random", "--tree", "1,1", "--draft-mode", "fused", "--draft-kv-budget", "8192", "--draft-cache",
      "static"], "--draft-cache, --draft-kv-budget set nothing here: --draft-mode fused has no draft pass, whose "
                 "cache they set"),
    (["--heads", "random", "--ngram-topk", "0", "--lookup-nodes", "12"],
     "--lookup-nodes sets nothing here: --ngram-topk 0 turns off n-gram reuse and with it the suffix lookup"),
    (["--heads", "random", "--no-suffix-lookup", "--lookup-nodes", "12"],
     "--lookup-nodes sets nothing here: --no-suffix-lookup turns off the suffix lookup, whose copy it bounds"),
])
def test_tokenswift_flags_on_an_ar_run_are_said_to_do_nothing(args, note, tmp_path, capsys):
    """They were ignored without a word; refusing them would break one command line run with each method. So were
    the draft pass's cache settings in fused mode, which has no draft pass, and the suffix lookup's size where it is
    off."""
    tiny_hf_model("llama", seed=5).save_pretrained(tmp_path / "m")
    capsys.readouterr()
    code, _, err = run_cli(capsys, "generate", "--model", str(tmp_path / "m"), "--prompt-ids", "3,4,5",
                           "--max-new-tokens", "3", "--no-progress", *args)
    assert code == 0 and f"longswift: note: {note}" in err, err


@pytest.mark.parametrize("argv", [
    ["eval-heads", "--heads", "random", "--data", "{d}", "--json"],
    ["generate", "--prompt", "hi", "--json"],
    ["generate", "--prompt", "hi", "--checkpoint"],
    ["bench", "--methods", "ar", "--json"],
    ["bench-steps", "--shape", "smollm2-135m", "--json"],
])
def test_a_json_output_never_replaces_a_file_that_is_not_json(argv, tmp_path, capsys, no_loading):
    """`eval-heads --json run/heads.safetensors` replaced a trained heads file with its JSON (exit 0)."""
    (tmp_path / "doc.txt").write_text("Some text to evaluate on. " * 20)
    from safetensors.torch import save_file

    heads = tmp_path / "heads.safetensors"
    save_file({"w": torch.ones(4)}, str(heads))  # as a heads file begins: the header's length, then its JSON
    before = heads.read_bytes()
    flag = argv[-1]
    code, _, err = run_cli(capsys, *[a.replace("{d}", str(tmp_path / "doc.txt")) for a in argv], str(heads))
    assert_one_line_error(code, err, f"{flag} '{heads}' exists and is not a JSON file, which {flag} would replace")
    assert heads.read_bytes() == before


def test_a_checkpoint_names_its_heads_file_so_it_resumes_from_any_directory(tmp_path, capsys, monkeypatch):
    """--heads given relative was recorded as typed: resuming from another directory said the heads file
    did not exist and advised dropping --heads, which no resume can."""
    from longswift.spec.heads import save_heads

    tiny_hf_model("llama", seed=9).save_pretrained(tmp_path / "m")
    engine = longswift.load(str(tmp_path / "m"), dtype="float32", heads="random")
    save_heads(engine.heads, engine.cfg, engine.fingerprint, tmp_path / "h.safetensors")
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    run = ["generate", "--model", "m", "--prompt-ids", "3,4,5", "--max-new-tokens", "30", "--greedy", "--ignore-eos",
           "--no-progress", "--heads", "h.safetensors"]
    code, _, err = run_cli(capsys, *run, "--json", "whole.json")
    assert code == 0, err
    code, _, err = run_cli(capsys, *run, "--max-new-tokens", "12", "--checkpoint", "ck.json", "--json", "part.json")
    assert code == 0, err
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, _, err = run_cli(capsys, "generate", "--resume", str(tmp_path / "ck.json"), "--max-new-tokens", "30",
                           "--no-progress")
    assert code == 0, err
    whole = json.loads((tmp_path / "whole.json").read_text())
    assert json.loads((tmp_path / "part.json").read_text())["token_ids"] == whole["token_ids"]
    assert json.loads((tmp_path / "part.json").read_text())["stats"]["method"] == "tokenswift"


def test_heads_default_on_a_model_without_shipped_heads_is_refused(tmp_path, capsys):
    """'default' means only the heads shipped for the model: on another model generate ran AR without a
    word, where eval-heads and export-heads refused."""
    tiny_hf_model("llama", seed=5).save_pretrained(tmp_path / "m")
    capsys.readouterr()
    code, _, err = run_cli(capsys, "generate", "--model", str(tmp_path / "m"), "--prompt-ids", "3,4,5",
                           "--max-new-tokens", "4", "--heads", "default", "--json", str(tmp_path / "out.json"))
    assert_one_line_error(code, err, "no draft heads are shipped with longswift for this model, and --heads default")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
    code, out, err = run_cli(capsys, "info", "--model", str(tmp_path / "m"), "--heads", "default")  # said AR
    assert_one_line_error(code, err, "no draft heads are shipped with longswift for this model, and --heads default")


@pytest.mark.parametrize("command", ["generate", "info", "bench", "eval-heads", "export-heads"])
def test_an_empty_heads_value_is_refused(command, capsys, no_loading):
    """`--heads "$HEADS"` with HEADS unset: generate took it as 'auto', info and set_heads as the directory '.'."""
    code, _, err = run_cli(capsys, command, "--heads", "")
    assert_one_line_error(code, err, "argument --heads: is empty (an unset variable?)")


def test_heads_default_without_shipped_heads_is_refused_by_the_api():
    """set_heads('default') (and load(heads='default')) gave AR without a word where no heads are shipped;
    the refusal names the API's words, and the engine keeps the heads it had."""
    engine = longswift.load(tiny_hf_model("llama", seed=5), heads="random")
    with pytest.raises(LongswiftError, match="heads='default' takes only those") as caught:
        engine.set_heads("default")
    assert "--heads default" in caught.value.cli_message
    assert engine.heads is not None and engine.heads_source == "random"
    with pytest.raises(LongswiftError, match="heads='default' takes only those"):
        longswift.load(tiny_hf_model("llama", seed=5), heads="default")


def test_an_empty_heads_string_is_refused_by_the_api():
    engine = longswift.load(tiny_hf_model("llama", seed=5), heads=None)
    with pytest.raises(LongswiftError, match="heads is an empty string"):
        engine.set_heads("")
    with pytest.raises(LongswiftError, match="heads file '/dev/null' is not a regular file"):  # was: does not exist
        engine.set_heads("/dev/null")


@pytest.mark.parametrize("command", ["generate", "export-heads"])
def test_a_sigterm_while_loading_exits_with_sigterms_status(command, tmp_path, capsys, monkeypatch):
    """A signal that stops a command at once exits 128 + it: generate, stopped while its model loaded, said
    130 (Ctrl-C's) for a SIGTERM."""
    import signal

    def killed(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("the signal should have stopped the command")

    monkeypatch.setattr("longswift.engine.load_model", killed)
    monkeypatch.setattr("longswift.runtime.loading.load_model", killed)
    handler = signal.getsignal(signal.SIGTERM)
    args = ["--prompt", "hi"] if command == "generate" else ["--out", str(tmp_path / "h.safetensors")]
    code, _, err = run_cli(capsys, command, *args)
    assert code == 128 + signal.SIGTERM and "interrupted" in err, err
    assert signal.getsignal(signal.SIGTERM) == handler


def test_an_exception_between_a_step_and_its_record_keeps_the_stream_resumable():
    """An exception (a KeyboardInterrupt) after a step ran but before its tokens were recorded, as in the stop
    strings' check: the stream went on without that step's tokens and its checkpoint resumed to other tokens.
    Now it refuses to go on, and its checkpoint (the state before the step) resumes to the uninterrupted run."""
    engine = longswift.load(tiny_hf_model("llama", seed=5), dtype="float32", heads="random")
    whole = engine.generate([1, 5, 9, 7, 3], max_new_tokens=24, seed=7, ignore_eos=True).token_ids

    class Interrupting:  # stands in for the stop strings' check: raises at its third step
        calls = 0

        def cut(self, ids):
            self.calls += 1
            if self.calls == 3:
                raise KeyboardInterrupt
            return None

    stream = engine.stream([1, 5, 9, 7, 3], max_new_tokens=24, seed=7, ignore_eos=True)
    stream._stop = Interrupting()
    with pytest.raises(KeyboardInterrupt):
        for _ in stream:
            pass
    with pytest.raises(LongswiftError, match="cannot go on"):
        next(iter(stream))
    # result_so_far() is at the step boundary too, as the checkpoint (it gave the ids before the step with the
    # step's own stats: one more token and step)
    so_far, saved = stream.result_so_far("interrupted"), stream.checkpoint().stats
    assert len(so_far.token_ids) == so_far.stats.new_tokens == saved["new_tokens"] == 2
    assert so_far.stats.steps == saved["steps"] and so_far.stats.finish_reason == "interrupted"
    resumed = engine.resume(stream.checkpoint())
    list(resumed)
    assert resumed.result.token_ids == whole


def test_result_so_far_takes_only_the_finish_reasons():
    engine = longswift.load(tiny_hf_model("llama", seed=5), dtype="float32", heads=None)
    stream = engine.stream([1, 5, 9], max_new_tokens=4)
    next(iter(stream))
    with pytest.raises(ValueError, match="finish_reason must be one of length, eos, stop, interrupted or None"):
        stream.result_so_far("bogus")
    assert stream.result_so_far("interrupted").stats.finish_reason == "interrupted"


def test_heads_of_another_dtype_given_as_an_object_run_as_a_copy_in_the_models():
    """Heads of a float32 engine given to a float64 one of the same model were taken (the fingerprint is the same)
    and the first draft pass failed in a product of two dtypes (session 49's review). They now run as a copy in the
    model's dtype, TokenSwift's tokens AR's, and the object given is left as it was."""
    from conftest import tiny_hf_model

    import longswift

    hf = tiny_hf_model("llama", seed=5)
    heads = longswift.load(hf, dtype="float32", heads="random").heads
    engine = longswift.load(hf, dtype="float64", heads=None)
    engine.set_heads(heads)
    assert heads.weights.dtype == torch.float32 and engine.heads.weights.dtype == torch.float64
    run = {"max_new_tokens": 40, "ignore_eos": True, "seed": 3}
    assert engine.generate([5, 9, 17], method="tokenswift", **run).token_ids == \
        engine.generate([5, 9, 17], method="ar", **run).token_ids
    assert "a copy in float64" in engine.heads_origin


def test_out_of_range_values_and_wrong_types_raise_what_the_readme_promises(tmp_path):
    """README: a wrong type raises a LongswiftError that is also a TypeError, a value out of range one that is
    also a ValueError. Prompt ids and banned ids past the vocabulary raised a plain LongswiftError, load(5) one
    that was no TypeError, and Checkpoint.save(5) / read_checkpoint(5) a bare TypeError from pathlib."""
    from longswift.checkpoint import read_checkpoint

    engine = longswift.load(tiny_hf_model("llama", seed=5), dtype="float32", heads=None)
    with pytest.raises(ValueError, match=r"prompt token ids must be in \[0, 128\)"):
        engine.generate([1, 500], max_new_tokens=2)
    with pytest.raises(ValueError, match=r"banned token ids must be in \[0, 128\)"):
        engine.generate([1, 5], max_new_tokens=2, sampling=SamplingConfig(banned_ids=(400,)))
    with pytest.raises(LongswiftError) as refused:
        longswift.load(5)
    assert isinstance(refused.value, TypeError) and "model must be a path" in str(refused.value)
    stream = engine.stream([1, 5, 9], max_new_tokens=4, seed=1)
    next(iter(stream))
    for call in (lambda: stream.checkpoint().save(5), lambda: read_checkpoint(5)):
        with pytest.raises(LongswiftError, match=r"takes a path \(str or os.PathLike\); got int") as refused:
            call()
        assert isinstance(refused.value, TypeError)


def test_a_resume_of_heads_passed_as_an_object_asks_for_their_file(tmp_path, capsys):
    """A run whose heads were a DraftHeads object (set_heads(heads)): the command line's resume said "heads file
    '<DraftHeads>' does not exist: train heads ... or drop heads="; it now asks for --heads PATH, as it asks for
    --model PATH where the model was an object."""
    tiny_hf_model("llama", seed=9).save_pretrained(tmp_path / "m")
    engine = longswift.load(str(tmp_path / "m"), dtype="float32", heads="random")
    engine.set_heads(engine.heads)  # the object itself
    assert engine.heads_source == "<DraftHeads>"
    stream = engine.stream([3, 4, 5], max_new_tokens=8, seed=1, method="tokenswift")
    next(iter(stream))
    stream.checkpoint().save(tmp_path / "c.json")
    capsys.readouterr()
    code, _, err = run_cli(capsys, "generate", "--resume", str(tmp_path / "c.json"), "--no-progress")
    assert_one_line_error(code, err, "the checkpoint's draft heads were a Python object (<DraftHeads>): pass --heads "
                                     "PATH (the file they were saved to)")


def test_bad_values_given_to_the_api_are_value_errors():
    """The README: a value out of range raises a LongswiftError that is also a ValueError; these were plain
    LongswiftErrors, method='' ran the default method, a range of ids (a Sequence[int], as the hint says) was
    refused, and tensor_parallel took any value (found by a review)."""
    engine = longswift.load(tiny_hf_model("llama", seed=5), dtype="float32", heads="random")
    for call, match in [(lambda: engine.generate([1, 5], method="AR"), "unknown method 'AR'"),
                        (lambda: engine.generate([1, 5], method=""), "unknown method ''"),
                        (lambda: engine.stream([1, 5], tree="1,1,1,1,1,1", max_new_tokens=4),
                         "SpecConfig.tree='1,1,1,1,1,1' has 6"),
                        (lambda: engine.generate([]), "the prompt is empty: give at least one token id$"),
                        (lambda: engine.generate(" "), "the prompt is empty"),
                        (lambda: engine.generate("hi", chat=True, system=""), "the system message is empty"),
                        (lambda: engine.generate([1, 5], method="ar", tree="1,2"), "tree sets how TokenSwift drafts"),
                        (lambda: engine.set_heads(""), "heads is an empty string"),
                        (lambda: engine.token_id(""), "an empty token text names no token")]:
        with pytest.raises(ValueError, match=match) as info:
            call()
        assert isinstance(info.value, LongswiftError)
    ar = dict(method="ar", max_new_tokens=4, temperature=0)
    assert engine.generate(range(1, 6), **ar).token_ids == engine.generate([1, 2, 3, 4, 5], **ar).token_ids
    with pytest.raises(TypeError, match="tensor_parallel must be True or False; got 'yes'"):
        longswift.load(tiny_hf_model("llama", seed=5), tensor_parallel="yes")


# ---- session 59's review of the Python API -----------------------------------------------------------------

@pytest.mark.parametrize("method", ["ar", "tokenswift"])
def test_the_ids_a_stream_yields_are_the_callers_to_change(method):
    """AR's loop read its block's last id after the yield: a caller that emptied the list it was given broke the
    stream (an IndexError), and one that appended an EOS id to it ended the run there."""
    engine = longswift.load(tiny_hf_model("llama", seed=5), dtype="float32", heads="random")
    whole = engine.generate([1, 5, 9], method=method, max_new_tokens=10, seed=1).token_ids
    for change in (list.clear, lambda ids: ids.append(2)):
        stream = engine.stream([1, 5, 9], method=method, max_new_tokens=10, seed=1)
        for ids in stream:
            change(ids)
        assert stream.result.token_ids == whole


def test_a_stop_strings_step_says_stop_in_the_stats_and_the_result_so_far():
    """The step a stop string ends the run at is yielded with the live stats' finish_reason "stop" (a checkpoint
    taken there must not resume past it); result_so_far() said None there."""
    engine = longswift.load(tiny_hf_model("llama", seed=5), dtype="float32", heads=None)

    class StopAtThird:  # the stop strings' check, a stop string completed by the third step's token
        calls = 0

        def cut(self, ids):
            self.calls += 1
            return len(ids) if self.calls == 3 else None

    stream = engine.stream([1, 5, 9, 7, 3], max_new_tokens=24, seed=7, ignore_eos=True)
    stream._stop = StopAtThird()
    for _ in stream:
        if stream.complete():
            break
    assert stream.result is None and len(stream.token_ids) == 3
    assert stream.stats.finish_reason == stream.result_so_far().stats.finish_reason == "stop"
    assert list(engine.resume(stream.checkpoint())) == []


def test_prompt_text_past_the_models_vocabulary_is_refused_in_one_line(tmp_path):
    """A model directory whose tokenizer is larger than its vocabulary (here 260 tokens for 128 logits) gave an
    IndexError from the embedding in the first step, and a stream that could not go on."""
    from conftest import byte_tokenizer

    tiny_hf_model("llama", seed=5).save_pretrained(tmp_path / "m")
    byte_tokenizer().save_pretrained(tmp_path / "m")
    engine = longswift.load(tmp_path / "m", dtype="float32", heads=None)
    assert engine.generate("cafe", max_new_tokens=2).token_ids  # ids inside the vocabulary run
    with pytest.raises(LongswiftError, match=r"^the prompt text encodes to token 258 of the tokenizer, past this "
                                             r"model's 128 logits: the tokenizer is not this model's"):
        engine.stream("café")


@pytest.mark.parametrize("call, what", [
    (lambda e: e.stream("a\ud800b"), r"the prompt holds a lone surrogate \(U\+D800 at character 1\)"),
    (lambda e: e.stream("ab", chat=True, system="\udc80"),
     r"the system message holds a lone surrogate \(U\+DC80 at character 0\)"),
    (lambda e: e.token_id("\ud800"), r"the token text holds a lone surrogate \(U\+D800 at character 0\)"),
])
def test_text_with_a_lone_surrogate_is_refused_by_name(call, what):
    """A lone surrogate (a JSON escape without its pair) was the tokenizer's bare TypeError, or with the chat
    template a 'template fails' whose advice (chat=False) led to that TypeError."""
    engine = longswift.load(tiny_hf_model("llama", seed=5), dtype="float32", heads=None)
    engine.tokenizer = byte_tokenizer_with_template()
    with pytest.raises(ValueError, match=what + r", which is not Unicode text: remove it, or pair it"):
        call(engine)


def byte_tokenizer_with_template():
    from conftest import byte_tokenizer

    tokenizer = byte_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    return tokenizer


def test_a_system_message_longer_than_the_context_is_refused_before_tokenizing():
    engine = longswift.load(tiny_hf_model("llama", seed=5), dtype="float32", heads=None)
    engine.tokenizer = byte_tokenizer_with_template()
    with pytest.raises(ValueError, match=r"^the system message \(2,000,000 characters\) is far longer than this "
                                         r"model's context of 256 tokens can hold"):
        engine.stream("hi", chat=True, system="x" * 2_000_000)


def test_a_tokenizer_object_needs_len_and_an_eos_id():
    """Any object with encode and decode was taken, and failed later in len() or at its eos_token_id."""
    class Tok:
        def encode(self, text):
            return [1]

        def decode(self, ids):
            return ""

    with pytest.raises(TypeError, match=r"tokenizer must be a transformers tokenizer \(with encode, decode, len\(\) "
                                        r"and eos_token_id\); got Tok"):
        longswift.load(tiny_hf_model("llama", seed=5), dtype="float32", heads=None, tokenizer=Tok())


@pytest.mark.parametrize("device", ["cudafoo", "cuda:x", "cuda:-1", "cuda ", "cuda:"])
def test_a_device_name_torch_cannot_read_is_refused_by_the_config(device, monkeypatch):
    """With CUDA present, any name beginning with "cuda" was taken, and torch refused it later with a bare
    'Invalid device string' (CUDA's presence is patched in: the names are refused before any device is used)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError, match=rf"^RuntimeConfig.device must be cpu, cuda, cuda:N or auto; got '{device}'$"):
        RuntimeConfig(device=device)
    assert RuntimeConfig(device="cuda:1").device == "cuda:1"
    with pytest.raises(ValueError, match=r"^RuntimeConfig.device='cuda:2': this machine has 2 CUDA device\(s\), "
                                         r"numbered from 0$"):
        RuntimeConfig(device="cuda:2")


@pytest.mark.parametrize("make, error, match", [
    (lambda: SamplingConfig(banned_ids=[1.5]), TypeError,
     r"^SamplingConfig.banned_ids must be token ids \(whole numbers\); got 1.5 \(float\) among them"),
    (lambda: SamplingConfig(banned_ids=["<|im_start|>"]), TypeError, r"got '<\|im_start\|>' \(str\) among them \(a "
                                                                      r"token's text: Engine.token_id gives its id\)"),
    (lambda: SamplingConfig(banned_ids=[3, -1]), ValueError,
     r"^SamplingConfig.banned_ids must be non-negative; got -1"),
    (lambda: GenerationConfig(stop=[5]), TypeError,
     r"^GenerationConfig.stop must be strings; got 5 \(int\) among them"),
    (lambda: GenerationConfig(stop=[b"END"]), TypeError,
     r"^GenerationConfig.stop must be strings; got b'END' \(bytes\)"),
    (lambda: GenerationConfig(stop=["a\ud800"]), ValueError, r"^GenerationConfig.stop string 'a\\ud800' holds a lone "
                                                             r"surrogate, which is not Unicode text"),
])
def test_wrong_elements_of_banned_ids_and_stop_name_the_field_and_their_type(make, error, match):
    """They were ValueErrors alone ("banned token ids must be non-negative integers", not naming the field), a
    token's text among the ids included; a stop string with a lone surrogate was taken and could never match."""
    with pytest.raises(error, match=match):
        make()


def test_banned_ids_come_as_an_array_or_a_range_as_prompts_do():
    import numpy as np

    assert SamplingConfig(banned_ids=np.array([7, 3])).banned_ids == (3, 7)
    assert SamplingConfig(banned_ids=torch.tensor([5, 5])).banned_ids == (5,)
    assert SamplingConfig(banned_ids=range(2)).banned_ids == (0, 1)


@pytest.mark.parametrize("chat", [[], ["--raw"]])
def test_a_text_prompt_is_counted_and_refused_before_the_weights_load(capsys, embedded, tmp_path, no_loading, chat):
    """A text prompt was planned as one token before loading (the tokenizer came with the weights): a prompt past the
    context, or past the memory with the run's new tokens, was refused only once every weight had been read, minutes
    for the 8B-70B models of 100K-token runs. The command line now encodes it with the checkpoint's tokenizer and
    config alone: the count is the loaded engine's (with its chat template, or without it under --raw)."""
    text = "The lighthouse keeper walked along the shore at dusk. " * 1000  # ~10K tokens
    (tmp_path / "p.txt").write_text(text)
    n = len(embedded.encode(text, chat=None if not chat else False))
    code, _, err = run_cli(capsys, "generate", "--prompt-file", str(tmp_path / "p.txt"), "--max-new-tokens", "10", *chat)
    assert_one_line_error(code, err, f"prompt ({n} tokens) + --max-new-tokens 10 = {n + 10} exceeds this model's "
                                     "context of 8192 tokens")


def test_the_command_line_reads_the_tokenizer_once(capsys, monkeypatch):
    """The tokenizer read to count the prompt before the weights load is the one the engine gets (the load takes it
    from there): a second read cost the embedded model 0.2-0.3 s a run, and would an HF directory's a second or so."""
    import longswift.runtime.loading as loading

    loading._tokenizer.cache_clear()  # (a refusal before loading leaves the read one kept)
    reads = []
    read = loading.gguf_tokenizer
    monkeypatch.setattr(loading, "gguf_tokenizer", lambda *a: reads.append(a) or read(*a))
    code, out, _ = run_cli(capsys, "generate", "--prompt", "Say hi.", "--max-new-tokens", "3", "--no-progress")
    assert code == 0 and out.strip() and len(reads) == 1


# ---- a review of atomic.py ------------------------------------------------------------------------------------

def test_a_report_appended_to_a_file_named_with_a_tilde_keeps_the_file(tmp_path, monkeypatch):
    """`--out=~/notes.md` (no shell expands a tilde after '--out='): the append read './~/notes.md', found nothing,
    and write_atomic, which expands the tilde, replaced ~/notes.md with the one report: the notes were lost."""
    from longswift.atomic import append_atomic, check_appendable

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.md").write_text("# weeks of notes\n")
    check_appendable(Path("~/notes.md"), "--out")
    append_atomic(Path("~/notes.md"), "| report |\n")
    assert (tmp_path / "notes.md").read_text() == "# weeks of notes\n| report |\n"
    (tmp_path / "earlier.json").write_text('{"runs": []}\n')  # a --json result named by mistake: refused up front
    with pytest.raises(LongswiftError, match="exists and holds JSON or binary data"):
        check_appendable(Path("~/earlier.json"), "--out")


def test_a_json_output_named_with_a_tilde_never_replaces_a_file_that_is_not_json(tmp_path, monkeypatch, capsys,
                                                                                  no_loading):
    """`--json=~/h.safetensors`: the check read './~/h.safetensors', found nothing, and the run's JSON replaced the
    heads file at ~/h.safetensors (bench-steps and eval-heads check their --json so)."""
    from longswift.atomic import check_json_output

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    heads = tmp_path / "h.safetensors"
    heads.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      weights")
    with pytest.raises(LongswiftError, match="exists and is not a JSON file"):
        check_json_output(Path("~/h.safetensors"), "--json")
    code, _, err = run_cli(capsys, "eval-heads", "--heads", "random", "--json=~/h.safetensors")
    assert_one_line_error(code, err, "--json '")
    assert "is not a JSON file" in err and heads.read_bytes().endswith(b"weights")


def _fsyncs_of_directories(monkeypatch) -> list[tuple[str, int]]:
    """Record, in order, each os.replace ('replace', the destination directory's inode) and each fsync of a
    directory ('fsync', its inode)."""
    events: list[tuple[str, int]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            events.append(("fsync", st.st_ino))
        real_fsync(fd)

    def replace(src, dst):
        real_replace(src, dst)
        events.append(("replace", os.stat(Path(dst).parent).st_ino))

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return events


def test_an_atomic_write_fsyncs_its_directory_after_the_rename(tmp_path, monkeypatch):
    """The file was fsynced, but not the rename: after a power cut a checkpoint the run said it saved (or a result,
    or an exported directory) could be missing or the old one; the rename is durable once its directory is fsynced."""
    events = _fsyncs_of_directories(monkeypatch)
    here = tmp_path.stat().st_ino
    write_atomic(tmp_path / "out.txt", "text")
    assert events[-2:] == [("replace", here), ("fsync", here)]
    replace_atomically(tmp_path / "h.bin", lambda tmp: tmp.write_bytes(b"x"))
    assert events[-2:] == [("replace", here), ("fsync", here)]
    f = AtomicFile(tmp_path / "out.txt")
    f.write("more")
    f.commit()
    assert events[-2:] == [("replace", here), ("fsync", here)]
    events.clear()
    write_dir_atomically(tmp_path / "released", lambda tmp: (tmp / "config.json").write_text("{}"))
    assert events[-2:] == [("replace", here), ("fsync", here)]
    assert ("fsync", (tmp_path / "released").stat().st_ino) in events[:-2]  # its entries, before it is renamed


def test_directories_made_for_an_output_are_fsynced_into_their_parents(tmp_path, monkeypatch):
    """An export, a bench --out-dir or a training --out under new directories: the output's rename was fsynced into
    the new directory, but the new directories' own entries were not, so after a power cut the output could vanish
    with them. Each directory made is now fsynced into its parent."""
    from longswift.bench.store import ResultStore
    from longswift.train.train import claimed_out_dir

    events = _fsyncs_of_directories(monkeypatch)
    write_dir_atomically(tmp_path / "a" / "b" / "released", lambda tmp: (tmp / "config.json").write_text("{}"))
    synced = {ino for kind, ino in events if kind == "fsync"}
    assert {tmp_path.stat().st_ino, (tmp_path / "a").stat().st_ino, (tmp_path / "a" / "b").stat().st_ino} <= synced
    events.clear()
    ResultStore(tmp_path / "c" / "d", {"x": 1}).close()
    synced = {ino for kind, ino in events if kind == "fsync"}
    assert {tmp_path.stat().st_ino, (tmp_path / "c").stat().st_ino} <= synced
    events.clear()
    with claimed_out_dir(tmp_path / "e" / "f", resume=False):
        pass
    synced = {ino for kind, ino in events if kind == "fsync"}
    assert {tmp_path.stat().st_ino, (tmp_path / "e").stat().st_ino} <= synced


@pytest.mark.skipif(sys.platform == "win32", reason="no flock")
def test_a_writers_temporary_directory_is_never_swept_before_its_mark_is_locked(tmp_path, monkeypatch):
    """The mark was created under its own name, then locked: a sweep by another export into the same directory
    between the two found it unlocked, took the live writer for a killed one and removed its directory, and
    the writer's export failed. The mark now gets its name once it is locked."""
    import fcntl

    import longswift.atomic as atomic

    real_flock, swept = fcntl.flock, []

    def flock(fd, op):
        if op == fcntl.LOCK_EX and not swept:  # the writer, about to lock its mark: another export's sweep
            swept.append(atomic.remove_stale_dirs(tmp_path))
        return real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    write_dir_atomically(tmp_path / "released", lambda tmp: (tmp / "config.json").write_text("{}"))
    assert swept == [[]] and [p.name for p in (tmp_path / "released").iterdir()] == ["config.json"]


@pytest.mark.skipif(sys.platform == "win32", reason="no flock")
def test_a_report_is_appended_where_a_directory_cannot_be_locked(tmp_path, monkeypatch):
    """NFS emulates flock with a byte-range lock, which an exclusive lock takes only on a file opened for writing
    (flock(2)): the appenders' turn, a lock on the directory opened read-only, failed with EBADF, and `bench --out`
    on an NFS home directory ended, after the whole grid, in that error, its --json unwritten. The turn is best
    effort there, as where there is no flock."""
    import fcntl

    from longswift.atomic import append_atomic

    real_flock = fcntl.flock

    def nfs_flock(fd, op):
        if stat.S_ISDIR(os.fstat(fd).st_mode) and op & fcntl.LOCK_EX:
            raise OSError(errno.EBADF, "Bad file descriptor")
        return real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", nfs_flock)
    notes = tmp_path / "notes.md"
    notes.write_text("# notes\n")
    append_atomic(notes, "| report |\n")
    assert notes.read_text() == "# notes\n| report |\n" and [p.name for p in tmp_path.iterdir()] == ["notes.md"]


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="no /proc")
def test_the_umask_is_read_without_setting_it(tmp_path, monkeypatch):
    """Written files get the mode open() gives them, which takes the umask: reading it by setting it (os.umask
    has no read) left a moment in which another thread of an embedding program created files with a umask of 0.
    Where the system shows it (/proc/self/status), it is read there."""
    import longswift.atomic as atomic

    old = os.umask(0o027)
    try:
        calls = []
        real = os.umask
        monkeypatch.setattr(os, "umask", lambda mask: calls.append(mask) or real(mask))
        write_atomic(tmp_path / "out.txt", "text")
        assert atomic._umask() == 0o027 and calls == []
        assert (tmp_path / "out.txt").stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(old)


@pytest.mark.skipif(os.name != "posix", reason="POSIX modes")
def test_a_read_only_output_is_refused_not_replaced(tmp_path, capsys):
    """A review of atomic.py: an output the user made read-only (chmod a-w, to keep it) was replaced all the same,
    since a new file renamed over it needs only the directory's permission. Refused before the run, as a shell's
    redirection refuses it."""
    kept = tmp_path / "kept.txt"
    kept.write_text("keep me")
    kept.chmod(0o444)
    code, _, err = run_cli(capsys, "generate", "--model", "random", "--prompt-ids", "1,2", "--max-new-tokens", "2",
                           "--output", str(kept))
    assert_one_line_error(code, err, "is read-only: make it writable")
    assert kept.read_text() == "keep me"


@pytest.mark.skipif(os.name != "posix", reason="POSIX owners")
def test_another_users_file_is_refused_where_the_rename_would_fail_at_the_end(tmp_path, monkeypatch):
    """A review of atomic.py: in a sticky directory (/tmp, a shared scratch) another user's writable file passed
    every check, and the rename at the run's end failed (EPERM) after the whole run: its output lost. Refused first
    now, as is another user's read-only file (which was told to chmod u+w, which its owner alone can)."""
    sticky = tmp_path / "scratch"
    sticky.mkdir()
    sticky.chmod(0o1777)
    theirs = sticky / "shared.txt"
    theirs.write_text("theirs")
    theirs.chmod(0o666)
    check_writable(theirs)  # (this process owns both: replaceable)
    monkeypatch.setattr(os, "geteuid", lambda: 4321)  # another user, no root: the owner test alone changes
    with pytest.raises(LongswiftError, match="is another user's, in a directory where only a file's owner may "
                                             r"replace it \(sticky, as /tmp is\): give another file name"):
        check_writable(theirs)
    sticky.chmod(0o777)  # not sticky: any user who may write the directory may replace it
    assert check_writable(theirs) == theirs
    theirs.chmod(0o444)
    with pytest.raises(LongswiftError, match="is another user's and read-only to this one: give another file name"):
        check_writable(theirs)
    assert theirs.read_text() == "theirs"


@pytest.mark.skipif(os.name != "posix", reason="POSIX links")
def test_a_loop_of_links_and_a_name_too_long_are_refused_in_one_line(tmp_path):
    """A review of atomic.py: a loop of links was replaced by a file (realpath gives a loop's own name), where open()
    says ELOOP; a name past the file system's limit was a raw ENAMETOOLONG (exit 1) from the link check, where a
    slightly shorter one was refused in one line."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(LongswiftError, match="'.*a' is a loop of symbolic links"):
        check_writable(tmp_path / "a")
    assert (tmp_path / "a").is_symlink()
    with pytest.raises(LongswiftError, match="its name is too long for this file system"):
        check_writable(tmp_path / ("x" * 300))
