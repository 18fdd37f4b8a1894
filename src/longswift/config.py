"""Typed configurations. Defaults live here once; the CLI builds its flags from these fields."""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import re
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import ConfigError, ConfigTypeError, LongswiftError

if TYPE_CHECKING:  # (torch is imported where it is used: the command line parses its flags without it)
    import torch

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")

# Seeds torch.Generator.manual_seed takes (it reads a negative seed as seed + 2^64). Seeds derived
# from a user's seed (distill's per batch, training's per epoch) go through torch_seed, so they wrap
# the same way instead of overflowing at the edges of the range.
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1


def seed_problem(seed: int | None, flag: str = "--seed") -> str | None:
    """Why `seed` cannot seed a generator, in a line naming `flag`; None when it can."""
    if seed is None or SEED_MIN <= seed <= SEED_MAX:
        return None
    return f"{flag} must be between {SEED_MIN} and {SEED_MAX}; got {seed}"


def torch_seed(value: int) -> int:
    """A derived seed as manual_seed reads it: the same generator as `value` for every value it takes."""
    return value % 2**64


def flag_name(field: str) -> str:
    """A config field as the command line spells it (max_new_tokens -> --max-new-tokens)."""
    return "--" + field.replace("_", "-")


def _help(text: str, **extra: Any) -> dict[str, Any]:
    return {"help": text, **extra}


_EXPECTED = {int: (lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool), "a whole number"),
             float: (lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool), "a number"),
             str: (lambda v: isinstance(v, str), "a string"), bool: (lambda v: isinstance(v, bool), "True or False")}


def check_types(config: Any) -> None:
    """Refuse a field value of the wrong type (SamplingConfig(seed='abc'), max_new_tokens=2.5) with
    a message that says what was expected, before any check compares or computes with it. A number
    of another numeric type (numpy.int64(5), numpy.float32(0.7)) is stored as the Python int or float
    it stands for: torch.Generator.manual_seed and the checkpoint's JSON take no other."""
    cls = type(config)
    for name, kind in typing.get_type_hints(cls).items():
        value = getattr(config, name)
        union = typing.get_origin(kind) in (typing.Union, types.UnionType)  # (dict[str, float]'s args are no union)
        options = [t for t in typing.get_args(kind) if t is not type(None)] if union else [kind]
        optional = union and type(None) in typing.get_args(kind)
        if optional and value is None:
            continue
        matched = next((t for t in options if t in _EXPECTED and _EXPECTED[t][0](value)), None)
        if matched is not None:
            if matched in (int, float) and type(value) not in (int, float):
                setattr(config, name, int(value) if matched is int else float(value))
            continue
        if not all(t in _EXPECTED for t in options):
            continue
        expected = " or ".join([_EXPECTED[t][1] for t in options] + (["None"] if optional else []))
        got = f"got {value!r} ({type(value).__name__})"
        raise ConfigTypeError(f"{cls.__name__}.{name} must be {expected}; {got}",
                              f"{flag_name(name)} must be {expected}; {got}")


def _validated(post_init: Any) -> Any:
    """Wrap a config's __post_init__: types are checked first; its checks' messages, written with
    flags (--top-k), are raised naming the API field (SamplingConfig.top_k) and keep the flag form
    as `cli_message` for the command line."""

    @functools.wraps(post_init)
    def wrapper(self: Any) -> None:
        check_types(self)
        try:
            post_init(self)
        except ConfigError:
            raise
        except LongswiftError as exc:
            names = {f.name for f in dataclasses.fields(self)}

            def api(m: re.Match) -> str:
                name = m.group(1).replace("-", "_")
                return f"{type(self).__name__}.{name}" if name in names else m.group(0)

            raise ConfigError(re.sub(r"--([a-z][a-z0-9-]*)", api, str(exc)), str(exc)) from None

    return wrapper


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


