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
    if ACCURATE and g.dtype == tl.float32:  # torch's silu: x / (1 + exp(-x)), CUDA's expf and an IEEE division
        silu = tl.div_rn(g, 1.0 + libdevice.exp(-g))  # (div_rn takes float32 only; float64's `/` is IEEE)
    else:
        silu = g / (1.0 + tl.exp(-g))
    silu = silu.to(out.dtype.element_ty).to(ACC)  # F.silu's output, rounded as it is
    tl.store(out + t * INNER + c, (silu * u).to(out.dtype.element_ty), mask=inside)


# The reductions by their combine functions, which is how tl.max, tl.min, tl.sum and tl.cumsum reduce the 32- and
# 64-bit values the kernels reduce: every kernel here compiled for sm_90 to the same PTX either way (compared when
# one definition replaced a pair, interpreted and compiled). Triton's interpreter cannot call those four, jit
# functions of their own, when triton was imported before TRITON_INTERPRET was set (as in the tests: tl.cdiv and
# tl.zeros likewise, which the kernels avoid); their combine functions it computes in numpy.
@triton.jit
def _max(x, AXIS: tl.constexpr):
    return tl.reduce(x, AXIS, tl.standard._elementwise_max)


@triton.jit
def _min(x, AXIS: tl.constexpr):
    return tl.reduce(x, AXIS, tl.standard._elementwise_min)


@triton.jit
def _sum(x, AXIS: tl.constexpr):
    return tl.reduce(x, AXIS, tl.standard._sum_combine)


@triton.jit
def _cumsum(x, AXIS: tl.constexpr):
    return tl.associative_scan(x, AXIS, tl.standard._sum_combine)


