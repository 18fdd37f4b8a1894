"""Built-in model shapes (the public config.json hyperparameters of real models) and random weights
of those shapes, made directly in the run's dtype on its device: per-step costs without a download."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..config import ModelConfig
from ..errors import LongswiftError

if TYPE_CHECKING:  # (torch and the runtime are imported where they are used: bench-steps' flags need only SHAPES)
    import torch

# transformers-style config dicts, with the fields that shape the forward as in each model's
# config.json on the Hugging Face hub (Qwen2.5-7B is the base model: 128K context, no rope scaling).
SHAPES: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": {
        "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
        "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
    },
    "qwen2.5-7b": {
        "model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
        "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "sliding_window": 131072, "use_sliding_window": False, "max_window_layers": 28,
        "tie_word_embeddings": False, "bos_token_id": 151643, "eos_token_id": 151643,
    },  # qwen2: q/k/v projections carry biases (ModelConfig.from_hf sets qkv_bias)
    "smollm2-135m": {
        "model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
        "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
    },
}


def check_shape(shape: str | dict[str, Any], layers: int | None) -> None:
    """A one-line error for an unknown built-in shape's name, or a --layers that is not positive or
    deeper than the shape (--layers is for fitting a smaller machine, not for another model)."""
    if isinstance(shape, str) and shape not in SHAPES:
        raise LongswiftError(f"unknown shape '{shape}': choose one of {', '.join(SHAPES)}")
    if layers is not None and layers <= 0:
        raise LongswiftError(f"--layers must be positive, got {layers}")
    depth = (SHAPES[shape] if isinstance(shape, str) else shape).get("num_hidden_layers")
    if layers is not None and depth is not None and layers > depth:
        raise LongswiftError(f"--layers {layers} is deeper than the shape's {depth} layers: give at most {depth}")


def shape_config(shape: str | dict[str, Any], layers: int | None = None, rope_scaling: str | None = None) -> ModelConfig:
    """A built-in shape's name (or a config dict of the same form) -> ModelConfig; `layers`
    overrides the depth (to fit a smaller machine: the per-layer shapes stay the real ones)."""
    from transformers import AutoConfig

    from ..runtime.loading import with_rope_scaling

    check_shape(shape, layers)
    fields = dict(SHAPES[shape] if isinstance(shape, str) else shape)
    if layers is not None:
        fields["num_hidden_layers"] = layers
    model_type = fields.pop("model_type")
    hf = AutoConfig.for_model(model_type, **fields)
    return ModelConfig.from_hf(with_rope_scaling(hf, rope_scaling))


def weight_bytes_read(cfg: ModelConfig, dtype: torch.dtype, float32_head: bool = False) -> int:
    """Weight bytes one decoding step reads: every weight, except that an untied embedding table is
    only gathered (one row), while the LM head (the table itself when tied) is read in full, from its
    float32 copy where `float32_head` (--float32-logits on a bfloat16/float16 model off CUDA)."""
    elem = dtype.itemsize
    embed = 0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size
    # runtime.linear.float32_head: off CUDA the head's products read a float32 copy of its weight
    head = cfg.vocab_size * cfg.hidden_size * (4 - elem) if float32_head else 0
    return (cfg.parameter_count() - embed) * elem + head


def random_state(cfg: ModelConfig, dtype: torch.dtype, device: torch.device, seed: int = 0) -> dict[str, torch.Tensor]:
    """A transformers-named state dict of random weights for `cfg`, drawn in place on `device`.

    Matrices are N(0, 1/fan_in) so activations stay finite; norms are ones, biases small. An untied
    LM head shares the embedding's tensor: the cost is the same (the embedding lookup reads one
    row) and an 8B shape needs 1-2 GB less."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for name, shape in cfg.state_shapes().items():
        if name == "lm_head.weight":
            continue
        t = torch.empty(shape, dtype=dtype, device=device)
        if name.endswith("norm.weight"):
            t.fill_(1.0)
        elif name.endswith(".bias"):
            t.normal_(0.0, 0.02, generator=gen)
        else:  # [out, in] matrices and the [V, hidden] embedding
            t.normal_(0.0, shape[-1] ** -0.5, generator=gen)
        state[name] = t
    if not cfg.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return state
