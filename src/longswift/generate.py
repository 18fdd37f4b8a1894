"""Generation loops. Each loop is a generator yielding the tokens committed by one step and
keeping its numbers in a GenerationStats; the caller turns that into a GenerationResult."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import torch

from .cache import FullKVCache
from .config import GenerationConfig, SamplingConfig
from .errors import LongswiftError
from .memory import plan_memory
from .model import Transformer
from .sampling import draw, penalty_window, transform


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
    finish_reason: str = "length"
    accepted_tokens: int = 0  # drafted tokens the lossless walk accepted
    draft_positions: int = 0  # deepest drafted position per step, summed (alpha's denominator; 4 for 1,3,3,3)
    ngram_accepted: int = 0  # accepted tokens that only the n-gram table had proposed
    lookup_steps: int = 0  # adaptive steps that verified only n-gram continuations of the root (no draft pass)
    stage_seconds: dict[str, float] = field(default_factory=dict)  # draft / tree / verify / accept / commit

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def alpha(self) -> float:
        """Acceptance rate as the paper defines it: accepted draft tokens / draft positions."""
        return self.accepted_tokens / self.draft_positions if self.draft_positions else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.new_tokens / self.steps if self.steps else 0.0

    def to_dict(self) -> dict:
        return asdict(self) | {"tokens_per_second": round(self.tokens_per_second, 3), "alpha": round(self.alpha, 4),
                               "tokens_per_step": round(self.tokens_per_step, 3)}


@dataclass
class GenerationResult:
    """Generated token ids (prompt excluded), their text, and the run's stats."""

    token_ids: list[int]
    text: str | None
    stats: GenerationStats = field(repr=False)

    def to_dict(self) -> dict:
        return {"token_ids": self.token_ids, "text": self.text, "stats": self.stats.to_dict()}


def new_cache(model: Transformer, capacity: int, chunk: int) -> FullKVCache:
    """Plan the memory of a run, refuse what cannot fit, then allocate its full KV cache."""
    cfg = model.cfg
    if cfg.sliding_window is not None and capacity > cfg.sliding_window:
        raise LongswiftError(
            f"this model uses sliding-window attention ({cfg.sliding_window} tokens), which longswift does not "
            f"implement; keep prompt + max_new_tokens <= {cfg.sliding_window}"
        )
    plan_memory(cfg, model.dtype, model.device, capacity, chunk, model.packed).check(weights_loaded=True)
    return FullKVCache(cfg, capacity, model.dtype, model.device)


def ar_steps(
    model: Transformer,
    prompt: list[int],
    sampling: SamplingConfig,
    gen: GenerationConfig,
    stats: GenerationStats,
    eos_ids: frozenset[int],
    generator: torch.Generator | None,
) -> Iterator[list[int]]:
    """Plain autoregressive decoding: one forward and one draw per token."""
    capacity = len(prompt) + gen.max_new_tokens
    cache = new_cache(model, capacity, gen.prefill_chunk)
    history = torch.empty(capacity, dtype=torch.long)  # prompt + generated ids, on the CPU
    history[: len(prompt)] = torch.tensor(prompt, dtype=torch.long)
    t0 = time.perf_counter()
    logits, _ = model.prefill(history[: len(prompt)], cache, gen.prefill_chunk)  # [V]
    stats.prefill_seconds = time.perf_counter() - t0
    pick = draw if model.tp is None else model.tp.draw  # tensor parallel: rank 0 draws, all ranks get it
    n = len(prompt)
    for i in range(gen.max_new_tokens):
        t0 = time.perf_counter()
        window = penalty_window(history, n, sampling.penalty_window).to(logits.device)
        token = pick(transform(logits[None], window[None], sampling)[0], sampling, generator)
        history[n] = token
        n += 1
        last = i == gen.max_new_tokens - 1 or (token in eos_ids and not gen.ignore_eos)
        if not last:
            position = torch.tensor([n - 1], device=model.device)
            logits, _ = model.forward(torch.tensor([token], device=model.device), position, cache)
            logits = logits[0]
        stats.decode_seconds += time.perf_counter() - t0
        stats.new_tokens += 1
        stats.steps += 1
        yield [token]
        if token in eos_ids and not gen.ignore_eos:
            stats.finish_reason = "eos"
            return
