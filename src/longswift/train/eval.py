"""How good are draft heads: per-head top-1/top-3 accuracy on held-out text, and TokenSwift's
acceptance rate alpha on a held-out generation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..config import GenerationConfig, SamplingConfig, SpecConfig
from ..errors import ADD_TOKENIZER_FILES, LongswiftError
from ..spec.heads import DraftHeads
from .train import head_targets, window_hidden

HELD_OUT_PROMPT = "Write a long novel chapter about a family reunion at a mountain inn cut off by a snowstorm."


@dataclass
class HeadAccuracy:
    positions: int  # positions counted per head (head 1's; deeper heads have a few fewer per window)
    top1: list[float]  # per head
    top3: list[float]

    def describe(self) -> str:
        return ", ".join(f"head {i + 1}: top-1 {a:.3f} top-3 {b:.3f}" for i, (a, b) in enumerate(zip(self.top1, self.top3)))


def check_window(seq_len: int, gamma: int) -> None:
    """Refuse windows too short for the deepest head (head i at t predicts the token at t+1+i) to have a
    target: its accuracy would be a 0 over no positions."""
    if seq_len < gamma + 2:
        raise LongswiftError(f"--seq-len {seq_len} leaves head {gamma} no token to predict: these {gamma} heads "
                             f"need windows of at least {gamma + 2} tokens")


def head_accuracy(engine: Any, heads: DraftHeads, windows: torch.Tensor, chunk: int = 1024,
                  progress: bool = False, first: torch.Tensor | None = None) -> HeadAccuracy:
    """Top-1/top-3 accuracy of each head (head i at t predicting the token at t+1+i) on windows [N, L], counting
    the targets from each window's `first` index [N] on (a self-distilled document's prompt is not counted, as
    training does not learn it). The base's hidden states are taken a window at a time (all of them at once did
    not fit in memory for large data)."""
    check_window(int(windows.shape[1]), heads.gamma)
    model = engine.model
    windows = windows.to(model.device)
    targets = head_targets(windows, heads.gamma, first)  # [gamma, N, L]
    top1 = torch.zeros(heads.gamma, dtype=torch.long)
    top3 = torch.zeros(heads.gamma, dtype=torch.long)
    count = torch.zeros(heads.gamma, dtype=torch.long)
    with torch.no_grad():
        for i, h0 in enumerate(window_hidden(model, windows, progress)):  # [L, hidden]
            for lo in range(0, h0.shape[0], chunk):
                states = heads(h0[lo : lo + chunk].to(heads.weights.dtype))  # [gamma, P, hidden]
                logits = model.lm_head(states.flatten(0, 1).to(model.dtype)).view(*states.shape[:2], -1)
                best3 = torch.topk(logits, 3, dim=-1).indices  # [gamma, P, 3]
                t = targets[:, i, lo : lo + chunk]
                valid = t != -100
                hit = best3 == t[..., None]
                top1 += (hit[..., 0] & valid).sum(dim=1).cpu()
                top3 += (hit.any(dim=-1) & valid).sum(dim=1).cpu()
                count += valid.sum(dim=1).cpu()
    c = count.clamp(min=1).double()
    return HeadAccuracy(int(count[0]), (top1 / c).tolist(), (top3 / c).tolist())


def check_alpha_fits(engine: Any, new_tokens: int, prompt: str = HELD_OUT_PROMPT,
                     spec: SpecConfig | None = None) -> None:
    """Refuse, naming --alpha-tokens, a held-out generation longer than the model's context, or one that this
    model, without a tokenizer, cannot write from its text prompt; and a `spec` its heads cannot draft (a tree
    deeper than they are), which the run would refuse only after the accuracy's work."""
    from ..spec.tokenswift import spec_for_heads

    spec_for_heads(spec or SpecConfig(), engine.model.device, engine.heads.gamma)
    if engine.tokenizer is None:  # (encode's advice, to give token ids, is not one eval-heads can take)
        raise LongswiftError("the alpha run writes from a held-out text prompt, and this model has no tokenizer: "
                             f"{ADD_TOKENIZER_FILES}, or give --alpha-tokens 0")
    total, limit = len(engine.encode(prompt, chat=None)) + new_tokens, engine.cfg.context_limit
    if total > limit:
        raise LongswiftError(f"--alpha-tokens {new_tokens} + the held-out prompt's {total - new_tokens} tokens exceed "
                             f"this model's context of {limit}: lower --alpha-tokens (0 skips the alpha run)")


def held_out_alpha(engine: Any, new_tokens: int, prompt: str = HELD_OUT_PROMPT,
                   sampling: SamplingConfig | None = None, spec: SpecConfig | None = None,
                   progress: bool = False) -> Any:
    """Generate `new_tokens` with TokenSwift from a prompt the training set does not hold (paper
    sampling, seed 0, EOS ignored) and return the generation stats (alpha, tokens per step...);
    `progress`: a bar of the tokens on stderr."""
    from tqdm import tqdm

    sampling = sampling or SamplingConfig(seed=0)
    stream = engine.stream(prompt, sampling=sampling, chat=None, method="tokenswift", spec=spec,
                           generation=GenerationConfig(max_new_tokens=new_tokens, ignore_eos=True))
    with tqdm(total=new_tokens, desc="alpha generation", unit="tok", disable=not progress) as bar:
        for ids in stream:
            bar.update(len(ids))
    return stream.result.stats
