"""Draft heads (TokenSwift, arXiv 2502.18890): gamma sequential residual blocks on the last layer's pre-norm hidden
state, `h_i = h_{i-1} + W_i RMSNorm_i(h_{i-1})`, read out through `RMSNorm'_i` and the base
model's frozen, shared LM head. Saved as one safetensors file whose metadata names the base."""

from __future__ import annotations

import hashlib
import json
import math
import os
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..atomic import replace_atomically
from ..config import ModelConfig
from ..errors import LongswiftError, unreadable
from ..runtime.loading import EMBED_CORNER, check_finite
from ..runtime.model import fused_norm_default, rms_norm

FORMAT = "longswift-heads"
HEADS_FILE = "heads.safetensors"  # the file name train-heads writes and --heads DIR looks for
TRAIN_CHECKPOINT = "checkpoint.pt"  # what train-heads writes next to it as it goes
VERSION = 1


def named_heads_file(heads: str | None) -> Path | None:
    """The heads file a --heads value names on disk (a file, or a directory's heads.safetensors), which no
    output may replace; None for a keyword, a hub id or a path that holds none."""
    if heads is None:
        return None
    path = Path(heads).expanduser()
    path = path / HEADS_FILE if path.is_dir() else path
    return path if path.is_file() else None


def model_fingerprint(cfg: ModelConfig, embed: torch.Tensor) -> str:
    """Identity of a base model: shape facts plus a hash of part of its embedding table
    (rounded to bfloat16 so that the same weights loaded in another dtype still match)."""
    sample = embed[: EMBED_CORNER[0], : EMBED_CORNER[1]].detach().to("cpu", torch.bfloat16)
    h = hashlib.sha256(sample.view(torch.int16).numpy().tobytes())
    h.update(f"{cfg.architecture}:{cfg.hidden_size}:{cfg.vocab_size}:{cfg.num_layers}".encode())
    return h.hexdigest()[:32]


