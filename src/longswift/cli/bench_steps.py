"""`longswift bench-steps`: per-step costs on random weights of a real model's shape, and projections."""

from __future__ import annotations

import argparse
import json
import shlex
from typing import Any

from ..config import RuntimeConfig, SpecConfig, parse_number_list
from ..errors import LongswiftError
from .flags import (add_config_flags, config_from_args, note_unused_spec_fields, output_file, seed_number,
                    whole_number)


def add_parser(sub: Any) -> None:
    from ..bench.shapes import SHAPES
    from ..bench.step_defaults import (CPU_CONTEXTS, GPU_CONTEXTS, GPU_NEW_TOKENS, PAPER_PREFIX, REPS, SEED, TREE_NODES,
                                       WARMUP)

    p = sub.add_parser("bench-steps", help="per-step costs (AR, draft, verify by tree size) on random weights of a "
                                           "real model's shape at long contexts, the bandwidth floor, and projections")
    p.add_argument("--shape", required=True, choices=sorted(SHAPES), help="model shape (public config.json values)")
    p.add_argument("--layers", type=whole_number, default=None, help="run this many layers instead of the shape's depth "
                                                            "(to fit a smaller machine; reported as such)")
    p.add_argument("--contexts", default=None, help="comma list of cached-token counts to measure at (default: "
                   f"{','.join(map(str, GPU_CONTEXTS))} on CUDA, {','.join(map(str, CPU_CONTEXTS))} on CPU)")
    p.add_argument("--tree-nodes", default=None,
                   help=f"comma list of verify-pass sizes, root included (default {','.join(map(str, TREE_NODES))})")
    p.add_argument("--reps", type=whole_number, default=REPS,
                   help="timed repetitions per cost (median reported; default %(default)s)")
    p.add_argument("--warmup", type=whole_number, default=WARMUP,
                   help="untimed repetitions before them (default %(default)s)")
    p.add_argument("--alpha", default=None, help="comma list of acceptance rates in [0, 1] (accepted draft tokens / "
                   "draft positions of the tree's depths) to project TokenSwift's time with; `longswift bench`'s alpha "
                   "also counts its lookup steps' deeper n-gram paths: from its records, (accepted_tokens / "
                   "verify_steps) / depth is the comparable one")
    p.add_argument("--prefix", type=whole_number, default=None,  # (None: not given, which --alpha's absence checks)
                   help=f"prefix length of the projection (default {PAPER_PREFIX})")
    p.add_argument("--new-tokens", type=whole_number, default=None, help="tokens the projection generates (default: "
                   f"{GPU_NEW_TOKENS} on CUDA; on CPU up to the largest context)")
    p.add_argument("--bandwidth-mib", type=whole_number, default=None,
                   help="buffer summed to measure read bandwidth (default: max(1 GiB, 4x the last-level cache))")
    p.add_argument("--seed", type=seed_number, default=SEED,
                   help="seed of the random weights, caches and tries (default %(default)s)")
    p.add_argument("--out", type=output_file, help="also append the markdown report to this file")
    p.add_argument("--json", type=output_file, help="also write the measurements and projections to this JSON file")
    # (without the settings a generation's loop reads and one step's cost does not: they changed nothing here)
    add_config_flags(p, SpecConfig, skip=("adaptive", "suffix_lookup", "lookup_nodes"))
    add_config_flags(p, RuntimeConfig, skip=("read_every",))


def _list(text: str | None, flag: str, kind: type) -> tuple | None:
    return None if text is None else parse_number_list(text, flag, kind)


def cmd_bench_steps(args: argparse.Namespace) -> int:
    from ..atomic import (append_atomic, check_appendable, check_distinct, check_json_output, check_writable,
                          write_atomic)
    from ..bench.step_defaults import PAPER_PREFIX
    from ..bench.steps import StepBenchConfig, run_bench_steps
    from ..bench.steps_report import render, to_json

    runtime = config_from_args(RuntimeConfig, args)
    kwargs: dict[str, Any] = {}
    if args.tree_nodes is not None:
        kwargs["tree_nodes"] = _list(args.tree_nodes, "--tree-nodes", int)
    spec = config_from_args(SpecConfig, args)
    bench = StepBenchConfig(shape=args.shape, layers=args.layers, contexts=_list(args.contexts, "--contexts", int),
                            reps=args.reps, warmup=args.warmup, alphas=_list(args.alpha, "--alpha", float) or (),
                            prefix=PAPER_PREFIX if args.prefix is None else args.prefix, new_tokens=args.new_tokens,
                            spec=spec, bandwidth_mib=args.bandwidth_mib, seed=args.seed, **kwargs)
    # Without --alpha nothing is projected: these would change nothing, and the report would not say why
    for flag, given in (("--prefix", args.prefix), ("--new-tokens", args.new_tokens)):
        if given is not None and not bench.alphas:
            raise LongswiftError(f"{flag} sets the projection, which --alpha asks for: give --alpha (acceptance "
                                 f"rates to project with), or leave {flag} out")
    note_unused_spec_fields(spec)  # (as generate says it: taken, but nothing here reads them)
    for path in (args.out, args.json):
        if path is not None:
            check_writable(path)
    check_distinct([("--out", args.out), ("--json", args.json)])
    if args.json is not None:  # nor over a file that is not JSON (a heads file named by mistake)
        check_json_output(args.json, "--json")
    if args.out is not None:
        check_appendable(args.out, "--out")
    result = run_bench_steps(bench, runtime, command="longswift " + shlex.join(args.argv))
    report = render(result)
    print(report)
    if args.out is not None:
        append_atomic(args.out, report + "\n")
    if args.json is not None:
        write_atomic(args.json, json.dumps(to_json(result), indent=1) + "\n")
    return 0
