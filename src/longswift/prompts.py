"""Reading prompt text from files (generate's --prompt-file, bench's prose and instruction sets)."""

from __future__ import annotations

from pathlib import Path

from .errors import LongswiftError


def read_prompt_file(path: Path) -> str:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise LongswiftError(f"prompt file '{path}' does not exist") from None
    except OSError as exc:
        raise LongswiftError(f"cannot read prompt file '{path}': {exc.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LongswiftError(f"prompt file '{path}' is not UTF-8 text (bad byte at offset {exc.start})") from None
