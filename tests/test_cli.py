"""The command line: generation with output files, info, bench, and one-line errors (exit 2)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import assert_one_line_error, run_cli, tiny_hf_model


@pytest.mark.slow
def test_generate_writes_output_and_json(tmp_path, capsys):
    out_file, json_file = tmp_path / "out.txt", tmp_path / "out.json"
    code, out, err = run_cli(capsys, "generate", "--prompt", "Write a haiku about rain.", "--chat", "--greedy",
                         "--max-new-tokens", "24", "--ignore-eos", "--output", str(out_file), "--json", str(json_file))
    assert code == 0, err
    data = json.loads(json_file.read_text())
    assert set(data) == {"token_ids", "text", "stats"}
    assert len(data["token_ids"]) == 24 and data["stats"]["new_tokens"] == 24
    assert (data["stats"]["device"], data["stats"]["dtype"]) == ("cpu", "float32")  # what ran it (--dtype auto)
    assert out_file.read_text() == data["text"]
    assert not (tmp_path / "out.txt.partial").exists()
    assert "24 tokens in" in err and "tok/s" in err  # the summary line; the bar also went to stderr
    assert out == ""


def test_a_second_signal_during_the_renames_leaves_both_outputs_or_neither(tmp_path, capsys, monkeypatch):
    """Ctrl-C twice while the finished run renames --output and --json into place: the second signal
    waits for both renames (it used to land between them: the text renamed, the JSON discarded)."""
    import signal

    from longswift.atomic import AtomicFile

    commit, calls = AtomicFile.commit, []

    def commit_then_signal(self):
        commit(self)
        calls.append(self.path)
        if len(calls) == 1:
            signal.raise_signal(signal.SIGINT)  # the first asks to stop after the step (the run is done)
            signal.raise_signal(signal.SIGINT)  # the second: at once

    monkeypatch.setattr(AtomicFile, "commit", commit_then_signal)
    out_file, json_file = tmp_path / "out.txt", tmp_path / "out.json"
    code, _, err = run_cli(capsys, "generate", "--prompt", "Hi.", "--greedy", "--max-new-tokens", "4", "--no-progress",
                           "--output", str(out_file), "--json", str(json_file))
    assert code == 130 and "interrupted" in err
    assert calls == [out_file, json_file] and out_file.read_text() == json.loads(json_file.read_text())["text"]


@pytest.mark.parametrize("during", ["stage", "save"])
def test_two_signals_while_a_finished_run_writes_its_outputs_lose_nothing(tmp_path, capsys, monkeypatch, during):
    """Ctrl-C twice while a finished run staged its text or saved its final checkpoint (before any rename): the
    second discarded the staged text and JSON, so that a run without a periodic checkpoint kept nothing of its
    work. The writing is bounded: both signals now wait for it, and the run says what it wrote."""
    import signal

    from longswift.atomic import AtomicFile
    from longswift.checkpoint import Checkpoint, read_checkpoint

    owner = {"stage": AtomicFile, "save": Checkpoint}[during]
    real, calls = getattr(owner, during), []

    def signal_then(self, *args):
        calls.append(self)
        if len(calls) == 1:
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
        return real(self, *args)

    monkeypatch.setattr(owner, during, signal_then)
    out_file, json_file, ckpt = tmp_path / "out.txt", tmp_path / "out.json", tmp_path / "c.json"
    code, _, err = run_cli(capsys, "generate", "--prompt", "Hi.", "--greedy", "--max-new-tokens", "4", "--no-progress",
                           "--output", str(out_file), "--json", str(json_file), "--checkpoint", str(ckpt))
    assert code == 130, err
    assert "SIGINT received: the run is complete and writing its outputs, which a second signal waits for\n" in err
    assert err.rstrip().endswith("longswift: interrupted after the finished run's outputs were written in full"), err
    done = json.loads(json_file.read_text())
    assert done["stats"]["finish_reason"] == "length" and out_file.read_text() == done["text"]
    assert read_checkpoint(ckpt).token_ids == done["token_ids"]


def test_ctrl_c_while_the_command_line_imports_is_one_line_not_a_traceback(monkeypatch, capsys):
    """The entry point imports the command line inside its Ctrl-C handler: an interrupt there ends as one during
    a run does."""
    import importlib.abc

    import longswift.console

    class InterruptedImport(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "longswift.cli":
                raise KeyboardInterrupt
            return None

    for name in [m for m in sys.modules if m == "longswift.cli" or m.startswith("longswift.cli.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [InterruptedImport(), *sys.meta_path])
    assert longswift.console.main(["info"]) == 130
    assert capsys.readouterr().err == "longswift: interrupted\n"


def test_the_entry_point_and_python_m_run_the_command_line_and_import_nothing_heavy_first():
    code = ("import sys, longswift.console; heavy = {'torch', 'transformers'} & set(sys.modules); "
            "print(sorted(heavy)); sys.exit(longswift.console.main(['--version']))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.splitlines() == ["[]", "longswift 0.1.0"], run
    code = ("import sys, longswift; print('torch' in sys.modules); print(longswift.engine.Engine.__name__, "
            "longswift.SpecConfig.__module__); from longswift import *; print(sorted(dir()) == sorted(longswift.__all__ "
            "+ ['__annotations__', '__builtins__', '__doc__', '__loader__', '__name__', '__package__', '__spec__', "
            "'longswift', 'sys']))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.splitlines() == ["False", "Engine longswift.config.spec", "True"], run
    run = subprocess.run([sys.executable, "-m", "longswift", "--version"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "longswift 0.1.0", run
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    assert project["scripts"] == {"longswift": "longswift.console:main"}


@pytest.mark.slow
def test_the_summary_line_counts_graph_captures(capsys, monkeypatch, tmp_path):
    """On CUDA the closing line says how many graphs the run captured and in how long (faked here:
    the CPU captures none, and then the line says nothing of graphs)."""
    from longswift.stats import GenerationStats

    def captured(stats, graphs):
        stats.graph_captures += 2
        stats.graph_capture_seconds += 0.25

    args = ("generate", "--prompt", "Hi.", "--greedy", "--max-new-tokens", "8", "--ignore-eos", "--no-progress",
            "--method", "tokenswift")
    code, _, err = run_cli(capsys, *args, "--json", str(tmp_path / "a.json"))
    assert code == 0 and "graphs" not in err and json.loads((tmp_path / "a.json").read_text())["stats"][
        "graph_captures"] == 0
    monkeypatch.setattr(GenerationStats, "add_captures", captured)
    code, _, err = run_cli(capsys, *args, "--json", str(tmp_path / "b.json"))
    stats = json.loads((tmp_path / "b.json").read_text())["stats"]
    assert code == 0 and stats["graph_captures"] > 0, stats
    assert f"{stats['graph_captures']} CUDA graphs captured in" in err, err


def test_the_summary_line_says_when_nothing_was_drafted():
    """Alpha is a rate over drafted positions: a TokenSwift run whose adaptive steps were all plain
    drafted none, and its line says so instead of alpha 0.00."""
    from longswift.cli.display import summary_line
    from longswift.stats import GenerationStats

    plain = GenerationStats("tokenswift", 38, new_tokens=300, steps=300, decode_seconds=60.0, plain_steps=300,
                            finish_reason="length")
    assert summary_line(plain) == ("tokenswift: 300 tokens in 60.00 s (5.0 tok/s, nothing drafted: every step plain, "
                                   "1.00 tokens/step), prefill 38 tokens in 0.00 s, stop: length")
    drafted = GenerationStats("tokenswift", 38, new_tokens=300, steps=100, decode_seconds=10.0, accepted_tokens=200,
                              draft_positions=400)
    assert "(29.9 tok/s, alpha 0.50, 3.00 tokens/step) on 2 processes," in summary_line(replace(drafted, processes=2))
    ar = GenerationStats("ar", 38, new_tokens=300, steps=300, decode_seconds=10.0)
    assert summary_line(ar).startswith("ar: 300 tokens in 10.00 s (29.9 tok/s), prefill")  # the 299 after the first
    one = GenerationStats("ar", 38, new_tokens=1, steps=1, decode_seconds=0.001)  # stopped as it began
    assert summary_line(one).startswith("ar: 1 token in 0.00 s (no rate from one token), prefill")


def test_the_summary_line_of_a_resumed_run_says_its_prefill_time_holds_the_re_reads():
    """prefill_seconds adds each resume's re-prefill of prompt + output: 'prefill 39 tokens in 2.85 s'
    after four resumes read as a slow prefill of the prompt alone."""
    from longswift.cli.display import summary_line
    from longswift.stats import GenerationStats

    resumed = GenerationStats("ar", 39, new_tokens=250, steps=250, decode_seconds=10.0, prefill_seconds=2.85, resumes=4,
                              finish_reason="length")
    assert summary_line(resumed).endswith(", prefill 39 tokens in 2.85 s (with the context re-read at 4 resumes), "
                                          "stop: length")
    once = GenerationStats("ar", 39, new_tokens=250, steps=250, decode_seconds=10.0, prefill_seconds=0.5, resumes=1)
    assert "prefill 39 tokens in 0.50 s (with the context re-read at 1 resume), stop" in summary_line(once)
    assert "(with" not in summary_line(GenerationStats("ar", 39, new_tokens=250, steps=250, decode_seconds=1.0))


def test_an_interrupted_stdout_run_never_replaces_another_runs_checkpoint(tmp_path, monkeypatch):
    """Runs on stdout alone save to ./longswift.checkpoint.json when interrupted; one that is already
    there (another run's state) or being written (locked) is left alone: the next free name is taken."""
    from longswift.atomic import OutputLock
    from longswift.cli.outputs import Outputs

    class Saved:
        def __init__(self, text: str) -> None:
            self.text = text

        def save(self, path) -> None:
            path.write_text(self.text)

    monkeypatch.chdir(tmp_path)
    stdout = Outputs(output=None, json=None, checkpoint=None, every=1024)
    assert stdout.save_interrupted(Saved("first")) == tmp_path / "longswift.checkpoint.json"
    assert stdout.save_interrupted(Saved("second")) == tmp_path / "longswift.checkpoint.2.json"
    with OutputLock([("--checkpoint", tmp_path / "longswift.checkpoint.3.json")]):  # another run saving there now
        assert stdout.save_interrupted(Saved("third")) == tmp_path / "longswift.checkpoint.4.json"
    assert [(tmp_path / n).read_text() for n in ("longswift.checkpoint.json", "longswift.checkpoint.2.json",
                                                  "longswift.checkpoint.4.json")] == ["first", "second", "third"]
    beside = Outputs(output=tmp_path / "out.txt", json=None, checkpoint=None, every=1024)  # its own file's place
    here = tmp_path / "out.txt.checkpoint.json"
    assert beside.save_interrupted(Saved("a")) == beside.save_interrupted(Saved("b")) == here


class Proxy:
    """A generation stream with something changed, the rest passed through."""

    def __init__(self, stream) -> None:
        self.__dict__["_stream"] = stream

    def __getattr__(self, name):
        return getattr(self._stream, name)

    def __setattr__(self, name, value):
        setattr(self._stream, name, value)

    def __iter__(self):
        return iter(self._stream)


@pytest.mark.parametrize("when", ["loading", "reading", "reading-resumed"])
def test_a_signal_before_the_first_new_token_stops_the_reading_and_writes_nothing(tmp_path, capsys, when):
    """Ctrl-C while the model loads or the context is read (minutes, for a long one) stops at the next chunk:
    the run has generated nothing, so no checkpoint of it and no outputs are written (a resumed run's
    checkpoint stays as it was, and is named). It used to read the whole context, draw a token, and save a
    checkpoint of that one token."""
    import signal

    from conftest import tiny_hf_model

    import longswift
    from longswift import GenerationConfig, SamplingConfig
    from longswift.cli.outputs import Outputs, write_run
    from longswift.cli.stop import StopRequest

    engine = longswift.load(tiny_hf_model(), heads="random")
    stop = StopRequest()  # not entered: the signal is set by hand
    if when == "loading":
        stop.signum = signal.SIGINT
    chunks = []

    class SignalledWhileReading(Proxy):
        def __setattr__(self, name, value):
            if name == "on_prefill" and value is not None:  # the first chunk brings the signal
                def reading(read, total, show=value):
                    chunks.append(read)
                    stop.signum = stop.signum or signal.SIGINT
                    show(read, total)
                value = reading
            setattr(self._stream, name, value)

    stream = engine.stream(list(range(3, 43)), sampling=SamplingConfig(seed=1),
                           generation=GenerationConfig(max_new_tokens=20, ignore_eos=True, prefill_chunk=8))
    out = Outputs(tmp_path / "o.txt", tmp_path / "o.json", tmp_path / "c.json", 4)
    last = (tmp_path / "c.json", 4) if when == "reading-resumed" else None
    code = write_run(engine, SignalledWhileReading(stream), out, stop, no_progress=True, last_saved=last)
    err = capsys.readouterr().err
    assert code == 130, err
    assert chunks == ([] if when == "loading" else [8])  # 1 of the 5 chunks read
    assert stream.token_ids == [] and list(tmp_path.iterdir()) == []
    said = "longswift: stopped before the first new token: nothing written"
    if last is not None:
        said += "; the checkpoint saved at 4 tokens is intact: continue with: longswift generate --resume"
    assert said in err


def test_a_resume_stopped_while_reading_ends_the_text_it_showed_with_its_newline(tmp_path, capsys, monkeypatch):
    """A resumed run on stdout shows the checkpoint's text again, then re-reads its context: Ctrl-C during that
    reading left the text without stdout's closing newline and said "nothing written" under it (a review)."""
    import signal

    from conftest import tiny_hf_model

    import longswift
    from longswift import GenerationConfig, SamplingConfig
    from longswift.cli.outputs import Outputs, write_run
    from longswift.cli.stop import StopRequest

    engine = longswift.load(tiny_hf_model(), heads="random")
    first = engine.stream(list(range(3, 43)), sampling=SamplingConfig(seed=1),
                          generation=GenerationConfig(max_new_tokens=20, ignore_eos=True, prefill_chunk=8))
    for _ in first:
        if len(first.token_ids) >= 5:
            break
    first.checkpoint({}).save(tmp_path / "c.json")
    stop = StopRequest()

    class SignalledWhileReading(Proxy):
        def __setattr__(self, name, value):
            if name == "on_prefill" and value is not None:
                def reading(read, total, show=value):
                    stop.signum = stop.signum or signal.SIGINT
                    show(read, total)
                value = reading
            setattr(self._stream, name, value)

    resumed = engine.resume(tmp_path / "c.json")
    capsys.readouterr()
    code = write_run(engine, SignalledWhileReading(resumed), Outputs(None, None, None, 4), stop, no_progress=True,
                     last_saved=(tmp_path / "c.json", len(resumed.token_ids)))
    out, err = capsys.readouterr()
    assert code == 130 and out.endswith("\n") and out.strip() == " ".join(map(str, resumed.token_ids)), (out, err)
    assert "stopped before the first new token: no file written (the text shown is the checkpoint's); the " \
           "checkpoint saved at" in err, err
    # A terminal's display ends its last line itself: no second newline under it (a review)
    import io

    from rich.console import Console

    import longswift.cli.display as display_module

    screen = io.StringIO()

    monkeypatch.setattr(display_module, "Console", lambda **kw: Console(file=screen, force_terminal=True, **kw))
    monkeypatch.setattr(display_module, "make_display",
                        lambda text_file, total, initial, progress: display_module.TerminalDisplay(total, initial))
    stop = StopRequest()
    code = write_run(engine, SignalledWhileReading(engine.resume(tmp_path / "c.json")), Outputs(None, None, None, 4),
                     stop, no_progress=False)
    out, err = capsys.readouterr()
    assert code == 130 and out == "" and " ".join(map(str, resumed.token_ids)) in screen.getvalue(), (out, err)


def test_a_signal_while_loading_stops_at_once():
    """Loading has nothing to save: the first signal interrupts it, and is kept for after it too (a
    KeyboardInterrupt raised while Python runs a __del__ is printed and lost)."""
    import signal

    from longswift.cli.stop import StopRequest

    stop = StopRequest()
    with pytest.raises(KeyboardInterrupt), stop.at_once():
        stop._handle(signal.SIGTERM, None)
    assert stop.signum == signal.SIGTERM
    stop2 = StopRequest()
    stop2._handle(signal.SIGINT, None)  # outside: a request to stop after the step
    assert stop2.signum == signal.SIGINT


def test_under_torchrun_a_signal_relayed_right_after_the_first_is_the_same_request(monkeypatch):
    """torchrun passes a signal it gets on to its processes: a SIGTERM sent to the whole run (scancel, kill of
    every pid) or Ctrl-C reached each rank twice, and the second stopped it at once, saving nothing (a review).
    Under torchrun a second signal within RELAYED_SECONDS is the first's relay; later, or in one process, it
    stops at once as before."""
    import signal

    import longswift.cli.stop as stop_module
    from longswift.cli.stop import StopRequest

    now = [100.0]
    monkeypatch.setattr(stop_module.time, "monotonic", lambda: now[0])
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    stop = StopRequest()
    stop._handle(signal.SIGTERM, None)
    now[0] += 0.5
    try:
        stop._handle(signal.SIGTERM, None)  # torchrun's relay: still a request to stop after the step
    except KeyboardInterrupt:
        pytest.fail("torchrun's relay of the first signal stopped the run at once")
    assert stop.signum == signal.SIGTERM
    now[0] += stop_module.RELAYED_SECONDS
    with pytest.raises(KeyboardInterrupt):
        stop._handle(signal.SIGINT, None)  # a second request, later: at once
    monkeypatch.setenv("WORLD_SIZE", "1")
    one = StopRequest()
    one._handle(signal.SIGINT, None)
    with pytest.raises(KeyboardInterrupt):  # one process: Ctrl-C twice stops at once, however quick
        one._handle(signal.SIGINT, None)


def test_an_interrupted_run_whose_state_cannot_be_saved_exits_with_the_signals_status(tmp_path, capsys, monkeypatch):
    """Ctrl-C in a directory where nothing can be written (the start warned of it): the exit status is the
    signal's, and one line says the state could not be saved and what to do, rather than exit 1 on the
    checkpoint's lock file."""
    import signal

    from conftest import tiny_hf_model

    import longswift
    from longswift import GenerationConfig, SamplingConfig
    from longswift.cli.outputs import Outputs, write_run
    from longswift.cli.stop import StopRequest

    engine = longswift.load(tiny_hf_model(), heads="random")
    nowhere = tmp_path / "gone" / "longswift.checkpoint.json"  # its directory does not exist
    monkeypatch.setattr(Outputs, "fallback_checkpoint", lambda self: nowhere)
    stop = StopRequest()  # not entered: the signal is set by hand, as if it came during the first step

    class SignalledInFirstStep(Proxy):
        def __iter__(self):
            for ids in self._stream:
                stop.signum = signal.SIGINT
                yield ids

    stream = engine.stream([3, 4, 5], sampling=SamplingConfig(seed=1),
                           generation=GenerationConfig(max_new_tokens=20, ignore_eos=True))
    code = write_run(engine, SignalledInFirstStep(stream), Outputs(None, None, None, 1024), stop, no_progress=True)
    err = capsys.readouterr().err
    assert code == 130, err
    assert "longswift: interrupted at 1 of 20 tokens; its state could not be saved (" in err
    assert "give --checkpoint FILE in a writable directory to make a run resumable" in err
    assert not nowhere.parent.exists()


def test_an_interrupted_run_whose_last_save_fails_names_its_periodic_checkpoint(tmp_path, capsys, monkeypatch):
    """Ctrl-C, and the interrupted run's save fails (a full disk) where a periodic checkpoint was saved before: the
    line said no state was saved and to give --checkpoint (given), and the outputs it wrote, newer than that
    checkpoint, made its resume refuse to replace them. It names the intact checkpoint, and writes no outputs."""
    import errno
    import signal

    from conftest import tiny_hf_model

    import longswift
    from longswift import GenerationConfig, SamplingConfig
    from longswift.checkpoint import read_checkpoint
    from longswift.cli.outputs import Outputs, write_run
    from longswift.cli.stop import StopRequest

    engine = longswift.load(tiny_hf_model(), heads="random")
    stop = StopRequest()

    class SignalledAtStep7(Proxy):
        def __iter__(self):
            for i, ids in enumerate(self._stream):
                if i == 7:
                    stop.signum = signal.SIGINT
                yield ids

    def full(self, ckpt):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "c.json"))

    monkeypatch.setattr(Outputs, "save_interrupted", full)
    monkeypatch.chdir(tmp_path)
    stream = engine.stream([3, 4, 5], sampling=SamplingConfig(seed=1), method="ar",
                           generation=GenerationConfig(max_new_tokens=20, ignore_eos=True))
    outputs = Outputs(tmp_path / "out.txt", tmp_path / "out.json", tmp_path / "c.json", 3)
    code = write_run(engine, SignalledAtStep7(stream), outputs, stop, no_progress=True)
    err = capsys.readouterr().err
    assert code == 130, err
    assert ("longswift: interrupted at 8 of 20 tokens; its state could not be saved ([Errno 28] No space left on "
            f"device: '{tmp_path / 'c.json'}'), so its outputs were not written either; the checkpoint saved at 6 "
            "tokens is intact: continue with: longswift generate --resume c.json") in err, err
    assert not (tmp_path / "out.txt").exists() and not (tmp_path / "out.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.json"]  # (no staged file left either)
    assert len(read_checkpoint(tmp_path / "c.json").token_ids) == 6


