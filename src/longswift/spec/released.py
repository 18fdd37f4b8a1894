"""TokenSwift's released-checkpoint layout for draft heads: a complete HF model directory whose
config has `medusa_heads` and whose state dict holds, next to the base model's tensors,
`model.medusa_layers.{i}.linear.weight` [hidden, hidden] (W_i), `.input_layernorm.weight` (RMSNorm_i)
and `.post_layernorm.weight` (RMSNorm'_i), in the model dtype. That is DraftHeads one to one."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ..atomic import check_new_dir, write_dir_atomically
from ..config import ModelConfig, dtype_name
from ..errors import LongswiftError
from ..runtime.loading.hub import parse_hub_id, resolve_hub_id
from ..runtime.loading import (
    EMBED,
    HEAD_PREFIX,
    check_finite,
    load_config,
    read_embed_corner,
    read_tensors,
    resolve_path,
    take_head_tensors,
    tensor_shapes,
)
from .heads import (
    HEADS_FILE,
    NEW_HEADS,
    TRAIN_CHECKPOINT,
    DraftHeads,
    describe_heads_file,
    may_have_shipped_heads,
    model_fingerprint,
    shipped_heads,
    training_summary,
)

# DraftHeads parameter <- the part of each released layer stacked into it.
_PARTS = {"weights": "linear.weight", "in_norms": "input_layernorm.weight", "out_norms": "post_layernorm.weight"}


def heads_from_tensors(tensors: dict[str, torch.Tensor], cfg: ModelConfig, fingerprint: str) -> DraftHeads:
    """DraftHeads holding exactly these (checked, see loading.take_head_tensors) released-layout tensors."""
    gamma = len(tensors) // len(_PARTS)
    heads = DraftHeads(cfg.hidden_size, gamma, cfg.rms_norm_eps, base_fingerprint=fingerprint)
    # No rounding on the way in: the parameters take the widest of the tensors' dtypes (the first tensor's
    # dtype rounded a checkpoint's float32 tensors to bfloat16 where a bfloat16 one came first).
    heads.to(functools.reduce(torch.promote_types, (t.dtype for t in tensors.values())))
    heads.load_state_dict({p: torch.stack([tensors[f"{HEAD_PREFIX}{i}.{part}"] for i in range(gamma)])
                           for p, part in _PARTS.items()})
    return heads


def tensors_from_heads(heads: DraftHeads, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The released layout of these heads (contiguous CPU tensors in `dtype`)."""
    state = heads.state_dict()
    return {f"{HEAD_PREFIX}{i}.{part}": state[p][i].detach().to("cpu", dtype).contiguous()
            for i in range(heads.gamma) for p, part in _PARTS.items()}


def heads_location(source: str) -> Path:
    """A local path as given, or the snapshot directory of a hub id `org/name[@revision]`. A
    train-heads --out whose training has not finished (a checkpoint, no heads file yet) is refused,
    saying so, rather than read as a released checkpoint that lacks config.json."""
    path = Path(source).expanduser()
    if path.is_dir() and not (path / HEADS_FILE).is_file() and (path / TRAIN_CHECKPOINT).is_file() \
            and not (path / "config.json").exists():
        raise LongswiftError(f"'{path}' holds a train-heads {TRAIN_CHECKPOINT} but no {HEADS_FILE}: its training did "
                             f"not finish; continue it with `longswift train-heads --out {path} --resume` and the "
                             "flags it was started with")
    return resolve_hub_id(source, "heads") if not path.exists() and parse_hub_id(source) else path


@dataclass(frozen=True)
class HeadsChoice:
    """Where `--heads` takes a model's heads from. kind: "none", "random", "checkpoint" (the model
    checkpoint's own, TokenSwift layout), "shipped" (inside the package, for this model), "released" (a
    TokenSwift-layout directory) or "file"; `path` for the last three."""

    kind: str
    path: Path | None = None


