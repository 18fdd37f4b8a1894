"""SpecConfig: TokenSwift's draft tree, n-gram reuse and draft pass cache, with its per-device defaults."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import LongswiftError
from .checks import flag_help, validated
from .parsing import parse_tree

PAPER_TREE, PAPER_NGRAM_TOPK = "1,3,3,3", 20
CPU_TREE, CPU_NGRAM_TOPK = "1,1,1", 1
# Node budgets (SpecConfig.max_nodes): on an H100 (session 6, 8B shape, docs/benchmarks.md) a 32-row verify
# pass cost 1.08x (4K) to 1.14x (100K) an AR step and the paper trie's 128 rows 1.61x to 2.41x; 0: no limit.
CPU_MAX_NODES, GPU_MAX_NODES = 0, 32
# A lookup step's trie (SpecConfig.lookup_nodes): the suffix index's copy can be long where the text repeats
# itself. On session 46's CPU a 32-row verify pass cost 2.8x a decoding step (an 8-row one 1.5x) and replayed
# loops accepted most of a 31-token copy; on a GPU it is the default node budget.
LOOKUP_NODES = 32
# Bounds beyond any useful trie (a step of that many rows costs many AR steps): larger values are typos, which
# the memory plan refused with a 39-digit size and advice that did not name them.
MAX_NGRAM_TOPK, MAX_LOOKUP_NODES = 1024, 4096
DRAFT_CACHES = ("dynamic", "static", "full")  # SpecConfig.draft_cache
WALKS = ("auto", "rows", "batched")  # SpecConfig.walk


@dataclass
class SpecConfig:
    """TokenSwift: draft tree, n-gram reuse, draft pass cache."""

    tree: str = field(default="auto", metadata=flag_help(
        "candidates per depth, from the base logits then each head; auto: 1,1,1 on CPU, the paper's 1,3,3,3 on GPU"))
    ngram_topk: int | None = field(default=None, metadata=flag_help(
        "n-gram continuations added per depth-1 token, 0 disables; default: 1 on CPU, the paper's 20 on GPU"))
    max_nodes: int | None = field(default=None, metadata=flag_help(
        "most nodes a step's trie may have, the root included: a larger trie keeps its most likely nodes "
        "(by the draft heads' probabilities and the n-gram counts); 0: no limit; default: 32 on GPU (where "
        "the verify pass grows with its rows at long context), no limit on CPU (its default trie has at most 7)"))
    draft_mode: str = field(
        default="paper",
        metadata=flag_help(
            "paper: a draft pass on the partial cache; fused: heads read the verify pass (one forward per step)",
            choices=("paper", "fused")),
    )
    draft_kv_budget: int = field(default=4096, metadata=flag_help(
        "partial KV cache size of the draft pass; shorter contexts draft on the full cache"))
    draft_window: int = field(default=1024, metadata=flag_help("recent-token window inside the draft KV budget"))
    draft_cache: str = field(default="dynamic", metadata=flag_help(
        "the draft pass's cache once the context outgrows --draft-kv-budget: dynamic (sinks + important "
        "entries, re-selected whenever the recent window fills), static (selected once, never refreshed) "
        "or full (the whole KV cache); static and full are ablations", choices=DRAFT_CACHES))
    attention_sinks: int = field(default=16, metadata=flag_help("first positions always kept in the partial cache"))
    walk: str = field(default="auto", metadata=flag_help(
        "the lossless walk over the verified trie: rows (transform and draw each visited row in turn, "
        "computing only those rows' logits, or a small trie's in one pass while steps average 1.5+ tokens) "
        "or batched (every row at once, one device-to-host read per step); the same tokens either way; "
        "auto: rows on CPU, batched on GPU", choices=WALKS))
    suffix_lookup: bool = field(default=True, metadata=flag_help(
        "lookup steps also copy what followed the latest earlier occurrence of the text's last 8, 4 or 2 "
        "tokens, as long as --lookup-nodes allows (prompt-lookup style: text that repeats itself gives "
        "long accepted runs); needs n-gram reuse (--ngram-topk > 0)"))
    lookup_nodes: int = field(default=LOOKUP_NODES, metadata=flag_help(
        "most nodes a lookup step's trie may have where the suffix index copies, the root included, at most "
        "--max-nodes where that is set: the copy is at most 3 tokens per token of the match it follows, and "
        "the n-gram continuations fill the rest"))
    adaptive: bool = field(default=True, metadata=flag_help(
        "per step, use whichever kind of step has been faster: full steps (draft pass + tree), half steps "
        "(the same draft, the likeliest half of a --max-nodes of 32 or more), narrow "
        "steps (the same draft, a narrow tree; only with a wide --tree or --ngram-topk), lookup steps "
        "(the suffix index's copy and n-gram continuations of the root, no draft pass) or plain steps (the root "
        "alone, an AR step); output is the same either way"))

    @validated
    def __post_init__(self) -> None:
        if self.tree != "auto":  # parsed (raising on a bad one) and written one way: "1, 3,3,3" is "1,3,3,3" (bench's
            self.tree = ",".join(map(str, self.levels))  # run keys, checkpoints and reports hold it as text)
        if self.ngram_topk is not None and not 0 <= self.ngram_topk <= MAX_NGRAM_TOPK:
            raise LongswiftError(f"--ngram-topk must be 0 to {MAX_NGRAM_TOPK}; got {self.ngram_topk}")
        if self.max_nodes is not None and (self.max_nodes < 0 or self.max_nodes == 1):
            raise LongswiftError(f"--max-nodes must be 0 (no limit) or at least 2 (the root and one drafted token); "
                                 f"got {self.max_nodes}")
        if not 2 <= self.lookup_nodes <= MAX_LOOKUP_NODES:
            raise LongswiftError(f"--lookup-nodes must be 2 (the root and one copied token) to {MAX_LOOKUP_NODES}; "
                                 f"got {self.lookup_nodes}")
        if self.draft_mode not in ("paper", "fused"):
            raise LongswiftError(f"--draft-mode must be paper or fused; got '{self.draft_mode}'")
        if self.draft_mode == "fused" and self.tree != "auto" and len(self.levels) < 2:  # (info planned it)
            raise LongswiftError(f"--tree {self.tree} has one depth, and --draft-mode fused skips the first (the "
                                 "model's own next token is the root): give a tree of at least two depths")
        if self.walk not in WALKS:
            raise LongswiftError(f"--walk must be one of {', '.join(WALKS)}; got '{self.walk}'")
        if self.draft_cache not in DRAFT_CACHES:
            raise LongswiftError(f"--draft-cache must be one of {', '.join(DRAFT_CACHES)}; got '{self.draft_cache}'")
        if self.attention_sinks < 0 or self.draft_window <= 0:
            raise LongswiftError("--attention-sinks must be >= 0 and --draft-window positive")
        if self.draft_kv_budget <= self.attention_sinks + self.draft_window:
            raise LongswiftError(
                f"--draft-kv-budget ({self.draft_kv_budget}) must exceed --attention-sinks + --draft-window "
                f"({self.attention_sinks + self.draft_window})"
            )

    @property
    def levels(self) -> tuple[int, ...]:
        if self.tree == "auto":
            raise ValueError("SpecConfig.tree is 'auto': call for_device() first")
        return parse_tree(self.tree)

    def for_device(self, device: Any, depths: int | None = None) -> SpecConfig:
        """Fill in the per-device defaults. Measured (docs/benchmarks.md): on a CPU the verify pass
        is compute-bound, so its cost grows with every node and a small trie wins (1,1,1 with one
        n-gram continuation); on a GPU it is bandwidth-bound up to a few dozen rows (the paper's
        trie), but its attention over a long context grows with every row, so its 32 likeliest nodes.
        `depths`: the most the heads draft (gamma + 1), to which the default tree is cut."""
        cpu = getattr(device, "type", str(device)).startswith("cpu")
        tree = self.tree if self.tree != "auto" else (CPU_TREE if cpu else PAPER_TREE)
        if self.tree == "auto" and depths is not None:  # heads of fewer than 3 (GPU: 4) depths
            tree = ",".join(tree.split(",")[:depths])
        ngram = self.ngram_topk if self.ngram_topk is not None else (CPU_NGRAM_TOPK if cpu else PAPER_NGRAM_TOPK)
        walk = self.walk if self.walk != "auto" else ("rows" if cpu else "batched")
        max_nodes = self.max_nodes if self.max_nodes is not None else (CPU_MAX_NODES if cpu else GPU_MAX_NODES)
        return dataclasses.replace(self, tree=tree, ngram_topk=ngram, walk=walk, max_nodes=max_nodes)


def changed_spec_fields(spec: SpecConfig) -> list[str]:
    """The fields of `spec` that differ from SpecConfig's defaults."""
    default = SpecConfig()
    return [f.name for f in dataclasses.fields(SpecConfig) if getattr(spec, f.name) != getattr(default, f.name)]


