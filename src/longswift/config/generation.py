"""SamplingConfig (the logits transform) and GenerationConfig (how much to generate, when to stop)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

from ..errors import ConfigError, ConfigTypeError, LongswiftError
from .checks import flag_help, seed_problem, validated

# Logits of |x| <= 300, through a penalty in PENALTY_RANGE (a positive logit divided by it, a negative one
# multiplied) and then divided by a temperature of at least MIN_TEMPERATURE, stay finite in float32 (3.4e38);
# below it the draw saw NaN (1e-45 gave the vocabulary's last id at every step).
MIN_TEMPERATURE = 1e-30
PENALTY_RANGE = (1e-6, 1e6)


@dataclass
class SamplingConfig:
    """The logits transform: banned tokens, contextual penalty, then temperature, top-k, top-p, min-p, eta."""

    temperature: float = field(default=1.0, metadata=flag_help("softmax temperature; 0 means greedy (argmax)"))
    top_k: int = field(default=0, metadata=flag_help("keep the k most likely tokens; 0 disables"))
    top_p: float = field(default=1.0, metadata=flag_help("nucleus sampling mass in (0, 1]; 1 disables"))
    min_p: float = field(
        default=0.1, metadata=flag_help("drop tokens below min_p x the top probability; 0 disables")
    )
    eta: float = field(default=0.0, metadata=flag_help("eta-sampling epsilon in [0, 1); 0 disables"))
    repetition_penalty: float = field(
        default=1.2, metadata=flag_help("contextual penalty theta on tokens of the last window; 1 disables")
    )
    penalty_window: int = field(default=1024, metadata=flag_help(
        "the penalty looks at this many most recent tokens (0: none, as a penalty of 1)"))
    seed: int | None = field(default=None, metadata=flag_help(
        "RNG seed; the same seed gives the same output (default: a random one, which --json and checkpoints record; "
        "-1 is a seed like any other, not a random one; torch takes seeds modulo 2^64, so a negative seed is the "
        "same as itself + 2^64: -1 as 18446744073709551615)"))
    # Token ids whose logits are -inf before anything else (never drawn, never drafted). Not a flag of its own
    # (generate's --ban-ids / --ban-token set it): Engine.stream adds the model's EOS ids under --ignore-eos, and a
    # checkpoint records the result,
    # so a resumed run bans exactly what its first run banned (absent in older checkpoints: none).
    banned_ids: tuple[int, ...] = ()

    @validated
    def __post_init__(self) -> None:
        if hasattr(self.banned_ids, "tolist") and getattr(self.banned_ids, "ndim", None) == 1:  # a tensor or array
            self.banned_ids = self.banned_ids.tolist()
        if not isinstance(self.banned_ids, (tuple, list, set, frozenset, range)):
            raise ConfigTypeError(f"SamplingConfig.banned_ids must be a tuple or list of token ids; got "
                                  f"{self.banned_ids!r} ({type(self.banned_ids).__name__})")
        wrong = next((t for t in self.banned_ids if not isinstance(t, numbers.Integral) or isinstance(t, bool)), None)
        if wrong is not None:
            raise ConfigTypeError(f"SamplingConfig.banned_ids must be token ids (whole numbers); got {wrong!r} "
                                  f"({type(wrong).__name__}) among them (a token's text: Engine.token_id gives its id)",
                                  f"banned token ids must be whole numbers; got {wrong!r}")
        if any(t < 0 for t in self.banned_ids):
            raise ConfigError(f"SamplingConfig.banned_ids must be non-negative; got {min(self.banned_ids)}",
                              f"banned token ids must be non-negative; got {min(self.banned_ids)}")
        # a list from JSON, numpy ids, repeats: one canonical form of Python ints
        self.banned_ids = tuple(sorted({int(t) for t in self.banned_ids}))
        checks = [
            # Below MIN_TEMPERATURE (or a penalty outside its range), logits / temperature can overflow float32:
            # the draw would see NaN, not the argmax such a temperature approaches (temperature 0 is that argmax).
            (self.temperature == 0 or MIN_TEMPERATURE <= self.temperature < math.inf,
             f"--temperature must be 0 (greedy) or a finite number >= {MIN_TEMPERATURE:g}"),
            (self.top_k >= 0, "--top-k must be >= 0"),
            (0 < self.top_p <= 1, "--top-p must be in (0, 1]"),
            (0 <= self.min_p < 1, "--min-p must be in [0, 1)"),
            (0 <= self.eta < 1, "--eta must be in [0, 1)"),
            (PENALTY_RANGE[0] <= self.repetition_penalty <= PENALTY_RANGE[1],
             f"--repetition-penalty must be in [{PENALTY_RANGE[0]:g}, {PENALTY_RANGE[1]:g}] (1 disables)"),
            (self.penalty_window >= 0, "--penalty-window must be >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise LongswiftError(message)
        if (problem := seed_problem(self.seed)) is not None:
            raise LongswiftError(problem)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized_window(self) -> int:
        """Recent tokens the transform reads: the penalty window, or 0 where the penalty is off (1.0),
        so that no window is cut or gathered for nothing."""
        return self.penalty_window if self.repetition_penalty != 1.0 else 0


@dataclass
class GenerationConfig:
    """How much to generate and when to stop."""

    max_new_tokens: int = field(default=256, metadata=flag_help("number of tokens to generate"))
    ignore_eos: bool = field(default=False, metadata=flag_help(
        "ban end-of-sequence tokens (logit -inf, as llama.cpp's --ignore-eos and transformers' min_new_tokens), "
        "so generation runs to --max-new-tokens without ever emitting one"))
    prefill_chunk: int = field(
        default=256, metadata=flag_help("prompt tokens per prefill forward (bounds the attention mask size)")
    )
    # End after the generated token whose text completes one of these (kept in the output, as with
    # transformers' stop_strings; one string is taken as one); the command line's repeatable --stop (stop_strings.py)
    stop: tuple[str, ...] = ()

    @validated
    def __post_init__(self) -> None:
        if self.max_new_tokens <= 0:
            raise LongswiftError("--max-new-tokens must be a positive number of tokens")
        if self.prefill_chunk <= 0:
            raise LongswiftError("--prefill-chunk must be positive")
        if isinstance(self.stop, str):  # one stop string, as transformers, vLLM and OpenAI's API take it
            self.stop = (self.stop,)
        if not isinstance(self.stop, (tuple, list)):
            raise ConfigTypeError(f"GenerationConfig.stop must be a string, or a tuple or list of strings; got "
                                  f"{self.stop!r} ({type(self.stop).__name__})", "--stop must be text")
        wrong = next((s for s in self.stop if not isinstance(s, str)), None)
        if wrong is not None:
            raise ConfigTypeError(f"GenerationConfig.stop must be strings; got {wrong!r} ({type(wrong).__name__}) "
                                  "among them", "--stop strings must be non-empty text")
        if not all(self.stop):
            raise LongswiftError("--stop strings must be non-empty text")
        for s in self.stop:  # (a lone surrogate, a JSON escape without its pair, is no text the run can write)
            try:
                s.encode("utf-8")
            except UnicodeEncodeError:
                raise ConfigError(f"GenerationConfig.stop string {s!r} holds a lone surrogate, which is not Unicode "
                                  "text: remove it, or pair it", "--stop strings must be UTF-8 text") from None
        self.stop = tuple(self.stop)  # a checkpoint's JSON gives a list