def test_a_second_ctrl_c_names_the_last_periodic_checkpoint(tmp_path, capsys, monkeypatch):
    """A second Ctrl-C stops at once, without saving: the run's last periodic checkpoint is still there to
    continue from, and the interruption says which it is."""
    from conftest import tiny_hf_model

    import longswift
    from longswift import GenerationConfig, SamplingConfig
    from longswift.cli.outputs import Outputs, write_run
    from longswift.cli.stop import StopRequest

    class StoppedAtOnce(Proxy):  # the stream, cut by a KeyboardInterrupt after 7 steps
        def __iter__(self):
            for i, ids in enumerate(self._stream):
                if i == 7:
                    raise KeyboardInterrupt
                yield ids

    engine = longswift.load(tiny_hf_model(), heads="random")
    stream = engine.stream([3, 4, 5], sampling=SamplingConfig(seed=1), method="ar",
                           generation=GenerationConfig(max_new_tokens=20, ignore_eos=True))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(KeyboardInterrupt) as info:
        write_run(engine, StoppedAtOnce(stream), Outputs(None, None, tmp_path / "c.json", 3), StopRequest(), no_progress=True)
    assert str(info.value) == "the checkpoint saved at 6 tokens is intact: continue with: longswift generate --resume c.json"
    # a run stopped by an error of its own (another process of a tensor-parallel run lost, say) says the same
    class Failed(StoppedAtOnce):
        def __iter__(self):
            for i, ids in enumerate(self._stream):
                if i == 7:
                    raise longswift.LongswiftError("lost contact with the other processes of this run (gloo)")
                yield ids

    stream = engine.stream([3, 4, 5], sampling=SamplingConfig(seed=1), method="ar",
                           generation=GenerationConfig(max_new_tokens=20, ignore_eos=True))
    with pytest.raises(longswift.LongswiftError) as failed:
        write_run(engine, Failed(stream), Outputs(None, None, tmp_path / "d.json", 3), StopRequest(), no_progress=True)
    assert str(failed.value) == ("lost contact with the other processes of this run (gloo); the checkpoint saved at 6 "
                                 "tokens is intact: continue with: longswift generate --resume d.json")
    assert (tmp_path / "c.json").is_file()
    monkeypatch.setattr("longswift.cli.generate.cmd_generate", lambda args: (_ for _ in ()).throw(info.value))
    code, _, err = run_cli(capsys, "generate", "--prompt", "x")
    assert code == 130 and err == f"longswift: interrupted; {info.value}\n"


def test_resuming_a_finished_run_says_it_is_complete_and_writes_its_outputs_again(tmp_path, capsys, monkeypatch):
    """Its loop ends before any re-read of the context, which the message used to announce."""
    from conftest import tiny_hf_model

    tiny_hf_model("llama", seed=5).save_pretrained(tmp_path / "m")
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "generate", "--model", "m", "--prompt-ids", "3,4,5", "--max-new-tokens", "4",
                           "--seed", "1", "--heads", "none", "--checkpoint", "c.json", "--json", "o.json", "--no-progress")
    assert code == 0, err
    first = json.loads((tmp_path / "o.json").read_text())
    (tmp_path / "o.json").unlink()
    code, _, err = run_cli(capsys, "generate", "--resume", "c.json", "--no-progress")
    assert code == 0, err
    assert "longswift: the run in 'c.json' is complete (4 of 4 tokens, stop: length): its outputs are written again" in err
    again = json.loads((tmp_path / "o.json").read_text())
    assert again["token_ids"] == first["token_ids"]
    # nothing was re-read: no resume counted, none claimed in the closing line
    assert again["stats"]["resumes"] == first["stats"]["resumes"] == 0 and "re-read" not in err
    assert again["stats"]["prefill_seconds"] == first["stats"]["prefill_seconds"]


def test_a_tokenswift_resume_plans_its_draft_cache_and_tree_before_loading(tmp_path, capsys, monkeypatch):
    """The resume's memory plan left TokenSwift's buffers out: a run that fits only as AR was refused after
    the model loaded, not before."""
    from conftest import tiny_hf_model

    import longswift.cli.generate as generate_cli
    from longswift import SpecConfig

    tiny_hf_model("llama", seed=5).save_pretrained(tmp_path / "m")
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "generate", "--model", "m", "--prompt-ids", "3,4,5", "--max-new-tokens", "4",
                           "--heads", "random", "--method", "tokenswift", "--checkpoint", "c.json", "--no-progress")
    assert code == 0, err
    planned = []

    def plan(model, runtime, gen, prompt_tokens, spec=None, resumed=False, copies=True):
        planned.append((prompt_tokens, spec, resumed))
        raise generate_cli.LongswiftError("planned")

    monkeypatch.setattr(generate_cli, "_plan_before_loading", plan)
    code, _, err = run_cli(capsys, "generate", "--resume", "c.json", "--no-progress")
    assert code == 2 and planned[0][0] == 3 and isinstance(planned[0][1], SpecConfig) and planned[0][2], err


@pytest.mark.parametrize("heads, drafts", [("auto", False), ("none", False), ("random", True)])
def test_a_model_without_heads_is_planned_as_the_ar_run_it_is(tmp_path, capsys, monkeypatch, heads, drafts):
    """generate planned any run without --method as TokenSwift unless --heads none: a model with no heads (its
    own or shipped), which runs AR, was planned with a draft cache, a tree and heads, and refused runs that fit
    (info, which reads the heads first, planned it as AR)."""
    from conftest import tiny_hf_model

    import longswift.cli.generate as generate_cli
    from longswift import SpecConfig

    tiny_hf_model("llama", seed=5).save_pretrained(tmp_path / "m")
    capsys.readouterr()
    planned = []

    def plan(model, runtime, gen, prompt_tokens, spec=None, resumed=False, copies=True):
        planned.append(spec)
        raise generate_cli.LongswiftError("planned")

    monkeypatch.setattr(generate_cli, "_plan_before_loading", plan)
    code, _, err = run_cli(capsys, "generate", "--model", str(tmp_path / "m"), "--prompt-ids", "3,4,5",
                           "--heads", heads, "--no-progress")
    assert code == 2 and len(planned) == 1 and isinstance(planned[0], SpecConfig) == drafts, err