def choose_heads(heads: str, in_checkpoint: Callable[[], bool], shipped: Callable[[], Path | None]) -> HeadsChoice:
    """The one order of `--heads` (Engine.set_heads loads by it, `longswift info` describes it): "auto" is
    the checkpoint's own heads, else the shipped ones, else none; "default" only the shipped ones (refused
    where there are none); else a heads file, a directory holding one, or a released checkpoint (local or a
    hub id). The callables are asked only when the order reaches them (reading a checkpoint's header,
    hashing its embedding)."""
    if heads in ("none", "random"):
        return HeadsChoice(heads)
    if heads == "auto" and in_checkpoint():
        return HeadsChoice("checkpoint")
    if heads in ("auto", "default"):
        path = shipped()
        if path is None and heads == "default":  # asked for by name: not AR without a word
            raise LongswiftError(
                "no draft heads are shipped with longswift for this model, and heads='default' takes only those: "
                "pass a heads file or directory, or heads='auto' (AR where none are found)",
                cli_message="no draft heads are shipped with longswift for this model, and --heads default takes "
                            "only those: pass --heads FILE_OR_DIR, or --heads auto (AR where none are found)")
        return HeadsChoice("shipped", path) if path is not None else HeadsChoice("none")
    path = heads_location(heads)
    if path.is_dir() and not (path / HEADS_FILE).is_file():
        if not (path / "config.json").is_file():
            raise LongswiftError(f"heads '{path}' is a directory without {HEADS_FILE} or a released checkpoint "
                                 "(config.json): pass a heads file, a directory holding one, or a released checkpoint")
        return HeadsChoice("released", path)
    return HeadsChoice("file", path / HEADS_FILE if path.is_dir() else path)


def load_released_heads(path: Path, cfg: ModelConfig, embed: torch.Tensor, fingerprint: str | None = None) -> DraftHeads:
    """The heads of a released checkpoint directory for this base model (its embedding `embed`, whose
    device and dtype they take), refused if that checkpoint's base model is another one (same identity
    check as a heads file's). `fingerprint`: the model's (Engine.fingerprint; default: embed's)."""
    their_cfg = load_config(str(path))
    their_corner = read_embed_corner(path)
    if their_corner is None:
        raise LongswiftError(f"'{path}' has no {EMBED}: not a complete model directory")
    state = read_tensors(path, {k for k in tensor_shapes(path) if k.startswith(HEAD_PREFIX)})
    tensors = _head_tensors(path, their_cfg, state, embed.dtype)
    fingerprint = fingerprint or model_fingerprint(cfg, embed)
    if model_fingerprint(their_cfg, their_corner) != fingerprint:
        raise LongswiftError(f"heads in '{path}' were made for another model (its base model is not this one): "
                             "pass that checkpoint with --model, or train heads for this model")
    heads = heads_from_tensors(tensors, cfg, fingerprint)
    return heads.to(device=embed.device, dtype=embed.dtype)


def released_heads_as_stored(path: Path, cfg: ModelConfig, fingerprint: str) -> DraftHeads:
    """The heads of a released checkpoint directory (or a GGUF holding them) at the precision it stores them, for a
    base model already checked against it (load_released_heads or the model's load): an engine holds them in the
    model's dtype, so export-heads with --dtype bfloat16 (auto's on CUDA) wrote float32 tensors holding
    bfloat16-rounded values."""
    state = read_tensors(path, {k for k in tensor_shapes(path) if k.startswith(HEAD_PREFIX)})
    return heads_from_tensors(_head_tensors(path, load_config(str(path)), state), cfg, fingerprint)


