"""The candidate trie verified in one forward: node 0 is the root (the last sampled token),
every other node a drafted token; a prefix shared by several candidates is a single node.

Each node carries a score, the log of how likely its drafters think its whole path is (the heads:
the sum of their log-probabilities along it; n-grams: the log of the path's share of the table's
continuations); a node both proposed keeps the larger. `pruned` keeps a node budget's most likely
nodes. Scores and pruning choose what is verified, never what is emitted: the walk is the same for
any trie."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

HEADS, NGRAM = 1, 2  # where a node's token was proposed (a bit mask: both is possible)


@dataclass
class Trie:
    tokens: list[int]
    parents: list[int]  # -1 for the root
    depths: list[int]  # 0 for the root
    children: list[dict[int, int]]  # token -> child node
    sources: list[int] = field(default_factory=list)  # HEADS | NGRAM bits per node (0 for the root)
    scores: list[float] = field(default_factory=list)  # log-likelihood of each node's path (0 for the root)

    @classmethod
    def with_root(cls, root: int) -> Trie:
        return cls([root], [-1], [0], [{}], [0], [0.0])

    def __len__(self) -> int:
        return len(self.tokens)

    def _child(self, node: int, token: int, source: int, score: float = 0.0) -> int:
        """The child of `node` holding `token`, created if needed; marks who proposed it and keeps
        the larger of its scores."""
        child = self.children[node].get(token)
        if child is None:
            child = len(self.tokens)
            self.tokens.append(token)
            self.parents.append(node)
            self.depths.append(self.depths[node] + 1)
            self.children.append({})
            self.sources.append(0)
            self.scores.append(score)
            self.children[node][token] = child
        elif score > self.scores[child]:
            self.scores[child] = score
        self.sources[child] |= source
        return child

    def add_path(self, tokens: Sequence[int], source: int, scores: Sequence[float] | None = None) -> None:
        """Insert root -> tokens[0] -> tokens[1] -> ..., reusing existing prefix nodes; `scores`: each
        prefix's path score (default 0)."""
        node = 0
        for j, t in enumerate(tokens):
            node = self._child(node, int(t), source, 0.0 if scores is None else scores[j])

    def missing(self, tokens: Sequence[int]) -> int:
        """How many new nodes add_path(tokens) would create (those past the prefix the trie holds)."""
        node = 0
        for j, t in enumerate(tokens):
            child = self.children[node].get(int(t))
            if child is None:
                return len(tokens) - j
            node = child
        return 0

    def add_levels(self, levels: Sequence[Sequence[int]], logprobs: Sequence[Sequence[float]] | None = None,
                   keep: int | None = None) -> None:
        """The heads' cartesian tree: every node at depth j gets all of levels[j] as children;
        `logprobs[j][i]`: the log-probability of levels[j][i], summed along each path into its score.
        `keep` (with logprobs): of each depth, only its `keep` highest-scoring nodes (ties: the earlier) are made
        and grown, as `pruned(keep + 1)` keeps no other: each of those outranks every node below the rest, whose
        scores, sums of log-probabilities, are at most theirs (a 64,64,64,64 tree made 16.8 M nodes to keep 32)."""
        frontier = [(0, 0.0)]  # (node, its heads' path score)
        for j, level in enumerate(levels):
            lps = [0.0] * len(level) if logprobs is None else logprobs[j]
            grown = [(node, int(t), score + lp) for node, score in frontier for t, lp in zip(level, lps)]
            if keep is not None and logprobs is not None and len(grown) > keep:
                best = sorted(range(len(grown)), key=lambda i: (-grown[i][2], i))[:keep]
                grown = [grown[i] for i in sorted(best)]  # (made in the order the whole tree makes them)
            frontier = [(self._child(node, t, HEADS, score), score) for node, t, score in grown]

    def pruned(self, max_nodes: int) -> Trie:
        """The trie of at most `max_nodes` nodes (root included) grown best first: from the root,
        always the highest-scoring child of a kept node (ties: shallower, then earlier). Where a
        child never scores above its parent (log-probabilities, shares of counts) these are the
        trie's `max_nodes` highest-scoring nodes; every kept node's parent is kept."""
        if len(self.tokens) <= max_nodes:
            return self
        kept = self.best_first(max_nodes)
        out = Trie.with_root(self.tokens[0])
        new = {0: 0}
        for node in sorted(kept)[1:]:  # a parent's index is below its children's
            new[node] = out._child(new[self.parents[node]], self.tokens[node], self.sources[node], self.scores[node])
        return out

    def best_first(self, count: int) -> list[int]:
        """The first `count` nodes `pruned` grows (the root first): the highest-scoring child of a kept node, ties
        to the shallower, then the earlier. The first b of them are `pruned(b)`'s nodes, for every b."""
        frontier = [(-self.scores[c], self.depths[c], c) for c in self.children[0].values()]
        heapq.heapify(frontier)
        kept = [0]
        while frontier and len(kept) < count:
            _, _, node = heapq.heappop(frontier)
            kept.append(node)
            for c in self.children[node].values():
                heapq.heappush(frontier, (-self.scores[c], self.depths[c], c))
        return kept

    def held(self, path: Sequence[int], budget: int) -> int:
        """How many nodes of `path` (root excluded, from the root down) `pruned(budget)` keeps: a prefix of it,
        since a kept node's parent is kept. The walk over that trie accepts them and draws the next of `path`'s
        tokens as its new root (the same draws: what a step of that budget would have emitted)."""
        if len(self.tokens) <= budget:
            return len(path)
        kept = set(self.best_first(budget))
        return next((i for i, node in enumerate(path) if node not in kept), len(path))

    def spine(self) -> list[int]:
        """The root and its first-added children down the trie: a lookup trie's copy, a full step's
        likeliest heads path (the walk's path wherever the first candidate is accepted)."""
        out = [0]
        while self.children[out[-1]]:
            out.append(next(iter(self.children[out[-1]].values())))
        return out

    def path(self, node: int) -> list[int]:
        """Nodes from the root's first child down to `node` (empty for the root)."""
        out = []
        while node > 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def mask(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """[N, N] bool: row i sees column j iff j is i or an ancestor of i (the root included).
        Built a depth at a time (every row's next ancestor at once): a few ops for any trie, where
        setting the N x depth entries one by one cost ~3 ops each (~1 ms of host time a step)."""
        n = len(self.tokens)
        up = torch.tensor([max(p, 0) for p in self.parents])  # [N] each node's parent; the root's is itself
        rows = torch.arange(n)
        seen = rows  # [N] each row's ancestor at the current height
        m = torch.zeros(n, n, dtype=torch.bool)
        for _ in range(max(self.depths) + 1):  # a node of depth d: itself and d ancestors
            m[rows, seen] = True
            seen = up[seen]
        return m.to(device)

    def positions(self, root_position: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """[N] long: the root's position plus each node's depth."""
        return torch.tensor(self.depths, dtype=torch.long, device=device) + root_position

    def token_tensor(self, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.tensor(self.tokens, dtype=torch.long, device=device)
