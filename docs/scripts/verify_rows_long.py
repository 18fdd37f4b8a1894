"""A verify pass's time and page faults by its rows at long contexts (session 47), the embedded model, one thread.

    python docs/scripts/verify_rows_long.py CACHED_ENTRIES... [--rows 16,32] [--kernels default,cascade,onednn]

The cache is filled with random keys and values (attention's cost does not depend on them) rather than prefilled,
and the model's rope extended (yarn:4) so that 32K entries fit. Each forward is T tokens under a causal [T, T] mask
with hidden states only (no logits); medians of five, with the minor page faults (getrusage) each took. "default"
is the path the runtime picks; the others force Attention.kernel. Session 47 found with it that a 32-row pass at 8K
cached entries spent half its time faulting in freshly mapped pages (runtime.memory.keep_freed_buffers)."""

import argparse
import resource
import statistics
import time

import torch

import longswift
from longswift.runtime.cache import FullKVCache

ap = argparse.ArgumentParser()
ap.add_argument("cached", type=int, nargs="+")
ap.add_argument("--rows", default="1,16,32")
ap.add_argument("--kernels", default="default")
a = ap.parse_args()
torch.set_num_threads(1)
model = longswift.load(threads=1, rope_scaling="yarn:4").model
for cached in a.cached:
    cache = FullKVCache(model.cfg, cached + 64, model.dtype, model.device)
    cache.k.normal_()
    cache.v.normal_()
    cache.length = cached
    for t in (int(x) for x in a.rows.split(",")):
        mask = torch.ones(t, t, dtype=torch.bool).tril_() if t > 1 else None
        cells = []
        for kernel in a.kernels.split(","):
            model.attention.kernel = None if kernel == "default" else kernel
            times, faults = [], []
            for _ in range(5):
                before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                start = time.perf_counter()
                model.forward(torch.arange(100, 100 + t), torch.arange(cached, cached + t), cache, tree_mask=mask,
                              logits_rows=slice(0, 0))
                times.append(time.perf_counter() - start)
                faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
                cache.truncate(cached)
            cells.append(f"{kernel} {statistics.median(times) * 1e3:.1f} ms ({statistics.median(faults):,.0f} faults)")
        model.attention.kernel = None
        print(f"{cached} cached, {t} rows: " + ", ".join(cells), flush=True)
    del cache
