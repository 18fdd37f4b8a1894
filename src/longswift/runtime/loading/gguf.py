"""Read a GGUF file into a transformers config and a transformers-named, dequantized state dict."""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from ...errors import LongswiftError, reason_of
from .gguf_quants import DEQUANTIZE
from .gguf_reader import MAGIC, SUPPORTED_VERSIONS, GGUFHeader, UnknownTensorType
from .hub import quiet_transformers

# GGUF architecture -> transformers model_type. Mistral GGUFs are written as "llama".
_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_gate.bias": "mlp.gate_proj.bias",  # llama.cpp's llama: optional MLP biases (transformers' mlp_bias)
    "ffn_up.bias": "mlp.up_proj.bias",
    "ffn_down.bias": "mlp.down_proj.bias",
}
# Tensors that hold nothing the rope does not compute itself (rope_freqs: read into the config).
_DERIVED = ("rope_freqs.weight", "attn_rot_embd")
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def open_gguf(path: Path) -> GGUFHeader:
    try:
        import gguf  # noqa: F401  (the reader takes the tensor types' tables from it)
    except ImportError as exc:  # not the file's fault: say so (a bare environment once read "truncated")
        raise LongswiftError(f"reading GGUF file '{path}' needs the gguf package ({exc}): pip install gguf") from None
    try:
        return GGUFHeader(path)
    except UnknownTensorType as exc:
        from importlib.metadata import version

        raise LongswiftError(f"GGUF file '{path}': tensor {exc.name} has type id {exc.raw_type}, which the installed "
                             f"gguf package ({version('gguf')}) does not know (a quantization newer than it, or "
                             "damage): upgrade it (pip install -U gguf), or use a file of another quantization "
                             "(Q8_0, Q4_K, F16)") from None
    except Exception as exc:  # the reader raises ValueError, IndexError, OSError... on damage
        raise LongswiftError(_unreadable(path, exc)) from None


def _unreadable(path: Path, exc: Exception) -> str:
    """Why a file the gguf reader failed on cannot be read, in our words first (the reader's words,
    numpy's index and reshape errors, say little alone)."""
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    try:
        with open(path, "rb") as f:
            head = f.read(8)
        size = f"{path.stat().st_size:,} bytes"
    except OSError as err:
        return f"cannot read GGUF file '{path}': {err.strerror or reason}"
    if head[:4] != MAGIC:
        return (f"'{path}' is not a GGUF file (it does not begin with the bytes 'GGUF'): give a .gguf model, or a "
                "directory or hub id of a transformers checkpoint")
    version = int.from_bytes(head[4:8], "little") if len(head) == 8 else None
    if version is not None and not version & 0xFFFF:  # a big-endian file's version, read little-endian
        version = int.from_bytes(head[4:8], "big")
    if version is not None and version not in SUPPORTED_VERSIONS:
        readable = " and ".join(map(str, SUPPORTED_VERSIONS))
        remedy = ("convert the model again with a current llama.cpp" if version < min(SUPPORTED_VERSIONS)
                  else "use a file in one of those versions, or the model's Hugging Face checkpoint")
        return (f"cannot read GGUF file '{path}': it is GGUF version {version}, and longswift reads versions "
                f"{readable}; {remedy}")
    return (f"cannot read GGUF file '{path}' ({size}): it ends early or is damaged (the gguf reader: {reason}); "
            "download it again")


def _field(reader: GGUFHeader, key: str, default: Any = None) -> Any:
    return reader.fields.get(key, default)


def _number(reader: GGUFHeader, key: str, default: Any, path: Path, whole: bool = False) -> Any:
    """A numeric metadata field (`default` where absent): a whole number where `whole`, else any real one. A
    string or a list there was a ValueError or TypeError traceback; its sign and range are checked later."""
    value = _field(reader, key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral if whole else numbers.Real):
        raise LongswiftError(f"GGUF file '{path}' has {key} = {value!r}: expected a "
                             f"{'whole number' if whole else 'number'}; the file is damaged or hand-edited")
    return int(cast(numbers.Integral, value)) if whole else float(value)  # (mypy reads the isinstance as Real)


