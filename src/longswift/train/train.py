"""Training the draft heads (docs/heads.md) on a frozen base model.

The base runs once per window, without autograd, to give the last layer's pre-norm hidden states
`h0 [N, L, hidden]`; only the heads (and their gradients and AdamW state) train. Loss: the sum over
heads of the cross-entropy of head i (1-based) at position t against the token at t+1+i, through
the base model's frozen LM head. Checkpoints are written atomically and resume exactly."""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..atomic import OutputLock, check_dir_writable, make_dirs, replace_atomically, write_atomic
from ..config import dtype_name, torch_seed
from ..errors import ConfigError, LongswiftError, reason_of, refuse_non_utf8
from ..runtime.memory import available_bytes, size_text
from ..spec.heads import HEADS_FILE, TRAIN_CHECKPOINT, DraftHeads, new_heads, save_heads
from ..runtime.probe import model_probe, same_model
from .config import TrainConfig

CHECKPOINT = TRAIN_CHECKPOINT
LOG_FILE = "train_log.json"


def learning_rate(cfg: TrainConfig, step: int) -> float:
    """Linear warmup to cfg.lr over cfg.warmup steps, then cosine decay to 0 at cfg.steps."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def base_hidden(model: Any, windows: torch.Tensor, progress: bool = False) -> torch.Tensor:
    """windows [N, L] -> the base's last-layer pre-norm hidden states [N, L, hidden] (no autograd), refused in
    one line where they do not fit in memory (the allocation's traceback, and a run that began regardless)."""
    n, length = windows.shape
    check_window_length(model.cfg, length)
    need = hidden_bytes(model, n, length)
    free = available_bytes(model.device)
    out = None
    if free is None or need <= free:
        try:
            out = torch.empty(n, length, model.cfg.hidden_size, dtype=model.dtype, device=model.device)
        except RuntimeError:  # (a limit that free memory does not show: ulimit -v, a cgroup's)
            pass
    if out is None:
        short = ("which this process could not allocate (a limit: ulimit -v, a container's)" if free is None
                 or need <= free else f"and {size_text(free)} is free")
        raise LongswiftError(f"the base model's hidden states of {n:,} windows of {length} tokens need "
                             f"{size_text(need)}, {short}: give less data (--data, --self-distill) or a smaller "
                             "--seq-len")
    for i, hidden in enumerate(window_hidden(model, windows, progress)):
        out[i] = hidden
    return out


def hidden_bytes(model: Any, n: int, length: int) -> int:
    """Bytes of base_hidden's hidden states of `n` windows of `length` tokens."""
    return n * length * model.cfg.hidden_size * model.dtype.itemsize


def check_window_length(cfg: Any, length: int) -> None:
    """Refuse windows longer than a sliding attention window (the model's ModelConfig `cfg`): a window's forward
    attends over all of it, which such a model never does past its window, so heads would learn from hidden
    states generation never feeds them (generation refuses runs past the window)."""
    if cfg.sliding_window is not None and length > cfg.sliding_window:
        raise LongswiftError(f"windows of {length} tokens pass this model's sliding attention window of "
                             f"{cfg.sliding_window} tokens, which longswift does not implement: train and evaluate on "
                             f"windows of at most {cfg.sliding_window} tokens (--seq-len)")


def window_hidden(model: Any, windows: torch.Tensor, progress: bool = False) -> Iterator[torch.Tensor]:
    """windows [N, L] -> each window's last-layer pre-norm hidden states [L, hidden] in turn (no autograd),
    refused past a sliding attention window (check_window_length)."""
    check_window_length(model.cfg, windows.shape[1])
    from tqdm import tqdm

    positions = torch.arange(windows.shape[1], device=model.device)
    for i in tqdm(range(windows.shape[0]), desc="base hidden states", unit="window", disable=not progress):
        with torch.no_grad():  # (not around the yield: the caller's code would run without autograd too)
            _, hidden = model.forward(windows[i], positions, None, logits_rows=slice(0, 0))
        yield hidden


def head_targets(windows: torch.Tensor, gamma: int, first: torch.Tensor | None = None) -> torch.Tensor:
    """windows [N, L] -> targets [gamma, N, L]: head i (0-based) at t predicts windows[t + 2 + i];
    -100 (ignored) where that falls outside the window, or before the window's `first` [N] target index
    (a self-distilled document's prompt: cut_counted_windows)."""
    n, length = windows.shape
    targets = torch.full((gamma, n, length), -100, dtype=torch.long, device=windows.device)
    for i in range(gamma):
        targets[i, :, : max(0, length - 2 - i)] = windows[:, 2 + i :]
    if first is not None:
        reach = torch.arange(length, device=windows.device) + 2 + torch.arange(gamma, device=windows.device)[:, None]
        targets[reach[:, None, :] < first.to(windows.device)[None, :, None]] = -100  # [gamma, 1, L] < [1, N, 1]
    return targets


@dataclass
class StepMetrics:
    step: int
    loss: float  # sum over heads of the mean cross-entropy
    head_loss: list[float]
    head_acc: list[float]  # top-1 accuracy per head
    lr: float
    seconds: float


def bf16_lm_head_default(device: torch.device) -> bool:
    """--bf16-lm-head where not given: on where the device multiplies bfloat16 in hardware (CUDA, and a CPU with
    AVX512-BF16 or AMX), off elsewhere: the LM head's product over a chunk's thousands of rows ran 6x slower than
    float32 under an AVX2-only CPU's emulation (session 48) and ~3x on AVX-512 without BF16, where oneDNN converts
    (a step 2.2-2.4 s against 0.73-0.78 s, session 59)."""
    from ..runtime.linear import bfloat16_products_native, onednn_computes

    return device.type != "cpu" or (onednn_computes(torch.bfloat16) and bfloat16_products_native())


def heads_dtype(model_dtype: torch.dtype) -> torch.dtype:
    """The dtype the heads train in: the model's, at least float32."""
    return torch.promote_types(model_dtype, torch.float32)


# A loss chunk's logits [gamma, chunk, vocab] are held about this many times over at a step's peak: the logits, the
# log-softmax cross_entropy keeps for backward, and the gradient backward makes of them (measured 3.03-3.06x on a
# CPU, float32 and bfloat16 logits, chunks of 512 to 4,096 positions, session 67).
LOSS_LOGITS_COPIES = 3


def check_loss_memory(engine: Any, cfg: TrainConfig, held: int) -> None:
    """Refuse a cfg.chunk whose loss logits (head_losses, LOSS_LOGITS_COPIES times over) do not fit in the free
    memory beside `held` bytes the steps hold too (the base's hidden states), before those are computed: the first
    step's allocation was a traceback, minutes in. Where `held` alone does not fit, base_hidden says so."""
    device = engine.model.device
    free = available_bytes(device)
    if free is None or held > free:
        return
    bf16 = cfg.bf16_lm_head if cfg.bf16_lm_head is not None else bf16_lm_head_default(device)
    dtype = heads_dtype(engine.model.dtype)
    elem = 2 if bf16 and dtype in (torch.float32, torch.bfloat16) else dtype.itemsize  # (head_losses' autocast)
    per_position = LOSS_LOGITS_COPIES * cfg.gamma * engine.cfg.vocab_size * elem
    positions = min(cfg.chunk, cfg.batch_size * cfg.seq_len)  # (a chunk holds at most a micro-batch's)
    need = positions * per_position
    if held + need <= free:
        return
    fit = (free - held) // per_position
    said = (f"makes each loss chunk's logits {cfg.gamma} heads x {positions:,} positions x {engine.cfg.vocab_size:,} "
            f"tokens of vocabulary, which need {size_text(need)} with their autograd copies, and "
            f"{size_text(free - held)} is free besides the base's hidden states ({size_text(held)})")
    if fit < 1:
        raise ConfigError(f"TrainConfig.chunk={cfg.chunk} {said}: even a chunk of 1 does not fit; train fewer heads "
                          "(gamma) or free memory", f"--chunk {cfg.chunk} {said}: even --chunk 1 does not fit; "
                          "give a lower --gamma or free memory")
    raise ConfigError(f"TrainConfig.chunk={cfg.chunk} {said}: lower it to at most {fit:,}",
                      f"--chunk {cfg.chunk} {said}: lower --chunk to at most {fit:,}")


def head_losses(heads: DraftHeads, lm_head: torch.Tensor, h0: torch.Tensor, targets: torch.Tensor,
                bf16: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """h0 [P, hidden], targets [gamma, P] -> (summed CE per head [gamma], correct top-1 [gamma],
    counted positions [gamma]); differentiable w.r.t. the heads only."""
    states = heads(h0)  # [gamma, P, hidden]
    use_bf16 = bf16 and states.dtype in (torch.float32, torch.bfloat16)
    with torch.autocast(states.device.type, dtype=torch.bfloat16, enabled=use_bf16):
        logits = F.linear(states, lm_head)  # [gamma, P, V]
    # The cross-entropy stays in bfloat16 too when asked (softmax accumulates in float32 inside;
    # 1.7x faster per chunk on a 2-core CPU); per-position losses are summed in float32.
    ce = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="none")
    ce = ce.view(targets.shape).to(torch.promote_types(ce.dtype, torch.float32)).sum(dim=1)  # [gamma]
    valid = targets != -100
    correct = ((logits.argmax(dim=-1) == targets) & valid).sum(dim=1)
    return ce, correct, valid.sum(dim=1)


def param_groups(heads: DraftHeads, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW's groups: the weight decay on the heads' matrices alone. Decaying the RMSNorm gains (as one group did
    before session 70) pulls them towards 0, not towards the base model's final norm they start from. One group
    a parameter, in the order of `heads.parameters()`, so that a checkpoint's state keeps its indices."""
    return [{"params": [p], "weight_decay": _decay(name, weight_decay)} for name, p in heads.named_parameters()]


def _decay(name: str, weight_decay: float) -> float:
    """The weight decay of the heads' parameter `name`: the matrices' alone."""
    return weight_decay if name == "weights" else 0.0


def regrouped(state: dict, heads: DraftHeads, weight_decay: float) -> dict:
    """An optimizer state dict from a checkpoint, in `param_groups`' layout: a checkpoint before session 70 holds
    one group of all the parameters (its state, indexed by parameter, is the same)."""
    groups = state.get("param_groups")
    if not (isinstance(groups, list) and len(groups) == 1 and isinstance(groups[0], dict)
            and isinstance(groups[0].get("params"), list) and len(groups[0]["params"]) > 1):
        return state  # (the current layout, or damaged: load_state_dict says which)
    one = groups[0]
    names = [name for name, _ in heads.named_parameters()]
    if len(one["params"]) != len(names):
        return state
    split = [{**one, "params": [i], "weight_decay": _decay(name, weight_decay)}
             for i, name in zip(one["params"], names)]
    return {**state, "param_groups": split}


class HeadTrainer:
    """Explicit training state: heads, AdamW, step, data order; `run_step()` does one optimizer step."""

    def __init__(self, engine: Any, windows: torch.Tensor, hidden: torch.Tensor, cfg: TrainConfig,
                 data_settings: dict | None = None, first: torch.Tensor | None = None) -> None:
        if cfg.bf16_lm_head is None:  # (the checkpoint and the heads file record what ran)
            cfg = replace(cfg, bf16_lm_head=bf16_lm_head_default(engine.model.device))
        self.engine, self.cfg = engine, cfg
        self.windows, self.hidden = windows, hidden  # [N, L], [M, L, hidden]: the M windows the steps read
        n = windows.shape[0]
        read = windows_read(cfg, n) if hidden.shape[0] < n else torch.arange(n)
        if hidden.shape[0] != read.shape[0]:
            raise ValueError(f"hidden states of {hidden.shape[0]} windows for the {read.shape[0]} of {n} this run "
                             "reads")
        self.row = torch.full((n,), -1, dtype=torch.long)  # window index -> its row of `hidden` (-1: never read)
        self.row[read] = torch.arange(read.shape[0])
        # [gamma, M, L], rows as `hidden`'s: the windows read alone (all N of them held 24 bytes a token of --data,
        # planned nowhere, where a short run reads a few)
        self.targets = head_targets(windows[read], cfg.gamma, None if first is None else first[read])
        model = engine.model
        self.lm_head = model.embed if engine.cfg.tie_word_embeddings else model.state_tensor("lm_head.weight")
        heads = new_heads(engine.cfg, model.state, cfg.gamma, fingerprint=engine.fingerprint)
        dtype = heads_dtype(engine.model.dtype)
        self.heads = heads.to(dtype).requires_grad_(True)
        if not cfg.bf16_lm_head and self.lm_head.dtype != dtype:  # a bfloat16/float16 model's head, without
            self.lm_head = self.lm_head.to(dtype)  # autocast: a copy in the heads' precision (the products agree)
        self.optimizer = torch.optim.AdamW(param_groups(self.heads, cfg.weight_decay), lr=cfg.lr)
        self.step = 0
        self.log: list[dict] = []
        self.interrupted = False  # stopped by a signal before the last step (train_heads' `stop`)
        self.resumed_at = 0  # the checkpoint's step when load_checkpoint continued one
        self.data_hash = window_hash(windows, first)
        self.settings = run_settings(model.dtype, engine.runtime.rope_scaling, data_settings)
        self.probe = model_probe(model)  # (a fine-tune with the base's embeddings has the base's fingerprint)

    @property
    def windows_read(self) -> int:
        """M: how many windows the steps read (those with hidden states)."""
        return int(self.hidden.shape[0])

    def batch_windows(self, step: int, micro: int) -> torch.Tensor:
        """Window indices of one micro-batch: a seeded permutation per epoch (resumable from `step` alone)."""
        return batch_windows(self.cfg, self.windows.shape[0], step, micro)

    def run_step(self) -> StepMetrics:
        cfg, t0 = self.cfg, time.perf_counter()
        assert cfg.bf16_lm_head is not None  # (__init__ resolved it)
        lr = learning_rate(cfg, self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        micro_batches = [self.batch_windows(self.step, m) for m in range(cfg.grad_accum)]
        total = sum(int((self.targets[:, self.row[idx]] != -100).sum(dim=(1, 2))[0]) for idx in micro_batches)
        ce_sum = torch.zeros(cfg.gamma, dtype=torch.float64)
        correct = torch.zeros(cfg.gamma, dtype=torch.long)
        counted = torch.zeros(cfg.gamma, dtype=torch.long)
        for idx in micro_batches:
            h0 = self.hidden[self.row[idx]].flatten(0, 1).to(self.heads.weights.dtype)  # [B*L, hidden]
            targets = self.targets[:, self.row[idx]].flatten(1, 2)  # [gamma, B*L]
            for lo in range(0, h0.shape[0], cfg.chunk):
                ce, c, v = head_losses(self.heads, self.lm_head, h0[lo : lo + cfg.chunk],
                                       targets[:, lo : lo + cfg.chunk], cfg.bf16_lm_head)
                (ce.sum() / total).backward()  # mean over positions, summed over heads
                ce_sum += ce.detach().double().cpu()
                correct += c.cpu()
                counted += v.cpu()
        if not torch.isfinite(ce_sum).all():  # before the update: the heads and the last checkpoint stay finite
            decay = f" or --weight-decay (now {cfg.weight_decay:g})" if cfg.weight_decay else ""
            raise LongswiftError(f"training diverged at step {self.step + 1} (loss {ce_sum.sum().item()}): the "
                                 f"checkpoints so far are intact; train again into a new --out with a lower --lr "
                                 f"(now {cfg.lr}){decay}")
        torch.nn.utils.clip_grad_norm_(self.heads.parameters(), 1.0)
        self.optimizer.step()
        self.step += 1
        head_loss = (ce_sum / counted.clamp(min=1)).tolist()
        metrics = StepMetrics(self.step, sum(head_loss), head_loss, (correct / counted.clamp(min=1)).tolist(), lr,
                              time.perf_counter() - t0)
        self.log.append(asdict(metrics))
        return metrics

    # -- checkpoints -------------------------------------------------------------------------
    def checkpoint_state(self) -> dict:
        return {"format": "longswift-train", "version": 1, "config": asdict(self.cfg), "step": self.step,
                "heads": {k: v.detach().cpu() for k, v in self.heads.state_dict().items()},
                "optimizer": self.optimizer.state_dict(), "data_hash": self.data_hash,
                "base": self.heads.base_fingerprint, "log": self.log,
                "settings": self.settings, "probe": self.probe}

    def save_checkpoint(self, path: Path) -> None:
        state = self.checkpoint_state()
        try:
            replace_atomically(path, lambda tmp: torch.save(state, tmp))
        except RuntimeError as exc:  # torch.save reports a failed write (a full disk) as a RuntimeError
            raise OSError(f"cannot write the checkpoint '{path}': {str(exc).splitlines()[0]}") from exc

    def load_checkpoint(self, path: Path) -> None:
        assert self.heads.base_fingerprint is not None  # (new_heads records the model's)
        ck = check_resumable(path, self.cfg, self.heads.base_fingerprint, self.data_hash,
                             settings=self.settings, probe=(self.probe, self.engine.model.dtype))
        try:
            with torch.no_grad():
                self.heads.load_state_dict(ck["heads"])
            self.optimizer.load_state_dict(regrouped(ck["optimizer"], self.heads, self.cfg.weight_decay))
        except (RuntimeError, ValueError, KeyError, TypeError) as exc:  # heads of another shape, an optimizer's
            raise LongswiftError(f"checkpoint '{path}' is damaged ({reason_of(exc)}): delete it to start over"
                                 ) from None
        self.step, self.log = int(ck["step"]), list(ck["log"])
        self.resumed_at = self.step


def run_settings(dtype: torch.dtype, rope_scaling: str | None,
                 data_settings: dict | None = None) -> dict[str, Any]:
    """The settings besides TrainConfig that change the base model's hidden states, and so the heads a
    run trains: a resume must use the same (kept in the checkpoint and the heads file's record).
    `data_settings`: what makes the windows besides TrainConfig (train-heads' --self-distill N and, where N > 0,
    --distill-new-tokens and --distill-batch), so that a resume with others is refused before it samples."""
    return {"dtype": dtype_name(dtype), "rope_scaling": rope_scaling, **(data_settings or {})}


def check_checkpoint(path: Path, cfg: TrainConfig, mmap: bool = False, settings: dict | None = None) -> dict:
    """A training checkpoint, refused in one line if it is damaged or was written with other settings
    (what can be checked without the model: train-heads --resume calls this before loading it).
    `settings`: run_settings of this run, checked against the checkpoint's where it has them."""
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # truncated, not a zip, unpickling refused
        raise LongswiftError(f"cannot read checkpoint '{path}' ({type(exc).__name__}): it is damaged; "
                             "delete it to start over") from None
    if not isinstance(ck, dict) or ck.get("format") != "longswift-train":
        raise LongswiftError(f"'{path}' is not a longswift training checkpoint")
    wrong = _wrong_part(ck)
    if wrong:  # (a hand-edited file: a KeyError, AttributeError or ZeroDivisionError traceback further on)
        raise LongswiftError(f"checkpoint '{path}' is damaged ({wrong}): delete it to start over")
    # (a setting left to its default by device, None, takes the checkpoint's: _train)
    differ = [(k, ck["config"].get(k), v) for k, v in asdict(cfg).items()
              if k != "checkpoint_every" and v is not None and ck["config"].get(k) != v]
    theirs = ck.get("settings")  # (checkpoints before session 32 have none)
    if settings is not None and isinstance(theirs, dict):
        # (a setting the checkpoint does not have is not checked: --self-distill's, before session 50)
        differ += [(k, "none" if theirs[k] is None else theirs[k], "none" if v is None else v)
                   for k, v in settings.items() if k in theirs and theirs[k] != v]
    if differ:  # every one at once (one a run was a resume refused four times over, when no flag was repeated)
        said = []
        for k, was, now in differ:
            flag = k.replace("_", "-")
            if isinstance(was, bool):  # a switch: its two spellings
                said.append(f"--{'' if was else 'no-'}{flag}, not --{'no-' if was else ''}{flag}")
            else:
                said.append(f"--{flag} {was}, not {now}")
        raise LongswiftError(f"checkpoint '{path}' used {'; '.join(said)}: resume with the same settings")
    return ck


# What every training checkpoint holds, and of which type (settings: from session 32 on, not required).
_PARTS: dict[str, type | tuple[type, ...]] = {"config": dict, "step": int, "heads": dict, "optimizer": dict,
                                              "data_hash": str, "base": str, "log": list}


def _wrong_part(ck: dict) -> str | None:
    """What is missing or of the wrong type in a training checkpoint, or None."""
    for key, kind in _PARTS.items():
        value = ck.get(key)
        if key not in ck:
            return f"it lacks '{key}'"
        if not isinstance(value, kind) or isinstance(value, bool):
            return f"its '{key}' is {type(value).__name__}, not {getattr(kind, '__name__', kind)}"
    if ck["step"] < 0:
        return f"its step is {ck['step']}"
    if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in ck["heads"].items()):
        return "its 'heads' are not named tensors"
    return None


def batch_windows(cfg: TrainConfig, n: int, step: int, micro: int) -> torch.Tensor:
    """Indices of the windows (of `n`) micro-batch `micro` of step `step` trains on: the k-th read of a run is
    place k mod n of a permutation seeded by cfg.seed and the epoch k // n."""
    per_step = cfg.batch_size * cfg.grad_accum
    start = step * per_step + micro * cfg.batch_size
    idx = []
    for k in range(start, start + cfg.batch_size):
        epoch, offset = divmod(k, n)
        idx.append(int(_epoch_order(cfg.seed, epoch, n)[offset]))
    return torch.tensor(idx)


@functools.lru_cache(maxsize=2)
def _epoch_order(seed: int, epoch: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(torch_seed(seed * 1_000_003 + epoch))
    return torch.randperm(n, generator=g)


def windows_read(cfg: TrainConfig, n: int) -> torch.Tensor:
    """The indices, ascending, of the windows (of `n`) that a run of cfg.steps steps trains on at all: each, once
    every window is read (an epoch or more). The hidden-state pass runs on these alone: with more data than the
    steps read (1.5 MB of text, 9,375 windows of 32 tokens, for 2 steps of 2) it ran over all of it, minutes
    and gigabytes for windows no step draws."""
    reads = cfg.steps * cfg.batch_size * cfg.grad_accum
    if reads >= n:
        return torch.arange(n)
    return _epoch_order(cfg.seed, 0, n)[:reads].sort().values


def window_hash(windows: torch.Tensor, first: torch.Tensor | None = None) -> str:
    """Identity of the training windows [N, L] and of their first target indices [N] where any is past 0 (the
    targets differ), kept in the checkpoint so a resume runs on the same data (plain text's hash is the windows')."""
    data = windows.cpu().numpy().tobytes()
    if first is not None and bool((first > 0).any()):
        data += b"first" + first.cpu().numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:20]


def check_resumable(path: Path, cfg: TrainConfig, fingerprint: str, data_hash: str, mmap: bool = False,
                    settings: dict | None = None, probe: tuple[list[float], torch.dtype] | None = None) -> dict:
    """check_checkpoint, and refuse a checkpoint of another base model (`fingerprint`, and the model's `probe` and
    dtype where the checkpoint keeps one: runtime/probe.py) or other windows."""
    ck = check_checkpoint(path, cfg, mmap=mmap, settings=settings)
    again = "resume with the --model it was started with, or train this model into a new --out"
    if ck["base"] != fingerprint:
        raise LongswiftError(f"checkpoint '{path}' was trained on another base model: {again}")
    if probe is not None and "probe" in ck and not same_model(ck["probe"], *probe):  # (none before session 50)
        raise LongswiftError(f"checkpoint '{path}' was trained on another model with this one's embeddings (a "
                             f"fine-tune of it, or its base): {again}")
    if ck["data_hash"] != data_hash:
        raise LongswiftError(f"checkpoint '{path}' was trained on other data: pass the same --data/--self-distill")
    return ck


def check_out_dir(out_dir: str | os.PathLike, resume: bool) -> Path:
    """Refuse an --out that cannot be trained into, creating nothing (train-heads calls this before
    loading the model and distilling): a finished run there (its heads, with or without their checkpoint;
    --resume has nothing left to do), a checkpoint without --resume, none with it, or a train_log.json
    that no unfinished run of this directory wrote."""
    refuse_non_utf8(out_dir, "--out")  # (the run's heads are a safetensors file)
    out = check_dir_writable(out_dir, "--out")
    checkpoint = out / CHECKPOINT
    if checkpoint.exists() and (out / HEADS_FILE).exists():  # nothing left to continue
        done = "; --resume has nothing left to do (a run cannot add steps)" if resume else ""
        raise LongswiftError(f"'{out}' holds a finished run ({HEADS_FILE} and its {CHECKPOINT}){done}: choose another "
                             "--out, or move those files away")
    if checkpoint.exists() and not resume:
        raise LongswiftError(f"'{checkpoint}' exists: pass --resume to continue it, or choose another --out")
    if (out / HEADS_FILE).exists() and not checkpoint.exists():  # a finished run's heads: never trained over
        raise LongswiftError(f"'{out / HEADS_FILE}' exists (the heads of a finished run): choose another --out, or "
                             "move that file away")
    if resume and not checkpoint.exists():
        raise LongswiftError(f"nothing to resume: '{checkpoint}' does not exist")
    if (out / LOG_FILE).exists() and not checkpoint.exists():  # another run's log (or a file of that name)
        raise LongswiftError(f"'{out / LOG_FILE}' exists, which a run writes at its end: choose another --out, or "
                             "move that file away")
    return out


CONVERGENCE_STEPS = 8  # steps a run needs before its losses are compared, and how many of its last it averages


def not_converged(log: list[dict], lr: float) -> str | None:
    """What a finished run whose last steps' mean loss is above its first step's should be told (a --lr too
    high for the data moves the heads away from any minimum without a non-finite loss), else None. Runs
    shorter than CONVERGENCE_STEPS are not judged: a step's loss is one batch's, and noisy."""
    if len(log) < CONVERGENCE_STEPS:
        return None
    last = sum(m["loss"] for m in log[-CONVERGENCE_STEPS:]) / CONVERGENCE_STEPS
    if last <= log[0]["loss"]:
        return None
    return (f"the last {CONVERGENCE_STEPS} steps' mean loss ({last:.3f}) is above the first step's "
            f"({log[0]['loss']:.3f}): the heads did not learn; train again into a new --out with a lower --lr "
            f"(now {lr:g})")


@contextmanager
def claimed_out_dir(out_dir: str | os.PathLike, resume: bool,
                    on_stale: Callable[[Path], None] | None = None) -> Iterator[Path]:
    """Check --out (check_out_dir), make it, and hold it for this run: one run at a time per --out, since a
    second one would overwrite the first's checkpoint and heads. The lock also removes temp files a killed
    run left (`checkpoint.pt.<random>.partial`; `on_stale` hears of each). Yields the directory."""
    out = check_out_dir(out_dir, resume)
    try:
        make_dirs(out)
    except OSError as exc:
        raise LongswiftError(f"cannot create output directory '{out}': {exc.strerror}") from None
    if not os.access(out, os.W_OK):
        raise LongswiftError(f"output directory '{out}' is not writable: choose another --out")
    with OutputLock([("--out", out / name) for name in (CHECKPOINT, HEADS_FILE, LOG_FILE)], on_stale):
        check_out_dir(out, resume)  # a run that held the lock before this one may have written a checkpoint
        yield out


def train_heads(engine: Any, windows: torch.Tensor, cfg: TrainConfig, out_dir: str | os.PathLike,
                resume: bool = False, progress: bool = True, extra_meta: dict | None = None,
                log: Callable[[str], None] | None = None,
                stop: Any = None, claimed: bool = False, data_settings: dict | None = None,
                first: torch.Tensor | None = None) -> HeadTrainer:
    """Train heads on token windows [N, seq_len]; write checkpoints and `heads.safetensors` in out_dir.
    `stop`: a context manager (cli.stop.StopRequest) entered from the hidden states on, which a signal
    interrupts at once (its `at_once()`: nothing to save yet); during the optimizer steps, once its
    `signum` is set, training stops after the current step, saves the checkpoint and returns the
    trainer with `interrupted` set (no heads file: `resume=True` finishes the run). `claimed`: the caller
    holds `claimed_out_dir(out_dir)` already (train-heads takes it before loading the model). `log`: where to
    say, in plain lines, what it starts and each checkpoint's step, loss and accuracy (a log file's progress,
    where no bar is drawn). `data_settings`: see run_settings. `first`: each window's first target index [N]
    (cut_counted_windows: a self-distilled document's prompt is context, not a target); None: every token is one."""
    check_batch(cfg, windows.shape[0])
    if claimed:
        return _train(engine, windows, cfg, Path(out_dir), resume, progress, extra_meta, stop, log, data_settings,
                      first)
    with claimed_out_dir(out_dir, resume) as out:
        return _train(engine, windows, cfg, out, resume, progress, extra_meta, stop, log, data_settings, first)


def check_batch(cfg: TrainConfig, n: int) -> None:
    """Refuse a step that would read a window more than once on average: cfg.batch_size, or it x cfg.grad_accum,
    above the `n` windows of the data (train-heads checks the count before self-distill samples)."""
    if cfg.batch_size > n:  # (accepted: 1,000 on 12 windows read each ~83 times a step, for minutes a step)
        said = (f"exceeds the {n} windows of the training data: a batch would hold each window "
                f"{cfg.batch_size / n:.1f} times on average; give at most {n}, or more data")
        raise ConfigError(f"TrainConfig.batch_size={cfg.batch_size} {said}", f"--batch-size {cfg.batch_size} {said}")
    per_step = cfg.batch_size * cfg.grad_accum
    if per_step > n:  # (--batch-size 300 --grad-accum 20 on 308 windows: each read ~19 times a step, 7 s a step)
        def too_many(accum: str) -> str:
            return (f"= {per_step} windows a step exceeds the {n} windows of the training data: a step would read "
                    f"each window {per_step / n:.1f} times on average; give {accum} at most {n // cfg.batch_size}, "
                    "or more data")

        raise ConfigError(f"TrainConfig.batch_size={cfg.batch_size} x grad_accum={cfg.grad_accum} "
                          + too_many("a grad_accum of"),
                          f"--batch-size {cfg.batch_size} x --grad-accum {cfg.grad_accum} " + too_many("--grad-accum"))


def _train(engine: Any, windows: torch.Tensor, cfg: TrainConfig, out: Path, resume: bool, progress: bool,
           extra_meta: dict | None, stop: Any, log: Callable[[str], None] | None = None,
           data_settings: dict | None = None, first: torch.Tensor | None = None) -> HeadTrainer:
    from contextlib import nullcontext

    from tqdm import tqdm

    checkpoint = out / CHECKPOINT
    windows = windows.to(engine.model.device)
    if resume:  # another base model or other data: said before the hidden states, which take minutes
        ck = check_resumable(checkpoint, cfg, engine.fingerprint, window_hash(windows, first), mmap=True,
                             settings=run_settings(engine.model.dtype, engine.runtime.rope_scaling, data_settings),
                             probe=(model_probe(engine.model), engine.model.dtype))
        if cfg.bf16_lm_head is None:  # a resumed run goes on as it started, on whatever machine
            cfg = replace(cfg, bf16_lm_head=bool(ck["config"].get("bf16_lm_head", True)))
        del ck  # (mapped: trainer.load_checkpoint reads it again)
    with stop if stop is not None else nullcontext():
        with stop.at_once() if stop is not None else nullcontext():
            read = windows_read(cfg, windows.shape[0])  # (the windows its steps draw: all, from an epoch on)
            if log:
                log(f"base model's hidden states of {read.shape[0]:,} windows" + (
                    f" (of {windows.shape[0]:,}: the ones {cfg.steps} step{'s' if cfg.steps != 1 else ''} of "
                    f"{cfg.batch_size * cfg.grad_accum} read)"
                    if read.shape[0] < windows.shape[0] else ""))
            check_loss_memory(engine, cfg, held=hidden_bytes(engine.model, read.shape[0], windows.shape[1]))
            hidden = base_hidden(engine.model, windows[read.to(windows.device)], progress)
        trainer = HeadTrainer(engine, windows, hidden, cfg, data_settings, first)
        if resume:
            trainer.load_checkpoint(checkpoint)
        if log:
            every = (f"every {cfg.checkpoint_every} steps and the last" if cfg.checkpoint_every < cfg.steps
                     else "after the last step")
            log(f"training {cfg.steps} step{'s' if cfg.steps != 1 else ''}"
                + (f", from step {trainer.step}" if trainer.step else "") + f"; a line at each checkpoint ({every})")
        t0 = time.perf_counter()
        bar = tqdm(total=cfg.steps, initial=trainer.step, desc="train heads", unit="step", disable=not progress)
        while trainer.step < cfg.steps:
            m = trainer.run_step()
            bar.update(1)
            bar.set_postfix_str(f"loss {m.loss:.3f} acc " + "/".join(f"{a:.2f}" for a in m.head_acc))
            stopping = stop is not None and stop.signum is not None
            if trainer.step % cfg.checkpoint_every == 0 or trainer.step == cfg.steps or stopping:
                trainer.save_checkpoint(checkpoint)
                if log:
                    acc = "/".join(f"{a:.3f}" for a in m.head_acc)
                    log(f"step {trainer.step}/{cfg.steps}: loss {m.loss:.3f}, top-1 accuracy per head {acc}; "
                        f"checkpoint saved ({time.perf_counter() - t0:.0f} s)")
            if stopping and trainer.step < cfg.steps:
                bar.close()
                trainer.interrupted = True
                return trainer
    bar.close()
    # "windows": those the steps read (of the data's, which may be many more: the hidden states' line says both)
    # "rope": the rope the base model ran with (its own scaling or --rope-scaling's), which Engine.heads_note compares
    meta = {"training": {"config": asdict(trainer.cfg), "settings": trainer.settings, "rope": engine.cfg.rope_setting,
                         "windows": trainer.windows_read,
                         "final": trainer.log[-1] if trainer.log else None} | (extra_meta or {})}
    assert trainer.heads.base_fingerprint is not None  # (new_heads records the model's)
    save_heads(trainer.heads, engine.cfg, trainer.heads.base_fingerprint, out / HEADS_FILE, meta)
    write_atomic(out / LOG_FILE, json.dumps(trainer.log, indent=1))
    return trainer
