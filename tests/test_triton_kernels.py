"""The Triton kernels (runtime.triton_kernels: rope with the cache writes, SwiGLU) run here under Triton's
interpreter, on CPU tensors: each equals the eager ops it replaces (exactly or to the last bit of float32
and float64; bfloat16 to one unit in the last place, the interpreter rounding its casts toward zero where a
GPU rounds to nearest); the CUDA step bodies with them equal the model's own forward in float64 with fewer
ops a layer, and the generation loops through those bodies still emit AR's tokens. tests/test_cuda.py
runs the compiled kernels on a GPU."""

from __future__ import annotations

import builtins
import dataclasses
import os
import re

import pytest
import torch
import torch.nn.functional as F
from conftest import OpCount, tiny_hf_model

import longswift
from longswift import GenerationConfig, SamplingConfig, SpecConfig
from longswift.config import RuntimeConfig
from longswift.errors import LongswiftError
from longswift.runtime.cache import FullKVCache
from longswift.runtime.cuda_graphs import StepGraphs
from longswift.runtime.model import Transformer
from longswift.runtime.rope import apply_rope

triton = pytest.importorskip("triton")
from triton_compile import SHARED_LIMIT, compile_for, spilled_bytes  # noqa: E402
from longswift.runtime.triton_kernels import attention as triton_attention  # noqa: E402
from longswift.runtime.triton_kernels import rms_norm as triton_rms_norm  # noqa: E402
from longswift.runtime.triton_kernels import rope_store, silu_mul, triton_unavailable  # noqa: E402

