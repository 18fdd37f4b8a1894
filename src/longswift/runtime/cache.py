"""The KV caches: the full cache (preallocated once, written by index, compacted after verification) and
the draft pass's partial cache (attention sinks, the entries the root's queries select, a recent window)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..config import ModelConfig
from ..errors import LongswiftError


def transposed_keys(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether caches on this device and dtype store their keys transposed, slots innermost (see FullKVCache): the
    CPU's, where a query's scores q @ K^T then read each key dimension's slots in a row, as the GEMM streams them
    (docs/benchmarks.md, session 41: one layer's decode attention at 4K-64K entries 1.6-1.7x faster in float32,
    1.3-1.4x in bfloat16; a decoding forward of the embedded model 1.17x at 4K and 1.47x at 32K; session 42, float16:
    1.16x at 2K, 1.26x at 4K, 1.38x at 8K). Not CUDA (its flash kernels take the keys by slot)."""
    return device.type == "cpu" and dtype.is_floating_point


class FullKVCache:
    """Per layer `[Hkv, capacity, D]` keys and values; slots `[0, length)` hold the context.

    A forward writes its T new entries at slots `[length, length + T)` and advances `length`.
    `k` is always indexed [L, Hkv, C, D]; where transposed_keys says so (default: by device and dtype) it is a
    view of keys stored [L, Hkv, D, C], so that `k[layer].transpose(1, 2)` is a plain row-major product operand.
    """

    def __init__(self, cfg: ModelConfig, capacity: int, dtype: torch.dtype, device: torch.device,
                 transposed: bool | None = None) -> None:
        if capacity <= 0:
            raise LongswiftError(f"KV cache capacity must be positive, got {capacity}")
        shape = (cfg.num_layers, cfg.num_kv_heads, capacity, cfg.head_dim)
        device = torch.device(device)
        self.transposed = transposed_keys(device, dtype) if transposed is None else transposed
        if self.transposed:  # stored [L, Hkv, D, C]; k is its [L, Hkv, C, D] view
            self.k = torch.zeros(shape[:2] + shape[:1:-1], dtype=dtype, device=device).transpose(2, 3)
        else:
            self.k = torch.zeros(shape, dtype=dtype, device=device)  # [L, Hkv, C, D]
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # [L, Hkv, C, D]
        self.capacity = capacity
        self.length = 0

    def reserve(self, n: int) -> int:
        """Check that n more entries fit and return the first slot they will occupy."""
        if self.length + n > self.capacity:
            raise LongswiftError(
                f"KV cache full: {self.length} + {n} entries exceed its capacity of {self.capacity}; "
                "plan a larger cache (more max_new_tokens)"
            )
        return self.length

    def truncate(self, length: int) -> None:
        """Forget every entry at slot >= length."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {length}")
        self.length = length

    def compact(self, start: int, keep: Sequence[int]) -> None:
        """Keep slots `< start` as they are and, of the slots `>= start`, only `keep` (increasing),
        moved to `start, start + 1, ...`; the cache length becomes `start + len(keep)`. `keep` is
        checked on the host, so that committing a step reads nothing back from a GPU."""
        keep = list(keep)
        n = len(keep)
        if not 0 <= start <= self.length:  # (with nothing kept, the length would pass the entries held, or go below 0)
            raise ValueError(f"compact: start {start} must lie in [0, {self.length}]")
        if n and (keep[0] < start or keep[-1] >= self.length or any(b <= a for a, b in zip(keep, keep[1:]))):
            raise ValueError(f"compact: keep must be increasing slots in [{start}, {self.length})")
        if keep != list(range(start, start + n)):  # else already in place (a root alone, a first-child chain)
            keep_t = torch.tensor(keep, dtype=torch.long).to(self.k.device, non_blocking=True)  # [K]
            # index_select gathers into a new tensor first, so overlapping source/target is safe.
            self.k[:, :, start : start + n] = self.k.index_select(2, keep_t)
            self.v[:, :, start : start + n] = self.v.index_select(2, keep_t)
        self.length = start + n

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2


class PartialKVCache(FullKVCache):
    """The draft pass's small cache (TokenSwift's partial KV cache): slots `[0, sinks)` hold the first positions,
    then `retrieved` positions chosen per layer and KV head by importance (the latest query's
    dot products with the keys), then a window of the most recent entries. When the window is
    full, the caller selects again from the full cache ("dynamic partial cache"), or keeps the
    selection and restarts the window (static, an ablation)."""

    def __init__(self, cfg: ModelConfig, budget: int, sinks: int, window: int,
                 dtype: torch.dtype, device: torch.device,
                 reduce_scores: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        if not (sinks >= 0 and window > 0 and budget > sinks + window):
            raise LongswiftError(
                f"draft KV budget {budget} must exceed sinks ({sinks}) + recent window ({window})"
            )
        super().__init__(cfg, budget + 1, dtype, device)  # +1: the root fed by the draft pass
        self.budget, self.sinks, self.window = budget, sinks, window
        self.retrieved = budget - sinks - window
        self.group = cfg.group_size
        self.window_start = 0
        self.selected = False
        self.positions: torch.Tensor | None = None  # [L, Hkv, sinks + retrieved] selected slots, for tests
        # Tensor parallel with replicated KV heads: each copy sees part of the query group, and
        # this sums the scores over the copies (see parallel.TensorParallel.kv_score_reduce).
        self.reduce_scores = reduce_scores

    @property
    def window_full(self) -> bool:
        return self.length - self.window_start >= self.window

    def slide_window(self, full: FullKVCache, start: int, stop: int) -> int:
        """Refill a full recent window with its newest half: the newest of its entries followed by full-cache
        slots [start, stop) that it missed (static partial cache: the sinks and retrieved entries stay, and the
        draft pass goes on seeing the text just before its root). Returns the first slot not copied."""
        keep = self.window // 2
        held = max(keep - max(stop - start, 0), 0)  # the window's own newest entries kept
        first = self.length - held
        # [window_start, +held) <- [first, length): first >= window_start + window - held >= window_start + held
        self.k[:, :, self.window_start : self.window_start + held] = self.k[:, :, first : self.length]
        self.v[:, :, self.window_start : self.window_start + held] = self.v[:, :, first : self.length]
        self.length = self.window_start + held
        return self.append(full, max(start, stop - keep), stop)

    def select(self, full: FullKVCache, queries: list[torch.Tensor]) -> None:
        """Refill from `full[:length]` with sinks + top-`retrieved` slots per layer and KV head.
        queries: per layer the latest query [H, D] (after rope)."""
        n, s, r = full.length, self.sinks, self.retrieved
        if n < s + r:
            raise ValueError(f"a partial cache of {s} + {r} entries needs a context of at least that many, got {n}")
        hkv, d = full.k.shape[1], full.k.shape[3]
        picked = []
        for layer, q in enumerate(queries):
            keys = full.k[layer, :, s:n]  # [Hkv, n - s, D]
            qg = q.view(hkv, self.group, d)  # [Hkv, G, D]
            scores = torch.bmm(qg, keys.transpose(1, 2)).sum(dim=1)  # [Hkv, n - s], summed over the group
            if self.reduce_scores is not None:
                scores = self.reduce_scores(scores)
            top = torch.topk(scores, r, dim=-1).indices.sort(dim=-1).values + s  # [Hkv, R] slots, in order
            index = top[:, :, None].expand(hkv, r, d)
            self.k[layer, :, s : s + r] = full.k[layer].gather(1, index)
            self.v[layer, :, s : s + r] = full.v[layer].gather(1, index)
            picked.append(top)
        self.k[:, :, :s] = full.k[:, :, :s]
        self.v[:, :, :s] = full.v[:, :, :s]
        sink_slots = torch.arange(s, device=full.k.device).expand(len(queries), hkv, s)
        self.positions = torch.cat([sink_slots, torch.stack(picked)], dim=-1)
        self.length = self.window_start = s + r
        self.selected = True

    def append(self, full: FullKVCache, start: int, stop: int) -> int:
        """Copy full-cache slots [start, stop) into the recent window, as many as fit; returns the first slot
        not copied (`stop` when all fit)."""
        room = self.budget - self.length
        stop = min(stop, start + room)
        n = stop - start
        if n > 0:
            self.k[:, :, self.length : self.length + n] = full.k[:, :, start:stop]
            self.v[:, :, self.length : self.length + n] = full.v[:, :, start:stop]
            self.length += n
        return max(stop, start)
