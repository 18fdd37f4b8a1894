"""The logits transform (banned tokens, contextual penalty, temperature, top-k, top-p, min-p, eta)
and sampling.

AR decoding and speculative verification both call `transform` and `draw`, so a token accepted
by verification is drawn from exactly the distribution AR would have drawn it from."""

from __future__ import annotations

import collections
import math
import threading
import weakref

import numpy as np
import torch

from .config import SamplingConfig


def token_history(ids: list[int], capacity: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A generation's ids (prompt + output) in a buffer of its whole `capacity` [capacity] long, on the
    CPU, and the same on the model's device, where penalty windows are cut from and drawn tokens are
    written (no host copy per token); one tensor where the device is the CPU. ids fill the start."""
    host = torch.empty(capacity, dtype=torch.long)
    host[: len(ids)] = torch.tensor(ids, dtype=torch.long)
    return host, host if device.type == "cpu" else host.to(device)


def penalty_window(history: torch.Tensor, length: int, window: int) -> torch.Tensor:
    """The last `window` tokens of `history[:length]` — the tokens the contextual penalty sees."""
    return history[max(0, length - window) : length]


def apply_penalty(logits: torch.Tensor, window_ids: torch.Tensor, theta: float) -> torch.Tensor:
    """logits: [N, V]; window_ids: [N, W] long, -1 = padding. Each token present in a row's window
    has its logit divided by theta if positive, multiplied by theta otherwise (CTRL-style)."""
    if theta == 1.0 or window_ids.numel() == 0:
        return logits
    n, v = logits.shape
    present = torch.zeros(n, v + 1, dtype=torch.bool, device=logits.device)  # column v absorbs padding
    present.scatter_(1, torch.where(window_ids < 0, v, window_ids), True)
    present = present[:, :v]
    penalized = torch.where(logits > 0, logits / theta, logits * theta)
    return torch.where(present, penalized, logits)


class BanTensors:
    """banned_index(ids, device): the ids as a long tensor on the device, the same tensor for as long as anything
    holds it. A CUDA graph that captures the ban (the decode body's draw, runtime.cuda_graphs) may not copy from
    the host while it captures, and its replays read the tensor's memory: StepGraphs holds the tensor it binds,
    so it stays, and stays the one a capture finds. Besides those, the RECENT last lists used are kept (a run
    bans with one list for every token); the rest are freed (every list a process ever used was kept: a service
    banning other tokens per request grew by their size on every request)."""

    RECENT = 16

    def __init__(self) -> None:
        self.recent: collections.OrderedDict[tuple, torch.Tensor] = collections.OrderedDict()
        self.alive: weakref.WeakValueDictionary[tuple, torch.Tensor] = weakref.WeakValueDictionary()
        self.lock = threading.Lock()  # (engines generating in several threads share it)

    def __call__(self, banned_ids: tuple[int, ...], device: torch.device) -> torch.Tensor:
        key = (tuple(banned_ids), torch.device(device))
        with self.lock:
            index = self.alive.get(key)
            if index is None:
                index = self.alive[key] = torch.tensor(banned_ids, dtype=torch.long, device=device)
            self.recent[key] = index
            self.recent.move_to_end(key)
            while len(self.recent) > self.RECENT:
                self.recent.popitem(last=False)
            return index

    def held(self) -> int:
        """How many lists' tensors are alive (the recent ones and those held elsewhere)."""
        return len(self.alive)

    def cache_clear(self) -> None:
        with self.lock:
            self.recent.clear()
            self.alive.clear()


banned_index = BanTensors()


def ban(logits: torch.Tensor, banned_ids: tuple[int, ...]) -> torch.Tensor:
    """logits [N, V] with the columns of `banned_ids` at -inf (a new tensor: the input is kept)."""
    if not banned_ids:
        return logits
    return logits.index_fill(1, banned_index(tuple(banned_ids), logits.device), -math.inf)


def transform(logits: torch.Tensor, window_ids: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """logits: [N, V] -> transformed logits [N, V] (float32, or float64 for float64 input);
    banned and filtered tokens at -inf. The ban comes first, so no filter sees a banned token
    (as with llama.cpp's logit bias and transformers' min_new_tokens).
    Greedy configs get the ban and the penalty only (the filters never remove the argmax)."""
    x = ban(logits.to(torch.promote_types(logits.dtype, torch.float32)), cfg.banned_ids)
    x = apply_penalty(x, window_ids, cfg.repetition_penalty)
    if cfg.greedy:
        return x
    if cfg.temperature != 1.0:
        x = x / cfg.temperature
    if cfg.top_k > 0 and cfg.top_k < x.shape[-1]:
        kth = torch.topk(x, cfg.top_k, dim=-1).values[:, -1:]  # [N, 1]
        x = x.masked_fill(x < kth, -math.inf)
    if cfg.top_p < 1.0:
        x = _top_p(x, cfg.top_p)
    if cfg.min_p > 0.0:
        probs = torch.softmax(x, dim=-1)
        threshold = cfg.min_p * probs.max(dim=-1, keepdim=True).values
        x = x.masked_fill(probs < threshold, -math.inf)
    if cfg.eta > 0.0:
        x = _eta(x, cfg.eta)
    return x


def _top_p(x: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose total probability reaches top_p: in the
    order of descending logits, ties in vocabulary order (stable, so which tokens tie-break never
    depends on the other rows of the batch: the walk transforms one row or all of a trie's rows at
    once), a token is dropped when the probability mass of the tokens before it reaches top_p. On the
    CPU each row's sums run in order, so a row's result is the same alone or in a batch; CUDA's
    cumulative sum picks its summation order by the number of rows, so a token whose mass lies within
    float rounding of top_p may go either way, alone or batched, as the verify pass's logits may
    differ from a decode step's by rounding (exact outputs are float64's; docs/design.md)."""
    if x.device.type != "cpu" or x.requires_grad or x.dtype not in (torch.float32, torch.float64):
        return x.masked_fill(_top_p_drop_by_order(x, top_p), -math.inf)  # the GPU's way: no host read
    return x.masked_fill(_top_p_drop_cpu(x, top_p), -math.inf)


def _dropped_positions(sorted_x: torch.Tensor, top_p: float) -> torch.Tensor:
    """Rows of logits sorted descending [N, V] -> which positions top-p drops [N, V] bool."""
    probs = torch.softmax(sorted_x, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs  # [N, V] mass of strictly more likely tokens
    drop = mass_before >= top_p
    drop[:, 0] = False
    return drop


def _top_p_drop_by_order(x: torch.Tensor, top_p: float) -> torch.Tensor:
    """`_top_p`'s dropped tokens [N, V] through one stable sort with indices, which maps each sorted
    position to its token."""
    sorted_x, order = torch.sort(x, dim=-1, descending=True, stable=True)
    drop_sorted = _dropped_positions(sorted_x, top_p)
    return torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)


def _top_p_drop_cpu(x: torch.Tensor, top_p: float) -> torch.Tensor:
    """`_top_p`'s dropped tokens [N, V] without sorting indices (torch's CPU index sort takes 3.6-4.1 ms
    for a 49K-token row, 7% of the embedded model's decode step; this takes 0.76 ms). The mass
    before each position needs only the sorted values, and any sort of a row gives the same values,
    so the same softmax and sums: numpy's vectorised value sort (0.14 ms) serves. When the dropped
    positions are a suffix (always, short of a one-ulp dip in the cumulative mass), the kept tokens
    are those above the last kept value and, of the tokens equal to it, as many as the count asks
    in vocabulary order: what the stable order keeps. Otherwise the stable order maps positions to
    tokens (`_top_p_drop_by_order`, whose bits this path gives in every case: tests/test_sampling.py)."""
    sorted_x = -torch.from_numpy(np.sort((-x).numpy(), axis=-1))  # [N, V] descending; negation is exact
    drop_sorted = _dropped_positions(sorted_x, top_p)
    if bool((drop_sorted[:, :-1] & ~drop_sorted[:, 1:]).any()) or bool(torch.isnan(sorted_x).any()):
        return _top_p_drop_by_order(x, top_p)
    count = (~drop_sorted).sum(dim=-1, keepdim=True)  # [N, 1] tokens kept, >= 1
    last = sorted_x.gather(-1, count - 1)  # [N, 1] the smallest kept logit
    above = x > last
    ties = x == last
    wanted = count - above.sum(dim=-1, keepdim=True)  # [N, 1] how many of the tied tokens stay
    return ~(above | (ties & (torch.cumsum(ties, dim=-1, dtype=torch.int32) <= wanted)))


def _eta(x: torch.Tensor, eta: float) -> torch.Tensor:
    """Eta-sampling (Hewitt et al. 2022): drop tokens below min(eta, sqrt(eta) * exp(-entropy))."""
    probs = torch.softmax(x, dim=-1)
    logp = torch.log_softmax(x, dim=-1)
    entropy = -(probs * torch.where(probs > 0, logp, 0.0)).sum(dim=-1, keepdim=True)  # [N, 1]
    threshold = torch.minimum(torch.full_like(entropy, eta), math.sqrt(eta) * torch.exp(-entropy))
    drop = probs < threshold
    drop &= x < x.max(dim=-1, keepdim=True).values  # never drop the most likely token
    return x.masked_fill(drop, -math.inf)


def probabilities(transformed: torch.Tensor) -> torch.Tensor:
    """Transformed logits [N, V] -> float64 probabilities [N, V]."""
    return torch.softmax(transformed.double(), dim=-1)


def uniforms(generator: torch.Generator | None, count: int) -> torch.Tensor:
    """The next `count` float64 uniforms of `generator` [count], on the CPU so that a seed means the
    same draws on every device. Drawing k at once yields (and consumes) exactly what k single draws
    would (tests/test_sampling.py holds torch to that), so AR's one-per-token draws and the walk's
    one-per-depth block are the same stream."""
    return torch.rand(count, generator=generator, dtype=torch.float64)


def draw_rows(transformed: torch.Tensor, cfg: SamplingConfig, u: torch.Tensor | None) -> torch.Tensor:
    """One token per row of transformed logits [N, V] -> [N] long on their device, without a host
    read: argmax if greedy, else inverse-CDF sampling of row i with the float64 uniform u[i]."""
    if cfg.greedy:
        return torch.argmax(transformed, dim=-1)
    assert u is not None  # (a uniform per row unless greedy)
    cdf = torch.cumsum(torch.softmax(transformed.double(), dim=-1), dim=-1)  # [N, V]
    # First index whose cdf exceeds u * total: zero-probability tokens can never be chosen.
    target = u.to(cdf.device, non_blocking=True)[:, None] * cdf[:, -1:]  # [N, 1]
    return torch.searchsorted(cdf, target, right=True)[:, 0].clamp_(max=cdf.shape[-1] - 1)


def draw(transformed: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None) -> int:
    """One token from one row of transformed logits [V] (one uniform from `generator` unless greedy)."""
    u = None if cfg.greedy else uniforms(generator, 1)
    return int(draw_rows(transformed[None], cfg, u)[0])
