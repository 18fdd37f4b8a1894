"""Linear layers for the runner: plain `F.linear` on the state dict's tensors, or oneDNN-packed
copies on CPU (2-3x faster for the 1-40 row products of decoding and verification).

Packing wraps the model code rather than forking it: a packed layer computes the same product (to
float rounding) as `F.linear` on the original weights, and its PackedWeights give those weights
back exactly (packing only reorders the values), so the model need not keep them.

Where packing does not exist (CUDA), a layer's q/k/v weights and its gate/up weights can instead
be stored as row blocks of one matrix each (`colocate`: a model the runner loaded itself, no extra
memory): `make_linear` then runs them as one product over a view of that matrix, one kernel where
there were three (or two) and a concatenation."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

LinearFn = Callable[[torch.Tensor], torch.Tensor]
ResidualFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x, residual) -> residual + linear(x)


@functools.cache
def onednn_computes(dtype: torch.dtype) -> bool:
    """Whether this CPU's oneDNN computes linear products in `dtype`: bfloat16 and float16 need AVX-512 (or
    AVX-NE-CONVERT); without them torch emulates those dtypes, far slower than float32 (half_precision_note)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        w = torch.ops.mkldnn._reorder_linear_weight(torch.ones(2, 2, dtype=dtype))
        torch.ops.mkldnn._linear_pointwise(torch.ones(1, 2, dtype=dtype), w, None, "none", [], "")
    except (RuntimeError, AttributeError):
        return False
    return True


def bfloat16_products_native() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX). Without, oneDNN still runs bfloat16
    products on AVX-512 (onednn_computes) by converting to float32: that pays where a product reads one row (half
    the weight bytes), not for many rows: the embedded model's LM head took 0.6-0.8x float32's time over one row,
    2.4-2.9x over 32 and 2.6-3.4x over 1,024 (session 59, a Xeon with AVX-512 and no BF16,
    docs/scripts/bf16_head_rows.py)."""
    return any(getattr(torch.cpu, name, lambda: False)() for name in ("_is_avx512_bf16_supported",
                                                                       "_is_amx_tile_supported"))


def packing_supported(dtype: torch.dtype, device: torch.device) -> bool:
    """oneDNN packed linears exist for float32/bfloat16 on CPU builds with MKLDNN (bfloat16 where this CPU's
    oneDNN computes it)."""
    return device.type == "cpu" and dtype in (torch.float32, torch.bfloat16) and onednn_computes(dtype)


def half_precision_note(dtype: torch.dtype, device: torch.device) -> str | None:
    """What to tell someone who runs bfloat16 or float16 on a CPU that only emulates it (None elsewhere): on an
    AVX2-only AMD EPYC a bfloat16 run of the embedded model read a 2,260-token prompt in 55.9 s against float32's
    10.9 s and decoded at 6.8 tok/s against 14.9 (session 48)."""
    if device.type != "cpu" or dtype not in (torch.bfloat16, torch.float16):
        return None
    if onednn_computes(dtype):
        if dtype != torch.bfloat16 or bfloat16_products_native():
            return None
        return ("this CPU has no bfloat16 arithmetic (AVX512-BF16 or AMX): oneDNN converts to float32, so a one-row "
                "product reads half the bytes and runs faster than float32's, but a product of many rows (a prompt's "
                "prefill, a verify pass) runs 2.4-3.4x slower; --dtype float32 may run faster here")
    name = str(dtype).removeprefix("torch.")
    return (f"this CPU has no native {name} arithmetic (AVX-512 or AVX-NE-CONVERT): torch emulates it, several "
            "times slower than float32 (on an AVX2 AMD EPYC a 2K-token prompt 5x, decoding 2x); --dtype float32 runs "
            "faster here")


@dataclass(frozen=True, eq=False)
class PackedWeights:
    """The oneDNN-packed copy of weights stacked by rows, which a packed linear map reads."""

    weight: torch.Tensor  # [sum out_i, in], oneDNN's blocked layout (torch._mkldnn)
    rows: tuple[int, ...]  # out_i of each weight it was made from

    def unpacked(self) -> tuple[torch.Tensor, ...]:
        """The weights it was made from, as new plain [out_i, in] tensors: the same values, bit for
        bit (the layout is reordered back; nothing is computed)."""
        return self.weight.to_dense().split(self.rows)


def packed_linear(weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor | None]) -> tuple[LinearFn, PackedWeights]:
    """make_linear(..., pack=True) and the packed copy it reads: the weights concatenated and
    packed once, which holds their values (the caller may let the originals go)."""
    w = weights[0] if len(weights) == 1 else torch.cat(list(weights), dim=0)
    packed = PackedWeights(torch.ops.mkldnn._reorder_linear_weight(w.contiguous()), tuple(int(x.shape[0]) for x in weights))
    weight, bias = packed.weight, joined_bias(weights, biases)
    op = torch.ops.mkldnn._linear_pointwise

    def linear(x: torch.Tensor) -> torch.Tensor:  # a closure: ~0.5 us a call less than a dataclass's __call__
        return op(x.contiguous(), weight, bias, "none", [], "")

    return linear, packed


def make_linear(weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor | None], pack: bool) -> LinearFn:
    """One linear map whose output is the concatenation of `x @ w.T + b` over the given weights.

    Packed: see packed_linear (a copy). Unpacked: one `F.linear` per weight on the tensors
    themselves (no copy), concatenated only if there are several."""
    if pack:
        return packed_linear(weights, biases)[0]
    if len(weights) == 1:
        w0, b0 = weights[0], biases[0]
        return lambda x: F.linear(x, w0, b0)
    whole = row_blocks(weights)
    if whole is not None:  # colocated: one product over the matrix they are blocks of (no copy)
        bias = joined_bias(weights, biases)
        return lambda x: F.linear(x, whole, bias)
    pairs = list(zip(weights, biases))
    return lambda x: torch.cat([F.linear(x, w, b) for w, b in pairs], dim=-1)


def joined_bias(weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor | None]) -> torch.Tensor | None:
    """The biases of one map over concatenated weights, zeros where a weight has none (None if none
    has one); small, so concatenated once."""
    if all(b is None for b in biases):
        return None
    return torch.cat([b if b is not None else w.new_zeros(w.shape[0]) for w, b in zip(weights, biases)])


def add_to_residual(linear: LinearFn, weight: torch.Tensor, bias: torch.Tensor | None, fused: bool) -> ResidualFn:
    """(x [T, in], residual [T, out]) -> residual + x @ weight.T (+ bias). `fused` (and no bias): one
    product whose epilogue adds into the residual in place (`addmm_`: one GEMM with beta 1 on CUDA
    instead of a GEMM and an add, the sum rounded once; out of place, addmm would first copy the
    residual), so the residual must be the caller's own tensor; else `linear` and an add."""
    if fused and bias is None:
        wt = weight.t()
        return lambda x, residual: residual.addmm_(x, wt)
    return lambda x, residual: residual + linear(x)


