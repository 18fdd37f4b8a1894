"""What a person sees: `longswift generate` in a terminal (a pseudo-terminal read through the
pyte terminal emulator), where the text must stream readably under a status line."""

from __future__ import annotations

import json
import os
import pty
import struct
import subprocess
import sys
import time

import pytest

pyte = pytest.importorskip("pyte", reason="pyte (a dev extra: pip install -e '.[dev]') emulates the terminal screen")

COLS, ROWS = 100, 30


def run_in_terminal(argv: list[str], cwd, timeout: float = 600) -> tuple[int, list[str]]:
    """Run `python -m longswift ARGV` with stdin, stdout and stderr on a COLS x ROWS pseudo-terminal;
    return its exit status and the screen as a person would see it at the end (scrolled-off lines
    included)."""
    import fcntl
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR", "TERM")}
    env["TERM"] = "xterm-256color"
    proc = subprocess.Popen([sys.executable, "-m", "longswift", *argv], cwd=cwd, stdin=slave, stdout=slave,
                            stderr=slave, env=env, close_fds=True)
    os.close(slave)
    screen = pyte.HistoryScreen(COLS, ROWS, history=1000)
    stream = pyte.ByteStream(screen)
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the process closed the terminal
            break
        if not data:
            break
        stream.feed(data)
    os.close(master)
    code = proc.wait(timeout=60)
    lines = ["".join(ch.data for ch in (row[x] for x in range(COLS))).rstrip() for row in screen.history.top]
    lines += [line.rstrip() for line in screen.display]
    return code, [line for line in lines if line]


def squeeze(text: str) -> str:
    return "".join(text.split())


@pytest.mark.slow
def test_streamed_text_is_readable_in_a_terminal(tmp_path):
    code, lines = run_in_terminal(["generate", "--prompt", "Write a story about a lighthouse keeper.", "--seed", "4",
                                   "--max-new-tokens", "64", "--ignore-eos", "--json", "o.json"], tmp_path)
    screen = "\n".join(lines)
    assert code == 0, screen
    text = json.loads((tmp_path / "o.json").read_text())["text"]
    assert len(squeeze(text)) > 100, text
    # The whole text is on the screen in one piece: no status line or bar scraps inside it.
    assert squeeze(text) in squeeze(screen), screen
    # The status line was transient: what is left is the text and the one summary line.
    status = [line for line in lines if "tok/s" in line]
    assert len(status) == 1 and status[0].startswith(("ar: 64 tokens", "tokenswift: 64 tokens")), screen
    assert all(len(line) <= COLS for line in lines)


def test_the_status_says_the_context_is_being_read_until_the_first_token(capsys):
    """A resume's re-read of a long context takes minutes on a CPU: the status line says so instead of
    sitting at 0 tokens; the first token's status replaces it."""
    from types import SimpleNamespace

    from longswift.cli.display import PlainDisplay, TerminalDisplay

    term = TerminalDisplay(total=100, initial=0)
    term.prefill(12_288, 50_000)
    assert term.progress.tasks[0].fields["spec"] == "reading the context: 12,288/50,000 tokens"
    term.prefill(50_000, 50_000)
    assert term.progress.tasks[0].fields["spec"] == ""
    term.advance(1, SimpleNamespace(method="ar", steps=1))
    import io

    from tqdm import tqdm

    plain = PlainDisplay(lambda text: None, total=100, initial=0, progress=True)
    plain.bar = tqdm(total=100, file=io.StringIO(), disable=False)  # as on a terminal (stderr is captured here)
    with plain:
        plain.prefill(16, 40)
        assert plain.bar.postfix == "reading the context: 16/40 tokens"
        plain.prefill(40, 40)
        assert not plain.bar.postfix


def test_the_status_line_is_redrawn_a_few_times_a_second_not_per_step(monkeypatch):
    """A redraw costs ~0.5 ms: at every step it took 0.58 ms a token (a GPU step of the embedded model
    is ~2 ms). The line being written still shows at once after a pause."""
    from longswift.cli import display

    term = display.TerminalDisplay(total=1000, initial=0)
    clock = [100.0]
    monkeypatch.setattr(display.time, "monotonic", lambda: clock[0])
    redraws = []
    monkeypatch.setattr(term.progress, "refresh", lambda: redraws.append(clock[0]))
    for _ in range(200):  # 200 steps in 0.2 s
        term.text("a ")
        clock[0] += 0.001
    assert len(redraws) == 4  # at 0, 0.05, 0.10, 0.15 s
    clock[0] += 1.0
    term.text("b")  # after a pause: drawn at once
    assert redraws[-1] == clock[0]


def test_control_characters_the_model_writes_do_not_reach_the_terminal(monkeypatch):
    """An escape sequence in the generated text (a byte-level tokenizer can write any byte) would clear the
    screen or recolour what follows: on a terminal control characters show as symbols, newlines and tabs
    keep their meaning; text for a file or a pipe stays exact."""
    import io

    from longswift.cli import display

    text = "red\x1b[31m \x9b2J\x07bell\x7f\r\nnext\tline\n"
    term = display.TerminalDisplay(total=10, initial=0)
    lines: list[str] = []
    monkeypatch.setattr(term, "_emit", lines.append)
    term.text(text)
    assert lines == ["red\u241b[31m \ufffd2J\u2407bell\u2421", "next    line"]

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for out, expected in ((Terminal(), "red\u241b[31m \ufffd2J\u2407bell\u2421\nnext\tline\n"), (io.StringIO(), text)):
        monkeypatch.setattr(display.sys, "stdout", out)
        plain = display.make_display(None, total=10, initial=0, progress=False)
        with plain:
            plain.text(text)
        assert out.getvalue() == expected