@pytest.mark.parametrize("rank,said", [("0", "longswift: interrupted\n"), ("1", "longswift (rank 1): interrupted\n")])
def test_a_process_stopped_at_once_under_torchrun_says_which_it_is(capsys, monkeypatch, rank, said):
    """Ctrl-C while the model loads stops every process at once: each said "longswift: interrupted", with no rank
    on the others' lines as their errors have."""
    import longswift.cli.generate as generate_cli

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", rank)

    def loading(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(generate_cli, "cmd_generate", loading)
    code, _, err = run_cli(capsys, "generate", "--prompt", "x")
    assert code == 130 and err == said


@pytest.mark.parametrize("rank,world,said", [("0", "2", True), ("1", "2", False), (None, None, True),
                                             ("1", None, True), ("1", "1", True)])
def test_only_rank_0_says_a_signal_was_received(capsys, monkeypatch, rank, world, said):
    """Under torchrun every process gets the signal: the line was printed once per process. A RANK without a
    WORLD_SIZE above 1 (another launcher's job running one longswift) is no torchrun rank: it says so."""
    import signal

    from longswift.cli.stop import StopRequest

    for name, value in (("RANK", rank), ("WORLD_SIZE", world)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    stop = StopRequest()
    stop._handle(signal.SIGINT, None)
    assert stop.signum == signal.SIGINT
    assert ("SIGINT received: finishing the current step" in capsys.readouterr().err) == said


@pytest.mark.slow
def test_generate_streams_to_stdout(capsys, tmp_path):
    json_file = tmp_path / "o.json"
    code, out, err = run_cli(capsys, "generate", "--prompt", "Count from one to five.", "--chat", "--seed", "3",
                         "--max-new-tokens", "16", "--no-progress", "--json", str(json_file))
    assert code == 0, err
    assert out == json.loads(json_file.read_text())["text"] + "\n"


def test_info_prints_config_and_memory_plan(capsys):
    code, out, err = run_cli(capsys, "info", "--tokens", "100000")
    assert code == 0, err
    assert "parameters: 134,515,008" in out
    assert "num_kv_heads: 3" in out
    assert "memory plan for 100000 tokens with TokenSwift (tree 1,1,1 + 1 n-grams: 7 nodes, lookup steps 32) in float32" in out
    assert "KV cache 4.29 GiB (100032 tokens) + draft KV cache 0.18 GiB (4096 tokens)" in out
    # with the --rope-scaling that extends it so far, as generate advises (it said "--rope-scaling", no factor)
    assert ("100,000 tokens exceed the model's context of 8,192: generation will refuse them unless the context is "
            "extended with --rope-scaling yarn:13") in out
    assert "in memory, past the model's context" in out  # (info's verdict: not a plain "fits")
    code, out, err = run_cli(capsys, "info", "--tokens", "100000000")
    assert "generation will refuse them (no --rope-scaling extends this model's that far)" in out
    code, out, err = run_cli(capsys, "info", "--tokens", "100000", "--rope-scaling", "yarn:16")
    assert code == 0 and "context: 131072 tokens (yarn rope scaling)" in out and "exceed" not in out
    assert "past the model's context" not in out


def test_info_and_generate_say_a_sliding_windows_limit_before_loading(tmp_path, capsys, no_loading):
    """A run past a sliding-window model's window was refused only after the weights loaded (in the API's words),
    and info said it fit; a model's own rope scaling cannot be extended, and info advised --rope-scaling for it."""
    tiny_hf_model("mistral", "default", seed=31, sliding_window=16).save_pretrained(tmp_path / "m")
    code, out, err = run_cli(capsys, "info", "--model", str(tmp_path / "m"), "--tokens", "100")
    assert code == 0, err
    assert "note: 100 tokens exceed this model's sliding window of 16, which longswift does not implement" in out
    assert "past the model's context (the note above)" in out
    code, _, err = run_cli(capsys, "generate", "--model", str(tmp_path / "m"), "--prompt-ids", "3,4,5",
                           "--max-new-tokens", "100", "--heads", "none")
    assert_one_line_error(code, err, "sliding-window attention (16 tokens), which longswift does not implement; keep "
                                     "prompt + --max-new-tokens <= 16")
    tiny_hf_model("llama", "yarn", seed=2).save_pretrained(tmp_path / "y")
    code, out, err = run_cli(capsys, "info", "--model", str(tmp_path / "y"), "--tokens", "100000")
    assert "generation will refuse them (no --rope-scaling extends this model's that far)" in out


def test_info_plans_for_the_prefill_chunk_given(capsys):
    """The prompt's chunk sizes the largest masked forward (its [G*T, T] mask and activations): info takes
    generate's --prefill-chunk, and its plan is the one generate makes."""
    import re

    def workspace(*flags):
        code, out, err = run_cli(capsys, "info", *flags)
        assert code == 0, err
        return float(re.search(r"workspace ([0-9.]+) GiB", out).group(1))

    assert workspace("--prefill-chunk", "4096") > 8 * workspace()


def test_info_and_generate_plan_for_the_threads_given(capsys, monkeypatch):
    """The CPU's flash kernels hold a buffer a thread: generate's plan before loading counted torch's threads (the
    machine's), not --threads, which the load sets only later, and info had no --threads (found by review)."""
    import re

    from longswift import RuntimeConfig
    from longswift.runtime.loading import load_config
    from longswift.runtime.memory import cpu_flash_buffer_bytes
    from longswift.spec.budget import plan_before_loading

    cfg = load_config(None, None)
    plans = {n: plan_before_loading(cfg, RuntimeConfig(device="cpu", threads=n), 8192, 256, None) for n in (2, 64)}
    assert plans[64].workspace - plans[2].workspace == 62 * cpu_flash_buffer_bytes(cfg.head_dim, 1)

    def workspace(*flags):
        code, out, err = run_cli(capsys, "info", "--tokens", "8192", *flags)
        assert code == 0, err
        return float(re.search(r"workspace ([0-9.]+) GiB", out).group(1))

    assert workspace("--threads", "256") > workspace("--threads", "1") + 0.2


@pytest.mark.slow
def test_bench_smoke(tmp_path, capsys):
    md, js = tmp_path / "b.md", tmp_path / "b.json"
    code, out, err = run_cli(capsys, "bench", "--methods", "ar,hf,tokenswift,tokenswift-fused", "--heads", "random",
                         "--prompt-tokens", "16", "--new-tokens", "6", "--runs", "1", "--out", str(md), "--json", str(js))
    assert code == 0, err
    table = md.read_text()
    for method in ("ar", "hf", "tokenswift", "tokenswift-fused"):
        assert f"| {method} |" in table
    assert "hf identical; tokenswift identical; tokenswift-fused identical" in table
    runs = json.loads(js.read_text())["runs"]
    assert [r["method"] for r in runs] == ["ar", "hf", "tokenswift", "tokenswift-fused"]
    assert all(len(r["token_ids"]) == 6 and r["decode_tokens_per_second"] > 0 for r in runs)


def test_bench_refuses_bad_combinations(capsys):
    code, _, err = run_cli(capsys, "bench", "--methods", "ar,hf", "--presets", "greedy,nucleus")
    assert_one_line_error(code, err, "unknown sampling preset(s) ['nucleus']")
    code, _, err = run_cli(capsys, "bench", "--lengths", "2048,4k")
    assert_one_line_error(code, err, "--lengths takes comma-separated whole numbers")
    code, _, err = run_cli(capsys, "bench", "--lengths", "2048,,4096")  # was read as 2048,4096
    assert_one_line_error(code, err, "--lengths has an empty item (a number left out?)")
    code, _, err = run_cli(capsys, "bench", "--prefix", " , ")
    assert_one_line_error(code, err, "--prefix is empty")
    code, _, err = run_cli(capsys, "bench", "--methods", "ar,beam")
    assert_one_line_error(code, err, "unknown bench method")
    code, _, err = run_cli(capsys, "bench", "--methods", "ar", "--prefix", "2048", "--lengths", "8192")
    assert_one_line_error(code, err, "the grid's longest cell (prefix 2048 + 8192 new = 10240 tokens) exceeds this "
                                     "model's context of 8192: lower --lengths or --prefix, or extend the context with "
                                     "--rope-scaling yarn:2")


@pytest.mark.slow
def test_generate_tokenswift_with_random_heads(tmp_path, capsys):
    js_ar, js_ts = tmp_path / "ar.json", tmp_path / "ts.json"
    common = ["generate", "--prompt", "Tell a story.", "--chat", "--seed", "5", "--max-new-tokens", "40",
              "--ignore-eos", "--no-progress"]
    assert run_cli(capsys, *common, "--json", str(js_ar))[0] == 0
    code, out, err = run_cli(capsys, *common, "--heads", "random", "--tree", "1,2,2", "--json", str(js_ts))
    assert code == 0, err
    ar, ts = json.loads(js_ar.read_text()), json.loads(js_ts.read_text())
    assert ts["token_ids"] == ar["token_ids"]  # same seed, same output
    assert ts["stats"]["method"] == "tokenswift" and "alpha" in ts["stats"] and "tokens/step" in err


@pytest.mark.parametrize("args,match", [
    (["--prompt", "hi", "--top-p", "0"], "--top-p must be in (0, 1]"),
    (["--prompt", "hi", "--temperature", "-1"], "--temperature must be 0 (greedy) or a finite number >= 1e-30"),
    (["--prompt", "hi", "--temperature", "inf"], "--temperature must be 0 (greedy) or a finite number >= 1e-30"),
    (["--prompt", "hi", "--checkpoint-every", "5"], "--checkpoint-every needs --checkpoint FILE"),
    (["--prompt", "hi", "--checkpoint-e=5"], "--checkpoint-every needs --checkpoint FILE"),
    (["--prompt", "hi", "--output", "-"], "--output '-' would write a file named '-'"),
    (["--prompt", "hi", "--max-new-tokens", "0"], "--max-new-tokens must be a positive"),
    (["--prompt", "   "], "the prompt is empty"),
    (["--prompt", "hi", "--dtype", "int8"], "--dtype must be one of"),
    (["--prompt", "hi", "--device", "tpu"], "--device must be"),
    (["--prompt", "hi", "--output", "/nonexistent-dir/x.txt"], "does not exist"),
    (["--prompt", "hi", "--json", "/nonexistent-dir/x.json"], "does not exist"),
    (["--prompt", "hi", "--model", "/nonexistent/model.gguf"], "does not exist"),
    (["--prompt", "hi", "--tree", "1,0"], "--tree must be"),
    (["--prompt", "hi", "--draft-mode", "eager"], "--draft-mode must be"),
    (["--prompt", "hi", "--draft-mode", "fused", "--tree", "4"],
     "--tree 4 has one depth, and --draft-mode fused skips the first"),
    (["--prompt", "hi", "--heads", "none", "--method", "tokenswift"], "needs draft heads"),
    (["--prompt", "hi", "--heads", "/nonexistent/heads.safetensors"], "does not exist"),
    (["--max-new-tokens", "5"], "give a prompt: --prompt TEXT, --prompt-file FILE or --prompt-ids IDS"),
    (["--prompt", "hi", "--max-new-tokens", "100000"],  # "hi" in the chat template: 31 tokens, counted before loading
     "prompt (31 tokens) + --max-new-tokens 100000 = 100031 exceeds this model's context of 8192 tokens: lower "
     "--max-new-tokens, or extend the context on purpose with --rope-scaling yarn:13"),
    (["--prompt", "hi", "--max-new-tokens", "1000000000000"], "exceeds this model's context"),
    (["--prompt", "hi", "--max-new-tokens", "8000000", "--rope-scaling", "yarn:1024"], "not enough memory"),
    (["--prompt", "hi", "--rope-scaling", "ntk:2"], "--rope-scaling must be TYPE:FACTOR"),
    (["--prompt", "hi", "--rope-scaling", "yarn:0.5"], "--rope-scaling must be TYPE:FACTOR"),
    (["--prompt", "hi", "--checkpoint-every", "0"], "--checkpoint-every must be a positive"),
    (["--prompt", "hi", "--checkpoint", "/nonexistent-dir/c.json"], "does not exist"),
    (["--resume", "/nonexistent/c.json"], "checkpoint '/nonexistent/c.json' does not exist"),
    (["--resume", "c.json", "--temperature", "0.5"], "--temperature cannot be used with --resume"),
    (["--resume", "c.json", "--seed=9"], "--seed cannot be used with --resume"),
])
def test_bad_generate_arguments(capsys, args, match):
    code, out, err = run_cli(capsys, "generate", *args)
    assert_one_line_error(code, err, match)


@pytest.mark.parametrize("command", ["info", "bench-steps"])
def test_info_and_bench_steps_refuse_a_one_depth_fused_tree_before_planning(capsys, monkeypatch, command):
    """info planned a fused run of --tree 1 (exit 0) that generate refuses; bench-steps refused it only after
    its bandwidth measurement and, on an 8B shape, tens of GiB of random weights. SpecConfig refuses it now."""
    import longswift.bench.steps as steps
    from longswift import SpecConfig

    monkeypatch.setattr(steps, "run_bench_steps", lambda *a, **k: pytest.fail("bench-steps ran"))
    extra = ["--shape", "smollm2-135m", "--layers", "1"] if command == "bench-steps" else []
    code, _, err = run_cli(capsys, command, *extra, "--draft-mode", "fused", "--tree", "1")
    assert_one_line_error(code, err, "--tree 1 has one depth, and --draft-mode fused skips the first")
    with pytest.raises(ValueError, match="SpecConfig.tree 2 has one depth"):
        SpecConfig(draft_mode="fused", tree="2")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="--device auto is CUDA there")
def test_bench_steps_refuses_triton_kernels_off_cuda_before_measuring(capsys, monkeypatch):
    """--device auto on a machine without CUDA: it measured the bandwidth and drew the random weights (an 8B
    shape's tens of GiB) first."""
    import longswift.bench.steps as steps

    monkeypatch.setattr(steps, "measure_bandwidth", lambda *a, **k: pytest.fail("measured"))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    code, _, err = run_cli(capsys, "bench-steps", "--shape", "smollm2-135m", "--layers", "1", "--triton-kernels")
    assert_one_line_error(code, err, "triton_kernels (--triton-kernels): the Triton kernels need a CUDA device")


@pytest.mark.parametrize("args", [["--res", "c.json", "--out", "x.txt", "--js", "x.json"],
                                  ["--resume", "c.json", "--checkpoint-e=5", "--thr", "1", "--dev", "cpu", "--no-pr"]])
def test_abbreviations_of_the_flags_that_apply_on_resume_are_taken(capsys, no_loading, args):
    """argparse takes a unique prefix of a flag; --resume took it for the flags that do not apply
    (refused by the name typed) but refused it for those that do ('--out cannot be used with --resume')."""
    code, _, err = run_cli(capsys, "generate", *args)
    assert_one_line_error(code, err, "checkpoint 'c.json' does not exist")
    code, _, err = run_cli(capsys, "generate", *args, "--temp", "0.5")
    assert_one_line_error(code, err, "--temp cannot be used with --resume")


def test_no_other_generate_flag_is_a_prefix_of_one_that_applies_on_resume():
    """What lets --resume spell out an abbreviation of the flags that apply (cli.generate._spelt_out)."""
    from longswift.cli import build_parser
    from longswift.cli.generate import RESUME_FLAGS

    generate = build_parser()._subparsers._group_actions[0].choices["generate"]
    others = {o for a in generate._actions for o in a.option_strings} - {*RESUME_FLAGS, "--resume"}
    assert len(others) > 40 and not [(o, f) for o in others for f in (*RESUME_FLAGS, "--resume") if f.startswith(o)]


def test_bad_prompt_files(tmp_path, capsys):
    code, _, err = run_cli(capsys, "generate", "--prompt-file", str(tmp_path / "missing.txt"))
    assert_one_line_error(code, err, "does not exist")
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"abc\xff\xfe\x00")
    code, _, err = run_cli(capsys, "generate", "--prompt-file", str(binary))
    assert_one_line_error(code, err, "is not UTF-8 text")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    code, _, err = run_cli(capsys, "generate", "--prompt-file", str(empty))
    assert_one_line_error(code, err, "the prompt is empty")