CPU = torch.device("cpu")
H, HKV, D = 4, 2, 16
# aten ops that make views, launching no kernel on a GPU
VIEWS = {"aten.select", "aten.slice", "aten.transpose", "aten.view", "aten.chunk", "aten.split", "aten.unbind",
         "aten.expand", "aten.permute", "aten.unsqueeze", "aten.squeeze", "aten.as_strided", "aten._unsafe_view",
         "aten.alias", "aten.t"}


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    """Triton's interpreter for this module's tests only (the kernels are built per mode, so a GPU run of the
    whole suite still compiles them for its device elsewhere)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def rope_case(dtype: torch.dtype, t: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(t, (H + 2 * HKV) * D, generator=g).to(dtype)
    angles = torch.randn(t, 1, D // 2, generator=g, dtype=torch.float64) * 3
    cos = torch.cat([angles.cos()] * 2, -1).to(dtype)
    sin = torch.cat([angles.sin()] * 2, -1).to(dtype)
    sin[..., : D // 2].neg_()  # Rope.cos_sin's signed sine
    return qkv, cos, sin


@pytest.mark.parametrize("transposed", [True, False], ids=["keys-slots-innermost", "keys-dims-innermost"])
@pytest.mark.parametrize("fused", [False, True], ids=["transformers-order", "addcmul"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_rope_store_rotates_as_apply_rope_and_writes_only_the_given_slots(dtype, fused, transposed):
    """Rope as apply_rope in its two orders (float16, which the interpreter rounds as torch does, bit for bit:
    each order's roundings show there) and the cache written at the given slots only."""
    t, capacity = 5, 20
    qkv, cos, sin = rope_case(dtype, t)
    slots = torch.tensor([3, 7, 8, 9, 15])
    cache = FullKVCache(tiny_cfg(), capacity, dtype, CPU, transposed=transposed)
    cache.k.fill_(7.0), cache.v.fill_(-7.0)  # every slot not written must keep these
    q, k, v = rope_store(qkv, cos, sin, slots, cache.k[1], cache.v[1], H, HKV, fused)
    want = apply_rope(qkv[:, : (H + HKV) * D].view(t, H + HKV, D), cos, sin, fused)
    want_v = qkv[:, (H + HKV) * D :].view(t, HKV, D)
    assert q.shape == (t, H, D) and k.shape == v.shape == (t, HKV, D)
    if dtype == torch.bfloat16:
        # The interpreter truncates its casts where torch rounds to nearest: each of the (up to) three roundings
        # is then off by less than one unit of its own value, bounded by the two products' magnitudes
        x = qkv[:, : (H + HKV) * D].view(t, H + HKV, D).double()
        terms = (x * cos.double()).abs() + (torch.roll(x, D // 2, -1) * sin.double()).abs()
        bound = 4 * torch.finfo(dtype).eps * terms
        assert ((q.double() - want[:, :H].double()).abs() <= bound[:, :H]).all()
        assert ((k.double() - want[:, H:].double()).abs() <= bound[:, H:]).all()
    elif dtype == torch.float16:
        assert torch.equal(q, want[:, :H]) and torch.equal(k, want[:, H:])
        other = apply_rope(qkv[:, : (H + HKV) * D].view(t, H + HKV, D), cos, sin, not fused)
        assert not torch.equal(other, want)  # (so the order shows)
    elif fused:  # addcmul's product-add rounded once, where its last bit may differ (|x| < 5: a few eps)
        eps = torch.finfo(dtype).eps
        torch.testing.assert_close(q, want[:, :H], rtol=4 * eps, atol=8 * eps)
        torch.testing.assert_close(k, want[:, H:], rtol=4 * eps, atol=8 * eps)
    else:  # two products and their sum, each rounded as torch rounds them
        assert torch.equal(q, want[:, :H]) and torch.equal(k, want[:, H:])
    assert torch.equal(v, want_v)
    assert torch.equal(cache.k[1][:, slots], k.transpose(0, 1))  # [Hkv, T, D]
    assert torch.equal(cache.v[1][:, slots], want_v.transpose(0, 1))
    untouched = torch.ones(capacity, dtype=torch.bool)
    untouched[slots] = False
    assert (cache.k[1][:, untouched] == 7).all() and (cache.v[1][:, untouched] == -7).all()
    assert (cache.k[0] == 7).all() and (cache.v[0] == -7).all()  # another layer's cache


def tiny_cfg():
    from longswift.config import ModelConfig

    return ModelConfig.from_hf(tiny_hf_model("llama", "default").config)  # H 4, Hkv 2, D 16, 2 layers


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows,inner,block", [(3, 50, 16), (1, 96, 1024), (0, 8, 16)])
def test_silu_mul_is_silu_of_the_gate_times_up(dtype, rows, inner, block):
    gate_up = torch.randn(rows, 2 * inner, generator=torch.Generator().manual_seed(rows)).to(dtype) * 4
    gate, up = gate_up.chunk(2, dim=-1)
    want = F.silu(gate) * up
    got = silu_mul(gate_up, block)
    assert got.shape == (rows, inner) and got.dtype == dtype
    if dtype == torch.float16:  # the interpreter rounds as torch: silu rounded, then the product, bit for bit
        assert torch.equal(got, want)
        assert rows == 0 or not torch.equal((F.silu(gate.float()) * up.float()).half(), want)  # (one rounding: other)
    elif dtype == torch.bfloat16:
        # Two roundings, each off by at most 1.5 units of its value where the interpreter truncates and torch
        # rounds to nearest: within 3 eps of the exact product
        exact = (F.silu(gate.double()) * up.double()).abs()
        assert ((got.double() - want.double()).abs() <= 3.1 * torch.finfo(dtype).eps * exact).all()
    else:
        torch.testing.assert_close(got, want, rtol=8 * torch.finfo(dtype).eps, atol=8 * torch.finfo(dtype).tiny)


def attention_reference(qg, keys, values, used: int, scale: float, tree):
    """Attention in float64 over the cached slots [0, used) and, under `tree`, the N slots after them."""
    rows, new = qg.shape[1], 0 if tree is None else tree.shape[0]
    k, v = keys[:, : used + new].double(), values[:, : used + new].double()
    scores = qg.double() @ k.transpose(1, 2) * scale  # [Hkv, R, used + N]
    seen = torch.ones(rows, used + new, dtype=torch.bool)
    if new:
        seen[:, used:] = tree[torch.arange(rows) % new]  # row g*N + t: token t
    return torch.softmax(scores.masked_fill(~seen, float("-inf")), -1) @ v


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kv_heads,group,new,used,d,parts,transposed", [
    (2, 4, 0, 37, 16, 1, False),  # decoding: the token's key among the used slots, one part
    (2, 4, 0, 200, 16, 3, True),  # three parts of whole 64-key tiles (the last one short), CPU cache layout
    (1, 1, 0, 5, 16, 4, False),  # more parts than tiles: the empty ones weigh nothing
    (2, 3, 4, 150, 32, 2, False),  # a verify pass: 12 rows a KV head, a 4-node tree
    (1, 4, 5, 0, 16, 2, True),  # nothing cached: the tree alone
    (2, 4, 9, 130, 24, 2, False),  # a head size no power of two; 36 rows, two row blocks of 32
    (1, 4, 33, 70, 16, 1, False),  # 132 rows: two blocks of 128 rows
    (1, 1, 70, 3, 16, 1, False),  # tokens that see only themselves past the first tile of 64 new slots
    (1, 2, 90, 40, 16, 2, True),  # a random trie over two tiles of new slots; the mask stored column-major
])
def test_attention_is_attention_over_the_used_slots_and_the_tree(dtype, kv_heads, group, new, used, d, parts,
                                                                 transposed):
    """runtime.triton_kernels.attention against float64 attention: to float64's and float32's rounding, and in
    float16 and bfloat16 to what rounding the weights and the output to them costs; with the parts split on
    any count of used slots, GQA rows, a tree mask, and keys and the mask stored either way."""
    g = torch.Generator().manual_seed(used + new)
    rows, capacity = group * max(new, 1), used + new + 70  # (slots past used + N hold keys that must not count)
    qg = torch.randn(kv_heads, rows, d, generator=g).to(dtype)
    keys = torch.randn(kv_heads, capacity, d, generator=g).to(dtype)
    values = torch.randn(kv_heads, capacity, d, generator=g).to(dtype)
    if transposed:  # runtime.cache.transposed_keys: slots innermost
        keys = keys.transpose(1, 2).contiguous().transpose(1, 2)
    tree = None
    if new:
        tree = (torch.rand(new, new, generator=g) < 0.5).tril() | torch.eye(new, dtype=torch.bool)
        if new == 70:  # a tile of none seen before one of some: the running max stays -inf, weighing nothing
            tree = torch.eye(new, dtype=torch.bool)
        if transposed:
            tree = tree.t().contiguous().t()
    scale = d ** -0.5
    got = triton_attention(qg, keys, values, torch.tensor([used]), scale, tree, parts)
    assert got.dtype == dtype and got.shape == (kv_heads, rows, d)
    want = attention_reference(qg, keys, values, used, scale, tree)
    tol = {torch.float64: 1e-12, torch.float32: 2e-6}.get(dtype, 2 * torch.finfo(dtype).eps)
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


def test_the_attention_parts_fill_the_gpu_and_fit_one_merge(monkeypatch):
    """On a GPU of 132 multiprocessors (H100, H200), 264 programs: the 8B shape's decoding (8 KV heads, 4 rows)
    splits a 100K span into 33 parts, a 32-node pass (128 rows, one block) too, a 121-node one (484 rows, 4
    blocks) into 9; short spans keep 256 keys a part; few KV heads stop at 63 parts, so that every span's merge
    is the same compiled kernel."""
    import longswift.runtime.triton_kernels as tk

    monkeypatch.setattr(tk, "_processors", lambda index: 132)
    gpu = torch.device("cuda", 0)
    assert tk.attention_parts(gpu, 8, 4, 131072) == tk.attention_parts(gpu, 8, 128, 131072) == 33
    assert tk.attention_parts(gpu, 8, 484, 131072) == 9
    assert [tk.attention_parts(gpu, 8, 4, span) for span in (1024, 2048, 4096, 8192)] == [4, 8, 16, 32]
    assert tk.attention_parts(gpu, 3, 3, 131072) == tk.attention_parts(gpu, 1, 4, 131072) == tk.MERGE_BLOCK_P - 1
    assert tk.attention_parts(gpu, 8, 4, 100) == 1 and tk.attention_parts(CPU, 8, 4, 131072) == 1
    assert tk.attention_parts(CPU, 1, 4, 131072) == 2
    # float32's tiles take 64 rows a program at most: 128 rows a KV head are two blocks, so half the parts each
    assert tk.attention_parts(gpu, 8, 128, 131072, tk.FLOAT32_TILES.max_block_m) == 17
    assert tk.attention_fits(CPU, torch.bfloat16, 128) and not tk.attention_fits(CPU, torch.bfloat16, 256)


def record_launches(monkeypatch, kernel: str, keys: tuple[str, ...]) -> list[dict]:
    """The Triton kernels with `kernel`'s launches recorded (the `keys` of their keyword arguments, and "grid": the
    launch's grid) before they run: -> the list the launches append to."""
    import longswift.runtime.triton_kernels as tk

    launched: list[dict] = []
    real = tk.kernels()

    class Recorded:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launched.append({k: grid if k == "grid" else kwargs[k] for k in keys})
                return getattr(real, kernel)[grid](*args, **kwargs)
            return launch

    class Kernels:
        def __getattr__(self, name):
            return Recorded() if name == kernel else getattr(real, name)

    monkeypatch.setattr(tk, "kernels", lambda: Kernels())
    return launched


@pytest.mark.parametrize("block_n", [16, 32, 128])
def test_the_attention_tiles_change_its_speed_not_its_values(block_n, monkeypatch):
    """Other AttentionTiles (what triton_attention_ab.py's `tune` sweeps on a GPU): keys 16 to 128 a tile, with
    warps and stages (launched with them; the interpreter ignores them), attend as the default's float64 does."""
    from longswift.runtime.triton_kernels import AttentionTiles

    launched = record_launches(monkeypatch, "attention_part_kernel", ("BLOCK_N", "BLOCK_M", "num_warps", "num_stages"))
    g = torch.Generator().manual_seed(block_n)
    qg = torch.randn(2, 15, 16, generator=g, dtype=torch.float64)
    keys, values = (torch.randn(2, 400, 16, generator=g, dtype=torch.float64) for _ in range(2))
    tree = (torch.rand(5, 5, generator=g) < 0.5).tril() | torch.eye(5, dtype=torch.bool)
    got = triton_attention(qg, keys, values, torch.tensor([300]), 0.25, tree, 3, AttentionTiles(block_n, 8, 4, 16))
    torch.testing.assert_close(got, attention_reference(qg, keys, values, 300, 0.25, tree), rtol=1e-12, atol=1e-12)
    assert launched == [{"BLOCK_N": block_n, "BLOCK_M": 16, "num_warps": 8, "num_stages": 4}]
    with pytest.raises(ValueError, match="block_n must be a power of two of at least 16; got 48"):
        AttentionTiles(48)


@pytest.mark.parametrize("target,dtype,rows", [(90, torch.bfloat16, 128), (90, torch.bfloat16, 4),
                                               (86, torch.bfloat16, 128), (80, torch.float16, 484),
                                               (80, torch.bfloat16, 64), (86, torch.float32, 128),
                                               (90, torch.float32, 128), (80, torch.float32, 32),
                                               (80, torch.float32, 4)])
def test_the_attention_compiles_for_ampere_and_hopper(target, dtype, rows, monkeypatch):
    """The attention's kernels as `attention` launches them on a cache [Hkv, C, 128] (unit dimension strides,
    aligned rows), compiled here for sm_80, sm_86 and sm_90 (a GPU-only failure, such as a type Triton's compiler
    refuses, shows without one): within each GPU's shared memory, the keys' and values' loads pipelined
    (cp.async), and on Hopper the half-precision blocks of 64+ rows on wgmma, the tensor-core instructions
    flash's kernels do not use there; and no thread spills registers to local memory (ptxas's report: a float32
    block of 64 rows on 4 warps spilled ~16 KB a thread)."""
    import longswift.runtime.triton_kernels as tk

    monkeypatch.delenv("TRITON_INTERPRET")
    k = tk._kernels(False)
    el = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]
    pointers = {"q": el, "keys": el, "values": el, "used_at": "i64", "tree": "i8", "part_out": "fp32",
                "part_lse": "fp32"}
    ints = ("q_head", "q_row", "k_head", "k_slot", "v_head", "v_slot", "rows", "new", "splits")
    block_m, params = tk.part_launch(dtype, rows, 128)
    part = compile_for(k.attention_part_kernel, target, {**{n: f"*{t}" for n, t in pointers.items()},
                                                         **{n: "i32" for n in ints}, "scale": "fp32"}, params,
                       ones=("q_dim", "k_dim", "v_dim"),
                       aligned=(*pointers, "q_head", "q_row", "k_head", "k_slot", "v_head", "v_slot"))
    assert part.metadata.shared <= SHARED_LIMIT[target], part.metadata.shared
    assert "cp.async" in part.asm["ptx"]
    half = dtype != torch.float32
    assert ("wgmma.mma_async" in part.asm["ptx"]) == (target == 90 and half and block_m >= 64)
    assert spilled_bytes(part, target) == 0
    merge = compile_for(k.attention_merge_kernel, target, {"part_out": "*fp32", "part_lse": "*fp32", "out": f"*{el}",
                                                           "out_head": "i32", "out_row": "i32", "rows": "i32",
                                                           "parts": "i32", "splits": "i32"},
                        {"D": 128, "BLOCK_D": 128, "BLOCK_P": tk.MERGE_BLOCK_P})
    assert merge.metadata.shared <= SHARED_LIMIT[target]
    assert spilled_bytes(merge, target) == 0


