"""What a TokenSwift run's shapes will be, from its spec alone: the depths the heads draft, the
most trie nodes a step verifies, the walk's rows and the draft pass's partial cache. The loop,
the memory plan (`longswift info`, `generate`, `bench --lockstep`: run_plan) and `bench-steps` size
their buffers from these."""

from __future__ import annotations

import dataclasses

import torch

from ..config import ModelConfig, RuntimeConfig, SpecConfig
from ..runtime.cuda_graphs import graphs_blocker, padded_nodes
from ..runtime.linear import packing_supported
from ..runtime.memory import MemoryPlan, plan_memory
from .ngram import NGRAM_N


def draft_levels(spec: SpecConfig) -> tuple[int, ...]:
    """Candidates per drafted depth: --tree, without its first depth in fused mode (the base model's
    own next token is the root there). `spec` must be resolved for the device (for_device)."""
    return spec.levels if spec.draft_mode == "paper" else spec.levels[1:]


def tree_budget(spec: SpecConfig) -> int:
    """Most nodes a step's trie can have (root included): a full step's or a lookup step's, whichever
    is larger. `spec` must be resolved for the device (for_device)."""
    return max(step_budget(spec), lookup_budget(spec))


def step_budget(spec: SpecConfig) -> int:
    """Most nodes a full step's trie can have (root included): the heads' cartesian tree plus the
    n-gram paths, at most --max-nodes. `spec` must be resolved for the device."""
    nodes = unpruned_budget(spec)
    return min(nodes, spec.max_nodes) if spec.max_nodes else nodes


def resolved(spec: SpecConfig) -> tuple[int, int]:
    """(--ngram-topk, --max-nodes) of a spec resolved for the device (for_device), whose defaults fill them."""
    assert spec.ngram_topk is not None and spec.max_nodes is not None, "spec not resolved for the device (for_device)"
    return spec.ngram_topk, spec.max_nodes


def suffix_copies(spec: SpecConfig) -> bool:
    """Whether lookup steps copy from the suffix index: it runs with n-gram reuse on (`spec` resolved)."""
    return resolved(spec)[0] > 0 and spec.suffix_lookup


def lookup_budget(spec: SpecConfig) -> int:
    """Most nodes a lookup step's trie can have (root included): where the suffix index copies,
    --lookup-nodes, at most --max-nodes; else a full step's (its n-gram paths of the root fit there).
    `spec` must be resolved for the device."""
    if suffix_copies(spec):
        return min(spec.lookup_nodes, spec.max_nodes) if spec.max_nodes else spec.lookup_nodes
    return step_budget(spec)


def unpruned_budget(spec: SpecConfig) -> int:
    """Most nodes the heads' cartesian tree and the n-gram paths can make, before --max-nodes: a path
    follows a depth-1 token (the root where no heads draft) with the NGRAM_N - 1 tokens of one of its
    n-grams, which can all be new nodes."""
    levels = draft_levels(spec)
    nodes, width = 1, 1
    for k in levels:
        width *= k
        nodes += width
    return nodes + resolved(spec)[0] * (levels[0] if levels else 1) * (NGRAM_N - 1)


def walk_rows(spec: SpecConfig, nodes: int | None = None) -> int:
    """Rows of logits the lossless walk transforms and draws at once: the whole trie of `nodes` nodes
    (default: the spec's largest, tree_budget), padded to its verify budget, when the walk is
    batched; else one. `spec` must be resolved for the device."""
    return padded_nodes(tree_budget(spec) if nodes is None else nodes) if spec.walk == "batched" else 1


# The rows walk's logits: while steps emit at least 1.5 tokens on average, the verify pass computes the rows of a
# trie of at most this many nodes all at once, and of a larger trie its spine (spec.tokenswift.verify)
BATCHED_LOGITS_NODES = 16


