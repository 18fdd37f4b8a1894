"""Linear layers for the runner: plain `F.linear` on the state dict's tensors, or oneDNN-packed
copies on CPU (2-3x faster for the 1-40 row products of decoding and verification).

Packing wraps the model code rather than forking it: the state dict is untouched, and a packed
layer computes the same product (to float rounding) as `F.linear` on the original weights."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

LinearFn = Callable[[torch.Tensor], torch.Tensor]


def packing_supported(dtype: torch.dtype, device: torch.device) -> bool:
    """oneDNN packed linears exist for float32/bfloat16 on CPU builds with MKLDNN."""
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        return False
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        w = torch.ops.mkldnn._reorder_linear_weight(torch.ones(2, 2, dtype=dtype))
        torch.ops.mkldnn._linear_pointwise(torch.ones(1, 2, dtype=dtype), w, None, "none", [], "")
    except (RuntimeError, AttributeError):
        return False
    return True


def make_linear(weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor | None], pack: bool) -> LinearFn:
    """One linear map whose output is the concatenation of `x @ w.T + b` over the given weights.

    Packed: the weights are concatenated and packed once (a copy). Unpacked: one `F.linear` per
    weight on the tensors themselves (no copy), concatenated only if there are several."""
    if pack:
        w = weights[0] if len(weights) == 1 else torch.cat(list(weights), dim=0)
        packed = torch.ops.mkldnn._reorder_linear_weight(w.contiguous())
        bias = None
        if any(b is not None for b in biases):
            bias = torch.cat([b if b is not None else w.new_zeros(wi.shape[0]) for wi, b in zip(weights, biases)])
        op = torch.ops.mkldnn._linear_pointwise

        def packed_linear(x: torch.Tensor) -> torch.Tensor:
            return op(x.contiguous(), packed, bias, "none", [], "")

        return packed_linear
    if len(weights) == 1:
        w0, b0 = weights[0], biases[0]
        return lambda x: F.linear(x, w0, b0)
    pairs = list(zip(weights, biases))
    return lambda x: torch.cat([F.linear(x, w, b) for w, b in pairs], dim=-1)


def float32_head(weight: torch.Tensor, pack: bool) -> LinearFn:
    """An LM head for a reduced-precision (bfloat16/float16) model whose logits are not rounded to
    that dtype: `x @ weight.T` of the model's [T, hidden] inputs with float32 sums and a float32
    [T, V] result. CUDA computes it from the weight in place (a matmul with a float32 output);
    elsewhere, or where that op is missing, from a float32 copy of the weight (exact: every bf16/fp16
    value is a float32 value), oneDNN-packed if `pack` and supported."""
    if weight.device.type == "cuda":
        try:
            torch.mm(weight[:1], weight[:1].t(), out_dtype=torch.float32)
            return lambda x: torch.mm(x, weight.t(), out_dtype=torch.float32)
        except (RuntimeError, TypeError, NotImplementedError):
            pass
    w32 = weight.float()
    linear = make_linear([w32], [None], pack and packing_supported(torch.float32, weight.device))
    return lambda x: linear(x.float())
