"""What every generation loop shares: its stats, its result type and its stopping rule."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .config import GenerationConfig, check_types
from .errors import ConfigError, ConfigTypeError

# Why a run ended: its length, an EOS, a stop string, or a stop between steps (the CLI's signal; a caller's break).
FINISH_REASONS = ("length", "eos", "stop", "interrupted")


@dataclass
class GenerationStats:
    """What a run did and how long it took (decode time excludes the consumer's time)."""

    method: str
    prompt_tokens: int
    new_tokens: int = 0
    steps: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    seed: int | None = None
    finish_reason: str | None = None  # one of FINISH_REASONS once the run has ended; None while it runs
    accepted_tokens: int = 0  # drafted tokens the lossless walk accepted
    draft_positions: int = 0  # deepest drafted position per step, summed (alpha's denominator; 4 for 1,3,3,3)
    ngram_accepted: int = 0  # accepted tokens that only the n-gram table had proposed
    lookup_steps: int = 0  # adaptive steps that verified only n-gram continuations of the root (no draft pass)
    narrow_steps: int = 0  # adaptive full steps on a narrow trie (first candidate per depth, one n-gram path)
    half_steps: int = 0  # adaptive full steps on the likeliest half of the node budget (--max-nodes of 32 or more)
    plain_steps: int = 0  # adaptive steps that ran the root alone (an AR step: no draft paid for itself)
    verified_nodes: int = 0  # trie nodes (root included) verified by full, half, narrow and lookup steps
    verify_steps: int = 0  # those steps (every step but plain ones and the first token's draw): alpha's sample
    stage_seconds: dict[str, float] = field(default_factory=dict)  # draft / tree / verify / accept / commit / plain
    graph_captures: int = 0  # CUDA graphs captured (one per step shape, cache bucket and node budget in use)
    graph_capture_seconds: float = 0.0  # their wall time, inside decode_seconds
    resumes: int = 0  # times this generation was continued from a checkpoint (each re-prefills the context)
    processes: int = 1  # tensor parallel: the processes that ran it (a resumed run: its last part's)
    device: str | None = None  # where it ran, as torch names it ("cpu", "cuda:0"; a resumed run: its last part's)
    dtype: str | None = None  # the model's compute dtype ("float32", "bfloat16"; a resumed run: its last part's)

    @property
    def tokens_per_second(self) -> float:
        """Decoded tokens per decode second: the tokens after the first, which is the prefill's draw (decode time
        holds the work of the others alone: AR's n-1 forwards for n tokens), as bench's decode tok/s counts them;
        0.0 where there is no rate (has_rate: a run of one token is the prefill's draw alone; to_dict says null
        there)."""
        return (self.new_tokens - 1) / self.decode_seconds if self.decode_seconds > 0 and self.has_rate else 0.0

    @property
    def has_rate(self) -> bool:
        """Whether tokens_per_second means anything: a run of one token is the prefill's draw alone."""
        return self.new_tokens > 1

    @property
    def alpha(self) -> float:
        """Acceptance rate as the paper defines it: accepted draft tokens / draft positions; 0.0 for a run that
        drafted nothing (AR, or only plain steps), where it is undefined (to_dict says null there)."""
        return self.accepted_tokens / self.draft_positions if self.draft_positions else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.new_tokens / self.steps if self.steps else 0.0

    @classmethod
    def from_dict(cls, d: dict) -> GenerationStats:
        """Inverse of to_dict (derived numbers dropped). A field of the wrong type raises a
        ConfigTypeError, a missing one a TypeError (a hand-edited checkpoint)."""
        names = {f.name for f in fields(cls)}
        stats = cls(**{k: v for k, v in d.items() if k in names})
        check_types(stats)
        if not isinstance(stats.stage_seconds, dict) or not all(
                isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
                for k, v in stats.stage_seconds.items()):  # (a TypeError traceback when the run added to one)
            raise ConfigTypeError("GenerationStats.stage_seconds must map stage names to seconds",
                                  "stats.stage_seconds must map stage names to seconds")
        stats.stage_seconds = dict(stats.stage_seconds)  # the run's own: resuming added to the checkpoint's dict
        problem = _out_of_range(stats)
        if problem:
            raise ConfigError(f"GenerationStats.{problem}", f"stats.{problem}")
        return stats

    def drop(self, ids: list[int], keep: int, before: GenerationStats) -> None:
        """Take back a step's tokens after its first `keep` of `ids` (a stop string ended the run there; `before`:
        the stats before the step): they are not the run's tokens, nor, in a block of one-token steps (AR's, or
        plain ones), their steps; nor, in a drafting step (StepTokens), the accepted drafts among them."""
        dropped = len(ids) - keep
        self.new_tokens -= dropped
        if self.steps - before.steps == len(ids):  # a block of one-token steps: the dropped tokens' steps
            self.steps -= dropped
            if self.plain_steps - before.plain_steps == len(ids):
                self.plain_steps -= dropped
        if isinstance(ids, StepTokens):
            lost = ids.ngram[keep:]  # the accepted drafts the cut drops (the new root, last, is not one)
            self.accepted_tokens -= len(lost)
            self.ngram_accepted -= sum(lost)

    def add_captures(self, graphs: Iterable[Any]) -> None:
        """Count the CUDA graphs these step bodies (runtime.cuda_graphs.StepGraphs) captured since last asked."""
        for g in graphs:
            count, seconds = g.take_captures()
            self.graph_captures += count
            self.graph_capture_seconds += seconds

    def to_dict(self) -> dict:
        """The fields and the derived numbers; alpha is None for a run that drafted nothing (AR, or
        TokenSwift whose adaptive steps were all plain), whose acceptance rate is not 0 but undefined, and
        tokens_per_second for a run of one token, the prefill's draw (as the summary line says)."""
        alpha = round(self.alpha, 4) if self.draft_positions else None
        rate = round(self.tokens_per_second, 3) if self.has_rate else None
        return asdict(self) | {"tokens_per_second": rate, "alpha": alpha,
                               "tokens_per_step": round(self.tokens_per_step, 3)}


class StepTokens(list[int]):
    """A drafting step's emitted tokens: the drafts the walk accepted, in order, then the new root; `ngram`
    [accepted]: which of the accepted ones only the n-gram table proposed. A stop string that ends the run inside
    the step takes the tokens after it back from the run's stats (GenerationStats.drop)."""

    def __init__(self, tokens: list[int], ngram: tuple[bool, ...]) -> None:
        if len(ngram) != len(tokens) - 1:
            raise ValueError(f"StepTokens: {len(tokens)} tokens are {len(tokens) - 1} accepted drafts and the new "
                             f"root; got {len(ngram)} flags")
        super().__init__(tokens)
        self.ngram = ngram


@dataclass
class GenerationResult:
    """Generated token ids (prompt excluded), their text, and the run's stats."""

    token_ids: list[int]
    text: str | None
    stats: GenerationStats = field(repr=False)

    def to_dict(self) -> dict:
        return {"token_ids": self.token_ids, "text": self.text, "stats": self.stats.to_dict()}



def finished(generated: list[int], gen: GenerationConfig, eos_ids: frozenset[int]) -> str | None:
    """Why tokens already generated end the generation ("eos": an EOS not ignored, "length"), or None.
    A resumed run whose checkpoint was taken after its last step ends at once, for this reason."""
    if generated and generated[-1] in eos_ids and not gen.ignore_eos:
        return "eos"
    return "length" if len(generated) >= gen.max_new_tokens else None


def ended(generated: list[int], gen: GenerationConfig, eos_ids: frozenset[int], finish_reason: str | None) -> str | None:
    """`finished`, or "stop" for a run a stop string ended (its stats' `finish_reason`): why a run with these
    tokens goes no further (a resume of it generates nothing), or None."""
    return finished(generated, gen, eos_ids) or ("stop" if finish_reason == "stop" and generated else None)


def _out_of_range(stats: GenerationStats) -> str | None:
    """What a stats field read back holds that no run writes (a hand-edited checkpoint: a negative count, a time
    that is negative or not finite, a finish reason of no run), as `name must ...; got value`; None when all are."""
    if stats.finish_reason is not None and stats.finish_reason not in FINISH_REASONS:
        return f"finish_reason must be null or one of {', '.join(FINISH_REASONS)}; got {stats.finish_reason!r}"
    for f in fields(stats):
        value = getattr(stats, f.name)
        if f.name == "seed" or isinstance(value, (str, bool)) or value is None:
            continue
        values = value.values() if isinstance(value, dict) else (value,)
        if not all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in values):
            expected = "finite seconds of 0 or more" if isinstance(value, (float, dict)) else "0 or more"
            return f"{f.name} must be {expected}; got {value!r}"
    if stats.processes < 1:
        return f"processes must be 1 or more; got {stats.processes}"
    return None
