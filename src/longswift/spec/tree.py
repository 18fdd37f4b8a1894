"""The candidate trie verified in one forward: node 0 is the root (the last sampled token),
every other node a drafted token; a prefix shared by several candidates is a single node."""

from __future__ import annotations

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

    @classmethod
    def with_root(cls, root: int) -> Trie:
        return cls([root], [-1], [0], [{}], [0])

    def __len__(self) -> int:
        return len(self.tokens)

    def _child(self, node: int, token: int, source: int) -> int:
        """The child of `node` holding `token`, created if needed; marks who proposed it."""
        child = self.children[node].get(token)
        if child is None:
            child = len(self.tokens)
            self.tokens.append(token)
            self.parents.append(node)
            self.depths.append(self.depths[node] + 1)
            self.children.append({})
            self.sources.append(0)
            self.children[node][token] = child
        self.sources[child] |= source
        return child

    def add_path(self, tokens: Sequence[int], source: int) -> None:
        """Insert root -> tokens[0] -> tokens[1] -> ..., reusing existing prefix nodes."""
        node = 0
        for t in tokens:
            node = self._child(node, int(t), source)

    def add_levels(self, levels: Sequence[Sequence[int]]) -> None:
        """The heads' cartesian tree: every node at depth j gets all of levels[j] as children."""
        frontier = [0]
        for level in levels:
            frontier = [self._child(node, int(t), HEADS) for node in frontier for t in level]

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