def test_the_element_wise_kernels_compile_for_a_gpu(monkeypatch):
    """rope_store and silu_mul as their wrappers launch them (CUDA's exp, no floating-point fusion), compiled here
    for sm_90, with no registers spilled."""
    import triton.language as tl

    import longswift.runtime.triton_kernels as tk

    monkeypatch.delenv("TRITON_INTERPRET")
    k = tk._kernels(False)
    rope = compile_for(k.rope_store_kernel, 90, {
        **{n: "*bf16" for n in ("qkv", "cos", "sin", "q_out", "k_out", "cache_k", "cache_v")}, "slots": "*i64",
        **{n: "i32" for n in ("qkv_row", "k_head", "k_slot", "k_dim", "v_head", "v_slot", "v_dim")}},
        {"H": 32, "HKV": 8, "D": 128, "BLOCK": 128, "FUSED": True, "ACC": tl.float32, "enable_fp_fusion": False})
    assert "fma.rn.f32" in rope.asm["ptx"]  # the addcmul's one fused multiply-add, explicit
    silu = compile_for(k.silu_mul_kernel, 90, {"gate_up": "*bf16", "out": "*bf16", "gate_up_row": "i32"},
                       {"INNER": 14336, "BLOCK": 1024, "ACC": tl.float32, "ACCURATE": True, "enable_fp_fusion": False})
    assert "div.rn.f32" in silu.asm["ptx"]  # the IEEE division
    # float64 (a model run in it with --triton-kernels): div_rn takes float32 only, and float64's `/` is IEEE
    silu64 = compile_for(k.silu_mul_kernel, 90, {"gate_up": "*fp64", "out": "*fp64", "gate_up_row": "i32"},
                         {"INNER": 14336, "BLOCK": 1024, "ACC": tl.float64, "ACCURATE": True,
                          "enable_fp_fusion": False})
    assert "div.rn.f64" in silu64.asm["ptx"]
    norm = compile_for(k.rms_norm_kernel, 90, {"x": "*bf16", "weight": "*bf16", "out": "*bf16", "x_row": "i32",
                                               "eps": "fp32"},
                       {"N": 4096, "BLOCK": 4096, "ONE_ROUNDING": True, "ACC": tl.float32, "ACCURATE": True,
                        "num_warps": 16, "enable_fp_fusion": False})
    # CUDA's rsqrtf, as torch's norms take it (libdevice's flushes subnormals, which mean + eps never is)
    assert re.search(r"rsqrt\.approx(\.ftz)?\.f32", norm.asm["ptx"])
    assert "div.rn.f32" in norm.asm["ptx"]  # the mean's IEEE division
    assert [spilled_bytes(kernel, 90) for kernel in (rope, silu, silu64, norm)] == [0, 0, 0, 0]


