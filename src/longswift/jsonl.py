"""Reading JSON Lines files (bench's prompt sets, head training's data): one JSON value a line, and a line that
cannot be read, or a text in it that no tokenizer can encode, refused in one line that names it."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import LongswiftError


def json_lines(content: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of each line that is not blank. Lines end at "\\n" alone (a "\\r" before it is dropped):
    str.splitlines also cuts at U+2028, U+2029 and U+0085, which JSON writers leave unescaped inside strings
    (json.dumps with ensure_ascii=False), and such records were refused as not JSON."""
    for number, line in enumerate(content.split("\n"), 1):
        line = line.removesuffix("\r")
        if line.strip():
            yield number, line


def parse_line(path: Path, number: int, line: str, wanted: str) -> Any:
    """json.loads of line `number`, refused where it is not JSON or is JSON that Python does not read (nesting past
    its recursion limit, an integer past its digit limit: tracebacks before); `wanted` says what a line must be."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise LongswiftError(f"'{path}' line {number} is not JSON ({exc.msg} at column {exc.colno}): {wanted}") from None
    except RecursionError:
        raise LongswiftError(f"'{path}' line {number} nests arrays or objects too deeply to be read: {wanted}") from None
    except ValueError:  # (the one other ValueError json.loads raises)
        raise LongswiftError(f"'{path}' line {number} holds an integer of more than {sys.get_int_max_str_digits()} "
                             f"digits, which Python does not read: {wanted}") from None


def check_encodable(path: Path, number: int, field: str, text: str) -> None:
    """Refuse a text holding a lone surrogate: JSON's "\\ud800" escape reads as one, which is no character and which
    no tokenizer encodes (a TypeError traceback from the tokenizer, after the model had loaded)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise LongswiftError(f"'{path}' line {number} holds an unpaired surrogate escape "
                             f"(\\u{ord(text[exc.start]):04x}) in its '{field}', which is no character: remove it, or "
                             "write the character itself (one past U+FFFF escapes as a pair, \\ud83d\\ude00)") from None
