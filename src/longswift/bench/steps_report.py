"""The markdown report and JSON record of `longswift bench-steps`."""

from __future__ import annotations

from dataclasses import asdict
from collections.abc import Callable
from typing import Any

import torch

from ..spec.budget import draft_levels, unpruned_budget
from ..spec.tokenswift import BATCH_FROM_TOKENS, BATCHED_LOGITS_NODES
from .machine import machine_lines, processor_name, software_versions
from .steps import ContextCosts, StepBenchConfig, StepBenchResult


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _draft_text(r: StepBenchResult) -> str:
    """What the draft and refill columns time, in the spec's draft mode."""
    spec, gamma, depths = r.config.spec, r.identity["gamma"], len(draft_levels(r.config.spec))
    if spec.draft_mode == "fused":
        return (f"Draft: the fused mode's, with no forward: {gamma} random heads on the hidden state that predicted "
                f"the root, then the LM head on {depths} rows (the rest of its step is the verify pass). Refill: "
                "none (the fused mode has no partial cache).")
    rows = (f" + {gamma} random heads + the LM head on {depths} rows (the base model's and the heads' next tokens, "
            "one per drafted depth)")
    if not any(c.reselect is not None for c in r.costs):
        return f"Draft: the paper-mode draft pass on the full cache{rows}. Refill: none (no partial cache in use)."
    fill = "three quarters" if spec.draft_cache == "static" else "half"
    return (f"Draft: the paper-mode draft pass (on a {spec.draft_kv_budget}-entry partial cache past that context, "
            f"its recent window {fill} full){rows}. Refill: a draft step that drafts on the full cache and reselects "
            "the partial cache" + (" (--draft-cache static: once, at the budget)." if spec.draft_cache == "static"
                                   else "."))


def _verify_text(r: StepBenchResult) -> str:
    """What the verify costs time, in the spec's walk: the batched walk's verify pass computes every row's logits."""
    trie = "random trie of that many nodes (root included)"
    if r.config.spec.walk == "batched":
        return f"Verify: the tree's forward on the full cache + the LM head of every row (the batched walk's), {trie}"
    # (where the step bodies run, a root alone is AR's decode body, which computes its logits: found by review)
    one = ("; on CUDA a 1-node pass is the decode step, its LM head included"
           if str(r.identity["device"]).startswith("cuda") and 1 in r.config.tree_nodes else "")
    return (f"Verify: the tree's forward on the full cache (no LM head{one}), {trie}; when its steps emit at least "
            f"{BATCH_FROM_TOKENS} tokens on average, generation adds the LM head of all rows in one pass for tries "
            f"of at most {BATCHED_LOGITS_NODES} nodes, of the spine (the heads' first candidates, depth + 1 rows) "
            "for larger ones (the LM-head table below), and one LM head per walk row elsewhere")


def render(r: StepBenchResult) -> str:
    lines = [*_header_lines(r), "", *_cost_table(r)]
    lines += _by_rows(r, "Verify ms by tree nodes (x the AR step in parentheses):", "nodes",
                      lambda c: c.verify, lambda c, ms: f"{_ms(ms)} ({ms / c.ar:.2f}x)")
    lines += _by_rows(r, "Batched walk (the spec's walk: every row of the trie transformed and drawn at once, one "
                      "device read; the verify costs above then include the LM head of every row), ms:", "rows",
                      lambda c: c.walk_batched, lambda c, ms: _ms(ms))
    lines += _by_rows(r, "LM head of all the trie's rows in one pass, ms:", "rows",
                      lambda c: c.logits_rows, lambda c, ms: _ms(ms))
    if r.projections:
        lines += _projection_lines(r)
    return "\n".join(lines) + "\n"


NOISY_SPREAD = 1.5  # a cost whose slowest repetition takes this many times its median makes the report say so