# SpecConfig fields that a setting of the same config leaves unused: (fields, when, why, why on the command line)
_UNUSED_WHEN: tuple[tuple[frozenset[str], Callable[[SpecConfig], bool], str, str], ...] = (
    (frozenset({"draft_kv_budget", "draft_window", "attention_sinks", "draft_cache"}),
     lambda spec: spec.draft_mode == "fused",
     "draft_mode='fused' has no draft pass, whose cache they set",
     "--draft-mode fused has no draft pass, whose cache they set"),
    (frozenset({"lookup_nodes"}), lambda spec: spec.ngram_topk == 0,
     "ngram_topk=0 turns off n-gram reuse and with it the suffix lookup, whose copy it bounds",
     "--ngram-topk 0 turns off n-gram reuse and with it the suffix lookup, whose copy it bounds"),
    (frozenset({"lookup_nodes"}), lambda spec: not spec.suffix_lookup,
     "suffix_lookup=False turns off the suffix lookup, whose copy it bounds",
     "--no-suffix-lookup turns off the suffix lookup, whose copy it bounds"),
)


def unused_spec_fields(spec: SpecConfig, named: Iterable[str]) -> tuple[list[str], str, str]:
    """Of the fields `named` (those a caller set), the first group that another setting of `spec` leaves unused,
    and why (in the API's words, then the command line's); ([], '', '') where none is."""
    named = set(named)
    for group, when, why, cli_why in _UNUSED_WHEN:
        if group & named and when(spec):
            return sorted(group & named), why, cli_why
    return [], "", ""
