"""Triton kernels that fuse a decoder layer's small element-wise steps (opt-in: `triton_kernels`).

A CUDA decode step of an 8B model at 4K context is bound by the count of its kernels, not their
work (H200, session 51: of a 5.87 ms replayed step, 1.15 ms went to norms, element-wise kernels,
copies and the gaps between kernels). Two groups of those kernels have no one-op form in torch:

- `rope_store`: rope of the queries and keys (a roll, a product and a product-add: 3 kernels) and
  the two cache writes of the new keys and values (2 `index_copy_`), as one kernel that reads the
  q/k/v projection once and writes the rotated queries, the rotated keys, and the keys and values at
  their cache slots (given as a device tensor, so a CUDA graph replays it at any slot).
- `silu_mul`: SwiGLU's silu(gate) * up (2 kernels) as one.

Each kernel computes what the eager ops compute, in float32 (float64 for float64), rounding to the model's dtype where
they round: rope as `apply_rope` (transformers' order, or the product-add of `fused_rope`), SwiGLU
as silu rounded, then the product rounded. What can still differ is float32's last bit (Triton's
exp, its fused multiply-adds), so in a reduced dtype the outputs equal the eager ones to that dtype's
rounding, and in float32 to float32's: the tokens are AR's in distribution, not bit for bit, as with
every reduced-precision kernel choice (README, "What is exact where").

The kernels are built on first use (Triton is imported then). On a CPU they run only under Triton's
interpreter (TRITON_INTERPRET=1 before the first use), which is how the tests check them here."""

from __future__ import annotations

import functools
import os
from typing import Any

import torch


def triton_unavailable(device: torch.device) -> str | None:
    """Why the Triton kernels cannot run on `device` (None if they can): they need Triton and a CUDA
    device, or, on a CPU, Triton's interpreter."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "the Triton kernels need the triton package (pip install triton; CUDA builds of torch include it)"
    if device.type != "cuda" and not _interpreting():
        return f"the Triton kernels need a CUDA device (this model runs on {device})"
    return None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


@functools.cache
def _kernels(interpret: bool) -> dict[str, Any]:
    """The jitted kernels, built once per mode (Triton decides at decoration whether it interprets)."""
    del interpret  # the cache key: Triton reads TRITON_INTERPRET itself
    import triton
    import triton.language as tl

    @triton.jit
    def rope_store_kernel(qkv, cos, sin, slots, q_out, k_out, cache_k, cache_v,
                          qkv_row, k_head, k_slot, k_dim, v_head, v_slot, v_dim,
                          H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, FUSED: tl.constexpr,
                          ACC: tl.constexpr):
        # one program per (row t, head j): j < H a query head, H <= j < H + HKV a key head, past that a value head
        t = tl.program_id(0)
        j = tl.program_id(1)
        half: tl.constexpr = D // 2
        i = tl.arange(0, D)
        src = qkv + t * qkv_row + j * D
        if j < H + HKV:
            x = tl.load(src + i).to(ACC)
            rolled = tl.load(src + (i + half) % D).to(ACC)  # roll by D/2: x[(i - D/2) mod D]
            c = tl.load(cos + t * D + i).to(ACC)
            s = tl.load(sin + t * D + i).to(ACC)  # the sine, its first half negated (Rope.cos_sin)
            first = (x * c).to(q_out.dtype.element_ty).to(ACC)
            if FUSED:  # addcmul: the second product inside the sum, rounded once
                y = (first + rolled * s).to(q_out.dtype.element_ty)
            else:  # transformers: both products rounded, then their sum
                y = (first + (rolled * s).to(q_out.dtype.element_ty).to(ACC)).to(q_out.dtype.element_ty)
            if j < H:
                tl.store(q_out + (t * H + j) * D + i, y)
            else:
                tl.store(k_out + (t * HKV + (j - H)) * D + i, y)
                slot = tl.load(slots + t)
                tl.store(cache_k + (j - H) * k_head + slot * k_slot + i * k_dim, y)
        else:
            slot = tl.load(slots + t)
            tl.store(cache_v + (j - H - HKV) * v_head + slot * v_slot + i * v_dim, tl.load(src + i))

    @triton.jit
    def silu_mul_kernel(gate_up, out, gate_up_row, INNER: tl.constexpr, BLOCK: tl.constexpr, ACC: tl.constexpr):
        # one program per (row t, block of BLOCK columns): out[t, c] = silu(gate[t, c]) * up[t, c]
        t = tl.program_id(0)
        c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = c < INNER
        g = tl.load(gate_up + t * gate_up_row + c, mask=inside).to(ACC)
        u = tl.load(gate_up + t * gate_up_row + INNER + c, mask=inside).to(ACC)
        silu = (g / (1.0 + tl.exp(-g))).to(out.dtype.element_ty).to(ACC)  # F.silu, rounded as it is
        tl.store(out + t * INNER + c, (silu * u).to(out.dtype.element_ty), mask=inside)

    return {"rope_store": rope_store_kernel, "silu_mul": silu_mul_kernel, "cdiv": triton.cdiv}


def kernels() -> dict[str, Any]:
    return _kernels(_interpreting())


def _acc(dtype: torch.dtype) -> Any:
    """The Triton dtype a kernel computes in for tensors of `dtype`: float64's own, else float32."""
    import triton.language as tl
    return tl.float64 if dtype == torch.float64 else tl.float32


