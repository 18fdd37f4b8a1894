"""Count the CUDA graphs a generation would capture, and how often each would be replayed, on the CPU.

On CUDA the loops run every step through StepGraphs' bodies and capture one graph per key (span or
bucket, node budget, output) the first time it is needed; a graph the full cache's growth has left
behind is freed. Here the same loops run the same bodies eagerly (StepGraphs(capture=False), as the
CPU tests do) and every key is recorded: the distinct keys of a StepGraphs are the captures a CUDA
run of the same steps makes. Adaptive TokenSwift chooses its steps from measured times, so its
drafting steps (and their verify budgets) differ between this CPU and a GPU; AR's keys do not.

    python docs/scripts/graph_keys.py NEW_TOKENS [greedy|paper] [ar,tokenswift] [length|bucketed]

The prompt is docs/prompts/clockmaker.txt repeated to 2,048 tokens (bench's --prefix 2048), token blocks
of 16 as on CUDA, seed 0.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import longswift
from longswift import GenerationConfig
from longswift import generate as ar_loop
from longswift.bench.grid import PRESETS
from longswift.config import RuntimeConfig
from longswift.runtime import cuda_graphs
from longswift.spec import tokenswift

PROMPT = Path(__file__).resolve().parents[1] / "prompts" / "clockmaker.txt"


def main() -> None:
    new = int(sys.argv[1])
    preset = sys.argv[2] if len(sys.argv) > 2 else "paper"
    methods = (sys.argv[3] if len(sys.argv) > 3 else "ar,tokenswift").split(",")
    attention = sys.argv[4] if len(sys.argv) > 4 else "length"
    keys: dict[int, list[tuple[int, int, str]]] = {}
    body = cuda_graphs.StepGraphs.body

    def recorded(self: cuda_graphs.StepGraphs, first: int, n: int, out: str):  # type: ignore[no-untyped-def]
        keys.setdefault(id(self), []).append((first, n, out))
        return body(self, first, n, out)

    cuda_graphs.StepGraphs.body = recorded  # type: ignore[method-assign]
    tokenswift.step_bodies = lambda model: True  # the loops take the CUDA path's step bodies, run eagerly
    ar_loop.step_bodies = lambda model: True
    engine = longswift.load(runtime=RuntimeConfig(graph_attention=attention, read_every=16, threads=1))
    ids = engine.encode(PROMPT.read_text())
    while len(ids) < 2048:
        ids += ids
    sampling = replace(PRESETS[preset], seed=0)
    for method in methods:
        keys.clear()
        result = engine.generate(ids[:2048], method=method, sampling=sampling,
                                 generation=GenerationConfig(max_new_tokens=new, ignore_eos=True))
        total = 0
        for graphs, seen in keys.items():
            uses = Counter(seen)
            total += len(uses)
            print(f"{method}: StepGraphs {graphs % 10_000}: " + ", ".join(
                f"{key} x{count}" for key, count in uses.items()))
        print(f"{method}, {preset}, {len(result.token_ids)} new tokens: {total} graphs captured on CUDA "
              f"({result.stats.steps} steps)", flush=True)


if __name__ == "__main__":
    main()