def test_one_compiled_merge_serves_every_part_count(monkeypatch):
    """The merge reads MERGE_BLOCK_P parts whatever the count attention_parts gives (up to 63, with the tree's
    part 64): no span's graph compiles another merge inside its capture. 63 parts and a tree still attend right."""
    import longswift.runtime.triton_kernels as tk

    blocks = record_launches(monkeypatch, "attention_merge_kernel", ("BLOCK_P",))
    g = torch.Generator().manual_seed(0)
    qg, keys, values = (torch.randn(1, 4, 16, generator=g, dtype=torch.float64) for _ in range(3))
    keys, values = (torch.randn(1, 600, 16, generator=g, dtype=torch.float64) for _ in range(2))
    tree = torch.tensor([[1, 0], [1, 1]], dtype=torch.bool)
    for parts, t in ((1, None), (40, tree), (63, None), (63, tree)):
        got = triton_attention(qg, keys, values, torch.tensor([590]), 0.25, t, parts)
        torch.testing.assert_close(got, attention_reference(qg, keys, values, 590, 0.25, t), rtol=1e-12, atol=1e-12)
    assert blocks == [{"BLOCK_P": tk.MERGE_BLOCK_P}] * 4


def test_the_merge_takes_its_rows_on_the_grids_first_axis(monkeypatch):
    """A GPU's grid takes at most 65,535 programs on its second and third axes: the merge's query rows (4 a node for
    Llama's GQA, so past 16,383 nodes) go on the first, its KV heads on the second."""
    grids = record_launches(monkeypatch, "attention_merge_kernel", ("grid",))
    g = torch.Generator().manual_seed(0)
    qg = torch.randn(2, 12, 16, generator=g, dtype=torch.float64)
    keys, values = (torch.randn(2, 40, 16, generator=g, dtype=torch.float64) for _ in range(2))
    got = triton_attention(qg, keys, values, torch.tensor([35]), 0.25, None, 2)
    torch.testing.assert_close(got, attention_reference(qg, keys, values, 35, 0.25, None), rtol=1e-12, atol=1e-12)
    assert grids == [{"grid": (12, 2)}]


