"""A decoding forward of the embedded model whose bfloat16 or float16 attention reads the rounded span of a cache a
little longer than it (WHOLE_CACHE_SLACK 0: the products' bmm copies the span first) or every row of it (the
default, 128: a contiguous operand), alternately: `python docs/scripts/cpu_span_slack.py CONTEXT CAPACITY DTYPE
[THREADS [ROUNDS [SLACK]]]`. The cache holds CONTEXT random entries in CAPACITY rows (a TokenSwift run of 2,048 + 1,024
tokens: 3,079 rows, its tree's 7 slots past the run). SLACK (default 128) is the value timed against 0; a huge one
reads the whole cache at any context. Prints the best and median ms of each and the largest difference between
their logits."""

from __future__ import annotations

import sys
import time

import torch

import longswift
import longswift.runtime.attention as attention
from longswift.runtime.cache import FullKVCache

context, capacity, dtype = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
threads = int(sys.argv[4]) if len(sys.argv) > 4 else 1
rounds = int(sys.argv[5]) if len(sys.argv) > 5 else 20
slack = int(sys.argv[6]) if len(sys.argv) > 6 else attention.WHOLE_CACHE_SLACK
model = longswift.load(threads=threads, dtype=dtype).model
cache = FullKVCache(model.cfg, capacity, model.dtype, model.device)
g = torch.Generator().manual_seed(0)
cache.k.copy_(torch.randn(cache.k.shape, generator=g) * 0.5)
cache.v.copy_(torch.randn(cache.v.shape, generator=g))
cache.length = context
modes = {"span (slack 0)": 0, f"slack {slack}": slack}
times: dict[str, list[float]] = {name: [] for name in modes}
logits = {}
with torch.inference_mode():
    for _ in range(rounds):
        for name, value in modes.items():
            attention.WHOLE_CACHE_SLACK = value
            t = time.perf_counter()
            logits[name] = model.forward(torch.tensor([42]), torch.tensor([context]), cache)[0]
            times[name].append((time.perf_counter() - t) * 1e3)
            cache.truncate(context)
for name, ms in times.items():
    ms = sorted(ms)
    print(f"{dtype}, {threads} thread(s), {context} entries in {capacity} rows, {name}: best {ms[0]:.1f} ms, "
          f"median {ms[len(ms) // 2]:.1f} ms")
a, b = logits.values()
print("largest |difference| of the logits:", (a.float() - b.float()).abs().max().item())
