"""Stop strings (GenerationConfig.stop): a run ends after the generated token whose text completes
one of them, as transformers' `stop_strings` end `generate()`. The check runs on the tokens a step
committed, in order, so TokenSwift, whose steps commit several of AR's tokens at once, ends after
the same token as AR: the tokens past it in that step are dropped."""

from __future__ import annotations

from typing import Any

from .detok import byte_fallback_ids, decode_text, special_ids

BYTES_PER_CHAR = 4  # a character spans at most 4 tokens (UTF-8 byte tokens), and any token at least 1 byte
# Byte-fallback tokenizers decode a run of byte tokens as a whole (detok.byte_fallback_ids), so a window is
# widened back to where the run it begins in starts, by at most this many tokens (a model stuck on bytes)
RUN_REACH = 1024


class StopStrings:
    """Finds, among generated tokens pushed in order, the first whose text completes a stop string.
    Only the generated text counts (not the prompt), read two ways: as the output shows it, special tokens
    left out (a stop string split by an <eos> is found), and with each special token's own text in place, as
    transformers' stop_strings read every token's string (`--stop "<|im_start|>"`, "<|im_start|>user",
    "<|im_end|>\n"; and, as for any token, a stop string that ends inside one: "end", "<|im_" at "<|im_end|>")."""

    def __init__(self, tokenizer: Any, strings: tuple[str, ...], previous: list[int] | None = None) -> None:
        """`previous`: tokens generated before (a resumed run's), whose last ones a stop string can begin in."""
        self.tokenizer, self.strings = tokenizer, strings
        # tokens decoded per check: every token a stop string's characters can span, and a few before. Special
        # tokens are no part of the text: kept out of the window (11 <eos> inside "ab" filled it, and "ab" was
        # missed); its own text counts only where it completes a stop string ("<|im_start|>", "\n<|im_start|>").
        self.special = special_ids(tokenizer)
        self.bytes = byte_fallback_ids(tokenizer)
        self.window = BYTES_PER_CHAR * max(len(s) for s in strings) + BYTES_PER_CHAR
        # tokens of the tail kept: a window and a character before it (see _text)
        self.kept = self.window + BYTES_PER_CHAR + (RUN_REACH if self.bytes else 0)
        # the byte tokens of UTF-8's continuation bytes (0x80-0xBF), which no character begins with
        self.continuation = frozenset(i for token, i in tokenizer.get_vocab().items()
                                      if i in self.bytes and 0x80 <= int(token[3:5], 16) <= 0xBF) if self.bytes else ()
        self.tail: list[int] = [t for t in previous or [] if t not in self.special][-self.kept :]  # generated ids
        self.marked: list[int] = list(previous or [])[-self.kept :]  # the same with the special tokens

    def cut(self, ids: list[int]) -> int | None:
        """How many of `ids` (the next generated tokens) to keep: up to and including the one that
        completes a stop string; None where none does."""
        for i, t in enumerate(ids):
            self.marked = [*self.marked[1 - self.kept :], t]
            if t not in self.special:
                self.tail = [*self.tail[1 - self.kept :], t]
                if any(s in self._text(self.tail) for s in self.strings):
                    return i + 1
            if any(x in self.special for x in self.marked[-self.window :]):  # (else the texts are one)
                if any(s in self._text(self.marked, marked=True) for s in self.strings):
                    return i + 1
        return None

    def _text(self, tail: list[int], marked: bool = False) -> str:
        """The text of `tail`'s last tokens, as many as a stop string's characters can span (a special token
        spans one token and more characters than any); `marked`: with the special tokens' own text."""
        if not tail:
            return ""
        start = max(0, len(tail) - self.window)
        while start > 0 and tail[start] in self.bytes and tail[start - 1] in self.bytes:
            start -= 1  # (a byte-fallback window that began inside a run decoded to U+FFFD: "。" was missed)
        if start == 0 and len(tail) == self.kept:  # a run longer than the tail: begin at a character
            while start < len(tail) - 1 and tail[start] in self.continuation:
                start += 1  # (from a continuation byte the whole run decoded to U+FFFD, a stop string unseen)
        text = self._decode(tail[start:], marked)
        lead = len(text) - len(text.lstrip("\ufffd"))
        if start > 0 and lead:  # the window may begin inside a character (byte-level BPE), whose cut bytes decode
            # to U+FFFD ("\ufffd東" was found in "東東東東東x"); decoded from a character earlier, they are text again,
            # and the U+FFFDs that stay (a stray byte's, the character's own) are the text's: kept
            earlier = self._decode(tail[max(0, start - BYTES_PER_CHAR) :], marked)
            cut = next((k for k in range(lead + 1) if earlier.endswith(text[k:])), lead)
            text = text[cut:]
        return text

    def _decode(self, ids: list[int], marked: bool) -> str:
        if marked:
            return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return decode_text(self.tokenizer, ids)
