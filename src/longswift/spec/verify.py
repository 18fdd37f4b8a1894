"""The lossless walk (DESIGN §1 step 5): from the root, draw one token per visited node from
exactly the distribution AR would use at that position (the penalty window includes the path
accepted so far); descend while the draw is a child, and emit the first draw that is not.

Every emitted token is one AR draw — same transform, same single uniform from the generator — so
with the same seed the output is AR's output, token for token, whatever the heads drafted."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..config import SamplingConfig
from ..sampling import draw, transform
from .tree import NGRAM, Trie


@dataclass
class Walk:
    """Accepted trie nodes (root excluded, in order), their tokens, and the new root."""

    nodes: list[int]
    tokens: list[int]
    next_root: int
    ngram_only: int  # accepted nodes that only the n-gram table proposed


def lossless_walk(
    trie: Trie,
    row_logits: Callable[[int], torch.Tensor],
    history: torch.Tensor,
    length: int,
    sampling: SamplingConfig,
    generator: torch.Generator | None,
    stop_ids: frozenset[int] = frozenset(),
    max_tokens: int | None = None,
    pick: Callable[[torch.Tensor, SamplingConfig, torch.Generator | None], int] | None = None,
) -> Walk:
    """row_logits(i): the verify logits [V] of trie node i (computed only for visited nodes).
    history[:length] is the committed
    sequence ending with the root. Stops early after emitting a token in `stop_ids` or once
    `max_tokens` tokens (accepted + new root) are emitted; the last emitted is then `next_root`.
    `pick` draws a token (default `draw`; tensor parallel: rank 0 draws and broadcasts, so every rank
    walks the same path)."""
    pick = pick or draw
    nodes: list[int] = []
    tokens: list[int] = []
    w = sampling.penalty_window
    node = 0
    while True:
        d = len(tokens)
        recent = history[max(0, length + d - w) : length]  # the window: last w of history + path
        if d:
            path = torch.tensor(tokens[max(0, d - w) :], dtype=torch.long)
            recent = torch.cat([recent, path]) if w > 0 else recent[:0]
        logits = row_logits(node)
        x = transform(logits[None], recent.to(logits.device)[None], sampling)[0]
        y = pick(x, sampling, generator)
        child = trie.children[node].get(y)
        done = y in stop_ids or (max_tokens is not None and d + 1 >= max_tokens)
        if child is None or done:
            ngram_only = sum(1 for n in nodes if trie.sources[n] == NGRAM)
            return Walk(nodes, tokens, y, ngram_only)
        nodes.append(child)
        tokens.append(y)
        node = child
