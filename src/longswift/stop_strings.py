"""Stop strings (GenerationConfig.stop): a run ends after the generated token whose text completes
one of them, as transformers' `stop_strings` end `generate()`. The check runs on the tokens a step
committed, in order, so TokenSwift, whose steps commit several of AR's tokens at once, ends after
the same token as AR: the tokens past it in that step are dropped."""

from __future__ import annotations

import codecs
from typing import Any

from .detok import byte_fallback_ids, decode_text, special_ids

BYTES_PER_CHAR = 4  # a character spans at most 4 tokens (UTF-8 byte tokens), and any token at least 1 byte


class ByteRuns:
    """Whether each run of byte-fallback tokens (detok.byte_fallback_ids) in a sequence pushed a token at a time
    is UTF-8: the decoder gives a valid run's characters and an invalid (or unfinished) one one U+FFFD a byte, so
    a window's text inside a run depends on the bytes before it. Kept as the tokens come, this lets a window
    begin inside a run however long: it was widened back to the run's start (up to 1,024 tokens decoded a token,
    0.65 ms in a model's long byte runs)."""

    def __init__(self, values: dict[int, int], reach: int) -> None:
        self.values, self.reach = values, reach  # byte token id -> its byte; how far back runs are asked about
        self.count = 0  # tokens pushed
        # ended runs within reach: start, end, whether UTF-8, whether a special token left out split it (dropped)
        self.closed: list[tuple[int, int, bool, bool]] = []
        self.open: int | None = None  # where the run still open at the end began
        self.utf8 = codecs.getincrementaldecoder("utf-8")()
        self.ok = True  # the open run's bytes so far are UTF-8, or the start of some
        self.split = False  # a special token was left out inside the open run

    def push(self, token: int) -> None:
        byte = self.values.get(token)
        if byte is None:
            if self.open is not None:
                self.closed.append((self.open, self.count, self._valid(), self.split))
                self.open = None
        else:
            if self.open is None:
                self.open, self.ok, self.split = self.count, True, False
                self.utf8.reset()
            if self.ok:
                try:
                    self.utf8.decode(bytes((byte,)))
                except UnicodeDecodeError:  # (no byte after can make the run UTF-8 again)
                    self.ok = False
        self.count += 1
        while self.closed and self.closed[0][1] <= self.count - self.reach:
            self.closed.pop(0)

    def dropped(self) -> None:
        """A special token was left out here (the text without them): a run it falls in is one run in this text
        and two in the text read with it, whose bytes may decode otherwise (one stray byte before it: U+FFFDs)."""
        self.split = self.split or self.open is not None

    def _valid(self) -> bool:
        return self.ok and not self.utf8.getstate()[0]  # (bytes held: a character not finished)

    def inside(self, position: int) -> tuple[bool, bool] | None:
        """For the token `position` back from the end (1: the last), where a run began before it (a window
        beginning there begins inside the run): whether that run decodes to its characters, and whether a left-out
        special token split it (dropped: there the text and the text read with the special tokens differ); None
        elsewhere."""
        at = self.count - position
        if self.open is not None and at > self.open:
            return self._valid(), self.split
        return next(((valid, split) for start, end, valid, split in self.closed if start < at < end), None)


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
        self.kept = self.window + BYTES_PER_CHAR
        values = {i: int(token[3:5], 16) for token, i in tokenizer.get_vocab().items() if i in self.bytes}
        # the byte tokens of UTF-8's continuation bytes (0x80-0xBF), which no character begins with; one of them
        # leads a window that begins inside a run that is no UTF-8, to decode its bytes as the whole run's are
        self.continuation = frozenset(i for i, byte in values.items() if 0x80 <= byte <= 0xBF)
        self.stray = min(self.continuation, default=None)
        # the byte runs of both sequences (special tokens end a run in the text read with them, not in the other)
        self.runs, self.marked_runs = ByteRuns(values, self.kept), ByteRuns(values, self.kept)
        self.tail: list[int] = []  # the generated ids' last ones
        self.marked: list[int] = []  # the same with the special tokens
        for t in previous or []:  # (a resumed run's byte run may have begun long before the tail)
            self._push(t)

    def _push(self, t: int) -> bool:
        """Take the next generated token into both texts' tails and runs; whether it is text (not special)."""
        self.marked = [*self.marked[1 - self.kept :], t]
        self.marked_runs.push(t)
        if t in self.special:
            self.runs.dropped()
            return False
        self.tail = [*self.tail[1 - self.kept :], t]
        self.runs.push(t)
        return True

    def cut(self, ids: list[int]) -> int | None:
        """How many of `ids` (the next generated tokens) to keep: up to and including the one that
        completes a stop string; None where none does."""
        for i, t in enumerate(ids):
            if self._push(t) and any(s in self._text(self.tail, self.runs) for s in self.strings):
                return i + 1
            # (else the texts are one: no special token in the window, nor in a byte run it begins inside)
            run = self.runs.inside(min(len(self.tail), self.window))
            if any(x in self.special for x in self.marked[-self.window :]) or (run is not None and run[1]):
                if any(s in self._text(self.marked, self.marked_runs, marked=True) for s in self.strings):
                    return i + 1
        return None

    def _text(self, tail: list[int], runs: ByteRuns, marked: bool = False) -> str:
        """The text of `tail`'s last tokens, as many as a stop string's characters can span (a special token
        spans one token and more characters than any); `marked`: with the special tokens' own text."""
        if not tail:
            return ""
        start = max(0, len(tail) - self.window)
        if self.bytes:  # byte-fallback: a window begins inside a character only inside a run of byte tokens
            run = runs.inside(len(tail) - start)
            if run is not None and run[0]:  # begin at the character the window begins in
                while tail[start] in self.continuation:
                    start -= 1  # (the run is UTF-8 from its start: a character's lead byte is at most 3 back)
            elif run is not None and self.stray is not None:  # a run that is no UTF-8: one U+FFFD a byte, as whole
                return self._decode([self.stray, *tail[start:]], marked)[1:]
            return self._decode(tail[start:], marked)
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