def _header_lines(r: StepBenchResult) -> list[str]:
    """The report's title, command, machine and what each column times."""
    ident, b = r.identity, r.config
    lines = [f"## longswift bench-steps: {ident['shape']} shape, random weights", "", f"`{ident['command']}`", "",
             *machine_lines(ident)]
    if ident["device_name"]:
        lines.append(f"- device: {ident['device_name']}")
    if ident["layers"] != ident["full_layers"]:
        lines.append(f"- depth: {ident['layers']} of the shape's {ident['full_layers']} layers (--layers): every number "
                     f"below is for the {ident['layers']}-layer model, not scaled to the full depth")
    if (noisy := [c for c in r.costs if c.spread > NOISY_SPREAD]) and b.reps > 1:
        worst = max(noisy, key=lambda c: c.spread)
        lines.append(f"- **noisy**: at {len(noisy)} of {len(r.costs)} contexts a cost's slowest repetition took over "
                     f"{NOISY_SPREAD}x its median (at most {worst.spread:.1f}x, at {worst.context:,}): the machine was "
                     "busy; the medians hold only if most repetitions were not (more --reps, or a quieter machine)")
    if max(c.context for c in r.costs) > ident["context_limit"]:
        lines.append(f"- contexts past the shape's {ident['context_limit']}-token context were measured: the cost "
                     "does not depend on positions, but such a model would not be run there")
    return lines + [
        f"- read bandwidth: {r.bandwidth / 1e9:.1f} GB/s (best of 10 `sum()`s over a "
        f"{r.bandwidth_buffer / 2**20:.0f} MiB float32 buffer, before and after the timing); a floor above the "
        "step (marked (!)) means the step read faster than that sum(), e.g. a few layers' weights in the cache",
        f"- bytes per AR step: {r.weight_bytes / 1e6:.0f} MB of weights + {r.kv_bytes_per_token / 1e3:.1f} KB of KV "
        "per cached token; floor = those bytes / the bandwidth",
        f"- each cost is the median of {b.reps} repetitions after {b.warmup} warm-ups; caches hold random keys and "
        "values (no prefill); sampling is the paper's (min-p 0.1, penalty 1.2 over 1024 tokens)",
        f"- AR: one token's forward + LM head + sampling, as generation runs it (CUDA-graph replay where "
        f"--cuda-graphs is on: {ident.get('cuda_graphs', 'off')}, here "
        f"{'replayed' if ident.get('graphs_replayed') else 'not replayed (eager)'}, --graph-attention "
        f"{ident.get('graph_attention', 'bucketed')}; AR eager: the same step without the graph, "
        "where the graph was measured). " + _draft_text(r) + " Walk row: one row the lossless walk visits: "
        "LM head + sampling, or sampling only (cached) where the LM head of all the trie's rows ran in one pass. "
        + _verify_text(r),
    ]


