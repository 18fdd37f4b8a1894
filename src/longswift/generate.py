"""Generation loops. Each loop is a generator yielding the tokens committed by one step and
keeping its numbers in a GenerationStats; the caller turns that into a GenerationResult."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields

import torch

from .cache import FullKVCache
from .config import GenerationConfig, ModelConfig, SamplingConfig
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
    resumes: int = 0  # times this generation was continued from a checkpoint (each re-prefills the context)

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

    @classmethod
    def from_dict(cls, d: dict) -> GenerationStats:
        """Inverse of to_dict (derived numbers dropped)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

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


def rope_factor_for(cfg: ModelConfig, total: int) -> int:
    """The smallest whole rope-scaling factor whose extended context holds `total` tokens."""
    return -(-total // cfg.max_position_embeddings)


def check_context(cfg: ModelConfig, prompt_tokens: int, max_new_tokens: int) -> None:
    """Refuse a generation longer than the model's context (trained, or extended by rope scaling)."""
    total, limit = prompt_tokens + max_new_tokens, cfg.context_limit
    if total > limit:
        advice = ("lower --max-new-tokens or shorten the prompt" if cfg.rope_type != "default" else
                  f"lower --max-new-tokens, or extend the context on purpose with --rope-scaling yarn:"
                  f"{rope_factor_for(cfg, total)}")
        raise LongswiftError(f"prompt ({prompt_tokens} tokens) + max_new_tokens ({max_new_tokens}) = {total} "
                             f"exceeds this model's context of {limit} tokens: {advice}")


def new_cache(model: Transformer, capacity: int, chunk: int, draft_tokens: int = 0, tree_nodes: int = 0) -> FullKVCache:
    """Plan the memory of a run (with TokenSwift's draft cache and tree, if any), refuse what
    cannot fit, then allocate its full KV cache."""
    cfg = model.cfg
    if cfg.sliding_window is not None and capacity > cfg.sliding_window:
        raise LongswiftError(
            f"this model uses sliding-window attention ({cfg.sliding_window} tokens), which longswift does not "
            f"implement; keep prompt + max_new_tokens <= {cfg.sliding_window}"
        )
    plan_memory(cfg, model.dtype, model.device, capacity, chunk, model.packed, draft_tokens,
                tree_nodes).check(weights_loaded=True)
    return FullKVCache(cfg, capacity, model.dtype, model.device)


def ar_steps(
    model: Transformer,
    prompt: list[int],
    sampling: SamplingConfig,
    gen: GenerationConfig,
    stats: GenerationStats,
    eos_ids: frozenset[int],
    generator: torch.Generator | None,
    generated: list[int] | None = None,
) -> Iterator[list[int]]:
    """Plain autoregressive decoding: one forward and one draw per token. `generated`: tokens an
    earlier run already produced (resume); the cache is rebuilt by a prefill of prompt + them."""
    generated = generated or []
    if done(generated, gen, eos_ids):
        return
    capacity = len(prompt) + gen.max_new_tokens
    cache = new_cache(model, capacity, gen.prefill_chunk)
    history = torch.empty(capacity, dtype=torch.long)  # prompt + generated ids, on the CPU
    n = len(prompt) + len(generated)
    history[:n] = torch.tensor(prompt + generated, dtype=torch.long)
    t0 = time.perf_counter()
    logits, _ = model.prefill(history[:n], cache, gen.prefill_chunk)  # [V]
    stats.prefill_seconds += time.perf_counter() - t0
    pick = draw if model.tp is None else model.tp.draw  # tensor parallel: rank 0 draws, all ranks get it
    for i in range(len(generated), gen.max_new_tokens):
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


def done(generated: list[int], gen: GenerationConfig, eos_ids: frozenset[int]) -> bool:
    """Whether tokens already generated end the generation (length reached, or an EOS not ignored)."""
    if len(generated) >= gen.max_new_tokens:
        return True
    return bool(generated) and generated[-1] in eos_ids and not gen.ignore_eos