def held_logit_rows(spec: SpecConfig, nodes: int | None = None) -> int:
    """Rows of logits the rows walk holds at once besides the one it draws (0 for the batched walk, whose rows
    walk_rows counts): a trie of at most BATCHED_LOGITS_NODES nodes, all of them; a larger one's spine, the root
    and a path down the first children, which a lookup trie's copy makes as long as its node budget. `nodes`: the
    largest trie (default: tree_budget). `spec` must be resolved for the device."""
    if spec.walk == "batched":
        return 0
    budget = tree_budget(spec) if nodes is None else nodes
    deepest = 1 + max(len(draft_levels(spec)), NGRAM_N)  # a full step's spine: its heads' depths or an n-gram path
    return min(budget, max(BATCHED_LOGITS_NODES, deepest, lookup_budget(spec) if suffix_copies(spec) else 0))


def draft_cache_tokens(spec: SpecConfig, total: int) -> int:
    """Size of the draft pass's partial KV cache for a run of `total` tokens: the budget when the
    paper draft mode will outgrow it, else 0 (shorter runs, fused mode and --draft-cache full draft
    without one). The last draft pass sees at most total - 2 cached entries (a step has at least one
    token to make, and its root is not cached yet), and the partial cache takes over at the budget."""
    partial = spec.draft_mode == "paper" and spec.draft_cache != "full"
    return spec.draft_kv_budget if partial and total - 2 >= spec.draft_kv_budget else 0


def run_plan(cfg: ModelConfig, dtype: torch.dtype, device: torch.device, tokens: int, chunk: int, packed: bool,
             float32_logits: bool, spec: SpecConfig | None, threads: int | None = None,
             copies: bool = True) -> MemoryPlan:
    """The memory plan of a run of `tokens` (prompt + new tokens) prefilled in chunks of `chunk`: AR's
    where `spec` is None, else TokenSwift's with its largest trie, walk rows and draft cache (`spec`
    resolved for the device), on `threads` CPU threads (None: torch's now); `copies`: plan_memory's."""
    nodes = tree_budget(spec) if spec is not None else 0
    draft = draft_cache_tokens(spec, tokens) if spec is not None else 0
    rows = walk_rows(spec) if spec is not None else 1
    # The full cache's slots past the run hold a verify pass's tree: where the step bodies run (TokenSwiftState),
    # padded to its node budget (tensor parallelism, where they do not, is planned with the padding: a few slots more)
    bodies = graphs_blocker(device, cfg, tensor_parallel=False) is None
    slots = padded_nodes(nodes) if bodies and nodes else nodes
    held = held_logit_rows(spec) if spec is not None else 0
    plan = plan_memory(cfg, dtype, device, tokens + slots, chunk, packed, draft, nodes, float32_logits, rows, held,
                       threads, copies)
    if spec is None:
        return plan
    # The draft heads' weights, with the model's (an 8B model's three in bfloat16: 100 MB): enough for the tree's
    # depths (gamma heads draw gamma + 1), and the three that checkpoints hold at least (as bench-steps plans them)
    gamma = max(3, len(spec.levels) - 1)
    heads = gamma * cfg.hidden_size * (cfg.hidden_size + 2) * torch.empty((), dtype=dtype).element_size()
    return dataclasses.replace(plan, weights=plan.weights + heads)


def will_pack(runtime: RuntimeConfig) -> bool:
    """Whether a model loaded with `runtime` gets oneDNN-packed linears (known before loading it)."""
    return runtime.pack_weights is not False and packing_supported(runtime.torch_dtype(), runtime.torch_device())


def plan_before_loading(cfg: ModelConfig, runtime: RuntimeConfig, tokens: int, chunk: int,
                        spec: SpecConfig | None, copies: bool = True) -> MemoryPlan:
    """run_plan for a model not loaded yet: its dtype, device and packing as `runtime` will give them,
    TokenSwift's `spec` (None: AR) resolved for that device; `copies`: whether the load holds its weights as copies
    (runtime.loading.weights_copied)."""
    device = runtime.torch_device()
    return run_plan(cfg, runtime.torch_dtype(), device, tokens, chunk, will_pack(runtime), runtime.float32_logits,
                    None if spec is None else spec.for_device(device), runtime.threads, copies)
