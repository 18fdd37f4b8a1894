"""What `longswift generate` shows while it runs.

On a terminal, the text streams readably while one status line below it shows tokens, tok/s,
ETA, alpha and tokens per step: rich's live display keeps the status at the bottom and prints
the text above it, line by line (the line being written is part of the live display until it
is complete, so text and status never share a line). Text that goes to a file or a pipe is
written plain, with a tqdm bar on stderr only when stderr is a terminal. On a terminal, control characters
in the text (an escape sequence a model wrote could clear the screen or recolour it) show as symbols
(`visible`); `--output` and `--json` keep the exact text."""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.cells import get_character_cell_size
from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn, TimeRemainingColumn
from rich.text import Text

from ..atomic import AtomicFile


def make_display(text_file: AtomicFile | None, total: int, initial: int, progress: bool) -> Any:
    if text_file is None and progress and sys.stdout.isatty():
        return TerminalDisplay(total, initial)
    sink = text_file.write if text_file else _stdout_write
    return PlainDisplay(sink, total, initial, progress)


def _stdout_write(text: str) -> None:
    try:
        sys.stdout.write(visible(text) if sys.stdout.isatty() else text)
        sys.stdout.flush()
    except BrokenPipeError:  # (the reader stopped reading: the command line's quiet stop)
        raise
    except OSError as exc:  # ('[Errno 28] No space left on device' named no file: `> /dev/full`, a full disk)
        raise OSError(exc.errno, f"cannot write the text to stdout: {exc.strerror}") from None


# C0 controls but newline and tab as their Unicode control pictures (ESC as U+241B), DEL as U+2421, C1 controls
# (U+009B is a one-character CSI on some terminals) as U+FFFD; carriage returns dropped (CRLF line ends).
_VISIBLE = {**{c: 0x2400 + c for c in range(0x20) if c not in (0x09, 0x0A)}, 0x0D: None, 0x7F: 0x2421,
          **{c: 0xFFFD for c in range(0x80, 0xA0)}}


def visible(text: str) -> str:
    """`text` as a terminal may show it: control characters other than newline and tab as visible symbols,
    carriage returns dropped."""
    return text.translate(_VISIBLE)


def _status(stats: Any) -> str:
    if stats.method == "tokenswift" and stats.steps:
        return f"alpha {stats.alpha:.2f} · {stats.tokens_per_step:.2f} tok/step"
    return ""


def _reading(read: int, total: int) -> str:
    return f"reading the context: {read:,}/{total:,} tokens"


class PlainDisplay:
    """Text to a file or stdout as it comes; a tqdm bar on stderr if it is a terminal (disable=None)."""

    def __init__(self, sink: Any, total: int, initial: int, progress: bool) -> None:
        from tqdm import tqdm

        self.sink = sink
        self.bar = tqdm(total=total, initial=initial, unit="tok", file=sys.stderr, disable=None if progress else True,
                        dynamic_ncols=True, mininterval=0.5, leave=False)

    def __enter__(self) -> PlainDisplay:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.bar.close()

    def text(self, text: str) -> None:
        if text:
            self.sink(text)

    def prefill(self, read: int, total: int) -> None:
        """The context being read (before the first token): a note beside the bar, gone at the first token."""
        self.bar.set_postfix_str(_reading(read, total) if read < total else "", refresh=True)

    def advance(self, n: int, stats: Any) -> None:
        self.bar.update(n)
        if stats.method == "tokenswift" and stats.steps % 8 == 0:
            self.bar.set_postfix_str(_status(stats), refresh=False)


class RateColumn(ProgressColumn):
    def render(self, task: Any) -> Text:
        return Text(f"{task.speed:.1f} tok/s" if task.speed else "- tok/s")


REDRAW_SECONDS = 0.05


