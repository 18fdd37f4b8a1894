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
from dataclasses import dataclass
from typing import Any

import torch


def triton_unavailable(device: torch.device) -> str | None:
    """Why the Triton kernels cannot run on `device` (None if they can): they need a CUDA device (or, on a CPU,
    Triton's interpreter) and the triton package."""
    if device.type != "cuda" and not interpreting():
        return f"the Triton kernels need a CUDA device (this model runs on {device})"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "the Triton kernels need the triton package (pip install triton; CUDA builds of torch include it)"
    return None


def interpreting() -> bool:
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
    return _kernels(interpreting())


def acc(dtype: torch.dtype) -> Any:
    """The Triton dtype a kernel computes in for tensors of `dtype`: float64's own, else float32."""
    import triton.language as tl

    return tl.float64 if dtype == torch.float64 else tl.float32


def accurate(k: Any) -> bool:
    """Whether the kernels of `k` (kernels()) take CUDA's own exp, rsqrt and IEEE divisions (libdevice): compiled, with
    a Triton that has libdevice; the interpreter has none and takes tl.exp and `/`."""
    return not interpreting() and k.libdevice is not None


def on(device: torch.device) -> Any:
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
        with on(qkv.device):
            kernels().rope_store_kernel[(t, heads + 2 * kv_heads)](
                qkv, cos.contiguous(), signed_sin.contiguous(), slots, q, k, cache_k, cache_v,
                qkv.stride(0), *cache_k.stride(), *cache_v.stride(), H=heads, HKV=kv_heads, D=d,
                BLOCK=1 << (d - 1).bit_length(), FUSED=fused, ACC=acc(qkv.dtype), enable_fp_fusion=False)
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
        with on(gate_up.device):
            k.silu_mul_kernel[(t, -(-i // block))](gate_up, out, gate_up.stride(0), INNER=i, BLOCK=block,
                                                   ACC=acc(gate_up.dtype), ACCURATE=accurate(k),
                                                   enable_fp_fusion=False)
    return out


def norm_fits(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `rms_norm` and `attention` run for a model on `device` in `dtype`: not float64 on CUDA (Triton
    passes a float argument, eps or the scale, as a float32 there, and its products take no float64), anything
    under the interpreter."""
    return triton_unavailable(device) is None and (interpreting() or dtype != torch.float64)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, one_rounding: bool) -> torch.Tensor:
    """x [T, N] (rows contiguous), weight [N] of x's dtype -> RMSNorm [T, N] in x's dtype, as runtime.model.rms_norm
    computes it: `one_rounding` (aten's fused RMSNorm, or float32/float64) scales by the weight before rounding,
    else the normalised row is rounded and then scaled. One kernel a call, one program a row."""
    t, n = x.shape
    if x.stride(1) != 1 or weight.shape != (n,) or weight.dtype != x.dtype:
        raise ValueError(f"rms_norm: x {tuple(x.shape)} with contiguous rows and a weight [{n}] of its dtype; got a "
                         f"weight {tuple(weight.shape)} in {weight.dtype}")
    out = torch.empty(t, n, dtype=x.dtype, device=x.device)
    if t:
        k = kernels()
        block = 1 << (n - 1).bit_length()
        with on(x.device):
            k.rms_norm_kernel[(t,)](x, weight.contiguous(), out, x.stride(0), eps, N=n, BLOCK=block,
                                    ONE_ROUNDING=one_rounding, ACC=acc(x.dtype),
                                    ACCURATE=accurate(k),
                                    num_warps=max(1, min(16, block // 256)), enable_fp_fusion=False)
    return out


@dataclass(frozen=True)
class AttentionTiles:
    """How the attention's first kernel is compiled (untuned: no GPU was at hand when it was written;
    docs/scripts/triton_attention_ab.py `tune` times the choices). Query rows go in blocks of up to `max_block_m`
    (all of a KV head's rows in one block up to 128: a 32-node verify pass of a 4-query-head group is 128 rows,
    so each key is read once), keys `block_n` at a time; `warps`: None for `default_warps`; `stages`: Triton's
    software pipelining depth (None: its default; 1 crashed Triton 3.9's compiler in float32)."""

    block_n: int = 64
    warps: int | None = None
    stages: int | None = None
    max_block_m: int = 128

    def __post_init__(self) -> None:
        for name in ("block_n", "max_block_m"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"AttentionTiles.{name} must be a power of two of at least 16; got {value}")


# bfloat16 and float16: 128 rows and 64 keys a block, the keys' and values' loads pipelined 2 deep, take 72 KB of
# shared memory on Ampere and Ada and 104 KB on Hopper (Triton 3.9, compiled for sm_80, sm_86 and sm_90 on the CPU:
# tests/test_triton_kernels.py), within every such GPU's (99 KB on sm_86/sm_89); Triton's default of 3 took 104 KB
# and 136 KB. Deeper pipelines are for `tune` to weigh on a GPU.
DEFAULT_TILES = AttentionTiles(stages=2)
# float32's operands take twice the bytes: 64 rows and 32 keys a block in 2 stages (72 KB), on 8 warps
# (default_warps).
FLOAT32_TILES = AttentionTiles(block_n=32, stages=2, max_block_m=64)
ATTENTION_MAX_BLOCK_M = 128
# Programs the cached keys are split among, per streaming multiprocessor (the merge weighs the parts).
PROGRAMS_PER_SM = 2
# The fewest keys a part reads.
PART_MIN_KEYS = 256
# The merge's parts a program reads at once, and one more than attention_parts gives: one compiled merge serves
# every span, so a graph captured for a later span compiles nothing (a caller's larger count compiles another).
MERGE_BLOCK_P = 64


# The widest heads `attention` takes: a block of 128 rows of wider heads, pipelined, may pass a multiprocessor's
# shared memory (and float32's [128, 256] sums its registers); wider heads keep flash's kernels.
ATTENTION_MAX_HEAD_DIM = 128


def attention_fits(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether `attention` runs for a model on `device` in `dtype` with heads `head_dim` wide: where `norm_fits`,
    with heads up to ATTENTION_MAX_HEAD_DIM wide."""
    return head_dim <= ATTENTION_MAX_HEAD_DIM and norm_fits(device, dtype)


@functools.cache
def _processors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def attention_parts(device: torch.device, kv_heads: int, rows: int, span: int,
                    max_block_m: int = ATTENTION_MAX_BLOCK_M) -> int:
    """How many parts `attention` splits a span of cached keys into: enough programs for PROGRAMS_PER_SM on each
    of the device's multiprocessors (a CPU under the interpreter: 2 parts), each reading at least PART_MIN_KEYS
    keys, at most MERGE_BLOCK_P - 1. Fixed for a span, so a CUDA graph keeps its grid; the keys in use are
    divided among the parts on the device. `max_block_m`: the rows a program takes at most, as the launch's tiles
    say (float32's 64: counted at 128, its blocks were twice the programs planned; found by review)."""
    blocks = -(-rows // _block_m(rows, max_block_m))
    programs = PROGRAMS_PER_SM * _processors(device.index or 0) if device.type == "cuda" else 2
    return max(1, min(-(-programs // (kv_heads * blocks)), -(-span // PART_MIN_KEYS), MERGE_BLOCK_P - 1))


def _block_m(rows: int, most: int = ATTENTION_MAX_BLOCK_M) -> int:
    return min(most, max(16, 1 << (rows - 1).bit_length()))


def default_warps(dtype: torch.dtype, block_m: int) -> int:
    """The warps a program of the attention's first kernel runs on when its tiles do not say: 8 for blocks of
    128 rows in half precision, and of 32+ rows in float32 or float64, else 4. Each thread holds its share of the
    block's sums and product tiles in registers: ptxas (Triton 3.9, compiled here for sm_80 and sm_90) reported a
    float32 block of 64 rows on 4 warps spilling ~16 KB a thread to local memory, and 255 registers with 40 bytes
    spilled for 32 rows on sm_80; on 8 warps neither spills (tests/test_triton_kernels.py). Half precision's
    blocks spill on neither count."""
    wide = 64 if dtype in (torch.float16, torch.bfloat16) else 16
    return 8 if block_m > wide else 4


def default_tiles(dtype: torch.dtype) -> AttentionTiles:
    return FLOAT32_TILES if dtype in (torch.float32, torch.float64) else DEFAULT_TILES


def part_launch(dtype: torch.dtype, rows: int, head_dim: int, tiles: AttentionTiles | None = None,
                interpreting: bool = False) -> tuple[int, dict[str, Any]]:
    """The attention's first kernel for queries of `dtype`, `rows` a KV head, heads of `head_dim`: its block of
    rows, and its constexprs and compile options (what `attention` launches, and what the tests compile for a GPU
    here)."""
    tiles = tiles or default_tiles(dtype)
    block_m = _block_m(rows, tiles.max_block_m)
    params: dict[str, Any] = {
        "D": head_dim, "BLOCK_D": max(16, 1 << (head_dim - 1).bit_length()), "BLOCK_M": block_m,
        "BLOCK_N": tiles.block_n, "ACC": acc(dtype), "ROUND_P": dtype in (torch.float16, torch.bfloat16),
        "IEEE": dtype == torch.float32, "UPCAST": interpreting and dtype == torch.bfloat16,
        "num_warps": tiles.warps or default_warps(dtype, block_m),
        "enable_fp_fusion": True}  # (its sums are not eager's anyway; said, as Triton 3.9 warns where it is not)
    if tiles.stages is not None:
        params["num_stages"] = tiles.stages
    return block_m, params


def attention(qg: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, used: torch.Tensor, scale: float,
              tree: torch.Tensor | None = None, parts: int = 1, tiles: AttentionTiles | None = None) -> torch.Tensor:
    """Attention of every query row over a layer's cached slots [0, used) and, with `tree`, the step's own N
    slots [used, used + N) under the tree mask, in two kernels: the slots in use split into `parts` runs
    (attention_parts) plus the new ones, each attended with its log-sum-exp, then merged by them.
    qg [Hkv, R, D] (R = G*N, row g*N + t), keys/values: the layer's cache [Hkv, C, D] (any strides; the new
    entries already written), used: [1] integer on the device (the step's first slot; a decoding token's key
    is among them: used = its slot + 1, no tree), tree: [N, N] bool or int8 (a body converts its mask once for
    all layers) -> [Hkv, R, D] in q's dtype; a row that sees no key (none used, no tree) gets zeros.
    Computes in float32 (float64 for float64), with the weights rounded to the values' dtype for their product
    with the values as flash attention rounds them (float16 and bfloat16)."""
    hkv, rows, d = qg.shape
    new = 0 if tree is None else tree.shape[0]
    if (keys.shape[0] != hkv or keys.shape[2] != d or values.shape != keys.shape or rows == 0
            or (new and tree is not None and (rows % new or tree.shape != (new, new)))):
        raise ValueError(f"attention: queries {tuple(qg.shape)} do not fit keys {tuple(keys.shape)}"
                         + (f" and a tree of {tuple(tree.shape)}" if tree is not None else ""))
    if keys.dtype != qg.dtype or values.dtype != qg.dtype:
        raise ValueError(f"attention: queries in {qg.dtype}, keys in {keys.dtype}, values in {values.dtype}: "
                         "give them one dtype")
    sums = torch.float64 if qg.dtype == torch.float64 else torch.float32
    block_m, params = part_launch(qg.dtype, rows, d, tiles, interpreting())
    block_d = params["BLOCK_D"]
    part_out = torch.empty(hkv, parts + 1, rows, block_d, dtype=sums, device=qg.device)
    part_lse = torch.empty(hkv, parts + 1, rows, dtype=sums, device=qg.device)
    out = torch.empty(hkv, rows, d, dtype=qg.dtype, device=qg.device)
    tree_i8 = used if tree is None else tree.to(torch.int8).contiguous()  # (used: unread; a body's own: a no-op)
    k = kernels()
    launched = parts + (1 if new else 0)
    with on(qg.device):
        k.attention_part_kernel[(hkv, launched, -(-rows // block_m))](
            qg, keys, values, used, tree_i8, part_out, part_lse, *qg.stride(), *keys.stride(), *values.stride(),
            rows, new, parts, scale, **params)
        k.attention_merge_kernel[(rows, hkv)](part_out, part_lse, out, out.stride(0), out.stride(1), rows, launched,
                                              parts, D=d, BLOCK_D=block_d,
                                              BLOCK_P=max(MERGE_BLOCK_P, 1 << (launched - 1).bit_length()),
                                              enable_fp_fusion=True)
    return out