def _head_tensors(path: Path, their_cfg: ModelConfig, state: dict[str, torch.Tensor],
                  dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The draft heads' tensors of a released directory's tensors `state` (taken out of it, checked complete,
    floating-point and finite, in `dtype` too where they are cast to it), or a one-line refusal where it has none
    or they are not."""
    tensors = take_head_tensors(their_cfg, state, str(path))
    if tensors is None:
        raise LongswiftError(f"'{path}' has no draft heads: no {HEAD_PREFIX}* tensors and no heads.safetensors")
    for name, t in tensors.items():  # (a model load checks its own so; these were read alone, unchecked)
        if not t.is_floating_point() or t.dtype.itemsize == 1:  # integers were cast without a word
            raise LongswiftError(f"'{path}' holds {t.dtype} values in '{name}', where draft heads are 16- to 64-bit "
                                 "floating-point weights: a quantized or damaged checkpoint")
        check_finite(name, t, path, dtype)  # NaN heads drafted nothing, every step wasted
    return tensors


def check_exportable(cfg: ModelConfig) -> None:
    """Refuse a model that a released checkpoint's config.json cannot describe (read from the config alone)."""
    if cfg.rope_freq_factors is not None:
        raise LongswiftError("this model's rope is scaled by a GGUF's rope_freqs factors, which a transformers "
                             "config.json cannot state (transformers and TokenSwift's code would run it unscaled): "
                             "export the heads alone with --format longswift, or export from the HF checkpoint")


# config.json key of an exported TokenSwift directory that keeps the heads' training record (train-heads'
# metadata of a heads file), so that exporting its heads back to a heads file keeps it; other tools ignore it.
TRAINING_KEY = "longswift_heads_training"


def released_training_record(path: Path) -> dict | None:
    """The heads' training record an export kept in a TokenSwift directory's config.json, or None."""
    try:
        training = json.loads((path / "config.json").read_text()).get(TRAINING_KEY)
    except (OSError, ValueError, AttributeError):
        return None
    return training if isinstance(training, dict) else None


def _trained(path: Path) -> str:
    """'; trained ...' from the training record an export kept in a TokenSwift directory, else ''."""
    made = training_summary({"training": released_training_record(path)}) if path.is_dir() else ""
    return f"; {made}" if made else ""


def export_tokenswift(out: str | os.PathLike, cfg: ModelConfig, state: dict[str, torch.Tensor], heads: DraftHeads,
                      tokenizer: Any, dtype: torch.dtype, training: dict | None = None,
                      on_stale: Callable[[Path], None] | None = None) -> Path:
    """Write base model + heads as a released TokenSwift checkpoint: an HF directory (config.json with
    `medusa_heads`, model.safetensors, the tokenizer, and generation_config.json with every id the model stops
    at, as transformers' generate() reads them: a generation config's <|eot_id|> or a GGUF's end-of-turn id,
    which config.json's eos_token_id may lack) that transformers and TokenSwift's code load.
    `training`: the heads' training record, kept in config.json (TRAINING_KEY). `on_stale`: hears of each
    temporary directory a killed export left there, which this one removes (write_dir_atomically)."""
    from safetensors.torch import save_file
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    check_new_dir(out)
    check_exportable(cfg)
    hf = cfg.hf_config.to_dict()
    hf["medusa_heads"] = heads.gamma
    hf["architectures"] = hf.get("architectures") or [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[cfg.architecture]]
    hf["dtype"] = hf["torch_dtype"] = dtype_name(dtype)
    hf.pop(TRAINING_KEY, None)  # (a config read from an earlier export: the record is these heads' or none)
    if training:
        hf[TRAINING_KEY] = training
    # transformers < 5 (TokenSwift's code pins 4.47) reads rope_theta / rope_scaling, not rope_parameters.
    rope = dict(hf.get("rope_parameters") or {})
    hf.setdefault("rope_theta", rope.get("rope_theta", 10000.0))
    if rope.get("rope_type", "default") != "default":
        hf.setdefault("rope_scaling", {k: v for k, v in rope.items() if k != "rope_theta"})
    tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in state.items()}
    tensors |= tensors_from_heads(heads, dtype)
    stops = list(cfg.eos_token_ids)
    generation = {"bos_token_id": hf.get("bos_token_id"), "eos_token_id": stops[0] if len(stops) == 1 else stops}

    def write(tmp: Path) -> None:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        (tmp / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
        if stops:
            (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2, sort_keys=True) + "\n")

    return write_dir_atomically(out, write, on_stale)


