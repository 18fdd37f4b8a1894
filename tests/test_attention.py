"""Every attention path equals explicit attention (float64, GQA) for decoding, tree verification
and prefill chunks, at sizes around each kernel threshold; the cascade's log-sum-exp merge is
exact; and a whole model forward is the same on every kernel."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_hf_model

import longswift
from longswift.runtime.attention import (
    FUSED_FROM_TOKENS,
    MASK_ALIGN,
    ONEDNN_FROM_ENTRIES,
    ONEDNN_SPAN,
    WHOLE_CACHE_SLACK,
    Attention,
    additive_mask,
    by_length,
    cascade,
    cuda_flash_fits,
    explicit_with_lse,
    flash_with_lse,
    key_span,
    masked_with_lse,
    merge,
    onednn_span,
    prefix_attention,
    prefix_with_lse,
)
from longswift.runtime.linear import onednn_computes

HKV, G, D = 2, 3, 16


def reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int,
              new: torch.Tensor | None, scale: float) -> torch.Tensor:
    """Per query head, softmax over every cached slot and the new slots `new` allows. q: [T, H, D]."""
    t, h, _ = q.shape
    out = torch.empty(t, h, D, dtype=torch.float64)
    for head in range(h):
        kv = head // G
        for i in range(t):
            visible = list(range(start)) + [start + j for j in range(t) if new is None or bool(new[i, j])]
            k, v = keys[kv, visible].double(), values[kv, visible].double()
            p = torch.softmax(k @ q[i, head].double() * scale, dim=0)
            out[i, head] = p @ v
    return out


def grouped(q: torch.Tensor) -> torch.Tensor:
    t = q.shape[0]
    return q.reshape(t, HKV, G, D).permute(1, 2, 0, 3).reshape(HKV, G * t, D)


def ungrouped(o: torch.Tensor, t: int) -> torch.Tensor:
    return o.reshape(HKV, G, t, D).permute(2, 0, 1, 3).reshape(t, HKV * G, D)


def random_case(t: int, start: int, tree: bool, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(t, HKV * G, D, generator=g, dtype=torch.float64).to(dtype)
    keys = torch.randn(HKV, start + t, D, generator=g, dtype=torch.float64).to(dtype)
    values = torch.randn(HKV, start + t, D, generator=g, dtype=torch.float64).to(dtype)
    if t == 1 and not tree:
        return q, keys, values, None
    new = torch.ones(t, t, dtype=torch.bool).tril_()
    if tree:  # a random trie: each node sees itself and a random earlier parent's ancestors
        new = torch.eye(t, dtype=torch.bool)
        for i in range(1, t):
            parent = int(torch.randint(0, i, (1,), generator=g))
            new[i] |= new[parent]
    return q, keys, values, new


CASES = [  # (new tokens, cached entries, tree mask)
    (1, 0, False), (1, 1, False), (1, 7, False), (1, ONEDNN_FROM_ENTRIES - 1, False), (1, ONEDNN_FROM_ENTRIES, False),
    (8, 0, True), (8, 1, True), (8, 40, True), (31, ONEDNN_FROM_ENTRIES + 3, True),
    (FUSED_FROM_TOKENS - 1, 20, False), (FUSED_FROM_TOKENS, 20, False), (FUSED_FROM_TOKENS + 1, 0, False),
    (1, 0, True), (1, 7, True),  # a trie of its root alone: masked rows, one new slot
    # a trie picked for the cascade, longer than the cache
    (FUSED_FROM_TOKENS + 1, 3, True), (FUSED_FROM_TOKENS, 0, True),
]


@pytest.mark.parametrize("kernel", [None, "explicit", "cascade", "flash"])
@pytest.mark.parametrize("t,start,tree", CASES)
def test_every_path_equals_explicit_attention_in_float64(kernel, t, start, tree):
    q, keys, values, new = random_case(t, start, tree, torch.float64, seed=t * 7919 + start)
    scale = D**-0.5
    attn = Attention(torch.device("cpu"), torch.float64, scale, packed=False, kernel=kernel)
    masks = attn.masks(t, start, G, new if tree else None)
    got = ungrouped(attn.attend(grouped(q), keys, values, masks), t)
    want = reference(q, keys, values, start, new, scale)  # the tree (or causal mask) made here, not masks.new
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def stored_by_dimension(rows: torch.Tensor, capacity: int, seed: int) -> torch.Tensor:
    """`rows` [Hkv, S, D] as a cache with keys stored slot-innermost holds them (runtime.cache.transposed_keys): a
    [Hkv, C, D] view of [Hkv, D, C], its slots past S stale (finite, large), which must weigh nothing."""
    h, s, d = rows.shape
    stored = torch.randn(h, d, capacity, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 30
    stored = stored.to(rows.dtype)
    stored[:, :, :s] = rows.transpose(1, 2)
    view = stored.transpose(1, 2)
    assert view.stride(-1) != 1 and view.transpose(1, 2).is_contiguous()
    return view


@pytest.mark.parametrize("kernel", [None, "explicit", "cascade", "flash"])
@pytest.mark.parametrize("t,start,tree", CASES)
def test_keys_stored_by_dimension_equal_explicit_attention_in_float64(kernel, t, start, tree):
    """The CPU's float32/float64 caches store keys slot-innermost: every path reads them right (the flash kernels
    get them by slot: the CPU's misreads a strided view), the stale slots past the end weighing nothing."""
    q, keys, values, new = random_case(t, start, tree, torch.float64, seed=t * 7919 + start + 1)
    scale = D**-0.5
    attn = Attention(torch.device("cpu"), torch.float64, scale, packed=False, kernel=kernel)
    masks = attn.masks(t, start, G, new if tree else None)
    stored = stored_by_dimension(keys, start + t + 300, seed=start)
    padded_values = torch.cat([values, torch.full((HKV, 300, D), 1e6, dtype=values.dtype)], dim=1)
    got = ungrouped(attn.attend(grouped(q), stored, padded_values, masks), t)
    torch.testing.assert_close(got, reference(q, keys, values, start, new, scale), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("span_slots", [1, 7, 64, 10_000])
@pytest.mark.parametrize("t,start,tree", [(8, 40, True), (FUSED_FROM_TOKENS, 200, False)])
def test_the_cascade_copies_keys_by_slot_a_span_at_a_time(monkeypatch, span_slots, t, start, tree):
    """The cascade's prefix over keys stored by dimension in spans of span_slots slots (a span's by-slot copy at
    most BY_SLOT_SPAN_BYTES), merged by log-sum-exp: explicit attention in float64 however the spans fall."""
    import longswift.runtime.attention as attention

    q, keys, values, new = random_case(t, start, tree, torch.float64, seed=span_slots + start)
    monkeypatch.setattr(attention, "BY_SLOT_SPAN_BYTES", span_slots * HKV * D * 8)  # float64 keys
    calls = []
    real = attention.flash_with_lse
    monkeypatch.setattr(attention, "flash_with_lse", lambda *a: calls.append(a[1].shape[1]) or real(*a))
    scale = D**-0.5
    attn = Attention(torch.device("cpu"), torch.float64, scale, packed=False, kernel="cascade")
    masks = attn.masks(t, start, G, new if tree else None)
    stored = stored_by_dimension(keys, start + t + 300, seed=start)
    padded_values = torch.cat([values, torch.full((HKV, 300, D), 1e6, dtype=values.dtype)], dim=1)
    got = ungrouped(attn.attend(grouped(q), stored, padded_values, masks), t)
    torch.testing.assert_close(got, reference(q, keys, values, start, new, scale), rtol=1e-10, atol=1e-10)
    assert calls == [min(span_slots, start - a) for a in range(0, start, span_slots)]  # every span, in order


def test_scores_too_large_for_the_heap_go_to_the_cascade(monkeypatch):
    """A masked CPU forward whose [Hkv, G*T, S] float32 scores pass EXPLICIT_SCORES_BYTES runs the cascade (such a
    block was mapped from the system and faulted in every layer), with explicit attention's result in float64."""
    import longswift.runtime.attention as attention

    t, start = 8, 500
    q, keys, values, new = random_case(t, start, True, torch.float64, seed=3)
    scale = D**-0.5
    attn = Attention(torch.device("cpu"), torch.float64, scale, packed=True)
    masks = attn.masks(t, start, G, new)
    used = []
    real = attention.cascade
    monkeypatch.setattr(attention, "cascade", lambda *a: used.append(True) or real(*a))
    scores_bytes = HKV * G * t * (start + t) * 4
    for limit, expect in ((scores_bytes, False), (scores_bytes - 1, True)):
        monkeypatch.setattr(attention, "EXPLICIT_SCORES_BYTES", limit)
        used.clear()
        got = ungrouped(attn.attend(grouped(q), keys, values, masks), t)
        torch.testing.assert_close(got, reference(q, keys, values, start, new, scale), rtol=1e-10, atol=1e-10)
        assert used == ([True] if expect else []), limit
    one = attn.masks(1, start, G, None)  # a decoding token's scores stay explicit: no mask, no cascade
    used.clear()
    attn.attend(grouped(q[:1]), keys[:, : start + 1], values[:, : start + 1], one)
    assert used == []


@pytest.mark.parametrize("t,start,tree", [(1, ONEDNN_FROM_ENTRIES - 1, False), (1, ONEDNN_FROM_ENTRIES, False),
                                          (8, ONEDNN_FROM_ENTRIES + 300, True), (1, 9000, False)])
def test_keys_stored_by_dimension_on_the_packed_float32_path(t, start, tree):
    """The packed float32 path over keys stored slot-innermost (past ONEDNN_FROM_ENTRIES, P @ V by oneDNN over a
    rounded span) gives what it gives over keys stored by slot, to float32's rounding of a sum's order, and
    attention within float32's bound; the slots past the end (stale) weigh nothing. (Bit for bit on the AVX-512
    CPUs of sessions 32-47; on an AVX2-only AMD EPYC, MKL's products of the two layouts sum in different orders:
    at most 4e-8 apart here.)"""
    q, keys, values, new = random_case(t, start, tree, torch.float32, seed=11)
    stale = torch.randn(HKV, 4 * ONEDNN_SPAN, D, generator=torch.Generator().manual_seed(12)) * 30
    rows_k, rows_v = torch.cat([keys, stale], dim=1), torch.cat([values, stale.flip(1)], dim=1)
    scale = D**-0.5
    attn = Attention(torch.device("cpu"), torch.float32, scale, packed=True)
    masks = attn.masks(t, start, G, new)
    by_slot = attn.attend(grouped(q), rows_k, rows_v, masks)
    got = attn.attend(grouped(q), rows_k.transpose(1, 2).contiguous().transpose(1, 2), rows_v, masks)
    torch.testing.assert_close(got, by_slot, rtol=4 * 2**-23, atol=1e-7)
    torch.testing.assert_close(ungrouped(got, t).double(), reference(q, keys, values, start, new, scale), rtol=1e-4,
                               atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("t,start,tree", [(1, 0, False), (1, 300, False), (7, 300, True), (8, 40, True),
                                          (1, ONEDNN_FROM_ENTRIES, False), (7, ONEDNN_FROM_ENTRIES + 2, True)])
@pytest.mark.parametrize("past", [ONEDNN_SPAN, 4 * ONEDNN_SPAN])  # the whole cache read, or a shorter span
def test_reduced_precision_cpu_paths_equal_attention_up_to_their_rounding(t, start, tree, packed, dtype, past):
    """bfloat16 and float16 on the CPU: over keys stored by slot the scores come from keys @ q^T, read transposed
    (the CPU's bfloat16 bmm copies a transposed operand first); over keys stored by dimension (their caches on
    the CPU), from q @ K^T; both over a rounded span (or, within WHOLE_CACHE_SLACK of the cache's rows, all of
    them) whose slots past the end (stale, finite) weigh nothing, below the oneDNN threshold and above it."""
    if packed and start >= ONEDNN_FROM_ENTRIES and not onednn_computes(dtype):  # (below it no oneDNN product runs)
        pytest.skip(f"this CPU's oneDNN has no {dtype} products (they need AVX-512 or AVX-NE-CONVERT); a model "
                    "in that dtype is not packed here (runtime.linear.packing_supported)")
    q, keys, values, new = random_case(t, start, tree, dtype, seed=t + start)
    stale = (torch.randn(HKV, past, D, generator=torch.Generator().manual_seed(9)) * 30).to(dtype)
    rows_k, rows_v = torch.cat([keys, stale], dim=1), torch.cat([values, stale.flip(1)], dim=1)  # read, weigh 0
    scale = D**-0.5
    attn = Attention(torch.device("cpu"), dtype, scale, packed=packed)
    assert attn.rounded_spans
    masks = attn.masks(t, start, G, new if tree else None)
    got = ungrouped(attn.attend(grouped(q), rows_k, rows_v, masks), t)
    want = reference(q, keys, values, start, new, scale)
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2)
    by_dimension = rows_k.transpose(1, 2).contiguous().transpose(1, 2)
    got = ungrouped(attn.attend(grouped(q), by_dimension, rows_v, masks), t)
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("t,start,tree", [(1, ONEDNN_FROM_ENTRIES, False), (8, ONEDNN_FROM_ENTRIES + 1, True)])
def test_onednn_path_equals_explicit_attention(t, start, tree):
    """oneDNN products run in float32 (the packed path's dtypes), so the bound is float32's."""
    q, keys, values, new = random_case(t, start, tree, torch.float32, seed=3)
    scale = D**-0.5
    attn = Attention(torch.device("cpu"), torch.float32, scale, packed=True, kernel="onednn")
    masks = attn.masks(t, start, G, new)
    got = ungrouped(attn.attend(grouped(q), keys, values, masks), t)
    torch.testing.assert_close(got.double(), reference(q, keys, values, start, new, scale), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("t,start,tree", [(1, ONEDNN_FROM_ENTRIES + 5, False), (8, ONEDNN_FROM_ENTRIES + 300, True),
                                          (1, 9000, False), (8, 17000, True)])  # (spans of 512 and 1024 keys)
def test_onednn_path_reads_a_rounded_span_whose_padding_weighs_nothing(t, start, tree):
    """The oneDNN path reads the cache's rows up to a multiple of ONEDNN_SPAN (so that its primitive caches
    keep a shape per span, not one per step); the slots past the end hold stale entries and weigh 0."""
    q, keys, values, new = random_case(t, start, tree, torch.float32, seed=5)
    g = torch.Generator().manual_seed(6)
    stale = torch.randn(HKV, 4 * ONEDNN_SPAN, D, generator=g) * 30  # past the cache's length: finite, not zero
    assert onednn_span(start + t) > start + t  # (some of them are read)
    rows_k, rows_v = torch.cat([keys, stale], dim=1), torch.cat([values, stale.flip(1)], dim=1)
    scale = D**-0.5
    attn = Attention(torch.device("cpu"), torch.float32, scale, packed=True, kernel="onednn")
    masks = attn.masks(t, start, G, new)
    got = ungrouped(attn.attend(grouped(q), rows_k, rows_v, masks), t)
    torch.testing.assert_close(got.double(), reference(q, keys, values, start, new, scale), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("by_dimension", [False, True])
def test_onednn_path_makes_a_primitive_shape_per_span_not_per_step(monkeypatch, by_dimension):
    """Every key count the oneDNN linear sees is a shape its caches keep (~0.43 MiB each, 1024 of them): a
    decode run grew by ~440 MiB when each step brought a new one."""
    seen = set()
    real = torch.ops.mkldnn._linear_pointwise

    def spy(x, weight, *args):
        seen.add(tuple(weight.shape))
        return real(x, weight, *args)

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", spy)
    attn = Attention(torch.device("cpu"), torch.float32, D**-0.5, packed=True)  # the kernel picked by length
    g = torch.Generator().manual_seed(7)
    keys, values = torch.randn(HKV, 4096, D, generator=g), torch.randn(HKV, 4096, D, generator=g)
    if by_dimension:  # (a float32 cache on the CPU: only V meets oneDNN)
        keys = keys.transpose(1, 2).contiguous().transpose(1, 2)
    qg = torch.randn(HKV, G, D, generator=g)
    for length in range(ONEDNN_FROM_ENTRIES - 4, ONEDNN_FROM_ENTRIES + 600):  # decoding steps
        attn.attend(qg, keys, values, attn.masks(1, length, G, None))
    assert 0 < len(seen) <= 4, sorted(seen)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("by_dimension", [False, True])
def test_reduced_precision_cpu_products_see_a_shape_per_span_not_per_step(monkeypatch, by_dimension, dtype):
    """The CPU's bfloat16 and float16 bmm run on oneDNN, which keeps a primitive per shape (~0.5-1 MiB each): a
    bfloat16 run below the oneDNN threshold grew by ~1 GiB over 1K decoding steps when each brought a new key
    count (float16: 260-320 MiB over 400 key counts of one layer's product, in either key layout)."""
    seen = set()
    real = torch.bmm

    def spy(a, b):
        seen.add((tuple(a.shape), tuple(b.shape)))
        return real(a, b)

    monkeypatch.setattr(torch, "bmm", spy)
    attn = Attention(torch.device("cpu"), dtype, D**-0.5, packed=True)
    g = torch.Generator().manual_seed(8)
    keys, values = (torch.randn(HKV, 4096, D, generator=g).to(dtype) for _ in range(2))
    if by_dimension:  # (a bfloat16 or float16 cache on the CPU)
        keys = keys.transpose(1, 2).contiguous().transpose(1, 2)
    for length in range(100, 700):  # decoding steps, then 7-node tries
        attn.attend(torch.randn(HKV, G, D, generator=g).to(dtype), keys, values, attn.masks(1, length, G, None))
    tree = torch.ones(7, 7, dtype=torch.bool).tril_()
    for length in range(100, 700, 7):
        attn.attend(torch.randn(HKV, 7 * G, D, generator=g).to(dtype), keys, values, attn.masks(7, length, G, tree))
    assert len(seen) <= 2 * 2 * 3, sorted(seen)  # (scores, values) x (decode, tree) x the spans 256, 512, 768


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_reduced_precision_cpu_products_read_the_whole_cache_near_its_end(monkeypatch, dtype):
    """The CPU's bfloat16 and float16 bmm copies a span of a longer cache before it multiplies (1.5-1.9x the
    product): where the rounded span falls short of the cache's rows by at most WHOLE_CACHE_SLACK, both products
    read every row (a contiguous operand), the rows past the end weighing nothing. float32 reads what it did."""
    operands = []
    real = torch.bmm

    def spy(a, b):
        operands.append(b)
        return real(a, b)

    monkeypatch.setattr(torch, "bmm", spy)
    rows = 3072 + 7  # a run of 3,072 tokens with a 7-node trie's slots past it
    g = torch.Generator().manual_seed(10)
    keys = (torch.randn(HKV, rows, D, generator=g) * 0.5).to(dtype)
    keys = keys.transpose(1, 2).contiguous().transpose(1, 2)  # stored by dimension, as the CPU's caches are
    values = torch.randn(HKV, rows, D, generator=g).to(dtype)
    attn = Attention(torch.device("cpu"), dtype, D**-0.5, packed=False)
    reduced = dtype != torch.float32
    for end, whole in ((2900, reduced), (2500, False)):  # (the spans 3,072 and 2,560)
        assert (rows - onednn_span(end) <= WHOLE_CACHE_SLACK) == (end == 2900)
        keys[:, end:], values[:, end:] = keys[:, end:] * 30, values[:, end:] * 30  # stale rows, read, weigh nothing
        operands.clear()
        q = torch.randn(1, HKV * G, D, generator=g).to(dtype)
        got = ungrouped(attn.attend(grouped(q), keys, values, attn.masks(1, end - 1, G, None)), 1)
        assert len(operands) == 2
        assert all(b.is_contiguous() == whole for b in operands), (end, [tuple(b.shape) for b in operands])
        want = reference(q, keys[:, :end], values[:, :end], end - 1, None, D**-0.5)
        tol = 2e-2 if reduced else 1e-5
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


def test_onednn_spans_grow_with_the_context_so_that_a_100k_run_makes_few_shapes():
    """Past 8K entries the span's step doubles with the context: a shape per 256 steps would be ~380
    shapes (and as many per verify row count) by 100K, ~0.6 MiB each in oneDNN's caches."""
    spans = [onednn_span(end) for end in range(ONEDNN_FROM_ENTRIES, 100_001)]
    assert all(end <= span <= end * 17 / 16 or span - end < ONEDNN_SPAN
               for end, span in zip(range(ONEDNN_FROM_ENTRIES, 100_001), spans))
    assert len(set(spans)) <= 80
    assert len({onednn_span(end) for end in range(ONEDNN_FROM_ENTRIES, 8193)}) == 21  # 256 apart to 8K


def test_cascade_merge_is_exact():
    """Attention over A u B from the parts' outputs and log-sum-exps equals attention over A u B."""
    g = torch.Generator().manual_seed(0)
    qg = torch.randn(HKV, 5, D, generator=g, dtype=torch.float64)
    keys = torch.randn(HKV, 30, D, generator=g, dtype=torch.float64)
    values = torch.randn(HKV, 30, D, generator=g, dtype=torch.float64)
    whole, whole_lse = explicit_with_lse(qg, keys, values, 0.25, None)
    a, lse_a = flash_with_lse(qg, keys[:, :11], values[:, :11], 0.25)  # CPU flash with its lse
    b, lse_b = explicit_with_lse(qg, keys[:, 11:], values[:, 11:], 0.25, None)
    torch.testing.assert_close(torch.logaddexp(lse_a, lse_b), whole_lse, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(merge(a, lse_a, b, lse_b), whole, rtol=1e-12, atol=1e-12)
    # a part whose rows are all masked contributes nothing (lse -inf), and nothing becomes NaN
    none = torch.zeros(5, 19, dtype=torch.bool)
    c, lse_c = explicit_with_lse(qg, keys[:, 11:], values[:, 11:], 0.25, none)
    assert torch.isneginf(lse_c).all() and not c.isnan().any()
    torch.testing.assert_close(merge(a, lse_a, c, lse_c), a, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("width", [1, 5, 16, 17, 121])
def test_masked_attention_with_lse_equals_explicit_attention(width):
    """The verify pass's masked part (the CPU flash kernel with an additive mask, the call CUDA makes
    to its memory-efficient kernel) gives explicit attention's output and log-sum-exp in float64, for
    GQA rows under a random trie's mask; the mask's rows lie padded to the kernel's alignment."""
    q, keys, values, new = random_case(width, 0, True, torch.float64, seed=width)
    rows = new.repeat(G, 1)  # [G*T, T], rows g*T + t
    bias = additive_mask(rows, torch.float64)
    assert bias.shape == (G * width, width) and bias.stride(0) % MASK_ALIGN == 0
    assert torch.equal(bias == 0, rows) and torch.isneginf(bias[~rows]).all()
    got, got_lse = masked_with_lse(grouped(q), keys, values, bias, D**-0.5)
    want, want_lse = explicit_with_lse(grouped(q), keys, values, D**-0.5, rows)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got_lse, want_lse, rtol=1e-12, atol=1e-12)


def test_the_merge_weighs_each_part_by_its_share_of_the_softmax_mass():
    """sigmoid(lse_a - lse_b) is part a's share; extreme gaps give one part all the weight without
    NaN, and a part with lse -inf none."""
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(2, 3, 4, generator=g, dtype=torch.float64), torch.randn(2, 3, 4, generator=g, dtype=torch.float64)
    lse_a = torch.tensor([[0.0, 800.0, float("-inf")], [-3.0, -800.0, 2.0]], dtype=torch.float64)
    lse_b = torch.tensor([[1.0, 0.0, 5.0], [float("-inf"), 0.0, 2.0]], dtype=torch.float64)
    got = merge(a, lse_a, b, lse_b)
    lse = torch.logaddexp(lse_a, lse_b)
    want = torch.exp(lse_a - lse)[..., None] * a + torch.exp(lse_b - lse)[..., None] * b
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert torch.equal(got[0, 2], b[0, 2]) and torch.equal(got[1, 0], a[1, 0])


@pytest.mark.parametrize("t,start,tree", [(1, 0, False), (1, 7, False), (1, 16, False), (6, 5, True), (8, 12, True)])
def test_attention_by_a_device_held_length_equals_explicit_attention(t, start, tree):
    """--graph-attention length: the cached length comes from a device tensor and the keys from a
    fixed span of the cache (16 slots, stale past the length); the T new keys are passed apart."""
    q, keys, values, new = random_case(t, start, tree, torch.float64, seed=t * 31 + start)
    span = 16
    cache_k = torch.full((HKV, span, D), 1e6, dtype=torch.float64)  # stale slots must never be read
    cache_v = torch.full((HKV, span, D), -1e6, dtype=torch.float64)
    cache_k[:, :start], cache_v[:, :start] = keys[:, :start], values[:, :start]
    rows = (new if new is not None else torch.ones(1, 1, dtype=torch.bool)).repeat(G, 1)  # [G*T, T]
    used = key_span(torch.tensor([start]), span)
    got = by_length(grouped(q), cache_k, cache_v, used, keys[:, start:], values[:, start:],
                    additive_mask(rows, torch.float64), D**-0.5)
    torch.testing.assert_close(ungrouped(got, t), reference(q, keys, values, start, new, D**-0.5),
                               rtol=1e-10, atol=1e-10)
    out, lse = prefix_with_lse(grouped(q), cache_k, cache_v, used, D**-0.5)
    assert torch.equal(prefix_attention(grouped(q), cache_k, cache_v, used, D**-0.5), out)  # decoding's call
    if start == 0:  # nothing cached: no weight in the merge, and no NaN
        assert torch.isneginf(lse).all() and not out.isnan().any()
    else:
        want, want_lse = explicit_with_lse(grouped(q), keys[:, :start], values[:, :start], D**-0.5, None)
        torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)


def test_cascade_never_reads_a_masked_new_slot():
    """Poison a new slot that the mask hides: the cascade's output does not change."""
    q, keys, values, new = random_case(6, 12, True, torch.float64, seed=5)
    hidden = (~new).nonzero()[0]  # (row, column) not visible
    qg = grouped(q)
    bias = additive_mask(new.repeat(G, 1), torch.float64)
    before = cascade(qg, keys, values, 12, bias, D**-0.5)
    keys[:, 12 + int(hidden[1])] = 1e6
    after = cascade(qg, keys, values, 12, bias, D**-0.5)
    rows = [g * 6 + int(hidden[0]) for g in range(G)]
    torch.testing.assert_close(after[:, rows], before[:, rows], rtol=0, atol=0)


@pytest.mark.parametrize("kernel", ["cascade", "flash"])
def test_model_forward_is_the_same_on_the_gpu_kernels(kernel):
    """A whole prefill + decode + tree forward of a tiny GQA model with the CUDA kernels forced on
    CPU equals the default CPU kernels in float64."""
    hf = tiny_hf_model("llama", "default", seed=3)
    engine = longswift.load(hf, device="cpu", dtype="float64")
    model = engine.model
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 128, (21,), generator=g)
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)

    def run():
        from longswift.runtime.cache import FullKVCache
        cache = FullKVCache(engine.cfg, 64, torch.float64, torch.device("cpu"))
        first, _ = model.prefill(prompt, cache, chunk=8)
        step, _ = model.forward(torch.tensor([5]), torch.tensor([21]), cache)
        verify, _ = model.forward(torch.tensor([1, 2, 3, 4]), torch.tensor([22, 23, 23, 24]), cache, tree_mask=tree)
        return first, step, verify

    want = run()
    model.attention.kernel = kernel
    got = run()
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.fixture
def gpu_capability(monkeypatch):
    """Pretend a CUDA device of the given compute capability is present (cuda_flash_fits asks it)."""
    from longswift.runtime import attention

    def pretend(capability: tuple[int, int]) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability)
        attention._flash_capable.cache_clear()

    yield pretend
    attention._flash_capable.cache_clear()


