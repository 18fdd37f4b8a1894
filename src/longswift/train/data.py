"""Training text for the draft heads: plain text, JSONL (`text` field) or directories of them,
tokenized and cut into fixed windows of `seq_len` tokens."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from ..errors import ADD_TOKENIZER_FILES, LongswiftError
from ..jsonl import check_encodable, json_lines, parse_line

TEXT_SUFFIXES = (".txt", ".md", ".text")
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")  # (.ndjson: the same JSON Lines)


def _files(source: Path) -> list[Path]:
    if source.is_dir():
        found = sorted(p for p in source.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES + JSONL_SUFFIXES)
        if not found:
            raise LongswiftError(f"directory '{source}' holds no .txt/.md/.text/.jsonl/.ndjson/.json files: point "
                                 "--data at text files")
        return found
    if source.exists() and not source.is_file():  # (a shell's <(...) is a pipe: it exists, and is read once)
        raise LongswiftError(f"--data '{source}' is a pipe or device, not a file: save the data to a file and "
                             "pass that (a text file, a .jsonl file or a directory)")
    if not source.is_file():
        raise LongswiftError(f"--data '{source}' does not exist: pass a text file, a .jsonl file or a directory")
    return [source]


def _read_text(path: Path) -> str:
    raw = path.read_bytes()
    if b"\x00" in raw[:65536]:
        raise LongswiftError(f"'{path}' looks binary (it holds NUL bytes): pass UTF-8 text or JSONL")
    try:
        return raw.decode("utf-8-sig")  # a byte order mark (Notepad's UTF-8) is not text: dropped
    except UnicodeDecodeError as exc:
        raise LongswiftError(f"'{path}' is not UTF-8 text (byte {exc.start}): convert it to UTF-8") from None


def _one_document(content: str) -> bool:
    try:
        json.loads(content)
    except (ValueError, RecursionError):  # (JSONDecodeError is a ValueError; the others: jsonl.parse_line)
        return False
    return True


def _jsonl_texts(path: Path, content: str) -> list[str]:
    texts: list[str] = []
    wanted = 'JSONL data holds one {"text": ...} object a line'
    for n, line in json_lines(content):
        try:
            record = parse_line(path, n, line, wanted)
        except LongswiftError:
            if not texts and _one_document(content):  # a pretty-printed .json (a log, a config) in a --data folder
                raise LongswiftError(f"'{path}' is one JSON document, not JSON Lines (one {{\"text\": ...}} object "
                                     "per line): convert it, or move it out of the --data directory") from None
            raise
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise LongswiftError(f"'{path}' line {n} has no string field 'text': JSONL records need {{\"text\": ...}}")
        check_encodable(path, n, "text", record["text"])
        texts.append(record["text"])
    return texts


def data_files(sources: list[str | os.PathLike]) -> list[Path]:
    """The files read_texts reads for these --data sources (a directory's text and JSONL files)."""
    return [path for source in sources for path in _files(Path(source).expanduser())]


def read_texts(sources: list[str | os.PathLike]) -> list[str]:
    """Every document in the given files and directories (a text file is one document, a JSONL
    file one document per line). Empty documents are dropped; no text at all is an error."""
    texts: list[str] = []
    for source in sources:
        for path in _files(Path(source).expanduser()):
            content = _read_text(path)
            if path.suffix.lower() in JSONL_SUFFIXES:
                texts.extend(t for t in _jsonl_texts(path, content) if t.strip())
            elif content.strip():
                texts.append(content)
    if not texts:
        raise LongswiftError(f"no text in {', '.join(map(str, sources))}: the --data is empty")
    return texts


def cut_windows(documents: list[list[int]], seq_len: int) -> torch.Tensor:
    """Token-id documents -> windows [N, seq_len]; each document is cut into consecutive
    windows and its remainder shorter than a window is dropped."""
    return cut_counted_windows(documents, [0] * len(documents), seq_len)[0]


def counted_starts(length: int, prompt: int, seq_len: int) -> list[tuple[int, int]]:
    """(offset, first) of each window cut from a document of `length` tokens whose first `prompt` are a prompt
    (a self-distilled document's chat request): `first` is the window's first token that is a training target.
    The prompt is context for the hidden states but never a target: the heads learn the model's output, not 32
    fixed requests to memorize. A window whose tokens are all prompt has no target and is left out."""
    starts = [(i, max(0, prompt - i)) for i in range(0, length - seq_len + 1, seq_len)]
    return [(i, first) for i, first in starts if first < seq_len]


def cut_counted_windows(documents: list[list[int]], prompts: list[int],
                        seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id documents, each with its prompt's length (0: all of it is text to learn) -> windows [N, seq_len] and
    each window's first target index [N] (counted_starts; head_targets masks the targets before it)."""
    if seq_len < 2:
        raise LongswiftError(f"--seq-len must be at least 2, got {seq_len}")
    cut = [(doc, i, first) for doc, p in zip(documents, prompts) for i, first in counted_starts(len(doc), p, seq_len)]
    if not cut:
        longest = max((len(d) for d in documents), default=0)
        if any(len(d) >= seq_len for d in documents):  # (self_distill refuses such settings before sampling)
            raise LongswiftError(f"every window of --seq-len {seq_len} tokens holds only prompt tokens, which are not "
                                 "trained on: give longer documents (--distill-new-tokens) or a smaller --seq-len")
        raise LongswiftError(
            f"no document reaches --seq-len {seq_len} tokens (the longest has {longest}): "
            "give longer documents or a smaller --seq-len"
        )
    windows = torch.tensor([doc[i : i + seq_len] for doc, i, _ in cut], dtype=torch.long)
    return windows, torch.tensor([first for _, _, first in cut], dtype=torch.long)


def tokenize(tokenizer: Any, texts: list[str], vocab_size: int) -> list[list[int]]:
    """The --data texts' token ids; refused where the tokenizer gives an id past the model's `vocab_size` logits
    (the tokenizer is not the model's: the embedding's IndexError came after minutes of hidden states)."""
    if tokenizer is None:
        raise LongswiftError(f"this model has no tokenizer, so it cannot read text data: {ADD_TOKENIZER_FILES}")
    documents = [list(tokenizer.encode(t, add_special_tokens=False)) for t in texts]
    past = max((max(d) for d in documents if d), default=-1)
    if past >= vocab_size:
        raise LongswiftError(f"the --data text encodes to token {past} of the tokenizer, past this model's "
                             f"{vocab_size} logits: the tokenizer is not this model's; load the model with its own "
                             "tokenizer")
    return documents