class FoundHeads(NamedTuple):
    """What `--heads` gives a model, read from file headers (describe_heads)."""

    text: str  # which heads and where they come from, for `longswift info`
    drafts: bool  # whether there are any (else generation runs AR)
    gamma: int | None  # how many heads, where a header says (a tree may be one depth deeper: spec_for_heads)


def describe_heads(model: str | None, heads: str, cfg: ModelConfig) -> FoundHeads:
    """Which heads `--heads` gives this model and where they come from, read from file headers
    (plus the embedding table when shipped heads might match), for `longswift info` and generate's checks before
    loading; whether there are any (else generation runs AR), and how many."""
    if heads == "none":
        return FoundHeads("none (AR)", False, None)
    path = resolve_path(model) if heads in ("auto", "default") else None

    @functools.cache  # each read once, if at all
    def model_embed() -> torch.Tensor:
        corner = read_embed_corner(resolve_path(model))
        if corner is None:
            raise LongswiftError(f"'{resolve_path(model)}' has no {EMBED}: not a complete model")
        return corner

    def head_tensors(where: Path, their_cfg: ModelConfig) -> list[str]:
        meta = {k: torch.empty(v, device="meta") for k, v in tensor_shapes(where).items() if k.startswith(HEAD_PREFIX)}
        return list(take_head_tensors(their_cfg, meta, str(where)) or ())

    @functools.cache
    def checkpoint_heads() -> list[str]:
        assert path is not None  # (choose_heads asks only for heads "auto")
        return head_tensors(path, cfg)

    def shipped() -> Path | None:
        return shipped_heads(model_fingerprint(cfg, model_embed())) if may_have_shipped_heads(cfg) else None

    choice = choose_heads(heads, lambda: bool(checkpoint_heads()), shipped)
    if choice.kind == "random":
        return FoundHeads("random heads (testing only)", True, NEW_HEADS)
    if choice.kind == "none":
        return FoundHeads("none: AR (the checkpoint has no heads and none are shipped for this model)", False, None)
    if choice.kind == "checkpoint":
        assert path is not None  # (only heads "auto" finds them in the checkpoint)
        n = len(checkpoint_heads()) // len(_PARTS)
        where = f"({HEAD_PREFIX}0..{n - 1}, TokenSwift layout) {path}"
        return FoundHeads(f"{n} heads inside the model checkpoint {where}{_trained(path)}", True, n)
    assert choice.path is not None  # ("shipped", "released" and "file" come with their path)
    if choice.kind == "shipped":
        what, gamma = describe_heads_file(choice.path, cfg, model_embed)
        return FoundHeads(f"heads shipped with longswift for this model: {choice.path} ({what})", True, gamma)
    if choice.kind == "released":
        if not any(name.startswith(HEAD_PREFIX) for name in tensor_shapes(choice.path)):  # (a plain model folder)
            return FoundHeads(f"'{choice.path}' has no draft heads (no {HEAD_PREFIX}* tensors and no "
                              "heads.safetensors): generate refuses it", True, None)
        try:  # (their checks are the load's: the count alone here)
            gamma = len(head_tensors(choice.path, load_config(str(choice.path)))) // len(_PARTS) or None
        except LongswiftError:
            gamma = None
        return FoundHeads(f"from the released checkpoint {choice.path} (TokenSwift layout; checked against the model "
                          f"when loaded){_trained(choice.path)}", True, gamma)
    if not choice.path.exists():
        raise LongswiftError(f"heads '{choice.path}' do not exist: pass a heads file, a directory holding one, or a "
                             "released checkpoint")
    what, gamma = describe_heads_file(choice.path, cfg, model_embed)
    return FoundHeads(f"from the heads file {choice.path}: {what}", True, gamma)
