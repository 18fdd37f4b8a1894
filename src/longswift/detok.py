"""Incremental detokenization for streaming: text deltas without re-decoding the whole output."""

from __future__ import annotations

import re
from typing import Any


def decode_text(tokenizer: Any, ids: list[int]) -> str:
    """The text of `ids` as the model wrote it: special tokens left out, and no "clean-up" of spaces
    (transformers' clean_up_tokenization_spaces, on in Llama 3's tokenizer config and applied to BPE
    tokenizers by transformers 4, turns " ," into "," and "a ." into "a.": it changes the model's
    text, and since it looks across token boundaries, a stream of deltas could not match it)."""
    return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def special_ids(tokenizer: Any) -> frozenset[int]:
    """The tokenizer's special tokens: no part of the text (decode_text leaves them out). Those it names
    (all_special_ids) and every added token flagged special, which decoding leaves out too: SmolLM2's names 3
    of its 17, Llama 3's none of its control tokens but <|begin_of_text|> and <|end_of_text|>."""
    named = set(getattr(tokenizer, "all_special_ids", None) or ())
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    candidates = named | {i for i, token in added.items() if getattr(token, "special", False)}
    # only those decoding does leave out: a tokenizer object whose pad token was set to an ordinary entry ('a'), not
    # registered as special, names it, and the stream dropped its text where decode_text kept it (found by review)
    return frozenset(i for i in candidates if decode_text(tokenizer, [i]) == "")


BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def byte_fallback_ids(tokenizer: Any) -> frozenset[int]:
    """A byte-fallback tokenizer's byte tokens (`<0xNN>`: Llama 2, Mistral, SentencePiece GGUFs), or none. Its
    decoder turns a run of them into their UTF-8 text, or, where the run is no UTF-8, into one U+FFFD a byte: a
    later byte of the run can turn the text of the earlier ones into U+FFFD, so that text is final only once a
    token of text ends the run (byte-level BPE tokenizers, whose tokens are bytes, decode each invalid sequence
    on its own)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    if decoder is None or b"ByteFallback" not in decoder.__getstate__():
        return frozenset()
    return frozenset(i for token, i in tokenizer.get_vocab().items() if BYTE_TOKEN.fullmatch(token))


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
        self.bytes = byte_fallback_ids(tokenizer)  # a byte-fallback run's text is final only when it ends
        self.open_run: int | None = None  # where the byte run still open at the end of ids began

    def _decode(self, ids: list[int]) -> str:
        return decode_text(self.tokenizer, ids)

    def _run_start(self, i: int, end: int) -> int:
        """Where a byte-fallback run that position i (between ids[i - 1] and ids[i], i <= end; at `end`, a run
        still open there) falls inside begins, looking no further back than the read offset; i where it falls
        inside none."""
        if not self.bytes or i <= self.read or self.ids[i - 1] not in self.bytes:
            return i
        if i < end and self.ids[i] not in self.bytes:
            return i
        start = i
        while start > self.read and self.ids[start - 1] in self.bytes:
            start -= 1
        return start

    def push(self, ids: list[int]) -> str:
        # Special tokens decode to nothing and decoding leaves them out before the decoder joins the rest (a byte
        # run they split is one run): kept out of `ids`, they can neither be counted as tokens of text held back
        # nor pad a held run (a lead byte, 16 <eos>, its continuation byte streamed "\ufffd" and lost the rest).
        for t in ids:
            if t in self.special:
                continue
            if t not in self.bytes:
                self.open_run = None
            elif self.open_run is None:
                self.open_run = len(self.ids)
            self.ids.append(t)
        # the ids with final text: all but a byte-fallback run still open at the end (tracked as ids come: walking
        # back to its start at each push cost a long run quadratic time, 18 s for 40K byte tokens)
        end = len(self.ids) if self.open_run is None else max(self.open_run, self.read)
        if end <= self.read:  # (an open byte run: nothing to decode yet, however long it grows)
            return ""
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix : end])
        if after.endswith("\ufffd") or len(after) <= len(before):
            if end - self.read > MAX_HELD:
                return self._move_past_held(before, after, end)
            return ""
        self.prefix, self.read = self.read, end
        return after[len(before) :]

    def _move_past_held(self, before: str, after: str, end: int) -> str:
        """A long run of tokens that completed no text (bytes that are no UTF-8, special tokens): the
        text up to FINAL_AFTER tokens back, whatever it is, is final (a character is at most 4 bytes, a
        token at least 1), so it is emitted and the offsets move there. Without this every push of such
        a run decoded all of it again: a model stuck on a lone byte for 10K tokens took a second a 1K.
        (Special tokens never reach `ids`: push leaves them out.)"""
        cut = self._run_start(end - FINAL_AFTER, end)  # never inside a byte-fallback run: its text is the whole run's
        if cut <= self.read:
            return ""
        text = self._decode(self.ids[self.prefix : cut])
        if not after.startswith(text) or len(text) < len(before):
            return ""
        # Decoding starts at the old read offset from here on: the rest must read the same from there. (Bytes cut
        # mid-character decode to other replacement characters from there: one "\ufffd" more came out.)
        if self.read != self.prefix:  # (where they are one offset, these are `text` and `after` again)
            then_before, then_after = self._decode(self.ids[self.read : cut]), self._decode(self.ids[self.read : end])
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
