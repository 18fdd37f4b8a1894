"""The plain autoregressive loop: a generator yielding the tokens committed by each step and
keeping its numbers in a GenerationStats; the caller turns that into a GenerationResult."""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from .config import GenerationConfig, SamplingConfig
from .runtime.cuda_graphs import StepGraphs, step_bodies
from .runtime.memory import new_cache
from .runtime.model import Transformer
from .sampling import draw, penalty_window, transform
from .stats import GenerationStats, done


def ar_steps(
    model: Transformer,
    prompt: list[int],
    sampling: SamplingConfig,
    gen: GenerationConfig,
    stats: GenerationStats,
    eos_ids: frozenset[int],
    generator: torch.Generator | None,
    generated: list[int] | None = None,
    cuda_graphs: bool = False,
) -> Iterator[list[int]]:
    """Plain autoregressive decoding: one forward and one draw per token. `generated`: tokens an
    earlier run already produced (resume); the cache is rebuilt by a prefill of prompt + them.
    `cuda_graphs`: on CUDA, replay each decode forward as a CUDA graph (else its body runs eagerly)."""
    generated = generated or []
    if done(generated, gen, eos_ids):
        return
    capacity = len(prompt) + gen.max_new_tokens
    cache = new_cache(model, capacity, gen.prefill_chunk)
    history = torch.empty(capacity, dtype=torch.long)  # prompt + generated ids, on the CPU
    n = len(prompt) + len(generated)
    history[:n] = torch.tensor(prompt + generated, dtype=torch.long)
    # The same ids on the model's device, where the penalty window is cut from (no host copy per token).
    history_dev = history if model.device.type == "cpu" else history.to(model.device)
    t0 = time.perf_counter()
    logits, _ = model.prefill(history[:n], cache, gen.prefill_chunk)  # [V]
    stats.prefill_seconds += time.perf_counter() - t0
    pick = draw if model.tp is None else model.tp.draw  # tensor parallel: rank 0 draws, all ranks get it
    graphs = StepGraphs(model, cache, capture=cuda_graphs) if step_bodies(model) else None
    for i in range(len(generated), gen.max_new_tokens):
        t0 = time.perf_counter()
        window = penalty_window(history_dev, n, sampling.penalty_window)
        token = pick(transform(logits[None], window[None], sampling)[0], sampling, generator)
        history[n] = token
        if history_dev is not history:
            history_dev[n].fill_(token)  # a kernel argument, not a copy from the host
        n += 1
        last = i == gen.max_new_tokens - 1 or (token in eos_ids and not gen.ignore_eos)
        if not last and graphs is not None:
            logits, _ = graphs.decode(token, n - 1)
        elif not last:
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
