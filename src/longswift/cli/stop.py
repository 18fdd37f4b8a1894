"""Ctrl-C, SIGTERM and SIGHUP as a request to stop after the current step (generate, train-heads)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any


def _signals() -> list[int]:
    """SIGINT, SIGTERM, and SIGHUP (the terminal closed, an SSH session lost) unless it is ignored: a run
    started under `nohup` goes on as nohup promises."""
    found: list[int] = [signal.SIGINT, signal.SIGTERM]
    hup = getattr(signal, "SIGHUP", None)
    if hup is not None and signal.getsignal(hup) is not signal.SIG_IGN:
        found.append(hup)
    return found


SAVING = "finishing the current step and saving"
READING = "stopping the reading of the context (nothing generated yet, nothing to save)"
WRITING = "the run is complete and writing its outputs, which a second signal waits for"


# Under torchrun, a second signal this soon after the first is the same request relayed: torchrun passes a signal
# it gets on to its processes, so a SIGTERM (scancel, systemd, kill of every pid) or a Ctrl-C sent to the whole run
# reached each process twice, and the second stopped it at once, saving nothing.
RELAYED_SECONDS = 2.0


def _several_processes() -> bool:
    return os.environ.get("WORLD_SIZE", "1").strip() not in ("", "0", "1")


def _main_process() -> bool:
    """A single process, or rank 0 under torchrun (runtime.torchrun_env.env_rank, read from the environment alone: a
    signal handler imports nothing); a RANK without a WORLD_SIZE above 1 is another launcher's."""
    return not _several_processes() or os.environ.get("RANK", "0").strip() in ("", "0")


class StopRequest:
    """Turns the first SIGINT/SIGTERM/SIGHUP into a request to stop after the current step; a second
    one interrupts at once (KeyboardInterrupt). Handlers are restored on exit (of the outermost `with`:
    a command may hold it around more than the library function it passes it to enters it for)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._saved: dict[int, Any] = {}
        self._held = False  # inside held(): a second signal waits for its end
        self._pending = False
        self._at_once = False  # inside at_once(): the first signal stops at once too
        self.doing = SAVING  # what the first signal makes the run do, as said to the user
        self._first_at = 0.0  # time.monotonic() of the first signal
        self._depth = 0  # nested `with`s: the outermost installs and restores the handlers

    # The signal that last stopped a command at once (its KeyboardInterrupt), whichever StopRequest took it: the
    # command line exits with 128 + it (143 for SIGTERM, not Ctrl-C's 130). Reset as a command starts.
    stopped_by: int | None = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._at_once:
            self.signum = signum  # (kept: a KeyboardInterrupt raised inside a __del__ is lost, this is not)
            StopRequest.stopped_by = signum
            raise KeyboardInterrupt
        if self.signum is not None:
            if _several_processes() and time.monotonic() - self._first_at < RELAYED_SECONDS:
                return  # (torchrun's relay of the first, RELAYED_SECONDS)
            if self._held:
                self._pending = True  # (the section's end comes soon: its caller stops there, `deferred`)
                return
            StopRequest.stopped_by = signum
            raise KeyboardInterrupt
        self.signum = signum
        self._first_at = time.monotonic()
        if _main_process():  # under torchrun every rank gets it: rank 0 says so
            again = "" if self._held else " (send it again to stop at once)"
            say(f"\nlongswift: {signal.Signals(signum).name} received: {self.doing}{again}")

    def __enter__(self) -> StopRequest:
        self._depth += 1
        if self._depth == 1 and threading.current_thread() is threading.main_thread():
            for s in _signals():
                self._saved[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._depth -= 1
        if self._depth == 0:
            for s, handler in self._saved.items():
                signal.signal(s, handler)
            self._saved.clear()

    @contextmanager
    def at_once(self) -> Iterator[None]:
        """A section with nothing to save, such as loading the model: any signal stops the command at once."""
        self._at_once = True
        try:
            yield
        finally:
            self._at_once = False

    @contextmanager
    def held(self) -> Iterator[None]:
        """A section of bounded work that a second signal must not cut short (a finished or stopped run
        writing its outputs and state, and renaming them into place together): the signal waits for its
        end, and `deferred` then says it came, for the caller to stop there."""
        self._held, self._pending = True, False
        try:
            yield
        finally:
            self._held = False

    @property
    def deferred(self) -> bool:
        """Whether a second signal came inside the last held() section."""
        return self._pending

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or 0)


def say(line: str) -> None:
    """A line on stderr, best effort: after a hangup the terminal is gone, and a failed message must not
    stop the run from saving its state."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass
