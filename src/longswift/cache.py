"""The full KV cache: preallocated once, written by index, compacted after verification."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .config import ModelConfig
from .errors import LongswiftError


class FullKVCache:
    """Per layer `[Hkv, capacity, D]` keys and values; slots `[0, length)` hold the context.

    A forward writes its T new entries at slots `[length, length + T)` and advances `length`.
    """

    def __init__(self, cfg: ModelConfig, capacity: int, dtype: torch.dtype, device: torch.device) -> None:
        if capacity <= 0:
            raise LongswiftError(f"KV cache capacity must be positive, got {capacity}")
        shape = (cfg.num_layers, cfg.num_kv_heads, capacity, cfg.head_dim)
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

    def compact(self, start: int, keep: Sequence[int] | torch.Tensor) -> None:
        """Keep slots `< start` as they are and, of the slots `>= start`, only `keep` (increasing),
        moved to `start, start + 1, ...`; the cache length becomes `start + len(keep)`."""
        keep_t = torch.as_tensor(keep, dtype=torch.long, device=self.k.device)  # [K]
        n = int(keep_t.numel())
        if n:
            lo, hi = int(keep_t.min()), int(keep_t.max())
            if lo < start or hi >= self.length or (n > 1 and not bool((keep_t[1:] > keep_t[:-1]).all())):
                raise ValueError(f"compact: keep must be increasing slots in [{start}, {self.length})")
            # index_select gathers into a new tensor first, so overlapping source/target is safe.
            self.k[:, :, start : start + n] = self.k.index_select(2, keep_t)
            self.v[:, :, start : start + n] = self.v.index_select(2, keep_t)
        self.length = start + n

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2
