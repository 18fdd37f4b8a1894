"""The length path's chunked prefix (runtime.attention.prefix_chunks): a verify pass with more query rows a
KV head than flash's split kernel takes in one tile cuts the cached span into chunks, sent to flash's
regular kernel as a variable-length batch, and merges them by log-sum-exp. CUDA's flash kernels do not
run here, so `aten._flash_attention_forward` is replaced by a float64 reference of its variable-length
contract (which asserts the contract's limits); tests/test_cuda.py runs the real kernel on a GPU."""

from __future__ import annotations

import pytest
import torch

from longswift.runtime import attention
from longswift.runtime.attention import (
    CHUNK_MIN_KEYS,
    SPLIT_TILE_ROWS,
    additive_mask,
    by_length,
    explicit_with_lse,
    key_span,
    merge,
    merge_parts,
    prefix_chunks,
    prefix_with_lse,
)

HKV, GRP, D = 2, 3, 16
SCALE = D**-0.5


def varlen_flash(q, k, v, cu_q, cu_k, max_q, max_k, dropout, causal, debug, *, scale, seqused_k=None):
    """flash's variable-length forward as its contract states it: sequence i's query rows cu_q[i]:cu_q[i + 1]
    attend over the keys from cu_k[i] on, seqused_k[i] of them (else up to cu_k[i + 1]); query head h reads KV
    head h // (H / Hkv). q: [total_q, H, D], k/v: [total_k, Hkv, D] (strided views allowed) -> out [total_q, H,
    D] in q's dtype, lse [H, total_q] float32 (float64 here for float64); a sequence without keys: out 0, lse
    +inf (as flash's softmax.h gives it)."""
    assert dropout == 0.0 and not causal and not debug
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
    assert cu_q.dtype == cu_k.dtype == torch.int32 and (seqused_k is None or seqused_k.dtype == torch.int32)
    total_q, heads, d = q.shape
    group = heads // k.shape[1]
    out = torch.zeros_like(q)
    lse = torch.full((heads, total_q), float("inf"), dtype=torch.promote_types(q.dtype, torch.float32))
    for i in range(cu_q.numel() - 1):
        q0, q1, k0 = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i])
        n = int(seqused_k[i]) if seqused_k is not None else int(cu_k[i + 1]) - k0
        assert 0 <= q1 - q0 <= max_q and 0 <= n <= int(cu_k[i + 1]) - k0 <= max_k
        assert k0 + n <= k.shape[0]
        if n == 0:
            continue
        for h in range(heads):
            o, row_lse = explicit_with_lse(q[q0:q1, h][None], k[k0:k0 + n, h // group][None],
                                           v[k0:k0 + n, h // group][None], scale, None)
            out[q0:q1, h], lse[h, q0:q1] = o[0].to(q.dtype), row_lse[0].to(lse.dtype)
    return out, lse, None, None, None


@pytest.fixture
def flash(monkeypatch):
    """Flash on the CPU: the reference above for the op, and cuda_flash_fits saying yes; the calls recorded."""
    calls = []

    def op(*args, **kwargs):
        calls.append(args)
        return varlen_flash(*args, **kwargs)

    monkeypatch.setattr(torch.ops.aten, "_flash_attention_forward", op)
    monkeypatch.setattr(attention, "cuda_flash_fits", lambda *args: True)
    return calls


def case(t: int, used: int, span: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(HKV, GRP * t, D, dtype=torch.float64, generator=g)  # [Hkv, R, D], rows g*T + t
    keys = torch.full((HKV, span, D), 1e6, dtype=torch.float64)  # stale past `used`: must never be read
    values = torch.full((HKV, span, D), -1e6, dtype=torch.float64)
    keys[:, :used] = torch.randn(HKV, used, D, dtype=torch.float64, generator=g)
    values[:, :used] = torch.randn(HKV, used, D, dtype=torch.float64, generator=g)
    return q, keys, values


@pytest.mark.parametrize("chunks", [2, 3, 7])
@pytest.mark.parametrize("used", [0, 1, 7, 8, 9, 49, 50])
def test_the_chunked_prefix_equals_explicit_attention(flash, chunks, used):
    """Chunks of 25, 17 and 8 slots (the last shorter) over a span of 50, the used slots ending anywhere: in
    a chunk, at a chunk's end, in the first, nowhere (every chunk empty: out 0, lse -inf, no NaN)."""
    t, span = 25, 50  # 75 rows a KV head
    q, keys, values = case(t, used, span, seed=used * 10 + chunks)
    ks = key_span(torch.tensor([used]), span, rows=GRP * t, hkv=HKV, chunks=chunks)
    assert ks.chunks is not None and int(ks.chunks.cu_k[-1]) == span and int(ks.chunks.used.sum()) == used
    out, lse = prefix_with_lse(q, keys, values, ks, SCALE)
    assert len(flash) == 1 and flash[0][3].numel() == chunks + 1  # one call, a sequence per chunk
    if used == 0:
        assert torch.isneginf(lse).all() and torch.equal(out, torch.zeros_like(out))
        return
    want, want_lse = explicit_with_lse(q, keys[:, :used], values[:, :used], SCALE, None)
    torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("used", [0, 5, 33])
def test_by_length_merges_the_chunks_and_the_new_entries_at_once(flash, used):
    """The verify pass's call: the chunks' parts and the tree's new entries (under its mask) in one merge,
    against explicit attention over the used slots and the visible new ones."""
    t, span = 24, 40
    q, keys, values = case(t, used, span, seed=used)
    g = torch.Generator().manual_seed(99)
    new_k, new_v = (torch.randn(HKV, t, D, dtype=torch.float64, generator=g) for _ in range(2))
    tree = (torch.rand(t, t, generator=g) < 0.4).tril_() | torch.eye(t, dtype=torch.bool)  # [T, T], self visible
    rows = tree.repeat(GRP, 1)  # [G*T, T]
    ks = key_span(torch.tensor([used]), span, rows=GRP * t, hkv=HKV, chunks=4)
    got = by_length(q, keys, values, ks, new_k, new_v, additive_mask(rows, torch.float64), SCALE)
    allowed = torch.cat([torch.ones(GRP * t, used, dtype=torch.bool), rows], dim=1)
    want, _ = explicit_with_lse(q, torch.cat([keys[:, :used], new_k], 1), torch.cat([values[:, :used], new_v], 1),
                                SCALE, allowed)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert len(flash) == 1 and flash[0][3].numel() == 5  # chunked, not the split kernel's single query token


def test_the_reference_reproduces_the_split_kernels_layout(flash):
    """Below a tile of rows the span is not cut: the rows go as one query token of Hkv*R heads (the layout
    the H100 and H200 ran), and the reference gives explicit attention there too."""
    t, used, span = 20, 30, 40  # 60 rows: one tile
    q, keys, values = case(t, used, span, seed=3)
    ks = key_span(torch.tensor([used]), span, rows=GRP * t, hkv=HKV)
    assert ks.chunks is None
    out, lse = prefix_with_lse(q, keys, values, ks, SCALE)
    assert flash[0][0].shape == (1, HKV * GRP * t, D)
    want, want_lse = explicit_with_lse(q, keys[:, :used], values[:, :used], SCALE, None)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)


def test_merge_parts_equals_merging_two_at_a_time():
    g = torch.Generator().manual_seed(1)
    p, rows = 4, 5
    outs = torch.randn(p, rows, HKV, D, dtype=torch.float64, generator=g)
    lses = torch.randn(HKV, p, rows, dtype=torch.float64, generator=g) * 50
    lses[0, 1:, 2] = float("-inf")  # one part alone
    lses[1, :, 3] = float("-inf")  # no part: out 0, lse -inf
    got, lse = merge_parts(outs, lses)
    want, want_lse = outs[0].transpose(0, 1), lses[:, 0]
    for i in range(1, p):
        want = merge(want, want_lse, outs[i].transpose(0, 1), lses[:, i])
        want_lse = torch.logaddexp(want_lse, lses[:, i])
    want[1, 3] = 0.0  # merge() leaves NaN where both parts are empty; merge_parts gives 0
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)
    assert torch.isneginf(lse[1, 3]) and torch.equal(got[0, 2], outs[0, 2, 0])


def test_the_chunk_plan():
    """One tile of rows or under two chunks' keys: no chunks. Else about 264 thread blocks (two per SM of an
    H100/H200), a chunk at least CHUNK_MIN_KEYS keys."""
    assert prefix_chunks(SPLIT_TILE_ROWS, 8, 100_000) == 1  # 16 nodes of the 8B shape: the split kernel
    assert prefix_chunks(128, 8, 131_072) == 33  # 32 nodes: 33 chunks x 8 heads x 1 tile
    assert prefix_chunks(484, 8, 131_072) == 9  # 121 nodes: 4 tiles of 128 rows
    assert prefix_chunks(128, 8, 8192) == 8192 // CHUNK_MIN_KEYS
    assert prefix_chunks(128, 8, 2 * CHUNK_MIN_KEYS - 1) == 1
