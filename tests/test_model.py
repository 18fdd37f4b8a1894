"""Our runner's logits against transformers' for every supported family and rope type."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.nn.functional as F
from conftest import Calls, OpCount, needs_fused_rms_norm, tiny_hf_model, ulps

import longswift
from longswift.runtime.cache import FullKVCache
from longswift.runtime.linear import colocate, packed_linear, packing_supported, row_blocks
from longswift.runtime.memory import plan_memory
from longswift.runtime.model import Transformer

CPU = torch.device("cpu")

CASES = [
    ("llama", "default", False),
    ("llama", "default", True),
    ("llama", "linear", False),
    ("llama", "dynamic", False),
    ("llama", "llama3", False),
    ("llama", "yarn", True),
    ("mistral", "default", False),
    ("qwen2", "default", True),
    ("qwen2", "yarn", False),
    ("qwen3", "default", False),
    ("qwen3", "llama3", True),
]
CTX = 32  # the trained context these tests give the tiny models
SEQ = 80  # past it


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("pack", [False, True], ids=["plain", "packed"])
@pytest.mark.parametrize("arch,rope,tie", CASES, ids=[f"{a}-{r}-{'tied' if t else 'untied'}" for a, r, t in CASES])
def test_full_forward_matches_transformers(arch, rope, tie, pack):
    hf = tiny_hf_model(arch, rope, tie, max_position_embeddings=CTX)
    engine = longswift.load(hf, dtype="float32", pack_weights=pack)
    ids = torch.randint(0, hf.config.vocab_size, (SEQ,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    cache = FullKVCache(engine.cfg, SEQ, torch.float32, torch.device("cpu"))
    with torch.inference_mode():
        ours, hidden = engine.model.forward(ids, torch.arange(SEQ), cache)
        no_cache, _ = engine.model.forward(ids, torch.arange(SEQ), None)
    assert hidden.shape == (SEQ, hf.config.hidden_size)
    assert rel_err(ours, ref) < 1e-4
    assert rel_err(no_cache, ref) < 1e-4


FIELDS_NOT_READ = [("mistral", {"attention_bias": True}), ("mistral", {"mlp_bias": True}),
                   ("qwen2", {"mlp_bias": True}), ("qwen3", {"mlp_bias": True}), ("llama", {"hidden_act": "swish"}),
                   ("qwen2", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 2})]


@pytest.mark.parametrize("arch,fields", FIELDS_NOT_READ, ids=[f"{a}-{next(iter(f))}" for a, f in FIELDS_NOT_READ])
def test_config_fields_that_transformers_does_not_apply_are_not_applied(arch, fields):
    """A mistral's bias fields and a qwen's mlp_bias, which their classes never read, had the load look for bias
    tensors and refuse the checkpoint; "swish" (SiLU) was refused; a qwen window from layer 2 of 2 (none) refused
    runs longer than the window. Each now loads, runs transformers' forward and keeps the full context."""
    hf = tiny_hf_model(arch, "default", seed=4, dtype=torch.float64, max_position_embeddings=CTX, **fields)
    engine = longswift.load(hf, dtype="float64")
    assert engine.cfg.sliding_window is None
    ids = torch.randint(0, hf.config.vocab_size, (SEQ,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
        ours, _ = engine.model.forward(ids, torch.arange(SEQ), None)
    assert rel_err(ours, ref) < 1e-5  # (transformers' norms round in float32)


def test_a_qwen_window_from_a_layer_the_model_has_is_kept():
    hf = tiny_hf_model("qwen2", "default", use_sliding_window=True, sliding_window=8, max_window_layers=1)
    assert longswift.load(hf, dtype="float32").cfg.sliding_window == 8


@pytest.mark.parametrize("arch,rope,tie", [c for c in CASES if c[1] != "dynamic"],
                         ids=[f"{a}-{r}" for a, r, t in CASES if r != "dynamic"])
def test_chunked_prefill_and_decode_match_full_forward(arch, rope, tie):
    """Chunked prefill then one token at a time gives the full forward's logits at every position.
    (Dynamic NTK is excluded by design: its frequencies depend on the length of each call.)"""
    hf = tiny_hf_model(arch, rope, tie, seed=3, max_position_embeddings=CTX)
    engine = longswift.load(hf, dtype="float32")
    ids = torch.randint(0, hf.config.vocab_size, (SEQ,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    cache = FullKVCache(engine.cfg, SEQ, torch.float32, torch.device("cpu"))
    prompt = 45
    with torch.inference_mode():
        last, _ = engine.model.prefill(ids[:prompt], cache, chunk=16)
        steps = [last]
        for p in range(prompt, SEQ - 1):
            logits, _ = engine.model.forward(ids[p : p + 1], torch.tensor([p]), cache)
            steps.append(logits[0])
    assert cache.length == SEQ - 1
    assert rel_err(torch.stack(steps), ref[prompt - 1 : SEQ - 1]) < 1e-4


@pytest.mark.parametrize("arch,rope,tie", CASES, ids=[f"{a}-{r}-{'tied' if t else 'untied'}" for a, r, t in CASES])
def test_float64_runner_matches_transformers_closely(arch, rope, tie):
    """Every architecture and rope in float64, where float32's bound (1e-4) would hide a small error
    (a review measured 6-9e-7 in float32; an RMSNorm eps of 1e-5 for 1e-6 moved it to about 1e-3)."""
    hf = tiny_hf_model(arch, rope, tie, dtype=torch.float64, max_position_embeddings=CTX)
    engine = longswift.load(hf, dtype="float64")
    assert not engine.model.packed
    ids = torch.arange(SEQ) % hf.config.vocab_size
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
        ours, _ = engine.model.forward(ids, torch.arange(SEQ), None)
    # Rope tables are float32 in both implementations; the rest is float64. (Measured 2.4-3.9e-7 over these cases, and
    # 6-9e-7 in float32: the bound was 1e-6 against the reference rounded to float32, which a float32 run passed.)
    assert ours.dtype == torch.float64 and rel_err(ours, ref) < 5e-7


def test_transformers_model_weights_are_used_in_place():
    hf = tiny_hf_model("llama", "default")
    engine = longswift.load(hf, dtype="float32")  # default for a model object: no packed copies
    assert not engine.model.packed
    name = "model.layers.0.self_attn.q_proj.weight"
    assert engine.model.state[name].data_ptr() == hf.state_dict()[name].data_ptr()


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_onednn_attention_path_matches_transformers(arch):
    """The packed path switches attention to oneDNN matmuls for long contexts; force it on here."""
    hf = tiny_hf_model(arch, "yarn", seed=9, max_position_embeddings=CTX)
    engine = longswift.load(hf, dtype="float32", pack_weights=True)
    if not engine.model.packed:
        pytest.skip("no oneDNN in this torch build")
    engine.model.attention.onednn_from = 0
    ids = torch.randint(0, hf.config.vocab_size, (SEQ,), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    cache = FullKVCache(engine.cfg, SEQ, torch.float32, torch.device("cpu"))
    with torch.inference_mode():
        last, _ = engine.model.prefill(ids[:50], cache, chunk=16)
        steps = [last]
        for p in range(50, SEQ - 1):
            logits, _ = engine.model.forward(ids[p : p + 1], torch.tensor([p]), cache)
            steps.append(logits[0])
    assert rel_err(torch.stack(steps), ref[49 : SEQ - 1]) < 1e-4


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # qwen2: q/k/v biases
def test_colocated_linears_match_transformers_with_fewer_ops_and_no_copy(arch):
    """Where oneDNN packing does not exist (CUDA; here float64 on CPU), pack_weights stores each
    layer's q/k/v and gate/up weights as row blocks of one matrix: one product each instead of
    three and two plus a concatenation (5 kernels a layer fewer on a GPU), the same logits,
    and the state's weights are views of those matrices, so no second copy is kept."""
    hf = tiny_hf_model(arch, "default", max_position_embeddings=CTX, dtype=torch.float64)
    ids = torch.randint(0, hf.config.vocab_size, (SEQ,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    ops, logits = {}, {}
    for pack in (False, True):
        model = longswift.load(hf, dtype="float64", pack_weights=pack).model
        assert model.colocated == pack and not model.packed
        cache = FullKVCache(model.cfg, SEQ, torch.float64, torch.device("cpu"))
        with OpCount() as count:
            logits[pack], _ = model.forward(ids, torch.arange(SEQ), cache)
        assert rel_err(logits[pack], ref) < 1e-6, pack  # rope tables are float32 in both implementations
        ops[pack] = count
    torch.testing.assert_close(logits[True], logits[False], rtol=1e-12, atol=1e-12)
    layers = hf.config.num_hidden_layers

    def products(count: OpCount) -> int:  # F.linear dispatches as mm (addmm with a bias) after a view
        return count.names.get("aten.mm", 0) + count.names.get("aten.addmm", 0)

    assert products(ops[False]) - products(ops[True]) == 3 * layers  # 5 products a layer -> 2
    assert ops[False].names["aten.cat"] - ops[True].names.get("aten.cat", 0) == 2 * layers
    state = model.state
    for n in range(layers):
        for group in (["q", "k", "v"], ["gate", "up"]):
            where = "self_attn" if group[0] == "q" else "mlp"
            names = [f"model.layers.{n}.{where}.{x}_proj.weight" for x in group]
            whole = row_blocks([state[name] for name in names])
            assert whole is not None and whole.shape[0] == sum(state[name].shape[0] for name in names)
            hf_weights = [hf.get_parameter(name) for name in names]
            assert torch.equal(whole, torch.cat(hf_weights))
            before = [state[name].data_ptr() for name in names]
            colocate(state, names)  # already colocated: left as it is
            assert [state[name].data_ptr() for name in names] == before


def test_colocate_leaves_separate_weights_alone_until_asked():
    a, b = torch.randn(3, 4), torch.randn(2, 4)
    assert row_blocks([a, b]) is None
    state = {"a": a, "b": b}
    colocate(state, ["a", "b"])
    whole = row_blocks([state["a"], state["b"]])
    assert whole is not None and torch.equal(whole, torch.cat([a, b]))
    assert row_blocks([state["b"], state["a"]]) is None  # blocks out of order are not one matrix


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_fused_norm_rounds_once_within_one_ulp_of_transformers(dtype):
    """fused_norm (the default on CUDA): RMSNorm in a reduced dtype as one op that scales by the
    weight in float32 and rounds once, where transformers rounds the normalised x and then scales
    in the reduced dtype: the first is within half a unit in the last place of the float32 product,
    the second within one and a half, so they differ by at most one unit."""
    needs_fused_rms_norm()
    hf = tiny_hf_model("llama", "default", dtype=dtype)
    model = longswift.load(hf, dtype=str(dtype).removeprefix("torch."), pack_weights=False).model
    assert not model.fused_norm  # the CPU default keeps transformers' rounding
    x = 3 * torch.randn(64, hf.config.hidden_size, generator=torch.Generator().manual_seed(0)).to(dtype)
    w = model.layers[0].attn_norm
    eps = hf.config.rms_norm_eps
    twice = model.norm(x, w)
    ref = hf.model.layers[0].input_layernorm(x)
    assert torch.equal(twice, ref)  # transformers' own op order, bit for bit
    model.fused_norm = True
    once = model.norm(x, w)
    assert once.dtype == dtype
    assert torch.equal(once, (torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), eps=eps) * w.float()).to(dtype))
    assert (ulps(once, ref) <= 1).all()
    assert not torch.equal(once, ref)  # the test sees the difference it bounds


@pytest.mark.parametrize("arch", ["llama", "qwen3"])  # qwen3: q and k norms too
def test_a_fused_norm_is_one_call_and_keeps_the_logits(arch):
    """Each RMSNorm of a bfloat16 forward is one call with the weight (on CUDA one kernel: aten's
    fused RMSNorm) instead of four (up-cast, norm, down-cast, scale): 6 calls fewer per layer (12 with
    q/k norms) and 3 for the final norm; the logits stay as close to a float64 run as transformers' are."""
    needs_fused_rms_norm()
    import copy

    hf = tiny_hf_model(arch, "default", dtype=torch.bfloat16, max_position_embeddings=CTX)
    ids = torch.randint(0, hf.config.vocab_size, (SEQ,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        exact = copy.deepcopy(hf).double()(ids[None]).logits[0]
    model = longswift.load(hf, dtype="bfloat16", pack_weights=False).model
    calls, logits = {}, {}
    for fused in (False, True):
        model.fused_norm = fused
        with torch.inference_mode(), Calls() as count:
            logits[fused], _ = model.forward(ids, torch.arange(SEQ), None)
        calls[fused] = count.names
        assert rel_err(logits[fused].double(), exact) < 0.05, fused  # bfloat16's rounding, not an error
    norms = hf.config.num_hidden_layers * (4 if arch == "qwen3" else 2) + 1
    assert calls[True]["rms_norm"] == calls[False]["rms_norm"] == norms
    assert sum(calls[False].values()) - sum(calls[True].values()) == 3 * norms
    assert not torch.equal(logits[True], logits[False])


def unfused_case(dtype: torch.dtype, **overrides):
    """A tiny llama in `dtype`, SEQ random ids, the float64 logits of the same weights, and our model
    of it with the CPU defaults (no fused kernels) -> (hf, ids, exact logits, model)."""
    import copy

    hf = tiny_hf_model("llama", "default", dtype=dtype, max_position_embeddings=CTX, **overrides)
    ids = torch.randint(0, hf.config.vocab_size, (SEQ,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        exact = copy.deepcopy(hf).double()(ids[None]).logits[0]
    model = longswift.load(hf, dtype=str(dtype).removeprefix("torch."), pack_weights=False).model
    assert not (model.fused_norm or model.fused_residual or model.fused_rope)  # the CPU defaults
    return hf, ids, exact, model


def forward_calls(models: dict, ids: torch.Tensor) -> tuple[dict, dict]:
    """Each named model's forward of ids without a cache -> (its torch calls by name, its logits)."""
    calls, logits = {}, {}
    for name, model in models.items():
        with torch.inference_mode(), Calls() as count:
            logits[name], _ = model.forward(ids, torch.arange(len(ids)), None)
        calls[name] = count.names
    return calls, logits


@pytest.mark.parametrize("arch,dtype", [("llama", torch.float64), ("llama", torch.bfloat16), ("biased", torch.float64)])
def test_a_residual_added_in_the_product_keeps_the_logits_in_fewer_calls(arch, dtype):
    """fused_residual (the default on CUDA in a reduced dtype): o_proj and down_proj add into the
    residual in their product (one in-place addmm_, one GEMM on CUDA, instead of a product and an
    add): 2 calls fewer a
    layer, 1 where o_proj has a bias (which stays a product and an add); the same logits in float64,
    bfloat16's rounding otherwise."""
    from longswift.runtime.model import Transformer

    hf, ids, exact, base = unfused_case(dtype, attention_bias=arch == "biased")
    fused = Transformer(base.cfg, base.state, fused_residual=True)
    assert fused.fused_residual
    calls, logits = forward_calls({"base": base, "fused": fused}, ids)
    layers = hf.config.num_hidden_layers
    saved = layers * (1 if arch == "biased" else 2)
    assert calls["fused"].get("addmm_", 0) == saved  # in place: out of place, addmm would copy the residual first
    assert sum(calls["base"].values()) - sum(calls["fused"].values()) == saved
    if dtype == torch.float64:
        torch.testing.assert_close(logits["fused"], logits["base"], rtol=1e-12, atol=1e-12)
        assert rel_err(logits["fused"], exact) < 1e-6
    else:
        assert not torch.equal(logits["fused"], logits["base"])
        assert rel_err(logits["fused"].double(), exact) < 0.05  # bfloat16's rounding, as the separate add's
        assert rel_err(logits["base"].double(), exact) < 0.05


@pytest.mark.parametrize("rope", ["default", "linear", "dynamic", "llama3", "yarn"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_tables_are_transformers_far_past_the_trained_context(rope, dtype):
    """cos and sin at positions far past the trained context (32) are transformers' own, bit for bit: the
    forwards above reach position 80 only, where a table computed in another order or dtype still rounds alike."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    hf = tiny_hf_model("llama", rope, max_position_embeddings=CTX)
    model = longswift.load(hf, dtype="float32").model
    for positions in (torch.tensor([0, 31, 32, 33]), torch.tensor([99_999, 131_071, 131_072, 1_000_003])):
        cos, sin = LlamaRotaryEmbedding(hf.config)(torch.zeros(1, 1, dtype=dtype), positions[None])  # [1, T, D], fresh
        ours_cos, ours_sin = model.rope.cos_sin(positions, int(positions.max()), dtype)  # [T, 1, D], first half of
        half = ours_sin.shape[-1] // 2  # the sine negated
        assert torch.equal(ours_cos[:, 0], cos[0]), positions
        assert torch.equal(torch.cat([-ours_sin[:, 0, :half], ours_sin[:, 0, half:]], -1), sin[0]), positions


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_rope_with_its_second_product_in_the_sum_keeps_the_logits_in_fewer_calls(dtype):
    """fused_rope (the default on CUDA in a reduced dtype): rope's x * cos + roll(x) * sin as a product
    and one addcmul (3 kernels on CUDA instead of 4, the sum rounded once): one call fewer a layer,
    the same logits in float64, bfloat16's rounding otherwise; the defaults on the CPU stay off."""
    from longswift.runtime.model import Transformer
    from longswift.runtime.rope import apply_rope

    hf, ids, exact, base = unfused_case(dtype)
    calls, logits = forward_calls({"base": base, "fused": Transformer(base.cfg, base.state, fused_rope=True)}, ids)
    layers = hf.config.num_hidden_layers
    assert calls["fused"].get("addcmul", 0) == layers and "addcmul" not in calls["base"]
    assert sum(calls["base"].values()) - sum(calls["fused"].values()) == layers
    if dtype == torch.float64:
        torch.testing.assert_close(logits["fused"], logits["base"], rtol=1e-12, atol=1e-12)
        assert rel_err(logits["fused"], exact) < 1e-6
    else:
        assert rel_err(logits["fused"].double(), exact) < 0.05  # bfloat16's rounding, as the separate ops'
        x = torch.randn(5, 6, 16, generator=torch.Generator().manual_seed(2)).to(dtype)
        cos, sin = base.rope.cos_sin(torch.arange(5), 0, dtype)
        once, twice = apply_rope(x, cos, sin, fused=True), apply_rope(x, cos, sin)
        assert not torch.equal(once, twice)
        exact_rope = apply_rope(x.double(), cos.double(), sin.double())
        bound = 2 * torch.finfo(dtype).eps * float(x.double().abs().max())  # two roundings of terms this size
        assert float((once.double() - exact_rope).abs().max()) <= bound
        assert float((twice.double() - exact_rope).abs().max()) <= bound


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_packed_linear_gives_back_its_weights_bit_for_bit(dtype):
    """Packing reorders a weight's values into oneDNN's blocked layout and computes nothing, so the
    weights it was made from come back exactly; that is what lets a packed model drop them."""
    if not packing_supported(dtype, CPU):
        pytest.skip(f"this torch build has no oneDNN packing for {dtype}")
    g = torch.Generator().manual_seed(5)
    weights = [torch.randn(rows, 40, generator=g).to(dtype) for rows in (24, 8, 8)]  # q/k/v-like blocks
    linear, packed = packed_linear(weights, [None, None, None])
    assert packed.weight.is_mkldnn and packed.rows == (24, 8, 8)
    back = packed.unpacked()
    assert len(back) == 3
    for w, b in zip(weights, back):
        assert b.layout == torch.strided and b.dtype == dtype and torch.equal(b, w)
    x = torch.randn(3, 40, generator=g).to(dtype)
    torch.testing.assert_close(linear(x), torch.cat([F.linear(x, w) for w in weights], dim=-1))


@pytest.mark.parametrize("arch,tie", [("llama", False), ("llama", True), ("qwen2", False)],
                         ids=["untied", "tied", "qwen2-biases"])
def test_a_packed_model_lets_the_original_weights_go_and_gives_them_back(arch, tie):
    """Packed, each linear weight lives once, in its packed copy: the state dict's tensor is freed,
    `full_state()` gives back the loaded state bit for bit, and a model built from that state
    computes the same logits."""
    hf = tiny_hf_model(arch, "default", tie, seed=41, max_position_embeddings=CTX)
    plain = longswift.load(hf, dtype="float32", pack_weights=False).model
    state = {k: v.clone() for k, v in plain.state.items()}
    down = weakref.ref(state["model.layers.0.mlp.down_proj.weight"])
    head = weakref.ref(state["lm_head.weight"]) if not tie else None
    model = Transformer(plain.cfg, state, pack=True)
    assert model.packed
    linears = {k for k in plain.state if k.endswith("_proj.weight")} | ({"lm_head.weight"} if not tie else set())
    assert set(model.unpacked) == linears
    assert not linears & set(model.state)  # the embedding, norms and biases stay
    assert "model.embed_tokens.weight" in model.state
    gc.collect()
    assert down() is None  # nothing holds the original any more
    assert head is None or head() is None  # nor an untied LM head's
    full = model.full_state()
    assert set(full) == set(plain.state)
    for name, tensor in plain.state.items():
        assert torch.equal(full[name], tensor), name
        assert torch.equal(model.state_tensor(name), tensor), name
    ids = torch.randint(0, plain.cfg.vocab_size, (12,), generator=torch.Generator().manual_seed(3))
    again = Transformer(plain.cfg, full, pack=True)
    with torch.inference_mode():
        torch.testing.assert_close(again.forward(ids, torch.arange(12), None)[0],
                                   model.forward(ids, torch.arange(12), None)[0], rtol=0, atol=0)
        torch.testing.assert_close(model.forward(ids, torch.arange(12), None)[0],
                                   plain.forward(ids, torch.arange(12), None)[0], rtol=1e-5, atol=1e-5)


def test_a_packed_model_loaded_from_safetensors_keeps_no_file_sized_storage(tmp_path):
    """The tensors a packed model keeps (embedding, norms) must own storages of their own size: were
    they views of one file-sized buffer (a safetensors load that slices a mapping), that buffer, and
    with it every weight the packed copies replaced, would stay resident."""
    tiny_hf_model("llama", "default", False, seed=43, max_position_embeddings=CTX).save_pretrained(tmp_path)
    model = longswift.load(str(tmp_path), dtype="float32", pack_weights=True).model
    assert model.packed and model.unpacked
    for name, tensor in model.state.items():
        assert tensor.untyped_storage().nbytes() == tensor.nbytes, name


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_the_memory_plan_counts_what_a_packed_model_holds(tie):
    """The plan's weights and weight copies are the bytes a packed model keeps: its state dict's
    storages and its packed weights (the tied LM head's packed copy being the one extra)."""
    hf = tiny_hf_model("llama", "default", tie, seed=42, max_position_embeddings=CTX)
    model = longswift.load(hf, dtype="float32", pack_weights=True).model
    assert model.packed
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in model.state.values()}
    assert len(model.packed_copies) == 4 * model.cfg.num_layers + 1  # q/k/v, o, gate/up, down; the head
    dropped = {id(p) for p, _ in model.unpacked.values()}  # every copy but a tied head's replaced its weight
    assert dropped <= {id(p) for p in model.packed_copies} and len(dropped) == len(model.packed_copies) - tie
    held = sum(storages.values()) + sum(p.weight.numel() * p.weight.element_size() for p in model.packed_copies)
    plan = plan_memory(model.cfg, torch.float32, CPU, 64, 16, packed=True)
    assert held == plan.weights + plan.packed_weights
    assert plan.packed_weights == (model.cfg.vocab_size * model.cfg.hidden_size * 4 if tie else 0)


def test_prefill_returns_the_last_tokens_logits_and_hidden_state():
    """prefill's hidden state is the last prompt token's (fused drafting and a resumed TokenSwift run start
    their heads from it), whatever the chunking: the first row of the last chunk (hidden[0]) changed no
    output, TokenSwift verifying every draft, and only drafted worse."""
    engine = longswift.load(tiny_hf_model("llama", seed=4, max_position_embeddings=CTX), dtype="float32")
    ids = torch.randint(0, 128, (45,), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        logits, hidden = engine.model.forward(ids, torch.arange(45), None)
        for chunk in (16, 45, 64):  # last chunks of 13 and 45 tokens
            cache = FullKVCache(engine.cfg, 45, torch.float32, CPU)
            last, h = engine.model.prefill(ids, cache, chunk=chunk)
            assert h.shape == (engine.cfg.hidden_size,) and last.shape == (128,)
            assert rel_err(h, hidden[-1]) < 1e-5 and rel_err(last, logits[-1]) < 1e-5, chunk
