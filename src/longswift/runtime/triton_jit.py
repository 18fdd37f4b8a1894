"""The Triton kernels themselves (runtime.triton_kernels wraps them, and imports this module only when they are
used: Triton is an optional dependency). Defined at module level, as every Triton version finds them.

Both compute in ACC (float32, float64 for float64 tensors) and round to the tensors' dtype where the eager ops
round. Launched without floating-point fusion (`enable_fp_fusion=False`), so a product and a sum stay two
roundings, as torch's separate kernels make them; the one fused multiply-add eager computes (addcmul's, which
the CUDA compiler contracts) is an explicit `tl.fma`. ACCURATE: CUDA's own exp and an IEEE division, as torch's
silu computes (libdevice); Triton's interpreter has neither and takes tl.exp and `/`."""

import triton
import triton.language as tl

try:
    from triton.language.extra import libdevice
except ImportError:  # (Triton before 3.0)
    libdevice = None


@triton.jit
def rope_store_kernel(qkv, cos, sin, slots, q_out, k_out, cache_k, cache_v,
                      qkv_row, k_head, k_slot, k_dim, v_head, v_slot, v_dim,
                      H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
                      FUSED: tl.constexpr, ACC: tl.constexpr):
    # One program per (row t, head j): j < H a query head, H <= j < H + HKV a key head, past that a value head.
    # Offsets in int64: a cache's head stride times its heads passes 2^31 elements at a few million slots.
    t = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1).to(tl.int64)
    i = tl.arange(0, BLOCK)
    inside = i < D
    src = qkv + t * qkv_row + j * D
    if j < H + HKV:
        x = tl.load(src + i, mask=inside).to(ACC)
        rolled = tl.load(src + (i + D // 2) % D, mask=inside).to(ACC)  # torch.roll by D/2: x[(i - D/2) mod D]
        c = tl.load(cos + t * D + i, mask=inside).to(ACC)
        s = tl.load(sin + t * D + i, mask=inside).to(ACC)  # the sine, its first half negated (Rope.cos_sin)
        first = (x * c).to(q_out.dtype.element_ty).to(ACC)
        if FUSED:  # addcmul: the second product inside the sum, one rounding (a fused multiply-add)
            y = tl.fma(rolled, s, first).to(q_out.dtype.element_ty)
        else:  # transformers: both products rounded, then their sum
            y = (first + (rolled * s).to(q_out.dtype.element_ty).to(ACC)).to(q_out.dtype.element_ty)
        if j < H:
            tl.store(q_out + (t * H + j) * D + i, y, mask=inside)
        else:
            tl.store(k_out + (t * HKV + (j - H)) * D + i, y, mask=inside)
            slot = tl.load(slots + t)
            tl.store(cache_k + (j - H) * k_head + slot * k_slot + i * k_dim, y, mask=inside)
    else:
        slot = tl.load(slots + t)
        tl.store(cache_v + (j - H - HKV) * v_head + slot * v_slot + i * v_dim, tl.load(src + i, mask=inside),
                 mask=inside)


@triton.jit
def silu_mul_kernel(gate_up, out, gate_up_row, INNER: tl.constexpr, BLOCK: tl.constexpr, ACC: tl.constexpr,
                    ACCURATE: tl.constexpr):
    # One program per (row t, block of BLOCK columns): out[t, c] = silu(gate[t, c]) * up[t, c]
    t = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = c < INNER
    g = tl.load(gate_up + t * gate_up_row + c, mask=inside).to(ACC)
    u = tl.load(gate_up + t * gate_up_row + INNER + c, mask=inside).to(ACC)
    if ACCURATE:  # torch's silu: x / (1 + exp(-x)), CUDA's expf and an IEEE division
        silu = tl.div_rn(g, 1.0 + libdevice.exp(-g))
    else:
        silu = g / (1.0 + tl.exp(-g))
    silu = silu.to(out.dtype.element_ty).to(ACC)  # F.silu's output, rounded as it is
    tl.store(out + t * INNER + c, (silu * u).to(out.dtype.element_ty), mask=inside)
