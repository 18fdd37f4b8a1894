"""Shared fixtures: tiny random-weight transformers models of every supported family, and the
embedded SmolLM2 model (loaded once per session)."""

from __future__ import annotations

import os

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def pytest_configure(config):
    """Under pytest-xdist (the README's test command runs a worker per core) each worker runs on one thread, and so
    does every process a test starts: two workers of two threads each on two cores, or a test's subprocess beside
    the other worker, ran OpenMP's threads by turns (an interrupted and resumed generation took 190 s, alone 41)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        torch.set_num_threads(1)


ROPES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32},
}


def tiny_hf_model(arch: str = "llama", rope: str = "default", tie: bool = False, seed: int = 0,
                  dtype: torch.dtype = torch.float32, vocab: int = 128, **overrides):
    """A 2-layer random model (GQA 4:2, head_dim 16, trained context 256 unless overridden) with every weight,
    norms and biases included, drawn at random so that no term of the forward is trivial."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                  rope_parameters=dict(ROPES[rope]), tie_word_embeddings=tie, rms_norm_eps=1e-6,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if arch == "llama":
        kwargs["attention_bias"] = overrides.pop("attention_bias", False)
    if arch == "mistral":
        kwargs["sliding_window"] = None
    kwargs.update(overrides)
    cfg = AutoConfig.for_model(arch, **kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
    return model.eval()


class OpCount(TorchDispatchMode):
    """Counts the aten ops run under it: each is a kernel launch (or a view) on a GPU."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.names: dict[str, int] = {}  # per op name, e.g. "aten.linear"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        name = str(func.overloadpacket)
        self.names[name] = self.names.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


class Calls(TorchFunctionMode):
    """Counts the torch functions and tensor methods called under it, the level at which the
    model's code calls ops (each a kernel on CUDA; on the CPU some decompose further)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: dict[str, int] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name != "__get__":  # attribute reads (shape, dtype), not ops
            self.names[name] = self.names.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| in units in the last place of the larger of the two (a reduced dtype)."""
    big = torch.maximum(a.float().abs(), b.float().abs()).clamp_min(torch.finfo(a.dtype).tiny)
    return (a.float() - b.float()).abs() / (torch.finfo(a.dtype).eps * torch.exp2(torch.floor(torch.log2(big))))


def needs_fused_rms_norm() -> None:
    """Torch before aten's fused RMSNorm composes F.rms_norm from several ops, rounding as transformers:
    fused_norm then changes nothing, and stays off by default (runtime.model.fused_rms_norm_available)."""
    from longswift.runtime.model import fused_rms_norm_available

    if not fused_rms_norm_available():
        pytest.skip("this torch has no fused RMSNorm (aten._fused_rms_norm)")


@pytest.fixture(scope="session", autouse=True)
def own_cache_dir(tmp_path_factory):
    """The session's converted tokenizers go to a cache of its own, not the user's."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LONGSWIFT_CACHE_DIR", str(tmp_path_factory.mktemp("longswift-cache")))
        yield


_CUDA_IS_AVAILABLE = torch.cuda.is_available  # as this process found it (tests/fake_cuda_run.py replaces it)


@pytest.fixture(autouse=True)
def cuda_left_as_found(request):
    """A test that leaves torch.cuda.is_available replaced fails here, by name, and the original is put back:
    left replaced, every later test on its worker took CUDA for present (a test imported the fake-device
    plugin, which replaces it as it is imported: CI had 140 failures and 247 errors far from the cause).
    Not where that plugin runs the GPU tests: there it is replaced for the whole run."""
    yield
    if request.config.pluginmanager.has_plugin("fake_cuda_run"):
        return
    if torch.cuda.is_available is not _CUDA_IS_AVAILABLE:
        torch.cuda.is_available = _CUDA_IS_AVAILABLE
        pytest.fail("this test left torch.cuda.is_available replaced; patch it with monkeypatch, which restores it")


@pytest.fixture(scope="session")
def embedded():
    """Our engine on the embedded default model (float32, packed linears)."""
    import longswift

    return longswift.load(dtype="float32")


@pytest.fixture(scope="session")
def embedded_hf():
    """transformers' own load of the same GGUF (the oracle)."""
    from transformers import AutoModelForCausalLM

    from longswift.runtime.loading import default_model_path

    path = default_model_path()
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


@pytest.fixture
def no_loading(monkeypatch):
    """Fail the test if the model's weights are read: mistakes must be caught before that."""
    def loader(*args, **kwargs):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr("longswift.engine.load_model", loader)
    monkeypatch.setattr("longswift.runtime.loading.load_model", loader)


def run_cli(capsys, *argv):
    """`longswift ARGV...` in this process -> (exit code, stdout, stderr)."""
    from longswift.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, match):
    """The promise for bad input: exit 2 and one line `longswift: error: ...` containing `match`."""
    assert code == 2
    lines = [line for line in err.strip().splitlines() if line]
    assert len(lines) == 1, err
    assert lines[0].startswith("longswift: error: ") and match in lines[0], lines[0]


def byte_tokenizer(cleanup: bool = False):
    """Every byte a token (GPT-2's byte-to-character alphabet), a few merges (" ab", "é"), and a
    special token <eos>; `cleanup`: transformers' clean_up_tokenization_spaces on, as in Llama 3's
    tokenizer config (transformers 4 applies it to BPE tokenizers, 5 only when forced)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    merges = [("Ġ", "a"), ("Ġa", "b"), ("Ã", "©")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>",
                                        clean_up_tokenization_spaces=cleanup)
    tokenizer.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output = cleanup
    return tokenizer