@pytest.mark.parametrize("flag", ["--prompt", "--system", "--stop", "--ban-token"])
def test_text_arguments_that_are_not_utf8_are_refused_before_loading(capsys, no_loading, flag):
    """A Latin-1 `--prompt "$(cat notes.txt)"` reaches Python as surrogates: the tokenizer failed on them with a
    traceback after loading, a chat template was said to fail, and a --stop string could never match."""
    latin1 = b"caf\xe9".decode("utf-8", "surrogateescape")  # (what Python makes of such an argument)
    args = ["--prompt", latin1] if flag == "--prompt" else ["--prompt", "Hi.", flag, latin1]
    code, _, err = run_cli(capsys, "generate", *args)
    assert_one_line_error(code, err, f"{flag} is not UTF-8 text (byte 0xe9 at character 3): give it in UTF-8 (a "
                                     "UTF-8 locale), or put the prompt in a UTF-8 file (--prompt-file)")


class _Stdin:
    def __init__(self, data: bytes, tty: bool = False) -> None:
        import io

        self.buffer = io.BytesIO(data)
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_a_prompt_files_final_newline_is_not_part_of_the_prompt(tmp_path, capsys):
    """A file saved by an editor (or `echo`) ends in a newline, which was kept inside the prompt: its run differed
    from the same --prompt text (a review). One final newline, "\\n" or "\\r\\n", is the file's end, as llama.cpp's
    -f reads a file; a second one is the prompt's."""
    def prompt_tokens(*source: str) -> int:
        out = tmp_path / "r.json"
        code, _, err = run_cli(capsys, "generate", *source, "--max-new-tokens", "1", "--greedy", "--raw",
                               "--no-progress", "--json", str(out))
        assert code == 0, err
        return json.loads(out.read_text())["stats"]["prompt_tokens"]

    given = prompt_tokens("--prompt", "Say hello.")
    for content, extra in ((b"Say hello.\n", 0), (b"Say hello.\r\n", 0), (b"Say hello.", 0), (b"Say hello.\n\n", 1)):
        (tmp_path / "p.txt").write_bytes(content)
        assert prompt_tokens("--prompt-file", str(tmp_path / "p.txt")) == given + extra, content


def test_a_prompt_file_of_dash_is_standard_input(tmp_path, capsys, monkeypatch, no_loading):
    """`--prompt-file -` reads standard input to its end (the same checks as a file's, named as standard
    input); bench, whose results a prompt file's content identifies, refuses it."""
    from longswift.prompts import read_prompt_file

    monkeypatch.setattr(sys, "stdin", _Stdin(b"\xef\xbb\xbfTell a story.\n"))
    assert read_prompt_file(Path("-")) == "Tell a story.\n"
    monkeypatch.setattr(sys, "stdin", _Stdin(b"ab\xff"))
    code, _, err = run_cli(capsys, "generate", "--prompt-file", "-")
    assert_one_line_error(code, err, "the prompt on standard input is not UTF-8 text (bad byte at offset 2): convert "
                                     "it to UTF-8")
    monkeypatch.setattr(sys, "stdin", _Stdin(b""))
    code, _, err = run_cli(capsys, "generate", "--prompt-file", "-")
    assert_one_line_error(code, err, "the prompt is empty")
    code, _, err = run_cli(capsys, "bench", "--prompt-file", "-")
    assert_one_line_error(code, err, "bench --prompt-file needs a file")
    monkeypatch.setattr(sys, "stdin", _Stdin(b"", tty=True))  # at a terminal: it waited without a word
    code, _, err = run_cli(capsys, "generate", "--prompt-file", "-")
    assert err.startswith("longswift: reading the prompt from the terminal: type it, then press Ctrl-D")
    assert err.splitlines()[-1] == "longswift: error: the prompt is empty: give some prompt text"
    monkeypatch.setattr(sys, "stdin", None)  # (started with it closed, `<&-`: an AttributeError traceback)
    code, _, err = run_cli(capsys, "generate", "--prompt-file", "-")
    assert_one_line_error(code, err, "standard input is closed: write the prompt to a file and give its name")


@pytest.mark.slow
def test_a_prompt_on_standard_input_generates_what_the_same_prompt_given_as_text_does(capsys, monkeypatch):
    args = ["--max-new-tokens", "6", "--greedy", "--no-progress", "--threads", "1"]
    code, want, err = run_cli(capsys, "generate", "--prompt", "Name three colours.", *args)
    assert code == 0, err
    monkeypatch.setattr(sys, "stdin", _Stdin("Name three colours.".encode()))
    code, got, err = run_cli(capsys, "generate", "--prompt-file", "-", *args)
    assert code == 0, err
    assert got == want and got.strip()


def test_a_prompt_file_is_read_without_its_byte_order_mark(tmp_path, capsys):
    """Windows editors start UTF-8 files with a byte-order mark: it is no part of the prompt (it
    was tokenized as three bytes before the text, and broke the first line of a JSONL set)."""
    from longswift.bench.prompts import read_bench_prompt_file
    from longswift.prompts import read_prompt_file

    bom = tmp_path / "bom.txt"
    bom.write_bytes(b"\xef\xbb\xbfSay hi.\n")
    assert read_prompt_file(bom) == "Say hi.\n"
    bom.write_bytes(b"\xef\xbb\xbf\xef\xbb\xbfinner")  # only the mark at the start is one
    assert read_prompt_file(bom) == "\ufeffinner"
    jsonl = tmp_path / "set.jsonl"
    jsonl.write_bytes(b'\xef\xbb\xbf{"id": "a", "prompt": "one"}\n')
    assert read_bench_prompt_file(jsonl).instructions == (("a", "one"),)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xef\xbb\xbfab\xff")
    code, _, err = run_cli(capsys, "generate", "--prompt-file", str(bad))
    assert_one_line_error(code, err, "bad byte at offset 5")  # an offset in the file, the mark counted
    utf16 = tmp_path / "u16.txt"
    utf16.write_bytes("Say hi.".encode("utf-16"))
    code, _, err = run_cli(capsys, "generate", "--prompt-file", str(utf16))
    assert_one_line_error(code, err, "is UTF-16 text: save it as UTF-8")
    utf16.write_bytes("Say hi.".encode("utf-16-le"))  # no mark: it decoded as UTF-8, a NUL after each letter
    code, _, err = run_cli(capsys, "generate", "--prompt-file", str(utf16))
    assert_one_line_error(code, err, "holds NUL characters: it is not text, or is UTF-16 without a byte-order mark")
    utf32 = tmp_path / "u32.txt"  # (its little-endian mark begins with UTF-16's: it was called UTF-16)
    for encoding in ("utf-32-le", "utf-32-be"):
        utf32.write_bytes("\ufeffSay hi.".encode(encoding))
        code, _, err = run_cli(capsys, "generate", "--prompt-file", str(utf32))
        assert_one_line_error(code, err, "is UTF-32 text: save it as UTF-8")