def row_blocks(weights: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The [out_i, in] weights as one [sum out_i, in] matrix without a copy, when they are
    consecutive row blocks of one storage (as `colocate` leaves them); else None."""
    first = weights[0]
    offset = first.storage_offset()
    for w in weights:
        if (w.dim() != 2 or not w.is_contiguous() or w.shape[1] != first.shape[1] or w.dtype != first.dtype
                or w.untyped_storage().data_ptr() != first.untyped_storage().data_ptr() or w.storage_offset() != offset):
            return None
        offset += w.numel()
    return first.as_strided((sum(w.shape[0] for w in weights), first.shape[1]), (first.shape[1], 1))


def colocate(state: dict[str, torch.Tensor], names: Sequence[str]) -> None:
    """Store the named [out_i, in] weights as consecutive row blocks of one new matrix and point
    the state's entries at them (views: the old tensors are freed once nothing else holds them, so
    a loaded model's weights take no more memory than before). Already colocated: nothing to do."""
    parts = [state[name] for name in names]
    if row_blocks(parts) is not None:
        return
    whole = torch.cat(parts)  # [sum out_i, in]
    start = 0
    for name, part in zip(names, parts):
        state[name] = whole[start : start + part.shape[0]]
        start += part.shape[0]


def float32_head_copy(float32_logits: bool, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the LM head runs on a float32 copy of its weight (float32_head: a bfloat16/float16 model's
    --float32-logits off CUDA), which the memory plan holds and each step reads."""
    return float32_logits and dtype in (torch.bfloat16, torch.float16) and device.type != "cuda"


def float32_head_packed(float32_logits: bool, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether that float32 copy is also packed (float32_head, where packing float32 exists): made from a float32
    copy of the weight, which lives while it is (the memory plan's loading_bytes)."""
    return float32_head_copy(float32_logits, dtype, device) and packing_supported(torch.float32, device)


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
