"""The lossless walk (the TokenSwift step's accept stage, docs/design.md): from the root, draw one
token per visited node from exactly the distribution AR would use at that position (the penalty
window includes the path accepted so far); descend while the draw is a child, and emit the first
draw that is not.

Every emitted token is one AR draw — same transform, same single uniform from the generator — so
with the same seed the output is AR's output, token for token, whatever the heads drafted.

Two ways to walk, same tokens: `lossless_walk` transforms and draws the visited rows one by one
(computing only their logits: the CPU's choice, where a row's transform costs milliseconds), and
`batched_walk` transforms and draws every row of the trie at once and reads the draws back in one
device-to-host copy (the GPU's choice, where each read is a round trip that stalls the device).
A node's draw depends only on its own row, its path (the penalty window) and its depth (which
uniform of the step), so drawing at every node and then following the draws from the root visits
exactly the nodes, and emits exactly the tokens, that drawing along the way would."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..config import SamplingConfig
from ..sampling import draw, draw_rows, transform, uniforms
from .tree import NGRAM, Trie


@dataclass
class Walk:
    """Accepted trie nodes (root excluded, in order), their tokens, the new root, and which accepted nodes only
    the n-gram table proposed."""

    nodes: list[int]
    tokens: list[int]
    next_root: int
    ngram: tuple[bool, ...]  # [len(nodes)]: node i only the n-gram table proposed

    @classmethod
    def of(cls, trie: Trie, nodes: list[int], tokens: list[int], next_root: int) -> Walk:
        return cls(nodes, tokens, next_root, tuple(trie.sources[n] == NGRAM for n in nodes))

    @property
    def ngram_only(self) -> int:  # accepted nodes that only the n-gram table proposed
        return sum(self.ngram)


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
    w = sampling.penalized_window  # (0 where the penalty is off: no window cut, as batched_walk)

    def draw_at(node: int, path: list[int]) -> int:
        d = len(path)
        recent = history[max(0, length + d - w) : length]  # the window: last w of history + path
        if d:
            tail = torch.tensor(path[max(0, d - w) :], dtype=torch.long)
            recent = torch.cat([recent, tail]) if w > 0 else recent[:0]
        logits = row_logits(node)  # [V]
        x = transform(logits[None], recent.to(logits.device)[None], sampling)[0]  # [V]
        return pick(x, sampling, generator)

    return _descend(trie, draw_at, stop_ids, max_tokens)


def _descend(trie: Trie, draw_at: Callable[[int, list[int]], int], stop_ids: frozenset[int],
             max_tokens: int | None) -> Walk:
    """Follow the draws from the root: draw_at(node, accepted tokens so far) is the token drawn at `node`;
    a draw that is a child is accepted unless it stops the run (a stop id, or the max_tokens-th token);
    the first draw not accepted is the new root."""
    nodes: list[int] = []
    tokens: list[int] = []
    node = 0
    while True:
        y = draw_at(node, tokens)
        child = trie.children[node].get(y)
        done = y in stop_ids or (max_tokens is not None and len(tokens) + 1 >= max_tokens)
        if child is None or done:
            return Walk.of(trie, nodes, tokens, y)
        nodes.append(child)
        tokens.append(y)
        node = child


def node_windows(trie: Trie, history: torch.Tensor, length: int, window: int) -> torch.Tensor:
    """[N, W] long, -1 = padding: row i holds the penalty window AR would use to draw after node i's
    path: the last `window` tokens of history[:length] (which ends with the root) followed by the
    path's tokens (root excluded). Built on history's device; only the [N, depth] paths are copied."""
    n, deepest = len(trie), max(trie.depths)
    paths = [[-1] * deepest for _ in range(n)]  # row i: the tokens at depths 1..d of node i's path
    for i in range(1, n):
        paths[i] = list(paths[trie.parents[i]])
        paths[i][trie.depths[i] - 1] = trie.tokens[i]
    dev = history.device
    depths = torch.tensor(trie.depths, dtype=torch.long).to(dev, non_blocking=True)  # [N]
    tail = history[max(0, length - window) : length]  # [L] the root's window
    # A node at depth d sees history[max(0, length + d - window):length] then the last `window` of its path.
    drop = (length + depths - window).clamp(min=0) - max(0, length - window)  # [N] tail entries out of reach
    cols = torch.arange(tail.numel(), device=dev)
    hist = tail.expand(n, -1).masked_fill(cols[None] < drop[:, None], -1)  # [N, L]
    levels = torch.arange(deepest, device=dev)
    path = torch.tensor(paths, dtype=torch.long).reshape(n, deepest).to(dev, non_blocking=True)
    path = path.masked_fill(levels[None] < (depths - window)[:, None], -1)  # [N, depth]
    return torch.cat([hist, path], dim=1)


def batched_walk(
    trie: Trie,
    logits: torch.Tensor,
    history: torch.Tensor,
    length: int,
    sampling: SamplingConfig,
    generator: torch.Generator | None,
    stop_ids: frozenset[int] = frozenset(),
    max_tokens: int | None = None,
) -> Walk:
    """lossless_walk over the verify logits of every node [N, V] at once: one transform, one draw
    per node (node i uses the uniform of its depth), one device read; then the path is followed on
    the host. history[:length] (on the logits' device) is the committed sequence ending with the
    root. The generator ends where the row-by-row walk leaves it: advanced by the tokens emitted."""
    if logits.shape[0] != len(trie):  # a shape, no device read; padded rows are the caller's to slice off
        raise ValueError(f"batched_walk takes a row of logits per trie node: got {logits.shape[0]} rows for "
                         f"{len(trie)} nodes")
    w = sampling.penalized_window
    windows = node_windows(trie, history, length, w) if w > 0 else logits.new_empty(len(trie), 0, dtype=torch.long)
    x = transform(logits, windows, sampling)  # [N, V]
    u, gen = None, generator if generator is not None else torch.default_generator
    if not sampling.greedy:
        start = gen.get_state()
        u = uniforms(gen, max(trie.depths) + 1)[torch.tensor(trie.depths)]  # [N]: each node its depth's
    draws = draw_rows(x, sampling, u).tolist()  # the step's one device-to-host read
    walk = _descend(trie, lambda node, _path: draws[node], stop_ids, max_tokens)
    if u is not None:  # consume exactly one uniform per emitted token, as AR and the row walk do
        gen.set_state(start)
        uniforms(gen, len(walk.tokens) + 1)
    return walk
