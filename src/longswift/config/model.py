"""ModelConfig: the shape and numerics of a Llama-family decoder, read from a transformers config."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import LongswiftError

if TYPE_CHECKING:  # (torch is imported where it is used: the command line parses its flags without it)
    import torch

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass
class ModelConfig:
    """Shape and numerics of a Llama-family decoder, read from a transformers config."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    sliding_window: int | None
    rope_type: str
    eos_token_ids: tuple[int, ...]
    # Per-frequency divisors of the rope's frequencies (a GGUF's `rope_freqs` tensor: how llama.cpp's converter
    # stores Llama 3.1/3.2's llama3 scaling); None: none.
    rope_freq_factors: tuple[float, ...] | None = field(repr=False, default=None)
    # The transformers config itself: rope frequencies come from its ROPE_INIT_FUNCTIONS.
    hf_config: Any = field(repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise LongswiftError(
                f"unsupported architecture '{self.architecture}': longswift runs "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}; convert or pick a model of one of these families"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise LongswiftError(f"config field {name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise LongswiftError(
                f"config has {self.num_heads} attention heads but {self.num_kv_heads} KV heads; "
                "the first must be a multiple of the second"
            )

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_hf(cls, hf: Any) -> ModelConfig:
        """Build from a transformers PretrainedConfig (LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config)."""
        arch = getattr(hf, "model_type", None) or "unknown"
        if arch not in SUPPORTED_ARCHITECTURES:
            raise LongswiftError(
                f"unsupported architecture '{arch}': longswift runs {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        act = getattr(hf, "hidden_act", "silu")
        if act not in ("silu", "swish"):  # (transformers' two names of one function)
            raise LongswiftError(f"unsupported activation '{act}': longswift runs SiLU-gated MLPs only")
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
        rope = getattr(hf, "rope_parameters", None) or {}
        rope_type = rope.get("rope_type", "default")
        if rope_type not in ("default", "linear", "dynamic", "llama3", "yarn"):
            raise LongswiftError(
                f"unsupported rope type '{rope_type}': longswift supports default, linear, dynamic, llama3, yarn"
            )
        if rope.get("partial_rotary_factor", 1.0) != 1.0:
            raise LongswiftError("partial rotary embeddings are not supported")
        factors = getattr(hf, "rope_freq_factors", None)
        if factors is not None and rope_type != "default":
            raise LongswiftError(f"rope frequency factors (a GGUF's rope_freqs) with {rope_type} rope scaling on top "
                                 "are not supported")
        # Numbers transformers does not check (a string, NaN, 0 or a negative rope base or epsilon ran or failed
        # with a traceback deep in the rope or the norms).
        _positive_number("rms_norm_eps", getattr(hf, "rms_norm_eps", None))
        _positive_number("rope_theta", rope.get("rope_theta"))
        for key in ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor",
                    "beta_fast", "beta_slow", "attention_factor"):
            if rope.get(key) is not None:
                _positive_number(f"rope_parameters.{key}", rope[key])
        eos = getattr(hf, "eos_token_id", None)
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (int(eos),))
        # Only ids the model can write (as with_eos keeps a generation config's): a -1 some configs hold for "none"
        # was banned under ignore_eos, and refused there as a banned id of the user's.
        eos_ids = tuple(t for t in eos_ids if isinstance(t, int) and not isinstance(t, bool) and 0 <= t < hf.vocab_size)
        # Biases as transformers' classes build them, whatever else a config says (a mistral's attention_bias or
        # a qwen's mlp_bias, which they never read, had the load look for bias tensors and refuse the checkpoint).
        attention_bias = bool(getattr(hf, "attention_bias", False))
        if arch == "qwen2":
            qkv_bias, o_bias = True, False
        elif arch == "mistral":
            qkv_bias = o_bias = False
        else:  # llama; qwen3: attention_bias covers q/k/v/o
            qkv_bias = o_bias = attention_bias
        mlp_bias = arch == "llama" and bool(getattr(hf, "mlp_bias", False))
        sliding = getattr(hf, "sliding_window", None)
        if arch in ("qwen2", "qwen3") and (not getattr(hf, "use_sliding_window", False)
                                           or "sliding_attention" not in (getattr(hf, "layer_types", None) or [])):
            sliding = None  # qwen: windowed layers only from max_window_layers on (its layer_types), maybe none
        return cls(
            architecture=arch,
            vocab_size=int(hf.vocab_size),
            hidden_size=int(hf.hidden_size),
            intermediate_size=int(hf.intermediate_size),
            num_layers=int(hf.num_hidden_layers),
            num_heads=int(hf.num_attention_heads),
            num_kv_heads=int(getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(hf.rms_norm_eps),
            max_position_embeddings=int(hf.max_position_embeddings),
            tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
            qkv_bias=qkv_bias,
            o_bias=o_bias,
            mlp_bias=mlp_bias,
            qk_norm=arch == "qwen3",
            sliding_window=int(sliding) if sliding else None,
            rope_type=rope_type,
            eos_token_ids=eos_ids,
            rope_freq_factors=tuple(float(f) for f in factors) if factors is not None else None,
            hf_config=hf,
        )

    @property
    def scaled_rope(self) -> str | None:
        """The rope scaling the model runs with already (None: plain rope): its rope type, or llama3 for a
        GGUF's rope_freqs factors (llama.cpp's form of it). Another scaling cannot go on top."""
        if self.rope_freq_factors is not None:
            return "llama3"
        return None if self.rope_type == "default" else self.rope_type

    def _rope_parameters(self) -> dict:
        """The config's rope parameters, where a linear / dynamic / yarn scaling states a factor; {} otherwise."""
        rope = (getattr(self.hf_config, "rope_parameters", None) or {}) if self.hf_config is not None else {}
        return rope if self.rope_type in ("linear", "dynamic", "yarn") and rope.get("factor") else {}

    @property
    def rope_setting(self) -> str | None:
        """The rope scaling this config runs with, a --rope-scaling applied or the model's own, as --rope-scaling
        writes it ('yarn:2.0'); 'llama3' for llama3's, None for plain rope."""
        rope = self._rope_parameters() if self.rope_freq_factors is None else {}  # (rope_freqs: llama3's)
        return f"{self.rope_type}:{float(rope['factor'])}" if rope else self.scaled_rope

    @property
    def context_limit(self) -> int:
        """Positions the model is meant to handle: its trained context, extended by the factor of a
        linear / dynamic / yarn rope scaling (llama3 configs state the extended length themselves)."""
        rope = self._rope_parameters()
        if rope:
            return max(self.max_position_embeddings, int(self.trained_context * float(rope["factor"])))
        return self.max_position_embeddings

    @property
    def trained_context(self) -> int:
        """The context before a linear / dynamic / yarn rope scaling (the one its factor multiplies)."""
        return self._rope_parameters().get("original_max_position_embeddings") or self.max_position_embeddings

    def state_shapes(self, lm_head_rows: int | None = None) -> dict[str, tuple[int, ...]]:
        """Every tensor name of the state dict and its shape, in transformers' naming: what a checkpoint must hold
        (runtime.model.check_state_dict) and what parameter_count counts. An untied LM head has `lm_head_rows` rows
        if given: a tensor-parallel rank's vocabulary block."""
        h, d, i = self.hidden_size, self.head_dim, self.intermediate_size
        qd, kvd = self.num_heads * d, self.num_kv_heads * d
        shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (self.vocab_size, h),
                                               "model.norm.weight": (h,)}
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (lm_head_rows or self.vocab_size, h)
        for n in range(self.num_layers):
            p = f"model.layers.{n}."
            shapes |= {
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (qd, h),
                p + "self_attn.k_proj.weight": (kvd, h),
                p + "self_attn.v_proj.weight": (kvd, h),
                p + "self_attn.o_proj.weight": (h, qd),
                p + "mlp.gate_proj.weight": (i, h),
                p + "mlp.up_proj.weight": (i, h),
                p + "mlp.down_proj.weight": (h, i),
            }
            if self.qkv_bias:
                shapes |= {p + "self_attn.q_proj.bias": (qd,), p + "self_attn.k_proj.bias": (kvd,),
                           p + "self_attn.v_proj.bias": (kvd,)}
            if self.o_bias:
                shapes[p + "self_attn.o_proj.bias"] = (h,)
            if self.mlp_bias:
                shapes |= {p + "mlp.gate_proj.bias": (i,), p + "mlp.up_proj.bias": (i,), p + "mlp.down_proj.bias": (h,)}
            if self.qk_norm:
                shapes |= {p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)}
        return shapes

    def parameter_count(self) -> int:
        """Every value of the state dict (state_shapes): the memory plan's weights, info's count and bench-steps'
        bytes read a step."""
        return sum(math.prod(shape) for shape in self.state_shapes().values())

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        elem = dtype.itemsize
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * elem


def _positive_number(name: str, value: Any) -> None:
    """Refuse a model config's number that is not a finite positive one (a hand-edited config.json, a GGUF's metadata)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise LongswiftError(f"the model's config has {name} = {value!r}: expected a finite positive number; fix the "
                             "config (or re-download the model)")
