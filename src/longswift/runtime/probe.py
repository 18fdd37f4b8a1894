"""A base model's answer to a fixed input, kept where a result must come from the very same weights.

The fingerprint (spec/heads.py: shapes and a corner of the embedding table) is what heads are checked against:
they stay lossless on any model of that shape. A fine-tune that keeps its base's embeddings has its base's
fingerprint, yet it writes other text and has other hidden states: the self-distill cache served it its base's
text, a training resume mixed the two models' hidden states, and bench resumed its base's results directory.
Its answer to a fixed input differs."""

from __future__ import annotations

from typing import Any

import torch

PROBE_TOKENS = 8  # fixed ids spread over the vocabulary


def model_probe(model: Any) -> list[float]:
    """The final-normed hidden state [hidden] of the last of PROBE_TOKENS fixed tokens, as float64 numbers."""
    ids = (torch.arange(PROBE_TOKENS) * 7919 + 11) % model.cfg.vocab_size
    positions = torch.arange(PROBE_TOKENS, device=model.device)
    with torch.no_grad():
        _, hidden = model.forward(ids.to(model.device), positions, None, logits_rows=slice(0, 0))  # [T, hidden]
        normed = model.norm(hidden[-1:], model.final_norm)[0]  # [hidden]
    return normed.double().cpu().tolist()


def probe_tolerance(dtype: torch.dtype) -> float:
    """How far (relative L2) one model's probe may move on another device or thread count: the summation
    orders' rounding, ~1e-6 in float32, percents in bfloat16 and float16 after many layers."""
    return 1e-3 if dtype in (torch.float32, torch.float64) else 5e-2


def same_model(kept: Any, probe: list[float], dtype: torch.dtype) -> bool:
    """Whether a kept probe (from a cache entry or a checkpoint) is this model's `probe`; a missing or damaged
    one is not."""
    if not isinstance(kept, list) or len(kept) != len(probe):
        return False
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in kept):
        return False
    a, b = torch.tensor(kept, dtype=torch.float64), torch.tensor(probe, dtype=torch.float64)
    return bool(torch.isfinite(a).all()) and float((a - b).norm()) <= probe_tolerance(dtype) * float(b.norm())
