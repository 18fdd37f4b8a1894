"""TokenSwift's released checkpoints (draft heads inside the model, `model.medusa_layers.*`): loading
them as they are, the paper's model list against transformers and the reference head code,
Hugging Face model ids from the standard cache, and `export-heads` round trips."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_one_line_error, run_cli, tiny_hf_model
from test_lossless import repetitive_prompt

import longswift
from longswift import GenerationConfig, SamplingConfig, SpecConfig
from longswift.errors import LongswiftError
from longswift.spec.heads import new_heads, save_heads, training_record

GAMMA = 3
PREFIX = "model.medusa_layers."


def released_tensors(hidden: int, dtype: torch.dtype, seed: int) -> dict[str, torch.Tensor]:
    """Random heads in the released layout (norm weights away from 1, so every term counts)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i in range(GAMMA):
        out[f"{PREFIX}{i}.linear.weight"] = (torch.randn(hidden, hidden, generator=g) / hidden**0.5).to(dtype)
        out[f"{PREFIX}{i}.input_layernorm.weight"] = (1 + 0.2 * torch.randn(hidden, generator=g)).to(dtype)
        out[f"{PREFIX}{i}.post_layernorm.weight"] = (1 + 0.2 * torch.randn(hidden, generator=g)).to(dtype)
    return out


def save_released(hf, path, seed: int = 5, drop: str | None = None, change: dict | None = None) -> dict:
    """Save `hf` as TokenSwift's released checkpoints are: an HF directory whose config has
    medusa_heads and whose safetensors hold the heads next to the base tensors."""
    from safetensors.torch import load_file, save_file

    hf.save_pretrained(path)
    heads = released_tensors(hf.config.hidden_size, next(hf.parameters()).dtype, seed)
    state = load_file(str(path / "model.safetensors")) | heads
    if drop:
        state.pop(drop)
    state |= change or {}
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(cfg | {"medusa_heads": GAMMA}))
    return heads


def reference_heads(h0: torch.Tensor, tensors: dict, eps: float) -> list[torch.Tensor]:
    """TokenSwift 0.1.1 models/modeling_llama3_1.py (MedusaModel, LlamaRMSNorm), restated: h_0 is the
    last decoder layer's output before model.norm; each head returns post_layernorm(h_i)."""
    def rms(x, w):
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return w * x.to(dtype)

    h, outs = h0, []
    for i in range(GAMMA):
        p = f"{PREFIX}{i}."
        h = h + F.linear(rms(h, tensors[p + "input_layernorm.weight"]), tensors[p + "linear.weight"])
        outs.append(rms(h, tensors[p + "post_layernorm.weight"]))
    return outs


# The released checkpoints' architectures, as tiny random models of the same config family.
PAPER_MODELS = {
    "llama-3.1-8b": dict(arch="llama", rope="llama3", tie=False),
    "yarn-llama-2-7b-128k": dict(arch="llama", rope="default", tie=False, max_position_embeddings=131072,
                                 rope_scaling={"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
                                               "finetuned": True}, rope_theta=10000.0),
    "qwen2.5-1.5b": dict(arch="qwen2", rope="default", tie=True, max_position_embeddings=32768, rope_theta=1e6),
    "qwen2.5-7b": dict(arch="qwen2", rope="default", tie=False, max_position_embeddings=32768, rope_theta=1e6),
    "deepseek-r1-distill-qwen-32b": dict(arch="qwen2", rope="default", tie=False, max_position_embeddings=131072,
                                         rope_theta=1e6, sliding_window=131072, use_sliding_window=False),
}


def paper_model(name: str, dtype=torch.float64, seed: int = 41, vocab: int = 24):
    kw = dict(PAPER_MODELS[name])
    arch, rope, tie = kw.pop("arch"), kw.pop("rope"), kw.pop("tie")
    if "rope_scaling" in kw or "rope_theta" in kw:  # the checkpoint's own (legacy) config keys
        scaling, theta = kw.pop("rope_scaling", None), kw.pop("rope_theta")
        kw["rope_parameters"] = {"rope_type": scaling["type"], **scaling, "rope_theta": theta} if scaling else \
            {"rope_type": "default", "rope_theta": theta}
    return tiny_hf_model(arch, rope, tie, seed=seed, dtype=dtype, vocab=vocab, **kw)


