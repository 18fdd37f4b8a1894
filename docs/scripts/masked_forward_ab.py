"""Time masked forwards of the embedded model by attention path, for comparing two checkouts run alternately
(PYTHONPATH=<checkout>/src) or the paths of one (session 35: no CPU path builds a [G*T, S] mask any more).

    python docs/scripts/masked_forward_ab.py verify 24x2000,24x7000,48x4000 [auto|cascade|explicit|onednn]
        one forward of T tokens under a causal [T, T] mask at S cached entries: ms, best of 6
    python docs/scripts/masked_forward_ab.py prefill 4096 auto,cascade [repeats]
        a P-token prompt read in chunks of 256: s, best of the repeats (paths interleaved)
    python docs/scripts/masked_forward_ab.py decode 2048,4096 explicit,onednn [threads]
        one decoding forward (a token, no mask) at S cached entries: ms, best of 12 in each of 3 rounds
        (paths interleaved; default one thread, as bench's cells)

`auto` is the path the runner picks; a path named is forced (`Attention.kernel`)."""

from __future__ import annotations

import sys
import time

import torch

import longswift
from longswift.runtime.cache import FullKVCache


def main() -> None:
    mode, what = sys.argv[1], sys.argv[2]
    engine = longswift.load()
    model, cfg = engine.model, engine.cfg
    if mode == "verify":
        kernel = sys.argv[3] if len(sys.argv) > 3 else "auto"
        model.attention.kernel = None if kernel == "auto" else kernel
        for t, s in (tuple(map(int, c.split("x"))) for c in what.split(",")):
            cache = FullKVCache(cfg, s + t, model.dtype, model.device)
            cache.k.normal_(), cache.v.normal_()
            tokens, mask = torch.randint(0, 1000, (t,)), torch.ones(t, t, dtype=torch.bool).tril_()
            best = float("inf")
            with torch.inference_mode():
                for i in range(7):
                    cache.length = s
                    start = time.perf_counter()
                    model.forward(tokens, torch.arange(s, s + t), cache, tree_mask=mask, logits_rows=slice(-1, None))
                    if i:  # the first is a warm-up
                        best = min(best, time.perf_counter() - start)
            print(f"T={t} S={s} {kernel}: {best * 1e3:.1f} ms", flush=True)
        return
    if mode == "decode":
        decode(engine, [int(x) for x in what.split(",")], sys.argv[3].split(","),
               int(sys.argv[4]) if len(sys.argv) > 4 else 1)
        return
    p, kernels = int(what), sys.argv[3].split(",")
    repeats = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    tokens = torch.randint(0, 40000, (p,), generator=torch.Generator().manual_seed(0))
    cache = FullKVCache(cfg, p, model.dtype, model.device)
    best = dict.fromkeys(kernels, float("inf"))
    with torch.inference_mode():
        for _ in range(repeats):
            for k in kernels:
                model.attention.kernel = None if k == "auto" else k
                cache.length = 0
                start = time.perf_counter()
                for s in range(0, p, 256):
                    model.forward(tokens[s:s + 256], torch.arange(s, min(p, s + 256)), cache,
                                  logits_rows=slice(-1, None))
                best[k] = min(best[k], time.perf_counter() - start)
    print(" ".join(f"{k} {v:.2f} s" for k, v in best.items()), flush=True)


def decode(engine: longswift.Engine, sizes: list[int], kernels: list[str], threads: int) -> None:
    torch.set_num_threads(threads)
    model, cfg = engine.model, engine.cfg
    with torch.inference_mode():
        for s in sizes:
            cache = FullKVCache(cfg, s + 64, model.dtype, model.device)
            cache.k.normal_(), cache.v.normal_()
            best = dict.fromkeys(kernels, float("inf"))
            for _ in range(3):
                for k in kernels:
                    model.attention.kernel = None if k == "auto" else k
                    for i in range(13):
                        cache.length = s
                        start = time.perf_counter()
                        model.forward(torch.tensor([5]), torch.tensor([s]), cache)
                        if i:  # the first is a warm-up
                            best[k] = min(best[k], time.perf_counter() - start)
            print(f"S={s}: " + "  ".join(f"{k} {v * 1e3:.1f} ms" for k, v in best.items()), flush=True)


if __name__ == "__main__":
    main()