def check_token_ids(reader: GGUFHeader, path: Path) -> None:
    """Refuse special token ids (BOS, EOS, ...) outside the GGUF's vocabulary: transformers' conversion of its
    tokenizer failed on them with "list index out of range"."""
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        return
    if not isinstance(tokens, Sequence) or isinstance(tokens, str):
        raise LongswiftError(f"GGUF file '{path}' has tokenizer.ggml.tokens = {tokens!r}: expected an array of "
                             "token strings; the file is damaged or hand-edited")
    count = len(tokens)
    for key in sorted(k for k in reader.fields if k.startswith("tokenizer.ggml.") and k.endswith("_token_id")):
        value = _field(reader, key)
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or not 0 <= int(value) < count:
            raise LongswiftError(f"GGUF file '{path}' has {key} = {value!r}, outside its vocabulary of {count} tokens: "
                                 "the file is damaged or hand-edited")


def gguf_end_ids(reader: GGUFHeader) -> list[Any]:
    """The ids besides EOS at which llama.cpp ends a generation (None where the file names none): the
    end of a turn (Llama 3 Instruct's <|eot_id|>) and of a message (Llama 3.1's <|eom_id|>)."""
    return [_field(reader, f"tokenizer.ggml.{end}_token_id") for end in ("eot", "eom")]