def _cost_table(r: StepBenchResult) -> list[str]:
    """The per-step costs at each context."""
    paper = r.config.spec.draft_mode == "paper"
    lines = ["| context | AR ms | AR eager ms | floor ms | floor / AR | "
             + ("draft ms (entries)" if paper else "draft ms") + " | refill ms | walk row ms | cached ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in r.costs:
        floor = r.floor(c.context)
        entries = f" ({c.draft_cache})" if paper else ""
        above = " (!)" if floor > c.ar else ""  # the sum() read slower than the step's own products
        lines.append(f"| {c.context} | {_ms(c.ar)} | {_ms(c.ar_eager)} | {_ms(floor)} | {floor / c.ar:.0%}{above} "
                     f"| {_ms(c.draft)}{entries} | {_ms(c.reselect)} | {_ms(c.walk_row)} "
                     f"| {_ms(c.walk_row_cached)} |")
    return lines


def _by_rows(r: StepBenchResult, title: str, unit: str, costs: Callable[[ContextCosts], dict[int, float]],
             cell: Callable[[ContextCosts, float], str]) -> list[str]:
    """A table of seconds by a count of nodes or rows (`costs` of each context), one line per context; none where
    nothing was measured."""
    counts = sorted(costs(r.costs[0]))
    if not counts:
        return []
    lines = ["", title, "", "| context | " + " | ".join(f"{n} {unit}" for n in counts) + " |",
             "|---" * (len(counts) + 1) + "|"]
    for c in r.costs:
        lines.append(f"| {c.context} | " + " | ".join(cell(c, costs(c)[n]) for n in counts) + " |")
    return lines


def _projection_lines(r: StepBenchResult) -> list[str]:
    """The projected run's decode times at each alpha, and what the projection counts."""
    b = r.config
    spec = b.spec
    lines = ["", "### Projection (computed from the costs above, not measured)", "",
             f"Decode time of {b.new_tokens} new tokens after a {b.prefix}-token prefix (prefill excluded: both "
             "methods share it). AR: each cost interpolated linearly in context between the measured contexts "
             f"and summed over every token. TokenSwift ({spec.draft_mode} draft mode): tree "
             f"{spec.tree}" + (f" (drafted depths {','.join(map(str, draft_levels(spec)))})"
                               if spec.draft_mode == "fused" else "")
             + f" + {spec.ngram_topk} n-gram continuations per depth-1 token"
             + (f", cut to its {spec.max_nodes} likeliest nodes (--max-nodes)"
                if unpruned_budget(spec) > b.projection_nodes else "")  # (not where it has just that many)
             + f", verified at its budget of {b.projection_nodes} nodes (an upper bound); a step costs draft + "
             "verify + "
             + ("the batched walk" if spec.walk == "batched" else
                "tau x walk row (its LM head included; in steps of "
                f"{BATCH_FROM_TOKENS:g}+ tokens, where generation computes the logits of a trie of at most "
                f"{BATCHED_LOGITS_NODES} nodes, or a larger trie's spine, in the verify pass, that pass's LM head "
                "plus tau x the walk row without it, as if the walk stayed on the spine)") + " and "
             f"commits tau = 1 + {b.depth} x alpha tokens (alpha as the paper defines it: accepted draft tokens / "
             f"{b.depth} draft positions per step; `bench` counts each step's deepest trie position, which short "
             "n-gram paths or --max-nodes can make shallower, and its adaptive lookup steps' n-gram paths up to "
             "31 deep, so its alpha is not this one: its records' accepted_tokens / verify_steps + 1 are "
             "the tokens its drafting steps committed, tau here)" + _refills(b)
             + ". Not included: trie building, cache compaction, n-gram "
             "table updates, adaptive lookup steps; alpha is taken as constant over the run.",
             "", "| alpha | tokens/step | AR | TokenSwift | AR tok/s | TokenSwift tok/s | speedup |",
             "|---|---|---|---|---|---|---|"]
    for p in r.projections:
        lines.append(f"| {p.alpha:.2f} | {p.tokens_per_step:.2f} | {_duration(p.ar_seconds)} | "
                     f"{_duration(p.tokenswift_seconds)} | {p.new_tokens / p.ar_seconds:.1f} | "
                     f"{p.new_tokens / p.tokenswift_seconds:.1f} | {p.speedup:.2f}x |")
    return lines


def to_json(r: StepBenchResult) -> dict[str, Any]:
    b = r.config
    return {
        # (what measured it, as the markdown report's machine lines say: the JSON had neither)
        "identity": r.identity, "versions": software_versions(),
        "processor": processor_name(torch.device(r.identity["device"])), "bandwidth_bytes_per_s": r.bandwidth,
        "bandwidth_buffer_bytes": r.bandwidth_buffer, "weight_bytes_per_step": r.weight_bytes,
        "kv_bytes_per_token": r.kv_bytes_per_token,
        "settings": {"reps": b.reps, "warmup": b.warmup, "draft_mode": b.spec.draft_mode, "tree": b.spec.tree,
                     "ngram_topk": b.spec.ngram_topk,
                     "max_nodes": b.spec.max_nodes, "walk": b.spec.walk, "draft_cache": b.spec.draft_cache,
                     "draft_kv_budget": b.spec.draft_kv_budget, "draft_window": b.spec.draft_window,
                     "attention_sinks": b.spec.attention_sinks, "seed": b.seed},
        "contexts": [asdict(c) | {"floor": r.floor(c.context)} for c in r.costs],
        "projection": None if not r.projections else {
            "label": "projection from the measured step costs, not a measurement", "prefix": b.prefix,
            "new_tokens": b.new_tokens, "tree_nodes": b.projection_nodes, "depth": b.depth,
            "runs": [asdict(p) | {"speedup": p.speedup} for p in r.projections]},
    }


def _refills(b: StepBenchConfig) -> str:
    """What the projection counts of the draft pass's partial-cache refills (of `b`)."""
    spec = b.spec
    if b.refill_budget is not None:
        return f"; past {b.refill_budget} cached entries one step per {spec.draft_window} tokens is a refill"
    if spec.draft_mode == "fused" or spec.draft_cache == "full":
        return "; no partial cache, so no refills"
    if not b.drafts_on_partial:
        return (f"; the run stays within the draft budget of {spec.draft_kv_budget} entries, so it drafts on the "
                "full cache: no refills")
    return "; its static partial cache is selected once at the budget (a one-off, left out) and never refilled"
