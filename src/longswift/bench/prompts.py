"""Benchmark prompts: seeded random ids, a prose file repeated to each prefix length, a chat
message, or a JSONL set of instructions (docs/prompts/instructions.jsonl: one {"id", "prompt"} a line)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import ADD_TOKENIZER_FILES, LongswiftError
from ..jsonl import check_encodable, json_lines, parse_line
from ..prompts import STDIN, decode_prompt, read_prompt_bytes


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt. `fixed` prompts are used as they are (chat messages, instructions);
    the others are built to each --prefix length."""

    name: str
    ids: tuple[int, ...]
    fixed: bool


@dataclass(frozen=True)
class PromptFile:
    """A bench --prompt-file, read once before the model loads: its text, the digest of its bytes (which, with its
    path, identifies a results directory's runs) and, for a JSONL set, its (id, prompt) pairs."""

    path: Path
    text: str
    digest: str
    instructions: tuple[tuple[str, str], ...] | None


def parse_instructions(path: Path, content: str) -> list[tuple[str, str]]:
    """(id, text) pairs of the JSONL prompt set `content` read from `path`; a clear error names the first bad line."""
    pairs: list[tuple[str, str]] = []
    wanted = 'a prompt set holds one {"id": ..., "prompt": ...} object a line'
    for number, line in json_lines(content):
        row = parse_line(path, number, line, wanted)
        if not isinstance(row, dict) or "prompt" not in row:
            raise LongswiftError(f"'{path}' line {number} has no \"prompt\" field: {wanted}")
        text, name = row["prompt"], row.get("id", f"line{number}")
        if not isinstance(text, str) or not text.strip():
            raise LongswiftError(f"'{path}' line {number}: \"prompt\" must be non-empty text")
        check_encodable(path, number, "prompt", text)
        # The id names the report's cells, in headings and progress lines: a newline in it broke the report's
        # markdown, an empty one left the heading nameless, and null was "None"
        if (isinstance(name, bool) or not isinstance(name, (str, int, float)) or not str(name).strip()
                or any(unicodedata.category(c) == "Cc" for c in str(name))):
            raise LongswiftError(f"'{path}' line {number}: \"id\" must be a non-empty name on one line (text or a "
                                 f"number); got {json.dumps(name)[:40]}")
        name = str(name)
        if name in (n for n, _ in pairs):  # the report's cells are named by id: two prompts would share one
            raise LongswiftError(f"'{path}' line {number}: id \"{name}\" is used by an earlier line: give each "
                                 "prompt its own id")
        pairs.append((name, text))
    if not pairs:
        raise LongswiftError(f"prompt file '{path}' holds no prompts")
    return pairs


def holds_instructions(prompt_file: Path) -> bool:
    """Whether a --prompt-file is a JSONL file of instructions, each prompt a cell sent whole (its suffix, .jsonl or
    .ndjson in any case, as head training's data), rather than prose cut to each prefix length."""
    return prompt_file.suffix.lower() in (".jsonl", ".ndjson")


def read_bench_prompt_file(path: Path | None) -> PromptFile | None:
    """Read a --prompt-file once, before the model loads, refusing one bench cannot use: standard input or a pipe
    (the file's content names the results, and a resumed grid reads it again: a pipe's second read was empty, and
    its digest that of nothing), a file that cannot be read, or one that holds no prompt."""
    if path is None:
        return None
    if str(path) == STDIN:
        raise LongswiftError("bench --prompt-file needs a file: its content identifies the results, and a resumed grid "
                             "reads it again ('-', standard input, is generate's)")
    try:
        mode: int | None = os.stat(path).st_mode  # (stat opens nothing: a FIFO does not block it)
    except OSError:
        mode = None  # (read_prompt_bytes says why it cannot be read)
    if mode is not None and not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        raise LongswiftError(f"--prompt-file '{path}' is a pipe (a process substitution <(...) or a FIFO) or a device, "
                             "which bench reads more than once: write the prompts to a file and give its name")
    data = read_prompt_bytes(path)
    text = decode_prompt(data, path)
    instructions = tuple(parse_instructions(path, text)) if holds_instructions(path) else None
    if instructions is None and not text.strip():
        raise LongswiftError(f"prompt file '{path}' is empty: give a file of prose text, or leave out --prompt-file "
                             "(random token ids)")
    return PromptFile(path, text, hashlib.sha256(data).hexdigest()[:16], instructions)


def build_prompts(engine: Any, prompt_file: PromptFile | None, chat: bool, prefixes: tuple[int, ...],
                  seed: int) -> list[tuple[int | None, Prompt]]:
    """(prefix, prompt) pairs to run: random ids or a prose file for each prefix length; a chat
    message or each JSONL instruction once (prefix None: the prompt is used as it is)."""
    if prompt_file is None:
        g = torch.Generator().manual_seed(seed)
        pool = torch.randint(0, engine.cfg.vocab_size, (max(prefixes),), generator=g).tolist()
        return [(p, Prompt(f"random-ids-seed{seed}", tuple(pool[:p]), False)) for p in prefixes]
    if engine.tokenizer is None:  # (encode's advice, to give token ids, is not one bench can take)
        raise LongswiftError(f"--prompt-file '{prompt_file.path}' is text, and this model has no tokenizer: "
                             f"{ADD_TOKENIZER_FILES}, or leave out --prompt-file (random token ids)")
    if prompt_file.instructions is not None:
        return [(None, Prompt(name, tuple(engine.encode(text, chat=chat)), True))
                for name, text in prompt_file.instructions]
    text, stem = prompt_file.text, prompt_file.path.stem
    if chat:
        return [(None, Prompt(stem, tuple(engine.encode(text, chat=True)), True))]
    lead, body = _special_lead(engine, text)
    out: list[tuple[int | None, Prompt]] = []
    for p in prefixes:
        repeated = list(lead) + list(body)
        while len(repeated) < p:
            repeated += body
        out.append((p, Prompt(stem, tuple(repeated[:p]), False)))
    return out


def _special_lead(engine: Any, text: str) -> tuple[list[int], list[int]]:
    """The ids a prose prompt starts with (the tokenizer's BOS, where it adds one: Llama, Mistral) and the text's own
    ids, which are repeated to a prefix length: repeating the whole encoding put a BOS at every repeat."""
    ids = engine.encode(text)
    body = engine.tokenizer.encode(text, add_special_tokens=False)
    for start in range(len(ids) - len(body) + 1):
        if body and ids[start: start + len(body)] == body:
            return ids[:start], body  # (a special token after the text, such as an EOS, is not repeated either)
    return [], ids  # a tokenizer whose text ids are not a run of its whole encoding: repeated whole, as before
