"""AR vs TokenSwift reading tokens back one at a time and in blocks of 16 (--read-every), the paper's
sampling (seed 1), the shipped heads, a 2K-token prose prompt, interleaved in one process (the order
reversed every other round) and timed per token from the first yielded token (prefill excluded).
Checks that all three emit the same tokens. Run from the repo root:

python docs/scripts/token_block_ab.py [new_tokens] [rounds]"""
import statistics
import sys
import time
from pathlib import Path

import longswift
from longswift import GenerationConfig, SamplingConfig
from longswift.bench.grid import PRESETS

new, rounds = (int(a) for a in (sys.argv[1:] + ["256", "3"][len(sys.argv) - 1 :])[:2])
e = longswift.load(heads="default")
ids = e.encode(Path("docs/prompts/clockmaker.txt").read_text())[:2048]
sampling = SamplingConfig(**{**PRESETS["paper"].__dict__, "seed": 1})
gen = GenerationConfig(max_new_tokens=new)
ms: dict[tuple[str, int], list[float]] = {}
tokens: dict[tuple[str, int], list[int]] = {}
for r in range(rounds):
    order = [("ar", 1), ("tokenswift", 1), ("tokenswift", 16)]
    for method, every in order[::-1] if r % 2 else order:
        e.runtime.read_every = every
        stream = e.stream(ids, sampling=sampling, generation=gen, method=method)
        steps = iter(stream)
        next(steps)
        t0 = time.perf_counter()
        n = sum(len(x) for x in steps)
        ms.setdefault((method, every), []).append((time.perf_counter() - t0) / n * 1000)
        tokens.setdefault((method, every), stream.result.token_ids)
        st = stream.result.stats
        print(f"{method} read_every {every}: {ms[method, every][-1]:.2f} ms/token, plain steps {st.plain_steps}, "
              f"lookup steps {st.lookup_steps}, steps {st.steps}", flush=True)
for (method, every), v in ms.items():
    print(f"{method} read_every {every}: median {statistics.median(v):.2f} ms/token, runs "
          f"{', '.join(f'{x:.1f}' for x in v)}")
print("same tokens:", len({tuple(t) for t in tokens.values()}) == 1)
