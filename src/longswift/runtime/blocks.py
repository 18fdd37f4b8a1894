"""Token blocks: k autoregressive draws and forwards queued on the device and read back once.

AR needs each token to go on, but the device already has it: the draw (`sampling.draw_rows`)
leaves the token as a [1] tensor, which is written into the device copy of the history (where the
next draw's penalty window is cut from) and fed to the next decode forward (`StepGraphs.decode`
copies a token tensor into its buffer; where a forward follows, `StepGraphs.sample_decode` runs
the draw inside the decode body, so a CUDA graph replays both). So the host queues the block's
draws and forwards without waiting for any of them, and one device-to-host copy reads the k tokens. Reading each token
instead serialises host and GPU: the host's Python and launches for one token wait for the
device's forward of the one before.

The tokens are the draws AR makes one by one: the block draws its k uniforms at once (the same
stream as k single draws), and when a stop token ends the block early the generator is rewound to
the block's start and advanced by the tokens kept, so it is left where reading each token would
leave it. The forwards queued past a stop token are wasted, never used (the generation ends there)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..config import SamplingConfig
from ..sampling import draw_rows, penalty_window, transform, uniforms
from .cache import FullKVCache
from .cuda_graphs import StepGraphs
from .model import Transformer


@dataclass
class Block:
    """What `sample_block` drew and what its last forward left."""

    tokens: list[int]  # the drawn tokens, up to and including a stop token if one was drawn
    logits: torch.Tensor  # [V] the logits after the last forward (the input logits if none ran)
    hidden: torch.Tensor | None  # [hidden] the last forward's hidden state (None if none ran)


def decode(model: Transformer, cache: FullKVCache, graphs: StepGraphs | None, token: torch.Tensor | int,
           position: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One token (an id, or [1] long on the device) at the cache's end -> (logits [V], hidden [hidden]),
    through the step bodies where the loop runs them (CUDA), else the model's forward."""
    if graphs is not None:
        return graphs.decode(token, position)
    ids = token if isinstance(token, torch.Tensor) else torch.tensor([token], device=model.device)
    # (the position on the host: dynamic NTK rope reads its maximum there, which a device tensor would make a sync)
    logits, hidden = model.forward(ids, torch.tensor([position]), cache)
    return logits[0], hidden[0]


def sample_block(model: Transformer, cache: FullKVCache, graphs: StepGraphs | None, logits: torch.Tensor,
                 history: torch.Tensor, length: int, k: int, sampling: SamplingConfig,
                 generator: torch.Generator | None, stop_ids: frozenset[int], forward_last: bool,
                 pick: Callable[[torch.Tensor, SamplingConfig, torch.Generator | None], int] | None = None) -> Block:
    """Draw k tokens after history[:length] (history: on the model's device, capacity past length + k),
    starting from `logits` [V] (those after history[length - 1]); forward each drawn token at the
    cache's end except the last unless `forward_last`. The drawn tokens are written to
    history[length:length + k] on the device; the block is read back once and cut after the first
    token in `stop_ids`. `pick` (tensor parallel: rank 0 draws and broadcasts, so every rank gets
    the token) draws on the host instead, one token at a time: k must be 1."""
    if pick is not None and k != 1:
        raise ValueError("sample_block: a host-side pick draws one token per block")
    start = None
    u = None
    if not sampling.greedy and pick is None:
        rng = generator if generator is not None else torch.default_generator
        start = rng.get_state() if k > 1 else None
        u = uniforms(generator, k).to(model.device, non_blocking=True)  # [k]
    hidden = None
    body = graphs if graphs is not None and pick is None and graphs.sample_in_body else None  # graphs that draw
    if body is not None:
        body.bind_sampling(history, sampling)
    for j in range(k):
        if body is not None and (j + 1 < k or forward_last):  # the draw, its history write and the forward: one body
            logits, hidden = body.sample_decode(logits, None if u is None else u[j : j + 1], length + j)
            continue
        window = penalty_window(history, length + j, sampling.penalty_window)
        x = transform(logits[None], window[None], sampling)  # [1, V]
        if pick is not None:
            token = torch.tensor([pick(x[0], sampling, generator)], device=model.device)
        else:
            token = draw_rows(x, sampling, None if u is None else u[j : j + 1])  # [1] on the device
        history[length + j : length + j + 1].copy_(token)
        if j + 1 < k or forward_last:
            logits, hidden = decode(model, cache, graphs, token, length + j)
    tokens = history[length : length + k].tolist()  # the block's one device-to-host read
    end = next((j + 1 for j, t in enumerate(tokens) if t in stop_ids), k)
    if start is not None and end < k:  # give back the uniforms of the draws past the stop token
        rng.set_state(start)
        uniforms(generator, end)
    return Block(tokens[:end], logits, hidden)
