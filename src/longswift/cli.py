"""`longswift generate | info | bench | bench-steps | train-heads | eval-heads`: flags come from the config dataclasses' fields."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from pathlib import Path
from typing import Any

from .config import GenerationConfig, RuntimeConfig, SpecConfig, parse_number_list
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

    bench = sub.add_parser("bench", help="benchmark grid: our methods and installed peers, with a report")
    bench.add_argument("--model", help="a .gguf file or an HF model directory (default: embedded model)")
    bench.add_argument("--methods", default=None,
                       help="comma list of: ar, tokenswift, tokenswift-fused (ours); hf (transformers generate), hf-pld "
                            "(its prompt lookup), llamacpp, llamacpp-pld (llama-cpp-python on the same GGUF). Default: "
                            "ar,tokenswift,hf,hf-pld,llamacpp,llamacpp-pld, skipping those not installed")
    bench.add_argument("--heads", default="default",
                       help="draft heads for the tokenswift methods ('default' = shipped heads, or a file, or 'random')")
    presets = bench.add_mutually_exclusive_group()
    presets.add_argument("--presets", default=None,
                         help="comma list of sampling presets: greedy (no penalty), paper (min-p 0.1, penalty 1.2/1024), "
                              "paper-nopenalty, top-p (0.9, penalty 1.15), min-p (0.05, penalty 1.15), eta (0.001, "
                              "penalty 1.2); default greedy")
    presets.add_argument("--sampling", default=None, help="a single preset (same as --presets with one name)")
    lengths = bench.add_mutually_exclusive_group()
    lengths.add_argument("--lengths", default=None, help="comma list of generation lengths (default 2048,4096,8192)")
    lengths.add_argument("--new-tokens", type=int, default=None, help="a single generation length")
    prefixes = bench.add_mutually_exclusive_group()
    prefixes.add_argument("--prefix", default=None, help="comma list of prompt (prefix) lengths in tokens (default 2048)")
    prefixes.add_argument("--prompt-tokens", type=int, default=None, help="a single prefix length")
    bench.add_argument("--runs", type=int, default=1, help="timed runs per method and cell (interleaved); medians reported")
    bench.add_argument("--prompt-file", type=Path,
                       help="prompt text: a .txt file is repeated to each prefix length (or, with --chat, sent as a "
                            "chat message); a .jsonl file holds one {\"id\", \"prompt\"} a line, each a grid cell "
                            "(docs/prompts/ has a public set). Default: seeded random token ids")
    bench.add_argument("--chat", action="store_true", help="send the prompt(s) through the model's chat template")
    bench.add_argument("--seed", type=int, default=0, help="seed of the sampled presets and of random prompts")
    bench.add_argument("--pld-tokens", type=int, default=10, help="tokens proposed per prompt-lookup step (hf-pld, llamacpp-pld)")
    bench.add_argument("--out-dir", type=Path,
                       help="write results.jsonl (a line per finished run), results.csv, PNG plots and report.md here; "
                            "rerunning the same command resumes, skipping finished runs")
    bench.add_argument("--fresh", action="store_true", help="discard the results already in --out-dir")
    bench.add_argument("--no-warmup", action="store_true", help="skip the short untimed warm-up run of each method")
    bench.add_argument("--out", type=Path, help="also append the markdown report to this file")
    bench.add_argument("--json", type=Path, help="also write every run's record to this JSON file")
    add_config_flags(bench, SpecConfig)
    add_config_flags(bench, RuntimeConfig)
    from .cli_bench_steps import add_parser as add_bench_steps_parser

    add_bench_steps_parser(sub, add_config_flags)
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
    from .tokenswift import draft_cache_tokens, tree_budget

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
    draft = draft_cache_tokens(spec, tokens)
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


def _names(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(v.strip() for v in text.split(",") if v.strip())


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench import BenchConfig, run_bench

    runtime = config_from_args(RuntimeConfig, args)
    kwargs: dict[str, Any] = {}
    if args.lengths is not None or args.new_tokens is not None:
        kwargs["lengths"] = parse_number_list(args.lengths, "--lengths") if args.lengths is not None else (args.new_tokens,)
    if args.prefix is not None or args.prompt_tokens is not None:
        kwargs["prefixes"] = parse_number_list(args.prefix, "--prefix") if args.prefix is not None else (args.prompt_tokens,)
    presets = _names(args.presets) or _names(args.sampling)
    if presets is not None:
        kwargs["presets"] = presets
    cfg = BenchConfig(methods=_names(args.methods), runs=args.runs, prompt_file=args.prompt_file, chat=args.chat,
                      seed=args.seed, pld_tokens=args.pld_tokens, warmup=not args.no_warmup,
                      spec=config_from_args(SpecConfig, args), **kwargs)
    import shlex

    run_bench(args.model, runtime, cfg, heads=args.heads, out=args.out, json_path=args.json, out_dir=args.out_dir,
              fresh=args.fresh, command="longswift " + shlex.join(args.argv))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv  # the exact command, for reports
    from .cli_generate import cmd_generate
    from .cli_bench_steps import cmd_bench_steps
    from .cli_heads import cmd_eval_heads, cmd_train_heads

    commands = {"generate": cmd_generate, "info": cmd_info, "bench": cmd_bench, "bench-steps": cmd_bench_steps,
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
