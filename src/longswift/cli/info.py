"""`longswift info`: a model's config, context, parameter count and memory plan, without loading weights."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from ..config import GenerationConfig, ModelConfig, RuntimeConfig, SpecConfig, dtype_name
from ..errors import LongswiftError
from .flags import MODEL_HELP, add_config_flags, config_from_args, heads_value, whole_number


def add_parser(sub: Any) -> None:
    info = sub.add_parser("info", help="model config, parameter count and memory plan")
    info.add_argument("--model", help=MODEL_HELP)
    info.add_argument("--heads", type=heads_value, default="auto", help="which draft heads to report (as generate's --heads; default: auto)")
    info.add_argument("--tokens", type=whole_number, default=None,
                      help="plan for this many tokens, prompt + new (default: the model's context)")
    add_config_flags(info, SpecConfig)
    # the prompt's chunk sizes the largest masked forward: the one generation setting the plan depends on
    add_config_flags(info, GenerationConfig,
                     skip=tuple(f.name for f in dataclasses.fields(GenerationConfig) if f.name != "prefill_chunk"))
    # (float32 logits and threads, each with its flash buffers on a CPU, change the memory plan; CUDA graphs and
    # token blocks do not)
    add_config_flags(info, RuntimeConfig, skip=("cuda_graphs", "read_every", "graph_attention", "triton_kernels"))


def cmd_info(args: argparse.Namespace) -> int:
    from ..runtime.loading import load_config, resolve_path, weights_copied
    from ..runtime.memory import available_bytes, current_rss, size_text
    from ..spec.budget import lookup_budget, plan_before_loading, step_budget
    from ..spec.released import describe_heads
    from ..spec.tokenswift import spec_for_heads

    runtime = config_from_args(RuntimeConfig, args)
    spec = config_from_args(SpecConfig, args)
    if args.tokens is not None and args.tokens <= 0:
        raise LongswiftError(f"--tokens must be a positive number of tokens, got {args.tokens}")
    cfg = load_config(args.model, runtime.rope_scaling)
    tokens = cfg.context_limit if args.tokens is None else args.tokens
    dtype, device = runtime.torch_dtype(), runtime.torch_device()
    found = describe_heads(args.model, args.heads, cfg)  # (refuses heads that do not exist)
    heads, tokenswift = found.text, found.drafts
    # The tree as these heads run it ("auto" cut to their depths; one given deeper than they draft, refused)
    spec = spec_for_heads(spec, device, found.gamma)[0] if tokenswift and found.gamma else spec.for_device(device)
    chunk = config_from_args(GenerationConfig, args).prefill_chunk
    plan = plan_before_loading(cfg, runtime, tokens, chunk, spec if tokenswift else None,
                               weights_copied(args.model, dtype))
    print(f"model: {resolve_path(args.model)}")
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.name == "rope_freq_factors" and value is not None:  # one per frequency: 64 for Llama 3.1's rope
            value = f"{len(value)} factors from {min(value):g} to {max(value):g} (the GGUF's rope_freqs)"
        if f.name != "hf_config":
            print(f"  {f.name}: {value}")
    print(f"parameters: {cfg.parameter_count():,}")
    print(f"draft heads: {heads}")
    scaled = "" if cfg.scaled_rope is None else f" ({cfg.scaled_rope} rope scaling)"
    print(f"context: {cfg.context_limit} tokens{scaled}")
    nodes, lookup = step_budget(spec), lookup_budget(spec)
    lookups = f", lookup steps {lookup}" if lookup != nodes else ""
    method = (f"TokenSwift (tree {spec.tree} + {spec.ngram_topk} n-grams: {nodes} nodes{lookups})" if tokenswift
              else "AR")
    counted = f"{tokens} token{'' if tokens == 1 else 's'}"
    print(f"memory plan for {counted} with {method} in {dtype_name(dtype)}: {plan.describe()}")
    if device.type == "cpu":  # (on a GPU the plan is device memory; this process holds host memory)
        print(f"  not in the plan: the process itself (Python, torch, the tokenizer), a few hundred MiB: this one "
              f"holds {size_text(current_rss())} now, already left out of the available figure below; nor the "
              "heap that reading and packing the weights leave behind for a moment (see README)")
    past = _context_note(cfg, tokens, runtime.rope_scaling)
    if past:
        print(f"note: {past}")
    free = available_bytes(device)
    if free is not None:
        verdict = "fits" if plan.needed(weights_loaded=False) <= free else "does NOT fit"
        if past:
            verdict += " in memory, past the model's context (the note above)"
        print(f"available on {device}: {size_text(free)} -> {verdict}")
    return 0


def _context_note(cfg: ModelConfig, tokens: int, applied: str | None) -> str | None:
    """What generation would say of `tokens` tokens past this model's context (None: they fit), with the
    --rope-scaling that extends it where one does (runtime.memory.check_context's advice): a model's own scaling
    cannot be replaced, and a sliding window cannot be extended at all."""
    from ..runtime.memory import rope_extension

    if cfg.sliding_window is not None and tokens > cfg.sliding_window:
        return (f"{tokens:,} tokens exceed this model's sliding window of {cfg.sliding_window:,}, which longswift does "
                "not implement: generation will refuse them")
    if tokens <= cfg.context_limit:
        return None
    setting = rope_extension(cfg, tokens, applied)
    how = (f"unless the context is extended with --rope-scaling {setting}" if setting is not None
           else "(no --rope-scaling extends this model's that far)")
    return f"{tokens:,} tokens exceed the model's context of {cfg.context_limit:,}: generation will refuse them {how}"
