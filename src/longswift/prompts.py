"""Reading prompt text from files (generate's --prompt-file, bench's prose and instruction sets)."""

from __future__ import annotations

import codecs
import sys
from pathlib import Path

from .errors import LongswiftError

UTF16_BOMS = (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
UTF32_BOMS = (codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE)


STDIN = "-"  # the prompt file name that reads standard input (generate's --prompt-file -)


def read_prompt_file(path: Path) -> str:
    """The file's text ('-': standard input's, read to its end). A UTF-8 byte-order mark (what Windows
    editors put first) is not part of it: left in, it was tokenized as three bytes of prompt (and broke a
    JSONL set's first line)."""
    stdin = str(path) == STDIN
    what = "the prompt on standard input" if stdin else f"prompt file '{path}'"
    if stdin and sys.stdin is None:  # (started with standard input closed: `<&-`)
        raise LongswiftError("standard input is closed: write the prompt to a file and give its name")
    try:
        data = sys.stdin.buffer.read() if stdin else path.read_bytes()
    except FileNotFoundError:
        raise LongswiftError(f"{what} does not exist") from None
    except OSError as exc:
        raise LongswiftError(f"cannot read {what}: {exc.strerror}") from None
    if data.startswith(UTF32_BOMS):  # (before UTF-16's: UTF-32-LE's mark begins with UTF-16-LE's)
        raise LongswiftError(f"{what} is UTF-32 text: save it as UTF-8")
    if data.startswith(UTF16_BOMS):
        raise LongswiftError(f"{what} is UTF-16 text: save it as UTF-8")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LongswiftError(f"{what} is not UTF-8 text (bad byte at offset {exc.start}): convert it to UTF-8 (e.g. "
                             "`iconv -f latin1 -t utf-8`)") from None
    if "\x00" in text:  # UTF-16 without a byte-order mark decodes as UTF-8, a NUL between each ASCII letter
        raise LongswiftError(f"{what} holds NUL characters: it is not text, or is UTF-16 without a byte-order mark; "
                             "save it as UTF-8")
    return text.removeprefix("\ufeff")