@pytest.mark.parametrize("dtype,one_rounding", [(torch.float64, True), (torch.float32, True), (torch.float16, True),
                                                (torch.float16, False), (torch.bfloat16, True),
                                                (torch.bfloat16, False)])  # (float32 and float64: one op)
@pytest.mark.parametrize("rows,width,strided", [(3, 64, False), (1, 576, True), (4, 96, False), (0, 32, False),
                                               (2, 2880, True), (1, 16384, False)])
def test_rms_norm_normalises_as_the_models_norm(dtype, one_rounding, rows, width, strided):
    """The Triton RMSNorm against runtime.model.rms_norm (the same rounding: scaled then rounded once, as aten's
    fused norm and float32/float64; or rounded, then scaled): float16 to a unit up to 576 wide, float32 and
    float64 to their last bits (the mean's sum runs in another order), bfloat16 to the interpreter's truncating
    casts; rows of any stride (a wider tensor's first columns), 16 warps for 16,384."""
    from longswift.runtime.model import rms_norm

    g = torch.Generator().manual_seed(rows * width)
    x = (torch.randn(rows, width + 7 * strided, generator=g) * 3).to(dtype)[:, :width]
    weight = (torch.rand(width, generator=g) + 0.5).to(dtype)
    want = rms_norm(x, weight, 1e-5, fused=one_rounding)
    got = triton_rms_norm(x, weight, 1e-5, one_rounding)
    assert got.dtype == dtype and got.shape == (rows, width)
    eps = torch.finfo(dtype).eps
    if dtype == torch.float16 and width <= 576:  # the mean's float32 sum in another order than torch's (whose
        # order is the CPU's vector width): most values equal, none more than a float16 unit apart
        assert ((got.double() - want.double()).abs() <= eps * want.double().abs()).all()
        assert rows == 0 or (got == want).double().mean() >= 0.99
    elif dtype == torch.bfloat16:  # each of (up to) two roundings truncated, off by less than a unit
        assert ((got.double() - want.double()).abs() <= 2 * eps * want.double().abs()).all()
    else:  # the mean of thousands of squares summed in another order: a few units of float32 or float64 (and of
        # float16 from 2,880 wide); an eps left out shows in float64, 1e-6 relative here
        assert ((got.double() - want.double()).abs() <= 8 * eps * want.double().abs() + 1e-300).all()


