"""A base model's answer to a fixed input, kept where a result must come from the very same weights.

The fingerprint (spec/heads.py: shapes and a corner of the embedding table) is what heads are checked against:
they stay lossless on any model of that shape. A fine-tune that keeps its base's embeddings has its base's
fingerprint, yet it writes other text and has other hidden states: the self-distill cache served it its base's
text, a training resume mixed the two models' hidden states, and bench resumed its base's results directory.
Its answer to a fixed input differs. So does that of one whose untied LM head alone was tuned, though its hidden
states are its base's: the answer holds some of the logits too (a checkpoint resumed on such a model went on with
another model's tokens, without a word; found by review)."""

from __future__ import annotations

from typing import Any

import torch

PROBE_TOKENS = 8  # fixed ids spread over the vocabulary
PROBE_LOGITS = 64  # logits kept after the hidden state: those of fixed ids spread over the vocabulary


def model_probe(model: Any) -> list[float]:
    """The final-normed hidden state [hidden] of the last of PROBE_TOKENS fixed tokens, then its logits of
    PROBE_LOGITS fixed ids, as float64 numbers."""
    ids = (torch.arange(PROBE_TOKENS) * 7919 + 11) % model.cfg.vocab_size
    positions = torch.arange(PROBE_TOKENS, device=model.device)
    with torch.no_grad():
        logits, hidden = model.forward(ids.to(model.device), positions, None, logits_rows=slice(-1, None))
        normed = model.norm(hidden[-1:], model.final_norm)[0]  # [hidden]
    picked = (torch.arange(PROBE_LOGITS) * 104_729 + 13) % model.cfg.vocab_size
    return normed.double().cpu().tolist() + logits[-1, picked.to(logits.device)].double().cpu().tolist()


def probe_tolerance(dtype: torch.dtype) -> float:
    """How far (relative L2) one model's probe may move on another device or thread count: the summation
    orders' rounding, ~1e-6 in float32, percents in bfloat16 and float16 after many layers."""
    return 1e-3 if dtype in (torch.float32, torch.float64) else 5e-2


def same_model(kept: Any, probe: list[float], dtype: torch.dtype) -> bool:
    """Whether a kept probe (from a cache entry or a checkpoint) is this model's `probe`, its hidden state and its
    logits each to the tolerance; a missing or damaged one is not. One kept before the logits were (the hidden
    state alone: session 69) is compared on the hidden state."""
    if not isinstance(kept, list) or len(kept) not in (len(probe), len(probe) - PROBE_LOGITS):
        return False
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in kept):
        return False
    a, b = torch.tensor(kept, dtype=torch.float64), torch.tensor(probe[: len(kept)], dtype=torch.float64)
    hidden = len(probe) - PROBE_LOGITS
    parts = [(a[:hidden], b[:hidden]), (a[hidden:], b[hidden:])]  # (the second is empty in an older probe)
    return bool(torch.isfinite(a).all()) and all(float((x - y).norm()) <= probe_tolerance(dtype) * float(y.norm())
                                                  for x, y in parts)