def rope_store(qkv: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, slots: torch.Tensor,
               cache_k: torch.Tensor, cache_v: torch.Tensor, heads: int, kv_heads: int,
               fused: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qkv [T, (H + 2 Hkv) D] (rows contiguous), cos and signed sin [T, 1, D] (Rope.cos_sin), slots
    [T] long on the device, cache_k / cache_v [Hkv, C, D] (a layer's cache, any strides: a CPU cache's
    keys are stored slots innermost)
    -> q [T, H, D], k [T, Hkv, D] rotated as apply_rope(.., fused) rotates them, and v [T, Hkv, D] (a
    view of qkv); writes k and v at cache_k[:, slots] and cache_v[:, slots]. One kernel."""
    t, width = qkv.shape
    d = cos.shape[-1]
    if width != (heads + 2 * kv_heads) * d or qkv.stride(1) != 1:
        raise ValueError(f"rope_store: qkv {tuple(qkv.shape)} is not [T, (H + 2 Hkv) D] with contiguous rows "
                         f"for H={heads}, Hkv={kv_heads}, D={d}")
    if d & (d - 1):
        raise ValueError(f"rope_store: head_dim {d} must be a power of two")
    q = torch.empty(t, heads, d, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty(t, kv_heads, d, dtype=qkv.dtype, device=qkv.device)
    if t:
        kernels()["rope_store"][(t, heads + 2 * kv_heads)](
            qkv, cos.contiguous(), signed_sin.contiguous(), slots, q, k, cache_k, cache_v,
            qkv.stride(0), *cache_k.stride(), *cache_v.stride(), H=heads, HKV=kv_heads, D=d, FUSED=fused,
            ACC=_acc(qkv.dtype))
    v = qkv[:, (heads + kv_heads) * d :].view(t, kv_heads, d)
    return q, k, v


def silu_mul(gate_up: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """gate_up [T, 2 I] (rows contiguous: the gate/up product) -> silu(gate) * up [T, I], rounded as
    `F.silu(gate) * up` rounds. One kernel."""
    t, width = gate_up.shape
    if width % 2 or gate_up.stride(1) != 1:
        raise ValueError(f"silu_mul: gate_up {tuple(gate_up.shape)} is not [T, 2 I] with contiguous rows")
    i = width // 2
    out = torch.empty(t, i, dtype=gate_up.dtype, device=gate_up.device)
    if t:
        k = kernels()
        k["silu_mul"][(t, k["cdiv"](i, block))](gate_up, out, gate_up.stride(0), INNER=i, BLOCK=block,
                                                ACC=_acc(gate_up.dtype))
    return out
