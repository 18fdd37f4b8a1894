"""Incremental detokenization for streaming: text deltas without re-decoding the whole output."""

from __future__ import annotations

from typing import Any


class IncrementalDecoder:
    """Turns token ids, pushed a few at a time, into text deltas whose concatenation is the text.

    Decodes only a short tail (from the previous read offset), and holds back a delta that ends in
    an incomplete UTF-8 sequence until the next tokens complete it."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix = 0  # decoding starts here, so tokenizers see some left context
        self.read = 0  # text of ids[:read] has been emitted

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def push(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        if after.endswith("\ufffd") or len(after) <= len(before):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before) :]

    def flush(self) -> str:
        """Whatever is still held back (e.g. a final incomplete character)."""
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        self.prefix = self.read = len(self.ids)
        return after[len(before) :]