class TerminalDisplay:
    """Text above, status line below (rich.progress.Progress, transient: the status goes at the end)."""

    def __init__(self, total: int, initial: int) -> None:
        self.console = Console(highlight=False, markup=False, emoji=False)
        self.pending = ""  # the text since the last complete screen line
        display = self

        class _Progress(Progress):
            def get_renderables(self) -> Any:
                if display.pending:
                    yield Text(display.pending)
                yield self.make_tasks_table(self.tasks)

        self.progress = _Progress(
            BarColumn(bar_width=20), TextColumn("{task.completed}/{task.total} tokens"), RateColumn(),
            TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.fields[spec]}"),
            console=self.console, transient=True, refresh_per_second=4)
        self.task = self.progress.add_task("generate", total=total, completed=initial, spec="")
        self.drawn = 0.0  # time.monotonic() of the last redraw text() asked for

    def __enter__(self) -> TerminalDisplay:
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.pending:
            self._emit(self.pending)
            self.pending = ""
        self.progress.stop()

    def text(self, text: str) -> None:
        if not text:
            return
        self.pending += visible(text).replace("\t", "    ")
        width = max(self.console.width, 10)
        while True:
            cut = _fits(self.pending, width)
            newline = self.pending.find("\n", 0, cut + 1)
            if newline >= 0:  # a complete line
                line, self.pending = self.pending[:newline], self.pending[newline + 1:]
            elif cut < len(self.pending):  # longer than the screen: wrap at the last space, as a terminal reader expects
                space = self.pending.rfind(" ", 0, cut + 1)
                end = space if space > 0 else cut
                line, self.pending = self.pending[:end], self.pending[end + (1 if space > 0 else 0):]
            else:
                break
            self._emit(line)
        # The line being written shows at once, but redrawn at most every REDRAW_SECONDS: a redraw costs
        # ~0.5 ms, a whole step of a small model on a GPU ~2 ms (rich's own refresh, 4 a second, draws the rest).
        now = time.monotonic()
        if now - self.drawn >= REDRAW_SECONDS:
            self.drawn = now
            self.progress.refresh()

    def _emit(self, line: str) -> None:
        self.console.print(Text(line), crop=False, overflow="ignore")

    def prefill(self, read: int, total: int) -> None:
        """The context being read (before the first token): said in the status line until the first token."""
        self.progress.update(self.task, spec=_reading(read, total) if read < total else "")

    def advance(self, n: int, stats: Any) -> None:
        self.progress.update(self.task, advance=n, spec=_status(stats))


def _fits(text: str, width: int) -> int:
    """How many characters of `text` fit in `width` terminal cells."""
    cells = 0
    for i, ch in enumerate(text):
        cells += get_character_cell_size(ch)
        if cells > width:
            return i
    return len(text)


def summary_line(s: Any) -> str:
    """The closing line of a run from its GenerationStats."""
    spec_info = ""
    if s.method == "tokenswift":  # no drafts at all: every step was plain, and alpha is undefined, not 0
        rate = f"alpha {s.alpha:.2f}" if s.draft_positions else "nothing drafted: every step plain"
        spec_info = f", {rate}, {s.tokens_per_step:.2f} tokens/step"
    ranks = f" on {s.processes} processes" if s.processes > 1 else ""
    graphs = f", {s.graph_captures} CUDA graphs captured in {s.graph_capture_seconds:.2f} s" if s.graph_captures else ""
    # A resumed run's prefill time holds each resume's re-read of prompt + output, not the prompt's alone.
    rereads = f" (with the context re-read at {s.resumes} resume{'s' if s.resumes > 1 else ''})" if s.resumes else ""
    # One token (a run stopped as it began) is the prefill's draw: no rate to speak of.
    rate = f"{s.tokens_per_second:.1f} tok/s" if s.has_rate else "no rate from one token"
    count = f"{s.new_tokens} token{'' if s.new_tokens == 1 else 's'}"
    return (f"{s.method}: {count} in {s.decode_seconds:.2f} s ({rate}{spec_info}){ranks}{graphs}, prefill "
            f"{s.prompt_tokens} tokens in {s.prefill_seconds:.2f} s{rereads}, stop: {s.finish_reason}")
