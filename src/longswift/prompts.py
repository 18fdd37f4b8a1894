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
    return decode_prompt(read_prompt_bytes(path), path)


def without_final_newline(text: str) -> str:
    """A prompt file's text as generate takes it: one final newline ("\\n" or "\\r\\n", which editors and `echo` end a
    file with) is the file's end and not part of the prompt, as llama.cpp's -f reads a prompt file; kept, a
    file's prompt differed from the same --prompt text (a review)."""
    return text.removesuffix("\r\n") if text.endswith("\r\n") else text.removesuffix("\n")


def _what(path: Path) -> str:
    return "the prompt on standard input" if str(path) == STDIN else f"prompt file '{path}'"


def read_prompt_bytes(path: Path) -> bytes:
    """The file's bytes ('-': standard input's), refused in one line where they cannot be read."""
    stdin = str(path) == STDIN
    if stdin and sys.stdin is None:  # (started with standard input closed: `<&-`)
        raise LongswiftError("standard input is closed: write the prompt to a file and give its name")
    try:
        return sys.stdin.buffer.read() if stdin else path.read_bytes()
    except FileNotFoundError:
        raise LongswiftError(f"{_what(path)} does not exist") from None
    except OSError as exc:
        raise LongswiftError(f"cannot read {_what(path)}: {exc.strerror}") from None


def decode_prompt(data: bytes, path: Path) -> str:
    """The text of `path`'s bytes `data`: UTF-8, without a leading byte-order mark; other encodings and binary
    content refused, saying what to convert."""
    what = _what(path)
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