def test_the_kernels_refuse_what_they_cannot_take():
    qkv, cos, sin = rope_case(torch.float32, 2)
    cache = torch.zeros(HKV, 8, D)
    with pytest.raises(ValueError, match=r"rope_store: qkv \(2, 128\) is not \[T, \(H \+ 2 Hkv\) D\]"):
        rope_store(qkv, cos, sin, torch.tensor([0, 1]), cache, cache, H + 1, HKV, False)
    with pytest.raises(ValueError, match="not .T, 2 I. with contiguous rows"):
        silu_mul(torch.zeros(4, 6).t())
    with pytest.raises(ValueError, match=r"rms_norm: x \(4, 6\) .* got a weight \(6,\) in torch.float64"):
        triton_rms_norm(torch.zeros(4, 6), torch.ones(6, dtype=torch.float64), 1e-5, True)
    used, eye = torch.tensor([3]), torch.eye(4, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"attention: queries \(2, 6, 16\) do not fit keys \(2, 8, 16\) and a tree "
                                         r"of \(4, 4\)"):
        triton_attention(torch.zeros(2, 6, 16), cache, cache, used, 0.25, eye)
    with pytest.raises(ValueError, match=r"and a tree of \(4, 8\)"):
        triton_attention(torch.zeros(2, 8, 16), cache, cache, used, 0.25, torch.ones(4, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"queries \(2, 4, 8\) do not fit keys \(2, 8, 16\)"):
        triton_attention(torch.zeros(2, 4, 8), cache, cache, used, 0.25)
    with pytest.raises(ValueError, match="queries in torch.float16, keys in torch.float32, values in torch.float32"):
        triton_attention(torch.zeros(2, 4, 16, dtype=torch.float16), cache, cache, used, 0.25)


def engine64(family: str = "llama", seed: int = 4, **kwargs):
    return longswift.load(tiny_hf_model(family, "default", seed=seed, **kwargs), device="cpu", dtype="float64",
                          heads="random")


def with_triton(engine) -> Transformer:
    model = engine.model
    return Transformer(model.cfg, model.state, triton_kernels=True)


@pytest.mark.parametrize("attention", ["bucketed", "length"])
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_step_bodies_with_the_kernels_equal_the_model_forward(family, attention, monkeypatch):
    """Decoding and a tree-verify pass through the step bodies with the Triton kernels equal the eager
    forward in float64, cache included (qwen2: q/k/v biases; qwen3: q/k norms, whose rope stays eager); the
    length bodies' attention in 3 parts (a CPU's spans take 1)."""
    import longswift.runtime.cuda_graphs as cg

    monkeypatch.setattr(cg, "attention_parts", lambda *args: 3)
    engine = engine64(family)
    model, cfg = with_triton(engine), engine.cfg
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, 128, (13,), generator=g)
    steps = torch.randint(0, 128, (12,), generator=g).tolist()
    eager, bodies = FullKVCache(cfg, 64, torch.float64, CPU), FullKVCache(cfg, 64, torch.float64, CPU)
    engine.model.prefill(prompt, eager, chunk=8)
    model.prefill(prompt, bodies, chunk=8)
    body = StepGraphs(model, bodies, capture=False, bucket=8, attention=attention)
    for i, token in enumerate(steps):
        want, want_hidden = engine.model.forward(torch.tensor([token]), torch.tensor([13 + i]), eager)
        got, got_hidden = body.decode(token, 13 + i)
        torch.testing.assert_close(got, want[0], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(got_hidden, want_hidden[0], rtol=1e-10, atol=1e-10)
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    tokens, positions = [5, 6, 7, 8], torch.tensor([25, 26, 26, 27])
    want, _ = engine.model.forward(torch.tensor(tokens), positions, eager, tree_mask=tree)
    got, _ = body.forward(tokens, positions, tree, logits=True)
    torch.testing.assert_close(got[:4], want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(bodies.k[:, :, :29], eager.k[:, :, :29], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(bodies.v[:, :, :29], eager.v[:, :, :29], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fused_rope", [False, True])
def test_float16_bodies_with_the_kernels_equal_the_eager_bodies_bit_for_bit(fused_rope):
    """In float16, which the interpreter rounds as torch does, a body with the rope and SwiGLU kernels is the eager
    body bit for bit, logits and cache, in either rope order: the body passes the model's order on (fused_rope).
    Bucketed: the length bodies attend through the Triton attention, its own sums (test_attention_*). Without the
    Triton norm: its mean's float32 sum runs in another order than torch's, whose order is the CPU's vector width
    (on an AVX-512 Xeon one tree row's norm came out a float16 unit apart, which an AMD EPYC's AVX2 sums did not
    show); test_rms_norm_normalises_as_the_models_norm holds it to that unit."""
    engine = longswift.load(tiny_hf_model("llama", "default", seed=5), dtype="float16", pack_weights=False)
    cfg, state = engine.cfg, engine.model.state
    models = [Transformer(cfg, state, fused_rope=fused_rope), Transformer(cfg, state, fused_rope=fused_rope,
                                                                          triton_kernels=True)]
    models[1].triton_norm = False
    prompt = torch.randint(0, 128, (11,), generator=torch.Generator().manual_seed(3))
    caches = [FullKVCache(cfg, 48, torch.float16, CPU) for _ in models]
    outs: list[list[torch.Tensor]] = [[], []]
    for model, cache, out in zip(models, caches, outs):
        model.prefill(prompt, cache, chunk=8)
        body = StepGraphs(model, cache, capture=False, bucket=8, attention="bucketed")
        for i, token in enumerate([7, 30, 2, 99]):
            out.append(body.decode(token, 11 + i)[0].clone())
        tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
        out.append(body.forward([4, 5, 6], torch.tensor([15, 16, 16]), tree, logits=True)[0][:3].clone())
    assert all(torch.equal(a, b) for a, b in zip(*outs))
    assert torch.equal(caches[0].k[:, :, :18], caches[1].k[:, :, :18])
    assert torch.equal(caches[0].v[:, :, :18], caches[1].v[:, :, :18])


@pytest.mark.parametrize("attention", ["bucketed", "length"])
def test_the_kernels_take_the_element_wise_ops_out_of_a_step_body(attention, monkeypatch):
    """A decoding body with the kernels runs none of the ops they replace: fused rope's roll, product and
    addcmul, the two index_copy_ into the cache, SwiGLU's silu and product, the two RMSNorms (9 kernels a layer
    on a GPU with fused norms, and the last norm; the kernels' own launches are no aten ops, and the interpreter's
    work inside them is not counted). A length body's attention is the Triton attention's, once a layer, with
    no aten op of its own."""
    import longswift.runtime.cuda_graphs as cg
    import longswift.runtime.model as model_mod
    from torch.utils._python_dispatch import _disable_current_modes

    def uncounted(fn):
        def run(*args, **kwargs):
            with _disable_current_modes():
                return fn(*args, **kwargs)
        return run

    monkeypatch.setattr(cg, "rope_store", uncounted(rope_store))
    monkeypatch.setattr(model_mod, "silu_mul", uncounted(silu_mul))
    monkeypatch.setattr(model_mod, "triton_rms_norm", uncounted(triton_rms_norm))
    calls = []
    monkeypatch.setattr(cg, "triton_attention", uncounted(lambda *a, **k: calls.append(1) or triton_attention(*a, **k)))
    engine = engine64()
    counts = {}
    for name, model in {"eager": Transformer(engine.cfg, engine.model.state, fused_rope=True),
                        "triton": Transformer(engine.cfg, engine.model.state, fused_rope=True,
                                              triton_kernels=True)}.items():
        cache = FullKVCache(engine.cfg, 32, torch.float64, CPU)
        model.prefill(torch.arange(3, 10), cache, chunk=8)
        body = StepGraphs(model, cache, capture=False, bucket=8, attention=attention)
        with torch.inference_mode(), OpCount() as ops:
            body.decode(11, 7)
        counts[name] = {op: n for op, n in ops.names.items() if not op.startswith("aten.empty")}
    layers = engine.cfg.num_layers
    for op in ("aten.roll", "aten.addcmul", "aten.index_copy_", "aten.silu", "aten.rms_norm"):
        assert op in counts["eager"] and op not in counts["triton"], op
    launches = {name: sum(n for op, n in c.items() if op not in VIEWS) for name, c in counts.items()}
    if attention == "bucketed":  # eager attention in both bodies
        assert not calls
        assert counts["eager"]["aten.mul"] - counts["triton"]["aten.mul"] == 2 * layers
        assert launches["eager"] - launches["triton"] == 9 * layers + 1
        return
    assert len(calls) == layers
    attending = {"aten.bmm", "aten.logsumexp", "aten.exp", "aten.masked_fill"}  # the CPU's explicit attention
    assert attending <= counts["eager"].keys() and not attending & counts["triton"].keys()
    # what is left besides the layers' linears, residual adds and the attention's reshape back: the rope table,
    # the embedding, the slots and the LM head
    per_layer = {"aten.linear": 7, "aten.add": 2, "aten.reshape": 1}
    rest = {op: n - layers * per_layer.get(op, 0) for op, n in counts["triton"].items() if op not in VIEWS}
    rest = {op: n for op, n in rest.items() if n}
    assert rest == {"aten.zeros": 1, "aten.eye": 1, "aten.fill_": 3, "aten.to": 4, "aten.mul": 3, "aten.cat": 5,
                    "aten.cos": 1, "aten.sin": 1, "aten.neg_": 1, "aten.arange": 1, "aten.add": 2,
                    "aten.embedding": 1, "aten.linear": 1}, rest


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=0, repetition_penalty=1.3, penalty_window=6),
                                      SamplingConfig(seed=3, min_p=0.05)], ids=["greedy-penalty", "sampled"])
@pytest.mark.parametrize("attention", ["bucketed", "length"])
def test_loops_through_bodies_with_the_kernels_still_emit_ar_output(attention, sampling, monkeypatch):
    """The CPU loops routed through the CUDA step bodies (eagerly), with the Triton kernels (length: the Triton
    attention too): AR and both TokenSwift modes (paper mode drafting on the partial cache) emit the plain CPU AR
    tokens (float64)."""
    import longswift.generate as generate_mod
    import longswift.spec.tokenswift as tokenswift_mod

    engine = engine64(seed=9, vocab=32)
    prompt = [5, 9, 17, 3, 5, 9, 17, 4, 5, 9, 17, 3] * 3
    gen = GenerationConfig(max_new_tokens=24, ignore_eos=True)  # (the interpreter takes ~40 ms a launch)
    want = engine.generate(prompt, method="ar", sampling=sampling, generation=gen).token_ids
    engine.model = with_triton(engine)
    engine.runtime = dataclasses.replace(engine.runtime, graph_attention=attention)
    import longswift.runtime.cuda_graphs as cg

    monkeypatch.setattr(cg, "attention_parts", lambda *args: 2)  # (a CPU's short spans would take 1)
    monkeypatch.setattr(generate_mod, "step_bodies", lambda model: True)
    monkeypatch.setattr(tokenswift_mod, "step_bodies", lambda model: True)
    assert engine.generate(prompt, method="ar", sampling=sampling, generation=gen).token_ids == want
    for spec in (SpecConfig(tree="2,2,2", ngram_topk=2, draft_kv_budget=30, draft_window=6, attention_sinks=4,
                            adaptive=False),
                 SpecConfig(tree="1,2,2", ngram_topk=2, draft_mode="fused", adaptive=False)):
        got = engine.generate(prompt, method="tokenswift", sampling=sampling, generation=gen, spec=spec)
        assert got.token_ids == want, spec


def test_the_kernels_are_refused_where_they_cannot_run(monkeypatch):
    engine = engine64()
    with pytest.raises(LongswiftError, match=r"triton_kernels needs a CUDA device"):
        RuntimeConfig(device="cpu", triton_kernels=True)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert triton_unavailable(CPU) == "the Triton kernels need a CUDA device (this model runs on cpu)"
    import longswift.engine as engine_mod

    monkeypatch.setattr(engine_mod, "load_model", lambda *a, **k: pytest.fail("loaded before the refusal"))
    if not torch.cuda.is_available():  # device auto on a machine without CUDA: refused before the weights load
        with pytest.raises(LongswiftError, match=r"^triton_kernels: the Triton kernels need a CUDA device \(this "
                                                 r"model runs on cpu\); leave it off$"):
            longswift.load(None, triton_kernels=True)
    with pytest.raises(LongswiftError, match=r"^triton_kernels \(--triton-kernels\): the Triton kernels need a CUDA "
                                             r"device \(this model runs on cpu\)$"):
        Transformer(engine.cfg, engine.model.state, triton_kernels=True)
    real_import = builtins.__import__

    def no_triton(name, *args, **kwargs):
        if name == "triton" or name.startswith("triton."):
            raise ImportError(f"No module named '{name}'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_triton)
    assert "need the triton package (pip install triton" in triton_unavailable(torch.device("cuda"))
    assert os.environ.get("TRITON_INTERPRET") is None


def test_the_option_is_recorded_in_checkpoints_and_a_resume_runs_the_engines_kernels():
    """A checkpoint records whether its run had the kernels; a resume continues with the engine's own, either
    way (as on another device: the kernels change rounding, not the model; `generate --resume` keeps the
    checkpoint's setting, and leaves it behind with the run when --device moves it off CUDA)."""
    hf = tiny_hf_model("llama", "default", seed=4)
    plain = longswift.load(hf, dtype="float64", heads="random")
    fused = longswift.load(hf, dtype="float64", heads="random", triton_kernels=True)  # device auto: the CPU here
    assert fused.model.triton_kernels and not plain.model.triton_kernels
    gen, sampling = GenerationConfig(max_new_tokens=12, ignore_eos=True), SamplingConfig(seed=7)
    whole = plain.generate([5, 9, 17, 3], sampling=sampling, generation=gen, method="ar").token_ids
    for made, resumed in ((plain, fused), (fused, plain)):
        stream = made.stream([5, 9, 17, 3], sampling=sampling, generation=gen, method="ar")
        steps = iter(stream)
        for _ in range(4):
            next(steps)
        ckpt = stream.checkpoint()
        assert ckpt.runtime["triton_kernels"] is made.model.triton_kernels
        rest = resumed.resume(ckpt)
        list(rest)
        assert rest.result.token_ids == whole  # (float64: the kernels' rounding is far below any logit gap here)