def test_console_script_exit_code():
    proc = subprocess.run([sys.executable, "-m", "longswift.cli", "generate", "--prompt", "x", "--top-k", "-1"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "longswift: error: --top-k must be >= 0"


def test_an_interrupt_while_the_parser_is_built_is_one_line(monkeypatch, capsys):
    """Ctrl-C in the 40 ms the parser takes to build (its imports) came before the command line's handler: a
    traceback, not the one line and status 130 of an interrupt anywhere else."""
    from longswift import console

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr("longswift.cli.build_parser", interrupted)
    assert console.main(["info"]) == 130
    assert capsys.readouterr().err == "longswift: interrupted\n"


def test_a_closed_stdout_stops_quietly():
    """`longswift ... | head`: the reader has gone; the command stops with the status a shell gives a
    tool that the closed pipe killed, and says nothing about it (no traceback, no error line)."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to stdout now fails with EPIPE
    try:
        proc = subprocess.run([sys.executable, "-m", "longswift.cli", "info", "--tokens", "1000"], stdout=write_end, stderr=subprocess.PIPE,
                              text=True, timeout=300)
    finally:
        os.close(write_end)
    assert proc.returncode == 141 and proc.stderr == ""


def test_a_stdout_that_cannot_encode_the_text_shows_question_marks_and_the_run_goes_on(tmp_path):
    """Under an ASCII stdout (a C locale; Windows' code page when redirected) the first character it could not
    encode ended the run with a UnicodeEncodeError traceback, and its --json was never written."""
    import os

    from conftest import byte_tokenizer, tiny_hf_model

    tiny_hf_model("llama", seed=5, vocab=260).save_pretrained(tmp_path / "m")
    tok = byte_tokenizer()
    tok.save_pretrained(tmp_path / "m")
    ascii_ids = [i for i in range(len(tok)) if tok.decode([i]).isascii()]  # banned: the text cannot be ASCII
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    run = subprocess.run([sys.executable, "-m", "longswift.cli", "generate", "--model", "m", "--prompt", "Hi",
                          "--max-new-tokens", "12", "--ignore-eos", "--heads", "none", "--greedy", "--no-progress",
                          "--ban-ids", ",".join(map(str, ascii_ids)), "--json", "r.json"], cwd=tmp_path, env=env,
                         capture_output=True, timeout=300)
    assert run.returncode == 0, run.stderr.decode()
    text = json.loads((tmp_path / "r.json").read_text())["text"]
    assert text and not text.isascii()
    assert run.stdout.decode("ascii") == text.encode("ascii", "replace").decode() + "\n"


def start_long_run(tmp_path, *extra, stdout=subprocess.DEVNULL, **popen):
    """A tiny model's AR run of 30,000 tokens (its ids on stdout) that saves `c.json` every 100; returned
    once the first save is there."""
    import time

    from conftest import tiny_hf_model

    if not (tmp_path / "m").exists():
        tiny_hf_model("llama", seed=5, max_position_embeddings=40000).save_pretrained(tmp_path / "m")
    cmd = [sys.executable, "-m", "longswift.cli", "generate", "--model", "m", "--prompt-ids", "3,4,5",
           "--max-new-tokens", "30000", "--ignore-eos", "--heads", "none", "--seed", "1", "--no-progress",
           "--checkpoint", "c.json", "--checkpoint-every", "100", *extra]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=stdout, stderr=subprocess.PIPE, text=True, **popen)
    deadline = time.time() + 300
    while not (tmp_path / "c.json").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    return proc


def saved_tokens(path):
    from longswift.checkpoint import read_checkpoint

    return len(read_checkpoint(path).token_ids)


def test_a_hangup_stops_and_saves_and_nohup_keeps_running(tmp_path):
    """SIGHUP (the terminal closed, an SSH session lost) used to kill the run with nothing saved; under
    nohup, which ignores it, the run goes on."""
    import signal
    import time

    # (SIGHUP's default action, whatever this process inherited: a test suite run under nohup ignores it)
    proc = start_long_run(tmp_path, "--json", "o.json", preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGHUP, err
    done = json.loads((tmp_path / "o.json").read_text())
    assert done["stats"]["finish_reason"] == "interrupted" and saved_tokens(tmp_path / "c.json") == len(done["token_ids"])
    (tmp_path / "c.json").unlink()
    proc = start_long_run(tmp_path, preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    proc.send_signal(signal.SIGHUP)
    time.sleep(1)
    assert proc.poll() is None  # still running
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM


@pytest.mark.parametrize("signame", ["SIGINT", None])
def test_a_run_whose_output_closes_saves_its_state(tmp_path, signame):
    """`longswift generate ... | tee f` and Ctrl-C: tee dies with the run's pipe, and the run used to exit 141
    with nothing saved though it had said it was saving. Now it saves where an interrupted run saves (also
    when the reader just stops, as `| head` does, if the run keeps a checkpoint) and says how to continue."""
    import signal

    proc = start_long_run(tmp_path, stdout=subprocess.PIPE)
    periodic = saved_tokens(tmp_path / "c.json")
    proc.stdout.close()  # the reader is gone: the next token's write fails
    if signame:
        proc.send_signal(getattr(signal, signame))
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == (128 + getattr(signal, signame) if signame else 141), err
    assert "output closed at" in err and "state saved to 'c.json'. Continue with: longswift generate --resume c.json" in err
    assert saved_tokens(tmp_path / "c.json") >= periodic


def test_a_new_run_does_not_replace_an_unfinished_checkpoint_and_a_resume_saves_as_often(tmp_path, capsys, monkeypatch):
    """Re-running a stopped job's command replaced its saved state with a new start; a resume went back to
    saving every 1024 tokens (--checkpoint-every was not kept)."""
    import signal
    import time

    monkeypatch.chdir(tmp_path)
    proc = start_long_run(tmp_path)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=300)
    before = (tmp_path / "c.json").read_bytes()
    start = saved_tokens(tmp_path / "c.json")
    again = subprocess.run([sys.executable, "-m", "longswift.cli", "generate", "--model", "m", "--prompt-ids", "3,4,5",
                            "--max-new-tokens", "30000", "--heads", "none", "--checkpoint", "c.json"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
    assert_one_line_error(again.returncode, again.stderr, f"'c.json' (--checkpoint) holds an unfinished run ({start} of "
                          "30000 tokens): continue it with `longswift generate --resume c.json`, or delete the file")
    assert (tmp_path / "c.json").read_bytes() == before
    # Nor any other output named on it: --json / --output of a new run (a checkpoint is JSON), --checkpoint of
    # another run's resume (all replaced it, exit 0)
    (tmp_path / "other.json").write_bytes(before)
    capsys.readouterr()
    for flags, named in ((["--prompt-ids", "3,4", "--max-new-tokens", "3", "--json", "c.json"], "--json"),
                         (["--prompt-ids", "3,4", "--max-new-tokens", "3", "--output", "c.json"], "--output"),
                         (["--resume", "other.json", "--checkpoint", "c.json"], "--checkpoint")):
        model = [] if "--resume" in flags else ["--model", "m", "--heads", "none"]
        again = run_cli(capsys, "generate", *model, *flags)
        assert_one_line_error(again[0], again[2], f"'c.json' ({named}) holds an unfinished run ({start} of 30000 tokens)")
        assert (tmp_path / "c.json").read_bytes() == before
    proc = subprocess.Popen([sys.executable, "-m", "longswift.cli", "generate", "--resume", "c.json", "--no-progress"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while (tmp_path / "c.json").read_bytes() == before and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    first_save = saved_tokens(tmp_path / "c.json")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, err
    # AR saves at exactly every 100 tokens from where it resumed (it went back to 1024 before)
    assert (first_save - start) % 100 == 0 and 0 < first_save - start < 1024, (start, first_save)
    from longswift.checkpoint import read_checkpoint

    assert read_checkpoint(tmp_path / "c.json").outputs["checkpoint_every"] == 100


def test_a_resume_does_not_replace_an_output_another_run_wrote_after_its_checkpoint(tmp_path, capsys, monkeypatch):
    """A run stopped with --output o.txt, another run given --output o.txt finished, and the first run's resume
    replaced that run's text without a word. A run writes its outputs before it saves its state: an output newer
    than the checkpoint was written by someone else."""
    import os

    tiny_hf_model("llama", seed=9, vocab=64).save_pretrained(tmp_path / "m")
    monkeypatch.chdir(tmp_path)
    run = ["generate", "--model", "m", "--heads", "none", "--greedy", "--ignore-eos", "--no-progress",
           "--max-new-tokens", "6"]
    code, _, err = run_cli(capsys, *run, "--prompt-ids", "3,4,5", "--output", "o.txt", "--json", "o.json",
                           "--checkpoint", "c.json")
    assert code == 0, err
    mine = (tmp_path / "o.txt").read_text()
    code, _, err = run_cli(capsys, *run, "--prompt-ids", "7,8", "--output", "o.txt")  # the other run
    assert code == 0, err
    theirs = (tmp_path / "o.txt").read_text()
    assert theirs != mine
    saved = (tmp_path / "c.json").stat().st_mtime_ns
    os.utime(tmp_path / "o.txt", ns=(saved + 10**9, saved + 10**9))  # (later, whatever the clock's resolution)
    code, _, err = run_cli(capsys, "generate", "--resume", "c.json", "--no-progress")
    assert_one_line_error(code, err, "'" + str(tmp_path / "o.txt") + "' (the checkpoint's --output) was written after "
                          "the checkpoint was saved, by another run or by hand, and resuming would replace it: move it "
                          "away, or give --output FILE with --resume to write elsewhere")
    assert (tmp_path / "o.txt").read_text() == theirs
    code, _, err = run_cli(capsys, "generate", "--resume", "c.json", "--no-progress", "--output", "again.txt")
    assert code == 0, err  # (o.json is the checkpoint's own, older than it: written again)
    assert (tmp_path / "again.txt").read_text() == mine and (tmp_path / "o.txt").read_text() == theirs
    # (that resume saved the checkpoint again, writing again.txt; one older than its outputs is the run's own)
    code, _, err = run_cli(capsys, *run, "--prompt-ids", "3,4,5", "--output", "o.txt", "--checkpoint", "d.json")
    assert code == 0, err
    code, _, err = run_cli(capsys, "generate", "--resume", "d.json", "--no-progress")
    assert code == 0, err
    assert (tmp_path / "o.txt").read_text() == mine


def test_a_copied_or_moved_job_directory_resumes_into_its_own_outputs(tmp_path, capsys, monkeypatch):
    """`cp -r job job2` and a resume of job2/c.json wrote the text and JSON into job/ (the checkpoint's absolute
    paths), left job2's as they were, and made job's own resume refuse its newer output. Outputs that lay beside
    the checkpoint now follow it; one elsewhere stays where it was; the copy's file times are not checked."""
    import shutil

    tiny_hf_model("llama", seed=9, vocab=64).save_pretrained(tmp_path / "m")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job").mkdir()
    run = ["generate", "--model", "m", "--heads", "none", "--greedy", "--ignore-eos", "--no-progress",
           "--prompt-ids", "3,4,5"]
    code, _, err = run_cli(capsys, *run, "--max-new-tokens", "12", "--json", "whole.json")
    assert code == 0, err
    whole = json.loads((tmp_path / "whole.json").read_text())
    code, _, err = run_cli(capsys, *run, "--max-new-tokens", "6", "--output", "job/o.txt", "--json", "job/o.json",
                           "--checkpoint", "job/c.json")
    assert code == 0, err
    original = {p.name: p.read_bytes() for p in (tmp_path / "job").iterdir()}
    shutil.copytree(tmp_path / "job", tmp_path / "job2")
    (tmp_path / "job2" / "o.txt").touch()  # (a copy's times are the copy's: here the text is newer than its checkpoint)
    with monkeypatch.context() as m:  # a refusal after the outputs followed: one line (the note came before it)
        m.setattr("longswift.cli.generate.os.access", lambda path, mode: False)
        code, _, err = run_cli(capsys, "generate", "--resume", "job2/c.json", "--max-new-tokens", "12", "--no-progress")
        assert_one_line_error(code, err, "cannot update the checkpoint 'job2/c.json' in place")
    code, _, err = run_cli(capsys, "generate", "--resume", "job2/c.json", "--max-new-tokens", "12", "--no-progress")
    assert code == 0, err
    assert f"the checkpoint was saved as '{tmp_path / 'job' / 'c.json'}' (copied or moved since): --json follows " \
           "it to 'job2/o.json', --output follows it to 'job2/o.txt'" in err
    assert {p.name: p.read_bytes() for p in (tmp_path / "job").iterdir()} == original
    done = json.loads((tmp_path / "job2" / "o.json").read_text())
    assert done["token_ids"] == whole["token_ids"]
    assert (tmp_path / "job2" / "o.txt").read_text() == " ".join(map(str, whole["token_ids"]))
    (tmp_path / "job2").rename(tmp_path / "job3")  # moved: the resume goes on in the new place
    code, _, err = run_cli(capsys, "generate", "--resume", "job3/c.json", "--no-progress")
    assert code == 0 and "follows it to 'job3/o.json'" in err, err
    assert json.loads((tmp_path / "job3" / "o.json").read_text())["token_ids"] == whole["token_ids"]
    code, _, err = run_cli(capsys, "generate", "--resume", "job/c.json", "--no-progress")  # the original: in place
    assert code == 0 and "follows" not in err, err
    assert (tmp_path / "job" / "o.txt").read_bytes() == original["o.txt"]
    # An output outside the checkpoint's directory stays where it was recorded
    code, _, err = run_cli(capsys, *run, "--max-new-tokens", "6", "--json", "away.json", "--checkpoint", "job/d.json")
    assert code == 0, err
    shutil.copy(tmp_path / "job" / "d.json", tmp_path / "d.json")
    code, _, err = run_cli(capsys, "generate", "--resume", "d.json", "--max-new-tokens", "12", "--no-progress")
    assert code == 0 and "follows" not in err, err
    assert json.loads((tmp_path / "away.json").read_text())["token_ids"] == whole["token_ids"]
    # The job's checkpoint in a folder of its own: the job's place is the folders the two paths do not share
    (tmp_path / "jobs" / "a" / "ckpt").mkdir(parents=True)
    code, _, err = run_cli(capsys, *run, "--max-new-tokens", "6", "--output", "jobs/a/o.txt", "--json",
                           "jobs/a/../a/o.json", "--checkpoint", "jobs/a/ckpt/c.json")  # (a `..` in one path)
    assert code == 0, err
    shutil.copytree(tmp_path / "jobs" / "a", tmp_path / "jobs" / "b")
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "latest.json").symlink_to(tmp_path / "jobs" / "b" / "ckpt" / "c.json")  # (read through it)
    code, _, err = run_cli(capsys, "generate", "--resume", "links/latest.json", "--max-new-tokens", "12",
                           "--no-progress")
    assert code == 0 and "--json follows it to 'jobs/b/o.json', --output follows it to 'jobs/b/o.txt'" in err, err
    assert json.loads((tmp_path / "jobs" / "b" / "o.json").read_text())["token_ids"] == whole["token_ids"]
    assert len(json.loads((tmp_path / "jobs" / "a" / "o.json").read_text())["token_ids"]) == 6
    assert not (tmp_path / "links" / "o.txt").exists()
    # A copy beside the original (a backup) is no move: an output edited since is not replaced unasked
    shutil.copy2(tmp_path / "jobs" / "a" / "ckpt" / "c.json", tmp_path / "jobs" / "a" / "ckpt" / "backup.json")
    saved = (tmp_path / "jobs" / "a" / "ckpt" / "c.json").stat().st_mtime_ns
    os.utime(tmp_path / "jobs" / "a" / "o.txt", ns=(saved + 10**9, saved + 10**9))
    code, _, err = run_cli(capsys, "generate", "--resume", "jobs/a/ckpt/backup.json", "--no-progress")
    assert_one_line_error(code, err, "(the checkpoint's --output) was written after the checkpoint was saved")


def test_a_new_run_does_not_replace_an_unfinished_checkpoint_of_another_version(tmp_path, capsys, monkeypatch):
    """A checkpoint of a run not yet finished, written by another longswift (a batch script re-run after an
    upgrade), was replaced by a new run's, with exit 0: this longswift cannot resume it, but its own version can."""
    import hashlib

    from longswift.checkpoint import read_checkpoint
    from longswift.errors import LongswiftError

    tiny_hf_model("llama", seed=9, vocab=64).save_pretrained(tmp_path / "m")
    monkeypatch.chdir(tmp_path)
    run = ["generate", "--model", "m", "--heads", "none", "--greedy", "--ignore-eos", "--no-progress",
           "--prompt-ids", "3,4,5"]
    code, _, err = run_cli(capsys, *run, "--max-new-tokens", "6", "--checkpoint", "c.json")
    assert code == 0, err
    outer = json.loads((tmp_path / "c.json").read_text())
    body = outer["checkpoint"]
    body["version"], body["generation"]["max_new_tokens"], body["stats"]["finish_reason"] = "0.0.1", 500, None
    outer["sha256"] = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    (tmp_path / "c.json").write_text(json.dumps(outer))
    before = (tmp_path / "c.json").read_bytes()
    with pytest.raises(LongswiftError, match="written by longswift 0.0.1"):
        read_checkpoint(tmp_path / "c.json")
    code, _, err = run_cli(capsys, *run, "--max-new-tokens", "4", "--checkpoint", "c.json")
    assert_one_line_error(code, err, "'c.json' (--checkpoint) holds an unfinished run (6 of 500 tokens) that this run "
                          "would replace: checkpoint ")
    assert "resume it with longswift 0.0.1" in err and err.rstrip().endswith("or delete the file to start over")
    assert (tmp_path / "c.json").read_bytes() == before

    def rewritten(held_all: bool, sha: str | None = None) -> None:  # the file as that version left it
        body["generation"]["max_new_tokens"] = len(body["token_ids"]) if held_all else 500
        body["stats"]["finish_reason"] = "length" if held_all else None
        digest = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
        outer["sha256"] = sha or digest
        (tmp_path / "c.json").write_text(json.dumps(outer))

    rewritten(held_all=True)  # that version's run reached its length: ended, nothing to keep (a mutation audit)
    code, _, err = run_cli(capsys, *run, "--max-new-tokens", "4", "--checkpoint", "c.json")
    assert code == 0, err
    rewritten(held_all=False, sha="0" * 64)  # damaged: nothing to keep, as before
    code, _, err = run_cli(capsys, *run, "--max-new-tokens", "4", "--checkpoint", "c.json")
    assert code == 0, err


def test_a_model_without_a_tokenizer_writes_its_ids_and_is_told_of_prompt_ids(tmp_path, capsys, monkeypatch):
    """Its text (the ids) began with a space; a text prompt was told to pass "a list of token ids" (the API's
    words); --heads given to the resume of an AR run was taken without a word, and the run went on as AR."""
    tiny_hf_model("llama", seed=9, vocab=64).save_pretrained(tmp_path / "m")
    monkeypatch.chdir(tmp_path)
    run = ["generate", "--model", "m", "--heads", "none", "--greedy", "--ignore-eos", "--no-progress"]
    code, out, err = run_cli(capsys, *run, "--prompt-ids", "3,4,5", "--max-new-tokens", "4", "--output", "o.txt",
                             "--json", "o.json", "--checkpoint", "c.json")
    assert code == 0, err
    ids = json.loads((tmp_path / "o.json").read_text())["token_ids"]
    assert (tmp_path / "o.txt").read_text() == " ".join(map(str, ids))
    code, _, err = run_cli(capsys, "generate", "--resume", "c.json", "--max-new-tokens", "7", "--no-progress")
    assert code == 0, err  # (the resumed run's file holds the whole text, one space between ids)
    ids = json.loads((tmp_path / "o.json").read_text())["token_ids"]
    assert len(ids) == 7 and (tmp_path / "o.txt").read_text() == " ".join(map(str, ids))
    code, _, err = run_cli(capsys, *run, "--prompt", "hello", "--max-new-tokens", "4")
    assert_one_line_error(code, err, "this model has no tokenizer: give the prompt as token ids (--prompt-ids)")
    code, _, err = run_cli(capsys, "generate", "--resume", "c.json", "--heads", "random")
    assert_one_line_error(code, err, "--heads has no use here: the checkpoint's run is AR, and a resumed run keeps its "
                                     "method; drop --heads")


def test_a_finished_run_is_extended_by_resuming_it_with_a_longer_length(tmp_path, capsys, monkeypatch):
    """`--resume CKPT --max-new-tokens N` continues a run that ended at its length to the output a run of N
    tokens writes (sampled, TokenSwift); a length below what the checkpoint holds is refused."""
    tiny_hf_model("llama", seed=9, vocab=64).save_pretrained(tmp_path / "m")
    monkeypatch.chdir(tmp_path)
    run = ["generate", "--model", "m", "--prompt-ids", "3,4,5,3,4,5", "--heads", "random", "--seed", "4",
           "--ignore-eos", "--no-progress"]
    code, _, err = run_cli(capsys, *run, "--max-new-tokens", "60", "--json", "whole.json")
    assert code == 0, err
    code, _, err = run_cli(capsys, *run, "--max-new-tokens", "25", "--json", "part.json", "--checkpoint", "c.json")
    assert code == 0, err
    code, _, err = run_cli(capsys, "generate", "--resume", "c.json", "--max-new-tokens", "10")
    assert_one_line_error(code, err, "--max-new-tokens 10 is below the 25 tokens the checkpoint holds")
    code, _, err = run_cli(capsys, "generate", "--resume", "c.json", "--max-new-tokens", "300")
    assert_one_line_error(code, err, "prompt (6 tokens) + --max-new-tokens 300 = 306 exceeds this model's context "
                                     "of 256 tokens: lower --max-new-tokens")
    assert "rope" not in err  # --resume keeps the checkpoint's rope scaling: the flag would be refused
    code, _, err = run_cli(capsys, "generate", "--resume", "c.json", "--max-new-tokens", "60", "--no-progress")
    assert code == 0, err
    assert "resuming at 25 of 60 tokens" in err
    part, whole = json.loads((tmp_path / "part.json").read_text()), json.loads((tmp_path / "whole.json").read_text())
    assert part["token_ids"] == whole["token_ids"] and part["stats"]["new_tokens"] == 60
    assert part["stats"]["resumes"] == 1 and part["stats"]["finish_reason"] == "length"


def test_a_bfloat16_run_resumed_says_its_tokens_follow_the_distribution(tmp_path, capsys, monkeypatch):
    """A resumed bfloat16 run re-reads its context in other kernels than the steps that wrote it, which round
    otherwise there (bf16 audit: AR greedy parted from the uninterrupted run 27 tokens after the resume): the
    resume says so; float32's does not."""
    tiny_hf_model("llama", seed=9, vocab=64).save_pretrained(tmp_path / "m")
    monkeypatch.chdir(tmp_path)
    for dtype in ("bfloat16", "float32"):
        code, _, err = run_cli(capsys, "generate", "--model", "m", "--prompt-ids", "3,4,5", "--method", "ar",
                               "--ignore-eos", "--no-progress", "--dtype", dtype, "--max-new-tokens", "8",
                               "--json", f"{dtype}.json", "--checkpoint", f"{dtype}.ckpt")
        assert code == 0, err
        code, _, err = run_cli(capsys, "generate", "--resume", f"{dtype}.ckpt", "--max-new-tokens", "12",
                               "--no-progress")
        assert code == 0 and "resuming at 8 of 12 tokens" in err, err
        assert ("in bfloat16 the re-read cache rounds otherwise" in err) == (dtype == "bfloat16"), err


def test_a_checkpoint_an_editor_saved_with_a_byte_order_mark_resumes(tmp_path, capsys, monkeypatch):
    """read_checkpoint takes a UTF-8 byte order mark as no damage, but --resume's check of the file it rewrites
    called such a file 'not a JSON file' and asked for another name, which --resume cannot take; a read-only one
    was refused as an output file, advice that named no --checkpoint."""
    tiny_hf_model("llama", seed=9, vocab=64).save_pretrained(tmp_path / "m")
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "generate", "--model", "m", "--prompt-ids", "3,4,5", "--method", "ar",
                           "--ignore-eos", "--no-progress", "--max-new-tokens", "6", "--checkpoint", "c.json")
    assert code == 0, err
    Path("c.json").write_bytes(b"\xef\xbb\xbf" + Path("c.json").read_bytes())
    Path("c.json").chmod(0o444)  # an archived checkpoint: its refusal named no way on that --resume can take
    code, _, err = run_cli(capsys, "generate", "--resume", "c.json", "--max-new-tokens", "9", "--no-progress")
    assert_one_line_error(code, err, "cannot update the checkpoint 'c.json' in place: it is read-only; make it "
                                     "writable (chmod u+w), or give --checkpoint FILE with --resume")
    code, _, err = run_cli(capsys, "generate", "--resume", "c.json", "--max-new-tokens", "9", "--no-progress",
                           "--checkpoint", "d.json")
    assert code == 0 and "resuming at 6 of 9 tokens" in err, err
    Path("c.json").chmod(0o644)
    code, _, err = run_cli(capsys, "generate", "--resume", "c.json", "--max-new-tokens", "9", "--no-progress")
    assert code == 0 and "resuming at 6 of 9 tokens" in err, err


def sigterm_then_resume(tmp_path, method_args, signum):
    """Run the CLI in a subprocess, stop it with `signum` once its first checkpoint is written,
    check what the interrupted run left, then resume it to the end; return the final JSON."""
    import os
    import time

    cmd = [sys.executable, "-m", "longswift.cli", "generate", "--prompt", "Write a story about a lighthouse keeper.",
           "--chat", "--max-new-tokens", "120", "--ignore-eos", "--no-progress", *method_args,
           "--output", "out.txt", "--json", "out.json", "--checkpoint", "my ck.json", "--checkpoint-every", "30"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 600
    while not (tmp_path / "my ck.json").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 128 + signum, err
    assert "Continue with: longswift generate --resume 'my ck.json'" in err  # quoted: it pastes into a shell
    again = shlex.split(err.split("Continue with: ")[1].splitlines()[0])
    partial = json.loads((tmp_path / "out.json").read_text())
    assert partial["stats"]["finish_reason"] == "interrupted" and 30 <= len(partial["token_ids"]) < 120
    assert (tmp_path / "out.txt").read_text() == partial["text"]  # complete file, not a torn one
    assert not list(tmp_path.glob("*.partial"))
    os.remove(tmp_path / "out.json")
    done = subprocess.run([sys.executable, "-m", "longswift.cli", *again[1:], "--no-progress"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    final = json.loads((tmp_path / "out.json").read_text())  # the checkpoint remembered --output and --json
    assert final["token_ids"][: len(partial["token_ids"])] == partial["token_ids"]
    assert (tmp_path / "out.txt").read_text() == final["text"]
    assert final["stats"]["resumes"] == 1 and final["stats"]["finish_reason"] == "length"
    return final


@pytest.mark.slow
@pytest.mark.parametrize("method,signame", [("tokenswift", "SIGTERM"), ("ar", "SIGINT")])
def test_interrupted_generation_resumes_to_the_uninterrupted_output(embedded, tmp_path, method, signame):
    """Float32: resuming re-prefills the context, whose rounding differs from the step-by-step run's
    by ~1e-6; the output is still identical unless a draw falls within that of a tie (not here)."""
    import signal

    from longswift import GenerationConfig, SamplingConfig

    final = sigterm_then_resume(tmp_path, ["--method", method, "--seed", "3"], getattr(signal, signame))
    whole = embedded.generate("Write a story about a lighthouse keeper.", chat=True, method=method,
                              sampling=SamplingConfig(seed=3),
                              generation=GenerationConfig(max_new_tokens=120, ignore_eos=True))
    assert final["token_ids"] == whole.token_ids
    assert final["text"] == whole.text


LOREM = ("The keeper climbed the stairs of the lighthouse every evening, counting the steps as his father had. "
         "Below him the sea rolled grey and patient against the rocks, and the gulls settled on the rail. ") * 6


@pytest.mark.slow
def test_train_heads_then_eval_heads(tmp_path, capsys):
    data = tmp_path / "d.txt"
    data.write_text(LOREM)
    out = tmp_path / "heads"
    out.mkdir()
    (out / "checkpoint.pt.k1ll3d00.partial").write_bytes(b"half a checkpoint")  # a killed run's: removed, and said
    code, _, err = run_cli(capsys, "train-heads", "--data", str(data), "--out", str(out), "--seq-len", "32",
                       "--steps", "3", "--batch-size", "2", "--warmup", "1", "--no-progress")
    assert code == 0, err
    assert "top-1 accuracy per head" in err
    assert "checkpoint.pt.k1ll3d00.partial', left by a run that was killed while writing it" in err, err
    assert (out / "heads.safetensors").is_file() and (out / "checkpoint.pt").is_file()
    code, _, err = run_cli(capsys, "train-heads", "--data", str(data), "--out", str(out), "--seq-len", "32",
                       "--steps", "3", "--batch-size", "2", "--warmup", "1", "--no-progress")
    assert_one_line_error(code, err, "holds a finished run (heads.safetensors and its checkpoint.pt)")
    js = tmp_path / "eval.json"
    code, out_text, err = run_cli(capsys, "eval-heads", "--heads", str(out / "heads.safetensors"), "--data", str(data),
                              "--seq-len", "32", "--alpha-tokens", "24", "--json", str(js), "--no-progress")
    assert code == 0, err
    result = json.loads(js.read_text())
    assert len(result["accuracy"]["top1"]) == 3 and result["generation"]["new_tokens"] == 24
    assert "head 1: top-1" in out_text and "alpha" in out_text


@pytest.mark.slow
@pytest.mark.parametrize("content, args, match", [
    (b"", [], "the --data is empty"),
    (b"\x00\x01\x02binary", [], "looks binary"),
    (b"too short", ["--seq-len", "64"], "no document reaches --seq-len 64"),
    (None, [], "no training data"),
    (b"text", ["--steps", "0"], "--steps must be positive"),
])
def test_train_heads_bad_data(tmp_path, capsys, content, args, match):
    argv = ["train-heads", "--out", str(tmp_path / "o"), *args]
    if content is not None:
        (tmp_path / "d.txt").write_bytes(content)
        argv += ["--data", str(tmp_path / "d.txt")]
    code, _, err = run_cli(capsys, *argv)
    assert_one_line_error(code, err, match)
    assert not (tmp_path / "o" / "checkpoint.pt").exists()


@pytest.mark.parametrize("args,match", [
    (["--prompt-ids", "1,x"], "--prompt-ids must be token ids"),
    (["--prompt-ids", " , "], "the prompt is empty"),
    (["--prompt-ids", "1,2", "--chat"], "--chat wraps prompt text"),
    (["--prompt-ids", "5 -3"], "--prompt-ids must be in [0, 49152)"),  # refused before loading, as a too large id
    (["--prompt-ids=5,99999"], "--prompt-ids must be in [0, 49152)"),
    (["--prompt-ids", "1,2", "--system", "Be brief."], "--system goes into the chat template, which --prompt-ids "
                                                         "bypasses: give --prompt or --prompt-file"),
    (["--prompt", "Hi", "--raw", "--system", "Be brief."], "--system goes into the chat template, which --raw turns "
                                                          "off: drop one of them"),
    (["--prompt", "Hi", "--system", " "], "--system needs some text"),
])
def test_bad_prompt_ids(capsys, no_loading, args, match):
    code, _, err = run_cli(capsys, "generate", *args)
    assert_one_line_error(code, err, match)


@pytest.mark.parametrize("command", [["eval-heads"], ["generate", "--prompt", "hi"], ["info"], ["bench"],
                                     ["export-heads", "--out", "x.safetensors"]])
@pytest.mark.parametrize("heads", ["/nonexistent", "nope"])
def test_heads_that_are_neither_a_path_nor_a_hub_id_are_refused_first(capsys, no_loading, command, heads):
    """eval-heads said 'no training data' before a --heads path that is not there."""
    code, _, err = run_cli(capsys, *command, "--heads", heads)
    assert_one_line_error(code, err, f"heads '{heads}' do not exist: pass a heads file, a directory holding one")


def tiny_model_and_text(tmp_path, capsys):
    """A tiny random llama saved to tmp_path/tiny (no tokenizer) and a text file of LOREM, for eval-heads."""
    from conftest import tiny_hf_model

    model = tmp_path / "tiny"
    tiny_hf_model("llama", seed=5).save_pretrained(model)
    data = tmp_path / "d.txt"
    data.write_text(LOREM)
    capsys.readouterr()  # save_pretrained's progress bar
    return model, data


def test_eval_heads_without_heads_is_a_one_line_error(tmp_path, capsys):
    """`--heads none`, or `auto` on a model that has none, leaves nothing to evaluate: say so and how."""
    model, data = tiny_model_and_text(tmp_path, capsys)
    code, _, err = run_cli(capsys, "eval-heads", "--model", str(model), "--heads", "none", "--data", str(data))
    assert_one_line_error(code, err, "eval-heads needs draft heads")
    code, _, err = run_cli(capsys, "eval-heads", "--model", str(model), "--heads", "auto", "--data", str(data),
                           "--device", "cpu", "--seq-len", "32")  # within the tiny model's context of 256
    assert_one_line_error(code, err, "--heads auto found no draft heads for this model")


def test_eval_heads_refuses_windows_too_short_for_its_heads(tmp_path, capsys):
    """--seq-len 4 left the third head no target (accuracy 0.000 over no positions) and 2 or 3 raised a
    shape error, after the windows had been run through the model: refused once the heads are known."""
    model, data = tiny_model_and_text(tmp_path, capsys)
    for length in ("3", "4"):
        code, _, err = run_cli(capsys, "eval-heads", "--model", str(model), "--heads", "random", "--data", str(data),
                               "--device", "cpu", "--seq-len", length, "--alpha-tokens", "0", "--no-progress")
        assert_one_line_error(code, err, f"--seq-len {length} leaves head 3 no token to predict")


def test_eval_heads_without_data_says_evaluation_data_and_an_alpha_of_no_drafts_is_na(tmp_path, capsys):
    """It said "no training data"; an alpha run of one token (the prefill's draw, no step drafted) printed alpha
    0.000."""
    from conftest import byte_tokenizer, tiny_hf_model

    model, data = tiny_model_and_text(tmp_path, capsys)
    code, _, err = run_cli(capsys, "eval-heads", "--model", str(model), "--heads", "random")
    assert_one_line_error(code, err, "no evaluation data: pass --data FILE_OR_DIR and/or --self-distill N")
    tiny_hf_model("llama", seed=5, vocab=300).save_pretrained(model)  # with a tokenizer, for the alpha run's prompt
    byte_tokenizer().save_pretrained(model)
    capsys.readouterr()
    code, out, err = run_cli(capsys, "eval-heads", "--model", str(model), "--heads", "random", "--data", str(data),
                             "--device", "cpu", "--seq-len", "32", "--alpha-tokens", "1", "--no-progress")
    assert code == 0, err
    assert "alpha n/a (nothing drafted) (0 of 0 steps after the first token drafted)" in out


@pytest.mark.parametrize("seed, new, batch, refused", [
    (0, 512, 8, True),  # training's own seed: its documents
    (32, 512, 8, True),  # training's batch at 32 again (32 prompts in turn, seed + 32)
    (1, 512, 8, False), (16, 512, 8, False),  # (16: another prompt at each document)
    (32, 512, 64, False),  # (64 a batch: its batch at 0 holds training's 0 to 63, seeded 32, not 0)
    (0, 256, 8, False), (0, 512, 4, False),  # other documents, other batches
    (192, 512, 8, False),  # past training's 192 documents
])
def test_eval_heads_refuses_self_distilling_its_heads_training_documents(seed, new, batch, refused):
    """eval-heads --seed 1 (its default) scored heads trained with --seed 1 on their own training documents, read back
    from the self-distill cache, without a word."""
    import argparse

    from longswift.cli.heads import _check_not_training_documents
    from longswift.errors import LongswiftError

    record = {"settings": {"distill_batch": 8}, "data": {"self_distill": {
        "documents": 192, "new_tokens_per_document": 512, "sampling": {"seed": 0}}}}
    args = argparse.Namespace(self_distill=98_304, seed=seed, distill_new_tokens=new, distill_batch=batch)
    if not refused:
        _check_not_training_documents(record, args)
        return
    with pytest.raises(LongswiftError) as info:
        _check_not_training_documents(record, args)
    assert str(info.value) == (f"eval-heads --seed {seed} would self-distill documents these heads were trained on "
                               "(train-heads --seed 0, --distill-new-tokens 512, --distill-batch 8): give a --seed "
                               "that differs from 0 by other than a multiple of 32, such as --seed 1")
    _check_not_training_documents(None, args)  # (heads without a record: nothing to compare)
    _check_not_training_documents(record, argparse.Namespace(**{**vars(args), "self_distill": 0}))  # (--data only)


@pytest.mark.parametrize("seed, batch, refused", [(0, 32, True), (32, 64, True), (1, 32, False), (16, 8, False)])
def test_eval_heads_refuses_the_shipped_heads_own_documents(embedded, seed, batch, refused):
    """The shipped heads' record has no settings (they were trained before settings were kept), and the check
    returned at once: `eval-heads --heads default --self-distill 16384 --seed 0` scored them on their own training
    text. Without the batch, any seed that differs by a multiple of the 32 requests is refused."""
    import argparse

    from longswift.cli.heads import _check_not_training_documents
    from longswift.errors import LongswiftError

    record = embedded.heads_training_record()
    assert "settings" not in record and record["data"]["self_distill"]["sampling"]["seed"] == 0
    args = argparse.Namespace(self_distill=16_384, seed=seed, distill_new_tokens=512, distill_batch=batch)
    if not refused:
        _check_not_training_documents(record, args)
        return
    with pytest.raises(LongswiftError) as info:
        _check_not_training_documents(record, args)
    assert str(info.value) == (
        f"eval-heads --seed {seed} would self-distill documents these heads were trained on (train-heads --seed "
        "0, --distill-new-tokens 512, a --distill-batch not recorded): give a --seed that differs from 0 by other "
        "than a multiple of 32, such as --seed 1")


def test_eval_heads_refuses_a_tree_deeper_than_its_heads_before_the_accuracy(tmp_path, capsys, monkeypatch):
    """The alpha run refused --tree 1,3,3,3 for heads drafting 2 depths only after the accuracy's work (minutes with
    --self-distill), with no --json written: refused once the heads are known."""
    import longswift.train.eval as evaluation

    monkeypatch.setattr(evaluation, "head_accuracy", lambda *a, **k: pytest.fail("the accuracy ran first"))
    model, data = tiny_model_and_text(tmp_path, capsys)
    heads = tmp_path / "h.safetensors"
    code, _, err = run_cli(capsys, "export-heads", "--model", str(model), "--heads", "random", "--out", str(heads))
    assert code == 0, err  # 3 heads: 4 depths; the tree asks for 5
    assert f"wrote 3 heads random (seeded, for testing) to {heads}" in err  # (said "3 heads (3 heads random ...")
    code, _, err = run_cli(capsys, "eval-heads", "--model", str(model), "--heads", str(heads), "--data", str(data),
                           "--device", "cpu", "--seq-len", "32", "--alpha-tokens", "8", "--tree", "1,2,2,2,2",
                           "--no-progress")
    assert_one_line_error(code, err, "--tree 1,2,2,2,2 has 5 depths but the heads draft only 4")


@pytest.mark.slow
def test_eval_heads_alpha_drafts_at_every_step(tmp_path, capsys):
    """eval-heads' alpha measures the heads: with adaptive steps (generate's default) nearly every
    step can be a plain one, and alpha would come from a handful of drafts. It drafts at every step
    unless --adaptive is given, and says how many steps drafted."""
    data = tmp_path / "d.txt"
    data.write_text(LOREM)
    js = tmp_path / "eval.json"
    args = ("eval-heads", "--heads", "random", "--data", str(data), "--seq-len", "16", "--alpha-tokens", "12",
            "--no-progress", "--threads", "1")
    code, out_text, err = run_cli(capsys, *args, "--json", str(js))
    assert code == 0, err
    gen = json.loads(js.read_text())["generation"]
    assert gen["plain_steps"] == 0 and gen["lookup_steps"] == 0, gen
    assert gen["verify_steps"] == gen["steps"] - 1  # every step but the first token's draw, which follows the prefill
    # (the first token is the prefill's, a step of no drafts: "4 of 5 steps drafted" read as one that did not draft)
    assert f"({gen['verify_steps']} of {gen['steps'] - 1} steps after the first token drafted)" in out_text
    code, out_text, err = run_cli(capsys, *args, "--adaptive", "--json", str(js))
    assert code == 0, err
    gen = json.loads(js.read_text())["generation"]
    assert gen["plain_steps"] > 0, gen  # adaptive steps try a plain step among their first
    # In a log (stderr no terminal, no --no-progress): a plain line as each phase starts (there was none)
    code, _, err = run_cli(capsys, *[a for a in args if a != "--no-progress"])
    assert code == 0, err
    assert ("longswift: the heads' accuracy on " in err and " windows x 16 tokens\n" in err
            and "longswift: held-out TokenSwift generation of 12 tokens (paper sampling)\n" in err), err


@pytest.mark.slow
def test_an_interrupted_run_whose_outputs_cannot_be_written_still_saves_its_state(tmp_path, capsys, monkeypatch):
    """Ctrl-C, then the --json output failed to stage (its directory removed during the run, a full disk under the
    outputs): the state was not saved either, though the checkpoint's place was fine, and ~1,200 tokens were lost
    (found by review). Now the state is saved, neither output written, and the run resumes to the same tokens."""
    from conftest import tiny_hf_model

    import longswift
    from longswift import GenerationConfig, SamplingConfig
    from longswift.checkpoint import read_checkpoint
    from longswift.cli.outputs import Outputs, write_run
    from longswift.cli.stop import StopRequest

    engine = longswift.load(tiny_hf_model(), heads="random")

    def stream():
        return engine.stream([3, 4, 5], sampling=SamplingConfig(seed=1), method="ar",
                             generation=GenerationConfig(max_new_tokens=20, ignore_eos=True))

    whole = list(engine.generate([3, 4, 5], sampling=SamplingConfig(seed=1), method="ar",
                                 generation=GenerationConfig(max_new_tokens=20, ignore_eos=True)).token_ids)
    stop = StopRequest()

    class Signalled(Proxy):  # a SIGINT after 7 steps (the handler's part: the signal number set)
        def __iter__(self):
            for i, ids in enumerate(self._stream):
                if i == 6:
                    stop.signum = 2
                yield ids

    out = Outputs(tmp_path / "out.txt", tmp_path / "gone" / "r.json", tmp_path / "c.json", 100)
    code = write_run(engine, Signalled(stream()), out, stop, no_progress=True)
    err = capsys.readouterr().err
    assert code == stop.exit_code == 130, err
    assert "the outputs could not be written (cannot write" in err and "state saved to" in err, err
    assert not (tmp_path / "out.txt").exists() and not list(tmp_path.glob("*.partial"))
    saved = read_checkpoint(tmp_path / "c.json").token_ids
    assert len(saved) == 7 and saved == whole[:7], saved
    resumed = list(engine.resume(tmp_path / "c.json"))  # (steps' ids, after the 7 it holds)
    resumed = saved + [t for ids in resumed for t in ids]
    assert resumed == whole


def test_an_error_inside_a_step_saves_the_state_before_it_and_says_so_in_one_line(tmp_path, capsys):
    """An error inside a step (out of GPU memory on a shared device) was a traceback, and the state the stream kept
    from before that step was not saved (found by review): now it is, and one line says where and how to go on."""
    from conftest import tiny_hf_model

    import longswift
    from longswift import GenerationConfig, SamplingConfig
    from longswift.checkpoint import read_checkpoint
    from longswift.cli.outputs import Outputs, write_run
    from longswift.cli.stop import StopRequest

    engine = longswift.load(tiny_hf_model(), heads="random")
    gen = GenerationConfig(max_new_tokens=20, ignore_eos=True)
    whole = engine.generate([3, 4, 5], sampling=SamplingConfig(seed=1), method="ar", generation=gen).token_ids
    stream = engine.stream([3, 4, 5], sampling=SamplingConfig(seed=1), method="ar", generation=gen)

    def failing(steps):
        for i, ids in enumerate(steps):
            if i == 7:  # (the step's draws made: the state before it is what a resume must start from)
                raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore of the allocator's words")
            yield ids

    stream._steps = failing(stream._steps)
    with pytest.raises(longswift.LongswiftError) as failed:
        write_run(engine, stream, Outputs(None, None, tmp_path / "c.json", 100), StopRequest(), no_progress=True)
    said = str(failed.value)
    assert said.startswith("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (--debug shows where); state "
                           "before that step saved at 7 of 20 tokens to "), said
    assert "\n" not in said and "c.json': continue with: longswift generate --resume " in said, said
    saved = read_checkpoint(tmp_path / "c.json").token_ids
    assert saved == whole[:7]
    assert saved + [t for ids in engine.resume(tmp_path / "c.json") for t in ids] == whole


def test_a_finished_run_whose_checkpoint_cannot_be_saved_keeps_its_outputs(tmp_path, capsys, monkeypatch):
    """A finished run's final checkpoint failed (a file-size limit, a full disk under it alone): its staged text and
    JSON, complete, were discarded with it, and with no periodic checkpoint before nothing of the run was left
    (found by review). Now the outputs are written and the error says the checkpoint alone is missing."""
    from conftest import tiny_hf_model

    import longswift
    from longswift import GenerationConfig, SamplingConfig
    from longswift.checkpoint import Checkpoint
    from longswift.cli.outputs import Outputs, write_run
    from longswift.cli.stop import StopRequest

    def full(self, path):
        raise OSError(27, "File too large", str(path))

    monkeypatch.setattr(Checkpoint, "save", full)
    engine = longswift.load(tiny_hf_model(), heads="random")
    stream = engine.stream([3, 4, 5], sampling=SamplingConfig(seed=1), method="ar",
                           generation=GenerationConfig(max_new_tokens=12, ignore_eos=True))
    out = Outputs(tmp_path / "out.txt", tmp_path / "r.json", tmp_path / "c.json", 100)
    with pytest.raises(OSError, match=r"^\[Errno 27\] File too large: '.*c.json'; the run finished and its outputs "
                                      r"were written, but its checkpoint could not be saved to '.*c.json'$"):
        write_run(engine, stream, out, StopRequest(), no_progress=True)
    assert len(json.loads((tmp_path / "r.json").read_text())["token_ids"]) == 12
    assert (tmp_path / "out.txt").is_file() and not (tmp_path / "c.json").exists()


def test_a_second_ctrl_c_in_train_heads_names_the_checkpoint_to_continue_from(tmp_path, capsys, monkeypatch):
    """The second signal stops at once, without saving: the checkpoint.pt of the last saved step still
    resumes (bit for bit), and the interruption says so and how, not only 'interrupted'."""
    from conftest import tiny_hf_model

    import longswift.cli.heads as heads_cli
    import longswift.train.train as train_module

    tiny_hf_model("llama", seed=5).save_pretrained(tmp_path / "m")
    (tmp_path / "d.txt").write_text(LOREM)
    capsys.readouterr()

    def cut(engine, windows, cfg, out, **kwargs):  # saved a step, then the second Ctrl-C
        assert Path(out).is_dir() and kwargs["claimed"]  # (made and held before loading)
        import torch

        torch.save({"step": 7, "config": {"steps": 20}}, Path(out) / "checkpoint.pt")
        raise KeyboardInterrupt

    monkeypatch.setattr(heads_cli, "prepare_windows", lambda *a, **k: (None, None, {}))  # (tiny has no tokenizer)
    monkeypatch.setattr(train_module, "train_heads", cut)
    out = tmp_path / "h"
    code, _, err = run_cli(capsys, "train-heads", "--model", str(tmp_path / "m"), "--data", str(tmp_path / "d.txt"),
                           "--out", str(out), "--seq-len", "32", "--no-progress")
    assert code == 130, err
    assert err.startswith(f"longswift: interrupted; '{out / 'checkpoint.pt'}' holds the last saved step (step 7 of "
                          "20): continue with: longswift train-heads --model "), err
    assert err.rstrip().endswith(" --resume")


@pytest.mark.parametrize("when", ["loading", "hidden states", "resumed"])
def test_train_heads_stopped_before_its_steps_writes_nothing(tmp_path, capsys, monkeypatch, when):
    """SIGTERM while the model loads or the hidden states are computed (80 s for the shipped heads'
    windows) has nothing to save: the command stops at once with the signal's status and one line,
    leaving no --out (nor the parents it would have made), no lock file; a resumed run names the
    checkpoint it started from. (It died with no word, leaving *.lock files in --out.)"""
    import os
    import signal

    import longswift.engine as engine_module
    import longswift.train.train as train_module

    data = tmp_path / "d.txt"
    data.write_text(LOREM)
    common = ["--data", str(data), "--seq-len", "32", "--steps", "2", "--warmup", "1", "--no-progress",
              "--threads", "1"]
    out = tmp_path / "runs" / "new" / "heads"
    if when == "resumed":  # a checkpoint whose run has not written its heads yet
        out = tmp_path / "heads"
        code, _, err = run_cli(capsys, "train-heads", "--out", str(out), *common)
        assert code == 0, err
        (out / "heads.safetensors").unlink()
        (out / "train_log.json").unlink()
        saved = (out / "checkpoint.pt").read_bytes()
    module, name = (train_module, "base_hidden") if when == "hidden states" else (engine_module, "load")
    real = getattr(module, name)

    def signalled(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # the handler raises here, at once
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, signalled)
    resume = ["--resume"] if when == "resumed" else []
    code, _, err = run_cli(capsys, "train-heads", "--out", str(out), *common, *resume)
    assert code == 143, err
    if when == "resumed":
        assert err.strip().splitlines()[-1].startswith(f"longswift: interrupted; '{out / 'checkpoint.pt'}' holds the "
                                                       "last saved step (step 2 of 2): continue with: longswift "
                                                       "train-heads"), err
        assert sorted(p.name for p in out.iterdir()) == ["checkpoint.pt"]
        assert (out / "checkpoint.pt").read_bytes() == saved
    else:
        assert err.strip().splitlines()[-1] == "longswift: stopped before a checkpoint was saved: nothing written", err
        assert sorted(p.name for p in tmp_path.iterdir()) == ["d.txt"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handlers are given back


def test_train_heads_interrupted_saves_and_resumes_to_the_same_heads(tmp_path, capsys, monkeypatch):
    """Ctrl-C during train-heads finishes the step, saves the checkpoint (not only every
    --checkpoint-every steps), prints the command that continues, and that command ends with the
    heads an uninterrupted run writes."""
    import os
    import shlex
    import signal

    import torch
    from safetensors.torch import load_file

    from longswift.train.train import HeadTrainer

    data = tmp_path / "d.txt"
    data.write_text(LOREM)
    common = ["--data", str(data), "--seq-len", "32", "--steps", "5", "--batch-size", "2", "--warmup", "1",
              "--no-progress", "--threads", "1"]
    code, _, err = run_cli(capsys, "train-heads", "--out", str(tmp_path / "whole"), *common)
    assert code == 0, err

    run_step = HeadTrainer.run_step

    def interrupted_step(self):
        metrics = run_step(self)
        if self.step == 2:
            os.kill(os.getpid(), signal.SIGINT)  # arrives during step 2: training stops after it
        return metrics

    monkeypatch.setattr(HeadTrainer, "run_step", interrupted_step)
    out = tmp_path / "cut"
    code, _, err = run_cli(capsys, "train-heads", "--out", str(out), *common)
    monkeypatch.setattr(HeadTrainer, "run_step", run_step)
    assert code == 130, err
    assert torch.load(out / "checkpoint.pt", weights_only=True)["step"] == 2
    assert not (out / "heads.safetensors").exists()
    line = err.strip().splitlines()[-1]
    assert "interrupted at step 2 of 5" in line and "Continue with: longswift train-heads" in line, err
    again = shlex.split(line.split("Continue with: ")[1])
    assert again[-1] == "--resume"
    code, _, err = run_cli(capsys, *again[1:])
    assert code == 0, err
    assert "for 5 steps (3 in this run, resumed at step 2) in " in err, err  # the time is this run's
    whole, resumed = load_file(tmp_path / "whole" / "heads.safetensors"), load_file(out / "heads.safetensors")
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)


@pytest.mark.parametrize("data", [["--data", "TEXT"], ["--self-distill", "64"]])
def test_train_heads_on_a_model_without_tokenizer_says_what_is_missing(tmp_path, capsys, data):
    """Without a tokenizer neither --data nor --self-distill can work: the error says so and what to
    add, instead of sending --data users to --self-distill and --self-distill users to --data."""
    from conftest import tiny_hf_model

    model = tmp_path / "tiny"
    tiny_hf_model("llama", seed=5).save_pretrained(model)
    (tmp_path / "d.txt").write_text(LOREM)
    capsys.readouterr()  # save_pretrained's progress bar
    data = [str(tmp_path / "d.txt") if a == "TEXT" else a for a in data]
    code, _, err = run_cli(capsys, "train-heads", "--model", str(model), "--out", str(tmp_path / "o"), *data,
                           "--seq-len", "8", "--no-progress")
    assert_one_line_error(code, err, "this model has no tokenizer, and both --data (text) and --self-distill")
    assert not (tmp_path / "o").exists()


def test_eval_heads_defaults_make_self_distilled_windows():
    """eval-heads --self-distill with its defaults: each document (prompt + --distill-new-tokens) fills a
    --seq-len window, as in train-heads (a 1024-token window was refused: no document reached it)."""
    from longswift.cli import build_parser
    from longswift.train.train import TrainConfig

    args = build_parser().parse_args(["eval-heads", "--heads", "default", "--self-distill", "64"])
    assert args.seq_len == TrainConfig.seq_len <= args.distill_new_tokens


@pytest.mark.parametrize("tty,no_progress,shown", [(True, False, True), (False, False, False), (True, True, False),
                                                   (False, True, False)])
def test_progress_bars_only_on_a_terminal(monkeypatch, tty, no_progress, shown):
    """train-heads and eval-heads drew their bars into a redirected stderr (5 KB of carriage-return redraws
    in a log file); generate's display already kept to a terminal."""
    import argparse
    import io

    from longswift.cli.flags import show_progress

    class Stderr(io.StringIO):
        def isatty(self):
            return tty

    monkeypatch.setattr(sys, "stderr", Stderr())
    assert show_progress(argparse.Namespace(no_progress=no_progress)) == shown
    # ... and where no bar is drawn for want of a terminal, plain lines now and then (train-heads under nohup)
    from longswift.cli.flags import progress_lines

    lines = progress_lines(argparse.Namespace(no_progress=no_progress))
    assert (lines is not None) == (not tty and not no_progress)
    if lines is not None:
        lines("step 50/300")
        assert sys.stderr.getvalue() == "longswift: step 50/300\n"


def test_a_disk_error_in_train_heads_names_the_checkpoint_to_continue_from(tmp_path, capsys, monkeypatch):
    """A write that failed after a checkpoint was saved (the heads file on a directory made read-only, a
    full disk) said only the system's reason: the saved step and how to continue are said on the same line."""
    import errno

    from conftest import tiny_hf_model

    import longswift.cli.heads as heads_cli
    import longswift.train.train as train_module

    tiny_hf_model("llama", seed=5).save_pretrained(tmp_path / "m")
    (tmp_path / "d.txt").write_text(LOREM)
    capsys.readouterr()

    def full(engine, windows, cfg, out, **kwargs):  # saved a step, then the disk refused the heads file
        (Path(out) / "checkpoint.pt").write_bytes(b"saved")
        raise OSError(errno.ENOSPC, "No space left on device", str(Path(out) / "heads.safetensors.x1.partial"))

    monkeypatch.setattr(heads_cli, "prepare_windows", lambda *a, **k: (None, None, {}))  # (tiny has no tokenizer)
    monkeypatch.setattr(train_module, "train_heads", full)
    out = tmp_path / "h"
    code, _, err = run_cli(capsys, "train-heads", "--model", str(tmp_path / "m"), "--data", str(tmp_path / "d.txt"),
                           "--out", str(out), "--seq-len", "32", "--no-progress")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"longswift: error: [Errno 28] No space left on device: '{out / 'heads.safetensors.x1.partial'}'; "
                          f"'{out / 'checkpoint.pt'}' holds the last saved step: continue with: longswift train-heads "
                          "--model "), err
    assert err.rstrip().endswith(" --resume (--debug shows where)")


def test_a_signal_during_the_last_step_leaves_a_complete_run(tmp_path, capsys, monkeypatch):
    """A SIGTERM that lands while the run's last step runs: every token is there, so the outputs say how the
    run ended ("length"), not "interrupted", and the command exits 0 (it said interrupted and exited 143)."""
    import signal

    import longswift.cli.display as display

    tiny_hf_model("llama", seed=9, vocab=64).save_pretrained(tmp_path / "m")
    made = display.make_display

    def signalling(text_file, total, initial, progress):
        shown = made(text_file, total, initial, progress)
        advance = shown.advance

        def then_signal(n, stats):
            advance(n, stats)
            if stats.new_tokens >= total:
                os.kill(os.getpid(), signal.SIGTERM)  # (StopRequest's handler notes it; the loop then asks)
        shown.advance = then_signal
        return shown

    monkeypatch.setattr(display, "make_display", signalling)
    capsys.readouterr()
    code, _, err = run_cli(capsys, "generate", "--model", str(tmp_path / "m"), "--prompt-ids", "3,4,5", "--heads",
                           "none", "--max-new-tokens", "6", "--ignore-eos", "--no-progress", "--json",
                           str(tmp_path / "o.json"))
    assert code == 0, err
    done = json.loads((tmp_path / "o.json").read_text())
    assert len(done["token_ids"]) == 6 and done["stats"]["finish_reason"] == "length", done["stats"]


def test_resuming_a_run_a_stop_string_ended_or_whose_model_moved(tmp_path, capsys, monkeypatch):
    """A stop string's run resumed with a longer length said "resuming at ... (re-reading ...)" and then generated
    nothing; a checkpoint whose model directory moved said only that the path does not exist."""
    import hashlib

    tiny_hf_model("llama", seed=9, vocab=64).save_pretrained(tmp_path / "m")
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "generate", "--model", str(tmp_path / "m"), "--prompt-ids", "3,4,5", "--heads", "none",
                           "--max-new-tokens", "8", "--ignore-eos", "--no-progress", "--json", "o.json",
                           "--checkpoint", "c.json")
    assert code == 0, err
    outer = json.loads((tmp_path / "c.json").read_text())  # as a stop string would have ended it, at 8 tokens
    outer["checkpoint"]["stats"]["finish_reason"] = "stop"
    outer["checkpoint"]["generation"]["max_new_tokens"] = 10
    canonical = json.dumps(outer["checkpoint"], sort_keys=True, separators=(",", ":"))
    outer["sha256"] = hashlib.sha256(canonical.encode()).hexdigest()
    (tmp_path / "c.json").write_text(json.dumps(outer))
    code, _, err = run_cli(capsys, "generate", "--resume", "c.json", "--max-new-tokens", "20")
    assert code == 0, err
    assert "the run in 'c.json' is complete (8 of 20 tokens, stop: stop)" in err and "re-reading" not in err
    (tmp_path / "m").rename(tmp_path / "moved")
    code, _, err = run_cli(capsys, "generate", "--resume", "c.json")
    assert_one_line_error(code, err, f"the checkpoint's model '{tmp_path / 'm'}' no longer exists: give --model PATH "
                                     "with --resume")
    code, _, err = run_cli(capsys, "generate", "--resume", "c.json", "--model", "moved")
    assert code == 0, err


@pytest.mark.parametrize("native", [False, True])
def test_half_precision_on_a_cpu_that_emulates_it_gets_a_note(tmp_path, capsys, monkeypatch, native):
    """--dtype bfloat16 on a CPU whose oneDNN has no bfloat16 products (AVX2 only: torch emulates them, a 2K-token
    prompt 5x and decoding 2x slower than float32 on session 48's AMD EPYC) says so in one note, for generate
    (and its resume) and bench; where the CPU has them, and for float32, nothing is said."""
    import torch
    from conftest import tiny_hf_model

    import longswift.runtime.linear as linear

    # (--no-pack-weights: a CPU that emulates bfloat16 cannot pack it, whatever the patched probe says)
    monkeypatch.setattr(linear, "onednn_computes", lambda dtype: native or dtype == torch.float32)
    monkeypatch.setattr(linear, "bfloat16_products_native", lambda: native)  # (AVX512-BF16: its own test below)
    tiny_hf_model("llama", seed=5).save_pretrained(tmp_path / "m")
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    note = "note: this CPU has no native bfloat16 arithmetic (AVX-512 or AVX-NE-CONVERT): torch emulates it"
    for dtype, said in (("bfloat16", not native), ("float32", False)):
        code, _, err = run_cli(capsys, "generate", "--model", "m", "--prompt-ids", "3,4,5", "--max-new-tokens", "3",
                               "--heads", "none", "--dtype", dtype, "--no-progress", "--checkpoint", f"{dtype}.json",
                               "--no-pack-weights")
        assert code == 0, err
        assert (f"longswift: {note}" in err) is said, err
        assert err.count("note:") == int(said)
    code, _, err = run_cli(capsys, "generate", "--resume", "bfloat16.json", "--no-progress")
    assert code == 0 and (f"longswift: {note}" in err) is (not native), err
    code, _, err = run_cli(capsys, "generate", "--model", "nothing-here", "--prompt-ids", "3", "--dtype", "bfloat16")
    assert code == 2 and len(err.strip().splitlines()) == 1, err  # an error is still one line: the note comes later
    code, _, err = run_cli(capsys, "bench", "--model", "m", "--methods", "ar", "--prompt-tokens", "8", "--lengths", "4",
                           "--runs", "1", "--dtype", "bfloat16", "--no-progress", "--out-dir", "b", "--no-pack-weights")
    assert code == 0, err
    assert (note in err) is (not native), err
    assert linear.half_precision_note(torch.float16, torch.device("cuda")) is None


@pytest.mark.parametrize("native", [False, True])
def test_bfloat16_on_avx512_without_bf16_arithmetic_gets_its_own_note(monkeypatch, native):
    """oneDNN runs bfloat16 on AVX-512 without AVX512-BF16 by converting to float32: one-row products run faster,
    many-row ones 2.4-3.4x slower (docs/scripts/bf16_head_rows.py). No note was given there."""
    import torch

    import longswift.runtime.linear as linear

    monkeypatch.setattr(linear, "onednn_computes", lambda dtype: True)
    monkeypatch.setattr(linear, "bfloat16_products_native", lambda: native)
    note = linear.half_precision_note(torch.bfloat16, torch.device("cpu"))
    assert (note is None) is native
    if not native:
        assert note.startswith("this CPU has no bfloat16 arithmetic (AVX512-BF16 or AMX): oneDNN converts to float32")
    assert linear.half_precision_note(torch.float16, torch.device("cpu")) is None  # (float16: oneDNN's own)


def test_eval_heads_alpha_on_a_model_without_a_tokenizer_says_what_to_do(tmp_path, capsys):
    """encode's advice, to pass token ids, was no option eval-heads has (session 49's review)."""
    model, data = tiny_model_and_text(tmp_path, capsys)
    code, _, err = run_cli(capsys, "eval-heads", "--model", str(model), "--heads", "random", "--data", str(data),
                           "--device", "cpu", "--seq-len", "16", "--no-progress")
    assert_one_line_error(code, err, "the alpha run writes from a held-out text prompt, and this model has no "
                                     "tokenizer: put its tokenizer files")
    assert err.strip().endswith("or give --alpha-tokens 0")


def test_help_and_flag_errors_come_without_importing_torch():
    """`longswift --help`, a command's --help and a flag's one-line error came after torch's import (4-6 s on this
    project's CPUs); the command line parses its flags with the configs alone, torch-free (0.2-0.4 s)."""
    argvs = (["--help"], ["--version"], ["generate", "--help"], ["bench", "--help"], ["bench-steps", "--help"],
             ["train-heads", "--help"], ["eval-heads", "--help"], ["export-heads", "--help"], ["info", "--help"],
             ["generate", "--prompt", "x", "--bogus"], ["generate", "--prompt", "x", "--dtype", "bad"],
             ["bench-steps", "--shape", "nope"])
    script = ("import sys\nfrom longswift.cli import main\ncodes = []\nfor argv in %r:\n    try:\n"
              "        codes.append(main(list(argv)))\n    except SystemExit as exc:\n        codes.append(exc.code)\n"
              "print(codes, 'torch' in sys.modules, file=sys.stderr)" % (argvs,))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stderr.strip().splitlines()[-1] == f"{[0, 0] + [0] * 7 + [2, 2, 2]} False", done.stderr
