"""Reading prompt text from files (generate's --prompt-file, bench's prose and instruction sets)."""

from __future__ import annotations

import codecs
from pathlib import Path

from .errors import LongswiftError

UTF16_BOMS = (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)


def read_prompt_file(path: Path) -> str:
    """The file's text. A UTF-8 byte-order mark (what Windows editors put first) is not part of
    it: left in, it was tokenized as three bytes of prompt (and broke a JSONL set's first line)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise LongswiftError(f"prompt file '{path}' does not exist") from None
    except OSError as exc:
        raise LongswiftError(f"cannot read prompt file '{path}': {exc.strerror}") from None
    if data.startswith(UTF16_BOMS):
        raise LongswiftError(f"prompt file '{path}' is UTF-16 text: save it as UTF-8")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LongswiftError(f"prompt file '{path}' is not UTF-8 text (bad byte at offset {exc.start})") from None
    return text.removeprefix("\ufeff")
