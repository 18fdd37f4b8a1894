"""Incremental detokenization for streaming: text deltas without re-decoding the whole output."""

from __future__ import annotations

from typing import Any


def decode_text(tokenizer: Any, ids: list[int]) -> str:
    """The text of `ids` as the model wrote it: special tokens left out, and no "clean-up" of spaces
    (transformers' clean_up_tokenization_spaces, on in Llama 3's tokenizer config and applied to BPE
    tokenizers by transformers 4, turns " ," into "," and "a ." into "a.": it changes the model's
    text, and since it looks across token boundaries, a stream of deltas could not match it)."""
    return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def special_ids(tokenizer: Any) -> frozenset[int]:
    """The tokenizer's special tokens: no part of the text (decode_text leaves them out)."""
    return frozenset(getattr(tokenizer, "all_special_ids", None) or ())


MAX_HELD = 16  # tokens held back (no complete text yet) after which the text before the last few is emitted
FINAL_AFTER = 4  # ... the last few: a UTF-8 character spans at most 4 bytes, and a token is at least one


class IncrementalDecoder:
    """Turns token ids, pushed a few at a time, into text deltas whose concatenation is the text
    (decode_text of all the ids).

    Decodes only a short tail (from the previous read offset), and holds back a delta that ends in
    an incomplete UTF-8 sequence until the next tokens complete it."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix = 0  # decoding starts here, so tokenizers see some left context
        self.read = 0  # text of ids[:read] has been emitted
        self.special = special_ids(tokenizer)  # tokens of no text (skipped)

    def _decode(self, ids: list[int]) -> str:
        return decode_text(self.tokenizer, ids)

    def push(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        if after.endswith("\ufffd") or len(after) <= len(before):
            if len(self.ids) - self.read > MAX_HELD:
                return self._move_past_held(before, after)
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before) :]

    def _move_past_held(self, before: str, after: str) -> str:
        """A long run of tokens that completed no text (bytes that are no UTF-8, special tokens): the
        text up to FINAL_AFTER tokens back, whatever it is, is final (a character is at most 4 bytes, a
        token at least 1), so it is emitted and the offsets move there. Without this every push of such
        a run decoded all of it again: a model stuck on a lone byte for 10K tokens took a second a 1K.
        Special tokens decode to nothing, so they are not counted among those kept back where the run has
        enough others (two inside a character cut it, and its first bytes went out as "\ufffd"); a run of
        them alone (a model stuck on EOS) moves on as before."""
        cut, counted = len(self.ids), 0
        while counted < FINAL_AFTER and cut > self.read:
            cut -= 1
            counted += self.ids[cut] not in self.special
        if counted < FINAL_AFTER:  # too few tokens of text: keep back the last few tokens, as before
            cut = len(self.ids) - FINAL_AFTER
        text = self._decode(self.ids[self.prefix : cut])
        if not after.startswith(text) or len(text) < len(before):
            return ""
        # Decoding starts at the old read offset from here on: the rest must read the same from there. (Bytes cut
        # mid-character decode to other replacement characters from there: one "\ufffd" more came out.)
        if self.read != self.prefix:  # (where they are one offset, these are `text` and `after` again)
            then_before, then_after = self._decode(self.ids[self.read : cut]), self._decode(self.ids[self.read :])
            if not then_after.startswith(then_before) or then_after[len(then_before) :] != after[len(text) :]:
                return ""
        self.prefix, self.read = self.read, cut
        return text[len(before) :]

    def flush(self) -> str:
        """Whatever is still held back (e.g. a final incomplete character)."""
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        self.prefix = self.read = len(self.ids)
        return after[len(before) :]
