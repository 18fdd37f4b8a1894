"""A decoding forward of the embedded model whose bfloat16 or float16 attention reads the rounded span of a cache a
little longer than it (WHOLE_CACHE_SLACK 0: the products' bmm copies the span first) or what the library reads
(runtime.attention._rounded_span: every row where the span is within 128 rows of them), alternately:
`python docs/scripts/cpu_span_slack.py CONTEXT ROWS DTYPE [THREADS [ROUNDS [whole]]]`. The cache holds CONTEXT
random entries in ROWS rows (a TokenSwift run of 2,048 + 1,024 tokens: 3,079 rows, its tree's 7 slots past the
run). `whole`: time every row read at any context instead of the library's rule. Prints the best and median ms of
each and the largest difference between their logits."""

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
whole = len(sys.argv) > 6 and sys.argv[6] == "whole"
model = longswift.load(threads=threads, dtype=dtype).model
cache = FullKVCache(model.cfg, capacity, model.dtype, model.device)
g = torch.Generator().manual_seed(0)
cache.k.copy_(torch.randn(cache.k.shape, generator=g) * 0.5)
cache.v.copy_(torch.randn(cache.v.shape, generator=g))
cache.length = context
library = attention.Attention._rounded_span
modes = {"span (slack 0)": 0, "every row" if whole else f"slack {attention.WHOLE_CACHE_SLACK}": attention.WHOLE_CACHE_SLACK}
times: dict[str, list[float]] = {name: [] for name in modes}
logits = {}
with torch.inference_mode():
    for _ in range(rounds):
        for name, value in modes.items():
            attention.WHOLE_CACHE_SLACK = value
            attention.Attention._rounded_span = (lambda self, end, rows: rows) if whole and value else library
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
