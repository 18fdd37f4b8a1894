"""Triton kernels that fuse a decoder layer's small element-wise steps (opt-in: `triton_kernels`).

A CUDA decode step of an 8B model at 4K context is bound by the count of its kernels, not their
work (H200, session 51: of a 5.87 ms replayed step, 1.15 ms went to norms, element-wise kernels,
copies and the gaps between kernels). Two groups of those kernels have no one-op form in torch:

- `rope_store`: rope of the queries and keys (a roll, a product and a product-add: 3 kernels) and
  the two cache writes of the new keys and values (2 `index_copy_`), as one kernel that reads the
  q/k/v projection once and writes the rotated queries, the rotated keys, and the keys and values at
  their cache slots (given as a device tensor, so a CUDA graph replays it at any slot).
- `silu_mul`: SwiGLU's silu(gate) * up (2 kernels) as one.

Each kernel computes what the eager ops compute, in float32 (float64 for float64), rounding to the model's
dtype where they round: rope as `apply_rope` (transformers' order, or the product-add of `fused_rope`),
SwiGLU as silu rounded, then the product rounded; without floating-point fusion, with CUDA's exp and an
IEEE division as torch's silu (runtime.triton_jit). What may still differ is how each compiler contracts or
orders a sum, so the outputs are held to the eager ones within one unit in the last place, most of them
equal (tests/test_cuda.py), and the tokens are AR's in distribution, not bit for bit (README).

The kernels are built on first use (Triton is imported then). On a CPU they run only under Triton's
interpreter (TRITON_INTERPRET=1 before the first use), which is how the tests check them here."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
from typing import Any

import torch


def triton_unavailable(device: torch.device) -> str | None:
    """Why the Triton kernels cannot run on `device` (None if they can): they need a CUDA device (or, on a CPU,
    Triton's interpreter) and the triton package."""
    if device.type != "cuda" and not _interpreting():
        return f"the Triton kernels need a CUDA device (this model runs on {device})"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "the Triton kernels need the triton package (pip install triton; CUDA builds of torch include it)"
    return None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


@functools.cache
def _kernels(interpret: bool) -> Any:
    """runtime.triton_jit, loaded as a module of its own for each mode (Triton decides at decoration whether it
    interprets: a GPU run of the whole test suite compiles them for the device and interprets them for the CPU
    tests)."""
    del interpret  # the cache key: Triton reads TRITON_INTERPRET itself
    spec = importlib.util.find_spec(f"{__package__}.triton_jit")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kernels() -> Any:
    return _kernels(_interpreting())


def _acc(dtype: torch.dtype) -> Any:
    """The Triton dtype a kernel computes in for tensors of `dtype`: float64's own, else float32."""
    import triton.language as tl

    return tl.float64 if dtype == torch.float64 else tl.float32


def _on(device: torch.device) -> Any:
    """Where a launch goes: Triton launches on the current CUDA device, which need not be the tensors' (a model on
    cuda:1 while cuda:0 is current)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def rope_store(qkv: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, slots: torch.Tensor,
               cache_k: torch.Tensor, cache_v: torch.Tensor, heads: int, kv_heads: int,
               fused: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qkv [T, (H + 2 Hkv) D] (rows contiguous), cos and signed sin [T, 1, D] (Rope.cos_sin), slots
    [T] long on the device, cache_k / cache_v [Hkv, C, D] (a layer's cache, any strides: a CPU cache's
    keys are stored slots innermost) -> q [T, H, D], k [T, Hkv, D] rotated as apply_rope(.., fused) rotates
    them, and v [T, Hkv, D] (a view of qkv); writes k and v at cache_k[:, slots] and cache_v[:, slots]. One
    kernel."""
    t, width = qkv.shape
    d = cos.shape[-1]
    if width != (heads + 2 * kv_heads) * d or qkv.stride(1) != 1 or d % 2:
        raise ValueError(f"rope_store: qkv {tuple(qkv.shape)} is not [T, (H + 2 Hkv) D] with contiguous rows "
                         f"for H={heads}, Hkv={kv_heads}, an even D={d}")
    q = torch.empty(t, heads, d, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty(t, kv_heads, d, dtype=qkv.dtype, device=qkv.device)
    if t:
        with _on(qkv.device):
            kernels().rope_store_kernel[(t, heads + 2 * kv_heads)](
                qkv, cos.contiguous(), signed_sin.contiguous(), slots, q, k, cache_k, cache_v,
                qkv.stride(0), *cache_k.stride(), *cache_v.stride(), H=heads, HKV=kv_heads, D=d,
                BLOCK=1 << (d - 1).bit_length(), FUSED=fused, ACC=_acc(qkv.dtype), enable_fp_fusion=False)
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
        accurate = not _interpreting() and k.libdevice is not None
        with _on(gate_up.device):
            k.silu_mul_kernel[(t, -(-i // block))](gate_up, out, gate_up.stride(0), INNER=i, BLOCK=block,
                                                   ACC=_acc(gate_up.dtype), ACCURATE=accurate,
                                                   enable_fp_fusion=False)
    return out
