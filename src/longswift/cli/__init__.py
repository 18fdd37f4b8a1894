"""`longswift generate | info | bench | bench-steps | train-heads | eval-heads | export-heads`: one module per
command; flags come from the config dataclasses' fields (cli.flags)."""

from __future__ import annotations

import argparse
import sys

from ..errors import LongswiftError
from . import bench, bench_steps, export_heads, generate, heads, info


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="longswift", description="Lossless acceleration of ultra-long generation (TokenSwift)."
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", required=True)
    generate.add_parser(sub)
    info.add_parser(sub)
    bench.add_parser(sub)
    bench_steps.add_parser(sub)
    heads.add_parsers(sub)
    export_heads.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv  # the exact command, for reports
    commands = {"generate": generate.cmd_generate, "info": info.cmd_info, "bench": bench.cmd_bench,
                "bench-steps": bench_steps.cmd_bench_steps, "train-heads": heads.cmd_train_heads,
                "eval-heads": heads.cmd_eval_heads, "export-heads": export_heads.cmd_export_heads}
    from ..runtime.parallel import env_rank, env_world_size

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

