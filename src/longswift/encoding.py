"""Prompt text or token ids -> the ids a run reads: the model's tokenizer and chat template applied, and what they
cannot take refused in a line. Needs the tokenizer and the model's config, not its weights: the command line
encodes a text prompt before the weights load, so that its plan counts the prompt's tokens."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Union

from .config import ModelConfig
from .errors import ConfigError, ConfigTypeError, LongswiftError, reason_of

if TYPE_CHECKING:
    import numpy as np
    import torch

# A prompt: text, or one row of token ids (a list or tuple of ints, a 1-D tensor or numpy array).
Prompt = Union[str, Sequence[int], "torch.Tensor", "np.ndarray"]  # (names: torch loads with the model)


def _check_system(prompt: Prompt, chat: bool | None, system: str | None) -> None:
    """Refuse a system message that is not text, is empty, or goes with token ids or without the chat template."""
    if system is None:
        return
    if not isinstance(system, str):
        raise ConfigTypeError(f"system must be text (str) or None; got {type(system).__name__}")
    if not isinstance(prompt, str):
        raise LongswiftError("a system message (system=, --system) goes into the chat template, which takes prompt "
                             "text, not token ids")
    if chat is False:
        raise LongswiftError("a system message (system=, --system) goes into the chat template: pass chat=True "
                             "with it (the API sends text without the template unless asked)")
    if not system.strip():
        raise ConfigError("the system message is empty: give some text or leave it out")


class PromptEncoder:
    """A model's tokenizer (None: it has none, token ids only) and config, encoding prompts as Engine.encode does."""

    def __init__(self, tokenizer: Any, cfg: ModelConfig) -> None:
        self.tokenizer, self.cfg = tokenizer, cfg
        self._longest: int | None = None  # the tokenizer's longest vocabulary entry, in characters (0: unknown)

    def encode(self, prompt: Prompt, chat: bool | None = False, system: str | None = None) -> list[int]:
        """Prompt text or ids (a list, or a 1-D tensor or array) -> ids. `chat`: wrap text in the model's
        chat template (True), send it as it is (False), or the template when the model has one (None, the
        CLI's default). `system`: the chat's system message (instead of the template's default one)."""
        _check_system(prompt, chat, system)
        if hasattr(prompt, "tolist") and not isinstance(prompt, str):  # a tensor or numpy array of token ids
            prompt = prompt.tolist()
            if not isinstance(prompt, list) or any(isinstance(t, list) for t in prompt):
                raise ConfigTypeError("prompt token ids must be one row (a 1-D tensor or array, or a list): "
                                      "a call takes one prompt")
        several = (str, list, tuple, dict)
        if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(p, several) for p in prompt):
            what = "chat messages" if isinstance(prompt[0], dict) else "several prompts"
            raise ConfigTypeError(f"prompt is a list of {what}: a call takes one prompt, as text or a list of token ids"
                                  + (" (a chat: its text with chat=True, and system= for the system message)"
                                     if what == "chat messages" else " (one stream per prompt; streams may be "
                                                                     "iterated in turn)"))
        if isinstance(prompt, (list, tuple, range)):
            ids = self._given_ids(prompt, chat)
        elif not isinstance(prompt, str):
            raise ConfigTypeError(f"prompt must be text (str) or a list of token ids (ints); got {type(prompt).__name__}")
        else:
            ids = self._text_ids(prompt, chat, system)
        if not ids:
            raise ConfigError("the prompt is empty: give at least one token id" if not isinstance(prompt, str)
                              else "the prompt is empty: give at least one token of prompt text")
        return ids

    def _given_ids(self, prompt: list | tuple | range, chat: bool | None) -> list[int]:
        """Token ids given as a prompt, checked: whole numbers inside the vocabulary, and no chat template asked for."""
        for i, t in enumerate(prompt):
            if isinstance(t, bool) or not isinstance(t, numbers.Integral):
                raise ConfigTypeError(f"prompt token ids must be whole numbers; got {t!r} ({type(t).__name__}) "
                                      f"at position {i}")
        ids = [int(t) for t in prompt]
        if any(not 0 <= t < self.cfg.vocab_size for t in ids):  # (a ValueError too, as README says)
            raise ConfigError(f"prompt token ids must be in [0, {self.cfg.vocab_size})",
                              f"--prompt-ids must be in [0, {self.cfg.vocab_size})")
        if chat:
            raise LongswiftError("chat=True wraps prompt text in the chat template, and token ids are sent as they "
                                 "are: pass the text, or drop chat=True")
        return ids

    def _text_ids(self, prompt: str, chat: bool | None, system: str | None) -> list[int]:
        """Prompt text encoded, in the chat template where asked for (or by default, `chat` None, where the model
        has one); text that cannot fit the context, and ids past the model's vocabulary, are refused."""
        if not prompt.strip():
            raise ConfigError("the prompt is empty: give some prompt text")
        if self.tokenizer is None:
            raise LongswiftError("this model has no tokenizer: pass the prompt as a list of token ids",
                                 "this model has no tokenizer: give the prompt as token ids (--prompt-ids)")
        check_encodable(prompt, "the prompt")
        self._check_prompt_length(prompt)
        if system is not None:
            check_encodable(system, "the system message")
            self._check_prompt_length(system, "the system message")
        template = bool(getattr(self.tokenizer, "chat_template", None))
        if chat and not template:
            raise LongswiftError("this model has no chat template: drop chat=True (--chat)")
        if system is not None and not template:
            raise LongswiftError("this model has no chat template to put a system message (--system) in: "
                                 "write it into the prompt text instead")
        if chat or (chat is None and template):
            ids = self._apply_template([*([{"role": "system", "content": system}] if system is not None else []),
                                        {"role": "user", "content": prompt}])
        else:
            ids = self.tokenizer.encode(prompt)
        past = next((t for t in ids if not 0 <= t < self.cfg.vocab_size), None)
        if past is not None:  # (the embedding's IndexError in the first forward, and a stream left broken)
            raise LongswiftError(f"the prompt text encodes to token {past} of the tokenizer, past this model's "
                                 f"{self.cfg.vocab_size} logits: the tokenizer is not this model's; load the "
                                 "model with its own tokenizer")
        return ids

    def _check_prompt_length(self, text: str, what: str = "the prompt text") -> None:
        """Refuse text that cannot fit the context, before tokenizing it: a token covers at most as many characters
        as its vocabulary entry has (twice that, for normalizers that merge characters), so text longer than that
        many per token of context is longer than the context (a 20 MB file took 21 s and 4 GB to be refused)."""
        if self._longest is None:
            vocab = getattr(self.tokenizer, "get_vocab", None)  # (a tokenizer of the caller's may lack it: no bound)
            self._longest = max((len(t) for t in vocab()), default=1) if vocab else 0
        limit, longest = self.cfg.context_limit, self._longest
        if longest and len(text) > 2 * longest * limit:
            raise ConfigError(f"{what} ({len(text):,} characters) is far longer than this model's context of "
                              f"{limit:,} tokens can hold: shorten it")

    def _apply_template(self, messages: list[dict[str, str]]) -> list[int]:
        from jinja2 import TemplateError, TemplateSyntaxError

        def refused(what: str, remedy: str) -> LongswiftError:  # (the API's spelling, and the command line's)
            return LongswiftError(f"this model's chat template {what}: {remedy.format('chat=False')}",
                                  f"this model's chat template {what}: {remedy.format('--raw')}")

        try:
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        except TemplateSyntaxError as exc:  # a damaged or hand-edited template
            raise refused(f"is not a valid template ({reason_of(exc)})",
                          "fix it in the model's tokenizer config, or send the prompt as it is ({})") from None
        except TemplateError as exc:  # the template's own refusal (jinja's raise_exception), e.g. of a system role
            if any(m["role"] == "system" for m in messages):
                raise LongswiftError(f"this model's chat template refuses a system message ({reason_of(exc)}): write "
                                     "it into the prompt text instead") from None
            raise refused(f"refuses this prompt ({reason_of(exc)})", "send the prompt as it is ({})") from None
        except Exception as exc:  # an error inside the template's code (it reads a field the messages lack)
            raise refused(f"fails ({reason_of(exc)})", "send the prompt as it is ({}), or fix the template") from None
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def check_encodable(text: str, what: str) -> None:
    """Refuse text no tokenizer can take: a lone surrogate (a JSON escape such as \\ud800 without its pair) is no
    Unicode character, and the tokenizer's TypeError (or the chat template's failure) did not say which text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(f"{what} holds a lone surrogate (U+{ord(text[exc.start]):04X} at character {exc.start}), "
                          "which is not Unicode text: remove it, or pair it (a JSON escape cut in half)") from None