@triton.jit
def _dot(a, b, ACC: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    # a @ b summed in ACC. IEEE: float32 products as float32 (not TF32). UPCAST: the operands in ACC first, for
    # Triton 3.9's interpreter, whose bfloat16 products are wrong (off by 1e10); exact, as a product of two
    # bfloat16 values is a float32 one.
    if UPCAST:
        return tl.dot(a.to(ACC), b.to(ACC), out_dtype=ACC, input_precision="ieee")
    elif IEEE:
        return tl.dot(a, b, out_dtype=ACC, input_precision="ieee")
    else:
        return tl.dot(a, b, out_dtype=ACC)


# Parts' counts change with the span a graph reads (and are 1 at short ones): not specialized on, so that a graph
# captured for a later span launches the kernel compiled when the body was first warmed up (no compile inside a
# capture).
@triton.jit(do_not_specialize=["splits"])
def attention_part_kernel(q, keys, values, used_at, tree, part_out, part_lse,
                          q_head, q_row, q_dim, k_head, k_slot, k_dim, v_head, v_slot, v_dim,
                          rows, new, splits, scale,
                          D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          ACC: tl.constexpr, ROUND_P: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    # One program per (KV head h, part s, block of BLOCK_M query rows). Parts 0 .. splits-1 cut the cached slots
    # [0, used) into equal runs of whole BLOCK_N tiles (used read from device memory, so a graph replays this at
    # any length); part `splits`, where `new` > 0, is the step's own slots [used, used + new) under the tree mask
    # (row r is token r % new of its group). Writes the part's softmax-weighted values and log-sum-exp over its
    # keys (out 0, lse -inf where it has none), which attention_merge_kernel merges.
    h = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    r = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] query rows
    d = tl.arange(0, BLOCK_D).to(tl.int64)  # (a CPU cache's keys have a dimension stride of its capacity)
    row_in = r < rows
    d_in = d < D
    used = tl.load(used_at).to(tl.int32)
    piece = ((used + splits - 1) // splits + BLOCK_N - 1) // BLOCK_N * BLOCK_N  # (not tl.cdiv: a jit function,
    # which Triton's interpreter cannot call when triton was imported before TRITON_INTERPRET was set)
    lo = s * piece
    hi = tl.minimum(lo + piece, used)
    if s == splits:  # the step's own entries
        lo = used
        hi = used + new
    qt = tl.load(q + h * q_head + r[:, None].to(tl.int64) * q_row + d[None, :] * q_dim,
                 mask=row_in[:, None] & d_in[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]
    token = r % tl.maximum(new, 1)
    m_i = tl.full([BLOCK_M], float("-inf"), ACC)
    l_i = tl.full([BLOCK_M], 0.0, ACC)
    acc = tl.full([BLOCK_M, BLOCK_D], 0.0, ACC)  # (tl.full, not tl.zeros: see piece)
    for start in range(lo, hi, BLOCK_N):
        c = start + tl.arange(0, BLOCK_N)  # [BLOCK_N] cache slots
        c_in = c < hi
        slot = c.to(tl.int64)
        kt = tl.load(keys + h * k_head + slot[None, :] * k_slot + d[:, None] * k_dim,
                     mask=c_in[None, :] & d_in[:, None], other=0.0)  # [BLOCK_D, BLOCK_N]
        vt = tl.load(values + h * v_head + slot[:, None] * v_slot + d[None, :] * v_dim,
                     mask=c_in[:, None] & d_in[None, :], other=0.0)  # [BLOCK_N, BLOCK_D]
        sc = _dot(qt, kt, ACC, IEEE, UPCAST) * scale  # [BLOCK_M, BLOCK_N]
        seen = c_in[None, :] & row_in[:, None]
        if s == splits:  # among the new entries, the tree mask: tree[token, slot - used]
            j = c - used
            seen = seen & (tl.load(tree + token[:, None] * new + j[None, :], mask=seen, other=0) != 0)
        sc = tl.where(seen, sc, float("-inf"))
        m_new = tl.maximum(m_i, _max(sc, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing seen yet keeps weight 0
        p = tl.exp(sc - m_safe[:, None])  # [BLOCK_M, BLOCK_N]
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + _sum(p, 1)
        if ROUND_P:  # as flash does: the weights in the values' dtype for the product, summed in ACC
            pv = p.to(values.dtype.element_ty)
        else:
            pv = p
        acc = acc * alpha[:, None] + _dot(pv, vt.to(pv.dtype), ACC, IEEE, UPCAST)
        m_i = m_new
    some = l_i > 0
    lse = tl.where(some, m_i + tl.log(tl.where(some, l_i, 1.0)), float("-inf"))
    out = acc / tl.where(some, l_i, 1.0)[:, None]
    at = (h * (splits + 1) + s) * rows + r.to(tl.int64)  # [BLOCK_M]: rows of part s of head h
    tl.store(part_lse + at, lse, mask=row_in)
    tl.store(part_out + at[:, None] * BLOCK_D + d[None, :], out, mask=row_in[:, None])


@triton.jit(do_not_specialize=["parts", "splits"])
def attention_merge_kernel(part_out, part_lse, out, out_head, out_row, rows, parts, splits,
                           D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr):
    # One program per (query row r, KV head h): the parts' outputs weighted by exp(lse_s - max lse), over their sum.
    # (Rows on the grid's first axis: its second and third take at most 65,535.)
    r = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    p = tl.arange(0, BLOCK_P)
    d = tl.arange(0, BLOCK_D)
    at = (h * (splits + 1) + p) * rows + r  # [BLOCK_P]
    lse = tl.load(part_lse + at, mask=p < parts, other=float("-inf"))
    top = _max(lse, 0)
    w = tl.exp(lse - tl.where(top == float("-inf"), 0.0, top))  # [BLOCK_P]: 0 for parts with no keys
    o = tl.load(part_out + at[:, None] * BLOCK_D + d[None, :], mask=(p < parts)[:, None], other=0.0)
    total = _sum(w, 0)
    merged = _sum(w[:, None] * o, 0) / tl.where(total > 0, total, 1.0)  # [BLOCK_D]
    tl.store(out + h * out_head + r * out_row + d, merged.to(out.dtype.element_ty), mask=d < D)


@triton.jit
def rms_norm_kernel(x, weight, out, x_row, eps, N: tl.constexpr, BLOCK: tl.constexpr, ONE_ROUNDING: tl.constexpr,
                    ACC: tl.constexpr, ACCURATE: tl.constexpr):
    # One program per row: out = x * rsqrt(mean(x^2) + eps) * weight, in ACC. ONE_ROUNDING: scaled by the weight
    # in ACC and rounded once (aten's fused RMSNorm; float32 and float64, where rounding to ACC is no rounding);
    # else transformers' order: the normalised row rounded to the dtype, then its product with the weight rounded.
    t = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    inside = c < N
    v = tl.load(x + t * x_row + c, mask=inside, other=0.0).to(ACC)
    if ACCURATE:  # an IEEE division and CUDA's rsqrt, as torch's kernels take them
        rstd = libdevice.rsqrt(tl.div_rn(_sum(v * v, 0), N) + eps)
    else:
        rstd = 1.0 / tl.sqrt(_sum(v * v, 0) / N + eps)
    w = tl.load(weight + c, mask=inside, other=0.0).to(ACC)
    if ONE_ROUNDING:
        y = v * rstd * w
    else:
        y = (v * rstd).to(out.dtype.element_ty).to(ACC) * w
    tl.store(out + t * N + c, y.to(out.dtype.element_ty), mask=inside)


# The decode step's draw (runtime.triton_sampling): the logits transform of runtime's sampling.transform without
# top-k, top-p and eta, then draw_rows' inverse-CDF draw, over a row of V logits cut into chunks of CHUNK, one
# program a chunk, and one program to pick. ACC: the logits' dtype (float32 or float64); params [4] in ACC: the
# penalty, its reciprocal, the temperature's reciprocal and min-p (CUDA divides a tensor by a number as a product
# with its reciprocal, which is what torch's transform computes there). ACCURATE: CUDA's exp and IEEE divisions.


@triton.jit
def _exp(x, ACCURATE: tl.constexpr):
    # CUDA's expf where ACCURATE (Triton's float32 exp is an approximate exp2); Triton's float64 exp is CUDA's
    if ACCURATE and x.dtype == tl.float32:
        return libdevice.exp(x)
    else:
        return tl.exp(x)


@triton.jit
def sample_prepare_kernel(logits, history, position_at, banned, params, scratch, part_max, part_arg,
                          vocab, window, n_banned,
                          CHUNK: tl.constexpr, WBLOCK: tl.constexpr, PENALTY: tl.constexpr, BAN: tl.constexpr,
                          SCALE: tl.constexpr, ACC: tl.constexpr):
    # Program c: the transformed logits of tokens [c CHUNK, (c + 1) CHUNK) (banned at -inf; those of the last
    # `window` history entries before the position penalized as apply_penalty does; scaled by 1 / temperature)
    # into scratch (unless no step changes them), and their maximum and its first token.
    c = tl.program_id(0)
    lo = c * CHUNK
    i = lo + tl.arange(0, CHUNK)
    inside = i < vocab
    x = tl.load(logits + i, mask=inside, other=float("-inf"))
    if PENALTY or BAN:
        tl.store(scratch + i, x, mask=inside)
        tl.debug_barrier()  # the program's own copy, before it overwrites tokens of its chunk
        if PENALTY:  # ids that occur twice are written twice with one value
            theta = tl.load(params)
            inv_theta = tl.load(params + 1)
            position = tl.load(position_at)
            for start in range(0, window, WBLOCK):
                j = start + tl.arange(0, WBLOCK)
                at = position - window + j
                ok = (j < window) & (at >= 0)
                ids = tl.load(history + at, mask=ok, other=-1)
                mine = ok & (ids >= lo) & (ids < lo + CHUNK) & (ids < vocab)
                v = tl.load(logits + ids, mask=mine, other=0.0)
                tl.store(scratch + ids, tl.where(v > 0, v * inv_theta, v * theta), mask=mine)
        if BAN:
            if PENALTY:
                tl.debug_barrier()  # a banned token in the window: its -inf after its penalized value, not before
            for start in range(0, n_banned, WBLOCK):
                j = start + tl.arange(0, WBLOCK)
                ids = tl.load(banned + j, mask=j < n_banned, other=-1)
                mine = (j < n_banned) & (ids >= lo) & (ids < lo + CHUNK) & (ids < vocab)
                tl.store(scratch + ids, tl.full([WBLOCK], float("-inf"), ACC), mask=mine)
        tl.debug_barrier()
        x = tl.load(scratch + i, mask=inside, other=float("-inf"))
    if SCALE:
        x = x * tl.load(params + 2)
        tl.store(scratch + i, x, mask=inside)
    top = _max(x, 0)
    tl.store(part_max + c, top)
    tl.store(part_arg + c, _min(tl.where(x == top, i, vocab), 0))


@triton.jit
def _div(a, b, ACCURATE: tl.constexpr):
    # An IEEE division where ACCURATE (Triton's float32 `/` is approximate; float64's is IEEE)
    if ACCURATE and a.dtype == tl.float32:
        return tl.div_rn(a, b)
    else:
        return a / b


@triton.jit
def _top(part_max, parts, P_BLOCK: tl.constexpr):
    # The row's maximum from the chunks' (every program reads them in one order: one value for all).
    p = tl.arange(0, P_BLOCK)
    return _max(tl.load(part_max + p, mask=p < parts, other=float("-inf")), 0)


@triton.jit
def _mass(part_sum, parts, P_BLOCK: tl.constexpr):
    p = tl.arange(0, P_BLOCK)
    return _sum(tl.load(part_sum + p, mask=p < parts, other=0.0), 0)


@triton.jit
def _weights(x, top, mass, params, MIN_P: tl.constexpr, ACCURATE: tl.constexpr):
    # The draw's weights exp(x - top) in float64, 0 for the tokens min-p drops: those whose softmax probability
    # exp(x - top) / mass (in x's dtype) is below min_p times the largest, 1 / mass (exp(0) = 1).
    w = _exp(x.to(tl.float64) - top.to(tl.float64), ACCURATE)
    if MIN_P:
        e = _exp(x - top, ACCURATE)
        one = tl.full([], 1.0, x.dtype)
        w = tl.where(_div(e, mass, ACCURATE) < tl.load(params + 3) * _div(one, mass, ACCURATE), 0.0, w)
    return w


@triton.jit
def sample_sums_kernel(source, part_max, part_sum, part_weight, params, vocab, parts,
                       CHUNK: tl.constexpr, P_BLOCK: tl.constexpr, WEIGHTS: tl.constexpr, MIN_P: tl.constexpr,
                       ACCURATE: tl.constexpr):
    # Program c, over the transformed logits of its chunk: WEIGHTS false, the softmax's sum of exp(x - top) in x's
    # dtype (min-p's); true, the sum of the draw's weights (float64), after part_sum's sums where MIN_P.
    c = tl.program_id(0)
    i = c * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(source + i, mask=i < vocab, other=float("-inf"))
    top = _top(part_max, parts, P_BLOCK)
    if WEIGHTS:
        mass = top  # (unread without MIN_P)
        if MIN_P:
            mass = _mass(part_sum, parts, P_BLOCK)
        tl.store(part_weight + c, _sum(_weights(x, top, mass, params, MIN_P, ACCURATE), 0))
    else:
        tl.store(part_sum + c, _sum(_exp(x - top, ACCURATE), 0))


@triton.jit
def sample_pick_kernel(source, part_max, part_arg, part_sum, part_weight, params, u_at, history, position_at,
                       token_out, vocab, parts,
                       CHUNK: tl.constexpr, P_BLOCK: tl.constexpr, GREEDY: tl.constexpr, MIN_P: tl.constexpr,
                       ACCURATE: tl.constexpr):
    # One program: the token, written to token_out and to the history at the position. Greedy: the first token
    # of the largest logit. Else the first token whose cumulative weight exceeds u times the total (draw_rows'
    # searchsorted): the first weighed chunk where the chunks' cumulative weights pass it, then the first weighed
    # token within it. Where rounding leaves the target unpassed (u within ulps of 1), the last weighed chunk or
    # token: never a token of weight 0 (banned, dropped by min-p).
    p = tl.arange(0, P_BLOCK)
    if GREEDY:
        tops = tl.load(part_max + p, mask=p < parts, other=float("-inf"))
        first = _min(tl.where(tops == _max(tops, 0), p, P_BLOCK), 0)
        # A row of NaNs matches no maximum, in its chunks or here: the last chunk's, clamped to a token (vocab - 1;
        # torch's argmax would give the first NaN), so that an embedding of it does not fail a device assert.
        first = tl.minimum(first, parts - 1)
        token = tl.minimum(tl.load(part_arg + first), vocab - 1)
    else:
        weights = tl.load(part_weight + p, mask=p < parts, other=0.0)  # [P_BLOCK] float64
        before = _cumsum(weights, 0)
        target = tl.load(u_at) * _sum(tl.where(p == parts - 1, before, 0.0), 0)  # u times the scan's own total
        weighed = weights > 0
        k = _min(tl.where((before > target) & weighed, p, P_BLOCK), 0)
        k = tl.maximum(tl.where(k < P_BLOCK, k, _max(tl.where(weighed, p, -1), 0)), 0)
        base = _sum(tl.where(p == k - 1, before, 0.0), 0)
        i = k * CHUNK + tl.arange(0, CHUNK)
        x = tl.load(source + i, mask=i < vocab, other=float("-inf"))
        top = _top(part_max, parts, P_BLOCK)
        mass = top
        if MIN_P:
            mass = _mass(part_sum, parts, P_BLOCK)
        w = _weights(x, top, mass, params, MIN_P, ACCURATE)  # (what sample_sums_kernel summed for the chunk)
        found = _min(tl.where((base + _cumsum(w, 0) > target) & (w > 0), i, vocab), 0)
        last = _max(tl.where(w > 0, i, 0), 0)
        token = tl.where(found < vocab, found, last).to(tl.int64)
    tl.store(token_out, token)
    tl.store(history + tl.load(position_at), token)
