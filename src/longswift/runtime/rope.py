"""Rotary position embeddings; frequencies come from transformers' own rope-init functions."""

from __future__ import annotations

import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from ..config import ModelConfig


class Rope:
    """cos/sin tables for given positions, for every rope type of ModelConfig.

    Dynamic NTK scaling depends on the sequence length: we recompute the frequencies for
    max(position) + 1, as transformers does when a sequence grows past the trained context. So a
    token decoded alone at position p is rotated with the frequencies of p + 1 tokens, and rows
    that AR would have decoded one by one (a tree's, a resumed run's output) must be too.
    """

    def __init__(self, cfg: ModelConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.scaling = 1.0
        self._dynamic_len = -1
        if cfg.rope_type == "default":
            base = cfg.hf_config.rope_parameters["rope_theta"]
            dim = cfg.head_dim
            self.inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
            if cfg.rope_freq_factors is not None:  # llama.cpp's rope_freqs: each frequency divided by its factor
                self.inv_freq = self.inv_freq / torch.tensor(cfg.rope_freq_factors, dtype=torch.float)
        else:
            self.inv_freq, self.scaling = ROPE_INIT_FUNCTIONS[cfg.rope_type](cfg.hf_config, device)
        self.inv_freq = self.inv_freq.to(device=device, dtype=torch.float)  # [D/2]
        self._original_inv_freq = self.inv_freq

    def _frequencies(self, max_position: int) -> torch.Tensor:
        if self.cfg.rope_type != "dynamic":
            return self.inv_freq
        seq_len = max(max_position + 1, self.cfg.max_position_embeddings)
        if seq_len == self.cfg.max_position_embeddings:
            return self._original_inv_freq
        if seq_len != self._dynamic_len:
            # transformers passes seq_len as an int64 tensor; doing the same keeps its float32 rounding.
            length = torch.tensor(seq_len, dtype=torch.long, device=self.device)
            inv, _ = ROPE_INIT_FUNCTIONS["dynamic"](self.cfg.hf_config, self.device, seq_len=length)
            self.inv_freq, self._dynamic_len = inv.to(torch.float), seq_len
        return self.inv_freq

    def _row_frequencies(self, positions: torch.Tensor) -> torch.Tensor:
        """Dynamic NTK: each row's frequencies as a decode step at its position computes them: [T, D/2]."""
        at: dict[int, torch.Tensor] = {}
        rows = positions.tolist()
        for p in rows:
            if p not in at:
                at[p] = self._frequencies(p)
        return torch.stack([at[p] for p in rows])

    def cos_sin(self, positions: torch.Tensor, max_position: int | None,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [T] long -> cos, signed sin: [T, 1, D] in `dtype` (broadcast over heads).
        The sine's first half is negated so that rotation is `x * cos + roll(x, D/2) * sin`.
        Dynamic NTK: every row gets the frequencies of max_position + 1 tokens (a prefill chunk, as in
        transformers), or, where max_position is None, each row those of its own position."""
        if max_position is None and self.cfg.rope_type == "dynamic":
            inv = self._row_frequencies(positions)  # [T, D/2]
        else:
            inv = self._frequencies(max_position or 0)[None, :]  # [1, D/2]
        freqs = positions[:, None].float() * inv  # [T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, D]
        cos = (emb.cos() * self.scaling).to(dtype)
        sin = (emb.sin() * self.scaling).to(dtype)
        half = sin.shape[-1] // 2
        sin[:, :half].neg_()
        return cos[:, None, :], sin[:, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, fused: bool = False) -> torch.Tensor:
    """x: [T, H, D]; rotates pairs (i, i + D/2), the layout of HF checkpoints:
    (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), with the sign folded into `signed_sin`.
    transformers' order: two products and their sum, each rounded (4 kernels on CUDA, the roll
    included). `fused`: the second product inside the sum (`addcmul`, rounded once; 3 kernels)."""
    rolled = torch.roll(x, x.shape[-1] // 2, dims=-1)
    if fused:
        return torch.addcmul(x * cos, rolled, signed_sin)
    return x * cos + rolled * signed_sin