def pre_norm_hidden(hf, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' logits and the input of its final norm (the hidden state the heads read)."""
    seen = {}

    def keep(module, args):
        seen["h"] = args[0][0]  # returns None: the input is left as it is

    hook = hf.model.norm.register_forward_pre_hook(keep)
    with torch.no_grad():
        logits = hf(ids[None]).logits[0]
    hook.remove()
    return logits, seen["h"]


@pytest.mark.parametrize("name", PAPER_MODELS)
def test_paper_models_in_the_released_layout_match_transformers_and_the_reference_heads(tmp_path, name):
    """Base logits vs transformers and each head's logits vs the reference head code, float64;
    then TokenSwift with the checkpoint's own heads equals AR (greedy and seeded sampling)."""
    hf = paper_model(name)
    tensors = save_released(hf, tmp_path)
    engine = longswift.load(str(tmp_path), dtype="float64")
    assert engine.heads is not None and "inside the model checkpoint" in engine.heads_origin
    ids = torch.tensor(repetitive_prompt(1, 24, 40))
    ref_logits, ref_h0 = pre_norm_hidden(hf, ids)
    with torch.inference_mode():
        logits, hidden = engine.model.forward(ids, torch.arange(len(ids)), None)
        head_logits = engine.model.lm_head(engine.heads(hidden))  # [gamma, T, V]
    assert float((logits - ref_logits).abs().max() / ref_logits.abs().max()) < 1e-6
    assert float((hidden - ref_h0).abs().max() / ref_h0.abs().max()) < 1e-6
    with torch.no_grad():
        for i, state in enumerate(reference_heads(ref_h0, tensors, hf.config.rms_norm_eps)):
            ref = hf.lm_head(state)
            assert float((head_logits[i] - ref).abs().max() / ref.abs().max()) < 1e-6, i

    spec = SpecConfig(tree="1,3,3,3", ngram_topk=4, adaptive=False)
    gen = GenerationConfig(max_new_tokens=40, ignore_eos=True)
    for sampling in (SamplingConfig(temperature=0, repetition_penalty=1.15, penalty_window=16),
                     SamplingConfig(seed=7, top_p=0.9, min_p=0.0, repetition_penalty=1.15, penalty_window=16)):
        prompt = repetitive_prompt(2, 24)
        ar = engine.generate(prompt, sampling=sampling, generation=gen, method="ar")
        ts = engine.generate(prompt, sampling=sampling, generation=gen, spec=spec)  # tokenswift: it has heads
        assert ts.stats.method == "tokenswift" and ts.token_ids == ar.token_ids


def test_released_bfloat16_heads_load_bit_for_bit_and_run_like_the_reference(tmp_path):
    """Released checkpoints are bfloat16: heads keep their bits, and the norms multiply the weight in
    the model dtype after a float32 normalisation, as the reference's LlamaRMSNorm does."""
    hf = paper_model("llama-3.1-8b", dtype=torch.bfloat16)
    tensors = save_released(hf, tmp_path)
    engine = longswift.load(str(tmp_path), dtype="bfloat16")
    for i in range(GAMMA):
        assert torch.equal(engine.heads.weights[i], tensors[f"{PREFIX}{i}.linear.weight"])
        assert torch.equal(engine.heads.in_norms[i], tensors[f"{PREFIX}{i}.input_layernorm.weight"])
        assert torch.equal(engine.heads.out_norms[i], tensors[f"{PREFIX}{i}.post_layernorm.weight"])
    h0 = torch.randn(8, hf.config.hidden_size, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ours = engine.heads(h0)
    for i, ref in enumerate(reference_heads(h0, tensors, hf.config.rms_norm_eps)):
        assert ref.dtype == ours.dtype == torch.bfloat16
        # F.rms_norm vs the reference's mean/rsqrt may differ in a float32 last bit before rounding.
        assert float((ours[i].float() - ref.float()).abs().max()) <= 2 ** -6 * float(ref.float().abs().max()), i


def test_yarn_128k_frequencies_match_the_reference_formula():
    """Yarn-Llama-2-7b-128k: the reference (modeling_llama2.py, LlamaYaRNRotaryEmbedding) computes its
    own YaRN tables; ours come from transformers. Same frequencies and attention factor."""
    from transformers import AutoConfig

    from longswift.config import ModelConfig
    from longswift.runtime.rope import Rope

    hf = AutoConfig.for_model("llama", hidden_size=4096, num_attention_heads=32, num_hidden_layers=1, vocab_size=32000,
                              intermediate_size=11008, max_position_embeddings=131072, rope_theta=10000.0,
                              rope_scaling={"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
                                            "finetuned": True})
    rope = Rope(ModelConfig.from_hf(hf), torch.device("cpu"))
    dim, base, factor, orig = 128, 10000, 32.0, 4096
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)

    def corr(rot):
        return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

    low, high = max(math.floor(corr(32)), 0), min(math.ceil(corr(1)), dim - 1)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    mask = 1 - ramp
    inv = (1.0 / (factor * pos_freqs)) * (1 - mask) + (1.0 / pos_freqs) * mask
    assert torch.allclose(rope.inv_freq, inv, rtol=1e-6, atol=0)
    assert rope.scaling == pytest.approx(0.1 * math.log(factor) + 1.0)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_released_checkpoint_loads_its_heads_and_is_lossless(tmp_path, arch):
    hf = tiny_hf_model(arch, "yarn", seed=31, dtype=torch.float64, vocab=24)
    tensors = save_released(hf, tmp_path)
    engine = longswift.load(str(tmp_path), dtype="float64")  # heads: auto
    got = engine.heads.state_dict()
    for i in range(GAMMA):
        assert torch.equal(got["weights"][i], tensors[f"{PREFIX}{i}.linear.weight"])
        assert torch.equal(got["in_norms"][i], tensors[f"{PREFIX}{i}.input_layernorm.weight"])
        assert torch.equal(got["out_norms"][i], tensors[f"{PREFIX}{i}.post_layernorm.weight"])
    assert not any(k.startswith(PREFIX) for k in engine.model.state)
    gen = GenerationConfig(max_new_tokens=40, ignore_eos=True)
    accepted = 0
    for seed, sampling in enumerate((SamplingConfig(temperature=0, repetition_penalty=1.0),
                                     SamplingConfig(seed=3, min_p=0.05))):
        prompt = repetitive_prompt(seed, 24)
        ar = engine.generate(prompt, sampling=sampling, generation=gen, method="ar")
        ts = engine.generate(prompt, sampling=sampling, generation=gen, method="tokenswift",
                             spec=SpecConfig(tree="1,3,3,3", ngram_topk=4, adaptive=False))
        assert ts.token_ids == ar.token_ids
        accepted += ts.stats.accepted_tokens
    assert accepted > 0
    assert longswift.load(str(tmp_path), dtype="float64", heads="none").heads is None


def test_released_heads_inside_a_gguf(tmp_path):
    from test_loading import write_gguf

    hf = tiny_hf_model("llama", "default", seed=8)
    tensors = released_tensors(64, torch.float32, seed=2)
    write_gguf(tmp_path / "m.gguf", hf, "llama", extra=tensors)
    engine = longswift.load(str(tmp_path / "m.gguf"), dtype="float32")
    assert engine.heads is not None and engine.heads.gamma == GAMMA
    assert torch.equal(engine.heads.weights[2], tensors[f"{PREFIX}2.linear.weight"])


def test_heads_inside_a_gguf_export_as_stored_from_a_bfloat16_run(tmp_path, capsys):
    """export-heads --dtype bfloat16 (auto's on CUDA) of a GGUF's own heads wrote the run's bfloat16 rounding of
    them, where a released directory's and a heads file's are read again as stored."""
    from safetensors.torch import load_file
    from test_loading import write_gguf

    tensors = released_tensors(64, torch.float32, seed=2)
    write_gguf(tmp_path / "m.gguf", tiny_hf_model("llama", "default", seed=8), "llama", extra=tensors)
    code, _, err = run_cli(capsys, "export-heads", "--model", str(tmp_path / "m.gguf"), "--dtype", "bfloat16",
                           "--out", str(tmp_path / "h.safetensors"))
    assert code == 0, err
    got = load_file(str(tmp_path / "h.safetensors"))
    for i in range(GAMMA):
        assert torch.equal(got["weights"][i], tensors[f"{PREFIX}{i}.linear.weight"]), i
        assert torch.equal(got["in_norms"][i], tensors[f"{PREFIX}{i}.input_layernorm.weight"]), i
        assert torch.equal(got["out_norms"][i], tensors[f"{PREFIX}{i}.post_layernorm.weight"]), i


@pytest.mark.parametrize("bad", ["nan", "int32"])
def test_a_released_directorys_nan_or_integer_heads_are_refused_in_one_line(tmp_path, capsys, bad):
    """--heads DIR (a released checkpoint beside the model) read its heads unchecked, where the model's own are:
    NaN heads loaded and drafted nothing, and integer tensors were cast to the heads' dtype without a word."""
    hf = tiny_hf_model("llama", "default")
    hf.save_pretrained(tmp_path / "base")
    weight = torch.zeros(64, 64, dtype=torch.int32) if bad == "int32" else torch.zeros(64, 64)
    weight[3, 5] = 7 if bad == "int32" else float("nan")
    save_released(hf, tmp_path / "rel", change={f"{PREFIX}1.linear.weight": weight})
    capsys.readouterr()  # transformers' save progress bar
    code, _, err = run_cli(capsys, "generate", "--model", str(tmp_path / "base"), "--heads", str(tmp_path / "rel"),
                           "--prompt-ids", "1,2,3", "--max-new-tokens", "2")
    said = ("holds torch.int32 values in 'model.medusa_layers.1.linear.weight'" if bad == "int32"
            else "hold NaN or infinite values in 'model.medusa_layers.1.linear.weight'")
    assert_one_line_error(code, err, said)


def test_released_heads_of_mixed_dtypes_keep_every_value(tmp_path):
    """The heads took their first tensor's dtype: a bfloat16 norm stored first rounded every float32 weight
    after it to bfloat16 (safetensors keeps names sorted: input_layernorm comes first)."""
    hf = tiny_hf_model("llama", "default", seed=3)
    hf.save_pretrained(tmp_path / "base")
    first = f"{PREFIX}0.input_layernorm.weight"
    norm = released_tensors(64, torch.float32, seed=5)[first].to(torch.bfloat16)
    tensors = save_released(hf, tmp_path / "rel", change={first: norm})
    engine = longswift.load(str(tmp_path / "base"), dtype="float32", heads=str(tmp_path / "rel"))
    assert torch.equal(engine.heads.in_norms[0], norm.float())
    for i in range(GAMMA):
        assert torch.equal(engine.heads.weights[i], tensors[f"{PREFIX}{i}.linear.weight"]), i


BROKEN = {
    "missing": (dict(drop=f"{PREFIX}1.post_layernorm.weight"), f"'{PREFIX}1.post_layernorm.weight' is missing"),
    "shape": (dict(change={f"{PREFIX}0.linear.weight": torch.zeros(64, 32)}), f"'{PREFIX}0.linear.weight' has shape (64, 32)"),
    "bias": (dict(change={f"{PREFIX}2.linear.bias": torch.zeros(64)}), f"unexpected tensor '{PREFIX}2.linear.bias'"),
    "extra-head": (dict(change={f"{PREFIX}3.linear.weight": torch.zeros(64, 64)}), f"'{PREFIX}3.linear.weight'"),
}


@pytest.mark.parametrize("case", BROKEN, ids=BROKEN.keys())
def test_partial_or_ill_shaped_heads_are_refused_in_one_line(tmp_path, capsys, case):
    kwargs, match = BROKEN[case]
    save_released(tiny_hf_model("llama", "default"), tmp_path, **kwargs)
    capsys.readouterr()  # transformers' save progress bar
    code, _, err = run_cli(capsys, "generate", "--model", str(tmp_path), "--prompt-ids", "1,2,3", "--max-new-tokens", "2")
    assert_one_line_error(code, err, match)
    code, _, err = run_cli(capsys, "info", "--model", str(tmp_path))
    assert_one_line_error(code, err, match)


# -- Hugging Face model ids ------------------------------------------------------------------------

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(root, repo_id: str):
    """A cache directory in huggingface_hub's layout (models--org--name/refs/main -> snapshots/<commit>/)."""
    from huggingface_hub.file_download import repo_folder_name

    repo = root / repo_folder_name(repo_id=repo_id, repo_type="model")
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    return snapshot


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    """HF_HUB_CACHE at a fresh directory, offline, and any Hub API call fails the test."""
    import huggingface_hub

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def no_network(*a, **k):
        raise AssertionError("a network call was made")

    monkeypatch.setattr(huggingface_hub.HfApi, "repo_info", no_network)
    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_tree", no_network)
    return cache


def test_hub_id_resolves_from_the_cache_offline(offline_cache, tmp_path, capsys):
    snapshot = hub_cache(offline_cache, "tiny-org/tiny-released")
    hf = tiny_hf_model("qwen2", "default", seed=12)
    tensors = save_released(hf, snapshot)
    for source in ("tiny-org/tiny-released", f"tiny-org/tiny-released@{COMMIT}", "tiny-org/tiny-released@main"):
        engine = longswift.load(source, dtype="float32")
        assert engine.source == str(snapshot) and engine.hub_id == source
        assert torch.equal(engine.heads.weights[0], tensors[f"{PREFIX}0.linear.weight"])
    ids = torch.arange(20) % 128
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
        ours, _ = engine.model.forward(ids, torch.arange(20), None)
    assert float((ours - ref).abs().max() / ref.abs().max()) < 1e-4
    code, out, _ = run_cli(capsys, "info", "--model", "tiny-org/tiny-released")
    assert code == 0 and f"model: {snapshot}" in out and "3 heads inside the model checkpoint" in out
    from longswift.spec.released import describe_heads  # (their count, for the checks before loading)

    assert describe_heads("tiny-org/tiny-released", "auto", engine.cfg).gamma == 3


def test_hub_id_for_heads_checks_the_base_model(offline_cache, tmp_path, capsys):
    """`--heads org/name` reads a released checkpoint's heads for a base model loaded separately."""
    hf = tiny_hf_model("llama", "default", seed=13)
    tensors = save_released(hf, hub_cache(offline_cache, "tiny-org/released"))
    base = tmp_path / "base"
    hf.save_pretrained(base)
    engine = longswift.load(str(base), dtype="float32")
    assert engine.heads is None  # a plain base model: no heads of its own, none shipped
    engine.set_heads("tiny-org/released")
    assert torch.equal(engine.heads.out_norms[1], tensors[f"{PREFIX}1.post_layernorm.weight"])
    assert "from the released checkpoint" in engine.heads_origin
    from longswift.spec.released import describe_heads  # (their count, for the checks before loading)

    assert describe_heads(str(base), "tiny-org/released", engine.cfg).gamma == 3
    other = tmp_path / "other"
    tiny_hf_model("llama", "default", seed=14).save_pretrained(other)
    capsys.readouterr()
    code, _, err = run_cli(capsys, "generate", "--model", str(other), "--heads", "tiny-org/released",
                           "--prompt-ids", "1,2", "--max-new-tokens", "2")
    assert_one_line_error(code, err, "were made for another model")


def test_hub_id_under_hf_home(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot = hub_cache(tmp_path / "home" / "hub", "org2/base")
    tiny_hf_model("llama", "default").save_pretrained(snapshot)
    assert longswift.load("org2/base", dtype="float32").source == str(snapshot)


def test_missing_hub_model_is_one_line(offline_cache, capsys):
    code, _, err = run_cli(capsys, "generate", "--model", "tiny-org/not-there", "--prompt-ids", "1", "--max-new-tokens", "1")
    assert_one_line_error(code, err, "not in the Hugging Face cache")
    assert "hf download tiny-org/not-there" in err
    code, _, err = run_cli(capsys, "info", "--model", "tiny-org/not-there@v2")
    assert_one_line_error(code, err, "--revision v2")


@pytest.mark.parametrize("keep", ["config.json", "model.safetensors"])
def test_a_partly_downloaded_hub_model_is_called_so(offline_cache, capsys, keep):
    """The cache keeps the files that finished downloading: a snapshot with config.json and no weights (or
    weights and no config) was refused as a folder that is not a model, with no word of the download."""
    snapshot = hub_cache(offline_cache, "tiny-org/partial")
    tiny_hf_model("llama", "default").save_pretrained(snapshot)
    for f in snapshot.iterdir():
        if f.name != keep:
            f.unlink()
    capsys.readouterr()  # (save_pretrained's progress bar)
    code, _, err = run_cli(capsys, "info", "--model", "tiny-org/partial@main")
    missing = ".safetensors weights" if keep == "config.json" else "config.json"
    assert_one_line_error(code, err, f"snapshot of 'tiny-org/partial@main' ({snapshot}) has no {missing}: "
                                     "an interrupted download? get it again with `hf download tiny-org/partial "
                                     "--revision main`")


@pytest.mark.parametrize("flag", ["--model", "--heads"])
def test_a_mistyped_local_path_is_not_blamed_on_the_hub(offline_cache, capsys, tmp_path, monkeypatch, flag):
    """`runs/heads-typo` reads as a Hub id `org/name`; where `runs` is a local folder the error says
    first that the local path does not exist, not to download it from the Hub."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    code, _, err = run_cli(capsys, "generate", flag, "runs/typo", "--prompt-ids", "1", "--max-new-tokens", "1")
    assert_one_line_error(code, err, "'runs/typo' does not exist (folder 'runs' has no 'typo'), and as a Hugging "
                                     "Face id it is not in the Hugging Face cache and HF_HUB_OFFLINE is set: check "
                                     "the path")


def test_local_paths_are_not_taken_for_hub_ids(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org").mkdir()
    tiny_hf_model("llama", "default").save_pretrained(tmp_path / "org" / "name")
    assert longswift.load("org/name", dtype="float32").hub_id is None
    capsys.readouterr()
    code, _, err = run_cli(capsys, "info", "--model", "./nothing/here")
    assert_one_line_error(code, err, "does not exist")


# -- export-heads ------------------------------------------------------------------------------------

def test_export_tokenswift_layout_round_trips_bit_for_bit(tmp_path, capsys):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    hf = tiny_hf_model("qwen2", "default", tie=True, seed=17)
    base = tmp_path / "base"
    hf.save_pretrained(base)
    # its generation config stops at one more id than config.json names (Llama 3 Instruct's <|eot_id|>)
    (base / "generation_config.json").write_text(json.dumps({"eos_token_id": [hf.config.eos_token_id, 7]}))
    engine = longswift.load(str(base), dtype="float32", heads=None)
    heads = new_heads(engine.cfg, engine.model.state).randomize(seed=4)
    with torch.no_grad():
        heads.in_norms.mul_(1.1)
    save_heads(heads, engine.cfg, heads.base_fingerprint, tmp_path / "heads.safetensors",
               {"training": {"windows": 5}})
    saved = load_file(str(tmp_path / "heads.safetensors"))
    out = tmp_path / "released"
    killed = tmp_path / ".longswift-3v9q_x1z.partial"  # what an export killed by kill -9 leaves: marked, unlocked
    killed.mkdir()
    (killed / ".longswift-writing").write_text("")
    (killed / "model.safetensors").write_bytes(b"x" * 100)
    capsys.readouterr()
    code, _, err = run_cli(capsys, "export-heads", "--model", str(base), "--heads", str(tmp_path / "heads.safetensors"),
                           "--format", "tokenswift", "--out", str(out))
    assert code == 0, err
    assert not killed.exists() and f"removed '{killed}', left by a run that was killed" in err
    assert json.loads((out / "config.json").read_text())["medusa_heads"] == GAMMA
    assert longswift.load(str(out), heads=None).cfg.eos_token_ids == engine.cfg.eos_token_ids == (
        hf.config.eos_token_id, 7)  # (the export wrote no generation config: it stopped at the first only)
    from transformers import GenerationConfig

    assert GenerationConfig.from_pretrained(str(out)).eos_token_id == [hf.config.eos_token_id, 7]
    assert load_file(str(out / "model.safetensors"))[f"{PREFIX}2.linear.weight"].dtype == torch.float32
    loaded = longswift.load(str(out), dtype="float32")
    for k, v in loaded.heads.state_dict().items():
        assert torch.equal(v, saved[k]), k
    # transformers still reads the directory as the base model (the heads are extra keys to it).
    again = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).state_dict()
    for k, v in hf.state_dict().items():
        assert torch.equal(again[k], v), k
    # and back: the released directory's heads as a longswift heads file for the base model
    killed = tmp_path / "back.safetensors.a1b2c3d4.partial"
    killed.write_bytes(b"x" * 100)
    code, _, err = run_cli(capsys, "export-heads", "--model", str(out), "--format", "longswift",
                           "--out", str(tmp_path / "back.safetensors"))
    assert code == 0, err
    assert not killed.exists() and f"removed '{killed}', left by a run that was killed" in err
    back = longswift.load(str(base), dtype="float32", heads=str(tmp_path / "back.safetensors"))
    for k, v in back.heads.state_dict().items():
        assert torch.equal(v, saved[k]), k
    # the heads' training record survives the round trip (kept in the directory's config.json), whether the
    # directory is the model or names the heads of another copy of the base model
    assert json.loads((out / "config.json").read_text())["longswift_heads_training"] == {"windows": 5}
    assert training_record(tmp_path / "back.safetensors") == {"windows": 5}
    code, _, err = run_cli(capsys, "export-heads", "--model", str(base), "--heads", str(out),
                           "--out", str(tmp_path / "back2.safetensors"))
    assert code == 0 and training_record(tmp_path / "back2.safetensors") == {"windows": 5}, err
    # exported from the directory by a bfloat16 engine (auto's dtype on CUDA), as the directory and a heads file
    # are exported: the values stored, not the engine's bfloat16 rounding of them
    for i, argv in enumerate((("--model", str(out)), ("--model", str(base), "--heads", str(out)))):
        code, _, err = run_cli(capsys, "export-heads", *argv, "--dtype", "bfloat16",
                               "--out", str(tmp_path / f"bf16-{i}.safetensors"))
        assert code == 0, err
        exported = load_file(str(tmp_path / f"bf16-{i}.safetensors"))
        assert all(torch.equal(exported[k], v) for k, v in saved.items()), argv
    for argv in (("--model", str(out)), ("--model", str(base), "--heads", str(out))):  # and info says so
        code, info, err = run_cli(capsys, "info", *argv)
        assert code == 0 and "TokenSwift layout" in info and "; on 5 windows" in info, err
    capsys.readouterr()
    code, _, err = run_cli(capsys, "export-heads", "--model", str(base), "--heads", str(tmp_path / "heads.safetensors"),
                           "--out", str(out))
    assert_one_line_error(code, err, "is a directory that is not empty")
    # an --out ending in .safetensors is a heads file (it was a 540 MB directory of that name), which keeps the
    # heads' training record; the file being exported is never its own --out
    code, _, err = run_cli(capsys, "export-heads", "--model", str(base), "--heads", str(tmp_path / "heads.safetensors"),
                           "--out", str(tmp_path / "copy.safetensors"))
    assert code == 0 and (tmp_path / "copy.safetensors").is_file(), err
    assert training_record(tmp_path / "copy.safetensors") == {"windows": 5}
    code, _, err = run_cli(capsys, "export-heads", "--model", str(base), "--heads", str(tmp_path / "copy.safetensors"),
                           "--out", str(tmp_path / "copy.safetensors"))
    assert_one_line_error(code, err, f"'{tmp_path / 'copy.safetensors'}' exists: choose a new --out")
    # nor is any other heads file (hours of training) replaced: it replaced another run's heads silently
    before = (tmp_path / "copy.safetensors").read_bytes()
    code, _, err = run_cli(capsys, "export-heads", "--model", str(base), "--heads", "random",
                           "--out", str(tmp_path / "copy.safetensors"))
    assert_one_line_error(code, err, "exists: choose a new --out, or remove that file first to replace it")
    assert (tmp_path / "copy.safetensors").read_bytes() == before
    # a model run in bfloat16 holds the heads rounded; the heads file exports its own values
    code, _, err = run_cli(capsys, "export-heads", "--model", str(base), "--heads", str(tmp_path / "heads.safetensors"),
                           "--dtype", "bfloat16", "--out", str(tmp_path / "bf16.safetensors"))
    assert code == 0, err
    rounded = load_file(str(tmp_path / "bf16.safetensors"))
    assert all(torch.equal(rounded[k], v) for k, v in saved.items() if v.is_floating_point()), "rounded on export"


@pytest.mark.parametrize("command", ["generate", "info", "eval-heads", "export-heads"])
def test_a_directory_without_heads_is_refused_as_heads(tmp_path, capsys, command):
    """An empty directory (a train-heads --out stopped before its first checkpoint, say) as --heads was read
    as a model directory ("has no config.json: pass an HF model directory"), and `info` called it a released
    checkpoint."""
    (tmp_path / "empty").mkdir()
    extra = {"generate": ["--prompt", "hi"], "export-heads": ["--out", str(tmp_path / "out")]}.get(command, [])
    code, _, err = run_cli(capsys, command, "--heads", str(tmp_path / "empty"), *extra)
    assert_one_line_error(code, err, f"heads '{tmp_path / 'empty'}' is a directory without heads.safetensors or a "
                                     "released checkpoint (config.json): pass a heads file")


def test_info_reports_which_heads_and_where(tmp_path, capsys):
    save_released(tiny_hf_model("llama", "default"), tmp_path)
    code, out, _ = run_cli(capsys, "info", "--model", str(tmp_path))
    assert code == 0 and f"draft heads: 3 heads inside the model checkpoint ({PREFIX}0..2, TokenSwift layout) {tmp_path}" in out
    code, out, _ = run_cli(capsys, "info", "--model", str(tmp_path), "--heads", "none")
    assert code == 0 and "draft heads: none (AR)" in out
    code, out, _ = run_cli(capsys, "info")
    assert code == 0 and "draft heads: heads shipped with longswift for this model" in out


def test_info_says_a_model_folder_without_heads_given_as_heads_is_refused(tmp_path, capsys):
    """`info --heads DIR` with a plain model folder called it "the released checkpoint DIR" and planned a
    TokenSwift run, where generate refuses it ("has no draft heads")."""
    tiny_hf_model("llama", "default").save_pretrained(tmp_path / "plain")
    tiny_hf_model("llama", "default").save_pretrained(tmp_path / "m")
    code, out, _ = run_cli(capsys, "info", "--model", str(tmp_path / "m"), "--heads", str(tmp_path / "plain"))
    assert code == 0 and f"draft heads: '{tmp_path / 'plain'}' has no draft heads (no {PREFIX}* tensors and no " \
        "heads.safetensors): generate refuses it" in out
    code, _, err = run_cli(capsys, "generate", "--model", str(tmp_path / "m"), "--heads", str(tmp_path / "plain"),
                           "--prompt-ids", "1,2", "--max-new-tokens", "2")
    assert_one_line_error(code, err, "has no draft heads")


def test_info_reads_a_heads_files_metadata(tmp_path, capsys):
    """`info --heads FILE` says how many heads, whether they were made for this model, and how they were
    trained, from the file's header; a file generate would refuse is reported, not loaded."""
    for name, seed, overrides in (("m", 9, {}), ("twin", 10, {}), ("wide", 9, {"hidden_size": 32})):
        tiny_hf_model("llama", seed=seed, **overrides).save_pretrained(tmp_path / name)
    engine = longswift.load(str(tmp_path / "m"), dtype="float32", heads=None)
    heads = new_heads(engine.cfg, engine.model.state).randomize(seed=4)
    training = {"training": {"config": {"steps": 7}, "windows": 12,
                             "final": {"step": 7, "head_acc": [0.5, 0.25, 0.125]}}}
    save_heads(heads, engine.cfg, heads.base_fingerprint, tmp_path / "heads.safetensors", training)
    (tmp_path / "other.safetensors").write_bytes(b"not a safetensors file")
    capsys.readouterr()
    expect = {"m": "3 heads, made for this model; trained 7 steps on 12 windows, final training accuracy per head "
                   "0.500, 0.250, 0.125",
              "twin": "3 heads, made for another model (embedding weights differ): generate refuses them; trained 7",
              "wide": "3 heads, made for another model (hidden_size 64 vs 32): generate refuses them; trained 7"}
    for model, said in expect.items():
        code, out, err = run_cli(capsys, "info", "--model", str(tmp_path / model), "--heads",
                                 str(tmp_path / "heads.safetensors"))
        assert code == 0, err
        assert f"draft heads: from the heads file {tmp_path / 'heads.safetensors'}: {said}" in out, out
    code, out, err = run_cli(capsys, "info", "--model", str(tmp_path / "m"), "--heads",
                             str(tmp_path / "other.safetensors"))
    assert code == 0 and "draft heads: from the heads file" in out, err
    assert "unreadable (" in out and "generate refuses it" in out
    code, out, err = run_cli(capsys, "info", "--model", str(tmp_path / "m"), "--heads", str(tmp_path))  # --heads DIR
    assert code == 0 and f"from the heads file {tmp_path / 'heads.safetensors'}: {expect['m']}" in out, err


def test_bench_runs_a_released_checkpoint_with_its_own_heads(tmp_path, capsys):
    """bench's --heads default is generate's 'auto': a released checkpoint's TokenSwift methods run on its
    heads (they were skipped as having no heads when bench's default took shipped heads only)."""
    save_released(tiny_hf_model("llama", "default"), tmp_path / "m")
    capsys.readouterr()
    code, _, err = run_cli(capsys, "bench", "--model", str(tmp_path / "m"), "--threads", "1", "--no-warmup",
                           "--methods", "ar,tokenswift", "--prefix", "12", "--lengths", "6", "--out-dir",
                           str(tmp_path / "b"))
    assert code == 0, err
    runs = [json.loads(line) for line in (tmp_path / "b" / "results.jsonl").read_text().splitlines()]
    assert sorted(r["method"] for r in runs) == ["ar", "tokenswift"]
    assert json.loads((tmp_path / "b" / "config.json").read_text())["identity"]["heads"] == "auto"


def test_bench_tells_heads_retrained_into_the_same_file_apart(tmp_path, capsys):
    """A results directory of --heads FILE records the heads' weights: heads retrained into that file do not
    resume the old heads' runs (they were taken as done, and the report showed the old heads' speed)."""
    tiny_hf_model("llama", seed=9).save_pretrained(tmp_path / "m")
    engine = longswift.load(str(tmp_path / "m"), dtype="float32", heads=None)
    path = tmp_path / "heads.safetensors"
    argv = ["bench", "--model", str(tmp_path / "m"), "--heads", str(path), "--threads", "1", "--no-warmup",
            "--methods", "tokenswift", "--prefix", "12", "--lengths", "4", "--out-dir", str(tmp_path / "b")]
    for seed, expect in ((4, "1 runs to do"), (4, "0 runs to do"), (5, "differs in: heads_digest")):
        heads = new_heads(engine.cfg, engine.model.state).randomize(seed=seed)
        save_heads(heads, engine.cfg, heads.base_fingerprint, path)
        capsys.readouterr()
        code, _, err = run_cli(capsys, *argv)
        assert expect in err and code == (2 if seed == 5 else 0), err


def test_a_sigterm_while_exporting_leaves_nothing_behind(tmp_path, capsys, monkeypatch):
    """export-heads stopped by SIGTERM left a hidden half-written directory (a model's size) inside or beside
    --out, which no later run removed; like Ctrl-C, it now stops at once, removes it and exits 128 + 15."""
    import os
    import signal

    import safetensors.torch

    base = tmp_path / "base"
    tiny_hf_model("llama", seed=3).save_pretrained(base)
    real = safetensors.torch.save_file

    def killed_while_writing(tensors, path, metadata=None):
        real(tensors, path, metadata=metadata)
        os.kill(os.getpid(), signal.SIGTERM)  # as `kill` from outside, once the big file is written

    monkeypatch.setattr(safetensors.torch, "save_file", killed_while_writing)
    handler = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "export"
    code, _, err = run_cli(capsys, "export-heads", "--model", str(base), "--heads", "random", "--out", str(out))
    assert code == 128 + signal.SIGTERM and "interrupted" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base"]  # no --out, no .longswift-*.partial
    assert signal.getsignal(signal.SIGTERM) == handler  # the command's handler is gone with it


def test_a_hub_download_takes_the_files_a_load_reads_and_not_mistrals_consolidated_copy():
    """snapshot_download's patterns over Mistral-7B-Instruct-v0.3's listing: the shards, index, config and tokenizer;
    not consolidated.safetensors, a second copy of the model (14.5 GB) in mistral-inference's names, nor .bin/.pt."""
    from huggingface_hub.utils import filter_repo_objects

    from longswift.runtime.loading.hub import ALLOW_PATTERNS, IGNORE_PATTERNS

    listing = [".gitattributes", "README.md", "config.json", "consolidated.safetensors", "generation_config.json",
               "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
               "model-00003-of-00003.safetensors", "model.safetensors.index.json", "params.json",
               "special_tokens_map.json", "tokenizer.json", "tokenizer.model", "tokenizer.model.v3",
               "tokenizer_config.json", "pytorch_model.bin", "consolidated.00.pth"]
    kept = set(filter_repo_objects(listing, allow_patterns=ALLOW_PATTERNS, ignore_patterns=IGNORE_PATTERNS))
    assert kept == {"config.json", "generation_config.json", "model-00001-of-00003.safetensors",
                    "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors",
                    "model.safetensors.index.json", "params.json", "special_tokens_map.json", "tokenizer.json",
                    "tokenizer.model", "tokenizer.model.v3", "tokenizer_config.json"}


def test_heads_past_float16s_range_are_refused_in_a_float16_run(tmp_path):
    """A review: every heads source checks its values as read, but a float32 weight past float16's range (65,504)
    became infinite in a float16 run, whose drafts were then worthless (the output stays the model's). Each source
    (an object, a heads file, a released directory) is now checked before the cast, as a model's weights are."""
    from longswift.spec.heads import DraftHeads

    hf = tiny_hf_model("llama", "default", seed=3)
    heads = longswift.load(hf, dtype="float32", heads="random").heads
    big = copy.deepcopy(heads)
    with torch.no_grad():
        big.weights[1, 2, 3] = 1e5
    assert isinstance(big, DraftHeads)
    past = r"hold values up to 1e\+05 in '{}', past float16's range"
    with pytest.raises(LongswiftError, match=past.format("weights")):
        longswift.load(hf, dtype="float16", heads=big)
    save_heads(big, longswift.load(hf, dtype="float32", heads=None).cfg, big.base_fingerprint,
               tmp_path / "big.safetensors")
    with pytest.raises(LongswiftError, match=past.format("weights")):
        longswift.load(hf, dtype="float16", heads=str(tmp_path / "big.safetensors"))
    hf.save_pretrained(tmp_path / "base")
    weight = released_tensors(64, torch.float32, seed=5)[f"{PREFIX}1.linear.weight"]
    weight[2, 3] = 1e5
    save_released(hf, tmp_path / "rel", change={f"{PREFIX}1.linear.weight": weight})
    with pytest.raises(LongswiftError, match=past.format(f"{PREFIX}1.linear.weight")):
        longswift.load(str(tmp_path / "base"), dtype="float16", heads=str(tmp_path / "rel"))
    assert longswift.load(hf, dtype="float16", heads=heads).heads is not None  # within range: taken
    assert longswift.load(hf, dtype="bfloat16", heads=big).heads is not None  # bfloat16 holds 1e5


def test_a_checkpoints_fingerprint_reads_the_embeddings_corner_alone(tmp_path, monkeypatch):
    """The fingerprint hashes a 512 x 64 corner of the embedding: the whole table (an 8B model's, 2 GB as float32)
    was read for it, by `info` and as a released checkpoint's heads loaded."""
    import safetensors

    from conftest import tiny_hf_model

    from longswift.runtime.loading import EMBED, embed_corner, read_embed_corner

    hf = tiny_hf_model("llama", seed=4, vocab=600)
    hf.save_pretrained(tmp_path)
    whole = []
    real = safetensors.safe_open

    class Spy:
        def __init__(self, *args, **kwargs):
            self.inner = real(*args, **kwargs)

        def __enter__(self):
            self.st = self.inner.__enter__()
            return self

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)

        def keys(self):
            return self.st.keys()

        def get_slice(self, name):
            return self.st.get_slice(name)

        def get_tensor(self, name):
            whole.append(name)
            return self.st.get_tensor(name)

    monkeypatch.setattr(safetensors, "safe_open", Spy)
    corner = read_embed_corner(tmp_path)
    assert torch.equal(corner, embed_corner(hf.state_dict()[EMBED])) and corner.shape == (512, 64)
    assert whole == []