class DraftHeads(nn.Module):
    """forward(h0 [T, hidden]) -> normalised head states [gamma, T, hidden], ready for the LM head."""

    def __init__(self, hidden_size: int, gamma: int = 3, eps: float = 1e-6,
                 final_norm: torch.Tensor | None = None, base_fingerprint: str | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.base_fingerprint = base_fingerprint  # the base model they were made for (model_fingerprint)
        if gamma <= 0:
            raise LongswiftError("draft heads need gamma >= 1")
        self.gamma, self.eps = gamma, eps
        # Made where and in the precision they run (an 8B model's are 200 MB in float32: not made on the host first).
        like: dict[str, Any] = {"device": device, "dtype": dtype}
        self.in_norms = nn.Parameter(torch.ones(gamma, hidden_size, **like))  # RMSNorm_i
        self.weights = nn.Parameter(torch.zeros(gamma, hidden_size, hidden_size, **like))  # W_i, zero: h_i = h_0
        out = (final_norm.detach().to(**like).expand(gamma, -1).clone() if final_norm is not None
               else torch.ones(gamma, hidden_size, **like))
        self.out_norms = nn.Parameter(out)  # RMSNorm'_i, initialised to the base model's final norm
        # A reduced dtype's norms in one op, scaled in float32 and rounded once (Transformer.norm): None =
        # on CUDA, where each op is a kernel; off elsewhere, the reference's LlamaRMSNorm rounding.
        self.fused_norm: bool | None = None

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        fused = fused_norm_default(x.device, x.dtype) if self.fused_norm is None else self.fused_norm
        return rms_norm(x, w, self.eps, fused)

    def forward(self, h0: torch.Tensor) -> torch.Tensor:
        h, outs = h0, []
        for i in range(self.gamma):
            h = h + F.linear(self._norm(h, self.in_norms[i]), self.weights[i])  # [T, hidden]
            outs.append(self._norm(h, self.out_norms[i]))
        return torch.stack(outs)  # [gamma, T, hidden]

    def randomize(self, seed: int, scale: float = 1.0) -> DraftHeads:
        """Random residual weights (for tests: heads that draft badly must still be lossless)."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            w = torch.randn(self.weights.shape, generator=g, dtype=torch.float32) * scale / self.weights.shape[-1] ** 0.5
            self.weights.copy_(w)
        return self


NEW_HEADS = 3  # heads new_heads makes unless told (the paper's gamma): random heads and train-heads' default


def new_heads(cfg: ModelConfig, state: dict[str, torch.Tensor], gamma: int = NEW_HEADS,
              fingerprint: str | None = None) -> DraftHeads:
    """Untrained heads for a base model, in its dtype and on its device; `fingerprint`: the model's
    (Engine.fingerprint; default: its embedding's in `state`)."""
    embed = state["model.embed_tokens.weight"]
    return DraftHeads(cfg.hidden_size, gamma, cfg.rms_norm_eps, state["model.norm.weight"],
                      fingerprint or model_fingerprint(cfg, embed), device=embed.device, dtype=embed.dtype)


def save_heads(heads: DraftHeads, cfg: ModelConfig, fingerprint: str, path: str | os.PathLike,
               extra: dict | None = None) -> None:
    """Atomically write heads + metadata (format, gamma, base model identity) to one file."""
    from safetensors.torch import save_file

    meta = {"format": FORMAT, "version": VERSION, "gamma": heads.gamma, "eps": heads.eps,
            "base": {"architecture": cfg.architecture, "hidden_size": cfg.hidden_size,
                     "vocab_size": cfg.vocab_size, "num_layers": cfg.num_layers, "fingerprint": fingerprint}}
    meta |= extra or {}
    tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in heads.state_dict().items()}
    replace_atomically(path, lambda tmp: save_file(tensors, str(tmp), metadata={FORMAT: json.dumps(meta)}))


SHIPPED_DIR = Path(__file__).parent.parent / "data"  # src/longswift/data (package data)


def _file_meta(path: Path) -> dict:
    """A heads file's metadata as written (no tensors read, nothing checked: {} if it has none)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return json.loads((f.metadata() or {}).get(FORMAT, "{}"))


def may_have_shipped_heads(cfg: ModelConfig) -> bool:
    """Whether some shipped heads file was made for a model of this shape (no weights needed)."""
    for path in sorted(SHIPPED_DIR.glob("*.safetensors")):
        if _shape_mismatch(_file_meta(path).get("base", {}), cfg) is None:
            return True
    return False


def shipped_heads(fingerprint: str) -> Path | None:
    """The heads file shipped inside the package for the base model of this fingerprint
    (model_fingerprint), if any."""
    for path in sorted(SHIPPED_DIR.glob("*.safetensors")):
        if _file_meta(path).get("base", {}).get("fingerprint") == fingerprint:
            return path
    return None


def _read_meta(path: Path, raw: str) -> dict:
    """The heads file's metadata, or a one-line error naming the file when it is not what save_heads writes."""

    def damaged(what: str) -> LongswiftError:
        return LongswiftError(f"heads file '{path}' has damaged '{FORMAT}' metadata ({what}): "
                              "re-export or retrain the heads")

    try:
        meta = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise damaged(f"not JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise damaged("not a JSON object")
    kind, version = meta.get("format"), meta.get("version")
    if kind == FORMAT and isinstance(version, int) and not isinstance(version, bool) and version > VERSION:
        # first: a newer format may keep gamma or its base elsewhere (it was called damaged: "re-export or retrain")
        raise LongswiftError(f"heads file '{path}' was written by a newer longswift (heads format version {version}; "
                             f"this one reads version {VERSION}): upgrade longswift to read it")
    gamma, eps, base = meta.get("gamma"), meta.get("eps", 1e-5), meta.get("base", {})
    if not isinstance(gamma, int) or isinstance(gamma, bool) or gamma <= 0:
        raise damaged(f"gamma must be a positive whole number, got {gamma!r}")
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not math.isfinite(eps) or not 0 <= eps <= 1:
        raise damaged(f"eps (the norms' epsilon) must be a number from 0 to 1, got {eps!r}")
    if not isinstance(base, dict):
        raise damaged(f"base must be an object, got {base!r}")
    lacking = [k for k in BASE_KEYS if k not in base]
    if lacking:  # (it was refused as "made for another model (architecture None vs llama)")
        raise damaged(f"its base model lacks {', '.join(lacking)}")
    if kind != FORMAT:
        raise damaged(f"format must be '{FORMAT}', got {kind!r}")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise damaged(f"version must be a positive whole number, got {version!r}")
    return {**meta, "base": base}


# What a heads file's metadata says of its base model (save_heads), every one of which _read_meta requires
BASE_KEYS = ("architecture", "hidden_size", "vocab_size", "num_layers", "fingerprint")
SHAPE_KEYS = BASE_KEYS[:-1]  # those a ModelConfig alone answers (no weights read)


def _shape_mismatch(base: dict, cfg: ModelConfig) -> str | None:
    """The first of SHAPE_KEYS where a heads file's base model differs from `cfg` ('hidden_size 4096 vs 576')."""
    k = next((k for k in SHAPE_KEYS if base.get(k) != getattr(cfg, k)), None)
    return None if k is None else f"{k} {base.get(k)} vs {getattr(cfg, k)}"


def _made_for_another(base: dict, cfg: ModelConfig, fingerprint: Callable[[], str]) -> str | None:
    """How a heads file's base model differs from this one ('hidden_size 4096 vs 576'), None if it is this
    one. The model's fingerprint (`fingerprint()`, which may read its embedding) is taken only when the
    shapes match."""
    if (mismatch := _shape_mismatch(base, cfg)) is not None:
        return mismatch
    return None if base.get("fingerprint") == fingerprint() else "embedding weights differ"


def training_record(path: Path) -> dict | None:
    """What train-heads recorded in a heads file (its `training` metadata), or None: kept by
    export-heads, so that an exported file still says how its heads were made."""
    training = _file_meta(path).get("training")
    return training if isinstance(training, dict) else None


def training_summary(meta: dict) -> str:
    """What train-heads recorded about how these heads were made, in a few words ('' if nothing)."""
    training = meta.get("training")
    if not isinstance(training, dict):
        return ""
    config = c if isinstance(c := training.get("config"), dict) else {}
    final = f if isinstance(f := training.get("final"), dict) else {}
    steps = final.get("step", config.get("steps"))
    made = " ".join(p for p in (f"trained {steps} steps" if isinstance(steps, int) else "",
                                f"on {training['windows']} windows" if isinstance(training.get("windows"), int) else "")
                    if p)
    acc = final.get("head_acc")
    if isinstance(acc, list) and acc and all(isinstance(a, (int, float)) for a in acc):
        accuracy = "final training accuracy per head " + ", ".join(f"{a:.3f}" for a in acc)
        return f"{made}, {accuracy}" if made else accuracy
    return made


# What heads files hold, by safetensors' dtype names: float32, float16, bfloat16, float64 (float8, integers: refused)
_WEIGHT_DTYPE_NAMES = frozenset({"F32", "F16", "BF16", "F64"})
# safetensors' names of the others, as torch names them in a message
_OTHER_DTYPES = {"F8_E4M3": "torch.float8_e4m3fn", "F8_E5M2": "torch.float8_e5m2", "I8": "torch.int8",
                 "I16": "torch.int16", "I32": "torch.int32", "I64": "torch.int64", "U8": "torch.uint8",
                 "BOOL": "torch.bool"}


def _header_layout(f: Any) -> dict[str, tuple[list[int], str]]:
    """A safetensors file's tensors as its header gives them (an open safe_open handle): name -> (shape,
    safetensors dtype name), no value read."""
    return {k: (s.get_shape(), s.get_dtype()) for k in f.keys() for s in (f.get_slice(k),)}


def _layout_problem(path: Path, gamma: int, cfg: ModelConfig, layout: dict[str, tuple[list[int], str]]) -> str | None:
    """What is wrong with a heads file's tensors as its header gives them (name -> (shape, safetensors dtype
    name)), as one line, or None: what load_heads refuses before reading a value, and what info says of it."""
    h = cfg.hidden_size
    want = {"weights": [gamma, h, h], "in_norms": [gamma, h], "out_norms": [gamma, h]}
    missing, extra = sorted(set(want) - set(layout)), sorted(set(layout) - set(want))
    shape = layout.get("weights", (None, ""))[0]
    if shape is not None and list(shape) != want["weights"]:
        # before DraftHeads allocates gamma [hidden, hidden] matrices for a gamma the file does not hold
        return (f"heads file '{path}' is damaged: its metadata says {gamma} heads, and the model's hidden size is "
                f"{h}, but its 'weights' tensor has shape {list(shape)}; re-export or retrain the heads")
    if missing or extra:
        what = "; ".join(p for p in (f"missing {', '.join(missing)}" if missing else "",
                                     f"unexpected {', '.join(extra)}" if extra else "") if p)
        return f"heads file '{path}' is damaged ({what}): re-export or retrain the heads"
    for name, (shape, dtype) in layout.items():
        if dtype not in _WEIGHT_DTYPE_NAMES:  # load_state_dict would copy integers into the float weights
            return (f"heads file '{path}' is damaged or of another kind: its '{name}' tensor holds "
                    f"{_OTHER_DTYPES.get(dtype, dtype)} values, "
                    "where heads are float32, float16 or bfloat16 weights; re-export or retrain the heads")
        if list(shape) != want[name]:
            return (f"heads file '{path}' is damaged (its '{name}' tensor has shape {list(shape)}, not "
                    f"{want[name]}): re-export or retrain the heads")
    return None


def describe_heads_file(path: Path, cfg: ModelConfig, embed: Callable[[], torch.Tensor]) -> tuple[str, int | None]:
    """A heads file's metadata in one line for `longswift info`: how many heads, how they were trained,
    and whether they were made for this model (what load_heads would check; `embed` is called only when
    the shapes match); and how many heads its metadata says (None where it cannot be read). Never raises for a
    bad file: it says what generate would refuse."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            raw = (f.metadata() or {}).get(FORMAT)
            layout = _header_layout(f)
    except (SafetensorError, OSError, ValueError) as exc:
        return f"unreadable ({exc}): generate refuses it", None
    if raw is None:
        return f"not a longswift heads file (no '{FORMAT}' metadata): generate refuses it", None
    try:
        meta = _read_meta(path, raw)
    except LongswiftError as exc:
        return f"{exc}", None
    other = _made_for_another(meta["base"], cfg, lambda: model_fingerprint(cfg, embed()))
    problem = None if other else _layout_problem(path, meta["gamma"], cfg, layout)
    if problem:  # (values, NaN included, are read by generate alone: info reads headers)
        return f"{problem}: generate refuses it", meta["gamma"]
    fit = f"made for another model ({other}): generate refuses them" if other else "made for this model"
    training = training_summary(meta)
    return f"{meta['gamma']} heads, {fit}" + (f"; {training}" if training else ""), meta["gamma"]


def _unreadable_heads(path: Path, exc: BaseException) -> LongswiftError:
    """Why load_heads could not read `path` as safetensors, in one line (a training checkpoint or another
    torch.save file is named as such)."""
    if zipfile.is_zipfile(path):  # torch.save's format, not safetensors
        if path.name == TRAIN_CHECKPOINT:
            return LongswiftError(f"'{path}' is a train-heads training checkpoint, not heads: pass the run's "
                                  f"{HEADS_FILE} (or its directory), which the run writes when it finishes")
        return LongswiftError(f"'{path}' is a torch.save file (a renamed train-heads {TRAIN_CHECKPOINT}?), not a "
                              f"safetensors heads file: pass the {HEADS_FILE} that train-heads or export-heads wrote")
    return unreadable(path, "heads file ", exc, "it is truncated or not a heads file")


def load_heads(path: str | os.PathLike, cfg: ModelConfig, embed: torch.Tensor, fingerprint: str | None = None) -> DraftHeads:
    """Load heads for this base model (its embedding `embed`, whose device and dtype they take), refusing
    files made for another model. `fingerprint`: the model's (Engine.fingerprint; default: embed's)."""
    from safetensors import SafetensorError, safe_open

    path = Path(path).expanduser()
    if path.exists() and not path.is_file():  # a device or pipe (/dev/null), not a missing file
        raise LongswiftError(f"heads file '{path}' is not a regular file: pass a heads file written by `longswift "
                             "train-heads`")
    if not path.is_file():
        raise LongswiftError(f"heads file '{path}' does not exist: train heads with `longswift train-heads` or drop heads= (--heads)")
    try:
        with safe_open(str(path), framework="pt") as f:
            raw = (f.metadata() or {}).get(FORMAT)
            layout = _header_layout(f)
    except (SafetensorError, OSError, ValueError) as exc:
        raise _unreadable_heads(path, exc) from None
    if raw is None:
        raise LongswiftError(f"'{path}' is not a longswift heads file (no '{FORMAT}' metadata)")
    meta = _read_meta(path, raw)
    fingerprint = fingerprint or model_fingerprint(cfg, embed)
    other = _made_for_another(meta["base"], cfg, lambda: fingerprint)
    if other:
        raise LongswiftError(f"heads '{path}' were made for another model ({other}): train heads for this model")
    problem = _layout_problem(path, meta["gamma"], cfg, layout)
    if problem:
        raise LongswiftError(problem)
    # The values only now, past every check of the header: a model's weights file given as --heads was read
    # whole (gigabytes) before it was refused as no heads file.
    try:
        with safe_open(str(path), framework="pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise _unreadable_heads(path, exc) from None
    bad = next((k for k, t in tensors.items() if not torch.isfinite(t).all()), None)
    if bad is not None:  # they would draft nothing useful (output stays lossless, but every step wasted)
        raise LongswiftError(f"heads file '{path}' holds NaN or infinite values in '{bad}' (a training run that "
                             "diverged, or a damaged file): retrain the heads, with a lower --lr if it diverged")
    if embed.dtype == torch.float16:  # (a float32 value past float16's range would run as an infinity)
        for k, t in tensors.items():
            check_finite(k, t, path, embed.dtype)
    heads = DraftHeads(cfg.hidden_size, meta["gamma"], float(meta.get("eps", cfg.rms_norm_eps)),
                       base_fingerprint=fingerprint)
    try:
        heads.load_state_dict(tensors)
    except RuntimeError as exc:  # torch's first line is only "Error(s) in loading state_dict for DraftHeads:"
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        detail = lines[1] if len(lines) > 1 else lines[0] if lines else type(exc).__name__
        raise LongswiftError(f"heads file '{path}' is damaged ({detail.rstrip('.')}): re-export or retrain the "
                             "heads") from None
    return heads.to(device=embed.device, dtype=embed.dtype)
