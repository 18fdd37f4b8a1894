"""The plain autoregressive loop: a generator yielding the tokens committed by each step and
keeping its numbers in a GenerationStats; the caller turns that into a GenerationResult."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import torch

from .config import GenerationConfig, SamplingConfig
from .runtime.blocks import sample_block
from .runtime.cuda_graphs import StepGraphs, step_bodies
from .runtime.memory import new_cache
from .runtime.model import Transformer
from .sampling import token_history
from .stats import GenerationStats, finished


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
    read_every: int = 1,
    graph_attention: str = "bucketed",
    on_prefill: Callable[[int, int], None] | None = None,
    resumed: bool = False,
) -> Iterator[list[int]]:
    """Plain autoregressive decoding: one forward and one draw per token. The call plans the run's memory
    and allocates its cache (a run that cannot be is refused here, not at the first token); the iterator
    it returns prefills and decodes. `generated`: tokens an
    earlier run already produced (resume, `resumed`); the cache is rebuilt by a prefill of prompt + them.
    `cuda_graphs`: on CUDA, replay each decode forward as a CUDA graph (else its body runs eagerly);
    `graph_attention`: how those bodies attend (runtime.cuda_graphs). `on_prefill(read, total)`: the
    prefill's progress (Transformer.prefill).

    `read_every` N: sampled tokens stay on the device and are read back N at a time (a block), so a
    GPU is never left idle while the host waits for each token; the host queues the block's draws
    and forwards ahead. The tokens are the same for every N (a block draws its N uniforms at once,
    the same stream as N single draws, and gives back those it did not use when an end-of-sequence
    token ends it early; runtime/blocks.py); what changes is that a block is yielded whole, and
    that a block an EOS ends has run up to N-1 forwards past it, whose results are dropped."""
    generated = generated or []
    if (reason := finished(generated, gen, eos_ids)) is not None:
        stats.finish_reason = reason
        return iter(())
    if model.tp is not None:  # rank 0 draws and broadcasts each token: one at a time
        read_every = 1
    capacity = len(prompt) + gen.max_new_tokens
    # (its prefill reads the prompt and the tokens a resumed run holds: no chunk of it is longer)
    cache = new_cache(model, capacity, min(gen.prefill_chunk, len(prompt) + len(generated)), resumed=resumed)
    history, history_dev = token_history(prompt + generated, capacity, model.device)  # host; model's device

    def steps() -> Iterator[list[int]]:  # the checks and the cache above are made when the run is asked for
        n = len(prompt) + len(generated)
        t0 = time.perf_counter()
        logits, _ = model.prefill(history[:n], cache, gen.prefill_chunk, decoded_from=len(prompt), progress=on_prefill)
        stats.prefill_seconds += time.perf_counter() - t0
        bodies = step_bodies(model)
        graphs = StepGraphs(model, cache, capture=cuda_graphs, attention=graph_attention) if bodies else None
        stop = frozenset() if gen.ignore_eos else eos_ids
        pick = None if model.tp is None else model.tp.draw  # tensor parallel: rank 0 draws, all ranks get it
        i = len(generated)
        while i < gen.max_new_tokens:
            t0 = time.perf_counter()
            k = min(read_every, gen.max_new_tokens - i)  # tokens in this block
            block = sample_block(model, cache, graphs, logits, history_dev, n, k, sampling, generator, stop,
                                 forward_last=i + k < gen.max_new_tokens, pick=pick)  # the run's last token needs none
            tokens, logits = block.tokens, block.logits
            if history_dev is not history:
                history[n : n + len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            n += len(tokens)
            i += len(tokens)
            stats.decode_seconds += time.perf_counter() - t0
            stats.new_tokens += len(tokens)
            stats.steps += len(tokens)
            if graphs is not None:
                stats.add_captures([graphs])
            yield tokens
            if tokens[-1] in stop:
                stats.finish_reason = "eos"
                return
        stats.finish_reason = "length"  # (a stop string closes it at a yield)

    return steps()