# Logits of |x| <= 300, through a penalty in PENALTY_RANGE (a positive logit divided by it, a negative one
# multiplied) and then divided by a temperature of at least MIN_TEMPERATURE, stay finite in float32 (3.4e38);
# below it the draw saw NaN (1e-45 gave the vocabulary's last id at every step).
MIN_TEMPERATURE = 1e-30
PENALTY_RANGE = (1e-6, 1e6)


@dataclass
class SamplingConfig:
    """The logits transform: banned tokens, contextual penalty, then temperature, top-k, top-p, min-p, eta."""

    temperature: float = field(default=1.0, metadata=_help("softmax temperature; 0 means greedy (argmax)"))
    top_k: int = field(default=0, metadata=_help("keep the k most likely tokens; 0 disables"))
    top_p: float = field(default=1.0, metadata=_help("nucleus sampling mass in (0, 1]; 1 disables"))
    min_p: float = field(
        default=0.1, metadata=_help("drop tokens below min_p x the top probability; 0 disables")
    )
    eta: float = field(default=0.0, metadata=_help("eta-sampling epsilon in [0, 1); 0 disables"))
    repetition_penalty: float = field(
        default=1.2, metadata=_help("contextual penalty theta on tokens of the last window; 1 disables")
    )
    penalty_window: int = field(
        default=1024, metadata=_help("the penalty looks at this many most recent tokens (0: none, as a penalty of 1)")
    )
    seed: int | None = field(default=None, metadata=_help(
        "RNG seed; the same seed gives the same output (default: a random one, which --json and checkpoints record; "
        "-1 is a seed like any other, not a random one)"))
    # Token ids whose logits are -inf before anything else (never drawn, never drafted). Not a flag of its own
    # (generate's --ban-ids / --ban-token set it): Engine.stream adds the model's EOS ids under --ignore-eos, and a
    # checkpoint records the result,
    # so a resumed run bans exactly what its first run banned (absent in older checkpoints: none).
    banned_ids: tuple[int, ...] = ()

    @_validated
    def __post_init__(self) -> None:
        if hasattr(self.banned_ids, "tolist") and getattr(self.banned_ids, "ndim", None) == 1:  # a tensor or array
            self.banned_ids = self.banned_ids.tolist()
        if not isinstance(self.banned_ids, (tuple, list, set, frozenset, range)):
            raise ConfigTypeError(f"SamplingConfig.banned_ids must be a tuple or list of token ids; got "
                                  f"{self.banned_ids!r} ({type(self.banned_ids).__name__})")
        wrong = next((t for t in self.banned_ids if not isinstance(t, numbers.Integral) or isinstance(t, bool)), None)
        if wrong is not None:
            raise ConfigTypeError(f"SamplingConfig.banned_ids must be token ids (whole numbers); got {wrong!r} "
                                  f"({type(wrong).__name__}) among them (a token's text: Engine.token_id gives its id)",
                                  f"banned token ids must be whole numbers; got {wrong!r}")
        if any(t < 0 for t in self.banned_ids):
            raise ConfigError(f"SamplingConfig.banned_ids must be non-negative; got {min(self.banned_ids)}",
                              f"banned token ids must be non-negative; got {min(self.banned_ids)}")
        # a list from JSON, numpy ids, repeats: one canonical form of Python ints
        self.banned_ids = tuple(sorted({int(t) for t in self.banned_ids}))
        checks = [
            # Below MIN_TEMPERATURE (or a penalty outside its range), logits / temperature can overflow float32:
            # the draw would see NaN, not the argmax such a temperature approaches (temperature 0 is that argmax).
            (self.temperature == 0 or MIN_TEMPERATURE <= self.temperature < math.inf,
             f"--temperature must be 0 (greedy) or a finite number >= {MIN_TEMPERATURE:g}"),
            (self.top_k >= 0, "--top-k must be >= 0"),
            (0 < self.top_p <= 1, "--top-p must be in (0, 1]"),
            (0 <= self.min_p < 1, "--min-p must be in [0, 1)"),
            (0 <= self.eta < 1, "--eta must be in [0, 1)"),
            (PENALTY_RANGE[0] <= self.repetition_penalty <= PENALTY_RANGE[1],
             f"--repetition-penalty must be in [{PENALTY_RANGE[0]:g}, {PENALTY_RANGE[1]:g}] (1 disables)"),
            (self.penalty_window >= 0, "--penalty-window must be >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise LongswiftError(message)
        if (problem := seed_problem(self.seed)) is not None:
            raise LongswiftError(problem)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized_window(self) -> int:
        """Recent tokens the transform reads: the penalty window, or 0 where the penalty is off (1.0),
        so that no window is cut or gathered for nothing."""
        return self.penalty_window if self.repetition_penalty != 1.0 else 0


@dataclass
class GenerationConfig:
    """How much to generate and when to stop."""

    max_new_tokens: int = field(default=256, metadata=_help("number of tokens to generate"))
    ignore_eos: bool = field(default=False, metadata=_help(
        "ban end-of-sequence tokens (logit -inf, as llama.cpp's --ignore-eos and transformers' min_new_tokens), "
        "so generation runs to --max-new-tokens without ever emitting one"))
    prefill_chunk: int = field(
        default=256, metadata=_help("prompt tokens per prefill forward (bounds the attention mask size)")
    )
    # End after the generated token whose text completes one of these (kept in the output, as with
    # transformers' stop_strings; one string is taken as one); the command line's repeatable --stop (stop_strings.py)
    stop: tuple[str, ...] = ()

    @_validated
    def __post_init__(self) -> None:
        if self.max_new_tokens <= 0:
            raise LongswiftError("--max-new-tokens must be a positive number of tokens")
        if self.prefill_chunk <= 0:
            raise LongswiftError("--prefill-chunk must be positive")
        if isinstance(self.stop, str):  # one stop string, as transformers, vLLM and OpenAI's API take it
            self.stop = (self.stop,)
        if not isinstance(self.stop, (tuple, list)):
            raise ConfigTypeError(f"GenerationConfig.stop must be a string, or a tuple or list of strings; got "
                                  f"{self.stop!r} ({type(self.stop).__name__})", "--stop must be text")
        wrong = next((s for s in self.stop if not isinstance(s, str)), None)
        if wrong is not None:
            raise ConfigTypeError(f"GenerationConfig.stop must be strings; got {wrong!r} ({type(wrong).__name__}) "
                                  "among them", "--stop strings must be non-empty text")
        if not all(self.stop):
            raise LongswiftError("--stop strings must be non-empty text")
        for s in self.stop:  # (a lone surrogate, a JSON escape without its pair, is no text the run can write)
            try:
                s.encode("utf-8")
            except UnicodeEncodeError:
                raise ConfigError(f"GenerationConfig.stop string {s!r} holds a lone surrogate, which is not Unicode "
                                  "text: remove it, or pair it", "--stop strings must be UTF-8 text") from None
        self.stop = tuple(self.stop)  # a checkpoint's JSON gives a list


# More CPU threads than any machine has cores: refused, since past the OS's thread limit OpenMP fails
# to start them and the process crashes (100000 segfaults here) instead of raising.
MAX_THREADS = 1024
READ_EVERY_CUDA = 16  # RuntimeConfig.read_every's auto on CUDA: ~50 ms of tokens per block at 300 tok/s
PAPER_TREE, PAPER_NGRAM_TOPK = "1,3,3,3", 20
CPU_TREE, CPU_NGRAM_TOPK = "1,1,1", 1
# Node budgets (SpecConfig.max_nodes): on an H100 (session 6, 8B shape, docs/benchmarks.md) a 32-row verify
# pass cost 1.08x (4K) to 1.14x (100K) an AR step and the paper trie's 128 rows 1.61x to 2.41x; 0: no limit.
CPU_MAX_NODES, GPU_MAX_NODES = 0, 32
# A lookup step's trie (SpecConfig.lookup_nodes): the suffix index's copy can be long where the text repeats
# itself. On session 46's CPU a 32-row verify pass cost 2.8x a decoding step (an 8-row one 1.5x) and replayed
# loops accepted most of a 31-token copy; on a GPU it is the default node budget.
LOOKUP_NODES = 32
# Bounds beyond any useful trie (a step of that many rows costs many AR steps): larger values are typos, which
# the memory plan refused with a 39-digit size and advice that did not name them.
MAX_NGRAM_TOPK, MAX_LOOKUP_NODES = 1024, 4096
DRAFT_CACHES = ("dynamic", "static", "full")  # SpecConfig.draft_cache
WALKS = ("auto", "rows", "batched")  # SpecConfig.walk
GRAPH_ATTENTIONS = ("bucketed", "length")  # RuntimeConfig.graph_attention (runtime.cuda_graphs)


@dataclass
class SpecConfig:
    """TokenSwift: draft tree, n-gram reuse, draft pass cache."""

    tree: str = field(default="auto", metadata=_help(
        "candidates per depth, from the base logits then each head; auto: 1,1,1 on CPU, the paper's 1,3,3,3 on GPU"))
    ngram_topk: int | None = field(default=None, metadata=_help(
        "n-gram continuations added per depth-1 token, 0 disables; default: 1 on CPU, the paper's 20 on GPU"))
    max_nodes: int | None = field(default=None, metadata=_help(
        "most nodes a step's trie may have, the root included: a larger trie keeps its most likely nodes "
        "(by the draft heads' probabilities and the n-gram counts); 0: no limit; default: 32 on GPU (where "
        "the verify pass grows with its rows at long context), no limit on CPU (its default trie has at most 7)"))
    draft_mode: str = field(
        default="paper",
        metadata=_help("paper: a draft pass on the partial cache; fused: heads read the verify pass (one forward per step)",
                       choices=("paper", "fused")),
    )
    draft_kv_budget: int = field(
        default=4096, metadata=_help("partial KV cache size of the draft pass; shorter contexts draft on the full cache")
    )
    draft_window: int = field(default=1024, metadata=_help("recent-token window inside the draft KV budget"))
    draft_cache: str = field(default="dynamic", metadata=_help(
        "the draft pass's cache once the context outgrows --draft-kv-budget: dynamic (sinks + important "
        "entries, re-selected whenever the recent window fills), static (selected once, never refreshed) "
        "or full (the whole KV cache); static and full are ablations", choices=DRAFT_CACHES))
    attention_sinks: int = field(default=16, metadata=_help("first positions always kept in the partial cache"))
    walk: str = field(default="auto", metadata=_help(
        "the lossless walk over the verified trie: rows (transform and draw each visited row in turn, "
        "computing only those rows' logits, or a small trie's in one pass while steps average 1.5+ tokens) "
        "or batched (every row at once, one device-to-host read per step); the same tokens either way; "
        "auto: rows on CPU, batched on GPU", choices=WALKS))
    suffix_lookup: bool = field(default=True, metadata=_help(
        "lookup steps also copy what followed the latest earlier occurrence of the text's last 8, 4 or 2 "
        "tokens, as long as --lookup-nodes allows (prompt-lookup style: text that repeats itself gives "
        "long accepted runs); needs n-gram reuse (--ngram-topk > 0)"))
    lookup_nodes: int = field(default=LOOKUP_NODES, metadata=_help(
        "most nodes a lookup step's trie may have where the suffix index copies, the root included, at most "
        "--max-nodes where that is set: the copy is at most 3 tokens per token of the match it follows, and "
        "the n-gram continuations fill the rest"))
    adaptive: bool = field(default=True, metadata=_help(
        "per step, use whichever kind of step has been faster: full steps (draft pass + tree), half steps "
        "(the same draft, the likeliest half of a --max-nodes of 32 or more), narrow "
        "steps (the same draft, a narrow tree; only with a wide --tree or --ngram-topk), lookup steps "
        "(the suffix index's copy and n-gram continuations of the root, no draft pass) or plain steps (the root "
        "alone, an AR step); output is the same either way"))

    @_validated
    def __post_init__(self) -> None:
        if self.tree != "auto":  # parsed (raising on a bad one) and written one way: "1, 3,3,3" is "1,3,3,3" (bench's
            self.tree = ",".join(map(str, self.levels))  # run keys, checkpoints and reports hold it as text)
        if self.ngram_topk is not None and not 0 <= self.ngram_topk <= MAX_NGRAM_TOPK:
            raise LongswiftError(f"--ngram-topk must be 0 to {MAX_NGRAM_TOPK}; got {self.ngram_topk}")
        if self.max_nodes is not None and (self.max_nodes < 0 or self.max_nodes == 1):
            raise LongswiftError(f"--max-nodes must be 0 (no limit) or at least 2 (the root and one drafted token); "
                                 f"got {self.max_nodes}")
        if not 2 <= self.lookup_nodes <= MAX_LOOKUP_NODES:
            raise LongswiftError(f"--lookup-nodes must be 2 (the root and one copied token) to {MAX_LOOKUP_NODES}; "
                                 f"got {self.lookup_nodes}")
        if self.draft_mode not in ("paper", "fused"):
            raise LongswiftError(f"--draft-mode must be paper or fused; got '{self.draft_mode}'")
        if self.draft_mode == "fused" and self.tree != "auto" and len(self.levels) < 2:  # (info planned it)
            raise LongswiftError(f"--tree {self.tree} has one depth, and --draft-mode fused skips the first (the "
                                 "model's own next token is the root): give a tree of at least two depths")
        if self.walk not in WALKS:
            raise LongswiftError(f"--walk must be one of {', '.join(WALKS)}; got '{self.walk}'")
        if self.draft_cache not in DRAFT_CACHES:
            raise LongswiftError(f"--draft-cache must be one of {', '.join(DRAFT_CACHES)}; got '{self.draft_cache}'")
        if self.attention_sinks < 0 or self.draft_window <= 0:
            raise LongswiftError("--attention-sinks must be >= 0 and --draft-window positive")
        if self.draft_kv_budget <= self.attention_sinks + self.draft_window:
            raise LongswiftError(
                f"--draft-kv-budget ({self.draft_kv_budget}) must exceed --attention-sinks + --draft-window "
                f"({self.attention_sinks + self.draft_window})"
            )

    @property
    def levels(self) -> tuple[int, ...]:
        if self.tree == "auto":
            raise ValueError("SpecConfig.tree is 'auto': call for_device() first")
        return parse_tree(self.tree)

    def for_device(self, device: Any, depths: int | None = None) -> SpecConfig:
        """Fill in the per-device defaults. Measured (docs/benchmarks.md): on a CPU the verify pass
        is compute-bound, so its cost grows with every node and a small trie wins (1,1,1 with one
        n-gram continuation); on a GPU it is bandwidth-bound up to a few dozen rows (the paper's
        trie), but its attention over a long context grows with every row, so its 32 likeliest nodes.
        `depths`: the most the heads draft (gamma + 1), to which the default tree is cut."""
        cpu = getattr(device, "type", str(device)).startswith("cpu")
        tree = self.tree if self.tree != "auto" else (CPU_TREE if cpu else PAPER_TREE)
        if self.tree == "auto" and depths is not None:  # heads of fewer than 3 (GPU: 4) depths
            tree = ",".join(tree.split(",")[:depths])
        ngram = self.ngram_topk if self.ngram_topk is not None else (CPU_NGRAM_TOPK if cpu else PAPER_NGRAM_TOPK)
        walk = self.walk if self.walk != "auto" else ("rows" if cpu else "batched")
        max_nodes = self.max_nodes if self.max_nodes is not None else (CPU_MAX_NODES if cpu else GPU_MAX_NODES)
        return dataclasses.replace(self, tree=tree, ngram_topk=ngram, walk=walk, max_nodes=max_nodes)


def changed_spec_fields(spec: SpecConfig) -> list[str]:
    """The fields of `spec` that differ from SpecConfig's defaults."""
    default = SpecConfig()
    return [f.name for f in dataclasses.fields(SpecConfig) if getattr(spec, f.name) != getattr(default, f.name)]


# SpecConfig fields that a setting of the same config leaves unused: (fields, when, why, why on the command line)
_UNUSED_WHEN: tuple[tuple[frozenset[str], Callable[[SpecConfig], bool], str, str], ...] = (
    (frozenset({"draft_kv_budget", "draft_window", "attention_sinks", "draft_cache"}),
     lambda spec: spec.draft_mode == "fused",
     "draft_mode='fused' has no draft pass, whose cache they set",
     "--draft-mode fused has no draft pass, whose cache they set"),
    (frozenset({"lookup_nodes"}), lambda spec: spec.ngram_topk == 0,
     "ngram_topk=0 turns off n-gram reuse and with it the suffix lookup, whose copy it bounds",
     "--ngram-topk 0 turns off n-gram reuse and with it the suffix lookup, whose copy it bounds"),
    (frozenset({"lookup_nodes"}), lambda spec: not spec.suffix_lookup,
     "suffix_lookup=False turns off the suffix lookup, whose copy it bounds",
     "--no-suffix-lookup turns off the suffix lookup, whose copy it bounds"),
)


def unused_spec_fields(spec: SpecConfig, named: Iterable[str]) -> tuple[list[str], str, str]:
    """Of the fields `named` (those a caller set), the first group that another setting of `spec` leaves unused,
    and why (in the API's words, then the command line's); ([], '', '') where none is."""
    named = set(named)
    for group, when, why, cli_why in _UNUSED_WHEN:
        if group & named and when(spec):
            return sorted(group & named), why, cli_why
    return [], "", ""


@dataclass
class RuntimeConfig:
    """Where and in what precision the model runs."""

    device: str = field(default="auto", metadata=_help("cpu, cuda, cuda:N or auto"))
    dtype: str = field(
        default="auto", metadata=_help("float32, bfloat16, float16, float64 or auto (fp32 on CPU, bf16 on CUDA)",
                                       choices=("auto", "float32", "bfloat16", "float16", "float64"))
    )
    threads: int | None = field(default=None, metadata=_help("CPU threads for torch (default: torch's, one per "
                                                              "core; on a shared machine, the cores that are free)"))
    rope_scaling: str | None = field(default=None, metadata=_help(
        "extend the model's context on purpose: TYPE:FACTOR with TYPE yarn, linear or dynamic (e.g. yarn:4)"))
    pack_weights: bool | None = field(
        default=None,
        metadata=_help("run CPU linears on oneDNN-packed weight copies (faster; each replaces its weight, a tied "
                       "LM head's copy is the one extra); where "
                       "packing does not exist (CUDA) store each layer's q/k/v and gate/up weights as one matrix "
                       "each instead (one product for each, no extra memory); default: on for checkpoint files, "
                       "off for a transformers model passed in (no copy)"),
    )
    cuda_graphs: str = field(default="auto", metadata=_help(
        "replay decode, draft and verify steps as CUDA graphs: auto (wherever supported: CUDA, no tensor "
        "parallelism, no dynamic rope), on (required), off", choices=("auto", "on", "off")))
    read_every: int = field(default=0, metadata=_help(
        "AR reads sampled tokens back from the device N at a time, so the GPU never idles while the host "
        "waits on each token; the tokens are the same for every N, they stream in blocks of N. "
        "0 = auto: 1 on CPU, 16 on CUDA"))
    graph_attention: str = field(default="auto", metadata=_help(
        "how the CUDA step bodies attend over a cache that grows while their shapes stay fixed: length "
        "(flash reads the cached length from device memory; a graph per doubling of the context and node "
        "budget) or bucketed (flash over whole 1,024-slot buckets plus a masked part over the rest; a graph per bucket "
        "and node budget); the same attention in other float sums. auto: length where this torch's flash "
        "kernel takes seqused_k, else bucketed (on an H100, 8B shape, length's AR step is the faster: "
        "docs/benchmarks.md)",
        choices=("auto", *GRAPH_ATTENTIONS)))
    float32_logits: bool = field(default=False, metadata=_help(
        "compute the LM head's logits in float32 (float32 sums and output from a bfloat16/float16 model's "
        "inputs) instead of rounding them to the model's dtype; no effect in float32/float64. For measuring "
        "whether it keeps reduced-precision TokenSwift on AR's greedy tokens longer; not yet measured on a GPU"))
    triton_kernels: bool = field(default=False, metadata=_help(
        "CUDA: run each layer's rope with its cache writes, and SwiGLU, as one Triton kernel each (5 kernels fewer "
        "a layer in a step), its RMSNorms as Triton's, and with --graph-attention length its attention as "
        "Triton's (all of a verify pass's rows a KV head in one block, the keys split among the GPU's "
        "multiprocessors); needs triton (CUDA builds of torch include it). Equal to the eager ops to the dtype's "
        "rounding, not bit for bit; not yet timed on a GPU"))

    @_validated
    def __post_init__(self) -> None:
        if self.dtype not in ("auto", *_DTYPES):
            raise LongswiftError(f"--dtype must be one of auto, {', '.join(_DTYPES)}; got '{self.dtype}'")
        if self.device not in ("auto", "cpu") and not re.fullmatch(r"cuda(:[0-9]+)?", self.device):
            raise LongswiftError(f"--device must be cpu, cuda, cuda:N or auto; got '{self.device}'")
        if self.device.startswith("cuda") and not _cuda():
            raise ConfigError(f"RuntimeConfig.device='{self.device}' but no CUDA device is available: use device='cpu'",
                              f"--device {self.device} requested but no CUDA device is available; use --device cpu")
        if self.device.startswith("cuda:") and int(self.device[5:]) >= _cuda_count():
            there = f"this machine has {_cuda_count()} CUDA device(s), numbered from 0"
            raise ConfigError(f"RuntimeConfig.device='{self.device}': {there}", f"--device {self.device}: {there}")
        if self.threads is not None and not 0 < self.threads <= MAX_THREADS:
            raise LongswiftError(f"--threads must be between 1 and {MAX_THREADS}; got {self.threads}")
        if self.cuda_graphs not in ("auto", "on", "off"):
            raise LongswiftError(f"--cuda-graphs must be auto, on or off; got '{self.cuda_graphs}'")
        if self.cuda_graphs == "on" and (self.device == "cpu" or not _cuda()):
            raise ConfigError("RuntimeConfig.cuda_graphs='on' needs a CUDA device: use cuda_graphs='auto' or 'off' here",
                              "--cuda-graphs on needs a CUDA device: use --cuda-graphs auto or off here")
        if self.triton_kernels and self.device == "cpu":
            raise ConfigError("RuntimeConfig.triton_kernels needs a CUDA device: leave it off on a CPU",
                              "--triton-kernels needs a CUDA device: leave it off with --device cpu")
        if self.graph_attention not in ("auto", *GRAPH_ATTENTIONS):
            raise LongswiftError(f"--graph-attention must be one of auto, {', '.join(GRAPH_ATTENTIONS)}; "
                                 f"got '{self.graph_attention}'")
        if self.read_every < 0:
            raise LongswiftError(f"--read-every must be 0 (auto) or a positive number of tokens; got {self.read_every}")
        if self.rope_scaling is not None:
            parse_rope_scaling(self.rope_scaling)

    def torch_device(self) -> torch.device:
        import torch

        if self.device == "auto":
            return torch.device("cuda" if _cuda() else "cpu")
        return torch.device(self.device)

    def token_block(self, device: torch.device) -> int:
        """--read-every resolved for the device the model runs on."""
        return self.read_every or (READ_EVERY_CUDA if device.type == "cuda" else 1)

    def torch_dtype(self) -> torch.dtype:
        import torch

        if self.dtype == "auto":
            return torch.bfloat16 if self.torch_device().type == "cuda" else torch.float32
        return getattr(torch, self.dtype)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count()


ROPE_SCALINGS = ("yarn", "linear", "dynamic")
MAX_ROPE_FACTOR = 1024  # far past any published extension; larger factors overflow the context arithmetic


def parse_number_list(text: str, flag: str, kind: type = int) -> tuple:
    """A comma list of numbers from the command line ('2048,4096' -> (2048, 4096)); a one-line
    error names the flag when an item is not a number of `kind`, is empty ('64,,128': a number
    left out, as --tree refuses it) or the list is."""
    items = [v.strip() for v in text.split(",")]
    what = "whole numbers" if kind is int else "numbers"
    if not any(items):
        raise LongswiftError(f"{flag} is empty")
    if not all(items):
        raise LongswiftError(f"{flag} has an empty item (a number left out?): give comma-separated {what}, "
                             f"e.g. 2048,4096; got '{text}'")
    try:
        return tuple(kind(v) for v in items)
    except ValueError:
        raise LongswiftError(f"{flag} takes comma-separated {what}, e.g. 2048,4096; got '{text}'") from None


def parse_rope_scaling(text: str) -> tuple[str, float]:
    """'yarn:4' -> ('yarn', 4.0); a one-line error for anything else."""
    kind, _, factor = text.partition(":")
    try:
        value = float(factor)
    except ValueError:
        value = float("nan")
    if kind not in ROPE_SCALINGS or not 1 < value <= MAX_ROPE_FACTOR:  # also refuses nan
        raise LongswiftError(f"--rope-scaling must be TYPE:FACTOR with TYPE one of {', '.join(ROPE_SCALINGS)} "
                             f"and FACTOR in (1, {MAX_ROPE_FACTOR}] (e.g. yarn:4); got '{text}'")
    return kind, value


def same_rope_scaling(a: Any, b: Any) -> bool:
    """Whether two rope-scaling settings (None: none) are one, as 'yarn:2' and 'yarn:2.0' are; a setting that does
    not parse (a record edited by hand) is compared as written."""
    def parsed(setting: Any) -> Any:
        try:
            return None if setting is None else parse_rope_scaling(setting)
        except (LongswiftError, TypeError, AttributeError):
            return setting

    return parsed(a) == parsed(b)


_DTYPES = ("float32", "bfloat16", "float16", "float64")  # the names of torch's dtypes --dtype takes


# What --heads and heads= take besides a heads file, a directory or a hub id (Engine.set_heads).
HEADS_WORDS = ("auto", "default", "random", "none")


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> 'bfloat16', the name --dtype and the reports use."""
    return str(dtype).removeprefix("torch.")


def parse_tree(spec: str) -> tuple[int, ...]:
    """'1,3,3,3' -> (1, 3, 3, 3): the number of candidates taken at each depth."""
    try:
        ks = tuple(int(x) for x in spec.split(","))
    except ValueError:
        raise LongswiftError(f"--tree must be comma-separated positive integers like 1,3,3,3; got '{spec}'") from None
    if not ks or any(k <= 0 for k in ks):
        raise LongswiftError(f"--tree must be comma-separated positive integers like 1,3,3,3; got '{spec}'")
    return ks