def test_cuda_flash_is_asked_only_for_head_sizes_its_kernels_take(gpu_capability):
    """aten's flash forward refuses a head size that is not a multiple of 8 (only the public SDPA pads
    it) or above 256, and any dtype but float16/bfloat16: those take the explicit path instead of a
    RuntimeError on a GPU."""
    gpu_capability((9, 0))
    cuda = torch.device("cuda")
    assert cuda_flash_fits(cuda, torch.bfloat16, 128) and cuda_flash_fits(cuda, torch.float16, 64)
    assert not cuda_flash_fits(cuda, torch.bfloat16, 12)  # 12 % 8 != 0: mha_fwd's TORCH_CHECK
    assert not cuda_flash_fits(cuda, torch.bfloat16, 264)
    assert not cuda_flash_fits(cuda, torch.float32, 128)
    assert not cuda_flash_fits(torch.device("cpu"), torch.bfloat16, 128)


def test_cuda_flash_is_not_asked_of_gpus_before_ampere(gpu_capability):
    """torch's flash kernels raise "FlashAttention only supports Ampere GPUs or newer" on a V100 or T4
    (compute capability 7.x): there the fused paths give way to explicit attention."""
    gpu_capability((7, 5))
    assert not cuda_flash_fits(torch.device("cuda"), torch.float16, 64)
    gpu_capability((8, 0))
    assert cuda_flash_fits(torch.device("cuda"), torch.float16, 64)
