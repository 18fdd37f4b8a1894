"""How the draft heads train: train-heads' flags come from this config (without importing torch, as the command
line parses them)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..config import flag_help, flag_name, seed_problem
from ..errors import LongswiftError

MAX_LR = 10.0  # far above any useful AdamW rate; a finite but huge one overflowed inside the optimizer


@dataclass
class TrainConfig:
    """How the heads train (paper: AdamW, cosine schedule, warmup 50, a few hundred steps)."""

    steps: int = field(default=300, metadata=flag_help("optimizer steps"))
    lr: float = field(default=3e-2, metadata=flag_help(
        "peak learning rate (AdamW); see docs/heads.md for why above the paper's 1e-3"))
    seq_len: int = field(default=512, metadata=flag_help("tokens per training window (the base's context)"))
    batch_size: int = field(default=4, metadata=flag_help("windows per micro-batch"))
    grad_accum: int = field(default=1, metadata=flag_help("micro-batches per optimizer step"))
    warmup: int = field(default=50, metadata=flag_help("linear warmup steps before the cosine decay"))
    weight_decay: float = field(default=0.0,
                                metadata=flag_help("AdamW weight decay, on the heads' matrices (not their norm gains)"))
    gamma: int = field(default=3, metadata=flag_help("number of draft heads"))
    seed: int = field(default=0, metadata=flag_help("seed for the data order and for --self-distill's sampling"))
    bf16_lm_head: bool | None = field(default=None, metadata=flag_help(
        "run the frozen LM head in bfloat16 autocast (default: where the device multiplies bfloat16 in hardware: "
        "on CUDA, and on CPUs with AVX512-BF16 or AMX; not on other CPUs, where a step ran ~3x slower with "
        "AVX-512 and 35x with AVX2 alone)"))
    checkpoint_every: int = field(default=50, metadata=flag_help("write a checkpoint every N steps"))
    chunk: int = field(default=1024, metadata=flag_help(
        "positions per loss chunk (bounds the [heads, chunk, vocab] logits memory)"))

    def __post_init__(self) -> None:
        for name in ("steps", "seq_len", "batch_size", "grad_accum", "gamma", "checkpoint_every", "chunk"):
            if getattr(self, name) <= 0:
                raise LongswiftError(f"{flag_name(name)} must be positive, got {getattr(self, name)}")
        if self.warmup < 0:
            raise LongswiftError(f"--warmup must be >= 0, got {self.warmup}")
        if self.warmup >= self.steps:  # the learning rate would never reach --lr, nor decay
            raise LongswiftError(f"--warmup ({self.warmup} steps) must be below --steps ({self.steps}): lower --warmup "
                                 "(0: none), or train longer")
        if not 0 < self.lr <= MAX_LR:  # (nan fails too) AdamW's step lr / (1 - beta1) overflowed float32 at 1e38
            raise LongswiftError(f"--lr must be a positive number up to {MAX_LR:g} (AdamW's peak learning rate; "
                                 f"the default is {TrainConfig.lr}), got {self.lr}")
        if not (self.weight_decay >= 0 and math.isfinite(self.weight_decay)):  # nan/inf: NaN heads after one step
            raise LongswiftError(f"--weight-decay must be a number >= 0, got {self.weight_decay}")
        if self.lr * self.weight_decay >= 1:  # AdamW scales the weights by 1 - lr x decay a step: 0 or below flips them
            raise LongswiftError(f"--weight-decay {self.weight_decay:g} at --lr {self.lr:g} scales the heads by "
                                 f"{1 - self.lr * self.weight_decay:.3g} a step (AdamW's 1 - lr x decay): keep lr x "
                                 "decay below 1 (AdamW's usual decay is 0.01-0.1)")
        if (problem := seed_problem(self.seed)) is not None:
            raise LongswiftError(problem)
        if self.seq_len < self.gamma + 2:
            raise LongswiftError(f"--seq-len must be at least gamma + 2 = {self.gamma + 2}, got {self.seq_len}")
