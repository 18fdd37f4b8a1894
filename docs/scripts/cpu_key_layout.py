"""A decoding forward of the embedded model over a cache that stores its keys by slot ([L, Hkv, C, D], as before
session 41) and one that stores them by dimension ([L, Hkv, D, C] behind the same view: runtime/cache.py,
transposed_keys): `python docs/scripts/cpu_key_layout.py CONTEXT [THREADS [ROPE [DTYPE]]]` (ROPE: a --rope-scaling
such as yarn:4, for contexts past the model's 8,192, or "none"; DTYPE: float32, the default, bfloat16 or float16).
Both caches hold the same random keys and values at CONTEXT entries; the two forwards alternate, six rounds; prints
the best and median ms of each and the largest difference between their logits."""

from __future__ import annotations

import sys
import time

import torch

import longswift
from longswift.runtime.cache import FullKVCache

S = int(sys.argv[1])
threads = int(sys.argv[2]) if len(sys.argv) > 2 else 1
rope = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] != "none" else None
dtype = sys.argv[4] if len(sys.argv) > 4 else "float32"
model = longswift.load(threads=threads, rope_scaling=rope, dtype=dtype).model
caches = {}
for name, transposed in (("by slot", False), ("by dimension", True)):
    cache = FullKVCache(model.cfg, S + 16, model.dtype, model.device, transposed=transposed)
    g = torch.Generator().manual_seed(0)
    cache.k.copy_(torch.randn(cache.k.shape, generator=g) * 0.5)
    cache.v.copy_(torch.randn(cache.v.shape, generator=g))
    cache.length = S
    caches[name] = cache
token, position = torch.tensor([42]), torch.tensor([S])
times: dict[str, list[float]] = {name: [] for name in caches}
logits = {}
with torch.inference_mode():
    for _ in range(6):
        for name, cache in caches.items():
            t = time.perf_counter()
            logits[name] = model.forward(token, position, cache)[0]
            times[name].append((time.perf_counter() - t) * 1e3)
            cache.truncate(S)
for name, ms in times.items():
    print(f"{S} entries, {threads} thread(s), {dtype}, keys {name}: best {min(ms):.1f} ms, "
          f"median {sorted(ms)[3]:.1f} ms")
print("largest |difference| of the logits:", (logits["by slot"] - logits["by dimension"]).abs().max().item())
