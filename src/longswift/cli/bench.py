"""`longswift bench`: the benchmark grid (our methods and installed peers), resumable, with a report."""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from ..config import RuntimeConfig, SpecConfig, parse_number_list
from ..errors import LongswiftError
from .flags import (HEADS_HELP, MODEL_HELP, add_config_flags, add_switch, check_heads_flag, config_from_args,
                    given_path, heads_value, output_file, seed_number, whole_number)


def add_parser(sub: Any) -> None:
    bench = sub.add_parser("bench", help="benchmark grid: our methods and installed peers, with a report")
    bench.add_argument("--model", help=MODEL_HELP)
    bench.add_argument("--methods", default=None,
                       help="comma list of: ar, tokenswift, tokenswift-fused (ours); hf (transformers generate), hf-pld "
                            "(its prompt lookup), llamacpp, llamacpp-pld (llama-cpp-python on the same GGUF). Default: "
                            "ar,tokenswift,hf,hf-pld,llamacpp,llamacpp-pld, skipping those not installed")
    bench.add_argument("--heads", type=heads_value, default="auto",
                       help=f"draft heads for the tokenswift methods (default: auto): {HEADS_HELP}; 'random'")
    presets = bench.add_mutually_exclusive_group()
    presets.add_argument("--presets", default=None,
                         help="comma list of sampling presets: greedy (no penalty), paper (min-p 0.1, penalty 1.2/1024), "
                              "paper-nopenalty, top-p (0.9, penalty 1.15), min-p (0.05, penalty 1.15), eta (0.001, "
                              "penalty 1.2); default greedy")
    presets.add_argument("--sampling", default=None, help="a single preset (same as --presets with one name)")
    lengths = bench.add_mutually_exclusive_group()
    lengths.add_argument("--lengths", default=None,
                         help="comma list of generation lengths (default: those of 2048,4096,8192 that fit the "
                              "model's context after the prompt)")
    lengths.add_argument("--new-tokens", type=whole_number, default=None, help="a single generation length")
    prefixes = bench.add_mutually_exclusive_group()
    prefixes.add_argument("--prefix", default=None, help="comma list of prompt (prefix) lengths in tokens (default 2048)")
    prefixes.add_argument("--prompt-tokens", type=whole_number, default=None, help="a single prefix length")
    bench.add_argument("--runs", type=whole_number, default=1,
                       help="timed runs per method and cell (interleaved); medians reported (default %(default)s)")
    bench.add_argument("--prompt-file", type=given_path,
                       help="prompt text: a .txt file is repeated to each prefix length (or, with --chat, sent as a "
                            "chat message); a .jsonl (or .ndjson) file holds one {\"id\", \"prompt\"} a line, each a "
                            "grid cell (docs/prompts/ has a public set). Default: seeded random token ids")
    add_switch(bench, "--chat", "--no-chat", "send the prompt(s) through the model's chat template")
    bench.add_argument("--seed", type=seed_number, default=0,
                       help="seed of the sampled presets and of random prompts (default %(default)s)")
    bench.add_argument("--pld-tokens", type=whole_number, default=10,
                       help="tokens proposed per prompt-lookup step (hf-pld, llamacpp-pld; default %(default)s)")
    bench.add_argument("--out-dir", type=given_path, metavar="DIR",
                       help="write results.jsonl (a line per finished run), results.csv, PNG plots, report.md and "
                            "config.json (what the runs share) here; "
                            "rerunning the same command resumes, skipping finished runs")
    add_switch(bench, "--fresh", "--no-fresh", "discard the results already in --out-dir")
    add_switch(bench, "--no-warmup", "--warmup", "skip the short untimed warm-up run of each method")
    add_switch(bench, "--no-progress", "--progress",
               "log each run's start and result on stderr, not its tokens as it goes")
    add_switch(bench, "--lockstep", "--no-lockstep",
               "run our methods (ar, tokenswift, tokenswift-fused) of each cell and run together, a step "
               "at a time, the one furthest behind in tokens next, each timed on its own clock, so that "
               "the machine's drift over minutes hits them alike (their ratio holds where rates move); "
               "holds every method's KV cache at once")
    bench.add_argument("--out", type=output_file, help="also append the markdown report to this file")
    bench.add_argument("--json", type=output_file, help="also write every run's record to this JSON file")
    add_config_flags(bench, SpecConfig)
    add_config_flags(bench, RuntimeConfig)


def _names(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(v.strip() for v in text.split(",") if v.strip())


def cmd_bench(args: argparse.Namespace) -> int:
    from ..bench.grid import BenchConfig, run_bench
    from ..bench.prompts import holds_instructions

    runtime = config_from_args(RuntimeConfig, args)
    # Flags that would be dropped without a word (found by review): refused, as other conflicts are.
    prefix_flag = "--prefix" if args.prefix is not None else "--prompt-tokens" if args.prompt_tokens is not None else None
    jsonl = args.prompt_file is not None and holds_instructions(args.prompt_file)
    if prefix_flag and args.prompt_file is not None and (args.chat or jsonl):
        what = f"a {args.prompt_file.suffix.lower()} file's prompts" if jsonl else "a chat message"
        raise LongswiftError(f"{prefix_flag} sets prompt lengths, but {what} are sent whole: drop {prefix_flag}")
    check_heads_flag(args.heads, None)  # a heads file that is not there: said before loading, in flags
    if args.chat and args.prompt_file is None:
        raise LongswiftError("--chat sends a prompt file through the chat template: give --prompt-file (the default "
                             "prompts are random token ids)")
    if args.fresh and args.out_dir is None:
        raise LongswiftError("--fresh discards the results in --out-dir: give --out-dir, or drop --fresh")
    kwargs: dict[str, Any] = {}
    if args.lengths is not None or args.new_tokens is not None:
        kwargs["lengths"] = parse_number_list(args.lengths, "--lengths") if args.lengths is not None else (args.new_tokens,)
    if args.prefix is not None or args.prompt_tokens is not None:
        kwargs["prefixes"] = parse_number_list(args.prefix, "--prefix") if args.prefix is not None else (args.prompt_tokens,)
    if args.sampling is not None and len(_names(args.sampling) or ()) > 1:
        raise LongswiftError(f"--sampling takes a single preset; got '{args.sampling}': give several with --presets")
    presets = _names(args.presets) if args.presets is not None else _names(args.sampling)  # ',' -> (): refused
    if presets is not None:
        kwargs["presets"] = presets
    cfg = BenchConfig(methods=_names(args.methods), runs=args.runs, prompt_file=args.prompt_file, chat=args.chat,
                      seed=args.seed, pld_tokens=args.pld_tokens, warmup=not args.no_warmup, lockstep=args.lockstep,
                      spec=config_from_args(SpecConfig, args), prefix_flag=prefix_flag or "--prefix",
                      length_flag="--new-tokens" if args.new_tokens is not None else "--lengths", **kwargs)
    run_bench(args.model, runtime, cfg, heads=args.heads, out=args.out, json_path=args.json, out_dir=args.out_dir,
              fresh=args.fresh, command="longswift " + shlex.join(args.argv), show_progress=not args.no_progress)
    return 0
