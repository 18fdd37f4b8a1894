"""`longswift generate | info | bench | train-heads | eval-heads`: flags come from the config dataclasses' fields."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from pathlib import Path
from typing import Any

from .config import GenerationConfig, RuntimeConfig, SpecConfig
from .errors import LongswiftError


def add_config_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    """One flag per dataclass field: `--field-name`, typed and documented from the field."""
    group = parser.add_argument_group(cls.__name__)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if "help" not in f.metadata:
            continue
        flag = "--" + f.name.replace("_", "-")
        kind = hints[f.name]
        default_text = f" (default: {f.default})"
        if kind is bool or kind == (bool | None):
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=f.default,
                               help=f.metadata["help"] + default_text)
            continue
        base = next((t for t in typing.get_args(kind) if t is not type(None)), kind)
        group.add_argument(flag, dest=f.name, type=base, default=f.default, metavar=f.name.upper(),
                           help=f.metadata["help"] + default_text)


def config_from_args(cls: type, args: argparse.Namespace) -> Any:
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if "help" in f.metadata})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="longswift", description="Lossless acceleration of ultra-long generation (TokenSwift)."
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", required=True)

    from .cli_generate import add_parser as add_generate_parser

    add_generate_parser(sub, add_config_flags)

    info = sub.add_parser("info", help="model config, parameter count and memory plan")
    info.add_argument("--model", help="a .gguf file or an HF model directory (default: embedded model)")
    info.add_argument("--tokens", type=int, default=None,
                      help="plan for this many tokens, prompt + new (default: the model's context)")
    add_config_flags(info, SpecConfig)
    add_config_flags(info, RuntimeConfig)

    bench = sub.add_parser("bench", help="time generation methods against each other")
    bench.add_argument("--model", help="a .gguf file or an HF model directory (default: embedded model)")
    bench.add_argument("--methods", default="ar,hf",
                       help="comma list of: ar (ours), hf (transformers generate), tokenswift, tokenswift-fused")
    bench.add_argument("--heads", default="default",
                       help="draft heads for the tokenswift methods ('default' = shipped heads, or a file, or 'random')")
    bench.add_argument("--sampling", default="greedy", choices=["greedy", "paper"],
                       help="greedy (no penalty), or paper: min-p 0.1, penalty 1.2 over 1024, seed 0")
    bench.add_argument("--chat", action="store_true", help="use --prompt-file's text as a chat message")
    bench.add_argument("--prompt-tokens", type=int, default=2048, help="prompt length in tokens")
    bench.add_argument("--new-tokens", type=int, default=1024, help="tokens to generate per run")
    bench.add_argument("--runs", type=int, default=3, help="timed runs per method (interleaved); median reported")
    bench.add_argument("--prompt-file", type=Path, help="text to build the prompt from (default: bundled text)")
    bench.add_argument("--out", type=Path, help="append the markdown table to this file")
    bench.add_argument("--json", type=Path, help="write the raw measurements here")
    add_config_flags(bench, SpecConfig)
    add_config_flags(bench, RuntimeConfig)
    from .cli_heads import add_parsers

    add_parsers(sub)
    return parser


def read_prompt_file(path: Path) -> str:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise LongswiftError(f"prompt file '{path}' does not exist") from None
    except OSError as exc:
        raise LongswiftError(f"cannot read prompt file '{path}': {exc.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LongswiftError(f"prompt file '{path}' is not UTF-8 text (bad byte at offset {exc.start})") from None


def cmd_info(args: argparse.Namespace) -> int:
    from .loading import load_config, resolve_path
    from .linear import packing_supported
    from .memory import GiB, available_bytes, plan_memory
    from .tokenswift import tree_budget

    runtime = config_from_args(RuntimeConfig, args)
    spec = config_from_args(SpecConfig, args)
    cfg = load_config(args.model, runtime.rope_scaling)
    tokens = args.tokens or cfg.context_limit
    if tokens <= 0:
        raise LongswiftError("--tokens must be positive")
    dtype, device = runtime.torch_dtype(), runtime.torch_device()
    packed = runtime.pack_weights is not False and packing_supported(dtype, device)
    spec = spec.for_device(device)
    nodes = tree_budget(spec)
    draft = spec.draft_kv_budget if tokens > spec.draft_kv_budget and spec.draft_mode == "paper" else 0
    plan = plan_memory(cfg, dtype, device, tokens + nodes, GenerationConfig().prefill_chunk, packed, draft, nodes)
    print(f"model: {resolve_path(args.model)}")
    for f in dataclasses.fields(cfg):
        if f.name != "hf_config":
            print(f"  {f.name}: {getattr(cfg, f.name)}")
    print(f"parameters: {cfg.parameter_count():,}")
    print(f"context: {cfg.context_limit} tokens" + ("" if cfg.rope_type == "default" else f" ({cfg.rope_type} rope scaling)"))
    print(f"memory plan for {tokens} tokens with TokenSwift (tree {spec.tree} + {spec.ngram_topk} n-grams: "
          f"{nodes} nodes) in {str(dtype).removeprefix('torch.')}: {plan.describe()}")
    if tokens > cfg.context_limit:
        print(f"note: {tokens} tokens exceed the model's context of {cfg.context_limit}: generation will refuse them "
              "unless the context is extended with --rope-scaling")
    free = available_bytes(device)
    if free is not None:
        verdict = "fits" if plan.total <= free else "does NOT fit"
        print(f"available on {device}: {free / GiB:.2f} GiB -> {verdict}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench import BenchConfig, run_bench

    runtime = config_from_args(RuntimeConfig, args)
    cfg = BenchConfig(
        methods=tuple(m.strip() for m in args.methods.split(",") if m.strip()),
        prompt_tokens=args.prompt_tokens,
        new_tokens=args.new_tokens,
        runs=args.runs,
        prompt_file=args.prompt_file,
        sampling=args.sampling,
        chat=args.chat,
        spec=config_from_args(SpecConfig, args),
    )
    run_bench(args.model, runtime, cfg, heads=args.heads, out=args.out, json_path=args.json)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    from .cli_generate import cmd_generate
    from .cli_heads import cmd_eval_heads, cmd_train_heads

    commands = {"generate": lambda a: cmd_generate(a, argv), "info": cmd_info, "bench": cmd_bench,
                "train-heads": cmd_train_heads, "eval-heads": cmd_eval_heads}
    from .parallel import env_rank, env_world_size

    # Under torchrun every rank prints its own errors; ranks other than 0 say which they are.
    prefix = "longswift" if env_rank() == 0 else f"longswift (rank {env_rank()})"
    try:
        if env_world_size() > 1 and args.command != "generate":
            raise LongswiftError(f"only `generate` runs across several processes: run `longswift {args.command}` "
                                 "without torchrun")
        return commands[args.command](args)
    except LongswiftError as exc:
        if args.debug:
            raise
        print(f"{prefix}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("longswift: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
