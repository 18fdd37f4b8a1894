"""`longswift generate | info | bench | train-heads | eval-heads`: flags come from the config dataclasses' fields."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import typing
from pathlib import Path
from typing import Any

from .config import GenerationConfig, RuntimeConfig, SamplingConfig, SpecConfig
from .errors import LongswiftError

CONFIGS = {"sampling": SamplingConfig, "generation": GenerationConfig, "spec": SpecConfig, "runtime": RuntimeConfig}


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

    gen = sub.add_parser("generate", help="generate text from a prompt")
    gen.add_argument("--model", help="a .gguf file or an HF model directory (default: embedded SmolLM2-135M-Instruct)")
    source = gen.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="prompt text")
    source.add_argument("--prompt-file", type=Path, help="read the prompt from this UTF-8 file")
    source.add_argument("--prompt-ids", help="the prompt as token ids, e.g. 1,5,9 (models without a tokenizer)")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    gen.add_argument("--method", choices=["ar", "tokenswift"], default=None,
                     help="decoding method (default: tokenswift when the model has heads, else ar)")
    gen.add_argument("--heads", default="default",
                     help="draft heads file for TokenSwift; 'default' = the heads shipped for the model (the "
                          "embedded model has some), 'none' = no heads, 'random' = correct but slow (testing)")
    gen.add_argument("--greedy", action="store_true", help="shorthand for --temperature 0")
    gen.add_argument("--output", type=Path, help="write the text here (atomically) instead of stdout")
    gen.add_argument("--json", type=Path, help="write {token_ids, text, stats} to this file (atomically)")
    gen.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    for cls in CONFIGS.values():
        add_config_flags(gen, cls)

    info = sub.add_parser("info", help="model config, parameter count and memory plan")
    info.add_argument("--model", help="a .gguf file or an HF model directory (default: embedded model)")
    info.add_argument("--tokens", type=int, default=None, help="plan for this many tokens (default: the model's context)")
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


def parse_prompt_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise LongswiftError(f"--prompt-ids must be token ids separated by commas or spaces; got '{text}'") from None
    if not ids:
        raise LongswiftError("the prompt is empty: give at least one token id")
    return ids


def cmd_generate(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from .atomic import AtomicFile, check_writable, write_atomic
    from .detok import IncrementalDecoder
    from .engine import load
    from .parallel import env_rank, env_world_size, init_from_env

    if args.greedy:
        args.temperature = 0.0
    sampling = config_from_args(SamplingConfig, args)
    generation = config_from_args(GenerationConfig, args)
    spec = config_from_args(SpecConfig, args)
    runtime = config_from_args(RuntimeConfig, args)
    if args.prompt_ids is not None:
        if args.chat:
            raise LongswiftError("--chat wraps prompt text: use --prompt or --prompt-file with it")
        prompt: str | list[int] = parse_prompt_ids(args.prompt_ids)
    else:
        prompt = args.prompt if args.prompt is not None else read_prompt_file(args.prompt_file)
        if not prompt.strip():
            raise LongswiftError("the prompt is empty: give some prompt text")
    # Under torchrun every rank runs the model's shard; rank 0 alone writes output, progress and json.
    parallel = env_world_size() > 1
    main_rank = env_rank() == 0
    if args.json and main_rank:
        check_writable(args.json)
    if parallel:
        runtime = init_from_env(runtime)
    out = AtomicFile(args.output) if args.output and main_rank else None
    try:
        engine = load(args.model, runtime, heads=args.heads, tensor_parallel=parallel)
        stream = engine.stream(prompt, sampling=sampling, generation=generation, chat=args.chat, method=args.method,
                               spec=spec)
        if not main_rank:
            for _ in stream:
                pass
            return 0
        decoder = IncrementalDecoder(engine.tokenizer) if engine.tokenizer is not None else None
        sink = out.write if out else _stdout_write
        bar = tqdm(total=generation.max_new_tokens, unit="tok", file=sys.stderr, disable=args.no_progress,
                   dynamic_ncols=True, mininterval=0.5, leave=True)
        with bar:
            stats = stream.stats
            for ids in stream:
                # Without a tokenizer the output is the token ids, space-separated.
                sink(decoder.push(ids) if decoder else "".join(f" {t}" for t in ids))
                bar.update(len(ids))
                if stats.method == "tokenswift" and stats.steps % 8 == 0:
                    bar.set_postfix(alpha=f"{stats.alpha:.2f}", tok_per_step=f"{stats.tokens_per_step:.2f}", refresh=False)
            if decoder:
                sink(decoder.flush())
        assert stream.result is not None
        if out:
            out.commit()
        else:
            sys.stdout.write("\n")
            sys.stdout.flush()
        if args.json:
            write_atomic(args.json, json.dumps(stream.result.to_dict(), ensure_ascii=False) + "\n")
        s = stream.result.stats
        spec_info = f", alpha {s.alpha:.2f}, {s.tokens_per_step:.2f} tokens/step" if s.method == "tokenswift" else ""
        ranks = f" on {env_world_size()} processes" if parallel else ""
        print(f"{s.method}: {s.new_tokens} tokens in {s.decode_seconds:.2f} s ({s.tokens_per_second:.1f} tok/s{spec_info}){ranks}, "
              f"prefill {s.prompt_tokens} tokens in {s.prefill_seconds:.2f} s, stop: {s.finish_reason}",
              file=sys.stderr)
    except BaseException:
        if out:
            out.discard()
        raise
    finally:
        if parallel:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
    return 0


def _stdout_write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def cmd_info(args: argparse.Namespace) -> int:
    from .loading import load_config, resolve_path
    from .linear import packing_supported
    from .memory import GiB, available_bytes, plan_memory

    runtime = config_from_args(RuntimeConfig, args)
    cfg = load_config(args.model)
    tokens = args.tokens or cfg.max_position_embeddings
    if tokens <= 0:
        raise LongswiftError("--tokens must be positive")
    dtype, device = runtime.torch_dtype(), runtime.torch_device()
    packed = runtime.pack_weights is not False and packing_supported(dtype, device)
    plan = plan_memory(cfg, dtype, device, tokens, GenerationConfig().prefill_chunk, packed)
    print(f"model: {resolve_path(args.model)}")
    for f in dataclasses.fields(cfg):
        if f.name != "hf_config":
            print(f"  {f.name}: {getattr(cfg, f.name)}")
    print(f"parameters: {cfg.parameter_count():,}")
    print(f"memory plan for {tokens} tokens in {str(dtype).removeprefix('torch.')}: {plan.describe()}")
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
    args = parser.parse_args(argv)
    from .cli_heads import cmd_eval_heads, cmd_train_heads

    commands = {"generate": cmd_generate, "info": cmd_info, "bench": cmd_bench,
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