def gguf_hf_config(reader: GGUFHeader, path: Path) -> Any:
    """The transformers config that the GGUF metadata describes."""
    from transformers import AutoConfig

    arch = _field(reader, "general.architecture")
    if not isinstance(arch, str) or arch not in _ARCHITECTURES:
        raise LongswiftError(
            f"unsupported GGUF architecture '{arch}' in '{path}': longswift reads {', '.join(_ARCHITECTURES)} GGUFs"
        )
    a = arch
    _check_whole_model(reader, a, path)
    heads = int(_field(reader, f"{a}.attention.head_count"))
    hidden = int(_field(reader, f"{a}.embedding_length"))
    embed = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embed is None:
        raise LongswiftError(f"GGUF file '{path}' has no token_embd.weight tensor: it is not a complete model")
    if len(embed.shape) != 2:
        raise LongswiftError(f"GGUF file '{path}' has a token_embd.weight of shape {list(embed.shape)}: a model's is "
                             "[hidden, vocabulary] (ggml's order); the file is damaged or not a model")
    vocab = _number(reader, f"{a}.vocab_size", None, path, whole=True) or int(embed.shape[1])  # GGUF shapes are [ne0=hidden, ne1=vocab]
    rope = _rope_parameters(reader, a, path)
    names = {t.name for t in reader.tensors}
    head_dim = _number(reader, f"{a}.attention.key_length", hidden // heads, path, whole=True)
    rotated = _number(reader, f"{a}.rope.dimension_count", head_dim, path, whole=True)
    if rotated != head_dim:  # llama.cpp rotates only the first `rotated` dimensions of each head
        raise LongswiftError(f"GGUF file '{path}' rotates {rotated} of each head's {head_dim} dimensions "
                             f"({a}.rope.dimension_count): partial rotary embeddings are not supported")
    factors = _rope_freq_factors(reader, head_dim, path)
    kwargs = dict(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(_field(reader, f"{a}.feed_forward_length")),
        num_hidden_layers=int(_field(reader, f"{a}.block_count")),
        num_attention_heads=heads,
        num_key_value_heads=_number(reader, f"{a}.attention.head_count_kv", heads, path, whole=True),
        head_dim=head_dim,
        rms_norm_eps=_number(reader, f"{a}.attention.layer_norm_rms_epsilon", 1e-6, path),
        max_position_embeddings=_number(reader, f"{a}.context_length", 4096, path, whole=True),
        tie_word_embeddings="output.weight" not in names,
        rope_parameters=rope,
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_field(reader, "tokenizer.ggml.eos_token_id"),
    )
    if arch == "llama":
        kwargs["attention_bias"] = "blk.0.attn_q.bias" in names
        kwargs["mlp_bias"] = "blk.0.ffn_gate.bias" in names
    try:
        with quiet_transformers():
            config = AutoConfig.for_model(_ARCHITECTURES[arch], **kwargs)
    except Exception as exc:  # transformers' validation: e.g. a hidden size that is not a multiple of the heads
        raise LongswiftError(f"GGUF file '{path}' describes no valid {arch} model: {reason_of(exc.__cause__ or exc)}"
                             ) from None
    if factors is not None:
        config.rope_freq_factors = factors  # read by ModelConfig.from_hf
    return config


def _check_whole_model(reader: GGUFHeader, a: str, path: Path) -> None:
    """Refuse a part of a split model, sizes that are missing or not positive whole numbers, and a layer count the
    file's tensors do not hold (architecture `a`)."""
    parts = _field(reader, "split.count") if "split.count" in reader.fields else None
    if isinstance(parts, numbers.Integral) and not isinstance(parts, bool) and int(parts) > 1:  # llama.cpp's gguf-split
        number = _field(reader, "split.no") if "split.no" in reader.fields else None
        which = f"part {int(number) + 1} of {parts}" if isinstance(number, numbers.Integral) else f"one of {parts} parts"
        raise LongswiftError(f"GGUF file '{path}' is {which} of a split model: merge them into one file with "
                             "llama.cpp's `llama-gguf-split --merge FIRST-PART MERGED.gguf` and pass that")
    required = [f"{a}.{k}" for k in ("attention.head_count", "embedding_length", "feed_forward_length", "block_count")]
    missing = [k for k in required if k not in reader.fields]
    if missing:
        raise LongswiftError(f"GGUF file '{path}' lacks metadata {missing[0]}: it is not a complete {a} model")
    for key in required:  # (a head count of 0 was a ZeroDivisionError traceback, a list a TypeError)
        value = _field(reader, key)
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value <= 0:
            raise LongswiftError(f"GGUF file '{path}' has {key} = {value!r}: expected a positive whole number")
    # A damaged layer count is refused from the tensor names, as a model directory's (_check_layer_count): a bit
    # flipped there (2 -> 16,711,682) had the plan and the load list the names of every layer's tensors, out of memory;
    # a file of no layer tensors at all is refused so too (it was let through, whatever its count).
    blocks = int(_field(reader, f"{a}.block_count"))
    held = {int(t.name.split(".")[1]) for t in reader.tensors if re.fullmatch(r"blk\.[0-9]+\..+", t.name)}
    if len(held) != blocks:
        raise LongswiftError(f"GGUF file '{path}' has {a}.block_count = {blocks:,}, but its tensors hold {len(held):,} "
                             "layers: the file is damaged or hand-edited")


def _rope_parameters(reader: GGUFHeader, a: str, path: Path) -> dict[str, Any]:
    """transformers' rope parameters from the metadata (architecture `a`), as llama.cpp reads the scaling; a file
    that sets an attention scale longswift does not implement is refused."""
    rope: dict[str, Any] = {"rope_theta": _number(reader, f"{a}.rope.freq_base", 10000.0, path), "rope_type": "default"}
    scaling = _field(reader, f"{a}.rope.scaling.type")
    # As llama.cpp reads them: the factor from rope.scaling.factor, else from the key converters wrote before it
    # (rope.scale_linear, in GGUFs of linearly scaled Llama 2 fine-tunes), 0 meaning none; no type means linear.
    factor = _number(reader, f"{a}.rope.scaling.factor", None, path)
    if factor is None:
        factor = _number(reader, f"{a}.rope.scale_linear", None, path)
    if scaling is None and factor not in (None, 0.0, 1.0):
        scaling = "linear"
    if scaling and scaling != "none":
        rope |= {"rope_type": scaling, "factor": factor or 1.0}
        orig = _number(reader, f"{a}.rope.scaling.original_context_length", None, path, whole=True)
        if orig:
            rope["original_max_position_embeddings"] = int(orig)
    yarn = {"yarn_beta_fast": "beta_fast", "yarn_beta_slow": "beta_slow",
            # llama.cpp's converter writes a transformers config's YaRN attention_factor here, and only where the
            # config has one (convert_hf_to_gguf.py): read back, the run is transformers' (llama.cpp's own llama
            # graph does not read the key, and applies YaRN's default magnitude instead)
            "yarn_attn_factor": "attention_factor"} if scaling == "yarn" else {}
    for key, name in yarn.items():
        value = _number(reader, f"{a}.rope.scaling.{key}", None, path)
        if value is not None:
            rope[name] = value
    # Attention scales llama.cpp applies on top of a rope scaling; transformers' configs say them otherwise
    # (or not at all), so a file that sets one is refused rather than run without it.
    for key, neutral in (("attn_factor", (1.0,)), ("yarn_attn_factor", (1.0,)), ("yarn_ext_factor", (-1.0, 1.0)),
                         ("yarn_log_multiplier", (0.0,))):
        value = _number(reader, f"{a}.rope.scaling.{key}", None, path)
        if value is not None and key not in yarn and value not in neutral:
            raise LongswiftError(f"GGUF file '{path}' sets {a}.rope.scaling.{key} = {value}, which longswift does not "
                                 "implement: load the model from its Hugging Face checkpoint instead")
    return rope


def _rope_freq_factors(reader: GGUFHeader, head_dim: int, path: Path) -> list[float] | None:
    """The per-frequency divisors of a `rope_freqs` tensor; None where there is none."""
    # Llama 3.1/3.2's llama3 rope scaling: llama.cpp's converter writes no scaling type but the factor that
    # divides each frequency, as the tensor rope_freqs (the rope of 3.1 at every position, not only past 8K).
    freqs = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if freqs is None:
        return None
    factors = [float(x) for x in np.asarray(gguf_dequantize(freqs), dtype=np.float32).reshape(-1)]
    if len(factors) != head_dim // 2:
        raise LongswiftError(f"GGUF file '{path}' has {len(factors)} rope_freqs for a head size of {head_dim} "
                             f"({head_dim // 2} frequencies)")
    if not all(math.isfinite(f) and f > 0 for f in factors):  # (NaN or 0 ran: every logit NaN)
        raise LongswiftError(f"GGUF file '{path}' has rope_freqs that are not all positive finite numbers: the "
                             "file is damaged; re-download or re-convert the model")
    return factors


def _unpermute(w: np.ndarray, n_head: int, name: str, path: Path) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved rope pairs -> HF's half-split pairs)."""
    _check_heads(tuple(w.shape), n_head, name, path)
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _check_heads(shape: tuple[int, ...], n_head: int, name: str, path: Path) -> None:
    """Refuse a q/k tensor whose rows do not split into `n_head` heads of rope pairs (_unpermute's reshape)."""
    rows = shape[0]
    if len(shape) > 2 or n_head <= 0 or rows % (2 * n_head):  # (a reshape or division error, a traceback, before)
        raise LongswiftError(f"GGUF file '{path}' has a tensor {name} of {rows} rows (shape "
                             f"{list(reversed(shape))} in ggml's order), which does not split into {n_head} heads of "
                             "rope pairs: the file is damaged or its head counts are wrong")


# A tensor of more values is dequantized in blocks of rows of about this many, each cast into the tensor of the
# model's dtype: its float32 values whole (a Llama-3 8B's LM head: 2 GiB) were held beside the weights read before.
DEQUANTIZE_BLOCK = 1 << 22


def gguf_state_dict(reader: GGUFHeader, hf_config: Any, dtype: torch.dtype, device: torch.device,
                    only: set[str] | None = None,
                    before_cast: Callable[[str, torch.Tensor, int], None] | None = None,
                    shard: Callable[[str, torch.Tensor], torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Dequantize every tensor (or those named in `only`) to `dtype` under its transformers name;
    `before_cast` sees each (name, float32 values on the CPU, the index of their first row) first, a large matrix
    block by block (DEQUANTIZE_BLOCK) and anything else whole; `shard` (parallel.ShardedRead) then cuts a whole one to
    this rank's part, so that a process holds one tensor whole at a time."""
    llama = hf_config.model_type == "llama"
    state: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        if t.name in _GLOBAL_NAMES:
            name = _GLOBAL_NAMES[t.name]
        elif t.name.startswith("blk.") and t.name.count(".") >= 2:
            _, n, rest = t.name.split(".", 2)
            if rest not in _LAYER_NAMES:
                if rest.startswith(_DERIVED):
                    continue
                raise _unused(t.name)
            name = f"model.layers.{n}.{_LAYER_NAMES[rest]}"
        elif t.name.startswith("model.medusa_layers."):
            name = t.name  # TokenSwift draft heads, stored under their HF names (loading checks them)
        elif t.name in _DERIVED:
            continue
        else:
            raise _unused(t.name)
        if only is not None and name not in only:
            continue
        _check_byte_order(reader, t)
        heads = None  # llama.cpp permuted the rows of a llama's q and k by head
        if llama and rest_is(t.name, "attn_q"):
            heads = hf_config.num_attention_heads
        elif llama and rest_is(t.name, "attn_k"):
            heads = hf_config.num_key_value_heads
        if len(t.shape) == 2 and t.n_elements > DEQUANTIZE_BLOCK:
            # (read whole on the CPU where a rank cuts its part of it: that whole is in the run's dtype, not float32)
            values = _dequantize_by_rows(t, name, dtype, device if shard is None else torch.device("cpu"),
                                         before_cast, heads, reader.path)
            state[name] = values if shard is None else shard(name, values).to(device=device, dtype=dtype)
            continue
        array = gguf_dequantize(t)
        array = np.asarray(array, dtype=np.float32).reshape([int(x) for x in reversed(t.shape)] if len(t.shape) > 1 else -1)
        if heads is not None:
            array = _unpermute(array, heads, t.name, reader.path)
        if np.may_share_memory(array, reader.data) or not array.flags.c_contiguous:
            # A dequantizer may hand back a view of the read-only map (gguf-py's does for F32); the weights get
            # a buffer of their own.
            array = np.array(array, copy=True, order="C")
        values = torch.from_numpy(array)
        if before_cast is not None:
            before_cast(name, values, 0)
        if shard is not None:
            values = shard(name, values)
        state[name] = values.to(device=device, dtype=dtype)
    return state


def _check_byte_order(reader: GGUFHeader, t: Any) -> None:
    """Refuse a block type's tensor in a big-endian file (its block scales would be read byte-swapped)."""
    if reader.order == ">" and t.data.dtype.kind != "f":
        raise LongswiftError(f"GGUF file '{reader.path}' is big-endian and its tensor '{t.name}' is "
                             f"{t.tensor_type.name}: longswift reads a big-endian file's F32, F16 and F64 tensors "
                             "only; use a little-endian GGUF (llama.cpp's default)")


def _dequantize_by_rows(t: Any, name: str, dtype: torch.dtype, device: torch.device,
                        before_cast: Callable[[str, torch.Tensor, int], None] | None,
                        heads: int | None, path: Path) -> torch.Tensor:
    """A [rows, cols] tensor (ggml's shape (cols, rows)) dequantized a block of whole rows at a time (whole rows are
    whole quantization blocks) into a tensor of `dtype`: the same values as at once. `heads`: the rows are llama.cpp's
    permuted q or k rows of that many heads, unpermuted a block of whole heads at a time (of file `path`)."""
    cols, rows = int(t.shape[0]), int(t.shape[1])
    step = max(1, DEQUANTIZE_BLOCK // cols)
    if heads is not None:
        _check_heads((rows, cols), heads, t.name, path)
        per_head = rows // heads
        step = max(per_head, step // per_head * per_head)
    out = torch.empty(rows, cols, dtype=dtype, device=device)
    for first in range(0, rows, step):
        last = min(rows, first + step)
        values = _rows(t, first, last)
        if heads is not None:
            values = values.reshape(-1, per_head // 2, 2, cols).transpose(1, 2).reshape(last - first, cols)
        if before_cast is not None:
            before_cast(name, values, first)
        out[first:last] = values  # (a copy: never a view of the file's read-only map)
    return out


def _rows(t: Any, first: int, last: int) -> torch.Tensor:
    """Rows [first, last) of a 2-D GGUF tensor, dequantized -> [last - first, cols] float32 (it may view the file's
    read-only map: the caller copies it)."""
    cols, rows = int(t.shape[0]), int(t.shape[1])
    flat = t.data.reshape(-1)  # bytes of blocks, or the values of a float type
    per_row = flat.shape[0] // rows
    part = dataclasses.replace(t, data=flat[first * per_row : last * per_row], shape=(cols, last - first),
                               n_elements=cols * (last - first), n_bytes=(last - first) * per_row * flat.itemsize)
    return torch.from_numpy(np.asarray(gguf_dequantize(part), dtype=np.float32).reshape(last - first, cols))


def gguf_first_rows(reader: GGUFHeader, gguf_name: str, rows: int) -> torch.Tensor | None:
    """The first `rows` rows of the 2-D tensor `gguf_name` as float32 (a copy), dequantized alone; None if the file
    has no such tensor (a fingerprint's corner of the embedding table, which was dequantized whole: seconds for an
    8B model's)."""
    t = next((t for t in reader.tensors if t.name == gguf_name and len(t.shape) == 2), None)
    if t is None:
        return None
    _check_byte_order(reader, t)
    return _rows(t, 0, min(rows, int(t.shape[1]))).clone()


def _unused(tensor_name: str) -> LongswiftError:
    """A tensor the model longswift builds has no place for: refused, since dropping it runs another model."""
    return LongswiftError(f"GGUF tensor '{tensor_name}' is not part of the model longswift runs; running without it "
                          "would compute another model")


def gguf_dequantize(t: Any) -> np.ndarray:
    """A GGUF tensor's values (flat or not), dequantized."""
    import gguf

    ours = DEQUANTIZE.get(getattr(t.tensor_type, "name", ""))  # the common block types, in torch
    try:
        if t.data.dtype.kind == "f":  # F32, F16, F64 as stored, in the file's byte order (gguf-py reads them as
            return t.data.astype(np.float32)  # the machine's: a big-endian file's numbers came out garbled)
        if ours is not None:
            return ours(t.data).numpy().reshape(-1)
        return gguf.quants.dequantize(t.data, t.tensor_type)
    except NotImplementedError:  # the gguf package reads most types, not all (Q8_K, integer tensors)
        type_name = getattr(t.tensor_type, "name", t.tensor_type)
        raise LongswiftError(f"cannot read GGUF tensor '{t.name}': the gguf package does not dequantize its type "
                             f"{type_name}; use a file of another type (F32, F16, BF16, Q8_0, Q4_K_M...) or the "
                             "model's Hugging Face checkpoint") from None
    except Exception as exc:
        raise LongswiftError(f"cannot dequantize GGUF tensor '{t.name}': {reason_of(exc)}") from None


def rest_is(tensor_name: str, kind: str) -> bool:
    return tensor_name.endswith(f".{kind}.weight") or tensor_name.endswith(f".{kind}.bias")
