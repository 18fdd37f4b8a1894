"""AR vs TokenSwift decode cost per token, interleaved in one process, timed from the first yielded
token (prefill excluded) in process CPU time and wall time (the shipped heads, 2K-token prose
prompt, CPU defaults, the paper's sampling unless told). Run from the repo root:

python docs/scripts/plain_step_ab.py plain|adaptive [preset] [new_tokens] [rounds]

`plain` forces every TokenSwift step to be a plain step (the root alone: what adaptive steps fall
back to when no draft pays), to compare its cost with an AR step; `adaptive` runs the real loop."""
import statistics
import sys
import time
from pathlib import Path

import longswift
import longswift.spec.tokenswift as ts
from longswift import GenerationConfig, SamplingConfig
from longswift.bench.grid import PRESETS

mode, preset, new, rounds = (sys.argv[1:] + ["plain", "paper", "64", "4"][len(sys.argv) - 1 :])[:4]
if mode == "plain":
    ts.TokenSwiftState.choose = lambda self: ts.PLAIN
e = longswift.load(heads="default")
ids = e.encode(Path("docs/prompts/clockmaker.txt").read_text())[:2048]
sampling = PRESETS[preset]
if not sampling.greedy:
    sampling = SamplingConfig(**{**sampling.__dict__, "seed": 1})
gen = GenerationConfig(max_new_tokens=int(new))
cpu: dict[str, list[float]] = {"ar": [], "tokenswift": []}
wall: dict[str, list[float]] = {"ar": [], "tokenswift": []}
for _ in range(int(rounds)):
    for method in ("ar", "tokenswift"):
        stream = e.stream(ids, sampling=sampling, generation=gen, method=method)
        steps = iter(stream)
        next(steps)
        c0, w0 = time.process_time(), time.perf_counter()
        n = sum(len(x) for x in steps)
        cpu[method].append((time.process_time() - c0) / n * 1000)
        wall[method].append((time.perf_counter() - w0) / n * 1000)
        print(f"{method}: {cpu[method][-1]:.2f} cpu ms/token, {wall[method][-1]:.2f} wall ms/token, plain steps "
              f"{stream.stats.plain_steps}, lookup steps {stream.stats.lookup_steps}", flush=True)
for name, d in (("cpu", cpu), ("wall", wall)):
    print(f"{name} ms/token medians:", {m: round(statistics.median(v), 2) for m, v in d.items()},
          "TokenSwift/AR speed per round:", [round(a / t, 3) for t, a in zip(d["tokenswift"], d["ar"])])
