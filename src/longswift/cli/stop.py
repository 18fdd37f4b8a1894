"""Ctrl-C and SIGTERM as a request to stop after the current step (generate, train-heads)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any


class StopRequest:
    """Turns the first SIGINT/SIGTERM into a request to stop after the current step; a second
    one interrupts at once (KeyboardInterrupt). Handlers are restored on exit."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._saved: dict[int, Any] = {}
        self._held = False  # inside held(): a second signal waits for its end
        self._pending = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            if self._held:
                self._pending = True
                return
            raise KeyboardInterrupt
        self.signum = signum
        if os.environ.get("RANK", "0").strip() in ("", "0"):  # under torchrun every rank gets it: rank 0 says so
            print(f"\nlongswift: {signal.Signals(signum).name} received: finishing the current step and saving "
                  "(send it again to stop at once)", file=sys.stderr, flush=True)

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._saved[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, handler in self._saved.items():
            signal.signal(s, handler)

    @contextmanager
    def held(self) -> Iterator[None]:
        """A section that a second signal must not cut in two (the renames that put a run's outputs in
        place together): the interruption comes right after it instead."""
        self._held, self._pending = True, False
        try:
            yield
        finally:
            self._held = False
        if self._pending:
            raise KeyboardInterrupt

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or 0)
